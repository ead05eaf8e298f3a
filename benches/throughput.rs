//! The same work for every system, side by side in one run: 20,000 ready
//! jobs, a handler that succeeds at once, timed until all are done.
//!
//! - leasehold's worker loop (`Queue::work`) with 1 and 8 handlers, on
//!   SQLite and (with `LEASEHOLD_TEST_PG`) PostgreSQL, and the tokio loop
//!   (`leasehold::tokio::Queue::work`, async handlers) beside it, and four
//!   workers of 2 handlers on one queue, each with a store of its own (as
//!   four processes would have);
//! - leasehold's own `claim` + `complete` in a plain loop (no worker loop),
//!   one transaction each, on SQLite and PostgreSQL;
//! - a hand-written best-practice SQLite loop (BEGIN IMMEDIATE, one UPDATE
//!   ... RETURNING with an ordered sub-select, a fenced complete), one job
//!   per transaction and 64 per transaction;
//! - a hand-written PostgreSQL loop (a SKIP LOCKED claim and a fenced
//!   complete, two autocommit statements per job) on 1 and 8 connections.
//!
//! Every run checks at its end that each job is done exactly once and none
//! is left running; the process's peak RSS is written to
//! `target/bench-throughput-rss.log`.
//!
//! Run: `cargo bench --bench throughput` (results: BENCHMARKS.md).

#![allow(clippy::disallowed_methods)] // benchmarks use real threads and time

use criterion::{Criterion, Throughput};
use leasehold::{Client, JobSpec, JobState, SqliteStore, Store, StoreExt, WorkOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const JOBS: u64 = 20_000;

fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "leasehold-throughput-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fresh_queue() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("q{}", N.fetch_add(1, Ordering::SeqCst))
}

/// 20,000 ready jobs in `queue` (pushed in transactions of 1,000).
fn push(store: &Arc<dyn Store>, queue: &str) {
    let policy = leasehold::QueuePolicy::default();
    for _ in 0..JOBS / 1000 {
        store
            .txn(|tx| {
                for _ in 0..1000 {
                    leasehold::core::job::enqueue(tx, queue, &JobSpec::new("x"), &policy)?;
                }
                Ok(())
            })
            .unwrap();
    }
}

/// Every job done exactly once, none running.
fn check_done(store: &Arc<dyn Store>, queue: &str) {
    let policy = leasehold::QueuePolicy::default();
    let c = store
        .txn(|tx| leasehold::core::job::stats(tx, queue, &policy))
        .unwrap();
    assert_eq!(
        (c.get(JobState::Done), c.total()),
        (JOBS, JOBS),
        "{queue}: {c:?}"
    );
}

/// One run of the worker loop with `concurrency` handlers: the time to
/// drain the 20,000 jobs.
fn work_loop(store: &Arc<dyn Store>, concurrency: usize) -> Duration {
    let queue = fresh_queue();
    push(store, &queue);
    let client = Client::builder_shared(store.clone()).build();
    let q = client.queue(&queue).unwrap();
    // Default options but the handler count: the prefetch adapts by itself.
    let opts = WorkOptions {
        concurrency,
        drain: true,
        ..WorkOptions::default()
    };
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let report = q.work(&opts, &stop, |_| Ok(())).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(report.completed, JOBS, "{report:?}");
    check_done(store, &queue);
    elapsed
}

