//! What the dashboard reads and does. Every read is a normal store
//! transaction (`StoreExt::txn_as` over the core's listing rules, or the
//! library's `Client`), run on a blocking thread ([`blocking`]): the
//! async threads never touch the store (the PostgreSQL driver would panic
//! there), and a transaction ends before anything is rendered, so no
//! write lock is held while a page is built. A summary is one transaction
//! per queue, so a page of queues never holds the store for all of them
//! at once.

use super::UiError;
use crate::presence;
use leasehold::core::{self, JobCursor, JobPeek, LeasePage, QueueSummary, SummaryOptions};
use leasehold::{Client, JobId, JobState, QueuePolicy, Store, StoreExt};
use std::sync::Arc;
use std::time::Duration;

/// Queues per page of the overview.
pub const QUEUES_PAGE: usize = 50;
/// Queues offered by the jobs page's selector.
pub const QUEUE_CHOICES: usize = 200;
/// Held keys per page (records read per transaction).
pub const LEASES_PAGE: usize = 100;
/// Payload bytes shown in a list.
pub const LIST_PREVIEW_BYTES: usize = 64;
/// Payload bytes shown on a job's page.
pub const JOB_PREVIEW_BYTES: usize = 4096;

/// The store and how the dashboard reads it.
pub struct Reader {
    pub store: Arc<dyn Store>,
    /// For the actions and single jobs: the library's own calls, with
    /// their retries of transient store errors.
    pub client: Client,
    pub policy: QueuePolicy,
    pub summary: SummaryOptions,
}

/// Run a store call on a blocking thread.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, UiError> + Send + 'static,
) -> Result<T, UiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| UiError::Internal(format!("a store call failed: {e}")))?
}

/// A page of queues with their summaries.
#[derive(Default)]
pub struct Overview {
    pub queues: Vec<(String, QueueSummary)>,
    /// The last queue shown, when more may follow.
    pub next: Option<String>,
    /// Why there are no queues at all: the store keeps leases only.
    pub leases_only: Option<String>,
}

/// One state's jobs of one queue.
pub struct JobsView {
    /// `None` when the store has no queue yet.
    pub queue: Option<String>,
    pub state: JobState,
    pub jobs: Vec<JobPeek>,
    pub next: Option<JobCursor>,
    /// The queue's counts, for the state tabs.
    pub summary: Option<QueueSummary>,
    /// Queues to choose from.
    pub queues: Vec<String>,
    pub now_ms: u64,
    /// As in [`Overview`].
    pub leases_only: Option<String>,
}

impl JobsView {
    /// No jobs (no queue yet, or none kept).
    fn empty(state: JobState) -> JobsView {
        JobsView {
            queue: None,
            state,
            jobs: Vec::new(),
            next: None,
            summary: None,
            queues: Vec::new(),
            now_ms: 0,
            leases_only: None,
        }
    }
}

/// One job, its payload cut to a preview, and its worker's label.
pub struct JobView {
    pub peek: JobPeek,
    pub worker: Option<String>,
    pub now_ms: u64,
}

/// A page of held keys.
pub struct LeasesView {
    pub page: LeasePage,
    pub now_ms: u64,
}

/// The one place a store refuses job work ([`leasehold::core::Txn::jobs`]),
/// as a page says it: not an error, a store that keeps leases only.
fn leases_only<T>(read: Result<T, UiError>) -> Result<Result<T, String>, UiError> {
    match read {
        Ok(v) => Ok(Ok(v)),
        Err(UiError::Store(leasehold::Error::Invalid {
            field: leasehold::Field::Store,
            reason,
            ..
        })) => Ok(Err(reason)),
        Err(e) => Err(e),
    }
}

impl Reader {
    fn summary(&self, queue: &str) -> Result<QueueSummary, UiError> {
        let opts = self.summary;
        Ok(self.store.txn_as("ui_summary", |tx| {
            core::job::summary(tx, queue, &self.policy, &opts)
        })?)
    }

    fn queue_names(&self, after: &str, limit: usize) -> Result<Vec<String>, UiError> {
        Ok(self
            .store
            .txn_as("ui_queues", |tx| core::job::queues(tx, after, limit))?)
    }

