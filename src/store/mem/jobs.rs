//! The job half of a [`MemTxn`]: [`JobTxn`] over the maps and each
//! queue's ordered indexes, writing in place with the undo log.

use super::{MemTxn, ScheduleKey};
use crate::core::{
    ClaimRank, JobCursor, JobId, JobPeek, JobQuery, JobRecord, JobState, JobTxn, Journal, Pending,
    QueueConfig, RateLog, ScheduleRecord, StateCounts, StateSet,
};
use crate::error::Result;
use std::collections::BTreeSet;
use std::sync::Arc;

impl JobTxn for MemTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn token_floor(&self) -> u64 {
        self.st.token_floor
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

    fn link(&mut self, parent: JobId, child: JobId) -> Result<()> {
        let old = self.st.deps.get(&parent).cloned();
        self.st.undo.deps.push((parent, old));
        let children = self.st.deps.entry(parent).or_default();
        if let Err(at) = children.binary_search(&child) {
            children.insert(at, child);
        }
        Ok(())
    }

    fn children(&mut self, parent: JobId, out: &mut Vec<JobId>) -> Result<()> {
        out.extend(self.st.deps.get(&parent).into_iter().flatten());
        Ok(())
    }

    fn unlink(&mut self, parent: JobId) -> Result<()> {
        let old = self.st.deps.remove(&parent);
        if old.is_some() {
            self.st.undo.deps.push((parent, old));
        }
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
