//! Versioned migrations in their own schema, applied under a
//! transaction-scoped advisory lock so that many processes may start at
//! once. A schema from a newer version, or one that holds other objects and
//! no leasehold marker, is refused and left untouched.

use super::error::{pg_err, Stage};
use super::push_in::push_function;
use crate::error::{Error, Result};
use postgres::{Client, Transaction};

/// Schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// First key of the advisory lock held while migrating ("LSHD").
pub(super) const ADVISORY_CLASS: i32 = 0x4C53_4844;

/// Migrations, in order: `MIGRATIONS[i]` brings a schema from version `i`
/// to `i + 1`. `{s}` is the quoted schema name.
const MIGRATIONS: [&str; 16] = [
    "
CREATE TABLE {s}.leases (
    key text PRIMARY KEY,
    last_token int8 NOT NULL,
    tokens int8[] NOT NULL,
    holders bytea[] NOT NULL,
    labels text[] NOT NULL,
    expires int8[] NOT NULL
);
CREATE SEQUENCE {s}.job_ids AS int8 MINVALUE 1;
CREATE TABLE {s}.jobs (
    id int8 PRIMARY KEY,
    queue text NOT NULL,
    payload bytea NOT NULL,
    priority int4 NOT NULL,
    run_at int8 NOT NULL,
    created_at int8 NOT NULL,
    max_attempts int8 NOT NULL,
    attempts int8 NOT NULL,
    expiries int8 NOT NULL,
    last_token int8 NOT NULL,
    state int2 NOT NULL,
    claim_holder bytea,
    claim_token int8,
    lease_until int8,
    cancel_requested bool NOT NULL,
    last_error text,
    unique_key text,
    finished_at int8
);
CREATE INDEX jobs_ready ON {s}.jobs (queue, priority DESC, run_at, id) WHERE state = 0;
CREATE INDEX jobs_scheduled ON {s}.jobs (queue, run_at, id) WHERE state = 1;
CREATE INDEX jobs_running ON {s}.jobs (queue, lease_until, id) WHERE state = 2;
CREATE INDEX jobs_finished ON {s}.jobs (queue, finished_at, id, state) WHERE state >= 3;
CREATE UNIQUE INDEX jobs_unique ON {s}.jobs (queue, unique_key)
    WHERE state <= 2 AND unique_key IS NOT NULL;
",
    // v2: a counting lease's limit belongs to the key (0: not recorded);
    // retries waiting out their backoff, for the drain rule.
    "ALTER TABLE {s}.leases ADD COLUMN lease_limit int4 NOT NULL DEFAULT 0;
 CREATE INDEX jobs_retrying ON {s}.jobs (queue, run_at, id) WHERE state = 1 AND attempts > 0;",
    // v3: what a job's handler returned when it completed.
    "ALTER TABLE {s}.jobs ADD COLUMN result bytea;",
    V4_SCHEDULES,
    // v5: a queue's flow-control settings (absent: the defaults).
    "CREATE TABLE {s}.queues (queue text PRIMARY KEY, paused bool NOT NULL);",
    V6_LIMITS,
    // v7: a job's run-time limit and its current claim's deadline.
    "ALTER TABLE {s}.jobs ADD COLUMN timeout_ms int8, ADD COLUMN claim_deadline int8;",
    // v8: one index of ready jobs again, parked or not second in its key:
    // a claim reads the unparked ones in claim order, counts read them all,
    // and a queue that never parks pays for one index as before v6 (v6's
    // `jobs_claim` cost every job a second write).
    "DROP INDEX IF EXISTS {s}.jobs_claim;
     DROP INDEX IF EXISTS {s}.jobs_ready;
     CREATE INDEX jobs_ready ON {s}.jobs (queue, parked, priority DESC, run_at, id) WHERE state = 0;",
    V9_RATES,
    // v10: each rate bucket's newest start, so that `purge` finds the
    // buckets no window counts any more.
    "ALTER TABLE {s}.rates ADD COLUMN newest int8 NOT NULL DEFAULT 0;
     CREATE INDEX rates_idle ON {s}.rates (queue, newest) WHERE wake_at IS NULL;",
    // v11: uniqueness by period and states. Several live jobs may share a
    // key now (a spec may block on fewer states), so the live jobs' index
    // is no longer unique (pushes take an advisory lock on the key
    // instead), and every job with a key is indexed by when it was pushed.
    "DROP INDEX {s}.jobs_unique;
     CREATE INDEX jobs_unique ON {s}.jobs (queue, unique_key) WHERE state <= 2 AND unique_key IS NOT NULL;
     CREATE INDEX jobs_unique_all ON {s}.jobs (queue, unique_key, created_at) WHERE unique_key IS NOT NULL;",
    // v12: `push`, the enqueue rule as a function any transaction may call
    // (`push_in.rs`).
    PUSH_FUNCTION,
    // v13: what a running job's handler last reported (ten-thousandths
    // done, a message).
    "ALTER TABLE {s}.jobs ADD COLUMN progress int4, ADD COLUMN progress_msg text;",
    V14_DEPENDENCIES,
    // v15: `txn_meta`, what every transaction reads at BEGIN (the
    // migration marks, the failover fence and the server's timeline); and
    // `push` refuses a moved schema (re-created below).
    META_FUNCTION,
    // v16: `push` announces a delayed job too (idle workers sleep until
    // the queue's next change by time, and learn of it from the note).
    PUSH_FUNCTION,
];

