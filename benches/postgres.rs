//! PostgreSQL store benchmarks: claim+complete jobs/s with 1, 2, 4, 8 and 16
//! workers (threads sharing one store handle, one pooled connection each) on
//! loopback, single and batched (64) claims; in the same run, the SQLite
//! store (NORMAL) with 1 and 8 workers, the same PostgreSQL store with
//! `synchronous_commit=off` (how much is the commit's WAL flush), and the
//! ceiling of this server: two single-row autocommit UPDATEs per job (a claim
//! and a complete can commit no faster than that).
//!
//! The `store_batch64` rows are the store-level batch path a worker loop
//! builds on: `core::job::claim` of 64 and one `settle_many` of 64, two
//! transactions per 64 jobs. The `skip_locked` rows are the hand-written
//! baseline beside them: a `FOR UPDATE SKIP LOCKED` claim and a fenced
//! complete, two autocommit statements per job (or per batch of 64), no
//! rules. The `work_loop` rows run `Queue::work` instead of bare claim and
//! complete.
//!
//! The `postgres_txn_forms` rows time one transaction on one row in the
//! shapes it can take: an autocommit `UPDATE`, and a read `FOR UPDATE`
//! with the `UPDATE` in one round trip or in two (the library's per-call
//! shape, its rules running between them).
//!
//! After the criterion rows (only under `cargo bench`; `LEASEHOLD_BENCH_COST=0`
//! leaves it out, `=TEXT` keeps the rows whose name holds TEXT), a cost table: per job, the server's CPU (all
//! PostgreSQL processes of the machine, exited backends included, and the
//! benchmark's own backends alone), the client's CPU, and round trips (counted by a loopback proxy that sees
//! every request and reply, in a second pass so its own CPU stays out of
//! the first). Run only the table: `cargo bench --bench postgres -- none`.
//!
//! Needs `LEASEHOLD_TEST_PG` (a URL, e.g. postgres://postgres@127.0.0.1/test);
//! without it the benchmark prints a notice and measures nothing.
//! Run: `LEASEHOLD_TEST_PG=... cargo bench --bench postgres` (results: BENCHMARKS.md).

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // real threads, time and sockets

#[path = "support/harness.rs"]
mod harness;
#[path = "../tests/support/pg.rs"]
mod pg;
use pg::RoundTrips as Proxy;

use criterion::{BenchmarkId, Criterion, Throughput};
use leasehold::core::{self, job::Settle};
use leasehold::{
    Client, HolderId, JobState, PostgresOptions, PostgresStore, QueuePolicy, SqliteOptions,
    SqliteStore, Store, StoreExt, WorkOptions,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SCHEMA: &str = "leasehold_bench";
/// The application_name of every benchmark connection (to find its backends).
const APP: &str = "leasehold_bench";

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
    let params = format!("schema={SCHEMA}&application_name={APP}");
    Arc::new(PostgresStore::open_with(&with_params(url, &params), opts).unwrap())
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

/// Run `f` again while it fails with a transient error.
fn retrying<R>(mut f: impl FnMut() -> leasehold::Result<R>) -> R {
    for _ in 0..1_000 {
        match f() {
            Ok(r) => return r,
            Err(e) if e.is_transient() => continue,
            Err(e) => panic!("{e}"),
        }
    }
    panic!("still transient after 1000 tries");
}

/// One worker of the store-level batch path: claim up to `batch` jobs in
/// one transaction, settle them all (complete) in another, until the queue
/// is empty. Returns the jobs completed.
fn drain_store_batch(store: &dyn Store, queue: &str, holder: HolderId, batch: usize) -> u64 {
    let policy = QueuePolicy::default();
    let lease_ms = harness::QUEUE_LEASE.as_millis() as u64;
    let mut done = 0;
    loop {
        let jobs = retrying(|| {
            store.txn(|tx| core::job::claim(tx, queue, holder, lease_ms, batch, &policy))
        });
        if jobs.is_empty() {
            return done;
        }
        let settles: Vec<_> = jobs
            .iter()
            .map(|j| (j.id, j.last_token, Settle::Complete))
            .collect();
        let states =
            retrying(|| store.txn(|tx| core::job::settle_many(tx, holder, &settles, &policy)));
        assert!(states.iter().all(|s| matches!(s, Ok(JobState::Done))));
        done += jobs.len() as u64;
    }
}

/// `threads` workers drain `iters` jobs through the store-level batch path.
fn store_batch(
    store: &Arc<dyn Store>,
    queue: &str,
    iters: u64,
    threads: usize,
    batch: usize,
) -> Duration {
    harness::push_jobs_batched(store, queue, iters, 256);
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = store.clone();
            let queue = queue.to_owned();
            let holder = HolderId(t as u128 + 1);
            std::thread::spawn(move || drain_store_batch(&*store, &queue, holder, batch))
        })
        .collect();
    let done: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(done, iters);
    start.elapsed()
}

