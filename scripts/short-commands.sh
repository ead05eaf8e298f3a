#!/bin/bash
# Wall time of short leasehold commands against `flock FILE true`, each
# run N times in a row on a fresh SQLite database (the last process to
# close it is the command itself, unlike in `cargo bench -p leasehold-cli
# --bench latency`, whose own process holds the database open).
#
#   bash scripts/short-commands.sh [BIN] [N]
#
# BIN defaults to target/release/leasehold; run two builds alternately for
# a before/after.
set -euo pipefail
B=${1:-target/release/leasehold}
N=${2:-200}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
per_run() {
    local s e
    s=$(date +%s%N)
    for ((i = 0; i < N; i++)); do "$@" >/dev/null 2>&1; done
    e=$(date +%s%N)
    echo "scale=3; ($e - $s) / 1000000 / $N" | bc
}
f=$(per_run flock "$D/lockfile" true)
r=$(per_run "$B" --store "sqlite:$D/s.db" run K --ttl 5s -- true)
e=$(per_run "$B" --store "sqlite:$D/s.db" elect E --ttl 5s --once -- true)
echo "flock $f ms  run $r ms ($(echo "scale=2; $r / $f" | bc)x)  elect $e ms ($(echo "scale=2; $e / $f" | bc)x)"
