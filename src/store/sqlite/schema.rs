//! The schema: migrations, the checks that refuse foreign and newer
//! databases, and the clock state kept in `leasehold_meta`.

use super::conn::sql_err;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::store::boottime::{self, Saved, StoreClock};
use rusqlite::{params, Connection, OptionalExtension};
use std::sync::Arc;

/// Schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;
/// `PRAGMA application_id` of leasehold databases ("LSHD").
pub const APPLICATION_ID: i64 = 0x4C53_4844;

const SCHEMA_V1: &str = "
CREATE TABLE leasehold_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE leases (key TEXT PRIMARY KEY, last_token INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE lease_slots (
    key TEXT NOT NULL,
    token INTEGER NOT NULL,
    holder BLOB NOT NULL,
    label TEXT,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (key, token)
) WITHOUT ROWID;
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    payload BLOB NOT NULL,
    priority INTEGER NOT NULL,
    run_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    expiries INTEGER NOT NULL,
    last_token INTEGER NOT NULL,
    state INTEGER NOT NULL,
    claim_holder BLOB,
    claim_token INTEGER,
    lease_until INTEGER,
    cancel_requested INTEGER NOT NULL,
    last_error TEXT,
    unique_key TEXT,
    finished_at INTEGER
);
CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE state = 0;
CREATE INDEX jobs_scheduled ON jobs (queue, run_at, id) WHERE state = 1;
CREATE INDEX jobs_running ON jobs (queue, lease_until, id) WHERE state = 2;
CREATE INDEX jobs_finished ON jobs (queue, finished_at, id, state) WHERE state >= 3;
CREATE INDEX jobs_unique ON jobs (queue, unique_key) WHERE state <= 2 AND unique_key IS NOT NULL;
INSERT INTO leasehold_meta (name, value) VALUES ('last_job_id', '0');
";

/// Migrations, in order: `MIGRATIONS[i]` brings a database from schema
/// version `i` to `i + 1`, inside the one transaction that also sets
/// `user_version`, so a database is always at exactly one version.
const MIGRATIONS: [&str; 15] = [
    SCHEMA_V1,
    // v2: a counting lease's limit belongs to the key (0: not recorded);
    // retries waiting out their backoff, for the drain rule.
    "ALTER TABLE leases ADD COLUMN lease_limit INTEGER NOT NULL DEFAULT 0;
     CREATE INDEX jobs_retrying ON jobs (queue, run_at, id) WHERE state = 1 AND attempts > 0;",
    // v3: what a job's handler returned when it completed.
    "ALTER TABLE jobs ADD COLUMN result BLOB;",
    V4_SCHEDULES,
    // v5: a queue's flow-control settings (absent: the defaults).
    "CREATE TABLE queues (queue TEXT PRIMARY KEY, paused INTEGER NOT NULL) WITHOUT ROWID;",
    V6_LIMITS,
    // v7: a job's run-time limit and its current claim's deadline.
    "ALTER TABLE jobs ADD COLUMN timeout_ms INTEGER;
     ALTER TABLE jobs ADD COLUMN claim_deadline INTEGER;",
    V8_ONE_READY_INDEX,
    V9_RATES,
    // v10: each rate bucket's newest start, so that `purge` finds the
    // buckets no window counts any more.
    "ALTER TABLE rates ADD COLUMN newest INTEGER NOT NULL DEFAULT 0;
     CREATE INDEX rates_idle ON rates (queue, newest) WHERE wake_at IS NULL;",
    // v11: every job with a unique key by when it was pushed, whatever its
    // state, for a uniqueness period (`JobSpec::unique_for`).
    "CREATE INDEX jobs_unique_all ON jobs (queue, unique_key, created_at) WHERE unique_key IS NOT NULL;",
    // v12: what a running job's handler last reported (ten-thousandths
    // done, a message).
    "ALTER TABLE jobs ADD COLUMN progress INTEGER;
     ALTER TABLE jobs ADD COLUMN progress_msg TEXT;",
    V13_DEPENDENCIES,
    V14_LEASE_ROWS,
    V15_BANDS,
];

