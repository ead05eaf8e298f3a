#!/usr/bin/env python3
"""Plot throughput against contention per store from criterion's results.

Writes docs/throughput.png (linked from README.md). Needs matplotlib
(`python3 -m pip install matplotlib`); run after `cargo bench`.
"""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CRIT = ROOT / "target" / "criterion"

# (label, group dir, bench prefix), each a line over threads 1, 2, 4, 8.
SERIES = [
    ("mem: lease pairs", "mem_contention", "lease_pair_threads"),
    ("mem: claim+complete", "mem_contention", "claim_complete_threads"),
    ("sqlite NORMAL: claim+complete", "sqlite_claim_complete", "normal_threads"),
    ("sqlite FULL: claim+complete", "sqlite_claim_complete", "full_threads"),
    ("sqlite NORMAL: lease pairs", "sqlite_lease_pair", "normal_threads"),
    ("file, not durable: lease pairs", "file_lease_pair", "not_durable_threads"),
    ("file, durable: lease pairs", "file_lease_pair", "durable_threads"),
    ("naive SELECT-then-UPDATE (sqlite)", "naive_select_then_update", "threads"),
    ("postgres (loopback): claim+complete", "postgres_claim_complete", "postgres_threads"),
]


def rate(group, bench, threads):
    path = CRIT / group / bench / str(threads) / "new"
    try:
        est = json.loads((path / "estimates.json").read_text())
        meta = json.loads((path / "benchmark.json").read_text())
    except OSError:
        return None
    elements = (meta.get("throughput") or {}).get("Elements", 1) or 1
    return 1e9 * elements / est["median"]["point_estimate"]


# The same work (20,000 no-op jobs), handlers 1 and 8: (label, bench dirs).
SAME_WORK = [
    ("sqlite: Queue::work (same work)", "sqlite_work_loop_{}"),
    ("postgres: Queue::work (same work)", "postgres_work_loop_{}"),
    ("postgres: hand-written SKIP LOCKED (same work)", "postgres_hand_written_{}"),
]


def same_work_rate(bench):
    path = CRIT / "same_work_20k" / bench / "new"
    try:
        est = json.loads((path / "estimates.json").read_text())
        meta = json.loads((path / "benchmark.json").read_text())
    except OSError:
        return None
    elements = (meta.get("throughput") or {}).get("Elements", 1) or 1
    return 1e9 * elements / est["median"]["point_estimate"]


def main():
    fig, ax = plt.subplots(figsize=(8, 6), dpi=110)
    for label, group, bench in SERIES:
        pts = [(t, rate(group, bench, t)) for t in (1, 2, 4, 8, 16)]
        pts = [(t, r) for t, r in pts if r]
        if pts:
            ax.plot([t for t, _ in pts], [r for _, r in pts], marker="o", label=label)
    for label, bench in SAME_WORK:
        pts = [(t, same_work_rate(bench.format(t))) for t in (1, 8)]
        pts = [(t, r) for t, r in pts if r]
        if pts:
            ax.plot([t for t, _ in pts], [r for _, r in pts], marker="s", linestyle="--", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([1, 2, 4, 8, 16])
    ax.set_xticklabels(["1", "2", "4", "8", "16"])
    ax.set_xlabel("contending threads (one process, 2 cores)")
    ax.set_ylabel("operations per second (log)")
    ax.set_title("leasehold: throughput against contention, per store")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    out = ROOT / "docs" / "throughput.png"
    out.parent.mkdir(exist_ok=True)
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