/// The hand-written baseline: `threads` connections each claim up to
/// `batch` jobs with one autocommit `UPDATE ... WHERE id IN (SELECT ...
/// FOR UPDATE SKIP LOCKED) RETURNING` and complete them with one fenced
/// autocommit UPDATE, until the table has no ready row.
fn skip_locked(url: &str, iters: u64, threads: usize, batch: i64) -> Duration {
    table_push(url, iters);
    let workers = table_workers(url, threads);
    let start = Instant::now();
    let workers = table_drain_with(workers, iters, batch);
    let elapsed = start.elapsed();
    table_workers_back(url, workers);
    elapsed
}

/// One connection of the hand-written baseline, its statements prepared.
struct TableWorker {
    c: postgres::Client,
    claim: postgres::Statement,
    complete_one: postgres::Statement,
    complete_many: postgres::Statement,
}

impl TableWorker {
    fn new(url: &str) -> TableWorker {
        let url = with_params(url, &format!("application_name={APP}"));
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let claim = c
            .prepare(&format!(
                "UPDATE {SCHEMA}_ceiling.jobs SET state = 1, token = token + 1
                 WHERE id IN (SELECT id FROM {SCHEMA}_ceiling.jobs WHERE state = 0
                              ORDER BY priority DESC, run_at, id LIMIT $1 FOR UPDATE SKIP LOCKED)
                 RETURNING id, token"
            ))
            .unwrap();
        let complete_one = c
            .prepare(&format!(
                "UPDATE {SCHEMA}_ceiling.jobs SET state = 2 WHERE id = $1 AND token = $2 AND state = 1"
            ))
            .unwrap();
        let complete_many = c
            .prepare(&format!(
                "UPDATE {SCHEMA}_ceiling.jobs AS j SET state = 2
                 FROM unnest($1::int8[], $2::int8[]) AS u(id, token)
                 WHERE j.id = u.id AND j.token = u.token AND j.state = 1"
            ))
            .unwrap();
        TableWorker {
            c,
            claim,
            complete_one,
            complete_many,
        }
    }

    /// Claim and complete until no row is ready; returns the jobs done.
    fn drain(&mut self, batch: i64) -> u64 {
        let mut done = 0;
        loop {
            let rows = self.c.query(&self.claim, &[&batch]).unwrap();
            if rows.is_empty() {
                return done;
            }
            let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
            let tokens: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
            let n = if let [id] = ids[..] {
                let params: [&(dyn postgres::types::ToSql + Sync); 2] = [&id, &tokens[0]];
                self.c.execute(&self.complete_one, &params).unwrap()
            } else {
                self.c
                    .execute(&self.complete_many, &[&ids, &tokens])
                    .unwrap()
            };
            assert_eq!(n, ids.len() as u64, "every claimed job completed");
            done += n;
        }
    }
}

type TableWorkers = Vec<(String, TableWorker)>;
static TABLE_WORKERS: std::sync::Mutex<TableWorkers> = std::sync::Mutex::new(Vec::new());

/// `n` connected baseline workers for `url` (kept between calls, so
/// connecting is never measured).
fn table_workers(url: &str, n: usize) -> Vec<TableWorker> {
    let mut kept = TABLE_WORKERS.lock().unwrap();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match kept.iter().position(|(u, _)| u == url) {
            Some(i) => out.push(kept.swap_remove(i).1),
            None => out.push(TableWorker::new(url)),
        }
    }
    out
}

fn table_workers_back(url: &str, workers: Vec<TableWorker>) {
    let mut kept = TABLE_WORKERS.lock().unwrap();
    kept.extend(workers.into_iter().map(|w| (url.to_owned(), w)));
}

