//! `leasehold ui` on a store with a million finished jobs: the time of one
//! HTTP request per page and API call, against the release binary (a
//! fresh connection each, as a browser's refresh is), measured from this
//! process. Each page's reads go through indexes, so the figures should
//! not depend on the million.
//!
//! The store (SQLite, `target/tmp/bench-ui/1m.db`; with `LEASEHOLD_TEST_PG`
//! set, also the PostgreSQL schema `lh_bench_ui_1m`; each made once
//! through the library and kept): queue `bench` with 1,000,000 finished
//! jobs spread over ten days (98.5 % done, 1 % dead, 0.5 % cancelled),
//! 1,000 ready (ten of them with 1 MiB payloads) and 100 scheduled; queue
//! `running` with 10 running jobs; queue `small` with one; 200 held keys.
//!
//! Run: `cargo bench --bench ui` (figures: BENCHMARKS.md, "leasehold ui").

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // a server, sockets, time

use criterion::Criterion;
use leasehold::core::{self, job::Settle};
use leasehold::{
    HolderId, JobSpec, ManualClock, PostgresOptions, PostgresStore, QueuePolicy, SqliteOptions,
    SqliteStore, Store, StoreExt,
};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const FINISHED: u64 = 1_000_000;
const BATCH: u64 = 5_000;
const TEN_DAYS_MS: u64 = 10 * 86_400_000;

/// Fill `store` through the library, on `clock`, which walks ten days.
fn build(store: &dyn Store, clock: &ManualClock) {
    let policy = QueuePolicy::default();
    let worker = HolderId(1);
    for batch in 0..FINISHED / BATCH {
        clock.advance(TEN_DAYS_MS / (FINISHED / BATCH));
        store
            .txn(|tx| {
                for i in 0..BATCH {
                    let n = batch * BATCH + i;
                    let spec = JobSpec {
                        max_attempts: 1,
                        ..JobSpec::new(format!("{{\"job\":{n}}}"))
                    };
                    let id = core::job::enqueue(tx, "bench", &spec, &policy)?.id;
                    if n % 200 == 0 {
                        core::job::cancel(tx, id, &policy)?;
                    }
                }
                let claimed =
                    core::job::claim(tx, "bench", worker, 60_000, BATCH as usize, &policy)?;
                let settles: Vec<_> = claimed
                    .iter()
                    .map(|j| {
                        let s = if j.id.0 % 100 == 1 {
                            Settle::Fail("boom".into())
                        } else {
                            Settle::Complete
                        };
                        (j.id, j.last_token, s)
                    })
                    .collect();
                core::job::settle_many(tx, worker, &settles, &policy)?;
                Ok(())
            })
            .unwrap();
    }
    live(store, &policy);
}

/// What is waiting and running, and the held keys.
fn live(store: &dyn Store, policy: &QueuePolicy) {
    let big = vec![b'x'; 1 << 20];
    store
        .txn(|tx| {
            for i in 0..1_000u32 {
                let payload = if i % 100 == 0 {
                    big.clone()
                } else {
                    format!("ready {i}").into_bytes()
                };
                let spec = JobSpec {
                    priority: (i % 3) as i32,
                    ..JobSpec::new(payload)
                };
                core::job::enqueue(tx, "bench", &spec, policy)?;
            }
            for i in 0..100 {
                let spec = JobSpec {
                    delay_ms: 86_400_000,
                    ..JobSpec::new(format!("later {i}"))
                };
                core::job::enqueue(tx, "bench", &spec, policy)?;
            }
            for i in 0..10 {
                core::job::enqueue(tx, "running", &JobSpec::new(format!("r {i}")), policy)?;
            }
            core::job::claim(tx, "running", HolderId(2), 300 * 86_400_000, 10, policy)?;
            core::job::enqueue(tx, "small", &JobSpec::new("s"), policy)?;
            for k in 0..200u128 {
                let holder = leasehold::Holder::with_label(HolderId(k + 10), "bench")?;
                core::lease::acquire(tx, &format!("key-{k:03}"), &holder, 300 * 86_400_000, 1)?;
            }
            Ok(())
        })
        .unwrap();
}

/// The SQLite store, built once (a marker file says it is complete);
/// its URL.
fn sqlite_store() -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-ui");
    let path = dir.join("1m.db");
    let done = dir.join("1m.done");
    if !done.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        eprintln!("building {} (once)...", path.display());
        let clock = ManualClock::new(1_000_000);
        let opts = SqliteOptions {
            clock: Some(Arc::new(clock.clone())),
            boot_id: Some("bench-setup".into()),
            ..SqliteOptions::default()
        };
        build(&SqliteStore::open_with(&path, opts).unwrap(), &clock);
        std::fs::write(&done, "").unwrap();
    }
    format!("sqlite:{}", path.display())
}

