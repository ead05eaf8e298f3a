//! Push-to-start latency under load (issue 24), through the API users
//! call (`Queue::push` in one process, `Queue::work` in another), per
//! store, as a distribution:
//!
//! - `steady`: 4 pusher processes push 1,000 jobs/s between them (each
//!   job carries its push instant) for 10 s while one worker loop with 8
//!   handlers runs them; each job's start minus its push.
//! - `backlog`: the worker drains a backlog of 300,000 jobs while a probe
//!   pushes a higher-priority job every 10 ms (100 of them, all while the
//!   backlog lasts): how soon a job that should go first starts while the
//!   loop is busy (its prefetched jobs go first).
//!
//! Instants are the machine's realtime clock (one machine, so one clock).
//! The figures (p50, p90, p99, max and a histogram) are printed and
//! written to `target/latency/load-*.txt` for BENCHMARKS.md. PostgreSQL
//! runs when `LEASEHOLD_TEST_PG` is set.
//!
//! Run: `cargo bench --bench load_latency`.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // processes, time

use leasehold::{Client, JobSpec, PostgresStore, SqliteStore, Store, WorkOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Makes this binary a pusher process: `URL|QUEUE|RATE|SECONDS`.
const PUSHER: &str = "LEASEHOLD_BENCH_PUSHER";

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn open(url: &str) -> Arc<dyn Store> {
    match url.strip_prefix("sqlite:") {
        Some(path) => Arc::new(SqliteStore::open(path).unwrap()),
        None => Arc::new(PostgresStore::open(url).unwrap()),
    }
}

/// A pusher process: `rate` jobs/s for `seconds`, each carrying its push
/// instant, evenly spaced.
fn pusher(spec: &str) {
    let mut parts = spec.split('|');
    let (url, queue) = (parts.next().unwrap(), parts.next().unwrap());
    let rate: u64 = parts.next().unwrap().parse().unwrap();
    let seconds: u64 = parts.next().unwrap().parse().unwrap();
    let client = Client::builder_shared(open(url)).build();
    let q = client.queue(queue).unwrap();
    let start = Instant::now();
    for n in 0..rate * seconds {
        let due = start + Duration::from_nanos(n * 1_000_000_000 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        q.push(&JobSpec::new(wall_ns().to_string())).unwrap();
    }
}

/// What the handlers saw: start minus push, per job (ns).
#[derive(Default)]
struct Seen(Mutex<Vec<u64>>);

impl Seen {
    fn record(&self, payload: &[u8]) {
        let pushed: u64 = std::str::from_utf8(payload)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if pushed > 0 {
            self.0
                .lock()
                .unwrap()
                .push(wall_ns().saturating_sub(pushed));
        }
    }

    fn report(&self, name: &str) {
        let mut all = self.0.lock().unwrap().clone();
        assert!(!all.is_empty(), "{name}: nothing measured");
        all.sort_unstable();
        let ms = |ns: u64| ns as f64 / 1e6;
        let at = |q: f64| ms(all[((all.len() - 1) as f64 * q).round() as usize]);
        let mut text = format!(
            "{name}: n={} p50={:.2}ms p90={:.2}ms p99={:.2}ms max={:.2}ms\n",
            all.len(),
            at(0.5),
            at(0.9),
            at(0.99),
            ms(all[all.len() - 1])
        );
        let bounds = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, f64::INFINITY];
        let mut from = 0.0;
        for to in bounds {
            let n = all
                .iter()
                .filter(|&&ns| ms(ns) >= from && ms(ns) < to)
                .count();
            if n > 0 {
                let share = 100.0 * n as f64 / all.len() as f64;
                text += &format!("  [{from:>5} ms, {to:>5} ms): {n:>6} ({share:5.1} %)\n");
            }
            from = to;
        }
        print!("{text}");
        let dir = PathBuf::from("target/latency");
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(
            dir.join(format!("load-{}.txt", name.replace('/', "_"))),
            text,
        );
    }
}

fn worker_opts() -> WorkOptions {
    WorkOptions {
        concurrency: 8,
        schedules: None,
        ..WorkOptions::default()
    }
}

/// 4 processes push 1,000 jobs/s for 10 s; one worker loop runs them.
fn steady(url: &str, name: &str) {
    let client = Client::builder_shared(open(url)).build();
    let queue = format!("steady{}", std::process::id());
    let q = client.queue(&queue).unwrap();
    let seen = Seen::default();
    let stop = AtomicBool::new(false);
    let (processes, rate, seconds) = (4u64, 250u64, 10u64);
    std::thread::scope(|s| {
        s.spawn(|| {
            q.work(&worker_opts(), &stop, |job| {
                seen.record(job.payload());
                Ok(())
            })
            .unwrap();
        });
        let exe = std::env::current_exe().unwrap();
        let children: Vec<_> = (0..processes)
            .map(|_| {
                std::process::Command::new(&exe)
                    .env(PUSHER, format!("{url}|{queue}|{rate}|{seconds}"))
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut c in children {
            assert!(c.wait().unwrap().success());
        }
        // The last pushes run.
        let expected = (processes * rate * seconds) as usize;
        let patience = Instant::now();
        while seen.0.lock().unwrap().len() < expected
            && patience.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::SeqCst);
    });
    seen.report(&format!("steady/{name}"));
}

/// The worker drains a 300,000-job backlog while a probe pushes a
/// higher-priority job every 10 ms; only probes that started before the
/// backlog was drained count (100,000 lasted less than the probes' second
/// once the loop ran at 100k jobs/s).
fn backlog(url: &str, name: &str) {
    let store = open(url);
    let client = Client::builder_shared(store.clone()).build();
    let queue = format!("backlog{}", std::process::id());
    let q = client.queue(&queue).unwrap();
    let policy = leasehold::QueuePolicy::default();
    for _ in 0..300 {
        leasehold::StoreExt::txn(&*store, |tx| {
            for _ in 0..1_000 {
                leasehold::core::job::enqueue(tx, &queue, &JobSpec::new(""), &policy)?;
            }
            Ok(())
        })
        .unwrap();
    }
    let seen = Seen::default();
    let stop = AtomicBool::new(false);
    let probes = 100;
    std::thread::scope(|s| {
        s.spawn(|| {
            let prober = Client::builder_shared(open(url)).build();
            let pq = prober.queue(&queue).unwrap();
            for _ in 0..probes {
                let spec = JobSpec {
                    priority: 10,
                    ..JobSpec::new(wall_ns().to_string())
                };
                pq.push(&spec).unwrap();
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let opts = WorkOptions {
            drain: true,
            ..worker_opts()
        };
        q.work(&opts, &stop, |job| {
            seen.record(job.payload());
            Ok(())
        })
        .unwrap();
    });
    let measured = seen.0.lock().unwrap().len();
    assert!(
        measured * 10 >= probes * 9,
        "{name}: the backlog ran out before the probes: {measured} of {probes} measured"
    );
    seen.report(&format!("backlog/{name}"));
}

fn main() {
    if let Ok(spec) = std::env::var(PUSHER) {
        return pusher(&spec);
    }
    // `cargo bench` passes `--bench`; a filter argument picks the stores.
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("leasehold-load-latency-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut stores = vec![("sqlite", format!("sqlite:{}", dir.join("l.db").display()))];
    if let Some(url) = std::env::var("LEASEHOLD_TEST_PG")
        .ok()
        .filter(|u| !u.is_empty())
    {
        let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        admin
            .batch_execute("DROP SCHEMA IF EXISTS lh_bench_load CASCADE")
            .unwrap();
        let sep = if url.contains('?') { '&' } else { '?' };
        stores.push(("postgres", format!("{url}{sep}schema=lh_bench_load")));
    }
    for (name, url) in &stores {
        if !name.contains(filter.as_str()) {
            continue;
        }
        steady(url, name);
        backlog(url, name);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