/// Stands for the text of `meta::meta_function` in [`MIGRATIONS`].
const META_FUNCTION: &str = "{meta_function}";

/// v14: dependencies. A job's named jobs (`after_ids`, comma-separated),
/// whether it runs after any ending, how many it still waits for, and
/// whether any job waits for it; the edges by parent; the waiting state
/// (6), which the terminal jobs' index (3 to 5) leaves out and the live
/// unique keys' index takes in.
const V14_DEPENDENCIES: &str = "
ALTER TABLE {s}.jobs ADD COLUMN after_ids text, ADD COLUMN after_any bool NOT NULL DEFAULT false,
    ADD COLUMN waiting_on int4 NOT NULL DEFAULT 0, ADD COLUMN has_children bool NOT NULL DEFAULT false;
CREATE TABLE {s}.job_deps (parent int8 NOT NULL, child int8 NOT NULL, PRIMARY KEY (parent, child));
DROP INDEX {s}.jobs_finished;
CREATE INDEX jobs_finished ON {s}.jobs (queue, finished_at, id, state) WHERE state >= 3 AND state <= 5;
DROP INDEX {s}.jobs_unique;
CREATE INDEX jobs_unique ON {s}.jobs (queue, unique_key) WHERE (state <= 2 OR state = 6) AND unique_key IS NOT NULL;
CREATE INDEX jobs_waiting ON {s}.jobs (queue, id) WHERE state = 6;
";

/// Stands for the text of [`push_function`] in [`MIGRATIONS`].
const PUSH_FUNCTION: &str = "{push_function}";

/// v9: rate limits. A queue's rates (NULL: none) and one row per rate
/// bucket: the queue's own (key `''`) or a concurrency key's, with the
/// instants of its newest starts (8 little-endian bytes each) and when
/// its parked jobs wake (`rates_wake` finds the due ones).
const V9_RATES: &str = "
ALTER TABLE {s}.queues ADD COLUMN rate_count int4, ADD COLUMN rate_ms int8,
    ADD COLUMN key_rate_count int4, ADD COLUMN key_rate_ms int8;
CREATE TABLE {s}.rates (queue text NOT NULL, key text NOT NULL, starts bytea NOT NULL,
    wake_at int8, PRIMARY KEY (queue, key));
CREATE INDEX rates_wake ON {s}.rates (queue, wake_at) WHERE wake_at IS NOT NULL;
";

/// v6: concurrency limits. A job's concurrency key and whether a claim
/// parked it (its key was full); a queue's limits (NULL: none). A freed
/// slot finds its key's best parked job (`jobs_parked`). (Its
/// `jobs_claim`, for claims, is replaced in v8.)
const V6_LIMITS: &str = "
ALTER TABLE {s}.jobs ADD COLUMN conc_key text, ADD COLUMN parked bool NOT NULL DEFAULT false;
ALTER TABLE {s}.queues ADD COLUMN concurrency int4, ADD COLUMN per_key int4;
CREATE INDEX jobs_claim ON {s}.jobs (queue, priority DESC, run_at, id) WHERE state = 0 AND NOT parked;
CREATE INDEX jobs_parked ON {s}.jobs (queue, conc_key, priority DESC, run_at, id)
    WHERE state = 0 AND parked;
";