/// Each worker drains on its own thread; the jobs they did add up to `jobs`.
fn table_drain_with(workers: Vec<TableWorker>, jobs: u64, batch: i64) -> Vec<TableWorker> {
    let handles: Vec<_> = workers
        .into_iter()
        .map(|mut w| {
            std::thread::spawn(move || {
                let n = w.drain(batch);
                (w, n)
            })
        })
        .collect();
    let mut done = 0;
    let mut back = Vec::new();
    for h in handles {
        let (w, n) = h.join().unwrap();
        done += n;
        back.push(w);
    }
    assert_eq!(done, jobs);
    back
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

/// The shapes one transaction on one row can take, one connection, one
/// thread, `iters` transactions: what a per-call transaction of the
/// library costs against a bare statement, and how much of that is the
/// second round trip. The statement is the same `UPDATE` in each.
#[derive(Clone, Copy, Debug)]
enum TxnForm {
    /// One autocommit `UPDATE` (what the hand-written loop sends).
    Autocommit,
    /// `BEGIN`, the row read `FOR UPDATE`, the `UPDATE`, `COMMIT`: one
    /// round trip (a simple query of four statements).
    ReadLockWriteOneTrip,
    /// The same in two round trips, the library's shape (the rules run
    /// between them): `BEGIN` with the read, then the write with `COMMIT`.
    ReadLockWriteTwoTrips,
}

fn txn_form(url: &str, iters: u64, form: TxnForm) -> Duration {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let rows = format!("{SCHEMA}_ceiling.rows");
    let read = format!("BEGIN; SELECT n FROM {rows} WHERE id = 0 FOR UPDATE");
    let write = format!("UPDATE {rows} SET n = n + 1 WHERE id = 0");
    let both = format!("{read}; {write}; COMMIT");
    let write_commit = format!("{write}; COMMIT");
    let start = Instant::now();
    for _ in 0..iters {
        match form {
            TxnForm::Autocommit => c.batch_execute(&write),
            TxnForm::ReadLockWriteOneTrip => c.batch_execute(&both),
            TxnForm::ReadLockWriteTwoTrips => c
                .batch_execute(&read)
                .and_then(|()| c.batch_execute(&write_commit)),
        }
        .unwrap();
    }
    start.elapsed()
}

fn txn_forms(c: &mut Criterion, url: &str) {
    let mut g = c.benchmark_group("postgres_txn_forms");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    for (name, form) in [
        ("autocommit_update", TxnForm::Autocommit),
        (
            "read_lock_write/one_round_trip",
            TxnForm::ReadLockWriteOneTrip,
        ),
        (
            "read_lock_write/two_round_trips",
            TxnForm::ReadLockWriteTwoTrips,
        ),
    ] {
        g.bench_function(name, |b| b.iter_custom(|n| txn_form(url, n, form)));
    }
    g.finish();
}

fn setup(url: &str) {
    admin(
        url,
        &format!(
            "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; DROP SCHEMA IF EXISTS {SCHEMA}_ceiling CASCADE;
             CREATE SCHEMA {SCHEMA}_ceiling;
             CREATE TABLE {SCHEMA}_ceiling.rows (id int PRIMARY KEY, n int8 NOT NULL);
             INSERT INTO {SCHEMA}_ceiling.rows SELECT g, 0 FROM generate_series(0, 63) g;
             CREATE TABLE {SCHEMA}_ceiling.jobs (id bigserial PRIMARY KEY, state int2 NOT NULL,
                 token int8 NOT NULL, priority int4 NOT NULL, run_at int8 NOT NULL);
             CREATE INDEX ON {SCHEMA}_ceiling.jobs (priority DESC, run_at, id) WHERE state = 0;"
        ),
    );
}

fn workers(c: &mut Criterion, url: &str) {
    let mut g = c.benchmark_group("postgres_claim_complete");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    for t in [1usize, 8] {
        g.bench_with_input(BenchmarkId::new("commit_ceiling", t), &t, |b, &t| {
            b.iter_custom(|n| commit_ceiling(url, n, t))
        });
        g.bench_with_input(BenchmarkId::new("skip_locked", t), &t, |b, &t| {
            b.iter_custom(|n| skip_locked(url, n, t, 1))
        });
        g.bench_with_input(BenchmarkId::new("skip_locked_batch64", t), &t, |b, &t| {
            b.iter_custom(|n| skip_locked(url, n, t, 64))
        });
    }
    let store = postgres(url);
    for t in [1usize, 8] {
        g.bench_with_input(BenchmarkId::new("store_batch64", t), &t, |b, &t| {
            b.iter_custom(|n| store_batch(&store, "sb", n, t, 64))
        });
    }
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
    let nosync = postgres(&with_params(url, "options=-c%20synchronous_commit%3Doff"));
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
}

// ---- The cost table ----

/// CPU time (ms) of a process and of its children it has reaped, from
/// `/proc/PID/stat` (0 if it is gone): the postmaster's reaped children
/// are the backends that exited during a measurement.
fn cpu_ms(pid: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // After the command name (which may hold spaces): fields 3.., so utime,
    // stime, cutime and cstime (fields 14 to 17) are the 12th to 15th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|v| v.parse().ok())
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    f.iter().sum::<u64>() * 1000 / hz.max(1)
}

/// CPU (ms) of every PostgreSQL process of this machine.
fn server_cpu_ms() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .map(|pid| cpu_ms(&pid))
        .sum()
}

