//! SQLite store benchmarks: claim+complete jobs/s with 1, 2, 4 and 8 worker
//! threads and with 4 processes, single and batched claims, synchronous
//! NORMAL and FULL; beside them, in the same run, the naive pattern of the
//! brief's queue report (SELECT a ready row outside the write transaction,
//! then UPDATE it) with its double claims and BUSY errors counted, and the
//! mem store as the ceiling. Also lease acquire+release pairs with 1 to 8
//! threads, and pushes: one per transaction through `Queue::push`, and a
//! thousand per transaction (`core::job::enqueue`, as an import would).
//!
//! Run: `cargo bench --bench sqlite` (results: BENCHMARKS.md).

#![allow(clippy::disallowed_methods)] // benchmarks use real threads and time

#[path = "support/harness.rs"]
mod harness;

use criterion::{BenchmarkId, Criterion, Throughput};
use leasehold::{MemStore, SqliteOptions, SqliteStore, Store, Synchronous};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn temp_db(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "leasehold-bench-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("bench.db")
}

fn sqlite(path: &PathBuf, sync: Synchronous) -> Arc<dyn Store> {
    let opts = SqliteOptions {
        synchronous: sync,
        ..SqliteOptions::default()
    };
    Arc::new(SqliteStore::open_with(path, opts).unwrap())
}

fn threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("sqlite_claim_complete");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(3));
    let mem: Arc<dyn Store> = Arc::new(MemStore::new());
    g.bench_function("mem_ceiling/1", |b| {
        b.iter_custom(|n| harness::timed_drain(&mem, "q", n, 1, 1))
    });
    for sync in [Synchronous::Normal, Synchronous::Full] {
        let path = temp_db("threads");
        let store = sqlite(&path, sync);
        let name = format!("{sync:?}").to_lowercase();
        for t in [1usize, 2, 4, 8] {
            g.bench_with_input(
                BenchmarkId::new(format!("{name}/threads"), t),
                &t,
                |b, &t| b.iter_custom(|n| harness::timed_drain(&store, "q", n, t, 1)),
            );
        }
        g.bench_function(format!("{name}/batch64/1"), |b| {
            b.iter_custom(|n| harness::timed_drain(&store, "q", n, 1, 64))
        });
        g.bench_function(format!("{name}/batch64/4"), |b| {
            b.iter_custom(|n| harness::timed_drain(&store, "q", n, 4, 64))
        });
    }
    g.finish();
}

/// 4 processes (this benchmark binary re-run as workers), one connection each.
fn processes(c: &mut Criterion) {
    let mut g = c.benchmark_group("sqlite_processes");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(3));
    let exe = std::env::current_exe().unwrap();
    for procs in [1usize, 4] {
        let path = temp_db("procs");
        let store = sqlite(&path, Synchronous::Normal);
        g.bench_with_input(
            BenchmarkId::new("normal/processes", procs),
            &procs,
            |b, &procs| {
                b.iter_custom(|n| {
                    harness::push_jobs(&store, "p", n);
                    let start = Instant::now();
                    let children: Vec<_> = (0..procs)
                        .map(|_| {
                            std::process::Command::new(&exe)
                                .env("LEASEHOLD_BENCH_WORKER", &path)
                                .spawn()
                                .unwrap()
                        })
                        .collect();
                    for mut ch in children {
                        assert!(ch.wait().unwrap().success());
                    }
                    start.elapsed()
                })
            },
        );
    }
    g.finish();
}

