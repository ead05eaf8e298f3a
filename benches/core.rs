//! Core engine benchmarks on the mem store: uncontended lease pairs, job
//! claim+complete, and claim cost against queue depth and finished jobs.
//!
//! Run: `cargo bench --bench core` (results: BENCHMARKS.md).

#![allow(clippy::disallowed_methods)] // benchmarks read real time

#[path = "support/harness.rs"]
mod harness;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use leasehold::core::{self, Txn};
use leasehold::{Client, Holder, HolderId, JobId, JobSpec, MemStore, QueuePolicy, StoreExt};
use std::hint::black_box;
use std::time::{Duration, Instant};

const POLICY: QueuePolicy = QueuePolicy {
    backoff_base_ms: 1000,
    backoff_max_ms: 60_000,
    jitter_seed: 1,
    quarantine_expiries: 5,
};

fn push(store: &MemStore, queue: &str, priority: i32) -> JobId {
    let spec = JobSpec {
        priority,
        ..JobSpec::new(&b"payload-bytes"[..])
    };
    store
        .txn(|tx| core::job::enqueue(tx, queue, &spec, &POLICY))
        .unwrap()
        .id
}

fn claim_complete(store: &MemStore, queue: &str, holder: HolderId) {
    store
        .txn(|tx: &mut dyn Txn| {
            let jobs = core::job::claim(tx, queue, holder, 30_000, 1, &POLICY)?;
            Ok(jobs.into_iter().next())
        })
        .and_then(|job| {
            let job = job.expect("a ready job");
            let token = job.claim.map_or(0, |c| c.token);
            store.txn(|tx| core::job::complete(tx, job.id, holder, token))
        })
        .unwrap();
}

fn leases(c: &mut Criterion) {
    let mut g = c.benchmark_group("lease");
    g.throughput(Throughput::Elements(1));
    let store = MemStore::new();
    let holder = Holder::with_label(HolderId(7), "bench:1").unwrap();
    g.bench_function("acquire_release_pair/core", |b| {
        b.iter(|| {
            let grant = store
                .txn(|tx| core::lease::acquire(tx, "key", &holder, 30_000, 1))
                .unwrap();
            store
                .txn(|tx| core::lease::release(tx, "key", holder.id, grant.token))
                .unwrap();
            black_box(grant.token)
        })
    });
    let client = Client::new(MemStore::new());
    g.bench_function("acquire_release_pair/client_guard", |b| {
        b.iter(|| {
            let guard = client.try_acquire("key", Duration::from_secs(30)).unwrap();
            let token = guard.token();
            guard.release().unwrap();
            black_box(token)
        })
    });
    // Many live keys: the cost of one pair must not grow with them.
    for live in [1usize, 1_000, 100_000] {
        let store = MemStore::new();
        for i in 0..live {
            let key = format!("live-{i}");
            store
                .txn(|tx| core::lease::acquire(tx, &key, &holder, 3_600_000, 1))
                .unwrap();
        }
        g.bench_with_input(
            BenchmarkId::new("pair_with_live_keys", live),
            &live,
            |b, _| {
                b.iter(|| {
                    let grant = store
                        .txn(|tx| core::lease::acquire(tx, "key", &holder, 30_000, 1))
                        .unwrap();
                    store
                        .txn(|tx| core::lease::release(tx, "key", holder.id, grant.token))
                        .unwrap();
                })
            },
        );
    }
    g.finish();
}

fn jobs(c: &mut Criterion) {
    let mut g = c.benchmark_group("job");
    g.throughput(Throughput::Elements(1));
    let holder = HolderId(9);
    let store = MemStore::new();
    g.bench_function("enqueue_claim_complete", |b| {
        b.iter(|| {
            push(&store, "q", 0);
            claim_complete(&store, "q", holder);
        })
    });
    // Claim+complete only: the jobs are pushed outside the timed part.
    let store = MemStore::new();
    g.bench_function("claim_complete", |b| {
        b.iter_custom(|iters| {
            for _ in 0..iters {
                push(&store, "q", 0);
            }
            let start = Instant::now();
            for _ in 0..iters {
                claim_complete(&store, "q", holder);
            }
            start.elapsed()
        })
    });
    let store = MemStore::new();
    g.throughput(Throughput::Elements(64));
    g.bench_function("claim_batch64_complete", |b| {
        b.iter_custom(|iters| {
            for _ in 0..iters * 64 {
                push(&store, "q", 0);
            }
            let start = Instant::now();
            for _ in 0..iters {
                let jobs = store
                    .txn(|tx| core::job::claim(tx, "q", holder, 30_000, 64, &POLICY))
                    .unwrap();
                store
                    .txn(|tx| {
                        for j in &jobs {
                            core::job::complete(tx, j.id, holder, j.claim.map_or(0, |c| c.token))?;
                        }
                        Ok(())
                    })
                    .unwrap();
            }
            start.elapsed()
        })
    });
    g.finish();
}

/// Claim+complete at a steady queue depth (one job pushed back, untimed,
/// after each), and with many finished jobs in the store.
fn depth(c: &mut Criterion) {
    let mut g = c.benchmark_group("claim_depth");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    let holder = HolderId(11);
    for depth in [1_000usize, 100_000, 1_000_000] {
        let store = MemStore::new();
        for i in 0..depth {
            push(&store, "q", (i % 10) as i32);
        }
        g.bench_with_input(BenchmarkId::new("ready", depth), &depth, |b, _| {
            let mut i = 0i32;
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    claim_complete(&store, "q", holder);
                    spent += start.elapsed();
                    i = i.wrapping_add(1);
                    push(&store, "q", i % 10);
                }
                spent
            })
        });
    }
    let store = MemStore::new();
    for _ in 0..1_000_000 {
        push(&store, "q", 0);
        claim_complete(&store, "q", holder);
    }
    g.bench_function("with_1m_finished", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                push(&store, "q", 0);
                let start = Instant::now();
                claim_complete(&store, "q", holder);
                spent += start.elapsed();
            }
            spent
        })
    });
    g.finish();
}

/// Aggregate throughput with 1, 2, 4 and 8 threads sharing one mem store:
/// lease pairs (each thread its own key) and claim+complete (one queue).
fn contention(c: &mut Criterion) {
    let mut g = c.benchmark_group("mem_contention");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    for threads in [1usize, 2, 4, 8] {
        let store = std::sync::Arc::new(MemStore::new());
        g.bench_with_input(
            BenchmarkId::new("lease_pair/threads", threads),
            &threads,
            |b, &t| {
                b.iter_custom(|iters| {
                    let store = store.clone();
                    harness::spread(iters, t, move |i, n| harness::own_key_pairs(&*store, i, n))
                })
            },
        );
        let store = std::sync::Arc::new(MemStore::new());
        g.bench_with_input(
            BenchmarkId::new("claim_complete/threads", threads),
            &threads,
            |b, &t| {
                b.iter_custom(|iters| {
                    for _ in 0..harness::share(iters, t) * t as u64 {
                        push(&store, "q", 0);
                    }
                    let store = store.clone();
                    harness::spread(iters, t, move |i, n| {
                        for _ in 0..n {
                            claim_complete(&store, "q", HolderId(i as u128 + 1));
                        }
                    })
                })
            },
        );
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = leases, jobs, depth, contention
}
criterion_main!(benches);
