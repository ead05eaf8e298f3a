//! The in-memory store: one mutex over hash maps and ordered indexes.
//!
//! For tests, the simulator and embedding in one process. Every index is an
//! ordered set, so a claim costs O(log n) in the queue's depth and nothing in
//! the number of finished jobs. The store's clock never goes backwards: each
//! transaction reads `max(clock, last reading)`.
//!
//! Atomicity (S1): a transaction writes in place and keeps an undo log of
//! the first old value of every record it touches; if the closure returns
//! `Err`, the log is replayed backwards and the state is as before.

use crate::clock::{Clock, MonotonicClock};
use crate::core::{ClaimRank, JobId, JobQuery, JobRecord, JobState, LeaseRecord, StateCounts, Txn};
use crate::error::Result;
use crate::store::Store;
use crate::sync::{lock, Condvar, Mutex};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Per-queue indexes, kept in step with every `put_job`/`delete_job`.
#[derive(Debug, Default)]
struct QueueIndex {
    ready: BTreeSet<ClaimRank>,
    scheduled: BTreeSet<(u64, JobId)>,
    running: BTreeSet<(u64, JobId)>,
    finished: BTreeSet<(u64, JobId)>,
    unique: HashMap<Arc<str>, JobId>,
    ids: BTreeSet<JobId>,
    counts: StateCounts,
}

impl QueueIndex {
    fn insert(&mut self, job: &JobRecord) {
        let id = job.id;
        match job.state {
            JobState::Ready => {
                self.ready.insert(job.rank());
            }
            JobState::Scheduled => {
                self.scheduled.insert((job.run_at_ms, id));
            }
            JobState::Running => {
                let until = job.claim.map_or(0, |c| c.lease_until_ms);
                self.running.insert((until, id));
            }
            JobState::Done | JobState::Dead | JobState::Cancelled => {
                self.finished.insert((job.finished_at_ms.unwrap_or(0), id));
            }
        }
        if let (Some(key), false) = (&job.unique_key, job.state.is_terminal()) {
            self.unique.insert(key.clone(), id);
        }
        self.ids.insert(id);
        self.counts.add(job.state, 1);
    }

    fn remove(&mut self, job: &JobRecord) {
        let id = job.id;
        match job.state {
            JobState::Ready => {
                self.ready.remove(&job.rank());
            }
            JobState::Scheduled => {
                self.scheduled.remove(&(job.run_at_ms, id));
            }
            JobState::Running => {
                let until = job.claim.map_or(0, |c| c.lease_until_ms);
                self.running.remove(&(until, id));
            }
            JobState::Done | JobState::Dead | JobState::Cancelled => {
                self.finished.remove(&(job.finished_at_ms.unwrap_or(0), id));
            }
        }
        if let Some(key) = &job.unique_key {
            if self.unique.get(key) == Some(&id) {
                self.unique.remove(key);
            }
        }
        self.ids.remove(&id);
        self.counts.add(job.state, -1);
    }
}

/// The old value of something a transaction changed.
#[derive(Debug)]
enum Undo {
    Lease(Arc<str>, Option<LeaseRecord>),
    Job(JobId, Option<JobRecord>),
    LastJobId(u64),
}

#[derive(Debug, Default)]
struct MemState {
    last_now_ms: u64,
    leases: HashMap<Arc<str>, LeaseRecord>,
    jobs: HashMap<JobId, JobRecord>,
    queues: HashMap<Arc<str>, QueueIndex>,
    last_job_id: u64,
    lease_epoch: u64,
    /// Reused between transactions so a transaction does not allocate it.
    undo: Vec<Undo>,
}

impl MemState {
    /// Insert, replace or remove a job, keeping its queue's index in step.
    /// Returns the previous record.
    fn set_job(&mut self, id: JobId, new: Option<&JobRecord>) -> Option<JobRecord> {
        let old = match new {
            Some(job) => self.jobs.insert(id, job.clone()),
            None => self.jobs.remove(&id),
        };
        if let Some(old) = &old {
            if let Some(index) = self.queues.get_mut(&*old.queue) {
                index.remove(old);
            }
        }
        if let Some(job) = new {
            if !self.queues.contains_key(&*job.queue) {
                self.queues.insert(job.queue.clone(), QueueIndex::default());
            }
            if let Some(index) = self.queues.get_mut(&*job.queue) {
                index.insert(job);
            }
        }
        old
    }

    fn rollback(&mut self) {
        while let Some(undo) = self.undo.pop() {
            match undo {
                Undo::Lease(key, Some(rec)) => {
                    self.leases.insert(key, rec);
                }
                Undo::Lease(key, None) => {
                    self.leases.remove(&key);
                }
                Undo::Job(id, old) => {
                    self.set_job(id, old.as_ref());
                }
                Undo::LastJobId(last) => self.last_job_id = last,
            }
        }
    }
}

/// The in-memory [`Store`]. Thread-safe; clone the `Arc` to share it.
#[derive(Debug)]
pub struct MemStore {
    state: Mutex<MemState>,
    freed: Condvar,
    clock: Arc<dyn Clock>,
}