/// The naive claim of the original report: SELECT a ready row (autocommit,
/// outside the write transaction), then UPDATE it in a transaction.
/// Returns (elapsed, double claims, BUSY errors).
fn naive_run(path: &PathBuf, jobs: u64, threads: usize) -> (Duration, u64, u64) {
    {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; DROP TABLE IF EXISTS naive;
             CREATE TABLE naive (id INTEGER PRIMARY KEY, state TEXT NOT NULL, claims INTEGER NOT NULL DEFAULT 0);
             CREATE INDEX naive_state ON naive(state, id);",
        )
        .unwrap();
        let tx = conn.unchecked_transaction().unwrap();
        for _ in 0..jobs {
            tx.execute("INSERT INTO naive (state) VALUES ('ready')", [])
                .unwrap();
        }
        tx.commit().unwrap();
    }
    let busy = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let path = path.clone();
            let busy = busy.clone();
            std::thread::spawn(move || {
                let conn = rusqlite::Connection::open(&path).unwrap();
                conn.busy_timeout(Duration::from_millis(5)).unwrap();
                loop {
                    let id: Option<i64> = match conn.query_row(
                        "SELECT id FROM naive WHERE state = 'ready' ORDER BY id LIMIT 1",
                        [],
                        |r| r.get(0),
                    ) {
                        Ok(id) => Some(id),
                        Err(rusqlite::Error::QueryReturnedNoRows) => None,
                        Err(_) => {
                            busy.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                    let Some(id) = id else { return };
                    let r = conn.execute_batch(&format!(
                        "BEGIN; UPDATE naive SET state = 'done', claims = claims + 1 WHERE id = {id}; COMMIT;"
                    ));
                    if r.is_err() {
                        busy.fetch_add(1, Ordering::Relaxed);
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = start.elapsed();
    let conn = rusqlite::Connection::open(path).unwrap();
    let doubles: i64 = conn
        .query_row(
            "SELECT coalesce(sum(claims - 1), 0) FROM naive WHERE claims > 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    (elapsed, doubles as u64, busy.load(Ordering::Relaxed))
}

fn naive(c: &mut Criterion) {
    let mut g = c.benchmark_group("naive_select_then_update");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(3));
    for t in [1usize, 8] {
        let path = temp_db("naive");
        let (doubles, busy) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (d2, b2) = (doubles.clone(), busy.clone());
        g.bench_with_input(BenchmarkId::new("threads", t), &t, |b, &t| {
            b.iter_custom(|n| {
                let (elapsed, d, bz) = naive_run(&path, n, t);
                d2.fetch_add(d, Ordering::Relaxed);
                b2.fetch_add(bz, Ordering::Relaxed);
                elapsed
            })
        });
        println!(
            "naive baseline, {t} threads: {} double claims, {} BUSY errors over the run",
            doubles.load(Ordering::Relaxed),
            busy.load(Ordering::Relaxed)
        );
    }
    g.finish();
}

/// Lease acquire+release pairs with 1, 2, 4 and 8 threads sharing one
/// handle (each thread its own key), beside the mem store.
fn leases(c: &mut Criterion) {
    let mut g = c.benchmark_group("sqlite_lease_pair");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(3));
    let mem: Arc<dyn Store> = Arc::new(MemStore::new());
    let path = temp_db("leases");
    let store = sqlite(&path, Synchronous::Normal);
    for (name, store, counts) in [
        ("mem_ceiling", &mem, &[1usize][..]),
        ("normal", &store, &[1usize, 2, 4, 8][..]),
    ] {
        for &t in counts {
            g.bench_with_input(
                BenchmarkId::new(format!("{name}/threads"), t),
                &t,
                |b, &t| {
                    b.iter_custom(|n| {
                        let store = store.clone();
                        harness::spread(n, t, move |i, n| harness::own_key_pairs(&*store, i, n))
                    })
                },
            );
        }
    }
    g.finish();
}

/// Pushing jobs (8-byte payloads): `Queue::push` (a transaction each) and
/// a thousand to a transaction.
fn pushes(c: &mut Criterion) {
    let mut g = c.benchmark_group("sqlite_push");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(3));
    let store = sqlite(&temp_db("push"), Synchronous::Normal);
    let q = leasehold::Client::builder_shared(store.clone())
        .build()
        .queue("push")
        .unwrap();
    let spec = leasehold::JobSpec::new(&b"payload!"[..]);
    g.bench_function("client/one_per_txn", |b| b.iter(|| q.push(&spec).unwrap()));
    g.bench_function("store/txn_of_1000", |b| {
        b.iter_custom(|n| {
            let start = Instant::now();
            harness::push_jobs_batched(&store, "push", n, 1000);
            start.elapsed()
        })
    });
    g.finish();
}

fn main() {
    if let Ok(path) = std::env::var("LEASEHOLD_BENCH_WORKER") {
        let store = sqlite(&PathBuf::from(path), Synchronous::Normal);
        harness::drain(store, "p", 1);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    threads(&mut c);
    leases(&mut c);
    pushes(&mut c);
    processes(&mut c);
    naive(&mut c);
    c.final_summary();
}
