//! The listings people look at (`leasehold ui`, `lock list`, `queue
//! queues`): held keys, queue names, one state's jobs a page at a time,
//! capped counts and the finished jobs per interval. Plain reads (no row
//! locks: a listing never makes a worker wait), each on one index in its
//! order; a test in `tests/postgres.rs` checks the plans.
//!
//! Two partial indexes serve the dead and the cancelled jobs (done jobs
//! read `jobs_finished`, whose rows they dominate). They are created on
//! open when missing, under the migrations' advisory lock, not by a
//! schema version; they are written only when a job enters or leaves
//! those states.

use super::error::{pg_err, Stage};
use super::migrate::ADVISORY_CLASS;
use super::rows::{job_from_row, lease_from_row};
use super::statements::COLUMNS;
use crate::core::{JobCursor, JobPeek, JobState, LeaseRecord, StateCounts};
use crate::error::Result;
use postgres::types::ToSql;
use postgres::Client;

/// The listings' own indexes (name, definition after `ON`).
const INDEXES: [(&str, &str); 2] = [
    (
        "jobs_dead",
        "{s}.jobs (queue, finished_at, id) WHERE state = 4",
    ),
    (
        "jobs_cancelled",
        "{s}.jobs (queue, finished_at, id) WHERE state = 5",
    ),
];

/// Create the listings' indexes where missing: one round trip when
/// they exist (`CREATE INDEX IF NOT EXISTS` would lock the table out of
/// writers even then), one more to create them, under an advisory lock
/// so processes starting together create each once. `schema` is the
/// quoted name (lowercase letters, digits and `_`: a safe literal).
pub(super) fn ensure_indexes(client: &mut Client, schema: &str, shown: &str) -> Result<()> {
    let fail = |e| {
        pg_err(
            format!("creating the listing indexes on {shown}"),
            e,
            Stage::Work,
        )
    };
    let names: Vec<String> = INDEXES
        .iter()
        .map(|(n, _)| format!("{schema}.{n}"))
        .collect();
    let missing: bool = client
        .query_one(
            "SELECT bool_or(to_regclass(n) IS NULL) FROM unnest($1::text[]) AS n",
            &[&names],
        )
        .and_then(|r| r.try_get(0))
        .map_err(fail)?;
    if !missing {
        return Ok(());
    }
    let mut script =
        format!("BEGIN; SELECT pg_advisory_xact_lock({ADVISORY_CLASS}, hashtext('{schema}'));\n");
    for (name, on) in INDEXES {
        script += &format!(
            "CREATE INDEX IF NOT EXISTS {name} ON {};\n",
            on.replace("{s}", schema)
        );
    }
    script += "COMMIT";
    client.batch_execute(&script).map_err(fail)
}

/// Up to `limit` lease records with slots after `after`, by the primary key.
pub(super) fn lease_scan(
    client: &mut Client,
    schema: &str,
    after: &str,
    limit: usize,
) -> Result<Vec<(String, LeaseRecord)>> {
    let fail = |e| pg_err("listing held keys", e, Stage::Work);
    let sql = format!(
        "SELECT key, last_token, tokens, holders, labels, expires, lease_limit FROM {schema}.leases
         WHERE key > $1 AND cardinality(tokens) > 0 ORDER BY key LIMIT $2"
    );
    let rows = client
        .query(&sql, &[&after, &sat(limit as u64)])
        .map_err(fail)?;
    rows.iter()
        .map(|r| Ok((r.try_get(0).map_err(fail)?, lease_from_row(r, 1)?)))
        .collect()
}

/// The next queue name after `x`: the least of the first names after it
/// in each state's index (every job is in exactly one).
const NEXT_QUEUE: &str = "(SELECT min(n) FROM (
    (SELECT queue AS n FROM {s}.jobs WHERE state = 0 AND queue > {x} ORDER BY queue LIMIT 1)
    UNION ALL (SELECT queue FROM {s}.jobs WHERE state = 1 AND queue > {x} ORDER BY queue LIMIT 1)
    UNION ALL (SELECT queue FROM {s}.jobs WHERE state = 2 AND queue > {x} ORDER BY queue LIMIT 1)
    UNION ALL (SELECT queue FROM {s}.jobs WHERE state >= 3 AND state <= 5 AND queue > {x} ORDER BY queue LIMIT 1)
    UNION ALL (SELECT queue FROM {s}.jobs WHERE state = 6 AND queue > {x} ORDER BY queue LIMIT 1)
) m)";

