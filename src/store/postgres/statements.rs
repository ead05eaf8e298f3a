//! The statements a session prepares (the reads of a transaction: lease
//! rows, job rows, the indexed job scans), each on its first use.
//!
//! Preparing is a round trip per statement. A session prepared all 34 as
//! it opened, 5-8 ms on loopback, which every short-lived process paid
//! for each session it opened (a one-job `queue work --drain` opens three)
//! whatever it went on to run. A session now prepares a statement the
//! first time one of its transactions runs it ([`Lazy::get`]), and keeps it.

use crate::store::SCHEDULE_COLUMNS;
use postgres::{Client, Statement};
use std::sync::OnceLock;

/// One statement's text, and the statement once the session prepared it.
pub(super) struct Lazy {
    sql: String,
    prepared: OnceLock<Statement>,
}

impl Lazy {
    fn new(sql: String) -> Lazy {
        Lazy {
            sql,
            prepared: OnceLock::new(),
        }
    }

    /// The statement, prepared on `client` (this session) on first use.
    pub(super) fn get(&self, client: &mut Client) -> Result<&Statement, postgres::Error> {
        if let Some(stmt) = self.prepared.get() {
            return Ok(stmt);
        }
        let stmt = client.prepare(&self.sql)?;
        Ok(self.prepared.get_or_init(|| stmt))
    }
}

/// Every statement a session may run, each prepared on its first use
/// ([`Lazy`]) and kept for the session.
pub(super) struct Statements {
    pub lease_get: Lazy,
    pub job_get: Lazy,
    pub jobs_get: Lazy,
    /// The same read, run only after [`BY_ID`](super::job_writes::BY_ID) (a
    /// transaction that begins by reading a batch), so that every plan
    /// the session keeps for it looks the jobs up by id.
    pub jobs_get_by_id: Lazy,
    /// `$1` new job ids (see `PgTxn::ids`).
    pub next_ids: Lazy,
    pub unique_live: Lazy,
    pub unique_since: Lazy,
    pub lock_unique: Lazy,
    pub scan_maintenance: Lazy,
    pub scan_maintenance_ready: Lazy,
    pub scan_finished: Lazy,
    pub scan_retrying: Lazy,
    pub counts: Lazy,
    pub list: Lazy,
    pub schedules_get: Lazy,
    pub schedule_put: Lazy,
    pub schedule_delete: Lazy,
    pub queue_get: Lazy,
    pub queue_put: Lazy,
    pub running_count: Lazy,
    pub parked_key: Lazy,
    pub parked_any: Lazy,
    pub lock_queue: Lazy,
    pub lock_queue_shared: Lazy,
    pub rate_get: Lazy,
    pub rate_put: Lazy,
    pub rate_delete: Lazy,
    pub rate_wakes: Lazy,
    pub rate_forget: Lazy,
    pub link: Lazy,
    pub children: Lazy,
    pub unlink: Lazy,
}

/// The columns of a job row, in the order [`PgTxn`](super::txn::PgTxn) decodes them.
pub(super) const COLUMNS: &str = "id, queue, payload, priority, run_at, created_at, max_attempts, attempts, expiries, last_token, state, claim_holder, claim_token, lease_until, cancel_requested, last_error, unique_key, finished_at, result, conc_key, parked, timeout_ms, claim_deadline, progress, progress_msg, after_ids, after_any, waiting_on, has_children";

/// How many columns a comma-separated list names.
const fn column_count(list: &str) -> usize {
    let bytes = list.as_bytes();
    let (mut i, mut commas) = (0, 0);
    while i < bytes.len() {
        if bytes[i] == b',' {
            commas += 1;
        }
        i += 1;
    }
    commas + 1
}

/// How many [`COLUMNS`] there are (where a claim's read puts the queue's
/// settings).
pub(super) const JOB_COLUMN_COUNT: usize = column_count(COLUMNS);

/// The columns of a queue's settings row, in the order [`queue_config`]
/// decodes them from `at`, each prefixed with `c.` (the join's alias).
pub(super) const QUEUE_COLUMNS: &str =
    "c.paused, c.concurrency, c.per_key, c.rate_count, c.rate_ms, c.key_rate_count, c.key_rate_ms";

/// A lease's row, locked ($1 the key).
pub(super) const LEASE_GET: &str =
    "SELECT last_token, tokens, holders, labels, expires, lease_limit
     FROM {s}.leases WHERE key = $1 FOR UPDATE";

/// A job by id ($1), locked, for a change: with its queue's settings
/// ([`QUEUE_COLUMNS`] after the job's), so the end of an attempt knows its
/// queue's limits without another round trip.
pub(super) fn job_get_sql() -> String {
    let j = job_columns_of_j();
    format!(
        "SELECT {j}, {QUEUE_COLUMNS} FROM {{s}}.jobs j LEFT JOIN {{s}}.queues c ON c.queue = j.queue
         WHERE j.id = $1 FOR UPDATE OF j"
    )
}

