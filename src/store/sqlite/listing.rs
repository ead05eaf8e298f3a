//! The listings people look at (`leasehold ui`, `lock list`, `queue
//! queues`, `queue stats`, `queue list`): held keys, queue names, one
//! state's jobs a page at a time, a queue's jobs in id order, counts (all,
//! or capped) and the finished jobs per interval. Every statement reads
//! an index (a unit test checks the plans). A page's statements read one
//! index in its order, so a page costs its own rows whatever else the
//! database holds; the whole queue's counts and its id-ordered list cost
//! the queue's rows.
//!
//! Every state's jobs are one band (or two: ready and parked) of
//! `jobs_bands` (schema v15). Two partial indexes serve the dead and the
//! cancelled jobs' pages and counts (done jobs read the finished band,
//! whose rows they dominate). They are created on open when missing, not
//! by a schema version, and are only written when a job enters or leaves
//! those states.

use super::conn::sql_err;
use super::rows::{job_from_row, job_from_row_at, state_of, JOB_COLUMNS};
use crate::core::{JobCursor, JobId, JobPeek, JobRecord, JobState, StateCounts};
use crate::error::{Error, Field, Result};
use crate::store::{i64_of, u64_of};
use rusqlite::{params, Connection, OptionalExtension, Row};

/// The listings' own indexes, created on open if missing.
pub(super) const LISTING_INDEXES: &str = "
CREATE INDEX IF NOT EXISTS jobs_dead ON jobs (queue, finished_at, id) WHERE state = 4;
CREATE INDEX IF NOT EXISTS jobs_cancelled ON jobs (queue, finished_at, id) WHERE state = 5;
";

/// Create [`LISTING_INDEXES`] where missing (a no-op once they exist).
pub(super) fn ensure_indexes(conn: &Connection, shown: &str) -> Result<()> {
    conn.execute_batch(LISTING_INDEXES)
        .map_err(|e| sql_err(|| format!("creating the listing indexes of {shown}"), e))
}

/// The keys after `?1` that have a slot row, in the primary key's order
/// (it walks past the heads of keys nobody holds: `lease_rows` keeps both).
pub(super) const LEASE_KEYS: &str =
    "SELECT key FROM lease_rows WHERE key > ?1 AND token >= 0 GROUP BY key ORDER BY key LIMIT ?2";

/// Up to `limit` keys after `after` that have slot rows.
pub(super) fn lease_keys(conn: &Connection, after: &str, limit: usize) -> Result<Vec<String>> {
    let fail = |e| sql_err(|| "listing held keys".to_owned(), e);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(LEASE_KEYS).map_err(fail)?;
    let rows = stmt
        .query_map(params![after, limit], |r| r.get(0))
        .map_err(fail)?;
    rows.collect::<rusqlite::Result<Vec<String>>>()
        .map_err(fail)
}

/// The first queue name after `?1`: every job is in `jobs_bands`, which
/// leads with the queue.
pub(super) const NEXT_QUEUE: &str =
    "SELECT queue FROM jobs INDEXED BY jobs_bands WHERE queue > ?1 ORDER BY queue LIMIT 1";

/// Up to `limit` queue names after `after`: one index probe per name (a
/// loose index scan), however many jobs each queue has.
pub(super) fn queue_names(
    conn: &Connection,
    after: &str,
    limit: usize,
    out: &mut Vec<String>,
) -> Result<()> {
    let fail = |e| sql_err(|| "listing queues".to_owned(), e);
    let mut last = after.to_owned();
    for _ in 0..limit {
        let next: Option<String> = conn
            .prepare_cached(NEXT_QUEUE)
            .and_then(|mut s| s.query_row([&last], |r| r.get(0)).optional())
            .map_err(fail)?;
        let Some(name) = next else { break };
        out.push(name.clone());
        last = name;
    }
    Ok(())
}

