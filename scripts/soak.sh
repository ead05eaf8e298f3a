#!/usr/bin/env bash
# The long runs to make before a release (CI runs a short suite only):
#   1. every simulator scenario for SEEDS seeds (default 250,000 each, so
#      10^6 runs) from SEED_START, on JOBS threads (default: every core);
#   2. the mutation run of the pure core and of the client machines
#      (cargo-mutants, installed from crates.io if missing; MUTANTS=0 skips it).
# The figures (date, commit, runs, violations, mutants caught / missed /
# timeouts / unviable) go to BENCHMARKS.md, between the soak markers.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-250000}
SEED_START=${SEED_START:-0}
JOBS=${JOBS:-$(nproc)}
MUTANTS=${MUTANTS:-1}
# What the mutation run mutates (globs, space-separated; quoted, not expanded).
MUTANT_FILES=${MUTANT_FILES:-'src/core/** src/client/machine/**'}
SIM=${SIM:-1}
mkdir -p target

sim_status=0
if [ "$SIM" != 0 ]; then
  cargo build --release -p leasehold-sim
  start=$(date +%s)
  set +e
  ./target/release/leasehold-sim --seeds "$SEEDS" --seed-start "$SEED_START" --jobs "$JOBS" \
    > target/soak-sim.log
  sim_status=$?
  set -e
  echo "simulator: $(tail -1 target/soak-sim.log) in $(( $(date +%s) - start ))s"
  echo "$(( $(date +%s) - start ))" > target/soak-sim.secs
fi

if [ "$MUTANTS" != 0 ]; then
  command -v cargo-mutants >/dev/null || cargo install --locked cargo-mutants
  start=$(date +%s)
  # The real-process CLI tests do not exercise the core's rules any more
  # than the conformance suite, the model test and the simulator do; they
  # are left out of each mutant's run. Even so a mutant takes about 25 s
  # on 2 cores (240 s when it hangs the tests), so the 864 mutants of the
  # default MUTANT_FILES take hours: name fewer files to run a part.
  # The baseline run tests the mutated package alone, which has no
  # `model` or `sim` test: it is skipped (the timeouts are given instead).
  files=()
  read -r -a pats <<< "$MUTANT_FILES"
  for f in "${pats[@]}"; do files+=(--file "$f"); done
  echo "$MUTANT_FILES" > target/soak-mutants.scope
  cargo mutants --no-shuffle --baseline=skip --timeout 240 --build-timeout 600 \
    "${files[@]}" --test-workspace true -- \
    --lib --test conformance --test formulas --test errors --test machines --test journal \
    --test client --test model --test sim \
    > target/soak-mutants.log 2>&1 || true
  echo "$(( $(date +%s) - start ))" > target/soak-mutants.secs
  tail -3 target/soak-mutants.log
fi

python3 scripts/soak.py
exit $sim_status
