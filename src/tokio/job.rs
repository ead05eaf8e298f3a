//! [`ClaimedJob`] (async): a claimed job, as a worker loop's handler gets
//! it or as [`super::Queue::claim`] returns it.

use super::guard::keep_alive;
use super::{CancellationToken, Client};
use crate::core::{self, JobId, JobRecord, JobState};
use crate::error::Field;
use crate::error::{LostReason, Result};
use crate::sync::{lock, Mutex};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// A claimed job (async). Its [`ClaimedJob::cancellation`] token is
/// cancelled when the handler should stop: the claim is lost, the job was
/// cancelled, or a worker loop's shutdown gives it back. A worker loop
/// renews and settles its jobs itself (the handler's return value is the
/// outcome); a job claimed by hand is heartbeat and settled here. Clones
/// are handles on the same claim.
#[derive(Clone)]
pub struct ClaimedJob {
    client: Client,
    job: Arc<crate::ClaimedJob>,
    cancel: CancellationToken,
    task: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl std::fmt::Debug for ClaimedJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("tokio::ClaimedJob").field(&self.job).finish()
    }
}

impl ClaimedJob {
    pub(crate) fn new(client: &Client, job: Arc<crate::ClaimedJob>) -> ClaimedJob {
        ClaimedJob {
            client: client.clone(),
            job,
            cancel: CancellationToken::new(),
            task: Arc::new(Mutex::new(None)),
        }
    }

    /// The sync handle underneath.
    pub(crate) fn sync_job(&self) -> &Arc<crate::ClaimedJob> {
        &self.job
    }

    /// Set the result to keep with the job when the worker loop's handler
    /// returns `Ok` (see [`crate::ClaimedJob::set_result`]).
    pub fn set_result(&self, result: impl Into<Vec<u8>>) -> Result<()> {
        self.job.set_result(result)
    }

    /// Report how far the attempt got (see [`crate::ClaimedJob::progress`]:
    /// sent with the claim's next renewal or its settle, fenced by its
    /// token).
    pub fn progress(&self, fraction: f64, message: &str) -> Result<()> {
        self.job.progress(fraction, message)
    }

    /// Mark the job done, keeping `result` with it (a job claimed by hand).
    pub async fn complete_with(&self, result: &[u8]) -> Result<()> {
        core::job::check_result(result)?;
        let result = result.to_vec();
        self.settle(move |job| job.complete_with_txn(&result)).await
    }

    /// Tell the handler to stop (a worker loop's decision).
    pub(crate) fn stop(&self) {
        self.cancel.cancel();
    }

    /// The job's id.
    pub fn id(&self) -> JobId {
        self.job.id()
    }

    /// The claim's fencing token.
    pub fn token(&self) -> u64 {
        self.job.token()
    }

    /// Which attempt this is (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.job.attempt()
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        self.job.payload()
    }

    /// The job's record as claimed.
    pub fn record(&self) -> &JobRecord {
        self.job.record()
    }

    /// Whether the worker may still act on the job (see
    /// [`crate::ClaimedJob::is_valid`]).
    pub fn is_valid(&self) -> bool {
        self.job.is_valid()
    }

    /// Whether a heartbeat has seen a cancel request.
    pub fn cancel_requested(&self) -> bool {
        self.job.cancel_requested()
    }

    /// The loss seen so far, if any.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.job.lost()
    }

    /// Resolves when the handler should stop (lost, cancelled, given back).
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// A token cancelled when the handler should stop, for work the job
    /// hands on; cancelling it yourself touches only your copy.
    pub fn cancellation(&self) -> CancellationToken {
        self.cancel.child_token()
    }

    /// Extend the claim now (a job claimed by hand). Returns whether a
    /// cancel was requested (the token is then cancelled too).
    pub async fn heartbeat(&self) -> Result<bool> {
        let job = self.job.clone();
        let outcome = super::on_store(self.client.inline(), move || job.heartbeat()).await;
        if let Ok(true) = outcome {
            self.cancel.cancel();
        }
        outcome
    }

    /// Heartbeat in a task about every third of the lease (a job claimed
    /// by hand); a loss or a cancel request cancels the token.
    pub fn keep_alive(&self) -> Result<()> {
        self.job.by_hand("heartbeat")?;
        self.job.life.check_usable(false)?;
        let mut renew = self.job.renew_fn();
        let cancel = self.cancel.clone();
        let on_cancel = cancel.clone();
        let renew = Box::new(move |deadline| {
            let outcome = renew(deadline);
            if let Ok(true) = outcome {
                on_cancel.cancel();
            }
            outcome
        });
        let on_lost = Box::new(move |_| cancel.cancel());
        let clock = self.client.sync.clock().clone();
        if let Some(task) = keep_alive(&self.job.life, clock, renew, on_lost) {
            *lock(&self.task) = Some(task);
        }
        Ok(())
    }

    /// Stop the keep-alive and wait for it, then run `settle` (one of the
    /// sync job's settle transactions) on the blocking pool (or inline:
    /// `on_store`).
    async fn settle<R: Send + 'static>(
        &self,
        settle: impl FnOnce(&crate::ClaimedJob) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        self.job.by_hand("settle")?;
        self.job.life.check_usable(true)?;
        self.job.life.finish();
        let task = lock(&self.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        let job = self.job.clone();
        super::on_store(self.client.inline(), move || settle(&job)).await
    }

    /// Mark the job done (see [`crate::ClaimedJob::complete`]).
    pub async fn complete(&self) -> Result<()> {
        self.settle(|job| job.complete_txn()).await
    }

    /// Report the attempt failed (see [`crate::ClaimedJob::fail`]: a reason
    /// the store would refuse is rejected before anything changes).
    pub async fn fail(&self, reason: &str) -> Result<JobState> {
        core::check_text(Field::Reason, reason)?;
        let reason = reason.to_owned();
        self.settle(move |job| job.fail_txn(&reason)).await
    }

    /// Give the job back without an outcome (see
    /// [`crate::ClaimedJob::abandon`]).
    pub async fn abandon(&self) -> Result<JobState> {
        self.settle(|job| job.abandon_txn()).await
    }
}
