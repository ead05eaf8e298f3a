//! Runs the conformance suite (`suite/`) against every store.

#[macro_use]
mod suite;
#[path = "../support/dir.rs"]
mod dir;
#[path = "../support/pg.rs"]
mod pg;

pub use dir::Dir;

mod mem {
    use leasehold::{ManualClock, MemStore, Store};
    use std::sync::Arc;

    conformance_cases!(|clock: &ManualClock| -> Arc<dyn Store> {
        Arc::new(MemStore::with_clock(Arc::new(clock.clone())))
    });
}

/// A store that keeps what it lives in (a temp directory, a schema) until
/// it is dropped itself (fields drop in order: the store first).
pub struct Kept<S, K = Dir>(pub S, pub K);

impl<S: leasehold::Store, K: Send + Sync> leasehold::Store for Kept<S, K> {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn leasehold::core::Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        self.0.transact(f)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn epoch(&self, wake: leasehold::Wake) -> u64 {
        self.0.epoch(wake)
    }
    fn wait_epoch(&self, wake: leasehold::Wake, epoch: u64, timeout: std::time::Duration) -> bool {
        self.0.wait_epoch(wake, epoch, timeout)
    }
    fn concurrent_txns(&self) -> usize {
        self.0.concurrent_txns()
    }
}

mod sqlite {
    use super::{Dir, Kept};
    use leasehold::{ManualClock, SqliteOptions, SqliteStore, Store};
    use std::sync::Arc;

    conformance_cases!(|clock: &ManualClock| -> Arc<dyn Store> {
        let dir = Dir::new("conformance");
        let opts = SqliteOptions {
            clock: Some(Arc::new(clock.clone())),
            boot_id: Some("test-boot".into()),
            ..SqliteOptions::default()
        };
        let store = SqliteStore::open_with(dir.0.join("test.db"), opts).unwrap();
        Arc::new(Kept(store, dir))
    });
}

mod file {
    use super::{Dir, Kept};
    use leasehold::{FileOptions, FileStore, ManualClock, Store};
    use std::sync::Arc;

    conformance_lease_cases!(|clock: &ManualClock| -> Arc<dyn Store> {
        let dir = Dir::new("conformance-file");
        let opts = FileOptions {
            clock: Some(Arc::new(clock.clone())),
            boot_id: Some("test-boot".into()),
            durable: false,
            ..FileOptions::default()
        };
        let store = FileStore::open_with(dir.0.join("leases"), opts).unwrap();
        Arc::new(Kept(store, dir))
    });
}

mod postgres {
    use super::pg::Schema;
    use super::Kept;
    use leasehold::{ManualClock, PostgresOptions, Store};
    use std::sync::Arc;

    conformance_cases!(@guard super::pg::enabled; |clock: &ManualClock| -> Arc<dyn Store> {
        let schema = Schema::new("conf");
        let store = schema.open(PostgresOptions {
            clock: Some(Arc::new(clock.clone())),
            ..PostgresOptions::default()
        });
        Arc::new(Kept(store, schema))
    });
}
