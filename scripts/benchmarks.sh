#!/usr/bin/env bash
# Regenerate BENCHMARKS.md: run every criterion benchmark and the simulator,
# then summarize (scripts/benchmarks.py reads target/criterion and the logs).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --bench core
cargo bench --bench sqlite 2>&1 | tee target/bench-sqlite.log
cargo bench --bench file
# PostgreSQL on loopback (the benchmark measures nothing without a server).
export LEASEHOLD_TEST_PG="${LEASEHOLD_TEST_PG:-postgres://postgres@127.0.0.1:5432/test}"
cargo bench --bench postgres 2>&1 | tee target/bench-postgres.log
# The same work for every system (the worker loop, the plain loop, the
# hand-written SQL), SQLite and PostgreSQL; it logs the peak RSS.
cargo bench --bench throughput
# What users feel (issue 24): the lease pair at the API users call, push-to-
# start under load, and across processes command line to command line (the
# figures go into the wave3-latency section by hand: they come with a
# before column measured from another build, LEASEHOLD_BENCH_BIN).
cargo bench --bench lease_api
cargo bench --bench load_latency
cargo bench -p leasehold-cli --bench latency
cargo build --release -p leasehold-sim
./target/release/leasehold-sim --seeds 2000 | tail -1 > target/bench-sim.log
python3 scripts/benchmarks.py
# Python (issue 28): leasehold against sherlock and filelock from PyPI, in a
# venv of their own; replaces the python section of BENCHMARKS.md.
venv=target/bench-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet sherlock==0.4.1 filelock ./python
"$venv/bin/python" python/bench/bench.py --write BENCHMARKS.md
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install --quiet matplotlib
python3 scripts/plot.py
