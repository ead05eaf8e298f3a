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
use crate::core::{
    ClaimRank, JobCursor, JobId, JobPeek, JobQuery, JobRecord, JobState, JobTxn, Journal,
    LeaseRecord, Pending, QueueConfig, RateLog, ScheduleRecord, StateCounts, StateSet, Txn,
};
use crate::error::Result;
use crate::store::{Store, Wake};
use crate::sync::{lock, Condvar, Mutex};
use hashbrown::hash_map::EntryRef;
use hashbrown::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

mod index;
use index::QueueIndex;

/// What a transaction changed, to put back if it fails. Leases, jobs and
/// the id counter are disjoint, so each log is replayed backwards on its own.
#[derive(Debug, Default)]
struct UndoLog {
    leases: Vec<(Arc<str>, Option<LeaseRecord>)>,
    jobs: Vec<(JobId, Option<JobRecord>)>,
    last_job_id: Option<u64>,
    schedules: Vec<(ScheduleKey, Option<ScheduleRecord>)>,
    configs: Vec<(Arc<str>, Option<QueueConfig>)>,
    rates: Vec<(ScheduleKey, Option<RateLog>)>,
}

/// A schedule's queue and name (or a rate bucket's queue and key).
type ScheduleKey = (Arc<str>, Arc<str>);

#[derive(Debug, Default)]
struct MemState {
    last_now_ms: u64,
    /// Each value keeps its own key, so one lookup yields both the record
    /// and the key the undo log needs.
    leases: HashMap<Arc<str>, (Arc<str>, LeaseRecord)>,
    jobs: HashMap<JobId, JobRecord>,
    queues: HashMap<Arc<str>, QueueIndex>,
    last_job_id: u64,
    /// Schedules by queue, then name.
    schedules: BTreeMap<ScheduleKey, ScheduleRecord>,
    /// Queues' settings, where set.
    configs: HashMap<Arc<str>, QueueConfig>,
    /// Rate buckets by queue, then key.
    rates: BTreeMap<ScheduleKey, RateLog>,
    /// One counter per [`Wake`] event.
    epochs: [u64; 2],
    /// Threads blocked in `wait_epoch` (a notify is a system call;
    /// skip it when nobody waits).
    waiters: usize,
    /// Reused between transactions so a transaction does not allocate it.
    undo: UndoLog,
    /// Spare lease records whose allocations the undo log reuses.
    spare: Vec<LeaseRecord>,
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
        while let Some((key, old)) = self.undo.leases.pop() {
            match old {
                Some(rec) => {
                    self.leases.insert(key.clone(), (key, rec));
                }
                None => {
                    self.leases.remove(&key);
                }
            }
        }
        while let Some((id, old)) = self.undo.jobs.pop() {
            self.set_job(id, old.as_ref());
        }
        if let Some(last) = self.undo.last_job_id.take() {
            self.last_job_id = last;
        }
        while let Some((key, old)) = self.undo.schedules.pop() {
            match old {
                Some(s) => self.schedules.insert(key, s),
                None => self.schedules.remove(&key),
            };
        }
        while let Some((queue, old)) = self.undo.configs.pop() {
            match old {
                Some(c) => self.configs.insert(queue, c),
                None => self.configs.remove(&queue),
            };
        }
        while let Some((key, old)) = self.undo.rates.pop() {
            match old {
                Some(log) => self.rates.insert(key, log),
                None => self.rates.remove(&key),
            };
        }
    }

    /// Forget the undo log of a committed transaction, keeping the lease
    /// records' allocations for the next one.
    fn commit(&mut self) {
        const SPARE_MAX: usize = 64;
        for (_, old) in self.undo.leases.drain(..) {
            if let (Some(rec), true) = (old, self.spare.len() < SPARE_MAX) {
                self.spare.push(rec);
            }
        }
        self.undo.jobs.clear();
        self.undo.last_job_id = None;
        self.undo.schedules.clear();
        self.undo.configs.clear();
        self.undo.rates.clear();
    }
}

