//! A transaction's job rows in `jobs`: the write-back of a job read in the
//! transaction (only the columns that can change), the insert of one that
//! was not, and the reads (one job, many by id in chunks of fixed widths,
//! and the scans of the pending and parked jobs). The statements a batch
//! runs for every job are taken from the connection's cache once per
//! transaction ([`held`]).

use super::SqlTxn;
use crate::core::{JobId, JobRecord};
use crate::error::{Field, Result};
use crate::hash::IdMap;
use crate::store::sqlite::conn::sql_err;
use crate::store::sqlite::rows::{
    job_from_row, job_from_row_at, sql_quote, JobRow, BY_ID_SQL, BY_ID_WIDTHS, JOB_COLUMNS,
};
use crate::store::u64_of;
use crate::store::{after_text, i64_of};
use rusqlite::{params, Connection, OptionalExtension, Row};

/// [`SqlTxn::update_job`]'s statement.
const UPDATE_JOB_SQL: &str =
    "UPDATE jobs SET priority = ?2, run_at = ?3, max_attempts = ?4, attempts = ?5,
   expiries = ?6, last_token = ?7, state = ?8, claim_holder = ?9,
   claim_token = ?10, lease_until = ?11, cancel_requested = ?12,
   last_error = ?13, finished_at = ?14, result = ?15, parked = ?16,
   claim_deadline = ?17, progress = ?18, progress_msg = ?19,
   waiting_on = ?20, has_children = ?21
 WHERE id = ?1";

/// [`JobTxn::put_job`](crate::core::JobTxn::put_job)'s statement for a job not read in this transaction
/// (a new one, or an upsert of a whole record).
fn insert_job_sql() -> String {
    format!(
        "INSERT INTO jobs ({JOB_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29)
             ON CONFLICT(id) DO UPDATE SET
               queue = excluded.queue, payload = excluded.payload, priority = excluded.priority,
               run_at = excluded.run_at, created_at = excluded.created_at,
               max_attempts = excluded.max_attempts, attempts = excluded.attempts,
               expiries = excluded.expiries, last_token = excluded.last_token, state = excluded.state,
               claim_holder = excluded.claim_holder, claim_token = excluded.claim_token,
               lease_until = excluded.lease_until, cancel_requested = excluded.cancel_requested,
               last_error = excluded.last_error, unique_key = excluded.unique_key,
               finished_at = excluded.finished_at, result = excluded.result,
               conc_key = excluded.conc_key, parked = excluded.parked,
               timeout_ms = excluded.timeout_ms, claim_deadline = excluded.claim_deadline,
               progress = excluded.progress, progress_msg = excluded.progress_msg,
               after_ids = excluded.after_ids, after_any = excluded.after_any,
               waiting_on = excluded.waiting_on, has_children = excluded.has_children"
    )
}

/// The statement `slot` holds for the transaction, taken from `conn`'s
/// cache (the text from `sql`) on first use.
fn held<'s, 'c>(
    slot: &'s mut Option<rusqlite::CachedStatement<'c>>,
    conn: &'c Connection,
    sql: impl FnOnce() -> String,
) -> rusqlite::Result<&'s mut rusqlite::CachedStatement<'c>> {
    match slot {
        Some(stmt) => Ok(stmt),
        None => Ok(slot.insert(conn.prepare_cached(&sql())?)),
    }
}

impl SqlTxn<'_> {
    /// Write back a job read in this transaction: only what can change.
    pub(super) fn update_job(&mut self, job: &JobRecord) -> Result<()> {
        let JobRow {
            id,
            run_at,
            last_token,
            holder,
            token,
            until,
            finished,
            deadline,
            ..
        } = JobRow::of(job)?;
        let fail = |e| sql_err(|| format!("writing job {}", job.id), e);
        let stmt = held(&mut self.update, self.conn, || UPDATE_JOB_SQL.into()).map_err(fail)?;
        stmt.execute(params![
            id,
            job.priority,
            run_at,
            job.max_attempts,
            job.attempts,
            job.expiries,
            last_token,
            i64::from(job.state.code()),
            holder,
            token,
            until,
            i64::from(job.cancel_requested),
            job.last_error.as_deref(),
            finished,
            job.result.as_deref(),
            job.parked,
            deadline,
            job.progress.as_ref().map(|p| p.permyriad),
            job.progress.as_ref().map(|p| &*p.message),
            job.waiting_on,
            job.has_children,
        ])
        .map_err(fail)?;
        // It was read in this transaction: the columns not written are
        // the ones read, so `job` is the row as it now stands.
        self.rows.wrote(job);
        Ok(())
    }

    /// Write a job not read in this transaction: every column (an insert,
    /// or an upsert of the whole record).
    pub(super) fn insert_job(&mut self, job: &JobRecord) -> Result<()> {
        let fail = |e| sql_err(|| format!("writing job {}", job.id), e);
        let stmt = held(&mut self.insert, self.conn, insert_job_sql).map_err(fail)?;
        let JobRow {
            id,
            run_at,
            created,
            last_token,
            holder,
            token,
            until,
            finished,
            timeout,
            deadline,
        } = JobRow::of(job)?;
        stmt.execute(params![
            id,
            &*job.queue,
            &*job.payload,
            job.priority,
            run_at,
            created,
            job.max_attempts,
            job.attempts,
            job.expiries,
            last_token,
            i64::from(job.state.code()),
            holder,
            token,
            until,
            i64::from(job.cancel_requested),
            job.last_error.as_deref(),
            job.unique_key.as_deref(),
            finished,
            job.result.as_deref(),
            job.key.as_deref(),
            job.parked,
            timeout,
            deadline,
            job.progress.as_ref().map(|p| p.permyriad),
            job.progress.as_ref().map(|p| &*p.message),
            job.after.as_deref().map(after_text),
            job.after_any,
            job.waiting_on,
            job.has_children,
        ])
        .map_err(fail)?;
        // Every column was written from `job`.
        self.rows.wrote(job);
        Ok(())
    }
}