/// The rows of a queue ($1) a claim's ready scan reads.
const READY: &str = "state = 0 AND parked = false";

/// The job scans, each on the partial index ordered as it orders; the
/// maintenance statements combine them ($1 queue, $2 now, $3 limit, $4 the
/// ready limit).
fn expired_scan() -> String {
    format!(
        "SELECT {COLUMNS} FROM {{s}}.jobs WHERE queue = $1 AND state = 2 AND lease_until <= $2
         ORDER BY lease_until, id LIMIT $3 FOR UPDATE SKIP LOCKED"
    )
}
fn due_scan() -> String {
    format!(
        "SELECT {COLUMNS} FROM {{s}}.jobs WHERE queue = $1 AND state = 1 AND run_at <= $2
         ORDER BY run_at, id LIMIT $3 FOR UPDATE SKIP LOCKED"
    )
}

/// A claim's read ($1 queue, $2 now, $3 the expired and due limit, $4 the
/// ready limit): the expired, due and ready scans, with the queue's
/// settings riding along as the last columns ([`QUEUE_COLUMNS`]) and then
/// whether the ready scan skipped rows others held locked ([`SKIPPED_COLUMN`]),
/// on a row of NULL job columns if no job was read.
///
/// The ready scan skipped rows when it came back empty while the
/// statement's snapshot has a ready row: one probe of the ready index,
/// only for an empty scan (a scan that read rows starts jobs, or, on a
/// limited queue, takes its turn at the queue's row after any claim in
/// flight). (The snapshot may also hold a row a transaction committed a
/// change to since: then an idle worker looks once more for nothing.) The expired
/// and due scans need no probe: a row they passed over is still expired
/// or due in what [`crate::core::job::next_look`] reads after them (a
/// relook),
/// or the change that made it otherwise is in it.
pub(super) fn pending_ready_sql() -> String {
    format!(
        "WITH e AS ({}), d AS ({}), r AS (SELECT {COLUMNS} FROM {{s}}.jobs
           WHERE queue = $1 AND {READY} ORDER BY priority DESC, run_at, id
           LIMIT $4 FOR UPDATE SKIP LOCKED),
           j AS (SELECT * FROM e UNION ALL SELECT * FROM d UNION ALL SELECT * FROM r)
         SELECT j.*, {QUEUE_COLUMNS},
           NOT EXISTS (SELECT 1 FROM r)
             AND EXISTS (SELECT 1 FROM {{s}}.jobs WHERE queue = $1 AND {READY})
         FROM (SELECT) AS one LEFT JOIN j ON true LEFT JOIN {{s}}.queues c ON c.queue = $1",
        expired_scan(),
        due_scan(),
    )
}

/// Where a claim's read puts whether its ready scan skipped locked rows: after
/// the job's columns and the queue's settings.
pub(super) const SKIPPED_COLUMN: usize = JOB_COLUMN_COUNT + column_count(QUEUE_COLUMNS);