/// The queue names statement: a loose index scan as a recursive query,
/// four index probes per name, in one round trip.
pub(super) fn queue_names_sql(schema: &str) -> String {
    let next = |x: &str| NEXT_QUEUE.replace("{s}", schema).replace("{x}", x);
    format!(
        "WITH RECURSIVE names(q) AS (SELECT {} UNION ALL SELECT {} FROM names WHERE q IS NOT NULL)
         SELECT q FROM names WHERE q IS NOT NULL LIMIT $2",
        next("$1::text"),
        next("names.q")
    )
}

/// Up to `limit` queue names after `after`.
pub(super) fn queue_names(
    client: &mut Client,
    schema: &str,
    after: &str,
    limit: usize,
    out: &mut Vec<String>,
) -> Result<()> {
    let fail = |e| pg_err("listing queues", e, Stage::Work);
    let rows = client
        .query(&queue_names_sql(schema), &[&after, &sat(limit as u64)])
        .map_err(fail)?;
    for row in rows {
        out.push(row.try_get(0).map_err(fail)?);
    }
    Ok(())
}

/// A database integer for a cursor's field or a limit (past `i64::MAX`:
/// the largest, which no stored value exceeds).
fn sat(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The page statements, `{cols}` the job columns with the payload cut to
/// `$2` bytes, then its length; `$1` the queue, `$3` the limit, then the
/// cursor. Ready jobs page in two steps (the rest of the cursor's priority
/// band, then the lower bands), once for the claimable ones and once for
/// the parked ones (the last parameter), merged; terminal jobs newest
/// first.
pub(super) const PAGE_SQL: [&str; 8] = [
    "SELECT {cols} FROM {s}.jobs WHERE queue = $1 AND state = 0 AND parked = $7 AND priority = $4::int8 AND (run_at, id) > ($5, $6) ORDER BY run_at, id LIMIT $3",
    "SELECT {cols} FROM {s}.jobs WHERE queue = $1 AND state = 0 AND parked = $5 AND priority < $4::int8 ORDER BY priority DESC, run_at, id LIMIT $3",
    "SELECT {cols} FROM {s}.jobs WHERE queue = $1 AND state = 1 AND (run_at, id) > ($4, $5) ORDER BY run_at, id LIMIT $3",
    "SELECT {cols} FROM {s}.jobs WHERE queue = $1 AND state = 2 AND (lease_until, id) > ($4, $5) ORDER BY lease_until, id LIMIT $3",
    "SELECT {cols} FROM {s}.jobs WHERE queue = $1 AND state = 3 AND (finished_at, id) < ($4, $5) ORDER BY finished_at DESC, id DESC LIMIT $3",
    "SELECT {cols} FROM {s}.jobs WHERE queue = $1 AND state = 4 AND (finished_at, id) < ($4, $5) ORDER BY finished_at DESC, id DESC LIMIT $3",
    "SELECT {cols} FROM {s}.jobs WHERE queue = $1 AND state = 5 AND (finished_at, id) < ($4, $5) ORDER BY finished_at DESC, id DESC LIMIT $3",
    "SELECT {cols} FROM {s}.jobs WHERE queue = $1 AND state = 6 AND id > $5 AND $4::int8 IS NOT NULL ORDER BY id LIMIT $3",
];

/// A page statement for `schema`, ready to run.
pub(super) fn page_sql(step: usize, schema: &str) -> String {
    let cols = COLUMNS.replacen("payload", "substring(payload from 1 for $2::int4)", 1)
        + ", octet_length(payload)";
    PAGE_SQL[step]
        .replace("{cols}", &cols)
        .replace("{s}", schema)
}

/// The steps of [`PAGE_SQL`] for `state`, and each step's cursor values.
fn page_plan(state: JobState, after: Option<JobCursor>) -> Vec<(usize, Vec<i64>)> {
    let c = after.map(|c| (i64::from(c.priority), sat(c.at_ms), sat(c.id.0)));
    match (state, c) {
        (JobState::Ready, Some((p, at, id))) => vec![(0, vec![p, at, id]), (1, vec![p])],
        (JobState::Ready, None) => vec![(1, vec![i64::MAX])],
        (JobState::Waiting, c) => {
            let (_, at, id) = c.unwrap_or((0, 0, -1));
            vec![(7, vec![at, id])]
        }
        (JobState::Scheduled | JobState::Running, c) => {
            let (_, at, id) = c.unwrap_or((0, -1, -1));
            let step = if state == JobState::Scheduled { 2 } else { 3 };
            vec![(step, vec![at, id])]
        }
        (terminal, c) => {
            let (_, at, id) = c.unwrap_or((0, i64::MAX, i64::MAX));
            vec![(usize::from(terminal.code()) + 1, vec![at, id])]
        }
    }
}

/// Up to `limit` jobs of `queue` in `state` after `after`, with at most
/// `preview_bytes` of their payloads.
pub(super) fn page(
    client: &mut Client,
    schema: &str,
    q: (&str, JobState),
    after: Option<JobCursor>,
    limit: usize,
    preview_bytes: usize,
) -> Result<Vec<JobPeek>> {
    let (queue, state) = q;
    let what = format!("listing {state} jobs of queue {queue:?}");
    let preview = i32::try_from(preview_bytes).unwrap_or(i32::MAX);
    // Ready jobs are indexed claimable and parked apart: a page of each,
    // merged in claim order.
    let parked: &[Option<bool>] = match state {
        JobState::Ready => &[Some(false), Some(true)],
        _ => &[None],
    };
    let mut jobs: Vec<JobPeek> = Vec::new();
    for arm in parked {
        let mut got = 0;
        for (step, cursor) in page_plan(state, after) {
            let left = sat((limit - got) as u64);
            if left == 0 {
                break;
            }
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&queue, &preview, &left];
            params.extend(cursor.iter().map(|v| v as &(dyn ToSql + Sync)));
            if let Some(parked) = arm {
                params.push(parked);
            }
            let rows = client
                .query(&page_sql(step, schema), &params)
                .map_err(|e| pg_err(what.clone(), e, Stage::Work))?;
            for row in &rows {
                // The length follows the job's columns.
                let payload_bytes = row
                    .try_get::<_, i32>(COLUMNS.split(',').count())
                    .map_err(|e| pg_err(what.clone(), e, Stage::Work))?;
                jobs.push(JobPeek {
                    job: job_from_row(row)?,
                    payload_bytes: u64::try_from(payload_bytes).unwrap_or(0),
                });
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

/// Each state's count up to `$2`, each from the state's index.
pub(super) const COUNTS_CAPPED: &str = "SELECT
    (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND state = 0 LIMIT $2) c),
    (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND state = 1 LIMIT $2) c),
    (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND state = 2 LIMIT $2) c),
    (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND state = 3 LIMIT $2) c),
    (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND state = 4 LIMIT $2) c),
    (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND state = 5 LIMIT $2) c),
    (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND state = 6 LIMIT $2) c)";