/// The page statements: `{cols}` is the job columns with the payload cut
/// to a preview, then its length. Ready jobs page in two steps (the rest
/// of the cursor's priority, then the lower priorities), once for the
/// claimable ones and once for the parked ones (`?7`: bands 3 and 4),
/// merged; every other state in one; terminal jobs newest first. Outside
/// the ready bands a job's second key is always 0, so those cursors
/// compare it with 0.
pub(super) const PAGE_SQL: [&str; 8] = [
    "SELECT {cols} FROM jobs WHERE queue = ?1 AND band = 3 + ?7 AND band_k1 = -?2 AND (band_k2, id) > (?3, ?4) ORDER BY band_k2, id LIMIT ?5",
    "SELECT {cols} FROM jobs WHERE queue = ?1 AND band = 3 + ?7 AND band_k1 > -?2 ORDER BY band_k1, band_k2, id LIMIT ?5",
    "SELECT {cols} FROM jobs WHERE queue = ?1 AND band = 5 AND (band_k1, band_k2, id) > (?3, 0, ?4) ORDER BY band_k1, band_k2, id LIMIT ?5",
    "SELECT {cols} FROM jobs WHERE queue = ?1 AND band = 2 AND (band_k1, band_k2, id) > (?3, 0, ?4) ORDER BY band_k1, band_k2, id LIMIT ?5",
    "SELECT {cols} FROM jobs WHERE queue = ?1 AND band = 1 AND state = 3 AND (band_k1, band_k2, id) < (?3, 0, ?4) ORDER BY band_k1 DESC, band_k2 DESC, id DESC LIMIT ?5",
    "SELECT {cols} FROM jobs WHERE queue = ?1 AND state = 4 AND (finished_at, id) < (?3, ?4) ORDER BY finished_at DESC, id DESC LIMIT ?5",
    "SELECT {cols} FROM jobs WHERE queue = ?1 AND state = 5 AND (finished_at, id) < (?3, ?4) ORDER BY finished_at DESC, id DESC LIMIT ?5",
    "SELECT {cols} FROM jobs WHERE queue = ?1 AND band = 6 AND band_k1 = 0 AND band_k2 = 0 AND id > ?4 ORDER BY id LIMIT ?5",
];

/// A database integer for a cursor's field (past `i64::MAX`: the largest,
/// which no stored value exceeds).
fn sat(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The statements (indexes into [`PAGE_SQL`]) and the parameters of a
/// page of `state` after `after`.
fn page_plan(state: JobState, after: Option<JobCursor>) -> (&'static [usize], i64, i64, i64) {
    let steps: &'static [usize] = match (state, after.is_some()) {
        (JobState::Ready, true) => &[0, 1],
        (JobState::Ready, false) => &[1],
        (JobState::Scheduled, _) => &[2],
        (JobState::Running, _) => &[3],
        (JobState::Done, _) => &[4],
        (JobState::Dead, _) => &[5],
        (JobState::Cancelled, _) => &[6],
        (JobState::Waiting, _) => &[7],
    };
    // Without a cursor: before every row in the state's order.
    let (p, at, id) = match after {
        Some(c) => (i64::from(c.priority), sat(c.at_ms), sat(c.id.0)),
        None if state.is_terminal() => (i64::MAX, i64::MAX, i64::MAX),
        None => (i64::MAX, -1, -1),
    };
    (steps, p, at, id)
}

/// Up to `limit` jobs of `queue` in `state` after `after`, with at most
/// `preview_bytes` of their payloads.
pub(super) fn page(
    conn: &Connection,
    queue: &str,
    state: JobState,
    after: Option<JobCursor>,
    limit: usize,
    preview_bytes: usize,
) -> Result<Vec<JobPeek>> {
    let fail = |e| sql_err(|| format!("listing {state} jobs of queue {queue:?}"), e);
    let cols = JOB_COLUMNS.replacen("payload", "coalesce(substr(payload, 1, ?6), x'')", 1)
        + ", length(payload)";
    let (steps, p, at, id) = page_plan(state, after);
    let preview = i64::try_from(preview_bytes).unwrap_or(i64::MAX);
    // Ready jobs are indexed claimable and parked apart: a page of each,
    // merged in claim order.
    let parked: &[Option<bool>] = match state {
        JobState::Ready => &[Some(false), Some(true)],
        _ => &[None],
    };
    let mut jobs: Vec<JobPeek> = Vec::new();
    for &arm in parked {
        let mut got = 0;
        for &step in steps {
            let left = limit - got;
            if left == 0 {
                break;
            }
            let sql = PAGE_SQL[step].replacen("{cols}", &cols, 1);
            let mut stmt = conn.prepare_cached(&sql).map_err(fail)?;
            let n = i64::try_from(left).unwrap_or(i64::MAX);
            let rows = match arm {
                Some(parked) => {
                    stmt.query_map(params![queue, p, at, id, n, preview, parked], peek_from_row)
                }
                None => stmt.query_map(params![queue, p, at, id, n, preview], peek_from_row),
            }
            .map_err(fail)?;
            for row in rows {
                jobs.push(row.map_err(fail)?);
                got += 1;
            }
        }
    }
    if parked.len() > 1 {
        jobs.sort_by_key(|j| JobCursor::of(&j.job).sort_key(state));
        jobs.truncate(limit);
    }
    Ok(jobs)
}

