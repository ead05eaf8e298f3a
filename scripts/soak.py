#!/usr/bin/env python3
"""Write the soak figures (scripts/soak.sh) into BENCHMARKS.md, between the
soak markers; the rest of the file is kept.

Usage: soak.py [sim] [mutants]: the parts that ran now, whose figures
replace the previous ones; a part not named keeps its previous lines."""
import datetime
import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
START, END = "<!-- soak:start -->", "<!-- soak:end -->"


def read(name):
    p = ROOT / "target" / name
    return p.read_text().strip() if p.exists() else ""


def outcomes(path):
    """Each mutant's outcome in one cargo-mutants run: name -> summary."""
    data = json.loads(path.read_text())
    result = {}
    for o in data["outcomes"]:
        scenario = o["scenario"]
        if isinstance(scenario, dict) and "Mutant" in scenario:
            result[scenario["Mutant"]["name"]] = o["summary"]
    return result


def mutants():
    """Both passes merged: a mutant the first pass missed takes the second
    pass's outcome when the second caught it (or hung on it)."""
    first = ROOT / "target" / "soak-mutants-pass1.json"
    last = ROOT / "mutants.out" / "outcomes.json"
    if not first.exists() and not last.exists():
        return None
    merged = outcomes(first) if first.exists() else {}
    for name, outcome in (outcomes(last) if last.exists() else {}).items():
        if name not in merged or outcome in ("CaughtMutant", "Timeout"):
            merged[name] = outcome
    kinds = {
        "CaughtMutant": "caught",
        "MissedMutant": "missed",
        "Timeout": "timeout",
        "Unviable": "unviable",
    }
    summary = {k: 0 for k in kinds.values()}
    summary["total_mutants"] = len(merged)
    for outcome in merged.values():
        if outcome in kinds:
            summary[kinds[outcome]] += 1
    summary["missed_list"] = sorted(n for n, o in merged.items() if o == "MissedMutant")
    summary["timeout_list"] = sorted(n for n, o in merged.items() if o == "Timeout")
    return summary


def blocks(text):
    """The previous section's parts: the simulator's and the mutation
    run's lines (each a `- ` line and its `  - ` sub-lines), by name."""
    found, current = {}, None
    inside = False
    for line in text.splitlines():
        if line == START:
            inside = True
        elif line == END:
            inside = False
        elif inside and line.startswith("- "):
            current = "sim" if line.startswith("- simulator") else "mutants"
            found[current] = [line]
        elif inside and line.startswith("  ") and current:
            found[current].append(line)
        elif inside:
            current = None
    return found


def section(previous, ran):
    """The new section: each part run now replaces its previous lines; a
    part not run (SIM=0, MUTANTS=0) keeps them, with their own date and
    commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    when = f"{datetime.date.today().isoformat()}, commit {commit}"
    old = blocks(previous)
    lines = [START, "## Soak (before a release)", ""]
    lines += ["`bash scripts/soak.sh`, on this 2-core machine (each part says when it ran):", ""]
    sim = read("soak-sim.log").splitlines() if "sim" in ran else []
    if sim:
        secs = read("soak-sim.secs")
        lines += [f"- simulator ({when}, {secs} s): `{sim[-1]}`"]
        bad = [l for l in sim if l.startswith("VIOLATION")]
        lines += [f"  - {l}" for l in bad[:20]]
    else:
        lines += old.get("sim", [])
    m = mutants() if "mutants" in ran else None
    if m:
        secs = read("soak-mutants.secs")
        scope = read("soak-mutants.scope") or "src/core/** src/client/machine/**"
        lines += [
            f"- cargo mutants on `{scope}` ({when}, {secs} s): "
            f"{m['total_mutants']} mutants, {m['caught']} caught, {m['missed']} missed, "
            f"{m['timeout']} timeouts (hung tests: caught), {m['unviable']} unviable"
        ]
        lines += [f"  - missed: `{l}`" for l in m["missed_list"]]
        lines += [f"  - timeout: `{l}`" for l in m["timeout_list"]]
        note = read("soak-mutants.note")
        if note:
            lines += [f"  - {note}"]
    else:
        lines += old.get("mutants", [])
    lines += ["", END]
    return "\n".join(lines)


def main():
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    new = section(text, set(sys.argv[1:]))
    if START in text and END in text:
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: new, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + new + "\n"
    path.write_text(text)
    print(new)


if __name__ == "__main__":
    main()