/// The in-memory [`Store`]. Thread-safe; clone the `Arc` to share it.
#[derive(Debug)]
pub struct MemStore {
    state: Mutex<MemState>,
    changed: Condvar,
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
            changed: Condvar::new(),
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
    /// The wake-ups and events this transaction causes when it commits.
    journal: Journal,
}

impl Txn for MemTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn lease_mut(&mut self, key: &str, create: bool) -> Result<Option<&mut LeaseRecord>> {
        let st = &mut *self.st;
        // One hash lookup either way; the key is only allocated on insert.
        Ok(match st.leases.entry_ref(key) {
            EntryRef::Occupied(entry) => {
                let (k, rec) = entry.into_mut();
                let mut old = st.spare.pop().unwrap_or_default();
                old.clone_from(rec);
                st.undo.leases.push((k.clone(), Some(old)));
                Some(rec)
            }
            EntryRef::Vacant(entry) if create => {
                let k: Arc<str> = Arc::from(key);
                st.undo.leases.push((k.clone(), None));
                let (_, rec) = entry.insert((k, LeaseRecord::default()));
                Some(rec)
            }
            EntryRef::Vacant(_) => None,
        })
    }

    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }

    fn jobs(&mut self) -> Result<&mut dyn JobTxn> {
        Ok(self)
    }

    /// Keys are hashed here, not ordered: the records with slots are
    /// sorted per page (the mem store serves tests and one process).
    fn lease_scan(
        &mut self,
        after: &str,
        limit: usize,
        out: &mut Vec<(String, LeaseRecord)>,
    ) -> Result<()> {
        let mut keys: Vec<&Arc<str>> = self
            .st
            .leases
            .iter()
            .filter(|(k, (_, rec))| &***k > after && !rec.slots.is_empty())
            .map(|(k, _)| k)
            .collect();
        keys.sort_unstable();
        keys.truncate(limit);
        for key in keys {
            if let Some((_, rec)) = self.st.leases.get(key) {
                out.push((key.to_string(), rec.clone()));
            }
        }
        Ok(())
    }
}

