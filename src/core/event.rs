//! Events: the transitions a transaction made (a lease granted, a job
//! claimed, failed, dead...), as the rules record them in the
//! transaction's [`Journal`](super::Journal). They are facts about
//! committed state only once the transaction commits: the store layer
//! traces and counts them then ([`crate::store::StoreExt::txn`]), never
//! for a transaction that rolled back.

use super::schedule::TickChange;
use super::{HolderId, JobId};
use std::sync::Arc;

/// One transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A lease slot changed.
    Lease {
        /// The key.
        key: Arc<str>,
        /// The slot's holder.
        holder: HolderId,
        /// The slot's fencing token.
        token: u64,
        /// What happened.
        change: LeaseChange,
    },
    /// A job changed.
    Job {
        /// Its queue.
        queue: Arc<str>,
        /// Its id.
        id: JobId,
        /// The token of its latest claim (0 before the first).
        token: u64,
        /// Its attempts so far.
        attempt: u32,
        /// What happened.
        change: JobChange,
    },
    /// A schedule's tick was handled (by a worker's fire).
    Tick {
        /// The schedule's queue.
        queue: Arc<str>,
        /// The schedule.
        schedule: Arc<str>,
        /// The tick (wall clock, Unix ms).
        tick_ms: u64,
        /// What became of it.
        change: TickChange,
    },
}

/// What happened to a lease slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseChange {
    /// A new grant (a new token).
    Granted {
        /// Its time to live.
        ttl_ms: u64,
    },
    /// A live grant extended (a renewal, or an acquire by its holder).
    Renewed {
        /// The time to live asked for.
        ttl_ms: u64,
    },
    /// Released by its holder.
    Released,
    /// Found expired and removed.
    Expired,
}

/// What happened to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobChange {
    /// Added to its queue.
    Enqueued,
    /// Claimed by a worker.
    Claimed {
        /// How long it had been claimable (store clock, ms).
        wait_ms: u64,
    },
    /// Its claim extended.
    Heartbeat,
    /// Done.
    Completed,
    /// An attempt reported failed.
    Failed,
    /// A claim ran out (its worker died, hung or lost contact).
    Expired,
    /// Scheduled for another attempt (after a failure, an expiry or an
    /// operator's retry).
    Retried {
        /// How long until it may be claimed again.
        delay_ms: u64,
    },
    /// Out of attempts.
    Dead,
    /// Dead because its claims kept expiring (a crash loop).
    Quarantined,
    /// Cancelled.
    Cancelled,
    /// Given back by its worker without an outcome.
    Abandoned,
    /// Every job it waited for ended: ready (or scheduled) now.
    Released,
}

impl LeaseChange {
    /// Its name in traces and metrics.
    pub fn name(self) -> &'static str {
        match self {
            LeaseChange::Granted { .. } => "granted",
            LeaseChange::Renewed { .. } => "renewed",
            LeaseChange::Released => "released",
            LeaseChange::Expired => "expired",
        }
    }
}

impl JobChange {
    /// Its name in traces and metrics.
    pub fn name(self) -> &'static str {
        match self {
            JobChange::Enqueued => "enqueued",
            JobChange::Claimed { .. } => "claimed",
            JobChange::Heartbeat => "heartbeat",
            JobChange::Completed => "completed",
            JobChange::Failed => "failed",
            JobChange::Expired => "expired",
            JobChange::Retried { .. } => "retried",
            JobChange::Dead => "dead",
            JobChange::Quarantined => "quarantined",
            JobChange::Cancelled => "cancelled",
            JobChange::Abandoned => "abandoned",
            JobChange::Released => "released",
        }
    }
}
