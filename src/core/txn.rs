//! The storage interface the rules run against: what the core asks of a
//! store, on purpose, and nothing more.
//!
//! [`Txn`] is one atomic transaction over lease records; [`Txn::jobs`]
//! opens its job side ([`JobTxn`]), or says in one place that the store
//! keeps no jobs. The rules record the wake-ups they cause and the
//! transitions they make in the transaction's [`Journal`]; the store only
//! delivers them once the transaction commits. The job reads are indexed: a claim's whole read (a queue's
//! expired, due and ready jobs) is one call, [`JobTxn::pending`], which a
//! networked store answers in one round trip.

use super::event::Event;
use super::{
    JobCursor, JobId, JobPeek, JobRecord, JobState, LeaseRecord, QueueConfig, RateLog,
    ScheduleRecord, StateCounts, StateSet,
};
use crate::error::Field;
use crate::error::{Error, Result};
use std::sync::Arc;

/// What a transaction caused, for after it commits: the wake-ups its
/// store delivers to waiters, and the transitions it made ([`Event`]s,
/// traced and counted by the store layer). Dropped with a transaction
/// that does not commit.
///
/// Events are recorded only while [`Journal::set_recording`] is on (the
/// store layer turns it on when someone traces or counts them), so that a
/// transaction nobody observes allocates nothing for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Journal {
    woke: [bool; 2],
    recording: bool,
    events: Vec<Event>,
}

impl Journal {
    /// The rules caused `wake`.
    pub fn wake(&mut self, wake: Wake) {
        self.woke[wake.index()] = true;
    }

    /// The wake-ups caused, one flag per [`Wake`] (in the order of its variants).
    pub fn woke(&self) -> [bool; 2] {
        self.woke
    }

    /// Record events from now on (or not).
    #[doc(hidden)]
    pub fn set_recording(&mut self, on: bool) {
        self.recording = on;
    }

    /// Whether events are recorded: check before building one.
    #[doc(hidden)]
    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// The rules made this transition (dropped unless recording).
    #[doc(hidden)]
    pub fn note(&mut self, event: Event) {
        if self.recording {
            self.events.push(event);
        }
    }

    /// The transitions recorded so far, leaving none.
    #[doc(hidden)]
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }
}

/// An event a blocked caller can wait for ([`crate::Store::wait_epoch`]),
/// raised by the rules ([`Journal::wake`]) and delivered by the store when
/// the transaction that raised it commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wake {
    /// A lease slot was freed (released): blocked acquirers retry.
    LeaseFreed = 0,
    /// A queue's plan changed for its idle workers: a job became ready
    /// (pushed, due, given back, released), or the instant the queue next
    /// changes by time alone ([`crate::core::job::NextLook`]) may
    /// have moved earlier than an idle worker last read (a job scheduled:
    /// a delayed push, a retry's backoff; a job parked until a rate allows
    /// it; a schedule put). A claim does not announce itself: where claims
    /// overlap, an idle worker's claim that passed over rows another
    /// transaction held looks again soon instead
    /// ([`JobTxn::skipped_locked`]).
    /// Idle workers claim (and read the plan again), so they need no
    /// polling to start a job when it can start.
    JobReady = 1,
}

impl Wake {
    /// Every event, in index order.
    pub const ALL: [Wake; 2] = [Wake::LeaseFreed, Wake::JobReady];

    /// Its index (0 or 1), for stores that keep one counter per event.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// The indexed job scans a store must answer besides [`JobTxn::pending`].
/// Each is one ordered index in a store (a `BTreeSet` in memory, an index
/// in SQL), so a scan costs O(log n + limit) whatever the number of jobs in
/// other states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobQuery {
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

/// What bringing a queue up to date and claiming from it needs, read at
/// once ([`JobTxn::pending`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pending {
    /// Running jobs whose claim has expired (`lease_until_ms <= now_ms`),
    /// earliest first.
    pub expired: Vec<JobRecord>,
    /// Scheduled jobs that are due (`run_at_ms <= now_ms`), earliest first.
    pub due: Vec<JobRecord>,
    /// Ready jobs in claim order ([`super::ClaimRank`]: priority
    /// descending, then `run_at_ms`, then id).
    pub ready: Vec<JobRecord>,
    /// The queue's flow-control settings ([`JobTxn::queue_config`]), read
    /// with the ready jobs (the default when none were asked for).
    pub config: QueueConfig,
}

