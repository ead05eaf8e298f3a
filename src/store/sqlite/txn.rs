//! The transaction: the store's side of the core's [`Txn`] and [`JobTxn`]
//! on the connection, the lease records it holds (their rows:
//! [`super::lease_rows`]) and its jobs (their rows: [`job_rows`]).

mod job_rows;

use super::cache::RowCache;
use super::conn::sql_err;
use super::hot::HotConn;
use super::listing;
use super::rows::SCAN_SQL;
use crate::core::{
    JobCursor, JobId, JobPeek, JobQuery, JobRecord, JobState, JobTxn, Journal, LeaseRecord,
    Pending, QueueConfig, RateLog, ScheduleRecord, StateCounts, StateSet, Txn,
};
use crate::error::Field;
use crate::error::Result;
use crate::hash::IdSet;
use crate::store::{i64_of, u64_of, LeaseCache};
use rusqlite::params;
use std::sync::Arc;

pub(super) struct SqlTxn<'c> {
    conn: &'c HotConn,
    /// The connection's copy of the running jobs it wrote last: a read of
    /// one of them is served from it, and every job write goes through it.
    rows: &'c mut RowCache,
    now_ms: u64,
    leases: LeaseCache,
    /// Jobs read in this transaction: writing one back updates only the
    /// columns that can change (never the payload).
    loaded: IdSet<JobId>,
    /// The wake-ups this member raised (delivered with its group) and
    /// its events.
    journal: Journal,
    /// The write-back statement, taken from the connection's cache once
    /// per transaction: a batch of writes skips the cache's lookup (a hash
    /// of the statement's text) and return for every job.
    update: Option<rusqlite::CachedStatement<'c>>,
    /// The same for the insert of a job (a batch of pushes).
    insert: Option<rusqlite::CachedStatement<'c>>,
    /// Job ids taken from the counter and not used yet: each take is
    /// twice the last (up to 1,024), so a push takes one id and a batch
    /// of n about log2(n) counter updates; what is left goes back at the
    /// end (`finish`).
    ids: std::ops::Range<u64>,
    /// How many ids the next take holds.
    id_block: u64,
}

impl<'c> SqlTxn<'c> {
    /// A transaction's reads and writes on `conn`, at store time `now_ms`.
    pub(super) fn new(conn: &'c HotConn, rows: &'c mut RowCache, now_ms: u64) -> Self {
        SqlTxn {
            conn,
            rows,
            now_ms,
            leases: LeaseCache::default(),
            loaded: IdSet::default(),
            journal: Journal::default(),
            update: None,
            insert: None,
            ids: 0..0,
            id_block: 1,
        }
    }

    /// Write back what changed; the wake-ups raised.
    pub(super) fn finish(self) -> Result<[bool; 2]> {
        super::lease_rows::write_back(self.conn, &self.leases)?;
        if !self.ids.is_empty() {
            // The ids taken and not used go back: only this transaction
            // moved the counter since it took them (the members of a group
            // run one at a time, and other connections wait for its
            // commit), so ids stay dense, as one take per job left them.
            listing::set_last_job_id(self.conn, self.ids.start - 1)?;
        }
        Ok(self.journal.woke())
    }
}

impl Txn for SqlTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn lease_mut(&mut self, key: &str, create: bool) -> Result<Option<&mut LeaseRecord>> {
        if !self.leases.contains(key) {
            let loaded = super::lease_rows::load(self.conn, key)?;
            if !self.leases.add(key, loaded, create) {
                return Ok(None);
            }
        }
        Ok(self.leases.get_mut(key))
    }

    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }

    fn jobs(&mut self) -> Result<&mut dyn JobTxn> {
        Ok(self)
    }

    fn lease_scan(
        &mut self,
        after: &str,
        limit: usize,
        out: &mut Vec<(String, LeaseRecord)>,
    ) -> Result<()> {
        for key in listing::lease_keys(self.conn, after, limit)? {
            // A record this transaction changed is shown as changed.
            let record = match self.leases.get_mut(&key) {
                Some(mine) => Some(mine.clone()),
                None => super::lease_rows::load(self.conn, &key)?,
            };
            if let Some(record) = record {
                out.push((key, record));
            }
        }
        Ok(())
    }

    fn export_names(
        &mut self,
        what: crate::core::Exported<'_>,
        after: &str,
        limit: usize,
        out: &mut Vec<String>,
    ) -> Result<()> {
        listing::export_names(self.conn, what, after, limit, out)
    }
}