/// A job from [`JOB_COLUMNS`] (its payload cut), then the payload's length.
fn peek_from_row(r: &Row<'_>) -> rusqlite::Result<JobPeek> {
    let length_at = JOB_COLUMNS.split(',').count();
    Ok(JobPeek {
        job: job_from_row_at(r, 0)?,
        payload_bytes: u64_of(r.get(length_at)?),
    })
}

/// Each state's count, up to `?2`, each from the state's band (or index).
pub(super) const COUNTS_CAPPED: &str = "SELECT
    (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE queue = ?1 AND band >= 3 AND band <= 4 LIMIT ?2)),
    (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE queue = ?1 AND band = 5 LIMIT ?2)),
    (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE queue = ?1 AND band = 2 LIMIT ?2)),
    (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE queue = ?1 AND band = 1 AND state = 3 LIMIT ?2)),
    (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE queue = ?1 AND state = 4 LIMIT ?2)),
    (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE queue = ?1 AND state = 5 LIMIT ?2)),
    (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE queue = ?1 AND band = 6 LIMIT ?2))";

/// Jobs of `queue` per state, each counted up to `cap`.
pub(super) fn counts_capped(conn: &Connection, queue: &str, cap: u64) -> Result<StateCounts> {
    let fail = |e| sql_err(|| format!("counting queue {queue:?}"), e);
    let mut stmt = conn.prepare_cached(COUNTS_CAPPED).map_err(fail)?;
    let row: [i64; 7] = stmt
        .query_row(params![queue, sat(cap)], |r| {
            Ok([
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ])
        })
        .map_err(fail)?;
    Ok(StateCounts(row.map(u64_of)))
}

/// A queue's live jobs per state, each read from one band of `jobs_bands`
/// (no index is kept just for counting: every state change would have to
/// update it).
pub(super) const COUNTS_LIVE: [(JobState, &str); 4] = [
    (
        JobState::Ready,
        "SELECT count(*) FROM jobs WHERE queue = ?1 AND band >= 3 AND band <= 4",
    ),
    (
        JobState::Scheduled,
        "SELECT count(*) FROM jobs WHERE queue = ?1 AND band = 5",
    ),
    (
        JobState::Running,
        "SELECT count(*) FROM jobs WHERE queue = ?1 AND band = 2",
    ),
    (
        JobState::Waiting,
        "SELECT count(*) FROM jobs WHERE queue = ?1 AND band = 6",
    ),
];

/// A queue's finished jobs per state: the finished band.
pub(super) const COUNTS_FINISHED: &str = "SELECT state, count(*) FROM jobs INDEXED BY jobs_bands
     WHERE queue = ?1 AND band = 1 GROUP BY state";

/// Jobs of `queue` per state, all of them.
pub(super) fn counts(conn: &Connection, queue: &str) -> Result<StateCounts> {
    let fail = |e| sql_err(|| format!("counting queue {queue:?}"), e);
    let mut counts = StateCounts::default();
    for (state, sql) in COUNTS_LIVE {
        let n: i64 = conn
            .prepare_cached(sql)
            .and_then(|mut s| s.query_row([queue], |r| r.get(0)))
            .map_err(fail)?;
        counts.add(state, n);
    }
    let mut stmt = conn.prepare_cached(COUNTS_FINISHED).map_err(fail)?;
    let rows = stmt
        .query_map([queue], |r| {
            Ok((state_of(0, r.get(0)?)?, r.get::<_, i64>(1)?))
        })
        .map_err(fail)?;
    for row in rows {
        let (state, n) = row.map_err(fail)?;
        counts.add(state, n);
    }
    Ok(counts)
}

