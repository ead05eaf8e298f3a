//! Runs the conformance suite (`suite.rs`) against every store.

#[macro_use]
mod suite;

mod mem {
    use leasehold::{ManualClock, MemStore, Store};
    use std::sync::Arc;

    conformance_cases!(|clock: &ManualClock| -> Arc<dyn Store> {
        Arc::new(MemStore::with_clock(Arc::new(clock.clone())))
    });
}