/// v4: schedules (periodic jobs), one row per queue and name; `next_at`
/// is the cursor of the next tick (wall clock, Unix ms).
const V4_SCHEDULES: &str = "
CREATE TABLE {s}.schedules (
    queue text NOT NULL,
    name text NOT NULL,
    rule text NOT NULL,
    payload bytea NOT NULL,
    priority int4 NOT NULL,
    max_attempts int8 NOT NULL,
    missed text NOT NULL,
    next_at int8 NOT NULL,
    PRIMARY KEY (queue, name)
);
";

/// The notification channel of the schema `name` (unquoted).
pub(super) fn channel(name: &str) -> String {
    format!("leasehold_{name}")
}

/// The schema being migrated, for the statements and the messages.
pub(super) struct Target<'a> {
    /// Its name, unquoted.
    pub name: &'a str,
    /// Its name, quoted.
    pub quoted: &'a str,
    /// The server, for messages.
    pub shown: &'a str,
}

impl Target<'_> {
    pub(super) fn context(&self) -> String {
        format!("migrating schema {} on {}", self.name, self.shown)
    }

    pub(super) fn fail(&self, e: postgres::Error) -> Error {
        pg_err(self.context(), e, Stage::Work)
    }
}

/// Create or upgrade the schema, once, whoever else starts at the same time.
pub(super) fn migrate(client: &mut Client, to: &Target<'_>) -> Result<()> {
    let mut tx = client.transaction().map_err(|e| to.fail(e))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&ADVISORY_CLASS, &to.name],
    )
    .map_err(|e| to.fail(e))?;
    let version = current_version(&mut tx, to)?;
    if version > SCHEMA_VERSION {
        return Err(Error::store(
            to.context(),
            format!("written by a newer leasehold (schema version {version}; this build knows up to {SCHEMA_VERSION}); left untouched"),
        ));
    }
    if version == 0 {
        tx.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {s};
             CREATE TABLE {s}.leasehold_meta (name text PRIMARY KEY, value text NOT NULL);
             INSERT INTO {s}.leasehold_meta VALUES ('schema_version', '0');",
            s = to.quoted
        ))
        .map_err(|e| to.fail(e))?;
    }
    for (from, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(version).unwrap_or(0))
    {
        let sql = match *sql {
            PUSH_FUNCTION => push_function(to.quoted, &channel(to.name)),
            META_FUNCTION => super::meta::meta_function(to.quoted),
            sql => sql.replace("{s}", to.quoted),
        };
        tx.batch_execute(&sql).map_err(|e| to.fail(e))?;
        tx.execute(
            &format!(
                "UPDATE {}.leasehold_meta SET value = $1 WHERE name = 'schema_version'",
                to.quoted
            ),
            &[&(from as i64 + 1).to_string()],
        )
        .map_err(|e| to.fail(e))?;
    }
    if (12..SCHEMA_VERSION).contains(&version) {
        // The SQL `push` renders this build's rules (its limits, the state
        // codes): an upgraded schema gets them too.
        let sql = push_function(to.quoted, &channel(to.name));
        tx.batch_execute(&sql).map_err(|e| to.fail(e))?;
    }
    tx.commit().map_err(|e| to.fail(e))
}

/// The schema's version: 0 when it does not exist or is empty; an error
/// when it holds other objects and no leasehold marker, or a marker
/// without a valid version.
fn current_version(tx: &mut Transaction<'_>, to: &Target<'_>) -> Result<i64> {
    let row = tx
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL,
                    (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                      WHERE n.nspname = $2)",
            &[&format!("{}.leasehold_meta", to.quoted), &to.name],
        )
        .map_err(|e| to.fail(e))?;
    let (has_meta, objects): (bool, i64) = (row.get(0), row.get(1));
    if has_meta {
        let v: Option<String> = tx
            .query_opt(
                &format!(
                    "SELECT value FROM {}.leasehold_meta WHERE name = 'schema_version'",
                    to.quoted
                ),
                &[],
            )
            .map_err(|e| to.fail(e))?
            .map(|r| r.get(0));
        v.and_then(|v| v.parse().ok()).ok_or_else(|| {
            Error::store(
                to.context(),
                "leasehold_meta has no valid schema_version; left untouched",
            )
        })
    } else if objects > 0 {
        Err(Error::store(
            to.context(),
            format!("schema {} holds {objects} objects but is not a leasehold schema; left untouched (choose another with ?schema=NAME)", to.name),
        ))
    } else {
        Ok(0)
    }
}
