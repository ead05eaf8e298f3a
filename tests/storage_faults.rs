//! Storage faults a process meets on its own machine (issue 25): the
//! database file or the lease directory deleted or replaced under a
//! running process. Each stops the process's store with an error naming
//! the file, instead of letting it work on an inode nobody else sees.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // files, time

use leasehold::{Client, Error, FileStore, JobSpec, SqliteStore, Store, StoreExt, WorkOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "leasehold-faults-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Remove `db` and the files SQLite keeps beside it, as `rm db*` does.
fn rm_database(db: &Path) {
    for suffix in ["", "-wal", "-shm", "-wake"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

/// Transactions on `store` until one fails (within `patience`): its error.
fn first_failure(store: &dyn Store, patience: Duration) -> Error {
    let started = Instant::now();
    loop {
        match store.txn(|tx| Ok(tx.now_ms())) {
            Err(e) => return e,
            Ok(_) if started.elapsed() > patience => panic!("still working after {patience:?}"),
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

#[test]
fn a_deleted_database_stops_its_store_naming_the_file() {
    let dir = Dir::new("deleted");
    let db = dir.0.join("app.db");
    let store = SqliteStore::open(&db).unwrap();
    store.txn(|tx| Ok(tx.now_ms())).unwrap();
    rm_database(&db);
    let e = first_failure(&store, Duration::from_secs(5));
    let text = e.to_string();
    assert!(
        text.contains("app.db") && text.contains("was deleted"),
        "{text}"
    );
    assert!(!e.is_transient() && !e.is_ambiguous(), "permanent: {e:?}");
    // It stays stopped, even once a new database is made at the path.
    let fresh = SqliteStore::open(&db).unwrap();
    fresh.txn(|tx| Ok(tx.now_ms())).unwrap();
    let again = store.txn(|tx| Ok(tx.now_ms())).unwrap_err().to_string();
    assert_eq!(again, text, "the same reason, at once");
}

#[test]
fn a_replaced_lease_directory_stops_its_store_naming_it() {
    let dir = Dir::new("replaced");
    let leases = dir.0.join("leases");
    let store = FileStore::open(&leases).unwrap();
    store.txn(|tx| Ok(tx.now_ms())).unwrap();
    std::fs::rename(&leases, dir.0.join("old")).unwrap();
    std::fs::create_dir(&leases).unwrap();
    let text = first_failure(&store, Duration::from_secs(5)).to_string();
    assert!(
        text.contains("leases") && text.contains("lease directory") && text.contains("replaced"),
        "{text}"
    );
}

#[test]
fn a_worker_whose_database_is_deleted_stops_with_the_reason() {
    let dir = Dir::new("worker");
    let db = dir.0.join("jobs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).unwrap());
    let client = Client::builder_shared(store).build();
    let queue = client.queue("q").unwrap();
    queue.push(&JobSpec::new("x")).unwrap();
    let stop = AtomicBool::new(false);
    let opts = WorkOptions {
        idle_poll: Duration::from_millis(20),
        ..WorkOptions::default()
    };
    let started = Instant::now();
    let result = queue.work(&opts, &stop, |_| {
        rm_database(&db);
        Ok(())
    });
    let e = result.expect_err("the loop stops");
    assert!(e.to_string().contains("was deleted"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
}