/// Four workers on one queue, each with its own store (its own sessions
/// and listener, as four processes on one database would have) and 2
/// handlers: the time until the 20,000 jobs are done. Where claims of
/// different workers overlap (PostgreSQL), this is where their commits
/// meet.
fn four_workers(open: &dyn Fn() -> Arc<dyn Store>) -> Duration {
    let queue = fresh_queue();
    let stores: Vec<Arc<dyn Store>> = (0..4).map(|_| open()).collect();
    push(&stores[0], &queue);
    let start = Instant::now();
    let completed: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = stores
            .iter()
            .map(|store| {
                let queue = &queue;
                s.spawn(move || {
                    let client = Client::builder_shared(store.clone()).build();
                    let q = client.queue(queue).unwrap();
                    let opts = WorkOptions {
                        concurrency: 2,
                        drain: true,
                        ..WorkOptions::default()
                    };
                    q.work(&opts, &AtomicBool::new(false), |_| Ok(()))
                        .unwrap()
                        .completed
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let elapsed = start.elapsed();
    assert_eq!(completed, JOBS);
    check_done(&stores[0], &queue);
    elapsed
}

/// The same with the tokio worker loop (`leasehold::tokio::Queue::work`)
/// on a two-thread runtime: the handler is an async fn that succeeds.
fn tokio_work_loop(store: &Arc<dyn Store>, concurrency: usize) -> Duration {
    let queue = fresh_queue();
    push(store, &queue);
    let client = leasehold::tokio::Client::new(Client::builder_shared(store.clone()).build());
    let q = client.queue(&queue).unwrap();
    let opts = WorkOptions {
        concurrency,
        drain: true,
        ..WorkOptions::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let start = Instant::now();
    let report = rt
        .block_on(q.work(&opts, std::future::pending(), |_| async { Ok(()) }))
        .unwrap();
    let elapsed = start.elapsed();
    assert_eq!(report.completed, JOBS, "{report:?}");
    check_done(store, &queue);
    elapsed
}

/// leasehold's claim + complete in a plain loop, one transaction each.
fn plain_loop(store: &Arc<dyn Store>) -> Duration {
    let queue = fresh_queue();
    push(store, &queue);
    let client = Client::builder_shared(store.clone()).build();
    let q = client.queue(&queue).unwrap();
    let start = Instant::now();
    while let Some(job) = q.claim(Duration::from_secs(30)).unwrap() {
        job.complete().unwrap();
    }
    let elapsed = start.elapsed();
    check_done(store, &queue);
    elapsed
}

mod hand_sqlite {
    //! What a careful user writes by hand on SQLite.
    use super::*;
    use rusqlite::{params, Connection};

    pub fn open(dir: &std::path::Path) -> Connection {
        let c = Connection::open(dir.join("hand.db")).unwrap();
        c.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, queue TEXT NOT NULL,
               state INTEGER NOT NULL, priority INTEGER NOT NULL, run_at INTEGER NOT NULL,
               token INTEGER NOT NULL, lease_until INTEGER, payload BLOB);
             CREATE INDEX IF NOT EXISTS ready ON jobs (queue, priority DESC, run_at, id) WHERE state = 0;",
        )
        .unwrap();
        c
    }

    pub fn run(c: &Connection, per_txn: usize) -> Duration {
        let queue = fresh_queue();
        c.execute_batch("BEGIN").unwrap();
        for i in 0..JOBS {
            c.execute(
                "INSERT INTO jobs (queue, state, priority, run_at, token, payload) VALUES (?1, 0, 0, ?2, 0, x'78')",
                params![queue, i as i64],
            )
            .unwrap();
        }
        c.execute_batch("COMMIT").unwrap();
        let claim = format!(
            "UPDATE jobs SET state = 2, token = token + 1, lease_until = 30000
             WHERE id IN (SELECT id FROM jobs WHERE queue = ?1 AND state = 0
                          ORDER BY priority DESC, run_at, id LIMIT {per_txn})
             RETURNING id, token"
        );
        let start = Instant::now();
        loop {
            c.execute_batch("BEGIN IMMEDIATE").unwrap();
            let claimed: Vec<(i64, i64)> = {
                let mut s = c.prepare_cached(&claim).unwrap();
                let rows = s
                    .query_map([&queue], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap();
                rows.map(Result::unwrap).collect()
            };
            c.execute_batch("COMMIT").unwrap();
            if claimed.is_empty() {
                break;
            }
            c.execute_batch("BEGIN IMMEDIATE").unwrap();
            for (id, token) in claimed {
                let n = c
                    .prepare_cached(
                        "UPDATE jobs SET state = 3 WHERE id = ?1 AND state = 2 AND token = ?2",
                    )
                    .unwrap()
                    .execute(params![id, token])
                    .unwrap();
                assert_eq!(n, 1);
            }
            c.execute_batch("COMMIT").unwrap();
        }
        let elapsed = start.elapsed();
        let done: i64 = c
            .query_row(
                "SELECT count(*) FROM jobs WHERE queue = ?1 AND state = 3",
                [&queue],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(done as u64, JOBS);
        elapsed
    }
}

mod hand_pg {
    //! What a careful user writes by hand on PostgreSQL: a SKIP LOCKED claim
    //! and a fenced complete, two autocommit statements per job.
    use super::*;

    pub fn setup(url: &str, schema: &str) {
        let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
        c.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
             CREATE TABLE {schema}.jobs (id bigserial PRIMARY KEY, queue text NOT NULL,
               state int2 NOT NULL, priority int4 NOT NULL, token int8 NOT NULL, payload bytea);
             CREATE INDEX ready ON {schema}.jobs (queue, priority DESC, id) WHERE state = 0;"
        ))
        .unwrap();
    }

    pub fn run(url: &str, schema: &str, threads: usize) -> Duration {
        let queue = fresh_queue();
        let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
        c.execute(
            &format!(
                "INSERT INTO {schema}.jobs (queue, state, priority, token, payload)
                 SELECT $1, 0, 0, 0, '\\x78' FROM generate_series(1, $2::int8)"
            ),
            &[&queue, &(JOBS as i64)],
        )
        .unwrap();
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
                    let claim = c
                        .prepare(&format!(
                            "UPDATE {schema}.jobs SET state = 2, token = token + 1
                             WHERE id = (SELECT id FROM {schema}.jobs WHERE queue = $1 AND state = 0
                                         ORDER BY priority DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED)
                             RETURNING id, token"
                        ))
                        .unwrap();
                    let complete = c
                        .prepare(&format!(
                            "UPDATE {schema}.jobs SET state = 3 WHERE id = $1 AND state = 2 AND token = $2"
                        ))
                        .unwrap();
                    while let Some(row) = c.query_opt(&claim, &[&queue]).unwrap() {
                        let (id, token): (i64, i64) = (row.get(0), row.get(1));
                        assert_eq!(c.execute(&complete, &[&id, &token]).unwrap(), 1);
                    }
                });
            }
        });
        let elapsed = start.elapsed();
        let done: i64 = c
            .query_one(
                &format!("SELECT count(*) FROM {schema}.jobs WHERE queue = $1 AND state = 3"),
                &[&queue],
            )
            .unwrap()
            .get(0);
        assert_eq!(done as u64, JOBS);
        elapsed
    }
}

