//! The cases, each run on every store (see `main.rs`): leases in
//! `leases.rs`, jobs and the worker loop in `jobs.rs`; shared helpers here.

pub use super::election::*;
use super::Fresh;
use leasehold::client::JobOutcome;
use leasehold::core::{self, JobId};
use leasehold::tokio::{ClaimedJob, Client};
use leasehold::{JobSpec, JobState, LeaseOptions, ManualClock, StoreExt, WorkOptions};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinSet;

type Make = dyn Fn() -> Fresh;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A runtime with two workers and at most `blocking` blocking threads.
fn runtime(blocking: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(blocking)
        .enable_all()
        .build()
        .unwrap()
}

fn client(f: &Fresh) -> Client {
    Client::new(leasehold::Client::builder_shared(f.store.clone()).build())
}

/// A sync client with the same holder id as `c`: it can release or give
/// back what `c` holds (sabotage, as an operator or a bug would).
fn twin(f: &Fresh, c: &Client) -> leasehold::Client {
    leasehold::Client::builder_shared(f.store.clone())
        .holder(c.holder().clone())
        .build()
}

async fn within<T>(limit: Duration, what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not within {limit:?}"),
    }
}

/// Set when dropped: proves a handler's future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

async fn until(limit: Duration, what: &str, cond: impl Fn() -> bool) {
    within(limit, what, async {
        while !cond() {
            tokio::time::sleep(ms(5)).await;
        }
    })
    .await;
}

mod jobs;
mod leases;
pub use jobs::*;
pub use leases::*;
