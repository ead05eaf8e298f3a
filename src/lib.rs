//! # leasehold
//!
//! Expiring, fenced leases (distributed locks) and leased job claims (a work
//! queue) that stay correct when processes are killed, forked, paused,
//! started in bursts, or run on machines whose clocks disagree.
//!
//! The rules live in one pure, deterministic module, [`core`]: time is an
//! argument and storage is a trait, so the simulator and the property tests
//! drive exactly the code that production runs. Stores ([`store`]) are thin
//! adapters that make a transaction atomic: [`MemStore`] (one process),
//! [`SqliteStore`] (the embedded default: every process of one machine) and
//! [`FileStore`] (leases in a directory, the pidfile replacement). The
//! [`Client`] adds what a program needs: a holder identity, lease guards with
//! local deadlines and keep-alive, queue handles and a worker loop, all
//! fork-safe. The `leasehold` binary puts it on the command line.
//!
//! ```
//! use leasehold::{Client, JobSpec, MemStore};
//! use std::time::Duration;
//!
//! # fn main() -> leasehold::Result<()> {
//! let client = Client::new(MemStore::new());
//!
//! // A lease: at most one holder of "nightly-etl" at a time.
//! let guard = client.try_acquire("nightly-etl", Duration::from_secs(30))?;
//! assert!(guard.is_valid());
//! let token = guard.token(); // pass it to whatever the lease protects
//!
//! // Someone else is refused while it is held...
//! let other = Client::builder_shared(client.store().clone()).build();
//! assert!(matches!(
//!     other.try_acquire("nightly-etl", Duration::from_secs(30)),
//!     Err(leasehold::Error::Held { .. })
//! ));
//! // ...and gets a larger token once it is released.
//! guard.release()?;
//! let next = other.try_acquire("nightly-etl", Duration::from_secs(30))?;
//! assert!(next.token() > token);
//!
//! // A queue: claim under a lease, complete with the claim's token.
//! let queue = client.queue("emails")?;
//! queue.push(&JobSpec::new("hello"))?;
//! let job = queue.claim(Duration::from_secs(30))?.expect("a ready job");
//! assert_eq!(job.payload(), b"hello");
//! job.complete()?;
//! assert_eq!(queue.stats()?.get(leasehold::JobState::Done), 1);
//! # Ok(())
//! # }
//! ```
//!
//! ## Guarantees
//! Numbered as in the product brief; each is checked by the model-based
//! tests and the simulator.
//! - **L1** at most `limit` (1 for a mutex) unexpired holders of a key at any store instant.
//! - **L2** every grant's token is greater than every earlier token for the key; a stale token changes nothing.
//! - **L3** a holder acts only before its local deadline (its own monotonic clock, from when it sent the request, minus the drift allowance).
//! - **L4** a dead holder's lease is acquirable once its TTL has run out.
//! - **L5** only the holder (id + token) renews or releases; a forked child never touches its parent's lease.
//! - **Q1** a job has at most one unexpired claim.
//! - **Q2** a job is completed at most once, only with its current claim's token.
//! - **Q3** every job ends done, dead or cancelled; none is seen running past its lease.
//! - **Q4** attempts are counted at claim (an expiry is an attempt); out of attempts means dead.
//! - **Q5** claim order: priority, then `run_at`, then FIFO.
//! - **S1** a failed transaction changes nothing; transient store errors are retried with jittered backoff up to a deadline.

#![warn(missing_docs)]

pub mod client;
pub mod clock;
pub mod core;
mod error;
mod fork;
mod hash;
#[cfg(feature = "serde")]
mod json;
pub mod migrate;
mod observe;
#[cfg(feature = "serde")]
#[doc(hidden)]
pub mod render;
pub mod store;
mod sync;
pub mod time;
#[cfg(all(feature = "tokio", not(loom)))]
pub mod tokio;

pub use client::{
    fit_reason, random_holder_id, ClaimedJob, Client, ClientBuilder, Deposed, ElectOptions,
    Election, JobOutcome, Leader, LeaderEvent, LeaseGuard, LeaseOptions, Queue, Stop, StopSignal,
    WorkOptions, WorkReport,
};
pub use clock::{BootClock, Clock, ManualClock, MonotonicClock, SystemClock};
pub use core::{
    DriftBound, EnqueueOutcome, Holder, HolderId, HolderInfo, JobId, JobRecord, JobSpec, JobState,
    Limits, QueueConfig, QueuePolicy, Rate, StateCounts, StateSet,
};
pub use error::{Cause, Error, Field, LostReason, Result, StoreFailure, Target};
pub use store::{FileOptions, FileStore, FirstRead, MemStore, Store, StoreExt, Wake};
#[cfg(all(feature = "postgres", not(loom)))]
pub use store::{PostgresOptions, PostgresStore};
#[cfg(feature = "sqlite")]
pub use store::{SqliteOptions, SqliteStore, Synchronous};
pub use time::{LocalMs, StoreMs, WallMs};

/// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
