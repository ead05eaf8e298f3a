//! The lease path at the API users call (issue 24): one acquire + release
//! pair, one thread, one key, on every store, three ways in the same run:
//!
//! - `store/NAME`: the rules through the store (`core::lease::acquire` and
//!   `release` in one transaction each): what the store can do;
//! - `client/NAME`: `Client::try_acquire` + `LeaseGuard::release`: what a
//!   user's program pays;
//! - `tokio/NAME`: the same through `leasehold::tokio::Client`, awaited on
//!   a current-thread runtime.
//!
//! Beside them, the anchors the targets are stated in, measured here:
//! `anchor/fdatasync` (a 64-byte `pwrite` and one `fdatasync` of a file
//! in the file store's filesystem) and `anchor/sqlite_two_one_row_txns`
//! (two `BEGIN IMMEDIATE; UPDATE` of one row; `COMMIT` on a WAL database
//! with `synchronous=NORMAL`, the pair's two transactions at their
//! cheapest). PostgreSQL rows run when `LEASEHOLD_TEST_PG` is set.
//!
//! Run: `cargo bench --bench lease_api` (figures: BENCHMARKS.md).

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // files, time

use criterion::{Criterion, Throughput};
use leasehold::core;
use leasehold::{
    Client, FileOptions, FileStore, Holder, HolderId, MemStore, PostgresStore, SqliteStore, Store,
    StoreExt,
};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "leasehold-bench-lease-api-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn stores() -> Vec<(&'static str, Arc<dyn Store>)> {
    let file = |durable| {
        let dir = temp_dir(if durable { "durable" } else { "fast" }).join("leases");
        let opts = FileOptions {
            durable,
            ..FileOptions::default()
        };
        Arc::new(FileStore::open_with(dir, opts).unwrap()) as Arc<dyn Store>
    };
    let mut all: Vec<(&'static str, Arc<dyn Store>)> = vec![
        ("mem", Arc::new(MemStore::new())),
        (
            "sqlite",
            Arc::new(SqliteStore::open(temp_dir("sqlite").join("l.db")).unwrap()),
        ),
        ("file_durable", file(true)),
        ("file_not_durable", file(false)),
    ];
    if let Some(url) = std::env::var("LEASEHOLD_TEST_PG")
        .ok()
        .filter(|u| !u.is_empty())
    {
        let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        admin
            .batch_execute("DROP SCHEMA IF EXISTS lh_bench_lease_api CASCADE")
            .unwrap();
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}schema=lh_bench_lease_api");
        all.push(("postgres", Arc::new(PostgresStore::open(&url).unwrap())));
    }
    all
}

fn anchors(c: &mut Criterion) {
    let mut g = c.benchmark_group("lease_api");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    let dir = temp_dir("anchor");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(dir.join("sync"))
        .unwrap();
    g.bench_function("anchor/fdatasync", |b| {
        b.iter(|| {
            f.write_all_at(&[7u8; 64], 0).unwrap();
            f.sync_data().unwrap();
        })
    });
    let db = rusqlite::Connection::open(dir.join("one-row.db")).unwrap();
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
         CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL);
         INSERT INTO t VALUES (1, 0);",
    )
    .unwrap();
    g.bench_function("anchor/sqlite_two_one_row_txns", |b| {
        b.iter(|| {
            for _ in 0..2 {
                db.execute_batch("BEGIN IMMEDIATE").unwrap();
                db.prepare_cached("UPDATE t SET v = v + 1 WHERE id = 1")
                    .unwrap()
                    .execute([])
                    .unwrap();
                db.execute_batch("COMMIT").unwrap();
            }
        })
    });
    g.finish();
}

fn pairs(c: &mut Criterion) {
    let mut g = c.benchmark_group("lease_api");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (name, store) in stores() {
        let holder = Holder::new(HolderId(1));
        g.bench_function(format!("store/{name}"), |b| {
            b.iter(|| {
                let grant = store
                    .txn(|tx| core::lease::acquire(tx, "store", &holder, 30_000, 1))
                    .unwrap();
                store
                    .txn(|tx| core::lease::release(tx, "store", holder.id, grant.token))
                    .unwrap();
            })
        });
        let client = Client::builder_shared(store.clone()).build();
        g.bench_function(format!("client/{name}"), |b| {
            b.iter(|| {
                let guard = client
                    .try_acquire("client", Duration::from_secs(30))
                    .unwrap();
                guard.release().unwrap();
            })
        });
        let client = leasehold::tokio::Client::new(client.clone());
        g.bench_function(format!("tokio/{name}"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    let guard = client
                        .try_acquire("tokio", Duration::from_secs(30))
                        .await
                        .unwrap();
                    guard.release().await.unwrap();
                })
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    anchors(&mut c);
    pairs(&mut c);
    c.final_summary();
}
