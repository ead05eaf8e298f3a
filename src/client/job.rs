//! [`ClaimedJob`]: a claimed job, its local deadline and heartbeat. A job
//! claimed by hand ([`super::Queue::claim`]) is settled by its caller; a
//! job given to a worker loop's handler is renewed and settled by the loop
//! (its handle then only answers whether it may still act).

use super::lifeline::{Lifeline, Owner, RenewFn};
#[cfg(loom)]
use super::loom_canary;
use super::machine::{renew_every, run_limit, Lifetime};
use super::Client;
use crate::core::job::Progress;
#[cfg(loom)]
use crate::core::QueuePolicy;
use crate::core::{self, HolderId, JobId, JobRecord, JobState};
use crate::error::Field;
use crate::error::{Error, LostReason, Result, Target};
use crate::store::FirstRead;
use crate::sync::{lock, Mutex};
use crate::time::LocalMs;
use std::collections::HashMap;
use std::sync::Arc;

/// A claimed job. Valid while [`ClaimedJob::is_valid`]; heartbeat to keep
/// it, then complete or fail it. Dropping it unfinished leaves the claim to
/// expire (the job is then retried).
pub struct ClaimedJob {
    client: Client,
    job: JobRecord,
    token: u64,
    lease_ms: u64,
    /// Renewed and settled by a worker loop, not by hand.
    managed: bool,
    pub(crate) life: Arc<Lifeline>,
    /// The result a worker loop's handler set, kept with the job if the
    /// handler succeeds.
    result: Mutex<Option<Arc<[u8]>>>,
    /// Where [`ClaimedJob::progress`] leaves its report for the claim's
    /// next transaction (its own, or its worker loop's).
    board: ProgressBoard,
}

/// Progress reports waiting for the next transaction of their claim (a
/// renewal or a settle), newest per claim. A worker loop shares one among
/// its jobs; a job claimed by hand has its own.
#[derive(Clone, Default)]
pub(crate) struct ProgressBoard(Arc<Mutex<HashMap<(JobId, u64), Progress>>>);

impl ProgressBoard {
    fn post(&self, id: JobId, token: u64, progress: Progress) {
        lock(&self.0).insert((id, token), progress);
    }

    /// Take the reports of `claims` off the board and hand them to `send`
    /// (a transaction that records them, [`record_reports`]); if it fails
    /// they go back, unless a newer report of the same claim arrived.
    pub(crate) fn send<R>(
        &self,
        claims: impl IntoIterator<Item = (JobId, u64)>,
        send: impl FnOnce(&[(JobId, u64, Progress)]) -> Result<R>,
    ) -> Result<R> {
        let reports = self.take(claims);
        let sent = send(&reports);
        if sent.is_err() {
            self.put_back(reports);
        }
        sent
    }

    /// Put back `reports` a transaction could not send (unless a newer
    /// report of the same claim arrived meanwhile).
    fn put_back(&self, reports: Vec<(JobId, u64, Progress)>) {
        if reports.is_empty() {
            return;
        }
        let mut board = lock(&self.0);
        for (id, token, p) in reports {
            board.entry((id, token)).or_insert(p);
        }
    }

    /// Drop the reports of `claims` (lost or ended: nothing will send
    /// them).
    pub(crate) fn forget(&self, claims: impl IntoIterator<Item = (JobId, u64)>) {
        drop(self.take(claims));
    }

    /// The reports of the claims `claims` names, taken off the board.
    fn take(&self, claims: impl IntoIterator<Item = (JobId, u64)>) -> Vec<(JobId, u64, Progress)> {
        let mut board = lock(&self.0);
        if board.is_empty() {
            return Vec::new();
        }
        claims
            .into_iter()
            .filter_map(|(id, token)| board.remove(&(id, token)).map(|p| (id, token, p)))
            .collect()
    }
}

/// Record `reports` (of `holder`'s claims) in `tx`, ahead of the renewal or
/// settle that carries them: a stale claim's report is refused there (the
/// renewal or settle then says the claim is lost).
pub(crate) fn record_reports(
    tx: &mut dyn core::Txn,
    holder: HolderId,
    reports: &[(JobId, u64, Progress)],
) -> Result<()> {
    if !reports.is_empty() {
        core::job::record_progress(tx.jobs()?, holder, reports)?;
    }
    Ok(())
}

impl std::fmt::Debug for ClaimedJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimedJob")
            .field("id", &self.job.id)
            .field("token", &self.token)
            .field("attempt", &self.job.attempts)
            .finish()
    }
}

impl ClaimedJob {
    /// A job claimed by a request sent at `sent_at` (local clock).
    pub(crate) fn claimed(client: Client, job: JobRecord, lease_ms: u64, sent_at: LocalMs) -> Self {
        let token = job.claim.map_or(0, |c| c.token);
        let seed = token ^ job.id.0;
        let drift = client.inner.drift;
        // Never valid past the job's run-time limit (F3), whatever the
        // renewals: the store's claim ends there.
        let limit = run_limit(sent_at, job.timeout_ms, drift);
        let life =
            Lifetime::granted(sent_at, lease_ms, drift, renew_every(lease_ms), seed).capped(limit);
        Self::with_life(client, job, lease_ms, life, ProgressBoard::default())
    }

