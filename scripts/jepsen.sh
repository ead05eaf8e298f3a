#!/usr/bin/env bash
# Long runs of the history harness (issue 25): real processes against each
# store, faults injected at random moments, every history judged by the
# checker (history/src/check.rs: linearizability as a mutex, tokens,
# protected intervals, the fenced resource, the queue's lost / duplicated /
# unexpected / recovered / stuck). The summary replaces the RELIABILITY
# section of BENCHMARKS.md; any failed run fails the script, its directory
# (target/jepsen/STORE-SEED) kept with the seed that reproduces it.
#
#   RUN_SECONDS=300 RUNS=3 STORES="sqlite file postgres" SEED_START=1 bash scripts/jepsen.sh
#
# RUN_SECONDS: length of each run (default 300); RUNS: runs per store
# (default 3, seeds SEED_START...); STORES: any of sqlite, file, postgres
# (postgres needs LEASEHOLD_TEST_PG, default the local server; as root the
# runs also restart it); FAULTS: override the fault mix (default kill,stop,
# plus clock-step where libfaketime is installed (Debian's faketime),
# io-error where libfiu is (fiu-utils), and
# on postgres as root pg-restart and partition (network namespaces of the
# run's own, iproute2)); TTL_MS (default 3000).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_SECONDS="${RUN_SECONDS:-300}"
RUNS="${RUNS:-3}"
STORES="${STORES:-sqlite file postgres}"
SEED_START="${SEED_START:-1}"
TTL_MS="${TTL_MS:-3000}"
export LEASEHOLD_TEST_PG="${LEASEHOLD_TEST_PG:-postgres://postgres@127.0.0.1:5432/test}"
cargo build --release -p leasehold-history
bin=target/release/leasehold-history
out=target/jepsen
rm -rf "$out"
mkdir -p "$out"
failed=0
for store in $STORES; do
  for i in $(seq 0 $((RUNS - 1))); do
    seed=$((SEED_START + i))
    dir="$out/$store-$seed"
    default_faults="kill,stop"
    if [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || [ -n "${LEASEHOLD_FAKETIME:-}" ]; then
      default_faults="$default_faults,clock-step"
    fi
    if [ -e /usr/lib/fiu/fiu_posix_preload.so ]; then
      default_faults="$default_faults,io-error"
    fi
    faults="${FAULTS:-$default_faults}"
    case "$store" in
      sqlite) url="sqlite:$PWD/$out/$store-$seed.db" ;;
      file) url="file:$PWD/$out/$store-$seed.leases" ;;
      postgres)
        url="$LEASEHOLD_TEST_PG"
        if [ -z "${FAULTS:-}" ] && [ "$(id -u)" = 0 ]; then faults="$default_faults,pg-restart,partition"; fi ;;
      *) echo "unknown store $store (sqlite, file, postgres)" >&2; exit 2 ;;
    esac
    max_faults=$(( RUN_SECONDS / 2 ))
    echo "==> $store seed $seed: $RUN_SECONDS s, faults $faults"
    if ! "$bin" run --store "$url" --dir "$dir" --seconds "$RUN_SECONDS" --seed "$seed" \
        --faults "$faults" --max-faults "$max_faults" --ttl-ms "$TTL_MS"; then
      failed=1
    fi
  done
done
python3 - "$out" "$RUN_SECONDS" <<'PY'
import glob, json, os, subprocess, sys, time
out, seconds = sys.argv[1], sys.argv[2]
runs = []
for path in sorted(glob.glob(os.path.join(out, "*", "summary.json"))):
    s = json.load(open(path))
    runs.append((os.path.basename(os.path.dirname(path)), s))
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
cats = ["operations", "unknown outcomes (info or in flight)", "lease grants", "fenced writes accepted",
        "fenced writes refused", "pushes acknowledged", "claims", "recovered",
        "keys linearizable", "not linearizable (mutex)", "keys undecided (search limit)",
        "tokens not increasing", "protected intervals overlap", "fenced resource accepted a lower token",
        "lost", "duplicated", "unexpected", "stuck", "claim tokens not increasing", "done without a complete"]
lines = ["<!-- reliability:start -->", "## RELIABILITY: histories of real processes under faults (issue 25)", "",
         f"`RUN_SECONDS={seconds} bash scripts/jepsen.sh`, {time.strftime('%Y-%m-%d')}, commit {commit}: each run "
         "4 lease and 4 queue processes (lease only on the file store) against one store, faults at random moments "
         "from the seed, a drain, then the checker (history/src/check.rs). Allowed to be non-zero: the counts of work "
         "and of unknown outcomes, fenced writes refused, recovered. Everything below the line must be 0.", ""]
header = "| | " + " | ".join(name for name, _ in runs) + " |"
lines += [header, "|---" * (len(runs) + 1) + "|"]
faults = "| faults injected | " + " | ".join(", ".join(f"{k} {v}" for k, v in s["run"].get("faults", {}).items()) or "none" for _, s in runs) + " |"
lines.append(faults)
for c in cats:
    lines.append(f"| {c} | " + " | ".join(str(s["counts"].get(c, 0)) for _, s in runs) + " |")
lines.append("| **verdict** | " + " | ".join("ok" if s["ok"] else "**FAILED**" for _, s in runs) + " |")
lines += ["<!-- reliability:end -->", ""]
section = "\n".join(lines)
print(section)
text = open("BENCHMARKS.md").read()
a, b = text.find("<!-- reliability:start -->"), text.find("<!-- reliability:end -->")
if a >= 0 and b > a:
    text = text[:a] + section.rstrip("\n") + text[b + len("<!-- reliability:end -->"):]
else:
    text = text.rstrip("\n") + "\n\n" + section
open("BENCHMARKS.md", "w").write(text)
PY
exit $failed
