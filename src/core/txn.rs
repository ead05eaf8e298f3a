//! The storage interface the rules run against.

use super::{JobId, JobRecord, JobState, LeaseRecord, StateCounts};
use crate::error::Result;

/// The indexed job scans a store must answer. Each is one ordered index in
/// a store (a `BTreeSet` in memory, an index in SQL), so every scan costs
/// O(log n + limit) whatever the number of jobs in other states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobQuery {
    /// Ready jobs in claim order ([`super::ClaimRank`]: priority descending,
    /// then `run_at_ms`, then id).
    Ready,
    /// Scheduled jobs with `run_at_ms <= now_ms`, earliest first.
    Due {
        /// The instant (store clock) to compare with.
        now_ms: u64,
    },
    /// Running jobs whose claim expired (`lease_until_ms <= now_ms`),
    /// earliest first.
    Expired {
        /// The instant (store clock) to compare with.
        now_ms: u64,
    },
    /// Scheduled jobs that have been attempted before (waiting out a retry
    /// backoff, not a first delay), earliest `run_at_ms` first.
    Retrying,
    /// Terminal jobs (done, dead, cancelled) finished at or before
    /// `cutoff_ms`, earliest first.
    FinishedBy {
        /// The latest finish time to include.
        cutoff_ms: u64,
    },
}

/// One atomic transaction over lease and job records.
///
/// A store hands one to the closure given to [`crate::Store::transact`];
/// everything done through it commits together when the closure returns `Ok`,
/// or not at all. Implementations map records to memory, rows or files and
/// keep their indexes in step with [`Txn::put_job`]; they decide nothing.
pub trait Txn {
    /// The store's clock, read once when the transaction began (ms).
    fn now_ms(&self) -> u64;

    /// The record of `key`; with `create`, an empty record is created if
    /// there is none (it is only persisted if the transaction commits).
    fn lease_mut(&mut self, key: &str, create: bool) -> Result<Option<&mut LeaseRecord>>;

    /// Hint from the rules that a slot of `key` was freed, so the store
    /// can wake blocked acquirers when the transaction commits. Optional.
    fn lease_freed(&mut self, key: &str) {
        let _ = key;
    }

    /// Hint from the rules: after bringing `queue` up to date they will scan
    /// for up to `max` ready jobs to claim. A store whose reads cost a round
    /// trip may read them ahead, together with the maintenance scans; it
    /// must still answer each scan as if it ran when asked. Optional.
    fn will_claim(&mut self, queue: &str, max: usize) {
        let _ = (queue, max);
    }

    /// A fresh job id, greater than every id handed out before.
    fn next_job_id(&mut self) -> Result<JobId>;

    /// A copy of the job's record.
    fn job(&mut self, id: JobId) -> Result<Option<JobRecord>>;

    /// Insert or replace a job's record, updating every index.
    fn put_job(&mut self, job: &JobRecord) -> Result<()>;

    /// Remove a job's record and its index entries.
    fn delete_job(&mut self, id: JobId) -> Result<()>;

    /// The non-terminal job of `queue` carrying `unique_key`, if any.
    fn live_unique(&mut self, queue: &str, unique_key: &str) -> Result<Option<JobId>>;

    /// Up to `limit` job ids of `queue` matching `query`, in its order,
    /// appended to `out`.
    fn scan(
        &mut self,
        queue: &str,
        query: JobQuery,
        limit: usize,
        out: &mut Vec<JobId>,
    ) -> Result<()>;

    /// Number of jobs of `queue` in each state.
    fn counts(&mut self, queue: &str) -> Result<StateCounts>;

    /// Up to `limit` jobs of `queue` with id greater than `after`, in id
    /// order, optionally only those in `state`.
    fn list(
        &mut self,
        queue: &str,
        state: Option<JobState>,
        after: JobId,
        limit: usize,
    ) -> Result<Vec<JobRecord>>;
}