/// v15: one index of every job, by queue, band and the band's own order,
/// in place of one partial index per state (ready, scheduled, running,
/// finished, waiting). The bands, in index order: 1 finished (done, dead,
/// cancelled) by `finished_at`; 2 running by `lease_until`; 3 ready and 4
/// parked by priority (highest first), `run_at`; 5 scheduled by `run_at`;
/// 6 waiting; each then by id. A job's band and keys are virtual columns
/// computed from its state, so every write keeps them right.
///
/// Why: a claim moves a job from ready to running and a completion from
/// running to finished. With an index per state each move deleted from
/// one index's page and inserted into another's, so a one-job commit wrote
/// three pages to the WAL (the row and two index pages). Here the newest
/// finished jobs, the running ones and the next ready ones sit side by
/// side, so a move stays within one index page and a commit writes two
/// (measured: 6.2 against 4.1 WAL writes per commit, and one claim + one
/// completion per transaction 22-24 % faster; BENCHMARKS.md).
const V15_BANDS: &str = "
ALTER TABLE jobs ADD COLUMN band INTEGER GENERATED ALWAYS AS
    (CASE state WHEN 0 THEN 3 + parked WHEN 1 THEN 5 WHEN 2 THEN 2 WHEN 6 THEN 6 ELSE 1 END) VIRTUAL;
ALTER TABLE jobs ADD COLUMN band_k1 INTEGER GENERATED ALWAYS AS
    (CASE state WHEN 0 THEN -priority WHEN 1 THEN run_at WHEN 2 THEN lease_until WHEN 6 THEN 0
     ELSE finished_at END) VIRTUAL;
ALTER TABLE jobs ADD COLUMN band_k2 INTEGER GENERATED ALWAYS AS
    (CASE state WHEN 0 THEN run_at ELSE 0 END) VIRTUAL;
DROP INDEX jobs_ready;
DROP INDEX jobs_scheduled;
DROP INDEX jobs_running;
DROP INDEX jobs_finished;
DROP INDEX jobs_waiting;
CREATE INDEX jobs_bands ON jobs (queue, band, band_k1, band_k2, id, state);
";

/// v14: a key's head (its last token and limit, at token -1) and its
/// slots (at their tokens, from 0 up) in one table, so that a grant, which
/// writes both, dirties one page instead of two: measured on the lease
/// pair, 27.2 µs against 23.2 µs for the same SQL (BENCHMARKS.md). The
/// old tables are dropped, not kept: a process of an older build that has
/// the file open fails its next lease transaction (no such table) rather
/// than granting from a copy nobody else reads.
const V14_LEASE_ROWS: &str = "
CREATE TABLE lease_rows (
    key TEXT NOT NULL,
    token INTEGER NOT NULL,
    holder BLOB,
    label TEXT,
    expires_at INTEGER,
    last_token INTEGER,
    lease_limit INTEGER,
    PRIMARY KEY (key, token)
) WITHOUT ROWID;
INSERT INTO lease_rows (key, token, last_token, lease_limit)
    SELECT key, -1, last_token, lease_limit FROM leases;
INSERT INTO lease_rows (key, token, holder, label, expires_at)
    SELECT key, token, holder, label, expires_at FROM lease_slots;
DROP TABLE lease_slots;
DROP TABLE leases;
";

/// v13: dependencies. A job's named jobs (`after_ids`, comma-separated),
/// whether it runs after any ending, how many it still waits for, and
/// whether any job waits for it; the edges by parent; the waiting state
/// (6), which the terminal jobs' index (3 to 5) leaves out and the live
/// unique keys' index takes in.
const V13_DEPENDENCIES: &str = "
ALTER TABLE jobs ADD COLUMN after_ids TEXT;
ALTER TABLE jobs ADD COLUMN after_any INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN waiting_on INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN has_children INTEGER NOT NULL DEFAULT 0;
CREATE TABLE job_deps (parent INTEGER NOT NULL, child INTEGER NOT NULL, PRIMARY KEY (parent, child)) WITHOUT ROWID;
DROP INDEX jobs_finished;
CREATE INDEX jobs_finished ON jobs (queue, finished_at, id, state) WHERE state >= 3 AND state <= 5;
DROP INDEX jobs_unique;
CREATE INDEX jobs_unique ON jobs (queue, unique_key) WHERE (state <= 2 OR state = 6) AND unique_key IS NOT NULL;
CREATE INDEX jobs_waiting ON jobs (queue, id) WHERE state = 6;
";

/// v9: rate limits. A queue's rates (NULL: none) and one row per rate
/// bucket: the queue's own (key `''`) or a concurrency key's, with the
/// instants of its newest starts (8 little-endian bytes each) and when
/// its parked jobs wake (`rates_wake` finds the due ones).
const V9_RATES: &str = "
ALTER TABLE queues ADD COLUMN rate_count INTEGER;
ALTER TABLE queues ADD COLUMN rate_ms INTEGER;
ALTER TABLE queues ADD COLUMN key_rate_count INTEGER;
ALTER TABLE queues ADD COLUMN key_rate_ms INTEGER;
CREATE TABLE rates (queue TEXT NOT NULL, key TEXT NOT NULL, starts BLOB NOT NULL,
  wake_at INTEGER, PRIMARY KEY (queue, key)) WITHOUT ROWID;
