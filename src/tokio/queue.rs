//! [`Queue`] (async): push, claim by hand, inspect and manage a queue; the
//! worker loop is in `worker.rs`.

use super::{ClaimedJob, Client};
use crate::core::schedule::{Fired, PutOutcome};
use crate::core::{
    EnqueueOutcome, JobId, JobRecord, JobSpec, JobState, QueueConfig, ScheduleRecord, ScheduleSpec,
    StateCounts,
};
use crate::error::Result;
use std::sync::Arc;
use std::time::Duration;

/// A handle on one queue (async).
#[derive(Clone, Debug)]
pub struct Queue {
    pub(crate) client: Client,
    pub(crate) sync: crate::Queue,
}

impl Queue {
    /// The queue's name.
    pub fn name(&self) -> &str {
        self.sync.name()
    }

    /// The client behind this handle.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Run `f` with the sync queue on the blocking pool (or inline: `on_store`).
    async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&crate::Queue) -> R + Send + 'static,
    ) -> R {
        let queue = self.sync.clone();
        super::on_store(self.client.inline(), move || f(&queue)).await
    }

    /// Run `f`, a call whose cost grows with the queue (it may read or
    /// delete every job), with the sync queue on the blocking pool, even
    /// on a store whose calls run inline: a purge of a large mem queue
    /// must not hold a runtime thread.
    async fn call_long<R: Send + 'static>(
        &self,
        f: impl FnOnce(&crate::Queue) -> R + Send + 'static,
    ) -> R {
        let queue = self.sync.clone();
        super::blocking(move || f(&queue)).await
    }

    /// Enqueue a job.
    pub async fn push(&self, spec: &JobSpec) -> Result<EnqueueOutcome> {
        let spec = spec.clone();
        self.call(move |q| q.push(&spec)).await
    }

    /// Enqueue many jobs in one transaction ([`crate::Queue::push_many`]).
    pub async fn push_many(&self, specs: &[JobSpec]) -> Result<Vec<EnqueueOutcome>> {
        let specs = specs.to_vec();
        self.call(move |q| q.push_many(&specs)).await
    }

    /// [`crate::Queue::push_in`] on a `tokio-postgres` transaction: the
    /// job exists when `tx` commits and never if it rolls back.
    #[cfg(all(feature = "postgres", not(loom)))]
    pub async fn push_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        spec: &JobSpec,
    ) -> Result<EnqueueOutcome> {
        let schema = self.sync.postgres_schema()?;
        let policy = self.client.sync().policy();
        crate::store::postgres::push_in_async(tx, schema, self.name(), spec, policy).await
    }

    /// Claim the next ready job, if any, under a lease of `lease`.
    pub async fn claim(&self, lease: Duration) -> Result<Option<ClaimedJob>> {
        Ok(self.claim_batch(1, lease).await?.into_iter().next())
    }

    /// Claim up to `max` ready jobs in one transaction.
    pub async fn claim_batch(&self, max: usize, lease: Duration) -> Result<Vec<ClaimedJob>> {
        let jobs = self.call(move |q| q.claim_batch(max, lease)).await?;
        Ok(jobs
            .into_iter()
            .map(|job| ClaimedJob::new(&self.client, Arc::new(job)))
            .collect())
    }

    /// Add or replace a schedule (see [`crate::Queue::schedule`]).
    pub async fn schedule(&self, spec: &ScheduleSpec) -> Result<PutOutcome> {
        let spec = spec.clone();
        self.call(move |q| q.schedule(&spec)).await
    }

    /// This queue's schedules, by name.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRecord>> {
        self.call(|q| q.schedules()).await
    }

    /// Remove the schedule `name`.
    pub async fn unschedule(&self, name: &str) -> Result<()> {
        let name = name.to_owned();
        self.call(move |q| q.unschedule(&name)).await
    }

    /// Fire this queue's due ticks now (see [`crate::Queue::fire_schedules`]).
    pub async fn fire_schedules(&self) -> Result<Fired> {
        self.call(|q| q.fire_schedules()).await
    }

    /// Jobs per state.
    pub async fn stats(&self) -> Result<StateCounts> {
        self.call(|q| q.stats()).await
    }

    /// Pause the queue fleet-wide (see [`crate::Queue::pause`]).
    pub async fn pause(&self) -> Result<bool> {
        self.call(|q| q.pause()).await
    }

    /// Resume a paused queue (see [`crate::Queue::resume`]).
    pub async fn resume(&self) -> Result<bool> {
        self.call(|q| q.resume()).await
    }

    /// Replace the queue's concurrency limits (see
    /// [`crate::Queue::set_limits`]).
    pub async fn set_limits(&self, limits: crate::Limits) -> Result<bool> {
        self.call(move |q| q.set_limits(limits)).await
    }

    /// The queue's stored settings (see [`crate::Queue::config`]).
    pub async fn config(&self) -> Result<QueueConfig> {
        self.call(|q| q.config()).await
    }

    /// Up to `limit` jobs after id `after`, optionally only in `state`.
    pub async fn list(
        &self,
        state: Option<JobState>,
        after: JobId,
        limit: usize,
    ) -> Result<Vec<JobRecord>> {
        self.call_long(move |q| q.list(state, after, limit)).await
    }

    /// One job by id.
    pub async fn get(&self, id: JobId) -> Result<JobRecord> {
        self.call(move |q| q.get(id)).await
    }

    /// Cancel a job (see [`crate::Client::cancel_job`]).
    pub async fn cancel(&self, id: JobId) -> Result<JobState> {
        self.call(move |q| q.cancel(id)).await
    }

    /// Retry a dead or cancelled job.
    pub async fn retry(&self, id: JobId) -> Result<()> {
        self.call(move |q| q.retry(id)).await
    }

    /// Delete terminal jobs that finished at least `older_than` ago.
    pub async fn purge(&self, older_than: Duration) -> Result<u64> {
        self.call_long(move |q| q.purge(older_than)).await
    }
}
