//! The job half of [`PgTxn`]: [`JobTxn`] over the transaction's locked
//! and cached job rows (read with the queue's settings where a claim needs
//! them), queue settings, rate buckets, schedules and listings.

use super::error::{pg_err, Stage};
use super::listing;
use super::rows::{job_from_row, queue_config, Cells};
use super::statements::{Lazy, Statements, JOB_COLUMN_COUNT, SKIPPED_COLUMN};
use super::txn::{CachedJob, PgTxn, MAX_ID_BLOCK};
use crate::core::{
    JobCursor, JobId, JobPeek, JobQuery, JobRecord, JobState, JobTxn, Journal, Pending,
    QueueConfig, RateLog, ScheduleRecord, StateCounts, StateSet,
};
use crate::error::{Error, Field, Result};
use crate::store::{i64_of, rate_columns, schedule_of_row, u64_of};
use postgres::types::ToSql;
use postgres::Row;
use std::sync::Arc;

impl JobTxn for PgTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }

    fn next_job_id(&mut self) -> Result<JobId> {
        if self.ids.is_empty() {
            let block = i64::from(self.id_block);
            let rows = self.query("allocating job ids", |st| &st.next_ids, &[&block])?;
            self.ids = rows.iter().map(|r| u64_of(r.get(0))).collect();
            self.ids.sort_unstable_by(|a, b| b.cmp(a));
            self.id_block = (self.id_block * 2).min(MAX_ID_BLOCK);
        }
        self.ids
            .pop()
            .map(JobId)
            .ok_or_else(|| Error::store("allocating job ids", "the sequence returned no value"))
    }

    fn token_floor(&self) -> u64 {
        self.token_floor
    }

    /// Claims run side by side, each skipping the rows others locked: a
    /// claim's read says whether it skipped any ([`SKIPPED_COLUMN`]).
    fn skipped_locked(&self) -> bool {
        self.skipped_locked
    }

    fn reserve_job_ids(&mut self, last: JobId) -> Result<()> {
        // Ids taken before may be at or below `last`: never hand them out.
        self.ids.retain(|&id| id > last.0);
        listing::reserve_job_ids(&mut self.conn.client, self.schema, last.0)
    }

    fn job(&mut self, id: JobId) -> Result<Option<JobRecord>> {
        if let Some(c) = self.jobs.get(&id) {
            return Ok(Some(c.record.clone()));
        }
        if self.deleted.contains(&id) {
            return Ok(None);
        }
        let rows = self.query(
            &format!("reading job {id}"),
            |st| &st.job_get,
            &[&i64_of(Field::Id, id.0)?],
        )?;
        let mut ids = Vec::new();
        self.absorb_with(&rows, &mut ids, true)?;
        Ok(self.jobs.get(&id).map(|c| c.record.clone()))
    }

    /// One round trip for every job not read yet (none if all were).
    fn jobs_by_id(&mut self, ids: &[JobId]) -> Result<Vec<JobRecord>> {
        let mut missing = Vec::new();
        for id in ids {
            if !self.jobs.contains_key(id) && !self.deleted.contains(id) {
                missing.push(i64_of(Field::Id, id.0)?);
            }
        }
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let read: fn(&Statements) -> &Lazy = match self.by_id {
                true => |st| &st.jobs_get_by_id,
                false => |st| &st.jobs_get,
            };
            let rows = self.query(
                &format!("reading {} jobs", missing.len()),
                read,
                &[&missing],
            )?;
            self.absorb_with(&rows, &mut Vec::new(), true)?;
        }
        Ok(ids
            .iter()
            .filter_map(|id| self.jobs.get(id).map(|c| c.record.clone()))
            .collect())
    }

    fn put_job(&mut self, job: &JobRecord) -> Result<()> {
        // A job deleted earlier in this transaction stays deleted: its new
        // record is inserted after the DELETE (deletes render first).
        let entry = self.jobs.entry(job.id).or_insert_with(|| CachedJob {
            record: job.clone(),
            in_db: false,
            db_state: None,
        });
        entry.record.clone_from(job);
        if !self.pending.contains(&job.id) {
            self.pending.push(job.id);
        }
        Ok(())
    }

    fn link(&mut self, parent: JobId, child: JobId) -> Result<()> {
        let (p, c) = (i64_of(Field::Id, parent.0)?, i64_of(Field::Id, child.0)?);
        let what = format!("linking job {child} to job {parent}");
        self.query(&what, |st| &st.link, &[&p, &c]).map(drop)
    }

    fn children(&mut self, parent: JobId, out: &mut Vec<JobId>) -> Result<()> {
        let p = i64_of(Field::Id, parent.0)?;
        let what = format!("reading the jobs waiting for job {parent}");
        let rows = self.query(&what, |st| &st.children, &[&p])?;
        out.extend(rows.iter().map(|r| JobId(u64_of(r.get(0)))));
        Ok(())
    }

    fn unlink(&mut self, parent: JobId) -> Result<()> {
        let p = i64_of(Field::Id, parent.0)?;
        let what = format!("unlinking the jobs waiting for job {parent}");
        self.query(&what, |st| &st.unlink, &[&p]).map(drop)
    }

    fn delete_job(&mut self, id: JobId) -> Result<()> {
        self.pending.retain(|&p| p != id);
        match self.jobs.remove(&id) {
            Some(c) if !c.in_db => {}
            _ => self.deleted.push(id),
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
        self.flush_jobs()?;
        let what = format!("looking up unique key {unique_key:?} in queue {queue:?}");
        let bits = i32::from(states.bits());
        let n = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = if states.is_live() && since_ms == 0 {
            let args: [&(dyn ToSql + Sync); 4] = [&queue, &unique_key, &bits, &n];
            self.query(&what, |st| &st.unique_live, &args)?
        } else {
            let since = i64::try_from(since_ms).unwrap_or(i64::MAX);
            let args: [&(dyn ToSql + Sync); 5] = [&queue, &unique_key, &since, &bits, &n];
            self.query(&what, |st| &st.unique_since, &args)?
        };
        Ok(rows.iter().map(|r| JobId(u64_of(r.get(0)))).collect())
    }

    /// A key this transaction locked already is held until it ends: no
    /// round trip.
    fn lock_unique(&mut self, queue: &str, unique_key: &str) -> Result<()> {
        let held = (queue.to_owned(), unique_key.to_owned());
        if self.unique_locked.contains(&held) {
            return Ok(());
        }
        let what = format!("locking unique key {unique_key:?} of queue {queue:?}");
        self.query(&what, |st| &st.lock_unique, &[&queue, &unique_key])?;
        self.unique_locked.insert(held);
        Ok(())
    }

    /// One round trip: the expired, due and (when asked) ready scans of
    /// the queue together, each locking its rows `FOR UPDATE SKIP LOCKED`.
    /// A claim's scans sent with BEGIN serve its first call if they ran at
    /// this time, with these limits, before this transaction read or
    /// wrote anything else.
    fn pending(&mut self, queue: &str, now_ms: u64, chunk: usize, ready: usize) -> Result<Pending> {
        let what = format!("reading queue {queue:?}");
        if let Some(early) = self.early_claim.take() {
            let untouched = self.jobs.is_empty() && self.deleted.is_empty();
            if untouched && early.serves(queue, now_ms, chunk, ready) {
                self.early_used = true;
                return self.read_pending(&early.rows, &what, queue, ready);
            }
        }
        self.flush_jobs()?;
        let at = i64_of(Field::Now, now_ms)?;
        let n = i64::try_from(chunk).unwrap_or(i64::MAX);
        let rows = if ready > 0 {
            let max = i64::try_from(ready).unwrap_or(i64::MAX);
            self.query(
                &what,
                |st| &st.scan_maintenance_ready,
                &[&queue, &at, &n, &max],
            )?
        } else {
            self.query(&what, |st| &st.scan_maintenance, &[&queue, &at, &n])?
        };
        self.read_pending(&rows, &what, queue, ready)
    }

    fn scan(
        &mut self,
        queue: &str,
        query: JobQuery,
        limit: usize,
        out: &mut Vec<JobId>,
    ) -> Result<()> {
        self.flush_jobs()?;
        let what = format!("scanning queue {queue:?}");
        let n = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match query {
            JobQuery::FinishedBy { cutoff_ms } => {
                let at = i64_of(Field::Cutoff, cutoff_ms)?;
                self.query(&what, |st| &st.scan_finished, &[&queue, &at, &n])?
            }
            JobQuery::Retrying => self.query(&what, |st| &st.scan_retrying, &[&queue, &n])?,
        };
        out.extend(rows.iter().map(|r| JobId(u64_of(r.get(0)))));
        Ok(())
    }

    fn schedules(&mut self, queue: &str) -> Result<Vec<ScheduleRecord>> {
        let what = format!("reading the schedules of queue {queue:?}");
        let rows = self.query(&what, |st| &st.schedules_get, &[&queue])?;
        let decode = |r: &Row| -> std::result::Result<_, postgres::Error> {
            Ok((
                r.try_get::<_, String>(1)?,
                r.try_get::<_, String>(2)?,
                r.try_get::<_, Vec<u8>>(3)?,
                r.try_get::<_, i32>(4)?,
                r.try_get::<_, i64>(5)?,
                r.try_get::<_, String>(6)?,
                r.try_get::<_, i64>(7)?,
            ))
        };
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let (name, rule, payload, priority, attempts, missed, next) =
                decode(r).map_err(|e| pg_err(what.clone(), e, Stage::Work))?;
            out.push(schedule_of_row(
                queue,
                &name,
                &rule,
                payload,
                i64::from(priority),
                attempts,
                &missed,
                next,
            )?);
        }
        Ok(out)
    }

    fn queue_config(&mut self, queue: &str) -> Result<QueueConfig> {
        if let Some(config) = self.configs.get(queue) {
            return Ok(config.clone());
        }
        let what = format!("reading the settings of queue {queue:?}");
        let rows = self.query(&what, |st| &st.queue_get, &[&queue])?;
        let config = match rows.first() {
            Some(row) => queue_config(row, 0)?,
            None => QueueConfig::default(),
        };
        self.configs.insert(Arc::from(queue), config.clone());
        Ok(config)
    }

    fn put_queue_config(&mut self, queue: &str, config: &QueueConfig) -> Result<()> {
        let what = format!("writing the settings of queue {queue:?}");
        let limit = |n: Option<u32>| n.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
        let (concurrency, per_key) = (
            limit(config.limits.concurrency),
            limit(config.limits.per_key),
        );
        let (rate_count, rate_ms) = rate_columns(config.limits.rate);
        let (key_rate_count, key_rate_ms) = rate_columns(config.limits.per_key_rate);
        let count = |n: Option<i64>| n.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
        let (rate_count, key_rate_count) = (count(rate_count), count(key_rate_count));
        self.query(
            &what,
            |st| &st.queue_put,
            &[
                &queue,
                &config.paused,
                &concurrency,
                &per_key,
                &rate_count,
                &rate_ms,
                &key_rate_count,
                &key_rate_ms,
            ],
        )?;
        self.configs.insert(Arc::from(queue), config.clone());
        Ok(())
    }

    fn running_count(&mut self, queue: &str, key: Option<&str>) -> Result<u64> {
        self.flush_jobs()?;
        let what = format!("counting the running jobs of queue {queue:?}");
        let rows = self.query(&what, |st| &st.running_count, &[&queue, &key])?;
        Ok(rows.first().map_or(0, |r| u64_of(r.get(0))))
    }

    fn parked(&mut self, queue: &str, key: Option<&str>, limit: usize) -> Result<Vec<JobRecord>> {
        self.flush_jobs()?;
        let what = format!("reading the parked jobs of queue {queue:?}");
        let n = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match key {
            Some(key) => self.query(&what, |st| &st.parked_key, &[&queue, &key, &n])?,
            None => self.query(&what, |st| &st.parked_any, &[&queue, &n])?,
        };
        let mut ids = Vec::new();
        self.absorb(&rows, &mut ids)?;
        Ok(ids
            .iter()
            .filter_map(|id| self.jobs.get(id).map(|c| c.record.clone()))
            .collect())
    }

    fn rate_log(&mut self, queue: &str, key: &str) -> Result<RateLog> {
        let what = format!("reading a rate of queue {queue:?}");
        let rows = self.query(&what, |st| &st.rate_get, &[&queue, &key])?;
        Ok(rows.first().map_or_else(RateLog::default, |r| {
            let wake: Option<i64> = r.get(1);
            RateLog::decode_starts(r.get(0), wake.map(u64_of))
        }))
    }

    fn put_rate_log(&mut self, queue: &str, key: &str, log: &RateLog) -> Result<()> {
        let what = format!("writing a rate of queue {queue:?}");
        if log.is_empty() {
            self.query(&what, |st| &st.rate_delete, &[&queue, &key])?;
            return Ok(());
        }
        let wake = log
            .wake_at_ms
            .map(|w| i64_of(Field::RunAt, w))
            .transpose()?;
        let starts = log.encode_starts();
        let newest = i64_of(Field::RunAt, log.starts.last().copied().unwrap_or(0))?;
        let row: [&(dyn ToSql + Sync); 5] = [&queue, &key, &starts, &wake, &newest];
        self.query(&what, |st| &st.rate_put, &row)?;
        Ok(())
    }

    fn forget_idle_rates(&mut self, queue: &str, before_ms: u64, limit: usize) -> Result<usize> {
        let what = format!("forgetting idle rates of queue {queue:?}");
        let before = i64::try_from(before_ms).unwrap_or(i64::MAX);
        let n = i64::try_from(limit).unwrap_or(i64::MAX);
        let gone = self.execute(&what, |st| &st.rate_forget, &[&queue, &before, &n])?;
        Ok(usize::try_from(gone).unwrap_or(usize::MAX))
    }

    fn rate_wakes(
        &mut self,
        queue: &str,
        until_ms: u64,
        limit: usize,
    ) -> Result<Vec<(Arc<str>, u64)>> {
        let what = format!("reading the rate wake-ups of queue {queue:?}");
        let until = i64::try_from(until_ms).unwrap_or(i64::MAX);
        let n = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.query(&what, |st| &st.rate_wakes, &[&queue, &until, &n])?;
        Ok(rows
            .iter()
            .map(|r| (Arc::from(r.get::<_, &str>(0)), u64_of(r.get(1))))
            .collect())
    }

    fn lock_queue(&mut self, queue: &str, exclusive: bool) -> Result<()> {
        let what = format!("locking the settings of queue {queue:?}");
        if exclusive {
            self.query(&what, |st| &st.lock_queue, &[&queue])?;
        } else {
            self.query(&what, |st| &st.lock_queue_shared, &[&queue])?;
        }
        Ok(())
    }

    fn put_schedule(&mut self, s: &ScheduleRecord) -> Result<()> {
        let what = format!("writing schedule {:?} of queue {:?}", s.name, s.queue);
        let params: [&(dyn ToSql + Sync); 8] = [
            &&*s.queue,
            &&*s.name,
            &s.rule.encode(),
            &&*s.payload,
            &s.priority,
            &i64::from(s.max_attempts),
            &s.missed.as_str(),
            &i64_of(Field::NextAt, s.next_ms)?,
        ];
        self.query(&what, |st| &st.schedule_put, &params).map(drop)
    }

    fn delete_schedule(&mut self, queue: &str, name: &str) -> Result<bool> {
        let what = format!("deleting schedule {name:?} of queue {queue:?}");
        self.execute(&what, |st| &st.schedule_delete, &[&queue, &name])
            .map(|n| n > 0)
    }

    fn counts(&mut self, queue: &str) -> Result<StateCounts> {
        self.flush_jobs()?;
        let rows = self.query(
            &format!("counting queue {queue:?}"),
            |st| &st.counts,
            &[&queue],
        )?;
        let mut counts = StateCounts::default();
        if let Some(row) = rows.first() {
            for (i, state) in JobState::ALL.into_iter().enumerate() {
                counts.add(state, row.get::<_, i64>(i));
            }
        }
        Ok(counts)
    }

    fn list(
        &mut self,
        queue: &str,
        state: Option<JobState>,
        after: JobId,
        limit: usize,
    ) -> Result<Vec<JobRecord>> {
        self.flush_jobs()?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let after = i64_of(Field::After, after.0)?;
        let state = state.map_or(-1i16, |s| i16::from(s.code()));
        let rows = self.query(
            &format!("listing queue {queue:?}"),
            |st| &st.list,
            &[&queue, &after, &state, &limit],
        )?;
        rows.iter().map(job_from_row).collect()
    }

    fn queue_names(&mut self, after: &str, limit: usize, out: &mut Vec<String>) -> Result<()> {
        self.flush_jobs()?;
        listing::queue_names(&mut self.conn.client, self.schema, after, limit, out)
    }

    fn page(
        &mut self,
        queue: &str,
        state: JobState,
        after: Option<JobCursor>,
        limit: usize,
        preview_bytes: usize,
    ) -> Result<Vec<JobPeek>> {
        self.flush_jobs()?;
        let client = &mut self.conn.client;
        listing::page(
            client,
            self.schema,
            (queue, state),
            after,
            limit,
            preview_bytes,
        )
    }

    fn counts_capped(&mut self, queue: &str, cap: u64) -> Result<StateCounts> {
        self.flush_jobs()?;
        listing::counts_capped(&mut self.conn.client, self.schema, queue, cap)
    }

    fn finished_histogram(
        &mut self,
        queue: &str,
        from_ms: u64,
        bucket_ms: u64,
        out: &mut [StateCounts],
    ) -> Result<()> {
        self.flush_jobs()?;
        let window = (from_ms, bucket_ms);
        listing::finished_histogram(&mut self.conn.client, self.schema, queue, window, out)
    }
}