    /// A job run by a worker loop, valid until the loop says otherwise;
    /// its progress reports go on the loop's `board`.
    pub(crate) fn managed(
        client: Client,
        job: JobRecord,
        lease_ms: u64,
        deadline: LocalMs,
        board: &ProgressBoard,
    ) -> Self {
        let mut job = Self::with_life(
            client,
            job,
            lease_ms,
            Lifetime::until(deadline),
            board.clone(),
        );
        job.managed = true;
        job
    }

    fn with_life(
        client: Client,
        job: JobRecord,
        lease_ms: u64,
        life: Lifetime,
        board: ProgressBoard,
    ) -> Self {
        let token = job.claim.map_or(0, |c| c.token);
        let target = Target::Job { id: job.id, token };
        let fork = client.fork_guard();
        ClaimedJob {
            client,
            job,
            token,
            lease_ms,
            managed: false,
            life: Lifeline::new(Owner::Job(target), life, fork),
            result: Mutex::new(None),
            board,
        }
    }

    /// The job's id.
    pub fn id(&self) -> JobId {
        self.job.id
    }

    /// The claim's fencing token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Which attempt this is (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.job.attempts
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.job.payload
    }

    /// The record as claimed.
    pub fn record(&self) -> &JobRecord {
        &self.job
    }

    /// Whether the worker may still act on the job: same process, not
    /// settled or lost, before the claim's local deadline (see
    /// [`super::LeaseGuard::is_valid`]).
    pub fn is_valid(&self) -> bool {
        self.life.is_valid(self.client.local_now())
    }

    /// Whether a heartbeat has seen a cancel request.
    pub fn cancel_requested(&self) -> bool {
        self.life.cancel_requested()
    }

    /// The loss seen by a heartbeat (or the worker loop), if any.
    pub fn lost(&self) -> Option<LostReason> {
        self.life.lost()
    }

    pub(crate) fn by_hand(&self, what: &str) -> Result<()> {
        if self.managed {
            return Err(Error::invalid(
                Field::Job,
                format!(
                    "job {} is run by a worker loop, which {what}s it: return from the handler instead",
                    self.job.id
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn renew_fn(&self) -> RenewFn {
        let client = self.client.clone();
        let board = self.board.clone();
        let (id, token, lease_ms) = (self.job.id, self.token, self.lease_ms);
        #[cfg(loom)]
        let naive = loom_canary::naive();
        Box::new(move |deadline| {
            let holder = client.inner.holder.id;
            #[cfg(loom)]
            if naive {
                // Read, then write back in a second transaction: a lost update.
                let mut job =
                    client.run("get", |tx| core::job::get(tx, id, &QueuePolicy::default()))?;
                if let Some(c) = job.claim.as_mut() {
                    c.lease_until_ms += lease_ms;
                }
                client.run("put", |tx| tx.jobs()?.put_job(&job))?;
                return Ok(false);
            }
            let renewed = board.send([(id, token)], |reports| {
                client.run_until(
                    "heartbeat",
                    Some(deadline),
                    Some(FirstRead::Jobs(&[id])),
                    |tx| {
                        record_reports(tx, holder, reports)?;
                        core::job::heartbeat(tx, id, holder, token, lease_ms)
                    },
                )
            });
            renewed.map(|reply| reply.cancel_requested)
        })
    }

    /// Extend the claim now. Returns whether a cancel was requested.
    pub fn heartbeat(&self) -> Result<bool> {
        self.by_hand("heartbeat")?;
        self.life.check_usable(false)?;
        let sent_at = self.client.local_now();
        let outcome = (self.renew_fn())(self.life.deadline());
        self.life.record(sent_at, self.client.local_now(), &outcome);
        outcome
    }

    /// Heartbeat in a background thread about every third of the lease;
    /// `on_lost` is called once if the claim is lost.
    pub fn heartbeat_in_background(
        &self,
        on_lost: impl FnOnce(Error) + Send + 'static,
    ) -> Result<()> {
        self.by_hand("heartbeat")?;
        self.life.check_usable(false)?;
        self.life.spawn_keep_alive(
            self.client.inner.clock.clone(),
            self.renew_fn(),
            Box::new(on_lost),
        )
    }

    /// Stop the heartbeat before settling; the claim is ours to settle.
    pub(crate) fn begin_settle(&self) -> Result<()> {
        self.life.check_usable(true)?;
        self.life.finish();
        #[cfg(loom)]
        let skip_join = loom_canary::naive();
        #[cfg(not(loom))]
        let skip_join = false;
        if !skip_join {
            self.life.join();
        }
        Ok(())
    }

    /// Set the result to keep with the job when the worker loop's handler
    /// returns `Ok` (the last one set counts). A result larger than a
    /// payload may be ([`crate::core::MAX_PAYLOAD_BYTES`]) is refused here.
    pub fn set_result(&self, result: impl Into<Vec<u8>>) -> Result<()> {
        let result = result.into();
        core::job::check_result(&result)?;
        *lock(&self.result) = Some(Arc::from(result));
        Ok(())
    }

    /// Report how far the attempt got: `fraction` done (0.0 to 1.0) and a
    /// short message (at most [`core::job::MAX_PROGRESS_MESSAGE`] bytes),
    /// shown by `queue get`, `queue list`, `/api` and the dashboard, and
    /// kept with the job once it ends. Reports ride on the claim's next
    /// renewal or its settle (a worker loop's renewal round, a background
    /// or explicit [`ClaimedJob::heartbeat`], `complete`/`fail`): no
    /// transaction of their own, the newest replacing any not sent yet.
    /// They are fenced by the claim's token: once the claim is lost, this
    /// answers the loss, and a report still on its way is refused by the
    /// store. A new attempt starts without progress.
    pub fn progress(&self, fraction: f64, message: &str) -> Result<()> {
        let progress = Progress::new(fraction, message)?;
        self.life.check_usable(false)?;
        if !self.is_valid() {
            // Past the claim's local deadline: the store would refuse it.
            return Err(self.life.lost_error(LostReason::Expired));
        }
        self.board.post(self.job.id, self.token, progress);
        Ok(())
    }

    /// Run `f` in the claim's transaction `op`, with its reports not yet
    /// sent recorded first.
    fn settle_txn<R>(
        &self,
        op: &'static str,
        mut f: impl FnMut(&mut dyn core::Txn) -> Result<R>,
    ) -> Result<R> {
        let holder = self.client.inner.holder.id;
        let ids = [self.job.id];
        self.board.send([(self.job.id, self.token)], |reports| {
            self.client.run_reading(op, FirstRead::Jobs(&ids), |tx| {
                record_reports(tx, holder, reports)?;
                f(tx)
            })
        })
    }

    /// The result set with [`ClaimedJob::set_result`], taken.
    pub(crate) fn take_result(&self) -> Option<Arc<[u8]>> {
        lock(&self.result).take()
    }

    /// Mark the job done, keeping `result` with it (shown by `queue get`);
    /// a result larger than a payload may be is refused before anything
    /// changes.
    pub fn complete_with(&self, result: &[u8]) -> Result<()> {
        core::job::check_result(result)?;
        self.by_hand("settle")?;
        self.begin_settle()?;
        self.complete_with_txn(result)
    }

    /// The transaction of [`ClaimedJob::complete_with`], once settling began.
    pub(crate) fn complete_with_txn(&self, result: &[u8]) -> Result<()> {
        let holder = self.client.inner.holder.id;
        let (id, token) = (self.job.id, self.token);
        self.settle_txn("complete", |tx| {
            core::job::complete_with(tx, id, holder, token, result)
        })
    }

    /// Mark the job done (Q2: only with the current, unexpired claim).
    pub fn complete(&self) -> Result<()> {
        self.by_hand("settle")?;
        self.begin_settle()?;
        self.complete_txn()
    }

    /// Report the attempt failed; returns the job's new state (scheduled
    /// for a retry, dead, or cancelled). A reason the store would refuse
    /// (longer than [`crate::core::MAX_TEXT_BYTES`], or with NUL) is
    /// rejected with [`Error::Invalid`] before anything changes: the claim
    /// stays valid and heartbeating, so the caller can fail it again with a
    /// shorter reason ([`super::fit_reason`] makes one).
    pub fn fail(&self, reason: &str) -> Result<JobState> {
        core::check_text(Field::Reason, reason)?;
        self.by_hand("settle")?;
        self.begin_settle()?;
        self.fail_txn(reason)
    }

    /// Give the job back without an outcome: ready again at once, its
    /// attempt still counted (see [`core::job::abandon`]).
    pub fn abandon(&self) -> Result<JobState> {
        self.by_hand("settle")?;
        self.begin_settle()?;
        self.abandon_txn()
    }

    /// The transaction of [`ClaimedJob::complete`], once settling began.
    pub(crate) fn complete_txn(&self) -> Result<()> {
        let holder = self.client.inner.holder.id;
        let (id, token) = (self.job.id, self.token);
        self.settle_txn("complete", |tx| core::job::complete(tx, id, holder, token))
    }

    /// The transaction of [`ClaimedJob::fail`], once settling began.
    pub(crate) fn fail_txn(&self, reason: &str) -> Result<JobState> {
        let holder = self.client.inner.holder.id;
        let policy = self.client.inner.policy;
        let (id, token) = (self.job.id, self.token);
        self.settle_txn("fail", |tx| {
            core::job::fail(tx, id, holder, token, reason, &policy)
        })
    }

    /// The transaction of [`ClaimedJob::abandon`], once settling began.
    pub(crate) fn abandon_txn(&self) -> Result<JobState> {
        let holder = self.client.inner.holder.id;
        let (id, token) = (self.job.id, self.token);
        self.settle_txn("abandon", |tx| {
            core::job::abandon(tx, id, holder, token, true)
        })
    }
}

impl Drop for ClaimedJob {
    fn drop(&mut self) {
        // Stop the heartbeat; never settle the job implicitly, and never in
        // a forked child.
        if self.life.fork.is_origin_strict() {
            self.life.finish();
            self.life.join();
        }
    }
}