/// Per operation: (transactions, seconds inside them), read from the
/// library's own `leasehold_transaction_seconds` metric.
fn txn_totals(text: &str) -> std::collections::BTreeMap<String, (f64, f64)> {
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines() {
        let (kind, rest) =
            if let Some(r) = line.strip_prefix("leasehold_transaction_seconds_count{") {
                (0, r)
            } else if let Some(r) = line.strip_prefix("leasehold_transaction_seconds_sum{") {
                (1, r)
            } else {
                continue;
            };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let op = labels
            .split(',')
            .find_map(|l| l.strip_prefix("op=\""))
            .map(|o| o.trim_end_matches('"').to_owned())
            .unwrap_or_default();
        let v: f64 = value.trim().parse().unwrap_or(0.0);
        let e = out.entry(op).or_insert((0.0, 0.0));
        if kind == 0 {
            e.0 += v
        } else {
            e.1 += v
        }
    }
    out
}

/// Where the worker loop's time goes, against the plain loop: one pass of
/// each with the library's metrics on (a Prometheus recorder), reporting
/// transactions per job by operation and the time inside them per job;
/// what is left of the wall time is the loop's own work and its threads'
/// hand-offs. Written to `target/bench-throughput-breakdown.log`.
fn where_time_goes(stores: &[(&str, &Arc<dyn Store>)]) {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    if metrics::set_global_recorder(recorder).is_err() {
        return;
    }
    let mut lines = vec![
        "| loop | jobs/s | wall µs/job | transactions per job (claim, heartbeat, settle, other) | µs/job inside transactions |".to_owned(),
        "|---|---|---|---|---|".to_owned(),
    ];
    for (name, store) in stores {
        let runs: [(&str, &dyn Fn() -> Duration); 3] = [
            ("work_loop/1", &|| work_loop(store, 1)),
            ("work_loop/8", &|| work_loop(store, 8)),
            ("plain_claim_complete/1", &|| plain_loop(store)),
        ];
        for (label, run) in runs {
            let before = txn_totals(&handle.render());
            let wall = run();
            let after = txn_totals(&handle.render());
            let delta = |op: &str| {
                let (a, b) = (
                    after.get(op).copied().unwrap_or_default(),
                    before.get(op).copied().unwrap_or_default(),
                );
                (a.0 - b.0, a.1 - b.1)
            };
            let per_job = |n: f64| n / JOBS as f64;
            let (claim, heartbeat, settle) = (delta("claim"), delta("heartbeat"), delta("settle"));
            let all: (f64, f64) = after
                .keys()
                .map(|op| delta(op))
                .fold((0.0, 0.0), |acc, d| (acc.0 + d.0, acc.1 + d.1));
            let other = all.0 - claim.0 - heartbeat.0 - settle.0;
            lines.push(format!(
                "| {name}/{label} | {:.1}k | {:.1} | {:.3}, {:.4}, {:.3}, {:.3} | {:.1} |",
                JOBS as f64 / wall.as_secs_f64() / 1e3,
                wall.as_secs_f64() * 1e6 / JOBS as f64,
                per_job(claim.0),
                per_job(heartbeat.0),
                per_job(settle.0),
                per_job(other),
                per_job(all.1) * 1e6,
            ));
        }
    }
    let text = lines.join("\n");
    println!("\nwhere the time goes (one pass each, metrics on):\n{text}");
    let _ = std::fs::write("target/bench-throughput-breakdown.log", text + "\n");
}