impl JobTxn for MemTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }

    fn next_job_id(&mut self) -> Result<JobId> {
        if self.st.undo.last_job_id.is_none() {
            self.st.undo.last_job_id = Some(self.st.last_job_id);
        }
        self.st.last_job_id += 1;
        Ok(JobId(self.st.last_job_id))
    }

    fn job(&mut self, id: JobId) -> Result<Option<JobRecord>> {
        Ok(self.st.jobs.get(&id).cloned())
    }

    fn jobs_by_id(&mut self, ids: &[JobId]) -> Result<Vec<JobRecord>> {
        Ok(ids
            .iter()
            .filter_map(|id| self.st.jobs.get(id).cloned())
            .collect())
    }

    fn put_job(&mut self, job: &JobRecord) -> Result<()> {
        let old = self.st.set_job(job.id, Some(job));
        self.st.undo.jobs.push((job.id, old));
        Ok(())
    }

    fn delete_job(&mut self, id: JobId) -> Result<()> {
        let old = self.st.set_job(id, None);
        self.st.undo.jobs.push((id, old));
        Ok(())
    }

    fn unique_jobs(
        &mut self,
        queue: &str,
        unique_key: &str,
        states: StateSet,
        since_ms: u64,
        limit: usize,
    ) -> Result<Vec<JobId>> {
        let Some(ids) = self
            .st
            .queues
            .get(queue)
            .and_then(|q| q.unique.get(unique_key))
        else {
            return Ok(Vec::new());
        };
        let jobs = &self.st.jobs;
        let mut found: Vec<(u64, JobId)> = (ids.iter())
            .filter_map(|id| jobs.get(id))
            .filter(|j| states.contains(j.state) && j.created_at_ms >= since_ms)
            .map(|j| (j.created_at_ms, j.id))
            .collect();
        found.sort_unstable_by(|a, b| b.cmp(a));
        Ok(found.into_iter().take(limit).map(|(_, id)| id).collect())
    }

    fn pending(&mut self, queue: &str, now_ms: u64, chunk: usize, ready: usize) -> Result<Pending> {
        let config = match ready {
            0 => QueueConfig::default(),
            _ => self.st.configs.get(queue).cloned().unwrap_or_default(),
        };
        let Some(q) = self.st.queues.get(queue) else {
            return Ok(Pending {
                config,
                ..Pending::default()
            });
        };
        let jobs = &self.st.jobs;
        let until = |set: &BTreeSet<(u64, JobId)>| -> Vec<JobRecord> {
            set.range(..=(now_ms, JobId(u64::MAX)))
                .take(chunk)
                .filter_map(|(_, id)| jobs.get(id).cloned())
                .collect()
        };
        Ok(Pending {
            expired: until(&q.running),
            due: until(&q.scheduled),
            ready: q
                .claimable
                .iter()
                .take(ready)
                .filter_map(|r| jobs.get(&r.2).cloned())
                .collect(),
            config,
        })
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
        match query {
            JobQuery::FinishedBy { cutoff_ms } => out.extend(
                q.finished
                    .range(..=(cutoff_ms, JobId(u64::MAX)))
                    .take(limit)
                    .map(|&(_, id)| id),
            ),
            JobQuery::Retrying => {
                let jobs = &self.st.jobs;
                out.extend(
                    q.scheduled
                        .iter()
                        .filter(|(_, id)| jobs.get(id).is_some_and(|j| j.attempts > 0))
                        .take(limit)
                        .map(|&(_, id)| id),
                );
            }
        }
        Ok(())
    }

    fn schedules(&mut self, queue: &str) -> Result<Vec<ScheduleRecord>> {
        let from: ScheduleKey = (Arc::from(queue), Arc::from(""));
        Ok(self
            .st
            .schedules
            .range(from..)
            .take_while(|((q, _), _)| **q == *queue)
            .map(|(_, s)| s.clone())
            .collect())
    }

    fn queue_config(&mut self, queue: &str) -> Result<QueueConfig> {
        Ok(self.st.configs.get(queue).cloned().unwrap_or_default())
    }

    fn running_count(&mut self, queue: &str, key: Option<&str>) -> Result<u64> {
        let Some(q) = self.st.queues.get(queue) else {
            return Ok(0);
        };
        let jobs = &self.st.jobs;
        let n = match key {
            None => q.running.len(),
            Some(key) => q
                .running
                .iter()
                .filter(|(_, id)| jobs.get(id).is_some_and(|j| j.key.as_deref() == Some(key)))
                .count(),
        };
        Ok(n as u64)
    }

    fn parked(&mut self, queue: &str, key: Option<&str>, limit: usize) -> Result<Vec<JobRecord>> {
        let Some(q) = self.st.queues.get(queue) else {
            return Ok(Vec::new());
        };
        let jobs = &self.st.jobs;
        let ranks: Vec<&ClaimRank> = match key {
            Some(key) => {
                let key: Arc<str> = Arc::from(key);
                let from = (key.clone(), (std::cmp::Reverse(i32::MAX), 0, JobId(0)));
                q.parked
                    .range(from..)
                    .take_while(|(k, _)| *k == key)
                    .take(limit)
                    .map(|(_, r)| r)
                    .collect()
            }
            None => q.parked.iter().take(limit).map(|(_, r)| r).collect(),
        };
        Ok(ranks
            .into_iter()
            .filter_map(|r| jobs.get(&r.2).cloned())
            .collect())
    }

    fn put_queue_config(&mut self, queue: &str, config: &QueueConfig) -> Result<()> {
        let queue: Arc<str> = Arc::from(queue);
        let old = self.st.configs.insert(queue.clone(), config.clone());
        self.st.undo.configs.push((queue, old));
        Ok(())
    }

    fn rate_log(&mut self, queue: &str, key: &str) -> Result<RateLog> {
        let at: ScheduleKey = (Arc::from(queue), Arc::from(key));
        Ok(self.st.rates.get(&at).cloned().unwrap_or_default())
    }

    fn put_rate_log(&mut self, queue: &str, key: &str, log: &RateLog) -> Result<()> {
        let at: ScheduleKey = (Arc::from(queue), Arc::from(key));
        let old = match log.is_empty() {
            true => self.st.rates.remove(&at),
            false => self.st.rates.insert(at.clone(), log.clone()),
        };
        self.st.undo.rates.push((at, old));
        Ok(())
    }

    fn forget_idle_rates(&mut self, queue: &str, before_ms: u64, limit: usize) -> Result<usize> {
        let from: ScheduleKey = (Arc::from(queue), Arc::from(""));
        let idle: Vec<ScheduleKey> = (self.st.rates.range(from..))
            .take_while(|((q, _), _)| **q == *queue)
            .filter(|(_, log)| {
                log.wake_at_ms.is_none() && log.starts.last().is_none_or(|&t| t <= before_ms)
            })
            .take(limit)
            .map(|(k, _)| k.clone())
            .collect();
        for at in &idle {
            let old = self.st.rates.remove(at);
            self.st.undo.rates.push((at.clone(), old));
        }
        Ok(idle.len())
    }

    fn rate_wakes(
        &mut self,
        queue: &str,
        until_ms: u64,
        limit: usize,
    ) -> Result<Vec<(Arc<str>, u64)>> {
        // A scan of the queue's buckets: the memory store serves tests and
        // one process, where buckets are few.
        let from: ScheduleKey = (Arc::from(queue), Arc::from(""));
        let mut due: Vec<(Arc<str>, u64)> = (self.st.rates.range(from..))
            .take_while(|((q, _), _)| **q == *queue)
            .filter_map(|((_, k), log)| log.wake_at_ms.map(|w| (k.clone(), w)))
            .filter(|(_, w)| *w <= until_ms)
            .collect();
        due.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        due.truncate(limit);
        Ok(due)
    }

    fn put_schedule(&mut self, schedule: &ScheduleRecord) -> Result<()> {
        let key = (schedule.queue.clone(), schedule.name.clone());
        let old = self.st.schedules.insert(key.clone(), schedule.clone());
        self.st.undo.schedules.push((key, old));
        Ok(())
    }

    fn delete_schedule(&mut self, queue: &str, name: &str) -> Result<bool> {
        let key: ScheduleKey = (Arc::from(queue), Arc::from(name));
        let old = self.st.schedules.remove(&key);
        let existed = old.is_some();
        self.st.undo.schedules.push((key, old));
        Ok(existed)
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

    fn queue_names(&mut self, after: &str, limit: usize, out: &mut Vec<String>) -> Result<()> {
        let mut names: Vec<&Arc<str>> = self
            .st
            .queues
            .iter()
            .filter(|(name, q)| &***name > after && !q.ids.is_empty())
            .map(|(name, _)| name)
            .collect();
        names.sort_unstable();
        out.extend(names.into_iter().take(limit).map(|n| n.to_string()));
        Ok(())
    }

    fn page(
        &mut self,
        queue: &str,
        state: JobState,
        after: Option<JobCursor>,
        limit: usize,
        preview_bytes: usize,
    ) -> Result<Vec<JobPeek>> {
        let Some(q) = self.st.queues.get(queue) else {
            return Ok(Vec::new());
        };
        let ids = self.page_ids(q, state, after, limit);
        Ok(ids
            .iter()
            .filter_map(|id| self.st.jobs.get(id))
            .map(|job| JobPeek::of(job, preview_bytes))
            .collect())
    }

    fn counts_capped(&mut self, queue: &str, cap: u64) -> Result<StateCounts> {
        let mut counts = self.counts(queue)?;
        for n in &mut counts.0 {
            *n = (*n).min(cap);
        }
        Ok(counts)
    }

    fn finished_histogram(
        &mut self,
        queue: &str,
        from_ms: u64,
        bucket_ms: u64,
        out: &mut [StateCounts],
    ) -> Result<()> {
        let Some(q) = self.st.queues.get(queue) else {
            return Ok(());
        };
        let to_ms = from_ms.saturating_add(bucket_ms.saturating_mul(out.len() as u64));
        for &(at, id) in q.finished.range((from_ms, JobId(0))..(to_ms, JobId(0))) {
            let (Some(job), Ok(i)) = (
                self.st.jobs.get(&id),
                usize::try_from((at - from_ms) / bucket_ms.max(1)),
            ) else {
                continue;
            };
            if let Some(bucket) = out.get_mut(i) {
                bucket.add(job.state, 1);
            }
        }
        Ok(())
    }
}