/// Jobs of `queue` per state, each counted up to `cap`.
pub(super) fn counts_capped(
    client: &mut Client,
    schema: &str,
    queue: &str,
    cap: u64,
) -> Result<StateCounts> {
    let fail = |e| pg_err(format!("counting queue {queue:?}"), e, Stage::Work);
    let sql = COUNTS_CAPPED.replace("{s}", schema);
    let row = client.query_one(&sql, &[&queue, &sat(cap)]).map_err(fail)?;
    let mut counts = StateCounts::default();
    for (i, state) in JobState::ALL.into_iter().enumerate() {
        counts.add(state, row.try_get::<_, i64>(i).map_err(fail)?);
    }
    Ok(counts)
}

/// Terminal jobs per interval and state, read from `jobs_finished` in
/// its order: `$2` the start, `$3` the interval, `$4` the end.
pub(super) const HISTOGRAM: &str = "SELECT (finished_at - $2) / $3, state, count(*) FROM {s}.jobs
    WHERE queue = $1 AND state >= 3 AND state <= 5 AND finished_at >= $2 AND finished_at < $4 GROUP BY 1, 2";

/// See [`crate::core::JobTxn::finished_histogram`].
pub(super) fn finished_histogram(
    client: &mut Client,
    schema: &str,
    queue: &str,
    window: (u64, u64),
    out: &mut [StateCounts],
) -> Result<()> {
    let (from_ms, bucket_ms) = window;
    let fail = |e| {
        pg_err(
            format!("counting finished jobs of queue {queue:?}"),
            e,
            Stage::Work,
        )
    };
    let to_ms = from_ms.saturating_add(bucket_ms.saturating_mul(out.len() as u64));
    let sql = HISTOGRAM.replace("{s}", schema);
    let args = [sat(from_ms), sat(bucket_ms.max(1)), sat(to_ms)];
    let rows = client
        .query(&sql, &[&queue, &args[0], &args[1], &args[2]])
        .map_err(fail)?;
    for row in rows {
        let bucket: i64 = row.try_get(0).map_err(fail)?;
        let code: i16 = row.try_get(1).map_err(fail)?;
        let n: i64 = row.try_get(2).map_err(fail)?;
        let bucket = usize::try_from(bucket).ok().and_then(|b| out.get_mut(b));
        if let (Some(bucket), Some(state)) = (bucket, JobState::from_code(i64::from(code))) {
            bucket.add(state, n);
        }
    }
    Ok(())
}