/// One atomic transaction over lease records, and the way to its jobs.
///
/// A store hands one to the closure given to [`crate::Store::transact`];
/// everything done through it commits together when the closure returns
/// `Ok`, or not at all. Implementations map records to memory, rows or
/// files and keep their indexes in step with [`JobTxn::put_job`]; they
/// decide nothing.
pub trait Txn {
    /// The store's clock, read once when the transaction began (ms).
    fn now_ms(&self) -> u64;

    /// The record of `key`; with `create`, an empty record is created if
    /// there is none (it is only persisted if the transaction commits).
    fn lease_mut(&mut self, key: &str, create: bool) -> Result<Option<&mut LeaseRecord>>;

    /// What this transaction caused: the rules record wake-ups and events
    /// in it; the store delivers the wake-ups to its waiters once the
    /// transaction commits (never if it does not).
    fn journal(&mut self) -> &mut Journal;

    /// The job side of this transaction, or the error saying this store
    /// keeps no jobs (the one place a leases-only store refuses them).
    fn jobs(&mut self) -> Result<&mut dyn JobTxn>;

    /// Every token granted from now on is above this: a store whose
    /// history may have lost grants (a PostgreSQL standby promoted after
    /// asynchronous replication) raises it above every token it could have
    /// granted before. 0 for the others (the default).
    fn token_floor(&self) -> u64 {
        0
    }

    /// Up to `limit` lease records that have at least one holder slot
    /// (live, or expired and not pruned yet: the store does not judge),
    /// with keys after `after` (`""`: from the first), in ascending key
    /// order, appended to `out` as copies. Key order is byte order
    /// (PostgreSQL: the database's collation; paging only needs the store
    /// to be consistent with itself). For listings ([`super::lease::list`]);
    /// a store that cannot list says so (the default).
    fn lease_scan(
        &mut self,
        after: &str,
        limit: usize,
        out: &mut Vec<(String, LeaseRecord)>,
    ) -> Result<()> {
        let _ = (after, limit, out);
        Err(unlisted("leases"))
    }

    /// Up to `limit` names of `what` after `after` (`""`: from the first),
    /// ascending, appended to `out`: what `leasehold migrate` copies,
    /// every one of them whatever its state.
    #[doc(hidden)]
    fn export_names(
        &mut self,
        what: Exported<'_>,
        after: &str,
        limit: usize,
        out: &mut Vec<String>,
    ) -> Result<()> {
        let _ = (what, after, limit, out);
        Err(unlisted("everything it holds"))
    }
}

/// The names [`Txn::export_names`] lists.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exported<'a> {
    /// Every lease key with a record (held or not: its `last_token` is
    /// kept for ever).
    LeaseKeys,
    /// Every queue with jobs, settings, schedules or rate buckets.
    Queues,
    /// The keys of the queue's rate buckets.
    RateKeys(&'a str),
}

/// The answer of a store that does not implement a listing.
fn unlisted(what: &str) -> Error {
    Error::invalid(Field::Store, format!("this store cannot list {what}"))
}

/// The job side of a transaction ([`Txn::jobs`]).
pub trait JobTxn {
    /// The store's clock, read once when the transaction began (ms).
    fn now_ms(&self) -> u64;

    /// See [`Txn::journal`].
    fn journal(&mut self) -> &mut Journal;

    /// See [`Txn::token_floor`].
    fn token_floor(&self) -> u64 {
        0
    }

    /// Whether a claim in this transaction passed over ready jobs that
    /// other transactions held locked (PostgreSQL: READ COMMITTED, claims
    /// skip locked rows). Such a job is being changed by a transaction
    /// still open (another worker's claim, most often): an idle worker
    /// that found nothing looks again soon
    /// ([`crate::core::job::NextLook::relook_in_ms`]), and then sees what
    /// that transaction did, a claim's expiry included. (Due and expired
    /// jobs passed over need nothing here:
    /// [`crate::core::job::next_look`] reads them as past.) Announcing
    /// every claim instead serialized the commits of all claims on the server
    /// (PostgreSQL orders notifying commits under one lock). False, the
    /// default, where transactions run one at a time (SQLite, the file and
    /// mem stores): a claim sees every claim committed before it.
    fn skipped_locked(&self) -> bool {
        false
    }

