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
    JobCursor, JobId, JobRecord, JobState, JobTxn, Journal, LeaseRecord, QueueConfig, RateLog,
    ScheduleRecord, Txn,
};
use crate::error::Result;
use crate::store::{Store, Wake};
use crate::sync::{lock, Condvar, Mutex};
use hashbrown::hash_table::Entry;
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

mod index;
mod jobs;
use index::QueueIndex;

/// What a transaction changed, to put back if it fails. Leases, jobs and
/// the id counter are disjoint, so each log is replayed backwards on its own.
#[derive(Debug, Default)]
struct UndoLog {
    leases: Vec<LeaseUndo>,
    jobs: Vec<(JobId, Option<JobRecord>)>,
    last_job_id: Option<u64>,
    schedules: Vec<(ScheduleKey, Option<ScheduleRecord>)>,
    configs: Vec<(Arc<str>, Option<QueueConfig>)>,
    rates: Vec<(ScheduleKey, Option<RateLog>)>,
    deps: Vec<(JobId, Option<Vec<JobId>>)>,
}

/// A lease record's first old value (`None`: the transaction made it),
/// and where it is: its key's hash and the address of the key's text. A
/// record is never removed but by a rollback, newest first, so while its
/// transaction lasts the address names it alone, and the log holds no
/// count on the key (two atomic operations a transaction fewer).
#[derive(Debug)]
struct LeaseUndo {
    hash: u64,
    key_at: usize,
    old: Option<LeaseRecord>,
}

/// Where a lease key's text is: its identity in [`LeaseUndo`].
fn key_at(key: &Arc<str>) -> usize {
    Arc::as_ptr(key).cast::<u8>() as usize
}

/// A schedule's queue and name (or a rate bucket's queue and key).
type ScheduleKey = (Arc<str>, Arc<str>);

