//! PostgreSQL store benchmarks: claim+complete jobs/s with 1, 2, 4, 8 and 16
//! workers (threads sharing one store handle, one pooled connection each) on
//! loopback, single and batched (64) claims; in the same run, the SQLite
//! store (NORMAL) with 1 and 8 workers, the same PostgreSQL store with
//! `synchronous_commit=off` (how much is the commit's WAL flush), and the
//! ceiling of this server: two single-row autocommit UPDATEs per job (a claim
//! and a complete can commit no faster than that).
//!
//! The `work_loop` rows run `Queue::work` instead of bare claim and complete.
//!
//! Needs `LEASEHOLD_TEST_PG` (a URL, e.g. postgres://postgres@127.0.0.1/test);
//! without it the benchmark prints a notice and measures nothing.
//! Run: `LEASEHOLD_TEST_PG=... cargo bench --bench postgres` (results: BENCHMARKS.md).

#![allow(clippy::disallowed_methods)] // benchmarks use real threads and time

#[path = "support/harness.rs"]
mod harness;

use criterion::{BenchmarkId, Criterion, Throughput};
use leasehold::{
    Client, PostgresOptions, PostgresStore, SqliteOptions, SqliteStore, Store, WorkOptions,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SCHEMA: &str = "leasehold_bench";

fn pg_url() -> Option<String> {
    std::env::var("LEASEHOLD_TEST_PG")
        .ok()
        .filter(|u| !u.is_empty())
}

fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

fn admin(url: &str, sql: &str) {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.batch_execute(sql).unwrap();
}

fn postgres(url: &str) -> Arc<dyn Store> {
    let opts = PostgresOptions {
        max_connections: 32,
        ..PostgresOptions::default()
    };
    Arc::new(
        PostgresStore::open_with(&with_params(url, &format!("schema={SCHEMA}")), opts).unwrap(),
    )
}

/// `threads` workers running the worker loop (`Queue::work`: keep-alive,
/// validity checks, wake-ups) drain `iters` jobs: what the loop costs on top
/// of bare claim and complete.
fn timed_work(store: &Arc<dyn Store>, queue: &str, iters: u64, threads: usize) -> Duration {
    harness::push_jobs(store, queue, iters);
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let store = store.clone();
            let queue = queue.to_owned();
            std::thread::spawn(move || {
                let q = Client::builder_shared(store).build().queue(&queue).unwrap();
                let opts = WorkOptions {
                    lease: harness::QUEUE_LEASE,
                    batch: 1,
                    drain: true,
                    ..WorkOptions::default()
                };
                q.work(&opts, &AtomicBool::new(false), |_| Ok(()))
                    .unwrap()
                    .completed
            })
        })
        .collect();
    let done: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(done, iters);
    start.elapsed()
}

/// The server's ceiling: `threads` connections each run two single-row
/// autocommit UPDATEs per job (two commits, one round trip each).
fn commit_ceiling(url: &str, iters: u64, threads: usize) -> Duration {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (url, next) = (url.to_owned(), next.clone());
            std::thread::spawn(move || {
                let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                let stmt = c
                    .prepare(&format!(
                        "UPDATE {SCHEMA}_ceiling.rows SET n = n + 1 WHERE id = $1"
                    ))
                    .unwrap();
                while next.fetch_add(1, Ordering::Relaxed) < iters {
                    for _ in 0..2 {
                        c.execute(&stmt, &[&(t as i32)]).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    start.elapsed()
}

fn workers(c: &mut Criterion) {
    let Some(url) = pg_url() else {
        eprintln!("SKIPPED: LEASEHOLD_TEST_PG is not set; the postgres benchmarks need a server");
        return;
    };
    admin(
        &url,
        &format!(
            "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; DROP SCHEMA IF EXISTS {SCHEMA}_ceiling CASCADE;
             CREATE SCHEMA {SCHEMA}_ceiling;
             CREATE TABLE {SCHEMA}_ceiling.rows (id int PRIMARY KEY, n int8 NOT NULL);
             INSERT INTO {SCHEMA}_ceiling.rows SELECT g, 0 FROM generate_series(0, 63) g;"
        ),
    );
    let mut g = c.benchmark_group("postgres_claim_complete");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    for t in [1usize, 8] {
        g.bench_with_input(BenchmarkId::new("commit_ceiling", t), &t, |b, &t| {
            b.iter_custom(|n| commit_ceiling(&url, n, t))
        });
    }
    let store = postgres(&url);
    for t in [1usize, 2, 4, 8, 16] {
        g.bench_with_input(BenchmarkId::new("postgres/threads", t), &t, |b, &t| {
            b.iter_custom(|n| harness::timed_drain(&store, "q", n, t, 1))
        });
    }
    for t in [1usize, 4] {
        g.bench_with_input(BenchmarkId::new("postgres/batch64", t), &t, |b, &t| {
            b.iter_custom(|n| harness::timed_drain(&store, "q", n, t, 64))
        });
    }
    g.bench_function("postgres/work_loop/8", |b| {
        b.iter_custom(|n| timed_work(&store, "w", n, 8))
    });
    let nosync = postgres(&with_params(&url, "options=-c%20synchronous_commit%3Doff"));
    g.bench_function("postgres_async_commit/threads/8", |b| {
        b.iter_custom(|n| harness::timed_drain(&nosync, "async", n, 8, 1))
    });
    let dir = std::env::temp_dir().join(format!("leasehold-bench-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite: Arc<dyn Store> =
        Arc::new(SqliteStore::open_with(dir.join("bench.db"), SqliteOptions::default()).unwrap());
    for t in [1usize, 8] {
        g.bench_with_input(BenchmarkId::new("sqlite/threads", t), &t, |b, &t| {
            b.iter_custom(|n| harness::timed_drain(&sqlite, "q", n, t, 1))
        });
    }
    g.bench_function("sqlite/work_loop/8", |b| {
        b.iter_custom(|n| timed_work(&sqlite, "w", n, 8))
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
    admin(
        &url,
        &format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; DROP SCHEMA IF EXISTS {SCHEMA}_ceiling CASCADE;"),
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    workers(&mut c);
    c.final_summary();
}