impl MemStore {
    /// A store on a monotonic clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(MonotonicClock::new()))
    }

    /// A store on the given clock (a [`crate::ManualClock`] in tests).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemStore {
            state: Mutex::new(MemState::default()),
            freed: Condvar::new(),
            clock,
        }
    }
}

impl Default for MemStore {
    fn default() -> Self {
        Self::new()
    }
}

struct MemTxn<'a> {
    st: &'a mut MemState,
    now_ms: u64,
    freed: bool,
}

impl Txn for MemTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn lease_mut(&mut self, key: &str, create: bool) -> Result<Option<&mut LeaseRecord>> {
        let st = &mut *self.st;
        match st.leases.get_key_value(key) {
            Some((k, rec)) => st.undo.push(Undo::Lease(k.clone(), Some(rec.clone()))),
            None if create => {
                let k: Arc<str> = Arc::from(key);
                st.undo.push(Undo::Lease(k.clone(), None));
                st.leases.insert(k, LeaseRecord::default());
            }
            None => return Ok(None),
        }
        Ok(st.leases.get_mut(key))
    }

    fn lease_freed(&mut self, _key: &str) {
        self.freed = true;
    }

    fn next_job_id(&mut self) -> Result<JobId> {
        self.st.undo.push(Undo::LastJobId(self.st.last_job_id));
        self.st.last_job_id += 1;
        Ok(JobId(self.st.last_job_id))
    }

    fn job(&mut self, id: JobId) -> Result<Option<JobRecord>> {
        Ok(self.st.jobs.get(&id).cloned())
    }

    fn put_job(&mut self, job: &JobRecord) -> Result<()> {
        let old = self.st.set_job(job.id, Some(job));
        self.st.undo.push(Undo::Job(job.id, old));
        Ok(())
    }

    fn delete_job(&mut self, id: JobId) -> Result<()> {
        let old = self.st.set_job(id, None);
        self.st.undo.push(Undo::Job(id, old));
        Ok(())
    }

    fn live_unique(&mut self, queue: &str, unique_key: &str) -> Result<Option<JobId>> {
        Ok(self
            .st
            .queues
            .get(queue)
            .and_then(|q| q.unique.get(unique_key).copied()))
    }

    fn scan(
        &mut self,
        queue: &str,
        query: JobQuery,
        limit: usize,
        out: &mut Vec<JobId>,
    ) -> Result<()> {
        let Some(q) = self.st.queues.get(queue) else {
            return Ok(());
        };
        let until = |set: &BTreeSet<(u64, JobId)>, t: u64, out: &mut Vec<JobId>| {
            out.extend(
                set.range(..=(t, JobId(u64::MAX)))
                    .take(limit)
                    .map(|&(_, id)| id),
            );
        };
        match query {
            JobQuery::Ready => out.extend(q.ready.iter().take(limit).map(|r| r.2)),
            JobQuery::Due { now_ms } => until(&q.scheduled, now_ms, out),
            JobQuery::Expired { now_ms } => until(&q.running, now_ms, out),
            JobQuery::FinishedBy { cutoff_ms } => until(&q.finished, cutoff_ms, out),
        }
        Ok(())
    }

    fn counts(&mut self, queue: &str) -> Result<StateCounts> {
        Ok(self
            .st
            .queues
            .get(queue)
            .map(|q| q.counts)
            .unwrap_or_default())
    }

    fn list(
        &mut self,
        queue: &str,
        state: Option<JobState>,
        after: JobId,
        limit: usize,
    ) -> Result<Vec<JobRecord>> {
        let Some(q) = self.st.queues.get(queue) else {
            return Ok(Vec::new());
        };
        let jobs = &self.st.jobs;
        Ok(q.ids
            .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            .filter_map(|id| jobs.get(id))
            .filter(|j| state.is_none_or(|s| j.state == s))
            .take(limit)
            .cloned()
            .collect())
    }
}

impl Store for MemStore {
    fn transact(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()> {
        let mut st = lock(&self.state);
        // A transaction that panicked left its undo log: finish rolling it back.
        st.rollback();
        let now_ms = self.clock.now_ms().max(st.last_now_ms);
        st.last_now_ms = now_ms;
        let mut tx = MemTxn {
            st: &mut st,
            now_ms,
            freed: false,
        };
        let result = f(&mut tx);
        let freed = tx.freed;
        if result.is_err() {
            st.rollback();
        } else {
            st.undo.clear();
            if freed {
                st.lease_epoch = st.lease_epoch.wrapping_add(1);
                self.freed.notify_all();
            }
        }
        result
    }

    fn describe(&self) -> String {
        "mem".to_owned()
    }

    fn lease_epoch(&self) -> u64 {
        lock(&self.state).lease_epoch
    }

    fn wait_lease_epoch(&self, epoch: u64, timeout: Duration) -> bool {
        let st = lock(&self.state);
        if st.lease_epoch != epoch {
            return true;
        }
        let (st, _) = match self.freed.wait_timeout(st, timeout) {
            Ok(pair) => pair,
            Err(poisoned) => poisoned.into_inner(),
        };
        st.lease_epoch != epoch
    }
}