/// A queue's jobs after an id, in id order, in one state (`?3`) or all
/// (`?3` below zero). It reads the queue's rows in `jobs_bands` and sorts
/// them (by id, keeping the first `?4`): a page costs the whole queue
/// (about 20 ms for 200,000 jobs). The pages people browse are
/// [`page`]'s, in each state's own order.
fn list_sql() -> String {
    format!(
        "SELECT {JOB_COLUMNS} FROM jobs WHERE queue = ?1 AND id > ?2 AND (?3 < 0 OR state = ?3) ORDER BY id LIMIT ?4"
    )
}

/// Up to `limit` jobs of `queue` after id `after` in id order, optionally
/// in one state.
pub(super) fn list(
    conn: &Connection,
    queue: &str,
    state: Option<JobState>,
    after: JobId,
    limit: usize,
) -> Result<Vec<JobRecord>> {
    let fail = |e| sql_err(|| format!("listing queue {queue:?}"), e);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let after = i64_of(Field::After, after.0)?;
    let state = state.map_or(-1, |s| i64::from(s.code()));
    let mut stmt = conn.prepare_cached(&list_sql()).map_err(fail)?;
    let rows = stmt
        .query_map(params![queue, after, state, limit], job_from_row)
        .map_err(fail)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(fail)
}

/// Terminal jobs finished in `[?2, ?3)`: all of them (the finished band),
/// the dead and the cancelled (their own indexes); done is the rest. A
/// `count(*)` over an index range (no grouping, no column read) is about
/// five times faster here than one grouped scan of the window.
pub(super) const HISTOGRAM: [&str; 3] = [
    "SELECT count(*) FROM jobs WHERE queue = ?1 AND band = 1 AND band_k1 >= ?2 AND band_k1 < ?3",
    "SELECT count(*) FROM jobs WHERE queue = ?1 AND state = 4 AND finished_at >= ?2 AND finished_at < ?3",
    "SELECT count(*) FROM jobs WHERE queue = ?1 AND state = 5 AND finished_at >= ?2 AND finished_at < ?3",
];

/// See [`crate::core::JobTxn::finished_histogram`].
pub(super) fn finished_histogram(
    conn: &Connection,
    queue: &str,
    from_ms: u64,
    bucket_ms: u64,
    out: &mut [StateCounts],
) -> Result<()> {
    let fail = |e| sql_err(|| format!("counting finished jobs of queue {queue:?}"), e);
    let mut start_ms = from_ms;
    for bucket in out.iter_mut() {
        let end_ms = start_ms.saturating_add(bucket_ms);
        let mut n = [0i64; 3];
        for (sql, n) in HISTOGRAM.iter().zip(&mut n) {
            let mut stmt = conn.prepare_cached(sql).map_err(fail)?;
            *n = stmt
                .query_row(params![queue, sat(start_ms), sat(end_ms)], |r| r.get(0))
                .map_err(fail)?;
        }
        let [all, dead, cancelled] = n;
        bucket.add(JobState::Done, all - dead - cancelled);
        bucket.add(JobState::Dead, dead);
        bucket.add(JobState::Cancelled, cancelled);
        start_ms = end_ms;
    }
    Ok(())
}

/// [`crate::core::Txn::export_names`] on SQLite.
pub(super) fn export_names(
    conn: &Connection,
    what: crate::core::Exported<'_>,
    after: &str,
    limit: usize,
    out: &mut Vec<String>,
) -> Result<()> {
    let fail = |e| sql_err(|| "listing what a migration copies".to_owned(), e);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let sql = crate::store::export_sql(what, "", true);
    let mut stmt = conn.prepare_cached(&sql).map_err(fail)?;
    let mut rows = match what {
        crate::core::Exported::RateKeys(queue) => stmt.query(params![after, limit, queue]),
        _ => stmt.query(params![after, limit]),
    }
    .map_err(fail)?;
    while let Some(row) = rows.next().map_err(fail)? {
        out.push(row.get(0).map_err(fail)?);
    }
    Ok(())
}