/// CPU (ms) of the backends of this benchmark's connections (they stay
/// open between passes: the store's pool and the baseline's workers).
fn backends_cpu_ms(admin: &mut postgres::Client) -> u64 {
    admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&APP],
        )
        .unwrap()
        .iter()
        .map(|r| cpu_ms(&r.get::<_, i32>(0).to_string()))
        .sum()
}

/// The server's `host:port` of `url` (TCP only).
fn server_addr(url: &str) -> Option<String> {
    let config: postgres::Config = url.parse().ok()?;
    let host = match config.get_hosts().first()? {
        postgres::config::Host::Tcp(h) => h.clone(),
        _ => return None,
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    Some(format!("{host}:{port}"))
}

/// A workload of the cost table: `push(url, jobs)` sets up `jobs` jobs
/// (not measured), `drain(url, jobs)` works them all off.
struct Workload {
    label: &'static str,
    jobs: u64,
    push: fn(&str, u64),
    drain: fn(&str, u64),
}

/// One store handle per URL, kept, so a warm-up warms its pool.
fn cached_store(url: &str) -> Arc<dyn Store> {
    type Stores = Vec<(String, Arc<dyn Store>)>;
    static STORES: std::sync::Mutex<Stores> = std::sync::Mutex::new(Vec::new());
    let mut stores = STORES.lock().unwrap();
    if let Some((_, store)) = stores.iter().find(|(u, _)| u == url) {
        return store.clone();
    }
    let store = postgres(url);
    stores.push((url.to_owned(), store.clone()));
    store
}

/// `threads` threads run `work(thread)` and the jobs they did add up to `jobs`.
fn on_threads(jobs: u64, threads: usize, work: impl Fn(usize) -> u64 + Send + Sync + 'static) {
    let work = Arc::new(work);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let work = work.clone();
            std::thread::spawn(move || work(t))
        })
        .collect();
    let done: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(done, jobs);
}

fn store_drain(url: &str, jobs: u64, threads: usize, batch: usize) {
    let store = cached_store(url);
    on_threads(jobs, threads, move |t| {
        drain_store_batch(&*store, "cost", HolderId(t as u128 + 1), batch)
    });
}

fn client_drain(url: &str, jobs: u64, threads: usize) {
    let store = cached_store(url);
    on_threads(jobs, threads, move |_| {
        harness::drain(store.clone(), "cost", 1)
    });
}

/// One process's worker loop (`Queue::work`, default options: the claim,
/// renewal and settle batches, the adaptive prefetch) with `concurrency`
/// handlers drains the queue.
fn work_drain(url: &str, jobs: u64, concurrency: usize) {
    let q = Client::builder_shared(cached_store(url))
        .build()
        .queue("cost")
        .unwrap();
    let opts = WorkOptions {
        concurrency,
        drain: true,
        ..WorkOptions::default()
    };
    let report = q.work(&opts, &AtomicBool::new(false), |_| Ok(())).unwrap();
    assert_eq!(report.completed, jobs, "{report:?}");
}

fn store_push(url: &str, jobs: u64) {
    harness::push_jobs_batched(&cached_store(url), "cost", jobs, 256);
}

fn table_push(url: &str, jobs: u64) {
    admin(
        url,
        &format!(
            "TRUNCATE {SCHEMA}_ceiling.jobs;
             INSERT INTO {SCHEMA}_ceiling.jobs (state, token, priority, run_at)
             SELECT 0, 0, 0, g FROM generate_series(1, {jobs}) g;"
        ),
    );
}

fn table_drain(url: &str, jobs: u64, threads: usize, batch: i64) {
    let workers = table_drain_with(table_workers(url, threads), jobs, batch);
    table_workers_back(url, workers);
}

