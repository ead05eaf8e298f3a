#!/usr/bin/env bash
# Regenerate BENCHMARKS.md: run every criterion benchmark, then summarize.
# The simulator's events/s and seeds/s come from its own summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --bench core
cargo bench --bench sqlite 2>&1 | tee target/bench-sqlite.log
cargo bench --bench file
cargo build --release -p leasehold-sim
sim=$(./target/release/leasehold-sim --seeds 2000 | tail -1)
python3 scripts/benchmarks.py
{
  echo
  echo "## simulator"
  echo
  echo '`leasehold-sim --seeds 2000` (all four scenarios, mem store, full oracle with the lockstep model):'
  echo
  echo "    $sim"
  echo
  echo "The naive baseline's double claims and BUSY errors, from \`cargo bench --bench sqlite\`:"
  echo
  grep '^naive baseline' target/bench-sqlite.log | sed 's/^/    /'
} >> BENCHMARKS.md
