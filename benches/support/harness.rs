//! The timing harness the benchmarks share: `iters` operations split over
//! threads or processes, the elapsed time scaled to exactly `iters` (each
//! worker does `iters.div_ceil(workers)`).

#![allow(dead_code)] // each benchmark uses part of it

use std::sync::Arc;
use std::time::{Duration, Instant};

/// The environment variable that gives a worker process its count.
const COUNT_VAR: &str = "LEASEHOLD_BENCH_COUNT";

fn scale(elapsed: Duration, iters: u64, done: u64) -> Duration {
    elapsed.mul_f64(iters as f64 / done.max(1) as f64)
}

/// Operations per worker when `iters` are split over `workers`.
pub fn share(iters: u64, workers: usize) -> u64 {
    iters.div_ceil(workers as u64)
}

/// Run `work(worker, count)` on `threads` threads at once; the elapsed
/// time, scaled to `iters`.
pub fn spread(
    iters: u64,
    threads: usize,
    work: impl Fn(usize, u64) + Send + Sync + 'static,
) -> Duration {
    let per = share(iters, threads);
    let work = Arc::new(work);
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let work = work.clone();
            std::thread::spawn(move || work(i, per))
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    scale(start.elapsed(), iters, per * threads as u64)
}

/// Run this benchmark binary again as `procs` worker processes with `var`
/// set to `value` (its `main` checks [`worker`]); the elapsed time, scaled
/// to `iters`.
pub fn spread_processes(iters: u64, procs: usize, var: &str, value: &str) -> Duration {
    let per = share(iters, procs);
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let children: Vec<_> = (0..procs)
        .map(|_| {
            std::process::Command::new(&exe)
                .env(var, value)
                .env(COUNT_VAR, per.to_string())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a worker process failed");
    }
    scale(start.elapsed(), iters, per * procs as u64)
}

/// In a worker process started by [`spread_processes`] with `var`: its
/// value and the count of operations to do.
pub fn worker(var: &str) -> Option<(String, u64)> {
    let value = std::env::var(var).ok()?;
    let count = std::env::var(COUNT_VAR).ok()?.parse().ok()?;
    Some((value, count))
}

/// `n` lease acquire+release pairs on a key of worker `i`'s own.
pub fn own_key_pairs(store: &dyn leasehold::Store, i: usize, n: u64) {
    use leasehold::{core, Holder, HolderId, StoreExt};
    let holder = Holder::new(HolderId(i as u128 + 1));
    let key = format!("key-{i}");
    for _ in 0..n {
        let g = store
            .txn(|tx| core::lease::acquire(tx, &key, &holder, 30_000, 1))
            .unwrap();
        store
            .txn(|tx| core::lease::release(tx, &key, holder.id, g.token))
            .unwrap();
    }
}