const COSTS: [Workload; 9] = [
    Workload {
        label: "store_batch64/1",
        jobs: 8192,
        push: store_push,
        drain: |u, n| store_drain(u, n, 1, 64),
    },
    Workload {
        label: "store_batch64/8",
        jobs: 16384,
        push: store_push,
        drain: |u, n| store_drain(u, n, 8, 64),
    },
    Workload {
        label: "store_batch1/8",
        jobs: 2048,
        push: store_push,
        drain: |u, n| store_drain(u, n, 8, 1),
    },
    Workload {
        label: "skip_locked_batch64/8",
        jobs: 16384,
        push: table_push,
        drain: |u, n| table_drain(u, n, 8, 64),
    },
    Workload {
        label: "skip_locked/1",
        jobs: 2048,
        push: table_push,
        drain: |u, n| table_drain(u, n, 1, 1),
    },
    Workload {
        label: "skip_locked/8",
        jobs: 4096,
        push: table_push,
        drain: |u, n| table_drain(u, n, 8, 1),
    },
    Workload {
        label: "client claim+complete/8",
        jobs: 2048,
        push: store_push,
        drain: |u, n| client_drain(u, n, 8),
    },
    Workload {
        label: "work loop/1",
        jobs: 8192,
        push: store_push,
        drain: |u, n| work_drain(u, n, 1),
    },
    Workload {
        label: "work loop/8",
        jobs: 16384,
        push: store_push,
        drain: |u, n| work_drain(u, n, 8),
    },
];

/// The counters of one side of a measurement.
struct Counters {
    server_cpu_ms: u64,
    backends_cpu_ms: u64,
    client_cpu_ms: u64,
    round_trips: u64,
}

fn counters(admin: &mut postgres::Client, proxy: &Proxy) -> Counters {
    Counters {
        server_cpu_ms: server_cpu_ms(),
        backends_cpu_ms: backends_cpu_ms(admin),
        client_cpu_ms: cpu_ms("self"),
        round_trips: proxy.count(),
    }
}

/// Measure one workload: a warm-up, a direct pass (time and CPU)
/// and a pass through the counting proxy (round trips).
fn cost_row(url: &str, proxy: &Proxy, w: &Workload) {
    let mut admin = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let proxied = proxy.proxied(url);
    let mut pass = |url: &str| {
        (w.push)(url, w.jobs / 8);
        (w.drain)(url, w.jobs / 8);
        (w.push)(url, w.jobs);
        let before = counters(&mut admin, proxy);
        let start = Instant::now();
        (w.drain)(url, w.jobs);
        let elapsed = start.elapsed();
        (before, counters(&mut admin, proxy), elapsed)
    };
    let (b, a, elapsed) = pass(url);
    let (pb, pa, _) = pass(&proxied);
    let per = |d: u64| d as f64 * 1000.0 / w.jobs as f64;
    println!(
        "cost {:<24} {:>6.0} jobs/s | server CPU {:>6.1} µs/job (its backends {:>6.1}) | client CPU {:>6.1} µs/job | round trips {:>5.3}/job",
        w.label,
        w.jobs as f64 / elapsed.as_secs_f64(),
        per(a.server_cpu_ms.saturating_sub(b.server_cpu_ms)),
        per(a.backends_cpu_ms.saturating_sub(b.backends_cpu_ms)),
        per(a.client_cpu_ms.saturating_sub(b.client_cpu_ms)),
        (pa.round_trips - pb.round_trips) as f64 / w.jobs as f64,
    );
}

fn costs(url: &str) {
    let only = std::env::var("LEASEHOLD_BENCH_COST").unwrap_or_default();
    if only == "0" {
        return;
    }
    if server_addr(url).is_none() {
        eprintln!("cost table skipped: the server is not reached over TCP");
        return;
    }
    let proxy = Proxy::start_to(url);
    println!("\ncost table (CPU from /proc: every PostgreSQL process, and this one; round trips through a counting proxy):");
    for w in COSTS.iter().filter(|w| w.label.contains(&only)) {
        cost_row(url, &proxy, w);
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let Some(url) = pg_url() else {
        eprintln!("SKIPPED: LEASEHOLD_TEST_PG is not set; the postgres benchmarks need a server");
        return;
    };
    setup(&url);
    txn_forms(&mut c, &url);
    workers(&mut c, &url);
    c.final_summary();
    if std::env::args().any(|a| a == "--bench") {
        costs(&url);
    }
    admin(
        &url,
        &format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; DROP SCHEMA IF EXISTS {SCHEMA}_ceiling CASCADE;"),
    );
}