impl SqlTxn<'_> {
    /// Note `id` as read in this transaction (its write-back updates).
    pub(super) fn remember(&mut self, id: JobId) {
        self.loaded.insert(id);
    }

    /// Run one of [`SCAN_SQL`](crate::store::sqlite::rows::SCAN_SQL) with its literals, calling `row` for each
    /// row up to the first whose bound column is past `bound`.
    pub(super) fn scan_rows(
        &self,
        sql: &str,
        (queue, params): (&str, &[&dyn rusqlite::ToSql]),
        limit: usize,
        bound: u64,
        mut row: impl FnMut(&Row<'_>) -> rusqlite::Result<()>,
    ) -> Result<()> {
        if limit == 0 {
            return Ok(());
        }
        let fail = |e| sql_err(|| format!("scanning queue {queue:?}"), e);
        let sql = sql
            .replacen("{cols}", JOB_COLUMNS, 1)
            .replacen("{limit}", &limit.to_string(), 1)
            .replacen("{queue}", &sql_quote(queue), 1);
        let mut stmt = self.conn.prepare_cached(&sql).map_err(fail)?;
        let mut rows = stmt.query(params).map_err(fail)?;
        while let Some(r) = rows.next().map_err(fail)? {
            let at: Option<i64> = r.get(0).map_err(fail)?;
            if u64_of(at.unwrap_or(0)) > bound {
                break;
            }
            row(r).map_err(fail)?;
        }
        Ok(())
    }

    /// Up to `limit` whole jobs from one of the pending or parked reads
    /// (`queue` with the statement's parameters, if any).
    pub(super) fn read_jobs(
        &mut self,
        sql: &str,
        queue: (&str, &[&dyn rusqlite::ToSql]),
        limit: usize,
        bound: u64,
    ) -> Result<Vec<JobRecord>> {
        let mut jobs = Vec::new();
        self.scan_rows(sql, queue, limit, bound, |r| {
            jobs.push(job_from_row_at(r, 1)?);
            Ok(())
        })?;
        jobs.iter().for_each(|job| self.remember(job.id));
        Ok(jobs)
    }
}

impl SqlTxn<'_> {
    /// Job `id` from the database.
    pub(super) fn read_job(&self, id: JobId) -> Result<Option<JobRecord>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1");
        let key = i64_of(Field::Id, id.0)?;
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut s| s.query_row([key], job_from_row).optional())
            .map_err(|e| sql_err(|| format!("reading job {id}"), e))
    }

    /// Jobs `ids` from the database, by id: one statement per chunk
    /// ([`BY_ID_WIDTHS`]), or one per job for a few.
    pub(super) fn read_by_id(&self, ids: &[JobId]) -> Result<IdMap<JobId, JobRecord>> {
        let mut found = IdMap::with_capacity_and_hasher(ids.len(), Default::default());
        if ids.len() < BY_ID_WIDTHS[0] / 2 {
            for &id in ids {
                found.extend(self.read_job(id)?.map(|job| (id, job)));
            }
            return Ok(found);
        }
        let fail = |e| sql_err(|| format!("reading {} jobs", ids.len()), e);
        let widest = BY_ID_WIDTHS[BY_ID_WIDTHS.len() - 1];
        for chunk in ids.chunks(widest) {
            let shape = BY_ID_WIDTHS.iter().position(|&w| w >= chunk.len());
            let shape = shape.unwrap_or(BY_ID_WIDTHS.len() - 1);
            let sql = &BY_ID_SQL[shape];
            let mut stmt = self.conn.prepare_cached(sql).map_err(fail)?;
            for i in 0..BY_ID_WIDTHS[shape] {
                let key = chunk.get(i).map(|id| i64_of(Field::Id, id.0)).transpose()?;
                stmt.raw_bind_parameter(i + 1, key).map_err(fail)?;
            }
            let mut rows = stmt.raw_query();
            while let Some(row) = rows.next().map_err(fail)? {
                let job = job_from_row(row).map_err(fail)?;
                found.insert(job.id, job);
            }
        }
        Ok(found)
    }
}