#[derive(Debug, Default)]
struct MemState {
    last_now_ms: u64,
    /// Every token granted is above it ([`Txn::token_floor`]).
    token_floor: u64,
    /// The lease records with their keys, hashed by `lease_hasher`.
    leases: HashTable<(Arc<str>, LeaseRecord)>,
    lease_hasher: DefaultHashBuilder,
    jobs: HashMap<JobId, JobRecord>,
    queues: HashMap<Arc<str>, QueueIndex>,
    last_job_id: u64,
    /// Schedules by queue, then name.
    schedules: BTreeMap<ScheduleKey, ScheduleRecord>,
    /// Queues' settings, where set.
    configs: HashMap<Arc<str>, QueueConfig>,
    /// Rate buckets by queue, then key.
    rates: BTreeMap<ScheduleKey, RateLog>,
    /// The jobs waiting for each job (`deps`), in id order.
    deps: HashMap<JobId, Vec<JobId>>,
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
        while let Some(undo) = self.undo.leases.pop() {
            let found = self
                .leases
                .find_entry(undo.hash, |(k, _)| key_at(k) == undo.key_at);
            // Always found: see `LeaseUndo`.
            debug_assert!(found.is_ok(), "a lease record to restore is gone");
            if let Ok(entry) = found {
                match undo.old {
                    Some(rec) => entry.into_mut().1 = rec,
                    None => drop(entry.remove()),
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
        while let Some((parent, old)) = self.undo.deps.pop() {
            match old {
                Some(children) => self.deps.insert(parent, children),
                None => self.deps.remove(&parent),
            };
        }
    }

    /// Forget the undo log of a committed transaction, keeping the lease
    /// records' allocations for the next one.
    fn commit(&mut self) {
        const SPARE_MAX: usize = 64;
        for LeaseUndo { old, .. } in self.undo.leases.drain(..) {
            if let (Some(rec), true) = (old, self.spare.len() < SPARE_MAX) {
                self.spare.push(rec);
            }
        }
        self.undo.jobs.clear();
        self.undo.last_job_id = None;
        self.undo.schedules.clear();
        self.undo.configs.clear();
        self.undo.rates.clear();
        self.undo.deps.clear();
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

impl MemStore {
    /// A copy of the store as an asynchronous standby would hold it at
    /// this instant (its records, none of its waiters), for model tests
    /// of failover: what the copy grants after [`MemStore::promote`]
    /// must never repeat a token this store granted after the copy.
    #[doc(hidden)]
    pub fn standby_copy(&self) -> MemStore {
        let st = lock(&self.state);
        let copy = MemState {
            last_now_ms: st.last_now_ms,
            token_floor: st.token_floor,
            leases: st.leases.clone(),
            lease_hasher: st.lease_hasher,
            jobs: st.jobs.clone(),
            queues: st.queues.clone(),
            last_job_id: st.last_job_id,
            schedules: st.schedules.clone(),
            configs: st.configs.clone(),
            rates: st.rates.clone(),
            deps: st.deps.clone(),
            ..MemState::default()
        };
        MemStore {
            state: Mutex::new(copy),
            changed: Condvar::new(),
            clock: self.clock.clone(),
        }
    }

    /// This store becomes the primary after a failover whose replication
    /// may have lost grants: its token floor moves to the next generation
    /// ([`crate::core::lease::promoted_floor`]), as PostgreSQL's does on a
    /// new timeline.
    #[doc(hidden)]
    pub fn promote(&self) {
        let mut st = lock(&self.state);
        st.token_floor = crate::core::lease::promoted_floor(st.token_floor);
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

    fn token_floor(&self) -> u64 {
        self.st.token_floor
    }

    fn lease_mut(&mut self, key: &str, create: bool) -> Result<Option<&mut LeaseRecord>> {
        let st = &mut *self.st;
        let hasher = &st.lease_hasher;
        let hash = hasher.hash_one(key);
        // One hash lookup either way; the key is only allocated on insert.
        let entry = st
            .leases
            .entry(hash, |(k, _)| **k == *key, |(k, _)| hasher.hash_one(&**k));
        Ok(match entry {
            Entry::Occupied(entry) => {
                let (k, rec) = entry.into_mut();
                let mut old = st.spare.pop().unwrap_or_default();
                old.clone_from(rec);
                let key_at = key_at(k);
                st.undo.leases.push(LeaseUndo {
                    hash,
                    key_at,
                    old: Some(old),
                });
                Some(rec)
            }
            Entry::Vacant(entry) if create => {
                let k: Arc<str> = Arc::from(key);
                let key_at = key_at(&k);
                st.undo.leases.push(LeaseUndo {
                    hash,
                    key_at,
                    old: None,
                });
                Some(&mut entry.insert((k, LeaseRecord::default())).into_mut().1)
            }
            Entry::Vacant(_) => None,
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
        let mut page: Vec<&(Arc<str>, LeaseRecord)> = self
            .st
            .leases
            .iter()
            .filter(|(k, rec)| &**k > after && !rec.slots.is_empty())
            .collect();
        page.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        page.truncate(limit);
        out.extend(
            page.into_iter()
                .map(|(k, rec)| (k.to_string(), rec.clone())),
        );
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
            JobState::Waiting => q.waiting.range((from(after), Unbounded)),
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

    /// One short lock, no I/O: the async client runs it on its task.
    fn runs_inline(&self) -> bool {
        true
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

    /// Every transaction is this process's: all are announced.
    fn announces_changes(&self) -> bool {
        true
    }

    fn interrupt_waits(&self, _wake: Wake) {
        let st = lock(&self.state);
        if st.waiters > 0 {
            self.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{lease, Holder, HolderId};
    use crate::error::Error;
    use crate::store::StoreExt;

    /// A failed transaction puts every lease record back where it was
    /// taken from: with 3,000 keys some share their hash's tag, so a
    /// restore that matched on the hash alone would put one key's old
    /// record into another's place (`LeaseUndo`).
    #[test]
    fn a_rollback_restores_each_record_to_its_own_key() {
        let store = MemStore::new();
        let (one, two) = (Holder::new(HolderId(1)), Holder::new(HolderId(2)));
        let keys: Vec<String> = (0..3_000).map(|i| format!("key-{i}")).collect();
        let state = |store: &MemStore| -> Vec<String> {
            store
                .txn(|tx| {
                    keys.iter()
                        .map(|k| lease::inspect(tx, k).map(|i| format!("{k}: {:?}", i.holders)))
                        .collect()
                })
                .unwrap()
        };
        let tokens: Vec<u64> = store
            .txn(|tx| {
                // A TTL of its own for each: the records all differ.
                (0..)
                    .zip(&keys)
                    .map(|(i, k)| Ok(lease::acquire(tx, k, &one, 60_000 + 7 * i, 1)?.token))
                    .collect()
            })
            .unwrap();
        let before = state(&store);
        let failed: Result<()> = store.txn(|tx| {
            for (i, key) in keys.iter().enumerate().step_by(5) {
                lease::release(tx, key, one.id, tokens[i])?;
                lease::acquire(tx, key, &two, 1_000, 1)?;
            }
            Err(Error::transient("testing", "injected failure after writes"))
        });
        assert!(failed.is_err());
        assert_eq!(state(&store), before);
    }
}