impl MemTxn<'_> {
    /// A page of one state's jobs from the queue's index of that state
    /// (terminal states share one index, filtered by state).
    fn page_ids(
        &self,
        q: &QueueIndex,
        state: JobState,
        after: Option<JobCursor>,
        limit: usize,
    ) -> Vec<JobId> {
        use std::ops::Bound::{Excluded, Unbounded};
        let from = |c: Option<JobCursor>| c.map_or(Unbounded, |c| Excluded((c.at_ms, c.id)));
        match state {
            JobState::Ready => {
                let start = after.map_or(Unbounded, |c| {
                    Excluded((std::cmp::Reverse(c.priority), c.at_ms, c.id))
                });
                // Claimable and parked ready jobs, merged in claim order.
                let mut a = q.claimable.range((start, Unbounded)).peekable();
                let mut b = q.parked_ranks.range((start, Unbounded)).peekable();
                let mut out = Vec::new();
                while out.len() < limit {
                    let next = match (a.peek(), b.peek()) {
                        (Some(x), Some(y)) if y < x => b.next(),
                        (Some(_), _) => a.next(),
                        (None, _) => b.next(),
                    };
                    match next {
                        Some(r) => out.push(r.2),
                        None => break,
                    }
                }
                return out;
            }
            JobState::Scheduled => q.scheduled.range((from(after), Unbounded)),
            JobState::Running => q.running.range((from(after), Unbounded)),
            JobState::Done | JobState::Dead | JobState::Cancelled => {
                let jobs = &self.st.jobs;
                return q
                    .finished
                    .range((Unbounded, from(after)))
                    .rev()
                    .map(|&(_, id)| id)
                    .filter(|id| jobs.get(id).is_some_and(|j| j.state == state))
                    .take(limit)
                    .collect();
            }
        }
        .take(limit)
        .map(|&(_, id)| id)
        .collect()
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
            journal: Journal::default(),
        };
        let result = f(&mut tx);
        let woke = tx.journal.woke();
        if result.is_err() {
            st.rollback();
        } else {
            st.commit();
            if woke != [false; 2] {
                for (epoch, woke) in st.epochs.iter_mut().zip(woke) {
                    *epoch = epoch.wrapping_add(u64::from(woke));
                }
                if st.waiters > 0 {
                    self.changed.notify_all();
                }
            }
        }
        result
    }

    fn describe(&self) -> String {
        "mem".to_owned()
    }

    fn epoch(&self, wake: Wake) -> u64 {
        lock(&self.state).epochs[wake.index()]
    }

    fn wait_epoch(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        let mut st = lock(&self.state);
        if st.epochs[wake.index()] != epoch {
            return true;
        }
        st.waiters += 1;
        let (mut st, _) = match self.changed.wait_timeout(st, timeout) {
            Ok(pair) => pair,
            Err(poisoned) => poisoned.into_inner(),
        };
        st.waiters -= 1;
        st.epochs[wake.index()] != epoch
    }
}
