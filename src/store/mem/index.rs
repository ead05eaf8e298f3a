//! The in-memory store's per-queue indexes: one ordered set per state's
//! listing order (ready in claim order: the claimable ones and the parked
//! ones apart, merged by listings; scheduled by due time, running by lease
//! expiry, finished by finish time), the parked ones by concurrency key
//! too, the live
//! unique keys, the ids and the counts, kept in step with every write of a
//! job.

use crate::core::{ClaimRank, JobId, JobRecord, JobState, StateCounts};
use hashbrown::HashMap;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Per-queue indexes, kept in step with every `put_job`/`delete_job`.
#[derive(Debug, Default, Clone)]
pub(super) struct QueueIndex {
    /// Ready jobs not parked, in claim order (what a claim reads).
    pub(super) claimable: BTreeSet<ClaimRank>,
    /// Parked ready jobs by concurrency key, then claim order.
    pub(super) parked: BTreeSet<(Arc<str>, ClaimRank)>,
    /// Parked ready jobs in claim order (listings merge them with the
    /// claimable ones). Only parked jobs pay for the two sets.
    pub(super) parked_ranks: BTreeSet<ClaimRank>,
    pub(super) scheduled: BTreeSet<(u64, JobId)>,
    pub(super) running: BTreeSet<(u64, JobId)>,
    pub(super) finished: BTreeSet<(u64, JobId)>,
    /// Waiting jobs (`deps`), listed by id (at 0: their cursor's instant).
    pub(super) waiting: BTreeSet<(u64, JobId)>,
    pub(super) unique: HashMap<Arc<str>, BTreeSet<JobId>>,
    pub(super) ids: BTreeSet<JobId>,
    pub(super) counts: StateCounts,
}

impl QueueIndex {
    pub(super) fn insert(&mut self, job: &JobRecord) {
        let id = job.id;
        match job.state {
            JobState::Ready => {
                match (&job.key, job.parked) {
                    (Some(key), true) => {
                        self.parked.insert((key.clone(), job.rank()));
                        self.parked_ranks.insert(job.rank())
                    }
                    _ => self.claimable.insert(job.rank()),
                };
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
            JobState::Waiting => {
                self.waiting.insert((0, id));
            }
        }
        if let Some(key) = &job.unique_key {
            self.unique.entry(key.clone()).or_default().insert(id);
        }
        self.ids.insert(id);
        self.counts.add(job.state, 1);
    }

    pub(super) fn remove(&mut self, job: &JobRecord) {
        let id = job.id;
        match job.state {
            JobState::Ready => {
                match (&job.key, job.parked) {
                    (Some(key), true) => {
                        self.parked.remove(&(key.clone(), job.rank()));
                        self.parked_ranks.remove(&job.rank())
                    }
                    _ => self.claimable.remove(&job.rank()),
                };
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
            JobState::Waiting => {
                self.waiting.remove(&(0, id));
            }
        }
        if let Some(key) = &job.unique_key {
            if let Some(ids) = self.unique.get_mut(key) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.unique.remove(key);
                }
            }
        }
        self.ids.remove(&id);
        self.counts.add(job.state, -1);
    }
}
