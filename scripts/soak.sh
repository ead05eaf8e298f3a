#!/usr/bin/env bash
# The long runs to make before a release (CI runs a short suite only):
#   1. every simulator scenario for SEEDS seeds (default 250,000 each: 6
#      scenarios, 1.5 x 10^6 runs) from SEED_START, on JOBS threads
#      (default: every core);
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
# Each part run now starts from nothing (soak.py keeps the previous figures
# of a part not run, with their own date and commit).
if [ "$SIM" != 0 ]; then rm -f target/soak-sim.*; fi
if [ "$MUTANTS" != 0 ]; then rm -rf mutants.out mutants.out.old target/soak-mutants*; fi

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
  # Two passes over the same mutants. The first runs the quick tests that
  # exercise the rules directly (unit tests, the conformance suite on the
  # mem and SQLite stores, the formulas, errors, journal, machine, model,
  # observability and allocation tests; about 5 s a mutant on 2 cores,
  # built without debug info by the `mutants` profile, only these test
  # binaries linked). A mutant that hangs them is a timeout: caught. The
  # second (`--iterate`) runs only the mutants the first missed, against
  # the wider set (the client and results tests and the simulator's seed
  # suite added, PostgreSQL's conformance run when LEASEHOLD_TEST_PG is
  # set) with a longer timeout; soak.py counts a mutant caught when either
  # pass catches it. The real-process CLI tests exercise the rules no more
  # than these do and are left out.
  quick=(--lib --test conformance --test formulas --test errors --test machines --test journal
         --test model --test observe --test allocations)
  wide=("${quick[@]}" --test client --test results --test sim)
  files=()
  read -r -a pats <<< "$MUTANT_FILES"
  for f in "${pats[@]}"; do files+=(--file "$f"); done
  echo "$MUTANT_FILES" > target/soak-mutants.scope
  # Build the unmutated tree once, so that the first mutant's build is
  # incremental too (under --build-timeout), and check it passes.
  cargo test --profile mutants --workspace "${wide[@]}" > target/soak-mutants.log 2>&1
  pass() { # pass TIMEOUT TEST-ARGS...: one cargo-mutants run (baseline skipped:
    # the mutated package alone has no `model` or `sim` test to run it with)
    local timeout=$1; shift
    local args=()
    for a in "$@"; do args+=("--cargo-arg=$a"); done
    cargo mutants --no-shuffle --baseline=skip --timeout "$timeout" --build-timeout 600 \
      --profile mutants --copy-target true "${files[@]}" --test-workspace true \
      ${extra[@]+"${extra[@]}"} "${args[@]}" >> target/soak-mutants.log 2>&1 || true
  }
  extra=()
  LEASEHOLD_TEST_PG='' pass 60 "${quick[@]}" # the rules are the same on every store
  if [ -f mutants.out/outcomes.json ]; then
    cp mutants.out/outcomes.json target/soak-mutants-pass1.json
  fi
  if [ -s mutants.out/missed.txt ]; then
    extra=(--iterate)
    pass 240 "${wide[@]}"
  fi
  echo "$(( $(date +%s) - start ))" > target/soak-mutants.secs
  tail -3 target/soak-mutants.log
fi

ran=()
if [ "$SIM" != 0 ]; then ran+=(sim); fi
if [ "$MUTANTS" != 0 ]; then ran+=(mutants); fi
python3 scripts/soak.py ${ran[@]+"${ran[@]}"}
exit $sim_status
