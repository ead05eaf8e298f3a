//! [`Queue`]: a handle on one queue: push, claim by hand, inspect, manage,
//! and the worker loop ([`Queue::work`], driven in `worker.rs`).

use super::job::ClaimedJob;
use super::{ms_of, Client};
use crate::core::schedule::{Fired, PutOutcome};
use crate::core::{
    self, EnqueueOutcome, JobId, JobRecord, JobSpec, JobState, QueueConfig, ScheduleRecord,
    ScheduleSpec, StateCounts,
};
use crate::error::{Error, LostReason, Result};
use crate::store::FirstRead;
use crate::time::WallMs;
use std::sync::Arc;
use std::time::Duration;

/// A handle on one queue.
#[derive(Clone, Debug)]
pub struct Queue {
    pub(crate) client: Client,
    pub(crate) name: Arc<str>,
}

impl Queue {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client behind this handle.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Enqueue a job.
    pub fn push(&self, spec: &JobSpec) -> Result<EnqueueOutcome> {
        let policy = self.client.inner.policy;
        self.client.run("enqueue", |tx| {
            core::job::enqueue(tx, &self.name, spec, &policy)
        })
    }

    /// Enqueue many jobs in one transaction (one commit, one fsync, for
    /// all), in order: all of them or, if one is refused, none. Each
    /// outcome is what [`Queue::push`] of that spec after the ones before
    /// it would return (a spec's unique key is judged against the batch's
    /// earlier jobs too). At most [`MAX_BATCH`](crate::core::MAX_BATCH)
    /// jobs and [`MAX_BATCH_PAYLOAD_BYTES`](crate::core::MAX_BATCH_PAYLOAD_BYTES)
    /// of payloads a call; an error names the spec at fault by its place in
    /// `specs` (from 0). An empty batch does nothing (no transaction).
    pub fn push_many(&self, specs: &[JobSpec]) -> Result<Vec<EnqueueOutcome>> {
        if specs.is_empty() {
            self.client.inner.fork.check()?;
            return Ok(Vec::new());
        }
        let policy = self.client.inner.policy;
        self.client.run("enqueue", |tx| {
            core::job::enqueue_many(tx, &self.name, specs, &policy)
        })
    }

