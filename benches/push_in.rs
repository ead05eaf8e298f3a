//! Transactional enqueue (issue 27 §1) at the API users call, on
//! PostgreSQL: an application's transaction that writes one row of its
//! own and commits (the anchor), the same transaction with
//! `Queue::push_in` of a job (plain, and with a unique key), and what a
//! user does without it: the row committed, then `Queue::push` in a
//! transaction of the store's (two commits, and a window where one
//! exists without the other).
//!
//! Needs `LEASEHOLD_TEST_PG`; without it the benchmark prints a notice and
//! measures nothing. Run: `LEASEHOLD_TEST_PG=... cargo bench --bench
//! push_in` (results: BENCHMARKS.md).

#![allow(clippy::disallowed_methods)] // benchmarks read real time

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use leasehold::{Client, JobSpec, PostgresOptions, PostgresStore};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

fn push_in(c: &mut Criterion) {
    let Ok(url) = std::env::var("LEASEHOLD_TEST_PG") else {
        eprintln!("push_in: LEASEHOLD_TEST_PG is not set; nothing measured");
        return;
    };
    let schema = format!("lh_bench_push_in_{}", std::process::id());
    let opts = PostgresOptions {
        schema: schema.clone(),
        ..PostgresOptions::default()
    };
    let client = Client::new(PostgresStore::open_with(&url, opts).unwrap());
    let queue = client.queue("emails").unwrap();
    let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let orders = format!("{schema}.orders");
    db.batch_execute(&format!(
        "CREATE TABLE {orders} (id int8 PRIMARY KEY, body text NOT NULL)"
    ))
    .unwrap();
    let insert = format!("INSERT INTO {orders} VALUES ($1, 'an order')");
    let next = AtomicU64::new(1);
    let order = || i64::try_from(next.fetch_add(1, Ordering::Relaxed)).unwrap();
    let spec = JobSpec::new(&br#"{"order":1}"#[..]);

    let mut g = c.benchmark_group("push_in");
    g.throughput(Throughput::Elements(1));
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("order_alone", |b| {
        b.iter(|| {
            let mut tx = db.transaction().unwrap();
            tx.execute(&insert, &[&order()]).unwrap();
            tx.commit().unwrap();
        })
    });
    g.bench_function("order_with_push_in", |b| {
        b.iter(|| {
            let mut tx = db.transaction().unwrap();
            tx.execute(&insert, &[&order()]).unwrap();
            queue.push_in(&mut tx, &spec).unwrap();
            tx.commit().unwrap();
        })
    });
    g.bench_function("order_with_unique_push_in", |b| {
        b.iter(|| {
            let id = order();
            let mut tx = db.transaction().unwrap();
            tx.execute(&insert, &[&id]).unwrap();
            let unique = JobSpec {
                unique_key: Some(format!("order-{id}")),
                ..spec.clone()
            };
            queue.push_in(&mut tx, &unique).unwrap();
            tx.commit().unwrap();
        })
    });
    g.bench_function("order_then_push", |b| {
        b.iter(|| {
            let mut tx = db.transaction().unwrap();
            tx.execute(&insert, &[&order()]).unwrap();
            tx.commit().unwrap();
            queue.push(&spec).unwrap();
        })
    });
    g.finish();
    let _ = db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
}

criterion_group!(benches, push_in);
criterion_main!(benches);