    /// A fresh job id: never handed out before, and greater than every id
    /// this transaction handed out before and than every id of a job that
    /// committed before this transaction began. (A store may take ids
    /// ahead in blocks: two transactions that overlap may interleave.)
    fn next_job_id(&mut self) -> Result<JobId>;

    /// A copy of the job's record.
    fn job(&mut self, id: JobId) -> Result<Option<JobRecord>>;

    /// Copies of the records of `ids` that exist, in any order, in one read
    /// (a batch of heartbeats or outcomes loads its jobs this way; a store
    /// that locks rows locks these).
    fn jobs_by_id(&mut self, ids: &[JobId]) -> Result<Vec<JobRecord>>;

    /// Insert or replace a job's record, updating every index.
    fn put_job(&mut self, job: &JobRecord) -> Result<()>;

    /// Remove a job's record and its index entries.
    fn delete_job(&mut self, id: JobId) -> Result<()>;

    /// Record that `child` waits for `parent` (`deps`).
    fn link(&mut self, parent: JobId, child: JobId) -> Result<()>;

    /// The jobs waiting for `parent` (linked to it and not unlinked),
    /// appended to `out` in id order.
    fn children(&mut self, parent: JobId, out: &mut Vec<JobId>) -> Result<()>;

    /// Forget every job linked to `parent` (it ended and decided them).
    fn unlink(&mut self, parent: JobId) -> Result<()>;

    /// Up to `limit` jobs of `queue` carrying `unique_key` whose stored
    /// state is in `states` and that were created at or after `since_ms`,
    /// newest first. Reads an index of the key (of its live jobs when
    /// `states` holds live states only and `since_ms` is 0).
    fn unique_jobs(
        &mut self,
        queue: &str,
        unique_key: &str,
        states: StateSet,
        since_ms: u64,
        limit: usize,
    ) -> Result<Vec<JobId>>;

    /// Serialize this transaction with the others that push or revive a
    /// job with `unique_key` in `queue` (held until it ends), so that two
    /// never both miss each other's job (U1). A store whose transactions
    /// never run side by side does nothing (the default).
    fn lock_unique(&mut self, queue: &str, unique_key: &str) -> Result<()> {
        let _ = (queue, unique_key);
        Ok(())
    }

    /// In one read: up to `chunk` expired and up to `chunk` due jobs of
    /// `queue` as of `now_ms`, and, when `ready > 0`, up to `ready` ready
    /// jobs in claim order and the queue's settings. A store that locks
    /// rows locks these jobs (skipping rows that another transaction holds).
    fn pending(&mut self, queue: &str, now_ms: u64, chunk: usize, ready: usize) -> Result<Pending>;

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

    /// The stored settings of `queue`; the default if it has none.
    fn queue_config(&mut self, queue: &str) -> Result<QueueConfig>;

    /// Store `queue`'s settings (replacing any).
    fn put_queue_config(&mut self, queue: &str, config: &QueueConfig) -> Result<()>;

    /// How many jobs of `queue` are running (claimed and not yet seen to
    /// end), only those with concurrency key `key` when given. Costs the
    /// queue's running jobs, not its backlog.
    fn running_count(&mut self, queue: &str, key: Option<&str>) -> Result<u64>;

    /// Up to `limit` parked ready jobs of `queue` ([`JobRecord::parked`]):
    /// those with concurrency key `key` in claim order, or, without a key,
    /// every key's, by key and then in claim order. A
    /// store that locks rows locks these (skipping rows another
    /// transaction holds).
    fn parked(&mut self, queue: &str, key: Option<&str>, limit: usize) -> Result<Vec<JobRecord>>;

    /// The rate bucket `key` of `queue` ([`crate::core::job::QUEUE_BUCKET`]:
    /// the queue's own); empty if it has none.
    fn rate_log(&mut self, queue: &str, key: &str) -> Result<RateLog>;

