//! What people look at: the queues a store has, a page of one state's
//! jobs, and a queue's summary (counts, the oldest ready job's wait, jobs
//! finished per interval). Read-only but for the usual bringing up to
//! date ([`maintain`]), so nobody sees a job running past its lease.
//!
//! # Listing order
//! Each state's jobs are listed in the order of that state's index, so a
//! page costs its own rows whatever else the store holds ([`JobCursor`]):
//! ready jobs in claim order (what a worker takes next comes first),
//! scheduled jobs by `run_at_ms`, running jobs by `lease_until_ms`, and
//! terminal jobs newest first by `finished_at_ms`; the id breaks ties. A
//! page ends at a cursor, the position of its last job; the next page
//! starts after it.
//!
//! # Bounds
//! Every read here is bounded by an argument: a page by its limit, the
//! counts by a cap, the oldest ready job by [`PRIORITY_BANDS_MAX`] index
//! probes, the finished histogram by the jobs finished in its window.

use super::{maintain, JobId, JobRecord, JobState, QueuePolicy, StateCounts};
use crate::core::{check_count, check_key, Txn, MAX_PAYLOAD_BYTES, MAX_TTL_MS};
use crate::error::Field;
use crate::error::{Error, Result};
use std::fmt;
use std::sync::Arc;

/// Priority bands (distinct priorities of ready jobs) probed to find the
/// oldest ready job: one index probe each, highest priority first.
pub const PRIORITY_BANDS_MAX: usize = 64;
/// Most intervals a summary's histogram may have.
pub const BUCKETS_MAX: usize = 1440;

/// A position in the listing order of one state's jobs (see the module
/// docs): `priority` counts for ready jobs only, `at_ms` is the state's
/// instant (`run_at_ms` for ready and scheduled jobs, `lease_until_ms` for
/// running ones, `finished_at_ms` for terminal ones), `id` breaks ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobCursor {
    /// The job's priority.
    pub priority: i32,
    /// The state's instant (store clock, ms).
    pub at_ms: u64,
    /// The job's id.
    pub id: JobId,
}

impl JobCursor {
    /// The position of `job` in its own state's order.
    pub fn of(job: &JobRecord) -> JobCursor {
        let at_ms = match job.state {
            JobState::Ready | JobState::Scheduled => job.run_at_ms,
            JobState::Running => job.claim.map_or(0, |c| c.lease_until_ms),
            JobState::Done | JobState::Dead | JobState::Cancelled => {
                job.finished_at_ms.unwrap_or(0)
            }
            JobState::Waiting => 0,
        };
        JobCursor {
            priority: job.priority,
            at_ms,
            id: job.id,
        }
    }

    /// The key that sorts `state`'s listing order ascending: the rule
    /// every store's page follows (with its index) and tests check.
    pub fn sort_key(&self, state: JobState) -> (i64, u64, u64) {
        match state {
            JobState::Ready => (-i64::from(self.priority), self.at_ms, self.id.0),
            JobState::Scheduled | JobState::Running | JobState::Waiting => {
                (0, self.at_ms, self.id.0)
            }
            JobState::Done | JobState::Dead | JobState::Cancelled => (0, !self.at_ms, !self.id.0),
        }
    }

    /// Parse [`JobCursor`]'s `Display` form, `PRIORITY.AT_MS.ID`.
    pub fn parse(text: &str) -> Result<JobCursor> {
        let bad = || {
            Error::invalid(
                Field::After,
                format!("{text:?} is not a PRIORITY.AT_MS.ID cursor"),
            )
        };
        let mut parts = text.split('.');
        let (Some(p), Some(at), Some(id), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        Ok(JobCursor {
            priority: p.parse().map_err(|_| bad())?,
            at_ms: at.parse().map_err(|_| bad())?,
            id: JobId(id.parse().map_err(|_| bad())?),
        })
    }
}

impl fmt::Display for JobCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.priority, self.at_ms, self.id)
    }
}

