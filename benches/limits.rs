//! Concurrency and rate limits (F1, F4) at the API users call
//! (`Queue::claim`, then `complete`, then a push that keeps the queue's
//! depth): the claim of an unlimited queue; the same queue under a
//! queue-wide limit that does not bind (what counting the running jobs and
//! the claim's lock cost); under a rate that does not bind (what reading
//! and writing the queue's start log costs: 1,000 starts per ms, so the
//! log holds every start of the last ms, up to 1,000 instants); a queue
//! whose one hot key is full with 10,000 of its jobs waiting, where each
//! claim must find a free job behind them (F1's "skips blocked keys
//! without scanning every blocked job"); and the same hot key out of
//! allowance under a per-key rate instead (its backlog set aside until the
//! key's window has room).
//!
//! Run: `cargo bench --bench limits` (PostgreSQL too with
//! `LEASEHOLD_TEST_PG=postgres://...`; results: BENCHMARKS.md).

#![allow(clippy::disallowed_methods)] // benchmarks read real time

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use leasehold::core::{self, Limits, Rate};
use leasehold::{Client, JobSpec, QueuePolicy, Store, StoreExt};
use std::sync::Arc;
use std::time::Duration;

/// Ready jobs behind the claimed one (the hot key's backlog, or plain jobs).
const DEPTH: usize = 10_000;

const LEASE: Duration = Duration::from_secs(600);

fn stores() -> Vec<(&'static str, Arc<dyn Store>, Option<std::path::PathBuf>)> {
    let mut out: Vec<(&'static str, Arc<dyn Store>, Option<std::path::PathBuf>)> =
        vec![("mem", Arc::new(leasehold::MemStore::new()), None)];
    let dir = std::env::temp_dir().join(format!("leasehold-bench-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = leasehold::SqliteStore::open(dir.join("l.db")).unwrap();
    out.push(("sqlite", Arc::new(sqlite), Some(dir)));
    if let Ok(url) = std::env::var("LEASEHOLD_TEST_PG") {
        let opts = leasehold::PostgresOptions {
            schema: format!("lh_bench_limits_{}", std::process::id()),
            ..leasehold::PostgresOptions::default()
        };
        out.push((
            "postgres",
            Arc::new(leasehold::PostgresStore::open_with(&url, opts).unwrap()),
            None,
        ));
    }
    out
}

/// `n` jobs of `queue` (with concurrency key `key`), in transactions of
/// 1,000.
fn fill(store: &dyn Store, queue: &str, key: Option<&str>, n: usize) {
    let spec = JobSpec {
        key: key.map(str::to_owned),
        ..JobSpec::new(&b"payload-bytes"[..])
    };
    let policy = QueuePolicy::default();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        store
            .txn(|tx| {
                for _ in chunk {
                    core::job::enqueue(tx, queue, &spec, &policy)?;
                }
                Ok(())
            })
            .unwrap();
    }
}

/// One claim, its completion, and a push of a job like it.
fn cycle(q: &leasehold::Queue, spec: &JobSpec) {
    let job = q.claim(LEASE).unwrap().expect("a claimable job");
    job.complete().unwrap();
    q.push(spec).unwrap();
}

/// Under `limits`, fill `q` with the hot key's 10,001 jobs and 100 free
/// ones, claim the hot key's first job (returned: it holds its key), and
/// set the rest of its backlog aside once, as the first claims after a
/// burst do; one more free job keeps the depth.
fn set_aside(store: &dyn Store, q: &leasehold::Queue, limits: Limits) -> leasehold::ClaimedJob {
    q.set_limits(limits).unwrap();
    fill(store, q.name(), Some("hot"), DEPTH + 1);
    fill(store, q.name(), None, 100);
    let first = q.claim(LEASE).unwrap().expect("the hot key's first job");
    while q
        .claim(LEASE)
        .unwrap()
        .map(|j| j.complete().unwrap())
        .is_none()
    {}
    q.push(&JobSpec::new(&b"payload-bytes"[..])).unwrap();
    first
}

fn limits(c: &mut Criterion) {
    let mut g = c.benchmark_group("limits");
    g.throughput(Throughput::Elements(1));
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(4));
    let plain = JobSpec::new(&b"payload-bytes"[..]);
    for (name, store, _dir) in stores() {
        let client = Client::builder_shared(store.clone()).build();
        // Unlimited: the baseline.
        fill(store.as_ref(), "plain", None, DEPTH);
        let q = client.queue("plain").unwrap();
        g.bench_function(format!("claim_complete/unlimited/{name}"), |b| {
            b.iter(|| cycle(&q, &plain))
        });
        // A queue-wide limit that never binds.
        fill(store.as_ref(), "capped", None, DEPTH);
        let q = client.queue("capped").unwrap();
        q.set_limits(Limits::none().with_concurrency(Some(1_000)))
            .unwrap();
        g.bench_function(format!("claim_complete/concurrency_limit/{name}"), |b| {
            b.iter(|| cycle(&q, &plain))
        });
        // A rate that never binds.
        fill(store.as_ref(), "rated", None, DEPTH);
        let q = client.queue("rated").unwrap();
        q.set_limits(Limits::none().with_rate(Some(Rate::new(1_000, 1))))
            .unwrap();
        g.bench_function(format!("claim_complete/rate_limit/{name}"), |b| {
            b.iter(|| cycle(&q, &plain))
        });
        // One hot key, full: its 10,000 waiting jobs stand before the free
        // ones in claim order (enqueued first, same priority).
        let q = client.queue("hot").unwrap();
        let running = set_aside(store.as_ref(), &q, Limits::none().with_per_key(Some(1)));
        g.bench_function(format!("claim_complete/blocked_key/{name}"), |b| {
            b.iter(|| cycle(&q, &plain))
        });
        drop(running);
        // One hot key out of allowance under a per-key rate (one start an
        // hour): its 10,000 waiting jobs, set aside until the hour is up,
        // stand before the free ones.
        let q = client.queue("hot_rate").unwrap();
        let rate = Limits::none().with_per_key_rate(Some(Rate::new(1, 3_600_000)));
        set_aside(store.as_ref(), &q, rate).complete().unwrap();
        g.bench_function(format!("claim_complete/rate_blocked_key/{name}"), |b| {
            b.iter(|| cycle(&q, &plain))
        });
    }
    g.finish();
}

criterion_group!(benches, limits);
criterion_main!(benches);
