//! File store benchmarks: acquire+release pairs/s on one contended key,
//! durable (one fdatasync per pair: the grant is synced, the release not)
//! and not, with 1 to 8 threads and with 1, 2 and 4 processes; in the same
//! run, the baseline of a plain flock(2) lock/unlock of one file.
//!
//! Run: `cargo bench --bench file` (results: BENCHMARKS.md).

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // real files, threads, time

#[path = "support/harness.rs"]
mod harness;

use criterion::{BenchmarkId, Criterion, Throughput};
use leasehold::core;
use leasehold::{FileOptions, FileStore, Holder, HolderId, StoreExt};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "leasehold-bench-file-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The variable that makes this binary a worker process (its value: the store's directory).
const WORKER: &str = "LEASEHOLD_BENCH_FILE_WORKER";

fn open(dir: &std::path::Path, durable: bool) -> FileStore {
    FileStore::open_with(
        dir,
        FileOptions {
            durable,
            ..FileOptions::default()
        },
    )
    .unwrap()
}

/// One acquire+release pair on `key`, retrying while another thread holds it.
fn pair(store: &FileStore, key: &str, holder: &Holder) {
    loop {
        match store.txn(|tx| core::lease::acquire(tx, key, holder, 30_000, 1)) {
            Ok(g) => {
                store
                    .txn(|tx| core::lease::release(tx, key, holder.id, g.token))
                    .unwrap();
                return;
            }
            Err(leasehold::Error::Held { .. }) => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    }
}

fn pairs(c: &mut Criterion) {
    let mut g = c.benchmark_group("file_lease_pair");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(3));
    // Baseline: flock(2) lock + unlock of one file.
    let dir = temp_dir("flock");
    std::fs::create_dir_all(&dir).unwrap();
    let f = std::fs::File::create(dir.join("x.lock")).unwrap();
    g.bench_function("flock_baseline", |b| {
        b.iter(|| unsafe {
            libc::flock(f.as_raw_fd(), libc::LOCK_EX);
            libc::flock(f.as_raw_fd(), libc::LOCK_UN);
        })
    });
    for durable in [false, true] {
        let name = if durable { "durable" } else { "not_durable" };
        let store = Arc::new(open(&temp_dir(name), durable));
        for threads in [1usize, 2, 4, 8] {
            g.bench_with_input(
                BenchmarkId::new(format!("{name}/threads"), threads),
                &threads,
                |b, &t| {
                    b.iter_custom(|iters| {
                        let store = store.clone();
                        harness::spread(iters, t, move |i, n| {
                            let h = Holder::new(HolderId(i as u128 + 1));
                            for _ in 0..n {
                                pair(&store, "contended", &h);
                            }
                        })
                    })
                },
            );
        }
    }
    // Processes (this binary re-run as workers), each with its own handle,
    // on one contended key; not durable.
    let dir = temp_dir("procs");
    drop(open(&dir, false));
    for procs in [1usize, 2, 4] {
        g.bench_with_input(
            BenchmarkId::new("not_durable/processes", procs),
            &procs,
            |b, &p| {
                b.iter_custom(|iters| {
                    harness::spread_processes(iters, p, WORKER, &dir.display().to_string())
                })
            },
        );
    }
    g.finish();
}

fn main() {
    if let Some((dir, count)) = harness::worker(WORKER) {
        let store = open(std::path::Path::new(&dir), false);
        let holder = Holder::new(HolderId(u128::from(std::process::id())));
        for _ in 0..count {
            pair(&store, "contended", &holder);
        }
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    pairs(&mut c);
    c.final_summary();
}