/// A job as a listing shows it: its record with the payload cut to a
/// preview (at most the `preview_bytes` asked for), and the whole
/// payload's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPeek {
    /// The record; `payload` holds only the first bytes.
    pub job: JobRecord,
    /// The size of the whole payload.
    pub payload_bytes: u64,
}

impl JobPeek {
    /// `job` with its payload cut to `preview_bytes`.
    pub fn of(job: &JobRecord, preview_bytes: usize) -> JobPeek {
        let mut job = job.clone();
        let payload_bytes = job.payload.len() as u64;
        let keep = job.payload.len().min(preview_bytes);
        if keep != job.payload.len() {
            job.payload = Arc::from(&job.payload[..keep]);
        }
        JobPeek { job, payload_bytes }
    }
}

/// How much a [`summary`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummaryOptions {
    /// Count each state up to this many jobs ([`crate::core::JobTxn::counts_capped`]).
    pub count_cap: u64,
    /// The length of one interval of the finished histogram.
    pub bucket_ms: u64,
    /// How many intervals, the last one ending now.
    pub buckets: usize,
}

impl Default for SummaryOptions {
    /// Counts up to 100,000; ten intervals of a minute.
    fn default() -> Self {
        SummaryOptions {
            count_cap: 100_000,
            bucket_ms: 60_000,
            buckets: 10,
        }
    }
}

/// A queue at a glance ([`summary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSummary {
    /// Jobs per state, each counted up to `count_cap`.
    pub counts: StateCounts,
    /// The cap the counts were read with.
    pub count_cap: u64,
    /// The `run_at_ms` of the ready job that has waited longest.
    pub oldest_ready_at_ms: Option<u64>,
    /// Where the histogram starts (store clock).
    pub from_ms: u64,
    /// The length of one interval.
    pub bucket_ms: u64,
    /// Terminal jobs per state finished in each interval, oldest first.
    pub finished: Vec<StateCounts>,
    /// The store's clock when it was read.
    pub now_ms: u64,
    /// The queue is paused ([`super::set_paused`]): no claim starts its jobs.
    pub paused: bool,
    /// The queue's concurrency limits ([`super::set_limits`]).
    pub limits: super::Limits,
}

impl QueueSummary {
    /// Whether `state`'s count reached the cap (the true count may be larger).
    pub fn is_capped(&self, state: JobState) -> bool {
        self.counts.get(state) >= self.count_cap
    }

    /// How long the oldest ready job has been claimable.
    pub fn oldest_ready_wait_ms(&self) -> Option<u64> {
        self.oldest_ready_at_ms
            .map(|at| self.now_ms.saturating_sub(at))
    }
}

/// A page's `after`: empty (from the first) or a valid name.
pub(crate) fn check_after_key(after: &str) -> Result<()> {
    if after.is_empty() {
        return Ok(());
    }
    check_key(Field::After, after)
}

/// Up to `limit` names of queues that have jobs, after `after` (`""`: from
/// the first), in ascending order. A queue whose jobs were all purged is
/// not listed.
pub fn queues(tx: &mut dyn Txn, after: &str, limit: usize) -> Result<Vec<String>> {
    check_after_key(after)?;
    check_count(Field::Limit, limit)?;
    let mut names = Vec::new();
    tx.jobs()?.queue_names(after, limit, &mut names)?;
    debug_assert!(names.len() <= limit);
    debug_assert!(names.windows(2).all(|w| w[0] != w[1]));
    Ok(names)
}

