//! Rows: how jobs map to columns, and the indexed scans.

use crate::core::{Claim, JobId, JobRecord, JobState};
use crate::error::Field;
use crate::error::Result;
use crate::store::{after_of, holder_bytes, holder_from, i64_of, progress_of, u64_of};
use rusqlite::Row;
use std::sync::Arc;

/// `text` as an SQL string literal. Safe for any text: the only special
/// character inside single quotes is the quote itself, which is doubled
/// (queue names are also checked by the core: no NUL or control characters).
pub fn sql_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

pub(super) const JOB_COLUMNS: &str = "id, queue, payload, priority, run_at, created_at, max_attempts, attempts, expiries, last_token, state, claim_holder, claim_token, lease_until, cancel_requested, last_error, unique_key, finished_at, result, conc_key, parked, timeout_ms, claim_deadline, progress, progress_msg, after_ids, after_any, waiting_on, has_children";

/// A stored state code; an unknown one is an error naming the row.
pub(super) fn state_of(id: i64, code: i64) -> rusqlite::Result<JobState> {
    JobState::from_code(code).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            10,
            rusqlite::types::Type::Integer,
            Box::new(crate::error::Cause(format!(
                "job {id} has state code {code}, which this build does not know (written by a newer leasehold?)"
            ))),
        )
    })
}

pub(super) fn job_from_row(r: &Row<'_>) -> rusqlite::Result<JobRecord> {
    job_from_row_at(r, 0)
}

/// A job from [`JOB_COLUMNS`] starting at column `at`.
pub(super) fn job_from_row_at(r: &Row<'_>, at: usize) -> rusqlite::Result<JobRecord> {
    let c = |i: usize| at + i;
    let state = state_of(r.get(c(0))?, r.get(c(10))?)?;
    let claim = match (
        r.get::<_, Option<Vec<u8>>>(c(11))?,
        r.get::<_, Option<i64>>(c(12))?,
        r.get::<_, Option<i64>>(c(13))?,
    ) {
        (Some(h), Some(t), Some(u)) => Some(Claim {
            holder: holder_from(&h),
            token: u64_of(t),
            lease_until_ms: u64_of(u),
            deadline_ms: r.get::<_, Option<i64>>(c(22))?.map(u64_of),
        }),
        _ => None,
    };
    Ok(JobRecord {
        id: JobId(u64_of(r.get(c(0))?)),
        queue: Arc::from(r.get::<_, String>(c(1))?.as_str()),
        payload: Arc::from(r.get::<_, Vec<u8>>(c(2))?),
        priority: r.get(c(3))?,
        run_at_ms: u64_of(r.get(c(4))?),
        created_at_ms: u64_of(r.get(c(5))?),
        max_attempts: r.get(c(6))?,
        attempts: r.get(c(7))?,
        expiries: r.get(c(8))?,
        last_token: u64_of(r.get(c(9))?),
        state,
        claim,
        cancel_requested: r.get::<_, i64>(c(14))? != 0,
        last_error: r
            .get::<_, Option<String>>(c(15))?
            .map(|s| Arc::from(s.as_str())),
        unique_key: r
            .get::<_, Option<String>>(c(16))?
            .map(|s| Arc::from(s.as_str())),
        finished_at_ms: r.get::<_, Option<i64>>(c(17))?.map(u64_of),
        result: r.get::<_, Option<Vec<u8>>>(c(18))?.map(Arc::from),
        key: r
            .get::<_, Option<String>>(c(19))?
            .map(|s| Arc::from(s.as_str())),
        parked: r.get::<_, i64>(c(20))? != 0,
        timeout_ms: r.get::<_, Option<i64>>(c(21))?.map(u64_of),
        progress: progress_of(r.get(c(23))?, r.get(c(24))?),
        after: after_of(r.get::<_, Option<String>>(c(25))?.as_deref()),
        after_any: r.get::<_, i64>(c(26))? != 0,
        waiting_on: r.get(c(27))?,
        has_children: r.get::<_, i64>(c(28))? != 0,
    })
}