/// Each iteration is one whole run (20,000 jobs).
fn runs(n: u64, mut run: impl FnMut() -> Duration) -> Duration {
    (0..n).map(|_| run()).sum()
}

fn same_work(c: &mut Criterion) {
    let mut g = c.benchmark_group("same_work_20k");
    g.throughput(Throughput::Elements(JOBS));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    let dir = temp_dir("sqlite");
    let sqlite: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.join("lh.db")).unwrap());
    let mut breakdown: Vec<(&str, Arc<dyn Store>)> = vec![("sqlite", sqlite.clone())];
    let mut cleanup = None;
    for n in [1usize, 8] {
        g.bench_function(format!("sqlite/work_loop/{n}"), |b| {
            b.iter_custom(|iters| runs(iters, || work_loop(&sqlite, n)))
        });
    }
    for n in [1usize, 8] {
        g.bench_function(format!("sqlite/tokio_work_loop/{n}"), |b| {
            b.iter_custom(|iters| runs(iters, || tokio_work_loop(&sqlite, n)))
        });
    }
    let open_sqlite =
        || -> Arc<dyn Store> { Arc::new(SqliteStore::open(dir.join("lh.db")).unwrap()) };
    g.bench_function("sqlite/four_workers/2", |b| {
        b.iter_custom(|iters| runs(iters, || four_workers(&open_sqlite)))
    });
    g.bench_function("sqlite/plain_claim_complete/1", |b| {
        b.iter_custom(|iters| runs(iters, || plain_loop(&sqlite)))
    });
    let hand = hand_sqlite::open(&dir);
    for per in [1usize, 64] {
        g.bench_function(format!("sqlite/hand_written/txn_of_{per}"), |b| {
            b.iter_custom(|iters| runs(iters, || hand_sqlite::run(&hand, per)))
        });
    }
    if let Some(url) = std::env::var("LEASEHOLD_TEST_PG")
        .ok()
        .filter(|u| !u.is_empty())
    {
        let schema = format!("lh_throughput_{}", std::process::id());
        let lh = format!("{url}?schema={schema}_lh");
        let pg: Arc<dyn Store> = Arc::new(leasehold::PostgresStore::open(&lh).unwrap());
        breakdown.push(("postgres", pg.clone()));
        for n in [1usize, 8] {
            g.bench_function(format!("postgres/work_loop/{n}"), |b| {
                b.iter_custom(|iters| runs(iters, || work_loop(&pg, n)))
            });
            g.bench_function(format!("postgres/tokio_work_loop/{n}"), |b| {
                b.iter_custom(|iters| runs(iters, || tokio_work_loop(&pg, n)))
            });
        }
        let open_pg =
            || -> Arc<dyn Store> { Arc::new(leasehold::PostgresStore::open(&lh).unwrap()) };
        g.bench_function("postgres/four_workers/2", |b| {
            b.iter_custom(|iters| runs(iters, || four_workers(&open_pg)))
        });
        g.bench_function("postgres/plain_claim_complete/1", |b| {
            b.iter_custom(|iters| runs(iters, || plain_loop(&pg)))
        });
        hand_pg::setup(&url, &schema);
        for n in [1usize, 8] {
            g.bench_function(format!("postgres/hand_written/{n}"), |b| {
                b.iter_custom(|iters| runs(iters, || hand_pg::run(&url, &schema, n)))
            });
        }
        cleanup = Some((url, schema));
    } else {
        eprintln!("SKIPPED: the PostgreSQL rows: LEASEHOLD_TEST_PG is not set");
    }
    g.finish();
    let stores: Vec<(&str, &Arc<dyn Store>)> = breakdown.iter().map(|(n, s)| (*n, s)).collect();
    where_time_goes(&stores);
    drop(breakdown);
    if let Some((url, schema)) = cleanup {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let _ = c.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; DROP SCHEMA IF EXISTS {schema}_lh CASCADE"
        ));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if let Some(hwm) = status.lines().find(|l| l.starts_with("VmHWM")) {
        let line = format!("throughput bench peak RSS ({hwm})");
        eprintln!("{line}");
        let _ = std::fs::write("target/bench-throughput-rss.log", line + "\n");
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    same_work(&mut c);
    c.final_summary();
}