/// Up to `limit` jobs of `queue` in `state`, after `after`, in the state's
/// listing order, each with at most `preview_bytes` of its payload; after
/// bringing the queue up to date.
pub fn page(
    tx: &mut dyn Txn,
    queue: &str,
    state: JobState,
    after: Option<JobCursor>,
    limit: usize,
    preview_bytes: usize,
    policy: &QueuePolicy,
) -> Result<Vec<JobPeek>> {
    check_count(Field::Limit, limit)?;
    if preview_bytes > MAX_PAYLOAD_BYTES {
        return Err(Error::invalid(
            Field::PreviewBytes,
            format!("{preview_bytes} is larger than {MAX_PAYLOAD_BYTES}"),
        ));
    }
    maintain(tx, queue, policy)?;
    let jobs = tx.jobs()?.page(queue, state, after, limit, preview_bytes)?;
    debug_assert!(jobs.len() <= limit);
    debug_assert!(jobs.iter().all(|p| p.job.state == state));
    Ok(jobs)
}

/// `queue` at a glance, after bringing it up to date: whether it is
/// paused, jobs per state (each counted up to `opts.count_cap`), the
/// oldest ready job, and the terminal jobs finished per interval over the
/// last `opts.buckets` intervals (the last one ends now).
pub fn summary(
    tx: &mut dyn Txn,
    queue: &str,
    policy: &QueuePolicy,
    opts: &SummaryOptions,
) -> Result<QueueSummary> {
    check_summary(opts)?;
    maintain(tx, queue, policy)?;
    let oldest_ready_at_ms = oldest_ready(tx, queue)?;
    let jobs = tx.jobs()?;
    let now_ms = jobs.now_ms();
    let counts = jobs.counts_capped(queue, opts.count_cap)?;
    // Half-open intervals: a job finished at `now_ms` is in the last one.
    let span_ms = opts.bucket_ms * opts.buckets as u64;
    let from_ms = now_ms.saturating_add(1).saturating_sub(span_ms);
    let mut finished = vec![StateCounts::default(); opts.buckets];
    jobs.finished_histogram(queue, from_ms, opts.bucket_ms, &mut finished)?;
    let config = jobs.queue_config(queue)?;
    Ok(QueueSummary {
        counts,
        count_cap: opts.count_cap,
        oldest_ready_at_ms,
        from_ms,
        bucket_ms: opts.bucket_ms,
        finished,
        now_ms,
        paused: config.paused,
        limits: config.limits,
    })
}

fn check_summary(opts: &SummaryOptions) -> Result<()> {
    if opts.count_cap == 0 {
        return Err(Error::invalid(Field::CountCap, "must be at least 1"));
    }
    if opts.buckets == 0 || opts.buckets > BUCKETS_MAX {
        return Err(Error::invalid(
            Field::Buckets,
            format!("{} is outside 1..={BUCKETS_MAX}", opts.buckets),
        ));
    }
    let span_ms = opts.bucket_ms.checked_mul(opts.buckets as u64);
    if opts.bucket_ms == 0 || span_ms.is_none_or(|s| s > MAX_TTL_MS) {
        return Err(Error::invalid(
            Field::Bucket,
            format!(
                "{} intervals of {} ms must be at least 1 ms each and span at most a year",
                opts.buckets, opts.bucket_ms
            ),
        ));
    }
    Ok(())
}

/// The earliest `run_at_ms` of the queue's ready jobs. Within one priority
/// the first job in claim order has the earliest `run_at_ms`, so one
/// index probe per priority band finds it (the first
/// [`PRIORITY_BANDS_MAX`] bands, highest first).
fn oldest_ready(tx: &mut dyn Txn, queue: &str) -> Result<Option<u64>> {
    let jobs = tx.jobs()?;
    let mut oldest: Option<u64> = None;
    let mut after = None;
    for _ in 0..PRIORITY_BANDS_MAX {
        let Some(head) = jobs.page(queue, JobState::Ready, after, 1, 0)?.pop() else {
            break;
        };
        let head = head.job;
        oldest = Some(oldest.map_or(head.run_at_ms, |o| o.min(head.run_at_ms)));
        if head.priority == i32::MIN {
            break;
        }
        // After every job of this band: the next band's head.
        after = Some(JobCursor {
            priority: head.priority,
            at_ms: u64::MAX,
            id: JobId(u64::MAX),
        });
    }
    Ok(oldest)
}
