#!/usr/bin/env bash
# Regenerates docs/ui.png (the dashboard's queues page, see README) from a
# demo store, in Debian's chromium driven by playwright-core (cli/tests/browser).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --bin leasehold
(cd cli/tests/browser && { [ -d node_modules ] || npm ci --no-audit --no-fund; } && node screenshot.mjs)
