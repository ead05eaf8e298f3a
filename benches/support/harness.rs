//! The timing harness the benchmarks share: `iters` operations split over
//! threads or processes, the elapsed time scaled to exactly `iters` (each
//! worker does `iters.div_ceil(workers)`).

#![allow(dead_code)] // each benchmark uses part of it

use leasehold::{Client, JobSpec, Store};
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

/// The lease of jobs claimed by the queue benchmarks.
pub const QUEUE_LEASE: Duration = Duration::from_secs(60);

/// Push `n` jobs (8-byte payloads) to `queue`.
pub fn push_jobs(store: &Arc<dyn Store>, queue: &str, n: u64) {
    let q = Client::builder_shared(store.clone())
        .build()
        .queue(queue)
        .unwrap();
    for i in 0..n {
        q.push(&JobSpec::new(i.to_le_bytes().to_vec())).unwrap();
    }
}

/// Work the queue until it is empty; returns the jobs completed.
pub fn drain(store: Arc<dyn Store>, queue: &str, batch: usize) -> u64 {
    let q = Client::builder_shared(store).build().queue(queue).unwrap();
    let mut done = 0;
    loop {
        let jobs = q.claim_batch(batch, QUEUE_LEASE).unwrap();
        if jobs.is_empty() {
            return done;
        }
        if batch == 1 {
            for j in &jobs {
                j.complete().unwrap();
            }
        } else {
            for r in q.complete_many(&jobs).unwrap() {
                r.unwrap();
            }
        }
        done += jobs.len() as u64;
    }
}

/// `threads` workers sharing one store handle drain `iters` jobs.
pub fn timed_drain(
    store: &Arc<dyn Store>,
    queue: &str,
    iters: u64,
    threads: usize,
    batch: usize,
) -> Duration {
    push_jobs(store, queue, iters);
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let store = store.clone();
            let queue = queue.to_owned();
            std::thread::spawn(move || drain(store, &queue, batch))
        })
        .collect();
    let done: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(done, iters);
    start.elapsed()
}

/// Push `n` jobs (8-byte payloads) to `queue`, `per_txn` to a transaction
/// (setup for the batch benchmarks, faster than one commit per job).
pub fn push_jobs_batched(store: &Arc<dyn Store>, queue: &str, n: u64, per_txn: u64) {
    use leasehold::{core, QueuePolicy, StoreExt};
    let policy = QueuePolicy::default();
    let mut pushed = 0;
    while pushed < n {
        let count = per_txn.min(n - pushed);
        store
            .txn(|tx| {
                for i in pushed..pushed + count {
                    let spec = JobSpec::new(i.to_le_bytes().to_vec());
                    core::job::enqueue(tx, queue, &spec, &policy)?;
                }
                Ok(())
            })
            .unwrap();
        pushed += count;
    }
}
