"""leasehold for Python against what its users run today, in one run.

- Lock pairs (acquire + release) per second on the file store, from one
  process and from 4 at once (each on its own lock, and all 4 on one
  contended lock): leasehold's native lock, leasehold.sherlock.FileLock
  (the drop-in), sherlock's FileLock and filelock's FileLock (both from
  PyPI, measured here).
- The worker loop's jobs per second with a no-op Python handler, against
  the same loop with a no-op Rust handler (``Queue._work_noop``), on SQLite:
  the difference is the GIL and the hand-off to Python.

Prints a Markdown section; with ``--write BENCHMARKS.md`` replaces the
``<!-- python:start -->`` ... ``<!-- python:end -->`` section of that file
(appended when missing). Run by scripts/benchmarks.sh.
"""

import argparse
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

SECONDS = float(os.environ.get("BENCH_SECONDS", "2"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


def make_lock(impl, directory, key):
    """An (acquire, release) pair of callables for one lock of ``impl``."""
    if impl.startswith("leasehold "):
        import leasehold

        store = leasehold.open(f"file:{directory}" + ("" if "durable)" in impl else "?durable=false"))

        def acquire():
            return store.lock(key, ttl=60, wait=60, keep_alive=False)

        return acquire, lambda lease: lease.release()
    if impl.startswith("leasehold.sherlock"):
        import leasehold.sherlock as sh

        durable = "durable)" in impl
        lock = sh.FileLock(key, client=directory, expire=60, timeout=60, durable=durable)
        return (lambda: lock.acquire()), (lambda _: lock.release())
    if impl == "sherlock":
        import sherlock

        lock = sherlock.FileLock(key, client=__import__("pathlib").Path(directory), expire=60, timeout=60)
        return (lambda: lock.acquire()), (lambda _: lock.release())
    if impl == "filelock":
        import filelock

        lock = filelock.FileLock(os.path.join(directory, key + ".lock"))
        return (lambda: lock.acquire()), (lambda _: lock.release())
    raise ValueError(impl)


def pairs(impl, directory, key, seconds, start_at, out):
    """Count pairs for ``seconds`` from ``start_at`` (a shared instant)."""
    acquire, release = make_lock(impl, directory, key)
    time.sleep(max(0.0, start_at - time.time()))
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        release(acquire())
        n += 1
    out.put(n)


def rate(impl, procs, same_key):
    """Pairs per second summed over ``procs`` processes (a median of
    ROUNDS runs)."""
    ctx = multiprocessing.get_context("spawn")
    rates = []
    for _ in range(ROUNDS):
        with tempfile.TemporaryDirectory() as d:
            out = ctx.Queue()
            start_at = time.time() + 1.0
            workers = [
                ctx.Process(
                    target=pairs,
                    args=(impl, d, "bench" if same_key else f"bench-{i}", SECONDS, start_at, out),
                )
                for i in range(procs)
            ]
            for w in workers:
                w.start()
            total = sum(out.get(timeout=120) for _ in workers)
            for w in workers:
                w.join()
            rates.append(total / SECONDS)
    return statistics.median(rates), min(rates), max(rates)


def loop_rate(jobs, concurrency, native):
    import leasehold

    rates = []
    for _ in range(ROUNDS):
        with tempfile.TemporaryDirectory() as d:
            q = leasehold.open(f"sqlite:{d}/q.db").queue("bench")
            for i in range(jobs):
                q.push(b"x")
            started = time.perf_counter()
            if native:
                report = q._native._work_noop(concurrency, 30.0, True)
            else:
                report = q.work(lambda job: None, concurrency=concurrency, lease=30, drain=True)
            elapsed = time.perf_counter() - started
            assert report["completed"] == jobs, report
            rates.append(jobs / elapsed)
    return statistics.median(rates), min(rates), max(rates)


def fmt(r):
    med, lo, hi = r
    return f"{med:,.0f} ({lo:,.0f}–{hi:,.0f})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", help="the BENCHMARKS.md whose python section to replace")
    parser.add_argument("--jobs", type=int, default=20000)
    args = parser.parse_args()

    ours = [
        "leasehold (durable)",
        "leasehold (durable=false)",
        "leasehold.sherlock (durable)",
        "leasehold.sherlock (durable=false)",
    ]
    peers = ["sherlock", "filelock"]
    impls = ours + peers
    rows = {}
    for impl in impls:
        rows[impl] = [rate(impl, 1, True), rate(impl, 4, False), rate(impl, 4, True)]
        print(impl, [fmt(r) for r in rows[impl]], file=sys.stderr)
    loops = {}
    for c in (1, 8):
        loops[c] = (loop_rate(args.jobs, c, native=False), loop_rate(args.jobs, c, native=True))
        print("loop", c, [fmt(r) for r in loops[c]], file=sys.stderr)

    import leasehold

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "<!-- python:start -->",
        "## Python: against sherlock and filelock (issue 28)",
        "",
        f"`bash scripts/benchmarks.sh` (or `python python/bench/bench.py --write BENCHMARKS.md` in the venv that has "
        f"leasehold, sherlock==0.4.1 and filelock), {time.strftime('%Y-%m-%d')}, commit {commit}, "
        f"{platform.machine()} with {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"each figure the median of {ROUNDS} runs of {SECONDS:g} s (min–max), all in one run.",
        "",
        "Lock pairs (acquire + release) per second on the file store (a lease directory; filelock's and",
        "sherlock's files in a temporary directory of the same disk). `durable` syncs each grant (one",
        "`fdatasync` per pair: a power loss never hands a token out twice); `durable=false` syncs nothing,",
        "as neither sherlock (JSON files) nor filelock (an flock, no state) does. The native lock is",
        "`store.lock(key, ttl=60, wait=60, keep_alive=False)`:",
        "",
        "| implementation | 1 process | 4 processes, own lock each | 4 processes, one lock |",
        "|---|---|---|---|",
    ]
    for impl in impls:
        lines.append(f"| {impl} | " + " | ".join(fmt(r) for r in rows[impl]) + " |")
    lines += ["", "Ratios of the medians (leasehold over the peer):", ""]
    lines += ["| leasehold | against | 1 process | 4, own lock | 4, one lock |", "|---|---|---|---|---|"]
    for mine in ours:
        for other in peers:
            cells = [f"{rows[mine][i][0] / rows[other][i][0]:.1f}x" for i in range(3)]
            lines.append(f"| {mine} | {other} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"The worker loop on SQLite, {args.jobs:,} jobs pushed beforehand, no-op handler, `drain=True`, jobs per second:",
        "",
        "| concurrency | `q.work(handler)` (Python handler) | the same loop, a Rust no-op handler | Python / Rust |",
        "|---|---|---|---|",
    ]
    for c, (py, rs) in loops.items():
        lines.append(f"| {c} | {fmt(py)} | {fmt(rs)} | {py[0] / rs[0]:.2f} |")
    lines += ["<!-- python:end -->", ""]
    section = "\n".join(lines)
    print(section)
    if args.write:
        with open(args.write) as f:
            text = f.read()
        a, b = text.find("<!-- python:start -->"), text.find("<!-- python:end -->")
        if a >= 0 and b > a:
            text = text[:a] + section.rstrip("\n") + text[b + len("<!-- python:end -->"):]
        else:
            text = text.rstrip("\n") + "\n\n" + section
        with open(args.write, "w") as f:
            f.write(text)
    _ = leasehold


if __name__ == "__main__":
    main()