/// [`COLUMNS`], each prefixed with `j.` (for a join with the queues).
fn job_columns_of_j() -> String {
    COLUMNS
        .split(", ")
        .map(|c| format!("j.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Statements {
    /// The statements of a session on the quoted schema `s` (none prepared).
    pub(super) fn new(s: &str) -> Statements {
        let p = |sql: String| Lazy::new(sql.replace("{s}", s));
        let j = job_columns_of_j();
        let jobs_get = format!(
            "SELECT {j}, {QUEUE_COLUMNS} FROM {{s}}.jobs j LEFT JOIN {{s}}.queues c ON c.queue = j.queue
             WHERE j.id = ANY($1) ORDER BY j.id FOR UPDATE OF j"
        );
        Statements {
            lease_get: p(LEASE_GET.into()),
            job_get: p(job_get_sql()),
            // Locked in id order, so two batches that share jobs never
            // deadlock (the lock is taken above the sort).
            jobs_get: p(jobs_get.clone()),
            jobs_get_by_id: p(jobs_get),
            next_ids: p("SELECT nextval('{s}.job_ids') FROM generate_series(1, $1::int8)".into()),
            unique_live: p("SELECT id FROM {s}.jobs WHERE queue = $1 AND unique_key = $2 AND (state <= 2 OR state = 6)
                 AND ((1 << state) & $3::int4) != 0 ORDER BY id DESC LIMIT $4"
                .into()),
            unique_since: p("SELECT id FROM {s}.jobs WHERE queue = $1 AND unique_key = $2 AND created_at >= $3
                 AND ((1 << state) & $4::int4) != 0 ORDER BY created_at DESC, id DESC LIMIT $5"
                .into()),
            // One key's pushes and retries take turns (U1): the schema and
            // queue, and the key, hashed, name the lock (a collision only
            // makes two keys take turns).
            lock_unique: p("SELECT pg_advisory_xact_lock(hashtext('{s}.' || $1), hashtext($2))".into()),
            scan_maintenance: p(format!(
                "WITH e AS ({}), d AS ({}) SELECT * FROM e UNION ALL SELECT * FROM d",
                expired_scan(),
                due_scan()
            )),
            scan_maintenance_ready: p(pending_ready_sql()),
            scan_finished: p(
                "SELECT id FROM {s}.jobs WHERE queue = $1 AND state >= 3 AND state <= 5 AND finished_at <= $2
                 ORDER BY finished_at, id LIMIT $3 FOR UPDATE SKIP LOCKED".into(),
            ),
            scan_retrying: p(
                "SELECT id FROM {s}.jobs WHERE queue = $1 AND state = 1 AND attempts > 0
                 ORDER BY run_at, id LIMIT $2".into(),
            ),
            counts: p("SELECT
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 0),
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 1),
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 2),
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 3),
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 4),
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 5),
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 6)".into()),
            list: p(format!(
                "SELECT {COLUMNS} FROM {{s}}.jobs WHERE queue = $1 AND id > $2 AND ($3::int2 < 0 OR state = $3::int2)
                 ORDER BY id LIMIT $4"
            )),
            // Locked: two workers firing one queue take turns, and the
            // second sees the cursor the first moved.
            schedules_get: p(format!(
                "SELECT {SCHEDULE_COLUMNS} FROM {{s}}.schedules WHERE queue = $1 ORDER BY name FOR UPDATE"
            )),
            schedule_put: p(format!(
                "INSERT INTO {{s}}.schedules ({SCHEDULE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (queue, name) DO UPDATE SET rule = excluded.rule, payload = excluded.payload,
                   priority = excluded.priority, max_attempts = excluded.max_attempts,
                   missed = excluded.missed, next_at = excluded.next_at"
            )),
            schedule_delete: p("DELETE FROM {s}.schedules WHERE queue = $1 AND name = $2".into()),
            queue_get: p(format!("SELECT {QUEUE_COLUMNS} FROM {{s}}.queues c WHERE queue = $1")),
            queue_put: p(
                "INSERT INTO {s}.queues (queue, paused, concurrency, per_key, rate_count, rate_ms,
                   key_rate_count, key_rate_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (queue) DO UPDATE SET paused = excluded.paused,
                   concurrency = excluded.concurrency, per_key = excluded.per_key,
                   rate_count = excluded.rate_count, rate_ms = excluded.rate_ms,
                   key_rate_count = excluded.key_rate_count, key_rate_ms = excluded.key_rate_ms"
                    .into(),
            ),
            running_count: p(
                "SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 2
                   AND ($2::text IS NULL OR conc_key = $2::text)".into(),
            ),
            parked_key: p(format!(
                "SELECT {COLUMNS} FROM {{s}}.jobs WHERE queue = $1 AND state = 0 AND parked AND conc_key = $2
                 ORDER BY priority DESC, run_at, id LIMIT $3 FOR UPDATE SKIP LOCKED"
            )),
            parked_any: p(format!(
                "SELECT {COLUMNS} FROM {{s}}.jobs WHERE queue = $1 AND state = 0 AND parked
                 ORDER BY conc_key, priority DESC, run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED"
            )),
            // The claims of a limited queue take turns on its settings row
            // (every limited queue has one); the ends of attempts share it.
            lock_queue: p("SELECT 1 FROM {s}.queues WHERE queue = $1 FOR UPDATE".into()),
            lock_queue_shared: p("SELECT 1 FROM {s}.queues WHERE queue = $1 FOR SHARE".into()),
            rate_get: p("SELECT starts, wake_at FROM {s}.rates WHERE queue = $1 AND key = $2".into()),
            rate_put: p(
                "INSERT INTO {s}.rates (queue, key, starts, wake_at, newest) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (queue, key) DO UPDATE SET starts = excluded.starts,
                   wake_at = excluded.wake_at, newest = excluded.newest"
                    .into(),
            ),
            rate_delete: p("DELETE FROM {s}.rates WHERE queue = $1 AND key = $2".into()),
            rate_forget: p("DELETE FROM {s}.rates WHERE queue = $1 AND key IN (SELECT key FROM {s}.rates
                   WHERE queue = $1 AND wake_at IS NULL AND newest <= $2 LIMIT $3)"
                .into()),
            rate_wakes: p("SELECT key, wake_at FROM {s}.rates WHERE queue = $1 AND wake_at <= $2
                 ORDER BY wake_at, key LIMIT $3"
                .into()),
            link: p("INSERT INTO {s}.job_deps (parent, child) VALUES ($1, $2) ON CONFLICT DO NOTHING".into()),
            children: p("SELECT child FROM {s}.job_deps WHERE parent = $1 ORDER BY child".into()),
            unlink: p("DELETE FROM {s}.job_deps WHERE parent = $1".into()),
        }
    }
}