impl PgTxn<'_> {
    /// A claim's or maintenance's rows ([`JobTxn::pending`]), binary or
    /// text: cached and locked, sorted by what they were read as.
    fn read_pending(
        &mut self,
        rows: &[impl Cells],
        what: &str,
        queue: &str,
        ready: usize,
    ) -> Result<Pending> {
        let mut read = Pending::default();
        let mut jobs = rows;
        if let (true, Some(row)) = (ready > 0, rows.first()) {
            // One row at least, the settings in the last columns of each;
            // a lone row without a job id says no job was read.
            let config = queue_config(row, JOB_COLUMN_COUNT)?;
            let id = row.int(0).map_err(|e| Error::store(what.to_owned(), e))?;
            let skipped = row.flag(SKIPPED_COLUMN);
            self.skipped_locked |=
                skipped.map_err(|e| Error::store(what.to_owned(), e))? == Some(true);
            self.configs.insert(Arc::from(queue), config.clone());
            read.config = config;
            if id.is_none() {
                jobs = &[];
            }
        }
        let mut ids = Vec::new();
        self.absorb(jobs, &mut ids)?;
        for id in ids {
            let job = self.jobs[&id].record.clone();
            match job.state {
                JobState::Running => read.expired.push(job),
                JobState::Scheduled => read.due.push(job),
                _ => read.ready.push(job),
            }
        }
        Ok(read)
    }
}