    /// Enqueue a job inside the caller's own PostgreSQL transaction: the
    /// job exists when `tx` commits and never if it rolls back (or a
    /// savepoint it was pushed in does); idle workers wake at the commit.
    /// `tx` must be on the database of this client's store, which must be
    /// a [`PostgresStore`](crate::PostgresStore) (else
    /// [`Error::Invalid`] naming the store). Unique keys behave as in
    /// [`Queue::push`] (the key's lock waits only for other pushes of the
    /// key, until `tx` ends), with two differences: a unique push needs
    /// `tx` in READ COMMITTED (the default), and a candidate job retried
    /// after its claim ran out blocks when either ready or scheduled does
    /// (its backoff's jitter is the client's that brings it up to date). It
    /// calls the schema's SQL function `push` (see the README,
    /// "Transactional enqueue"), which other languages can call too.
    ///
    /// ```no_run
    /// # fn main() -> leasehold::Result<()> {
    /// # let url = "postgres://app@db/app";
    /// let store = leasehold::PostgresStore::open(url)?;
    /// let queue = leasehold::Client::new(store).queue("emails")?;
    /// let mut db = postgres::Client::connect(url, postgres::NoTls).unwrap();
    /// let mut tx = db.transaction().unwrap();
    /// tx.execute("INSERT INTO orders (id) VALUES (42)", &[]).unwrap();
    /// queue.push_in(&mut tx, &leasehold::JobSpec::new(r#"{"order":42}"#))?;
    /// tx.commit().unwrap(); // the order and its email job, or neither
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(all(feature = "postgres", not(loom)))]
    pub fn push_in(
        &self,
        tx: &mut postgres::Transaction<'_>,
        spec: &JobSpec,
    ) -> Result<EnqueueOutcome> {
        let policy = self.client.policy();
        crate::store::postgres::push_in(tx, self.postgres_schema()?, &self.name, spec, policy)
    }

    /// The schema [`Queue::push_in`] writes into.
    #[cfg(all(feature = "postgres", not(loom)))]
    pub(crate) fn postgres_schema(&self) -> Result<&str> {
        self.client.inner.fork.check()?;
        let store = self.client.store();
        store.postgres_schema().ok_or_else(|| {
            Error::invalid(
                crate::error::Field::Store,
                format!(
                    "push_in needs a PostgreSQL store; this client's store is {}",
                    store.describe()
                ),
            )
        })
    }

    /// Claim the next ready job, if any, under a lease of `lease`.
    pub fn claim(&self, lease: Duration) -> Result<Option<ClaimedJob>> {
        Ok(self.claim_batch(1, lease)?.into_iter().next())
    }

    /// Claim up to `max` ready jobs in one transaction.
    pub fn claim_batch(&self, max: usize, lease: Duration) -> Result<Vec<ClaimedJob>> {
        let lease_ms = ms_of(lease);
        let holder = self.client.inner.holder.id;
        let policy = self.client.inner.policy;
        let sent_at = self.client.local_now();
        let first = crate::FirstRead::Claim {
            queue: &self.name,
            ready: max,
        };
        let jobs = self.client.run_reading("claim", first, |tx| {
            core::job::claim(tx, &self.name, holder, lease_ms, max, &policy)
        })?;
        Ok(jobs
            .into_iter()
            .map(|job| ClaimedJob::claimed(self.client.clone(), job, lease_ms, sent_at))
            .collect())
    }

    /// Complete many claimed jobs in one transaction (one commit, one
    /// fsync, for all). Each job's outcome is reported on its own: a lost
    /// claim does not stop the others.
    pub fn complete_many(&self, jobs: &[ClaimedJob]) -> Result<Vec<Result<()>>> {
        self.client.inner.fork.check_strict()?;
        let ready: Vec<Result<()>> = jobs.iter().map(ClaimedJob::begin_settle).collect();
        let settles: Vec<(JobId, u64, core::job::Settle)> = jobs
            .iter()
            .zip(&ready)
            .filter(|(_, ok)| ok.is_ok())
            .map(|(job, _)| (job.id(), job.token(), core::job::Settle::Complete))
            .collect();
        let ids: Vec<JobId> = settles.iter().map(|s| s.0).collect();
        let holder = self.client.inner.holder.id;
        let policy = self.client.inner.policy;
        let mut states = self
            .client
            .run_reading("settle", FirstRead::Jobs(&ids), |tx| {
                core::job::settle_many(tx, holder, &settles, &policy)
            })?
            .into_iter();
        Ok(jobs
            .iter()
            .zip(ready)
            .map(|(job, ok)| match ok {
                Ok(()) => states
                    .next()
                    .unwrap_or(Err(Error::NotFound(job.id())))
                    .map(drop),
                Err(e) => Err(Error::Lost {
                    target: job.life.target(),
                    reason: match e {
                        Error::Lost { reason, .. } => reason,
                        _ => LostReason::StaleToken,
                    },
                }),
            })
            .collect())
    }

    /// Add a schedule to this queue, or replace the one of the same name
    /// (the same rule keeps its place: every process may register its
    /// schedules at startup). Workers of the queue ([`Queue::work`]) fire
    /// it: each tick becomes one job, however many workers run.
    pub fn schedule(&self, spec: &ScheduleSpec) -> Result<PutOutcome> {
        let wall = WallMs::read(&**self.client.wall_clock());
        self.client.run("schedule", |tx| {
            core::schedule::put(tx, &self.name, spec, wall)
        })
    }

    /// This queue's schedules, by name.
    pub fn schedules(&self) -> Result<Vec<ScheduleRecord>> {
        self.client
            .run("schedules", |tx| core::schedule::list(tx, &self.name))
    }

    /// Remove the schedule `name` (the jobs it made stay).
    pub fn unschedule(&self, name: &str) -> Result<()> {
        self.client.run("unschedule", |tx| {
            core::schedule::remove(tx, &self.name, name)
        })
    }

    /// Fire this queue's due ticks now (workers do it on their own; this is
    /// for a process that runs no worker).
    pub fn fire_schedules(&self) -> Result<Fired> {
        let wall = WallMs::read(&**self.client.wall_clock());
        let policy = self.client.inner.policy;
        self.client.run("fire", |tx| {
            core::schedule::fire(tx, &self.name, wall, &policy)
        })
    }

    /// Jobs per state.
    pub fn stats(&self) -> Result<StateCounts> {
        let policy = self.client.inner.policy;
        self.client
            .run("stats", |tx| core::job::stats(tx, &self.name, &policy))
    }

    /// Pause the queue, durably and fleet-wide: no worker anywhere starts
    /// one of its jobs until [`Queue::resume`] (F2); running jobs finish,
    /// renew and settle as ever, and pushes are accepted. Workers idle
    /// meanwhile as on an empty queue. Returns whether it changed anything
    /// (false: it was paused already).
    pub fn pause(&self) -> Result<bool> {
        self.client
            .run("pause", |tx| core::job::set_paused(tx, &self.name, true))
    }

    /// Resume a paused queue: idle workers are woken and claim at once.
    /// Returns whether it changed anything (false: it was not paused).
    pub fn resume(&self) -> Result<bool> {
        self.client
            .run("resume", |tx| core::job::set_paused(tx, &self.name, false))
    }

    /// Replace the queue's concurrency limits, fleet-wide and durably
    /// ([`Limits::none`](crate::Limits::none) clears them): at most
    /// `concurrency` of its jobs run at once, and at most `per_key` of
    /// those sharing a [`JobSpec::key`](crate::JobSpec::key), across every
    /// worker (F1). Running jobs are never stopped: under a lowered limit,
    /// nothing starts until they are under it. Returns whether the limits
    /// changed.
    pub fn set_limits(&self, limits: crate::Limits) -> Result<bool> {
        self.client.run("set_limits", |tx| {
            core::job::set_limits(tx, &self.name, limits)
        })
    }

    /// The queue's stored flow-control settings (whether it is paused, its
    /// limits).
    pub fn config(&self) -> Result<QueueConfig> {
        self.client
            .run("queue_config", |tx| core::job::queue_config(tx, &self.name))
    }

    /// Up to `limit` jobs after id `after`, optionally only in `state`.
    pub fn list(
        &self,
        state: Option<JobState>,
        after: JobId,
        limit: usize,
    ) -> Result<Vec<JobRecord>> {
        let policy = self.client.inner.policy;
        self.client.run("list", |tx| {
            core::job::list(tx, &self.name, state, after, limit, &policy)
        })
    }

    /// One job by id (see [`Client::job`]).
    pub fn get(&self, id: JobId) -> Result<JobRecord> {
        self.client.job(id)
    }

    /// Cancel a job (see [`Client::cancel_job`]).
    pub fn cancel(&self, id: JobId) -> Result<JobState> {
        self.client.cancel_job(id)
    }

    /// Retry a dead or cancelled job (see [`Client::retry_job`]).
    pub fn retry(&self, id: JobId) -> Result<()> {
        self.client.retry_job(id)
    }

    /// Delete terminal jobs that finished at least `older_than` ago.
    /// Returns how many were deleted.
    pub fn purge(&self, older_than: Duration) -> Result<u64> {
        const CHUNK: usize = 1000;
        let policy = self.client.inner.policy;
        let mut total = 0u64;
        loop {
            let n = self.client.run("purge", |tx| {
                core::job::purge(tx, &self.name, ms_of(older_than), CHUNK, &policy)
            })?;
            total += n as u64;
            if n < CHUNK {
                return Ok(total);
            }
        }
    }
}