/// The PostgreSQL schema, built once (kept while it holds the million),
/// then vacuumed and analyzed; its URL. Store time there is the server's
/// epoch clock: the manual clock of the build ends about now.
fn postgres_store(server: &str) -> String {
    let url = format!("{server}?schema=lh_bench_ui_1m");
    let count = |store: &PostgresStore| {
        store
            .txn(|tx| tx.jobs()?.counts_capped("bench", FINISHED))
            .map(|c| c.total())
    };
    let store = PostgresStore::open(&url).unwrap();
    if count(&store).unwrap_or(0) >= FINISHED {
        return url;
    }
    eprintln!("building {url} (once; minutes)...");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let clock = ManualClock::new(now_ms - TEN_DAYS_MS - 60_000);
    let opts = PostgresOptions {
        clock: Some(Arc::new(clock.clone())),
        ..PostgresOptions::default()
    };
    build(&PostgresStore::open_with(&url, opts).unwrap(), &clock);
    // What autovacuum does soon after a load like this one: statistics
    // (without them the planner takes a million rows for a few dozen) and
    // the visibility map (for index-only scans).
    let mut admin = postgres::Client::connect(server, postgres::NoTls).unwrap();
    admin
        .batch_execute("VACUUM ANALYZE lh_bench_ui_1m.jobs")
        .unwrap();
    url
}

/// `leasehold ui` on `store`, stopped when dropped.
struct Ui(Child, String);

impl Ui {
    fn start(store: &str, extra: &[&str]) -> Ui {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["ui", "--listen", "127.0.0.1:0", "--refresh", "0s"])
            .args(extra)
            .env("LEASEHOLD_STORE", store)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .unwrap();
        Ui(child, addr.to_owned())
    }

    /// One GET on a fresh connection; the answer's length (200 required).
    fn get(&self, path: &str) -> usize {
        let mut s = TcpStream::connect(&self.1).unwrap();
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.1
        );
        s.write_all(head.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        assert!(
            raw.starts_with(b"HTTP/1.1 200"),
            "{path}: {}",
            String::from_utf8_lossy(&raw[..raw.len().min(300)])
        );
        raw.len()
    }
}

impl Drop for Ui {
    fn drop(&mut self) {
        // SAFETY: signalling the child this benchmark started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// Every page and API call, one request at a time, in group `group`.
fn pages(c: &mut Criterion, group: &str, store: &str) {
    let ui = Ui::start(store, &[]);
    // Half way down the done jobs: after batch 99 of 200 finished.
    let deep = format!(
        "0.{}.500000",
        1_000_000 + 100 * (TEN_DAYS_MS / (FINISHED / BATCH))
    );
    let mut g = c.benchmark_group(group);
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(4));
    let routes = [
        ("queues", "/queues".to_owned()),
        ("api_queues", "/api/queues".to_owned()),
        ("jobs_done", "/jobs?queue=bench&state=done".to_owned()),
        (
            "jobs_done_deep",
            format!("/jobs?queue=bench&state=done&after={deep}"),
        ),
        ("jobs_dead", "/jobs?queue=bench&state=dead".to_owned()),
        ("jobs_ready", "/jobs?queue=bench&state=ready".to_owned()),
        (
            "api_jobs_done",
            "/api/jobs?queue=bench&state=done".to_owned(),
        ),
        ("job", "/jobs/500000".to_owned()),
        ("leases", "/leases".to_owned()),
        ("metrics", "/metrics".to_owned()),
    ];
    for (name, route) in &routes {
        g.bench_function(*name, |b| b.iter(|| ui.get(route)));
    }
    drop(ui);
    // The price of exact counts: every state counted to the end.
    let exact = Ui::start(store, &["--count-cap", "100000000"]);
    g.bench_function("api_queues_exact_counts", |b| {
        b.iter(|| exact.get("/api/queues"))
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    pages(&mut c, "ui_1m_finished", &sqlite_store());
    match std::env::var("LEASEHOLD_TEST_PG") {
        Ok(server) if !server.is_empty() => {
            pages(&mut c, "ui_1m_finished_postgres", &postgres_store(&server));
        }
        _ => eprintln!("SKIPPED: the PostgreSQL group (LEASEHOLD_TEST_PG is not set)"),
    }
    c.final_summary();
}