/// [`crate::core::Txn::export_names`] on PostgreSQL.
pub(super) fn export_names(
    client: &mut Client,
    schema: &str,
    what: crate::core::Exported<'_>,
    after: &str,
    limit: usize,
    out: &mut Vec<String>,
) -> Result<()> {
    let fail = |e| pg_err("listing what a migration copies", e, Stage::Work);
    let sql = crate::store::export_sql(what, &format!("{schema}."), false);
    let limit = sat(limit as u64);
    let rows = match what {
        crate::core::Exported::RateKeys(queue) => client.query(&sql, &[&after, &limit, &queue]),
        _ => client.query(&sql, &[&after, &limit]),
    }
    .map_err(fail)?;
    for row in rows {
        out.push(row.try_get(0).map_err(fail)?);
    }
    Ok(())
}

/// [`crate::core::JobTxn::reserve_job_ids`] on PostgreSQL: the id
/// sequence moved above `last` (never back).
pub(super) fn reserve_job_ids(client: &mut Client, schema: &str, last: u64) -> Result<()> {
    if last == 0 {
        return Ok(());
    }
    let sql = format!(
        "SELECT setval('{schema}.job_ids', greatest($1,
           (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {schema}.job_ids)))"
    );
    client
        .execute(&sql, &[&sat(last)])
        .map(|_| ())
        .map_err(|e| pg_err("reserving job ids", e, Stage::Work))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listing statement can be served by an index (with sequential
    /// scans priced out, none is left), and pages need no sort. Runs on
    /// the server in `LEASEHOLD_TEST_PG` (skipped without it).
    #[test]
    fn every_listing_statement_reads_an_index() {
        let Some(url) = std::env::var("LEASEHOLD_TEST_PG")
            .ok()
            .filter(|u| !u.is_empty())
        else {
            eprintln!("SKIPPED: LEASEHOLD_TEST_PG is not set");
            return;
        };
        let name = format!("lh_plans_{}", std::process::id());
        let store = crate::PostgresStore::open(&format!("{url}?schema={name}")).unwrap();
        let s = format!("\"{name}\"");
        let mut c = Client::connect(&url, postgres::NoTls).unwrap();
        c.batch_execute("SET enable_seqscan = off; SET enable_sort = off")
            .unwrap();
        let (q, n, t) = ("q", 10i64, 5i64);
        let mut plans = Vec::new();
        let mut explain = |sql: &str, params: &[&(dyn ToSql + Sync)]| {
            let rows = c.query(&format!("EXPLAIN {sql}"), params).unwrap();
            let plan: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            plans.push((sql.to_owned(), plan.join("\n")));
        };
        for step in 0..PAGE_SQL.len() {
            let sql = page_sql(step, &s);
            match step {
                0 => explain(&sql, &[&q, &3i32, &n, &t, &t, &t, &false]),
                1 => explain(&sql, &[&q, &3i32, &n, &t, &false]),
                _ => explain(&sql, &[&q, &3i32, &n, &t, &t]),
            }
        }
        explain(&queue_names_sql(&s), &[&"", &n]);
        explain(&COUNTS_CAPPED.replace("{s}", &s), &[&q, &n]);
        explain(&HISTOGRAM.replace("{s}", &s), &[&q, &t, &t, &n]);
        drop(store);
        c.batch_execute(&format!("DROP SCHEMA {s} CASCADE"))
            .unwrap();
        assert!(plans[5].1.contains("jobs_dead"), "{}", plans[5].1);
        assert!(plans[6].1.contains("jobs_cancelled"), "{}", plans[6].1);
        for (sql, plan) in plans {
            assert!(!plan.contains("Seq Scan on jobs"), "{sql}\n{plan}");
            let sorts = plan.lines().any(|l| {
                let node = l.trim_start().trim_start_matches("->").trim_start();
                node.starts_with("Sort  (") || node.starts_with("Incremental Sort")
            });
            assert!(sql.contains("GROUP BY") || !sorts, "{sql}\n{plan}");
        }
    }
}