    /// Up to [`QUEUES_PAGE`] queues after `after`, each summarized.
    pub fn overview(&self, after: &str) -> Result<Overview, UiError> {
        let names = match leases_only(self.queue_names(after, QUEUES_PAGE))? {
            Ok(names) => names,
            Err(why) => {
                return Ok(Overview {
                    leases_only: Some(why),
                    ..Overview::default()
                })
            }
        };
        let next = (names.len() == QUEUES_PAGE)
            .then(|| names.last().cloned())
            .flatten();
        let mut queues = Vec::with_capacity(names.len());
        for name in names {
            let summary = self.summary(&name)?;
            queues.push((name, summary));
        }
        Ok(Overview {
            queues,
            next,
            leases_only: None,
        })
    }

    /// Up to `limit` jobs of `queue` (default: the first queue) in `state`
    /// after `after`.
    pub fn jobs(
        &self,
        queue: Option<&str>,
        state: JobState,
        after: Option<JobCursor>,
        limit: usize,
    ) -> Result<JobsView, UiError> {
        let queues = match leases_only(self.queue_names("", QUEUE_CHOICES))? {
            Ok(queues) => queues,
            Err(why) => {
                return Ok(JobsView {
                    state,
                    leases_only: Some(why),
                    ..JobsView::empty(state)
                })
            }
        };
        let queue = queue.map(str::to_owned).or_else(|| queues.first().cloned());
        let Some(name) = queue.clone() else {
            return Ok(JobsView {
                state,
                queues,
                ..JobsView::empty(state)
            });
        };
        let summary = self.summary(&name)?;
        let (jobs, now_ms) = self.store.txn_as("ui_jobs", |tx| {
            let page = core::job::page(
                tx,
                &name,
                state,
                after,
                limit,
                LIST_PREVIEW_BYTES,
                &self.policy,
            )?;
            Ok((page, tx.now_ms()))
        })?;
        let next = (jobs.len() == limit)
            .then(|| jobs.last().map(|p| JobCursor::of(&p.job)))
            .flatten();
        Ok(JobsView {
            queue,
            state,
            jobs,
            next,
            summary: Some(summary),
            queues,
            now_ms,
            leases_only: None,
        })
    }

    /// One job with its worker's label (read in the same transaction).
    pub fn job(&self, id: JobId) -> Result<JobView, UiError> {
        let (job, worker, now_ms) = self.store.txn_as("ui_job", |tx| {
            let job = core::job::get(tx, id, &self.policy)?;
            let worker = match job.claim {
                Some(claim) => presence::label_of(tx, claim.holder)?,
                None => None,
            };
            Ok((job, worker, tx.now_ms()))
        })?;
        Ok(JobView {
            peek: JobPeek::of(&job, JOB_PREVIEW_BYTES),
            worker,
            now_ms,
        })
    }

    /// Up to [`LEASES_PAGE`] records after `after`, the held keys among them.
    pub fn leases(&self, after: &str) -> Result<LeasesView, UiError> {
        let (page, now_ms) = self.store.txn_as("ui_leases", |tx| {
            let page = core::lease::list(tx, after, LEASES_PAGE)?;
            Ok((page, tx.now_ms()))
        })?;
        Ok(LeasesView { page, now_ms })
    }

    /// Make a dead or cancelled job ready again.
    pub fn retry(&self, id: JobId) -> Result<(), UiError> {
        Ok(self.client.retry_job(id)?)
    }

    /// Cancel a job; its state afterwards (running: asked to stop).
    pub fn cancel(&self, id: JobId) -> Result<JobState, UiError> {
        Ok(self.client.cancel_job(id)?)
    }

    /// Pause or resume `queue`.
    pub fn set_paused(&self, queue: &str, paused: bool) -> Result<bool, UiError> {
        let q = self.client.queue(queue)?;
        Ok(if paused { q.pause()? } else { q.resume()? })
    }

    /// Delete `queue`'s finished jobs older than `older_than`, a bounded
    /// batch per transaction; how many.
    pub fn purge(&self, queue: &str, older_than: Duration) -> Result<u64, UiError> {
        Ok(self.client.queue(queue)?.purge(older_than)?)
    }
}
