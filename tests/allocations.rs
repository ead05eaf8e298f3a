//! Heap allocations per operation on the hot paths, counted by a global
//! allocator: a regression guard for "no per-operation allocation in the
//! core" (the figures are printed; the bounds are today's counts).
//!
//! Counted through the mem store, so what is counted is the rules plus the
//! thinnest store. A lease acquire+release pair and an acquire+renew
//! allocate nothing (the store's undo copies reuse their buffers). A claim
//! allocates twice: the `Vec` of records it returns (the API hands the
//! caller owned records) and the list of ids its scan fills. Beyond that,
//! only the mem store's ordered indexes allocate, as their B-trees grow
//! with finished jobs (a fraction of an allocation per job, amortized).
//!
//! The same pair through the `Client` (`try_acquire` + `release`)
//! allocates twice: the key the guard, its lifeline and the client's set
//! of held keys share, and the lifeline.

use leasehold::core::{self, Txn};
use leasehold::{Client, Holder, HolderId, JobSpec, MemStore, QueuePolicy, StoreExt};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations per call of `f`, over `n` calls after a warm-up (tests in
/// this file run one at a time: the counter is global).
fn per_op(n: u64, mut f: impl FnMut()) -> f64 {
    for _ in 0..100 {
        f();
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..n {
        f();
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / n as f64
}

const POLICY: QueuePolicy = QueuePolicy {
    backoff_base_ms: 1000,
    backoff_max_ms: 60_000,
    jitter_seed: 1,
    quarantine_expiries: 5,
};

#[test]
fn hot_paths_allocate_almost_nothing() {
    // One test: the counter is process-wide, so no other test may run beside it.
    let store = MemStore::new();
    let holder = Holder::with_label(HolderId(7), "worker:1").unwrap();
    let lease = per_op(10_000, || {
        let g = store
            .txn(|tx| core::lease::acquire(tx, "key", &holder, 30_000, 1))
            .unwrap();
        store
            .txn(|tx| core::lease::release(tx, "key", holder.id, g.token))
            .unwrap();
    });
    let renew = per_op(10_000, || {
        let g = store
            .txn(|tx| core::lease::acquire(tx, "renewed", &holder, 30_000, 1))
            .unwrap();
        store
            .txn(|tx| core::lease::renew(tx, "renewed", holder.id, g.token, 30_000))
            .unwrap();
    });
    let client = Client::new(MemStore::new());
    let ttl = std::time::Duration::from_secs(30);
    let client_pair = per_op(10_000, || {
        client.try_acquire("key", ttl).unwrap().release().unwrap();
    });
    for _ in 0..20_000 {
        store
            .txn(|tx| core::job::enqueue(tx, "q", &JobSpec::new(&b"payload"[..]), &POLICY))
            .unwrap();
    }
    let mut claimed = Vec::new();
    let claim = per_op(10_000, || {
        let job = store
            .txn(|tx: &mut dyn Txn| {
                Ok(core::job::claim(tx, "q", HolderId(1), 30_000, 1, &POLICY)?.pop())
            })
            .unwrap()
            .unwrap();
        claimed.push((job.id, job.claim.map_or(0, |c| c.token)));
    });
    let mut next = claimed.into_iter();
    let complete = per_op(9_000, || {
        let (id, token) = next.next().unwrap();
        store
            .txn(|tx| core::job::complete(tx, id, HolderId(1), token))
            .unwrap();
    });
    eprintln!(
        "allocations per operation: lease acquire+release {lease:.2} (through the Client {client_pair:.2}), acquire+renew {renew:.2}, claim {claim:.2}, complete {complete:.2}"
    );
    assert!(
        client_pair <= 2.01,
        "Client lease pair allocates {client_pair} times (the key, the lifeline)"
    );
    assert!(lease <= 0.01, "lease pair allocates {lease} times");
    assert!(renew <= 0.01, "acquire+renew allocates {renew} times");
    assert!(
        claim <= 2.5,
        "claim allocates {claim} times (result, ids, index growth)"
    );
    assert!(
        complete <= 0.5,
        "complete allocates {complete} times (index growth)"
    );
}