/// The indexed reads: expired, due and ready jobs (for
/// [`JobTxn::pending`](crate::core::JobTxn::pending)), then the retrying
/// and finished scans. Each names its band (schema v15) or its state as a
/// literal, so SQLite reads one range of `jobs_bands` (or the matching
/// partial index), whose order is exactly the ORDER BY, and streams rows
/// in that order; the time bound is checked on
/// each row (`bound` column) and reading stops at the first row past it. A
/// bound parameter in the SQL would make SQLite (built with STAT4)
/// re-prepare the statement on every call as `now` changes. `{queue}` is
/// replaced by the queue as a literal ([`sql_quote`]) and `{limit}` by the
/// limit: bound as parameters, either one makes SQLite re-prepare these
/// statements on every execution (measured: a fifth of a claim's cost).
/// The statement cache keeps one per queue and limit.
pub const SCAN_SQL: [&str; 7] = [
    "SELECT lease_until, {cols} FROM jobs WHERE queue = {queue} AND band = 2 ORDER BY band_k1, band_k2, id LIMIT {limit}",
    "SELECT run_at, {cols} FROM jobs WHERE queue = {queue} AND band = 5 ORDER BY band_k1, band_k2, id LIMIT {limit}",
    "SELECT 0, {cols} FROM jobs WHERE queue = {queue} AND band = 3 ORDER BY band_k1, band_k2, id LIMIT {limit}",
    "SELECT finished_at, id FROM jobs WHERE queue = {queue} AND band = 1 ORDER BY band_k1, band_k2, id LIMIT {limit}",
    "SELECT 0, id FROM jobs WHERE queue = {queue} AND state = 1 AND attempts > 0 ORDER BY run_at, id LIMIT {limit}",
    // Parked jobs: one key's in claim order; any key's by key, then so.
    "SELECT 0, {cols} FROM jobs INDEXED BY jobs_parked WHERE queue = {queue} AND state = 0 AND parked = 1 AND conc_key = ?1 ORDER BY priority DESC, run_at, id LIMIT {limit}",
    "SELECT 0, {cols} FROM jobs INDEXED BY jobs_parked WHERE queue = {queue} AND state = 0 AND parked = 1 ORDER BY conc_key, priority DESC, run_at, id LIMIT {limit}",
];

/// A job's fields as the database stores them (integers checked to fit).
pub(super) struct JobRow {
    pub id: i64,
    pub run_at: i64,
    pub created: i64,
    pub last_token: i64,
    pub holder: Option<Vec<u8>>,
    pub token: Option<i64>,
    pub until: Option<i64>,
    pub finished: Option<i64>,
    pub timeout: Option<i64>,
    pub deadline: Option<i64>,
}

impl JobRow {
    pub(super) fn of(job: &JobRecord) -> Result<JobRow> {
        let claim = job.claim;
        Ok(JobRow {
            id: i64_of(Field::Id, job.id.0)?,
            run_at: i64_of(Field::RunAt, job.run_at_ms)?,
            created: i64_of(Field::CreatedAt, job.created_at_ms)?,
            last_token: i64_of(Field::Token, job.last_token)?,
            holder: claim.map(|c| holder_bytes(c.holder).to_vec()),
            token: claim.map(|c| i64_of(Field::Token, c.token)).transpose()?,
            until: claim
                .map(|c| i64_of(Field::LeaseUntil, c.lease_until_ms))
                .transpose()?,
            finished: job
                .finished_at_ms
                .map(|f| i64_of(Field::FinishedAt, f))
                .transpose()?,
            timeout: job
                .timeout_ms
                .map(|t| i64_of(Field::Timeout, t))
                .transpose()?,
            deadline: claim
                .and_then(|c| c.deadline_ms)
                .map(|d| i64_of(Field::Timeout, d))
                .transpose()?,
        })
    }
}

/// The widths of [`JobTxn::jobs_by_id`](crate::core::JobTxn::jobs_by_id)'s statements (a settle batch's
/// reads: one statement per chunk of ids instead of one per id). A chunk
/// takes the narrowest that holds it and binds NULL for the ids it lacks,
/// which match no row: a few statements serve every batch, and a small
/// batch does not pay for a wide list (fewer than half the narrowest are
/// read one by one).
pub(super) const BY_ID_WIDTHS: [usize; 2] = [8, 64];

/// The statement of each of [`BY_ID_WIDTHS`].
pub(super) static BY_ID_SQL: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
    BY_ID_WIDTHS.map(|width| {
        let marks: Vec<String> = (1..=width).map(|i| format!("?{i}")).collect();
        format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE id IN ({})",
            marks.join(", ")
        )
    })
});