    /// Store the rate bucket `key` of `queue` (replacing it; an empty one,
    /// [`RateLog::is_empty`], is removed).
    fn put_rate_log(&mut self, queue: &str, key: &str, log: &RateLog) -> Result<()>;

    /// Up to `limit` buckets of `queue` with a wake-up instant at or
    /// before `until_ms`, earliest first: `(key, wake_at_ms)`. Costs the
    /// buckets returned.
    fn rate_wakes(
        &mut self,
        queue: &str,
        until_ms: u64,
        limit: usize,
    ) -> Result<Vec<(Arc<str>, u64)>>;

    /// Remove up to `limit` rate buckets of `queue` whose newest start is
    /// at or before `before_ms` and that wake nobody; how many went.
    /// Costs the buckets removed.
    fn forget_idle_rates(&mut self, queue: &str, before_ms: u64, limit: usize) -> Result<usize>;

    /// Make every job id handed out from now on greater than `last` (a
    /// migration copied jobs up to it).
    #[doc(hidden)]
    fn reserve_job_ids(&mut self, last: JobId) -> Result<()> {
        let _ = last;
        Err(unlisted("job ids"))
    }

    /// Serialize this transaction with the others that change what runs in
    /// a limited `queue`: `exclusive` for a claim or a change of limits
    /// (one at a time), shared for the end of an attempt (many at once,
    /// none beside a claim). Held until the transaction ends. A store
    /// whose transactions never run side by side does nothing (the
    /// default).
    fn lock_queue(&mut self, queue: &str, exclusive: bool) -> Result<()> {
        let _ = (queue, exclusive);
        Ok(())
    }

    /// The schedules of `queue`, by name. A store that locks rows locks
    /// these (two workers firing the same queue take turns).
    fn schedules(&mut self, queue: &str) -> Result<Vec<ScheduleRecord>>;

    /// Insert or replace a schedule (by queue and name).
    fn put_schedule(&mut self, schedule: &ScheduleRecord) -> Result<()>;

    /// Remove `queue`'s schedule `name`; whether there was one.
    fn delete_schedule(&mut self, queue: &str, name: &str) -> Result<bool>;

    // The listings below serve people looking at the store (`leasehold
    // ui`, `queue queues`): each reads an index, so its cost does not grow
    // with the jobs it does not return. A store that cannot list says so
    // (the defaults).

    /// Up to `limit` names of queues that have at least one job, after
    /// `after` (`""`: from the first), in ascending order (as
    /// [`Txn::lease_scan`] orders keys), appended to `out`.
    fn queue_names(&mut self, after: &str, limit: usize, out: &mut Vec<String>) -> Result<()> {
        let _ = (after, limit, out);
        Err(unlisted("queues"))
    }

    /// Up to `limit` jobs of `queue` in `state`, in that state's listing
    /// order ([`JobCursor`]), after the position `after` (`None`: from the
    /// first), each with at most `preview_bytes` of its payload.
    fn page(
        &mut self,
        queue: &str,
        state: JobState,
        after: Option<JobCursor>,
        limit: usize,
        preview_bytes: usize,
    ) -> Result<Vec<JobPeek>> {
        let _ = (queue, state, after, limit, preview_bytes);
        Err(unlisted("jobs by state"))
    }

    /// Jobs of `queue` per state, each state counted up to `cap` (a count
    /// of `cap` means `cap` or more): the cost is bounded by `cap`, not by
    /// the number of jobs.
    fn counts_capped(&mut self, queue: &str, cap: u64) -> Result<StateCounts> {
        let _ = (queue, cap);
        Err(unlisted("job counts"))
    }

    /// Terminal jobs of `queue` per state, by the interval their
    /// `finished_at_ms` falls in: `out[i]` counts `[from_ms + i *
    /// bucket_ms, from_ms + (i + 1) * bucket_ms)`. Read from the finished
    /// jobs' index, so it costs the jobs finished in the window.
    fn finished_histogram(
        &mut self,
        queue: &str,
        from_ms: u64,
        bucket_ms: u64,
        out: &mut [StateCounts],
    ) -> Result<()> {
        let _ = (queue, from_ms, bucket_ms, out);
        Err(unlisted("finished jobs"))
    }
}
