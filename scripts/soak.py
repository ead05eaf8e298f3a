#!/usr/bin/env python3
"""Write the soak figures (scripts/soak.sh) into BENCHMARKS.md, between the
soak markers, replacing the previous ones; the rest of the file is kept."""
import datetime
import json
import pathlib
import re
import subprocess

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
    """Both passes merged: a mutant the second pass ran again takes its
    outcome there (the second pass runs the wider test set)."""
    last = ROOT / "mutants.out" / "outcomes.json"
    if not last.exists():
        return None
    first = ROOT / "target" / "soak-mutants-pass1.json"
    merged = outcomes(first) if first.exists() else {}
    merged.update(outcomes(last))
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


def section():
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    date = datetime.date.today().isoformat()
    lines = [START, "## Soak (before a release)", ""]
    lines += [f"`bash scripts/soak.sh` on {date}, commit {commit}:", ""]
    sim = read("soak-sim.log").splitlines()
    if sim:
        secs = read("soak-sim.secs")
        lines += [f"- simulator ({secs} s): `{sim[-1]}`"]
        bad = [l for l in sim if l.startswith("VIOLATION")]
        lines += [f"  - {l}" for l in bad[:20]]
    m = mutants()
    if m:
        secs = read("soak-mutants.secs")
        scope = read("soak-mutants.scope") or "src/core/** src/client/machine/**"
        lines += [
            f"- cargo mutants on `{scope}` ({secs} s): "
            f"{m['total_mutants']} mutants, {m['caught']} caught, {m['missed']} missed, "
            f"{m['timeout']} timeouts (hung tests: caught), {m['unviable']} unviable"
        ]
        lines += [f"  - missed: `{l}`" for l in m["missed_list"]]
        lines += [f"  - timeout: `{l}`" for l in m["timeout_list"]]
        note = read("soak-mutants.note")
        if note:
            lines += [f"  - {note}"]
    lines += ["", END]
    return "\n".join(lines)


def main():
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    new = section()
    if START in text and END in text:
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: new, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + new + "\n"
    path.write_text(text)
    print(new)


if __name__ == "__main__":
    main()