CREATE INDEX rates_wake ON rates (queue, wake_at) WHERE wake_at IS NOT NULL;
";

/// v8: one index of ready jobs again, parked or not second in its key:
/// a claim reads the unparked ones in claim order (`parked = 0`), counts
/// read them all, and a queue that never parks pays for one index as
/// before v6 (v6's second index, `jobs_claim`, cost every job a write).
const V8_ONE_READY_INDEX: &str = "
DROP INDEX IF EXISTS jobs_claim;
DROP INDEX IF EXISTS jobs_ready;
CREATE INDEX jobs_ready ON jobs (queue, parked, priority DESC, run_at, id) WHERE state = 0;
";

/// v6: concurrency limits. A job's concurrency key and whether a claim
/// parked it (its key was full); a queue's limits (NULL: none). A freed
/// slot finds its key's best parked job (`jobs_parked`). (Its
/// `jobs_claim`, for claims, is replaced in v8.)
const V6_LIMITS: &str = "
ALTER TABLE jobs ADD COLUMN conc_key TEXT;
ALTER TABLE jobs ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queues ADD COLUMN concurrency INTEGER;
ALTER TABLE queues ADD COLUMN per_key INTEGER;
CREATE INDEX jobs_claim ON jobs (queue, priority DESC, run_at, id) WHERE state = 0 AND parked = 0;
CREATE INDEX jobs_parked ON jobs (queue, conc_key, priority DESC, run_at, id) WHERE state = 0 AND parked = 1;
";

/// v4: schedules (periodic jobs), one row per queue and name; `next_at`
/// is the cursor of the next tick (wall clock, Unix ms).
const V4_SCHEDULES: &str = "
CREATE TABLE schedules (
    queue TEXT NOT NULL,
    name TEXT NOT NULL,
    rule TEXT NOT NULL,
    payload BLOB NOT NULL,
    priority INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    missed TEXT NOT NULL,
    next_at INTEGER NOT NULL,
    PRIMARY KEY (queue, name)
) WITHOUT ROWID;
";

/// The schema's version, the application id and the number of schema
/// objects, read in one statement: one snapshot, so a racing process's
/// migration is seen whole or not at all (read apart, a new file could
/// show its tables but not yet its application id, and pass for foreign).
fn inspect(conn: &Connection) -> rusqlite::Result<(i64, i64, i64)> {
    conn.query_row(
        "SELECT (SELECT user_version FROM pragma_user_version),
                (SELECT application_id FROM pragma_application_id),
                (SELECT count(*) FROM sqlite_master)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
}

/// Whether a database at `version` with `app` and `tables` needs
/// migrating (`Ok(true)`), is current (`Ok(false)`), or is refused.
fn verdict(shown: &str, (version, app, tables): (i64, i64, i64)) -> Result<bool> {
    if app != APPLICATION_ID && (tables > 0 || version != 0) {
        return Err(Error::store(
            format!("opening {shown}"),
            format!("not a leasehold database (application_id {app:#x}, {tables} schema objects); left untouched"),
        ));
    }
    if version > SCHEMA_VERSION {
        return Err(Error::store(
            format!("opening {shown}"),
            format!("written by a newer leasehold (schema version {version}; this build knows up to {SCHEMA_VERSION}); left untouched"),
        ));
    }
    Ok(version < SCHEMA_VERSION)
}

/// Create the schema in a new database; refuse foreign or newer ones.
pub(super) fn check_schema(conn: &Connection, shown: &str) -> Result<()> {
    let seen =
        inspect(conn).map_err(|e| sql_err(|| format!("reading the schema of {shown}"), e))?;
    if verdict(shown, seen)? {
        migrate(conn, shown)?;
    }
    Ok(())
}

/// Create or upgrade the schema once, even if many processes race: the
/// checks run again under the write lock, on what the winner left.
fn migrate(conn: &Connection, shown: &str) -> Result<()> {
    let ctx = || format!("migrating the schema of {shown}");
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| sql_err(ctx, e))?;
    let result = (|| {
        let seen = inspect(conn).map_err(|e| sql_err(ctx, e))?;
        if !verdict(shown, seen)? {
            return Ok(());
        }
        let run = |sql: &str| conn.execute_batch(sql).map_err(|e| sql_err(ctx, e));
        for sql in MIGRATIONS.iter().skip(usize::try_from(seen.0).unwrap_or(0)) {
            run(sql)?;
        }
        run(&format!(
            "PRAGMA application_id={APPLICATION_ID}; PRAGMA user_version={SCHEMA_VERSION};"
        ))
    })();
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = conn.execute_batch(end).map_err(|e| sql_err(ctx, e));
    if !conn.is_autocommit() {
        // A COMMIT refused (BUSY) leaves the transaction open: end it, so
        // the caller's retry starts from a clean connection.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result.and(ended)
}

/// The clock state kept in `leasehold_meta`, if the database has any.
fn read_saved(conn: &Connection) -> rusqlite::Result<Option<Saved>> {
    let get = |name: &str| -> rusqlite::Result<Option<String>> {
        conn.query_row(
            "SELECT value FROM leasehold_meta WHERE name = ?1",
            [name],
            |r| r.get(0),
        )
        .optional()
    };
    let boot_id = get("boot_id")?;
    let high = get("high_water_ms")?;
    if boot_id.is_none() && high.is_none() {
        return Ok(None);
    }
    Ok(Some(Saved {
        boot_id: boot_id.unwrap_or_default(),
        offset_ms: get("clock_offset_ms")?
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        high_water_ms: high.and_then(|s| s.parse().ok()).unwrap_or(0),
    }))
}

/// Settle this handle's store clock on `boot` ([`boottime`]'s rule),
/// storing a new offset when the boot changed.
pub(super) fn open_clock(
    conn: &Connection,
    clock: Arc<dyn Clock>,
    boot: &str,
    shown: &str,
) -> Result<StoreClock> {
    let ctx = || format!("reading the clock state of {shown}");
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| sql_err(ctx, e))?;
    let result = (|| -> rusqlite::Result<(i64, u64)> {
        let saved = read_saved(conn)?;
        let (offset, store) = boottime::rebase(saved.as_ref(), boot, clock.now_ms());
        if store {
            let set = "INSERT INTO leasehold_meta (name, value) VALUES (?1, ?2)
                       ON CONFLICT(name) DO UPDATE SET value = excluded.value";
            conn.execute(set, params!["boot_id", boot])?;
            conn.execute(set, params!["clock_offset_ms", offset.to_string()])?;
        }
        Ok((offset, saved.map_or(0, |s| s.high_water_ms)))
    })();
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = conn.execute_batch(end);
    let (offset, high) = result.map_err(|e| sql_err(ctx, e))?;
    ended.map_err(|e| sql_err(ctx, e))?;
    Ok(StoreClock::new(clock, offset, high))
}