/// Take `n` job ids from the counter: the last of them.
///
/// `OR FAIL`: the default (`ABORT`) makes SQLite keep a statement journal
/// for this one-row update (its RETURNING and the NOT NULL check): a 64
/// KiB buffer allocated and freed per push, which glibc gave back to the
/// kernel and took again each time (`brk`, page faults). A one-row
/// statement has no earlier change of its own to keep or undo, and any
/// error rolls the push back. Measured: a push through `Queue::push` 31 µs
/// before, 22 µs after (BENCHMARKS.md).
pub(super) fn take_job_ids(conn: &Connection, n: u64) -> Result<u64> {
    let fail = |e| sql_err(|| "allocating job ids".to_owned(), e);
    let last: String = conn
        .prepare_cached(
            "UPDATE OR FAIL leasehold_meta SET value = CAST(value AS INTEGER) + ?1
             WHERE name = 'last_job_id' RETURNING value",
        )
        .and_then(|mut s| s.query_row([i64::try_from(n).unwrap_or(i64::MAX)], |r| r.get(0)))
        .map_err(fail)?;
    last.parse::<u64>()
        .ok()
        .filter(|&l| l >= n)
        .ok_or_else(|| Error::store("allocating job ids", format!("corrupt counter {last:?}")))
}

/// Set the counter back to `last`: ids after it that a transaction took
/// and did not use (only that transaction moved the counter since).
pub(super) fn set_last_job_id(conn: &Connection, last: u64) -> Result<()> {
    conn.prepare_cached("UPDATE leasehold_meta SET value = ?1 WHERE name = 'last_job_id'")
        .and_then(|mut s| s.execute([last.to_string()]))
        .map(|_| ())
        .map_err(|e| sql_err(|| "giving back job ids".to_owned(), e))
}

/// [`crate::core::JobTxn::reserve_job_ids`] on SQLite.
pub(super) fn reserve_job_ids(conn: &Connection, last: u64) -> Result<()> {
    conn.prepare_cached(
        "UPDATE leasehold_meta SET value = CAST(max(CAST(value AS INTEGER), ?1) AS TEXT)
         WHERE name = 'last_job_id'",
    )
    .and_then(|mut s| s.execute([i64::try_from(last).unwrap_or(i64::MAX)]))
    .map(|_| ())
    .map_err(|e| sql_err(|| "reserving job ids".to_owned(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of `sql`, one line per step (parameters left unbound:
    /// the plans do not depend on them).
    fn plan(conn: &Connection, sql: &str) -> Vec<String> {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let mut rows = stmt.raw_query();
        let mut plan = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            plan.push(row.get::<_, String>(3).unwrap());
        }
        plan
    }

    /// Every listing statement reads an index: no full scan of `jobs`; and
    /// pages need no sort (a whole queue's counts group at most three
    /// finished states, its id-ordered list sorts: see [`list_sql`]).
    #[test]
    fn every_listing_statement_reads_an_index() {
        let conn = Connection::open_in_memory().unwrap();
        super::super::schema::check_schema(&conn, "memory").unwrap();
        ensure_indexes(&conn, "memory").unwrap();
        let cols = JOB_COLUMNS.replacen("payload", "coalesce(substr(payload, 1, ?6), x'')", 1);
        let mut pages: Vec<String> = PAGE_SQL
            .iter()
            .map(|s| s.replacen("{cols}", &cols, 1))
            .collect();
        pages.push(NEXT_QUEUE.to_owned());
        pages.extend(HISTOGRAM.iter().map(|s| s.to_string()));
        pages.extend([COUNTS_CAPPED, LEASE_KEYS].map(str::to_owned));
        pages.extend(COUNTS_LIVE.iter().map(|(_, s)| s.to_string()));
        let whole = [COUNTS_FINISHED.to_owned(), list_sql()];
        for (sql, sorts) in pages
            .iter()
            .map(|s| (s, false))
            .chain(whole.iter().map(|s| (s, true)))
        {
            let plan = plan(&conn, sql);
            for line in &plan {
                let reads_table = line.contains(" jobs") || line.contains(" lease_rows");
                if reads_table {
                    assert!(
                        line.starts_with("SEARCH")
                            && (line.contains("INDEX") || line.contains("PRIMARY KEY")),
                        "{sql}\n{plan:#?}"
                    );
                }
                assert!(sorts || !line.contains("TEMP B-TREE"), "{sql}\n{plan:#?}");
            }
        }
        // The dead and cancelled pages use their own indexes.
        let plan = plan(&conn, &PAGE_SQL[5].replacen("{cols}", "id", 1));
        assert!(plan[0].contains("jobs_dead"), "{plan:#?}");
    }
}
