//! Pushing a backlog at the API users call: 1,000 jobs as 1,000
//! `Queue::push` calls (a transaction and a commit each) against one
//! `Queue::push_many` of 1,000 (one transaction, one commit), per store, in
//! the same run. PostgreSQL needs `LEASEHOLD_TEST_PG` (else its rows are
//! skipped with a notice). Run: `cargo bench --bench pushes` (results:
//! BENCHMARKS.md).

#![allow(clippy::disallowed_methods)] // benchmarks read real time

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use leasehold::{Client, JobSpec, MemStore, PostgresOptions, PostgresStore, SqliteStore, Store};
use std::sync::Arc;

/// Jobs per measured push of a backlog.
const JOBS: usize = 1_000;

fn pushes(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("lh-bench-pushes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut stores: Vec<(&str, Arc<dyn Store>)> = vec![
        ("mem", Arc::new(MemStore::new())),
        (
            "sqlite",
            Arc::new(SqliteStore::open(dir.join("lh.db")).unwrap()),
        ),
    ];
    let schema = format!("lh_bench_pushes_{}", std::process::id());
    let url = std::env::var("LEASEHOLD_TEST_PG")
        .ok()
        .filter(|u| !u.is_empty());
    match &url {
        Some(url) => {
            let opts = PostgresOptions {
                schema: schema.clone(),
                ..PostgresOptions::default()
            };
            stores.push((
                "postgres",
                Arc::new(PostgresStore::open_with(url, opts).unwrap()),
            ));
        }
        None => eprintln!("SKIPPED: the PostgreSQL rows: LEASEHOLD_TEST_PG is not set"),
    }
    let specs: Vec<JobSpec> = (0..JOBS)
        .map(|i| JobSpec::new(format!("job {i}")))
        .collect();
    let mut g = c.benchmark_group("pushes");
    g.throughput(Throughput::Elements(JOBS as u64));
    g.sample_size(10);
    for (name, store) in &stores {
        let client = Client::builder_shared(store.clone()).build();
        let q = client.queue("backlog").unwrap();
        g.bench_function(format!("{name}/push_one_by_one/{JOBS}"), |b| {
            b.iter(|| {
                for spec in &specs {
                    q.push(spec).unwrap();
                }
            })
        });
        g.bench_function(format!("{name}/push_many/{JOBS}"), |b| {
            b.iter(|| assert_eq!(q.push_many(&specs).unwrap().len(), JOBS))
        });
    }
    g.finish();
    drop(stores);
    if let Some(url) = url {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, pushes);
criterion_main!(benches);