/// Record the clock's high water (kept if a higher one is stored).
pub(super) fn write_high_water(conn: &Connection, now_ms: u64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO leasehold_meta (name, value) VALUES ('high_water_ms', ?1)
         ON CONFLICT(name) DO UPDATE SET value = excluded.value
         WHERE CAST(value AS INTEGER) < CAST(excluded.value AS INTEGER)",
    )
    .and_then(|mut s| s.execute([now_ms.to_string()]))
    .map(|_| ())
    .map_err(|e| sql_err(|| "recording the clock".to_owned(), e))
}

/// The migration marks kept in `leasehold_meta` ([`crate::store::marks`]).
pub(super) fn read_marks(conn: &Connection, shown: &str) -> Result<crate::store::Marks> {
    use crate::store::marks::{MOVED_TO, MOVING_FROM};
    let mut marks = crate::store::Marks::default();
    let read = || -> rusqlite::Result<Vec<(String, String)>> {
        let mut stmt =
            conn.prepare_cached("SELECT name, value FROM leasehold_meta WHERE name IN (?1, ?2)")?;
        let rows = stmt.query_map([MOVED_TO, MOVING_FROM], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    };
    let rows =
        read().map_err(|e| sql_err(|| format!("reading the migration marks of {shown}"), e))?;
    for (name, value) in rows {
        marks.set(&name, value);
    }
    Ok(marks)
}

/// Replace the migration marks, in one transaction.
pub(super) fn write_marks(
    conn: &Connection,
    shown: &str,
    marks: &crate::store::Marks,
) -> Result<()> {
    let ctx = || format!("writing the migration marks of {shown}");
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| sql_err(ctx, e))?;
    let result = (|| -> rusqlite::Result<()> {
        for (name, value) in marks.entries() {
            match value {
                Some(v) => conn.execute(
                    "INSERT INTO leasehold_meta (name, value) VALUES (?1, ?2)
                     ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                    params![name, v],
                )?,
                None => conn.execute("DELETE FROM leasehold_meta WHERE name = ?1", [name])?,
            };
        }
        Ok(())
    })();
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = conn.execute_batch(end);
    result.map_err(|e| sql_err(ctx, e))?;
    ended.map_err(|e| sql_err(ctx, e))
}