impl JobTxn for SqlTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }

    fn pending(&mut self, queue: &str, now_ms: u64, chunk: usize, ready: usize) -> Result<Pending> {
        Ok(Pending {
            expired: self.read_jobs(SCAN_SQL[0], (queue, &[]), chunk, now_ms)?,
            due: self.read_jobs(SCAN_SQL[1], (queue, &[]), chunk, now_ms)?,
            ready: self.read_jobs(SCAN_SQL[2], (queue, &[]), ready, u64::MAX)?,
            config: match ready {
                0 => QueueConfig::default(),
                _ => super::schedules::config(self.conn, queue)?,
            },
        })
    }

    fn next_job_id(&mut self) -> Result<JobId> {
        if let Some(id) = self.ids.next() {
            return Ok(JobId(id));
        }
        let block = self.id_block;
        let last = listing::take_job_ids(self.conn, block)?;
        self.ids = last + 1 - block..last + 1;
        self.id_block = (block * 2).min(1024);
        Ok(JobId(self.ids.next().unwrap_or(last)))
    }

    fn reserve_job_ids(&mut self, last: JobId) -> Result<()> {
        // Ids taken before may be at or below `last`: never hand them out.
        self.ids.start = self.ids.start.max(last.0.saturating_add(1));
        listing::reserve_job_ids(self.conn, last.0)
    }

    fn job(&mut self, id: JobId) -> Result<Option<JobRecord>> {
        let job = match self.rows.take(id) {
            Some(job) => Some(job),
            None => self.read_job(id)?,
        };
        if job.is_some() {
            self.remember(id);
        }
        Ok(job)
    }

    /// The connection's copy where it has the job, else one statement per
    /// chunk of the other ids ([`BY_ID_WIDTHS`]).
    fn jobs_by_id(&mut self, ids: &[JobId]) -> Result<Vec<JobRecord>> {
        let missing: Vec<JobId> = ids
            .iter()
            .copied()
            .filter(|&id| !self.rows.has(id))
            .collect();
        let mut found = self.read_by_id(&missing)?;
        let mut jobs: Vec<JobRecord> = Vec::with_capacity(ids.len());
        for &id in ids {
            // An id asked for twice is served from its first answer.
            let job = found
                .remove(&id)
                .or_else(|| self.rows.take(id))
                .or_else(|| jobs.iter().find(|j| j.id == id).cloned());
            jobs.extend(job);
        }
        jobs.iter().for_each(|job| self.remember(job.id));
        Ok(jobs)
    }
    fn put_job(&mut self, job: &JobRecord) -> Result<()> {
        if self.loaded.contains(&job.id) {
            return self.update_job(job);
        }
        self.insert_job(job)
    }

    fn link(&mut self, parent: JobId, child: JobId) -> Result<()> {
        let (p, c) = (i64_of(Field::Id, parent.0)?, i64_of(Field::Id, child.0)?);
        self.conn
            .prepare_cached("INSERT OR IGNORE INTO job_deps (parent, child) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute(params![p, c]))
            .map(drop)
            .map_err(|e| sql_err(|| format!("linking job {child} to job {parent}"), e))
    }

    fn children(&mut self, parent: JobId, out: &mut Vec<JobId>) -> Result<()> {
        let p = i64_of(Field::Id, parent.0)?;
        let fail = |e| sql_err(|| format!("reading the jobs waiting for job {parent}"), e);
        let mut stmt = self
            .conn
            .prepare_cached("SELECT child FROM job_deps WHERE parent = ?1 ORDER BY child")
            .map_err(fail)?;
        let rows = stmt.query_map([p], |r| r.get::<_, i64>(0)).map_err(fail)?;
        for row in rows {
            out.push(JobId(u64_of(row.map_err(fail)?)));
        }
        Ok(())
    }

    fn unlink(&mut self, parent: JobId) -> Result<()> {
        let p = i64_of(Field::Id, parent.0)?;
        self.conn
            .prepare_cached("DELETE FROM job_deps WHERE parent = ?1")
            .and_then(|mut s| s.execute([p]))
            .map(drop)
            .map_err(|e| sql_err(|| format!("unlinking the jobs waiting for job {parent}"), e))
    }

    fn delete_job(&mut self, id: JobId) -> Result<()> {
        let key = i64_of(Field::Id, id.0)?;
        self.rows.forget(id);
        self.conn
            .prepare_cached("DELETE FROM jobs WHERE id = ?1")
            .and_then(|mut s| s.execute([key]))
            .map(|_| ())
            .map_err(|e| sql_err(|| format!("deleting job {id}"), e))
    }

    fn unique_jobs(
        &mut self,
        queue: &str,
        unique_key: &str,
        states: StateSet,
        since_ms: u64,
        limit: usize,
    ) -> Result<Vec<JobId>> {
        // Live states alone and no period: the live jobs' index.
        let sql = if states.is_live() && since_ms == 0 {
            "SELECT id FROM jobs INDEXED BY jobs_unique
             WHERE queue = ?1 AND unique_key = ?2 AND (state <= 2 OR state = 6) AND unique_key IS NOT NULL
               AND ((1 << state) & ?3) != 0 AND created_at >= ?4 ORDER BY id DESC LIMIT ?5"
        } else {
            "SELECT id FROM jobs INDEXED BY jobs_unique_all
             WHERE queue = ?1 AND unique_key = ?2 AND unique_key IS NOT NULL
               AND created_at >= ?4 AND ((1 << state) & ?3) != 0
             ORDER BY created_at DESC, id DESC LIMIT ?5"
        };
        let fail = |e| {
            sql_err(
                || format!("looking up unique key {unique_key:?} in queue {queue:?}"),
                e,
            )
        };
        let since = i64::try_from(since_ms).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stmt = self.conn.prepare_cached(sql).map_err(fail)?;
        let rows = stmt
            .query_map(
                params![queue, unique_key, states.bits(), since, limit],
                |r| r.get::<_, i64>(0),
            )
            .map_err(fail)?;
        let mut out = Vec::new();
        for id in rows {
            out.push(JobId(u64_of(id.map_err(fail)?)));
        }
        Ok(out)
    }

    fn scan(
        &mut self,
        queue: &str,
        query: JobQuery,
        limit: usize,
        out: &mut Vec<JobId>,
    ) -> Result<()> {
        let (sql, bound) = match query {
            JobQuery::FinishedBy { cutoff_ms } => (SCAN_SQL[3], cutoff_ms),
            JobQuery::Retrying => (SCAN_SQL[4], u64::MAX),
        };
        self.scan_rows(sql, (queue, &[]), limit, bound, |r| {
            out.push(JobId(u64_of(r.get(1)?)));
            Ok(())
        })
    }

    fn schedules(&mut self, queue: &str) -> Result<Vec<ScheduleRecord>> {
        super::schedules::read(self.conn, queue)
    }

    fn queue_config(&mut self, queue: &str) -> Result<QueueConfig> {
        super::schedules::config(self.conn, queue)
    }

    fn put_queue_config(&mut self, queue: &str, config: &QueueConfig) -> Result<()> {
        super::schedules::put_config(self.conn, queue, config)
    }

    fn rate_log(&mut self, queue: &str, key: &str) -> Result<RateLog> {
        super::schedules::rate_log(self.conn, queue, key)
    }

    fn put_rate_log(&mut self, queue: &str, key: &str, log: &RateLog) -> Result<()> {
        super::schedules::put_rate_log(self.conn, queue, key, log)
    }

    fn forget_idle_rates(&mut self, queue: &str, before_ms: u64, limit: usize) -> Result<usize> {
        super::schedules::forget_idle_rates(self.conn, queue, before_ms, limit)
    }

    fn rate_wakes(
        &mut self,
        queue: &str,
        until_ms: u64,
        limit: usize,
    ) -> Result<Vec<(Arc<str>, u64)>> {
        super::schedules::rate_wakes(self.conn, queue, until_ms, limit)
    }

    fn running_count(&mut self, queue: &str, key: Option<&str>) -> Result<u64> {
        self.conn
            .prepare_cached(
                "SELECT count(*) FROM jobs INDEXED BY jobs_bands
                 WHERE queue = ?1 AND band = 2 AND (?2 IS NULL OR conc_key = ?2)",
            )
            .and_then(|mut s| s.query_row(params![queue, key], |r| r.get::<_, i64>(0)))
            .map(u64_of)
            .map_err(|e| {
                sql_err(
                    || format!("counting the running jobs of queue {queue:?}"),
                    e,
                )
            })
    }

    fn parked(&mut self, queue: &str, key: Option<&str>, limit: usize) -> Result<Vec<JobRecord>> {
        match key {
            Some(key) => self.read_jobs(SCAN_SQL[5], (queue, &[&key]), limit, u64::MAX),
            None => self.read_jobs(SCAN_SQL[6], (queue, &[]), limit, u64::MAX),
        }
    }

    fn put_schedule(&mut self, schedule: &ScheduleRecord) -> Result<()> {
        super::schedules::write(self.conn, schedule)
    }

    fn delete_schedule(&mut self, queue: &str, name: &str) -> Result<bool> {
        super::schedules::delete(self.conn, queue, name)
    }

    fn counts(&mut self, queue: &str) -> Result<StateCounts> {
        listing::counts(self.conn, queue)
    }

    fn list(
        &mut self,
        queue: &str,
        state: Option<JobState>,
        after: JobId,
        limit: usize,
    ) -> Result<Vec<JobRecord>> {
        listing::list(self.conn, queue, state, after, limit)
    }

    fn queue_names(&mut self, after: &str, limit: usize, out: &mut Vec<String>) -> Result<()> {
        listing::queue_names(self.conn, after, limit, out)
    }

    fn page(
        &mut self,
        queue: &str,
        state: JobState,
        after: Option<JobCursor>,
        limit: usize,
        preview_bytes: usize,
    ) -> Result<Vec<JobPeek>> {
        listing::page(self.conn, queue, state, after, limit, preview_bytes)
    }

    fn counts_capped(&mut self, queue: &str, cap: u64) -> Result<StateCounts> {
        listing::counts_capped(self.conn, queue, cap)
    }

    fn finished_histogram(
        &mut self,
        queue: &str,
        from_ms: u64,
        bucket_ms: u64,
        out: &mut [StateCounts],
    ) -> Result<()> {
        listing::finished_histogram(self.conn, queue, from_ms, bucket_ms, out)
    }
}
