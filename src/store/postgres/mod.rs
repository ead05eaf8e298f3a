//! The PostgreSQL store: leases and jobs shared by many machines.
//!
//! # Design
//! - **Time is the database's.** Each transaction reads `clock_timestamp()`
//!   once, in the same round trip as its `BEGIN`, and the rules compare and
//!   compute every expiry with that instant, so machines whose clocks
//!   disagree still agree on who holds what. A handle never hands out a
//!   time below one it handed out before. (A holder's own validity deadline
//!   still runs on its local monotonic clock, in the client layer.) The
//!   server's clock should be slewed, not stepped: a step forward ends
//!   leases early on the store's clock (holders still stop at their local
//!   deadline and stale tokens are fenced), a step back lengthens them.
//! - **Row locks serialize the rules.** A lease row is read `FOR UPDATE`;
//!   a key nobody has held yet is inserted at commit, and a concurrent
//!   first grant of the same key fails that insert (unique violation,
//!   retried) instead of granting twice. Job scans take their rows
//!   `FOR UPDATE SKIP LOCKED`, so concurrent claimers never wait on each
//!   other and never see the same job; a single job is read `FOR UPDATE`.
//!   Transactions run at READ COMMITTED: every decision is made on rows the
//!   transaction has locked, so it cannot be based on a stale read.
//! - **Few round trips.** Reads are cached in the transaction (a scanned
//!   row is not read again). Writes wait for the commit and travel with it:
//!   one script of literal statements ending in `COMMIT`, one round trip
//!   (a batch of claims is one `UPDATE ... FROM (VALUES ...)`). A queue's
//!   expired and due scans travel together, with the ready scan of a claim
//!   the rules announced ([`Txn::will_claim`]). So a claim is three round
//!   trips (BEGIN with the clock; the scans; the writes with COMMIT), and so
//!   is a complete (BEGIN; the job's row; the writes with COMMIT). A pending
//!   write is flushed before any query that could see it. Literals are
//!   rendered with `standard_conforming_strings` on: text quoted with its
//!   quotes doubled, bytes in hex, numbers by Rust.
//! - **Indexes match the scans**: one partial index per job state, ordered
//!   as the scan orders, so claim cost does not grow with finished jobs.
//! - **Wake-ups**: a transaction that frees a lease slot or makes a job
//!   ready sends `pg_notify` on the schema's channel; a listener thread per
//!   store handle (started on the first wait, with its own connection)
//!   wakes blocked acquirers and idle workers. Polling stays the fallback.
//! - **Errors**: serialization failures, deadlocks, lock timeouts, unique
//!   violations (two first grants of one key) and lost connections are
//!   transient; the client retries them with jittered backoff up to its
//!   deadline. If the session is lost while the COMMIT script is in flight,
//!   the error is ambiguous: the caller cannot know whether it happened (a
//!   claim that did is recovered when its lease expires). An error the
//!   server reports on a live session means nothing was committed. A broken
//!   connection is discarded and replaced on next use.
//! - **Sessions** set `lock_timeout` (a wait on a row lock ends as a
//!   transient error) and `idle_in_transaction_session_timeout` (a process
//!   paused in the middle of a transaction loses its session and its locks).
//! - **Connections**: a small pool per store handle (threads sharing a
//!   handle each get a connection). Used in a forked child the store returns
//!   [`Error::Forked`]; dropped there, it leaks its connections instead of
//!   closing the parent's sockets.
//! - **Versioned migrations** in their own schema (default `leasehold`),
//!   applied under a transaction-scoped advisory lock, so many processes may
//!   start at once. A schema from a newer version, or a schema that holds
//!   other tables and no leasehold marker, is refused and left untouched.

use crate::clock::Clock;
use crate::core::{
    Claim, JobId, JobQuery, JobRecord, JobState, JobTxn, LeaseRecord, LeaseSlot, Pending,
    StateCounts, Txn,
};
use crate::error::{Error, Result, StoreFailure};
use crate::fork::ForkGuard;
use crate::store::{holder_bytes, holder_from, i64_of, u64_of, LeaseCache, Store, Wake};
use crate::sync::{lock, thread, AtomicU64, Condvar, Mutex, Ordering};
use crate::Holder;
use fallible_iterator::FallibleIterator;
use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, Config, NoTls, Row, SimpleQueryMessage, Statement};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// First key of the advisory lock held while migrating ("LSHD").
const ADVISORY_CLASS: i32 = 0x4C53_4844;

/// The longest schema name: the notification channel
/// (`leasehold_<schema>`) must fit PostgreSQL's 63-byte identifiers.
const MAX_SCHEMA_BYTES: usize = 48;

/// Migrations, in order: `MIGRATIONS[i]` brings a schema from version `i`
/// to `i + 1`. `{s}` is the quoted schema name.
const MIGRATIONS: [&str; 2] = [
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
];

/// Options of [`PostgresStore::open_with`]. The URL's `schema=` and
/// `pool_size=` parameters, when present, override `schema` and
/// `max_connections`.
#[derive(Clone)]
pub struct PostgresOptions {
    /// The schema holding leasehold's tables (created if missing).
    pub schema: String,
    /// Connections this handle opens at most (threads sharing the handle
    /// each take one for the length of a transaction).
    pub max_connections: usize,
    /// How long a thread waits for a free connection before a transient error.
    pub pool_wait: Duration,
    /// `lock_timeout` of every session: a row-lock wait longer than this
    /// ends as a transient error.
    pub lock_timeout: Duration,
    /// `idle_in_transaction_session_timeout`: a client that stalls inside a
    /// transaction (a paused process) loses its session and its locks.
    pub idle_in_transaction_timeout: Duration,
    /// Replaces the database clock (tests use a manual clock for exact
    /// boundaries). `None`: `clock_timestamp()` of the server.
    pub clock: Option<Arc<dyn Clock>>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            schema: "leasehold".to_owned(),
            max_connections: 16,
            pool_wait: Duration::from_secs(5),
            lock_timeout: Duration::from_secs(2),
            idle_in_transaction_timeout: Duration::from_secs(10),
            clock: None,
        }
    }
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("clock", &self.clock.as_ref().map(|_| "injected"))
            .finish_non_exhaustive()
    }
}

/// Split leasehold's own parameters (`schema`, `pool_size`) off a
/// `postgres://` URL; the rest goes to the driver.
fn split_url(url: &str, opts: &mut PostgresOptions) -> Result<String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok(url.to_owned());
    };
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "schema" => opts.schema = value.to_owned(),
            "pool_size" => {
                opts.max_connections = value
                    .parse()
                    .ok()
                    .filter(|&n| (1..=1024).contains(&n))
                    .ok_or_else(|| {
                        Error::invalid("store", format!("pool_size={value:?}: expected 1..=1024"))
                    })?;
            }
            _ => rest.push(pair),
        }
    }
    Ok(if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    })
}

/// Check a schema name: lowercase letters, digits and `_`, not starting
/// with a digit, at most [`MAX_SCHEMA_BYTES`].
fn check_schema_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SCHEMA_BYTES
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "schema",
            format!("{name:?}: use 1 to {MAX_SCHEMA_BYTES} lowercase letters, digits or _, not starting with a digit"),
        ))
    }
}

/// Every statement, prepared once per connection.
struct Statements {
    lease_get: Statement,
    job_get: Statement,
    next_id: Statement,
    live_unique: Statement,
    scan_maintenance: Statement,
    scan_maintenance_ready: Statement,
    scan_finished: Statement,
    scan_retrying: Statement,
    counts: Statement,
    list: Statement,
}

const COLUMNS: &str = "id, queue, payload, priority, run_at, created_at, max_attempts, attempts, expiries, last_token, state, claim_holder, claim_token, lease_until, cancel_requested, last_error, unique_key, finished_at";

impl Statements {
    fn prepare(client: &mut Client, s: &str) -> std::result::Result<Statements, postgres::Error> {
        let mut p = |sql: String| client.prepare(&sql.replace("{s}", s));
        // The job scans, each on the partial index ordered as it orders;
        // the maintenance statements combine them ($1 queue, $2 now, $3
        // limit, $4 the ready limit).
        let expired = format!(
            "SELECT {COLUMNS} FROM {{s}}.jobs WHERE queue = $1 AND state = 2 AND lease_until <= $2
             ORDER BY lease_until, id LIMIT $3 FOR UPDATE SKIP LOCKED"
        );
        let due = format!(
            "SELECT {COLUMNS} FROM {{s}}.jobs WHERE queue = $1 AND state = 1 AND run_at <= $2
             ORDER BY run_at, id LIMIT $3 FOR UPDATE SKIP LOCKED"
        );
        let ready = |limit: &str| {
            format!(
                "SELECT {COLUMNS} FROM {{s}}.jobs WHERE queue = $1 AND state = 0
                 ORDER BY priority DESC, run_at, id LIMIT {limit} FOR UPDATE SKIP LOCKED"
            )
        };
        Ok(Statements {
            lease_get: p("SELECT last_token, tokens, holders, labels, expires, lease_limit FROM {s}.leases WHERE key = $1 FOR UPDATE".into())?,
            job_get: p(format!("SELECT {COLUMNS} FROM {{s}}.jobs WHERE id = $1 FOR UPDATE"))?,
            next_id: p("SELECT nextval('{s}.job_ids')".into())?,
            live_unique: p("SELECT id FROM {s}.jobs WHERE queue = $1 AND unique_key = $2 AND state <= 2 LIMIT 1".into())?,
            scan_maintenance: p(format!(
                "WITH e AS ({expired}), d AS ({due}) SELECT * FROM e UNION ALL SELECT * FROM d"
            ))?,
            scan_maintenance_ready: p(format!(
                "WITH e AS ({expired}), d AS ({due}), r AS ({})
                 SELECT * FROM e UNION ALL SELECT * FROM d UNION ALL SELECT * FROM r",
                ready("$4")
            ))?,
            scan_finished: p(
                "SELECT id FROM {s}.jobs WHERE queue = $1 AND state >= 3 AND finished_at <= $2
                 ORDER BY finished_at, id LIMIT $3 FOR UPDATE SKIP LOCKED".into(),
            )?,
            scan_retrying: p(
                "SELECT id FROM {s}.jobs WHERE queue = $1 AND state = 1 AND attempts > 0
                 ORDER BY run_at, id LIMIT $2".into(),
            )?,
            counts: p("SELECT
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 0),
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 1),
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 2),
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 3),
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 4),
                 (SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = 5)".into())?,
            list: p(format!(
                "SELECT {COLUMNS} FROM {{s}}.jobs WHERE queue = $1 AND id > $2 AND ($3::int2 < 0 OR state = $3::int2)
                 ORDER BY id LIMIT $4"
            ))?,
        })
    }
}

/// One pooled connection and its prepared statements.
struct Conn {
    client: Client,
    st: Statements,
}

#[derive(Default)]
struct Pool {
    idle: Vec<Conn>,
    /// Connections open (idle or in use).
    open: usize,
}

/// Wake-up counters fed by the listener thread.
#[derive(Default)]
struct Listener {
    state: Mutex<ListenState>,
    changed: Condvar,
}

#[derive(Default)]
struct ListenState {
    epochs: [u64; 2],
    started: bool,
    stop: bool,
}

/// The PostgreSQL [`Store`].
pub struct PostgresStore {
    config: Config,
    shown: String,
    /// The quoted schema name.
    schema: String,
    channel: String,
    opts: PostgresOptions,
    pool: Mutex<Pool>,
    pool_freed: Condvar,
    fork: ForkGuard,
    /// Highest store time this handle handed out.
    high_water_ms: AtomicU64,
    listener: Arc<Listener>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.shown)
            .finish_non_exhaustive()
    }
}

/// What a failed statement means for the connection and the caller.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Before COMMIT was sent: the transaction did not happen.
    Work,
    /// During COMMIT: it may have happened.
    Commit,
}

/// Map a driver error to a typed store error. Returns the error and
/// whether the connection must be discarded.
fn pg_err(context: impl Into<String>, e: postgres::Error, stage: Stage) -> Error {
    let code = e.code();
    let transient_code = code.is_some_and(|c| {
        [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::LOCK_NOT_AVAILABLE,
            SqlState::UNIQUE_VIOLATION,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
            SqlState::QUERY_CANCELED,
        ]
        .contains(c)
            || c.code().starts_with("08")
            || c.code().starts_with("57P")
    });
    // No code: the connection failed (closed, I/O) or the client refused
    // a value before sending it (not transient).
    let connection_lost = code.is_none()
        && (e.is_closed()
            || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>()));
    let transient = transient_code || connection_lost;
    // Whether the session ended (rather than the server refusing the
    // statement and staying connected, which means nothing was committed).
    // (An idle-in-transaction or idle-session timeout ends the session
    // before it reads the COMMIT: certainly not committed.)
    let session_lost = connection_lost
        || code.is_some_and(|c| {
            (c.code().starts_with("57P") && *c != SqlState::IDLE_SESSION_TIMEOUT)
                || c.code().starts_with("08")
        });
    let ambiguous = stage == Stage::Commit && session_lost;
    let failure = if ambiguous {
        StoreFailure::Ambiguous
    } else if transient {
        StoreFailure::Transient
    } else {
        StoreFailure::Permanent
    };
    Error::from_source(context, failure, PgError(e))
}

/// The driver's error, shown with what it hides: the SQLSTATE of a server
/// error, or the cause (connection refused, timed out) of a generic
/// "error connecting to server". It stays the source of the store error.
#[derive(Debug)]
struct PgError(postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(f, "{} (SQLSTATE {})", db.message(), db.code().code()),
            None => match std::error::Error::source(&self.0) {
                Some(cause) => write!(f, "{}: {cause}", self.0),
                None => write!(f, "{}", self.0),
            },
        }
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// The connection settings without the password, for messages.
fn describe_config(config: &Config, schema: &str) -> String {
    use postgres::config::Host;
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432u16)))
        .map(|(h, p)| match h {
            Host::Tcp(name) => format!("{name}:{p}"),
            Host::Unix(path) => format!("{}:{p}", path.display()),
        })
        .collect();
    format!(
        "postgres://{}@{}/{} (schema {schema})",
        config.get_user().unwrap_or(""),
        hosts.join(","),
        config.get_dbname().unwrap_or("")
    )
}

fn ms_setting(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

impl PostgresStore {
    /// Connect to `url` (`postgres://user@host:port/db?schema=NAME&pool_size=N`,
    /// plus any parameter the driver knows) with default options, creating
    /// or migrating the schema.
    pub fn open(url: &str) -> Result<Self> {
        Self::open_with(url, PostgresOptions::default())
    }

    /// [`PostgresStore::open`] with options.
    pub fn open_with(url: &str, mut opts: PostgresOptions) -> Result<Self> {
        let driver_url = split_url(url, &mut opts)?;
        check_schema_name(&opts.schema)?;
        if opts.max_connections == 0 {
            return Err(Error::invalid("max_connections", "must be at least 1"));
        }
        let mut config: Config = driver_url.parse().map_err(|e: postgres::Error| {
            Error::invalid("store", format!("not a PostgreSQL URL: {e}"))
        })?;
        if config.get_application_name().is_none() {
            config.application_name("leasehold");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        let shown = describe_config(&config, &opts.schema);
        let store = PostgresStore {
            schema: format!("\"{}\"", opts.schema),
            channel: format!("leasehold_{}", opts.schema),
            config,
            shown,
            opts,
            pool: Mutex::new(Pool::default()),
            pool_freed: Condvar::new(),
            fork: ForkGuard::new(),
            high_water_ms: AtomicU64::new(0),
            listener: Arc::new(Listener::default()),
        };
        let mut client = store.connect_raw()?;
        store.migrate(&mut client)?;
        let conn = store.prepare(client)?;
        let mut pool = lock(&store.pool);
        pool.idle.push(conn);
        pool.open = 1;
        drop(pool);
        Ok(store)
    }

    /// The schema's name (unquoted).
    pub fn schema(&self) -> &str {
        &self.opts.schema
    }

    fn connect_raw(&self) -> Result<Client> {
        let mut client = self
            .config
            .connect(NoTls)
            .map_err(|e| pg_err(format!("connecting to {}", self.shown), e, Stage::Work))?;
        client
            .batch_execute(&format!(
                "SET lock_timeout = '{}'; SET idle_in_transaction_session_timeout = '{}';
                 SET standard_conforming_strings = on",
                ms_setting(self.opts.lock_timeout),
                ms_setting(self.opts.idle_in_transaction_timeout)
            ))
            .map_err(|e| {
                pg_err(
                    format!("configuring a session on {}", self.shown),
                    e,
                    Stage::Work,
                )
            })?;
        Ok(client)
    }

    fn prepare(&self, mut client: Client) -> Result<Conn> {
        let st = Statements::prepare(&mut client, &self.schema).map_err(|e| {
            pg_err(
                format!("preparing statements on {}", self.shown),
                e,
                Stage::Work,
            )
        })?;
        Ok(Conn { client, st })
    }

    /// Create or upgrade the schema, once, whoever else starts at the same time.
    fn migrate(&self, client: &mut Client) -> Result<()> {
        let ctx = || format!("migrating schema {} on {}", self.opts.schema, self.shown);
        let fail = |e: postgres::Error| pg_err(ctx(), e, Stage::Work);
        let mut tx = client.transaction().map_err(fail)?;
        tx.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            &[&ADVISORY_CLASS, &self.opts.schema],
        )
        .map_err(fail)?;
        let row = tx
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL,
                        (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                          WHERE n.nspname = $2)",
                &[&format!("{}.leasehold_meta", self.schema), &self.opts.schema],
            )
            .map_err(fail)?;
        let (has_meta, objects): (bool, i64) = (row.get(0), row.get(1));
        let version: i64 = if has_meta {
            let v: Option<String> = tx
                .query_opt(
                    &format!(
                        "SELECT value FROM {}.leasehold_meta WHERE name = 'schema_version'",
                        self.schema
                    ),
                    &[],
                )
                .map_err(fail)?
                .map(|r| r.get(0));
            v.and_then(|v| v.parse().ok()).ok_or_else(|| {
                Error::store(
                    ctx(),
                    "leasehold_meta has no valid schema_version; left untouched",
                )
            })?
        } else if objects > 0 {
            return Err(Error::store(
                ctx(),
                format!("schema {} holds {objects} objects but is not a leasehold schema; left untouched (choose another with ?schema=NAME)", self.opts.schema),
            ));
        } else {
            0
        };
        if version > SCHEMA_VERSION {
            return Err(Error::store(
                ctx(),
                format!("written by a newer leasehold (schema version {version}; this build knows up to {SCHEMA_VERSION}); left untouched"),
            ));
        }
        if version == 0 {
            tx.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {s};
                 CREATE TABLE {s}.leasehold_meta (name text PRIMARY KEY, value text NOT NULL);
                 INSERT INTO {s}.leasehold_meta VALUES ('schema_version', '0');",
                s = self.schema
            ))
            .map_err(fail)?;
        }
        for (from, sql) in MIGRATIONS
            .iter()
            .enumerate()
            .skip(usize::try_from(version).unwrap_or(0))
        {
            tx.batch_execute(&sql.replace("{s}", &self.schema))
                .map_err(fail)?;
            tx.execute(
                &format!(
                    "UPDATE {}.leasehold_meta SET value = $1 WHERE name = 'schema_version'",
                    self.schema
                ),
                &[&(from as i64 + 1).to_string()],
            )
            .map_err(fail)?;
        }
        tx.commit().map_err(fail)
    }

    /// A connection from the pool, a new one, or (all in use) the first
    /// one returned within `pool_wait`.
    fn checkout(&self) -> Result<Conn> {
        let mut pool = lock(&self.pool);
        let mut waited = Duration::ZERO;
        loop {
            if let Some(conn) = pool.idle.pop() {
                return Ok(conn);
            }
            if pool.open < self.opts.max_connections {
                pool.open += 1;
                drop(pool);
                let conn = self.connect_raw().and_then(|c| self.prepare(c));
                if conn.is_err() {
                    lock(&self.pool).open -= 1;
                    self.pool_freed.notify_one();
                }
                return conn;
            }
            if waited >= self.opts.pool_wait {
                return Err(Error::transient(
                    format!("taking a connection to {}", self.shown),
                    format!(
                        "all {} connections of this handle are in use",
                        self.opts.max_connections
                    ),
                ));
            }
            let step = Duration::from_millis(50);
            pool = match self.pool_freed.wait_timeout(pool, step) {
                Ok((p, _)) => p,
                Err(poisoned) => poisoned.into_inner().0,
            };
            waited += step;
        }
    }

    /// Return a connection to the pool, or drop it if it broke.
    fn checkin(&self, conn: Conn, broken: bool) {
        let mut pool = lock(&self.pool);
        if broken || conn.client.is_closed() {
            pool.open -= 1;
            drop(pool);
            drop(conn);
        } else {
            pool.idle.push(conn);
        }
        self.pool_freed.notify_one();
    }

    /// BEGIN and read the clock in one round trip.
    fn begin(&self, conn: &mut Conn) -> Result<u64> {
        let fail = |e: postgres::Error| {
            pg_err(
                format!("beginning a transaction on {}", self.shown),
                e,
                Stage::Work,
            )
        };
        let now = match &self.opts.clock {
            Some(clock) => {
                conn.client.batch_execute("BEGIN").map_err(fail)?;
                clock.now_ms()
            }
            None => {
                let msgs = conn
                    .client
                    .simple_query(
                        "BEGIN; SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8",
                    )
                    .map_err(fail)?;
                msgs.iter()
                    .find_map(|m| match m {
                        SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse::<u64>().ok()),
                        _ => None,
                    })
                    .ok_or_else(|| {
                        Error::store(
                            format!("reading the clock of {}", self.shown),
                            "clock_timestamp() returned no usable value",
                        )
                    })?
            }
        };
        let prev = self.high_water_ms.fetch_max(now, Ordering::SeqCst);
        Ok(now.max(prev))
    }

    fn run(&self, conn: &mut Conn, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()> {
        let now_ms = self.begin(conn).inspect_err(|_| {
            // Never hand a session with an open (aborted) transaction back
            // to the pool.
            let _ = conn.client.batch_execute("ROLLBACK");
        })?;
        let mut tx = PgTxn {
            conn: &mut *conn,
            schema: &self.schema,
            now_ms,
            leases: LeaseCache::default(),
            jobs: HashMap::new(),
            pending: Vec::new(),
            deleted: Vec::new(),
            woke: [false; 2],
        };
        let script = f(&mut tx).and_then(|()| tx.commit_script(&self.channel));
        match script {
            // The writes and COMMIT in one round trip.
            Ok(script) => conn.client.batch_execute(&script).map_err(|e| {
                let e = pg_err(format!("committing to {}", self.shown), e, Stage::Commit);
                if !e.is_ambiguous() {
                    let _ = conn.client.batch_execute("ROLLBACK");
                }
                e
            }),
            Err(e) => {
                let _ = conn.client.batch_execute("ROLLBACK");
                Err(e)
            }
        }
    }

    /// Start the listener thread once.
    fn start_listener(&self) {
        let mut st = lock(&self.listener.state);
        if st.started || !self.fork.is_origin() {
            return;
        }
        st.started = true;
        drop(st);
        let listener = self.listener.clone();
        let config = self.config.clone();
        let channel = self.channel.clone();
        let spawned = thread::Builder::new()
            .name("leasehold-pg-listen".into())
            .spawn(move || listen(&listener, &config, &channel));
        if spawned.is_err() {
            lock(&self.listener.state).started = false;
        }
    }
}

/// The listener thread: LISTEN on the schema's channel and bump the epoch
/// each notification names; reconnect after a failure (bumping every epoch,
/// since notifications may have been missed).
fn listen(listener: &Listener, config: &Config, channel: &str) {
    let bump = |which: Option<usize>| {
        let mut st = lock(&listener.state);
        for (i, epoch) in st.epochs.iter_mut().enumerate() {
            if which.is_none_or(|w| w == i) {
                *epoch = epoch.wrapping_add(1);
            }
        }
        drop(st);
        listener.changed.notify_all();
    };
    let stopped = || lock(&listener.state).stop;
    while !stopped() {
        let client = config.connect(NoTls).and_then(|mut c| {
            c.batch_execute(&format!("LISTEN \"{channel}\""))?;
            Ok(c)
        });
        let Ok(mut client) = client else {
            crate::sync::sleep(Duration::from_millis(500));
            continue;
        };
        bump(None);
        while !stopped() {
            let next = {
                let mut notes = client.notifications();
                let next = notes.timeout_iter(Duration::from_millis(250)).next();
                next
            };
            match next {
                Ok(Some(n)) => bump(n.payload().parse::<usize>().ok().filter(|&w| w < 2)),
                Ok(None) if !client.is_closed() => {}
                _ => break,
            }
        }
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        lock(&self.listener.state).stop = true;
        let idle = std::mem::take(&mut lock(&self.pool).idle);
        if self.fork.is_origin_strict() {
            drop(idle);
        } else {
            // A forked child must not close (or talk on) its parent's sockets.
            std::mem::forget(idle);
        }
    }
}

impl Store for PostgresStore {
    fn transact(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()> {
        self.fork.check()?;
        let mut out = Checkout {
            store: self,
            conn: Some(self.checkout()?),
        };
        let result = match out.conn.as_mut() {
            Some(conn) => self.run(conn, f),
            None => Err(Error::store("running a transaction", "no connection")),
        };
        if let Some(mut conn) = out.conn.take() {
            // After a store error, keep the connection only if it still works.
            let broken = matches!(result, Err(Error::Store { .. }))
                && conn.client.is_valid(Duration::from_secs(1)).is_err();
            self.checkin(conn, broken);
        }
        result
    }

    fn describe(&self) -> String {
        self.shown.clone()
    }

    fn epoch(&self, wake: Wake) -> u64 {
        lock(&self.listener.state).epochs[wake as usize]
    }

    /// The listener (and its connection) starts with the first wait, so a
    /// handle that never waits never opens it.
    fn wait_epoch(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        self.start_listener();
        let st = lock(&self.listener.state);
        if st.epochs[wake as usize] != epoch {
            return true;
        }
        let (st, _) = match self.listener.changed.wait_timeout(st, timeout) {
            Ok(pair) => pair,
            Err(poisoned) => poisoned.into_inner(),
        };
        st.epochs[wake as usize] != epoch
    }
}

/// A connection taken from the pool. If the transaction panics, the
/// connection (in the middle of a transaction) is closed, not reused.
struct Checkout<'s> {
    store: &'s PostgresStore,
    conn: Option<Conn>,
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            lock(&self.store.pool).open -= 1;
            self.store.pool_freed.notify_one();
            drop(conn);
        }
    }
}

/// A job row locked (or created) in this transaction.
struct CachedJob {
    record: JobRecord,
    /// The row exists in the database (else it is inserted at flush).
    in_db: bool,
    /// State as last written to the database (or read).
    db_state: Option<JobState>,
}

struct PgTxn<'c> {
    conn: &'c mut Conn,
    /// The quoted schema name.
    schema: &'c str,
    now_ms: u64,
    leases: LeaseCache,
    jobs: HashMap<JobId, CachedJob>,
    /// Jobs written since the last flush, in order.
    pending: Vec<JobId>,
    deleted: Vec<JobId>,
    /// The [`Wake`] events this transaction causes.
    woke: [bool; 2],
}

/// A job from a row of [`COLUMNS`]; a state code no state has is an error
/// naming the row (never guessed).
fn job_from_row(r: &Row) -> Result<JobRecord> {
    let (mut job, code) = decode_job(r).map_err(|e| pg_err("decoding a job", e, Stage::Work))?;
    job.state = JobState::from_code(i64::from(code)).ok_or_else(|| {
        Error::store(
            format!("reading job {}", job.id),
            format!("state code {code} is unknown to this build (written by a newer leasehold?)"),
        )
    })?;
    Ok(job)
}

/// The row's fields, and its state code (the state is set by the caller).
fn decode_job(r: &Row) -> std::result::Result<(JobRecord, i16), postgres::Error> {
    let state_code: i16 = r.try_get(10)?;
    let state = JobState::Ready;
    let claim = match (
        r.try_get::<_, Option<Vec<u8>>>(11)?,
        r.try_get::<_, Option<i64>>(12)?,
        r.try_get::<_, Option<i64>>(13)?,
    ) {
        (Some(h), Some(t), Some(u)) => Some(Claim {
            holder: holder_from(&h),
            token: u64_of(t),
            lease_until_ms: u64_of(u),
        }),
        _ => None,
    };
    let u32_of = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
    let payload: Vec<u8> = r.try_get(2)?;
    let job = JobRecord {
        id: JobId(u64_of(r.try_get(0)?)),
        queue: Arc::from(r.try_get::<_, &str>(1)?),
        payload: Arc::from(payload),
        priority: r.try_get(3)?,
        run_at_ms: u64_of(r.try_get(4)?),
        created_at_ms: u64_of(r.try_get(5)?),
        max_attempts: u32_of(r.try_get(6)?),
        attempts: u32_of(r.try_get(7)?),
        expiries: u32_of(r.try_get(8)?),
        last_token: u64_of(r.try_get(9)?),
        state,
        claim,
        cancel_requested: r.try_get(14)?,
        last_error: r.try_get::<_, Option<&str>>(15)?.map(Arc::from),
        unique_key: r.try_get::<_, Option<&str>>(16)?.map(Arc::from),
        finished_at_ms: r.try_get::<_, Option<i64>>(17)?.map(u64_of),
    };
    Ok((job, state_code))
}

/// SQL text with literal values, for the writes of a flush: all of them,
/// and the COMMIT, travel in one simple-query round trip. Sessions run with
/// `standard_conforming_strings = on`, so inside `'...'` only the quote is
/// special (and doubled); bytes are hex; numbers are formatted by Rust. A
/// NUL (which the core never lets through, and PostgreSQL text cannot hold)
/// is refused rather than sent.
struct Sql(String);

impl Sql {
    fn raw(&mut self, text: &str) -> &mut Self {
        self.0.push_str(text);
        self
    }

    fn text(&mut self, field: &'static str, text: &str) -> Result<&mut Self> {
        if text.contains('\0') {
            return Err(Error::invalid(field, "contains a NUL byte"));
        }
        self.0.reserve(text.len() + 2);
        self.0.push('\'');
        for c in text.chars() {
            if c == '\'' {
                self.0.push('\'');
            }
            self.0.push(c);
        }
        self.0.push('\'');
        Ok(self)
    }

    fn opt_text(&mut self, field: &'static str, text: Option<&str>) -> Result<&mut Self> {
        match text {
            Some(t) => self.text(field, t),
            None => Ok(self.raw("NULL")),
        }
    }

    fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        use std::fmt::Write;
        self.0.reserve(bytes.len() * 2 + 12);
        self.0.push_str("'\\x");
        for b in bytes {
            let _ = write!(self.0, "{b:02x}");
        }
        self.raw("'::bytea")
    }

    fn int(&mut self, field: &'static str, v: u64) -> Result<&mut Self> {
        use std::fmt::Write;
        let _ = write!(self.0, "{}", i64_of(field, v)?);
        Ok(self)
    }

    fn opt_int(&mut self, field: &'static str, v: Option<u64>) -> Result<&mut Self> {
        match v {
            Some(v) => self.int(field, v),
            None => Ok(self.raw("NULL")),
        }
    }

    /// The fields of `job` that can change after it is created, in the
    /// order of [`UPDATE_FIELDS`], typed (the first row of a VALUES list
    /// sets the column types).
    fn job_changes(&mut self, job: &JobRecord) -> Result<&mut Self> {
        let claim = job.claim;
        self.raw("(")
            .int("id", job.id.0)?
            .raw("::int8, ")
            // Parenthesized: `::` binds tighter than unary minus.
            .raw(&format!("({})::int4, ", job.priority))
            .int("run_at", job.run_at_ms)?
            .raw("::int8, ")
            .int("max_attempts", job.max_attempts.into())?
            .raw("::int8, ")
            .int("attempts", job.attempts.into())?
            .raw("::int8, ")
            .int("expiries", job.expiries.into())?
            .raw("::int8, ")
            .int("token", job.last_token)?
            .raw("::int8, ")
            .raw(&job.state.code().to_string())
            .raw("::int2, ");
        match claim {
            Some(c) => self.bytes(&holder_bytes(c.holder)),
            None => self.raw("NULL::bytea"),
        };
        self.raw(", ")
            .opt_int("token", claim.map(|c| c.token))?
            .raw("::int8, ")
            .opt_int("lease_until", claim.map(|c| c.lease_until_ms))?
            .raw("::int8, ")
            .raw(if job.cancel_requested {
                "true"
            } else {
                "false"
            })
            .raw(", ")
            .opt_text("last_error", job.last_error.as_deref())?
            .raw("::text, ")
            .opt_int("finished_at", job.finished_at_ms)?
            .raw("::int8)");
        Ok(self)
    }

    /// A whole new job row, in the order of [`COLUMNS`].
    fn job_row(&mut self, job: &JobRecord) -> Result<&mut Self> {
        let claim = job.claim;
        self.raw("(")
            .int("id", job.id.0)?
            .raw(", ")
            .text("queue", &job.queue)?
            .raw(", ")
            .bytes(&job.payload)
            .raw(&format!(", {}, ", job.priority))
            .int("run_at", job.run_at_ms)?
            .raw(", ")
            .int("created_at", job.created_at_ms)?
            .raw(&format!(
                ", {}, {}, {}, ",
                job.max_attempts, job.attempts, job.expiries
            ))
            .int("token", job.last_token)?
            .raw(&format!(", {}, ", job.state.code()));
        match claim {
            Some(c) => self.bytes(&holder_bytes(c.holder)),
            None => self.raw("NULL"),
        };
        self.raw(", ")
            .opt_int("token", claim.map(|c| c.token))?
            .raw(", ")
            .opt_int("lease_until", claim.map(|c| c.lease_until_ms))?
            .raw(if job.cancel_requested {
                ", true, "
            } else {
                ", false, "
            })
            .opt_text("last_error", job.last_error.as_deref())?
            .raw(", ")
            .opt_text("unique_key", job.unique_key.as_deref())?
            .raw(", ")
            .opt_int("finished_at", job.finished_at_ms)?
            .raw(")");
        Ok(self)
    }

    /// A lease record's columns after its key: last token and slot arrays.
    fn lease(&mut self, r: &LeaseRecord) -> Result<&mut Self> {
        self.int("token", r.last_token)?.raw(", ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .int("token", slot.token)?;
        }
        self.raw("]::int8[], ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .bytes(&holder_bytes(slot.holder.id));
        }
        self.raw("]::bytea[], ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .opt_text("holder label", slot.holder.label.as_deref())?;
        }
        self.raw("]::text[], ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .int("expires_at", slot.expires_at_ms)?;
        }
        Ok(self.raw(&format!("]::int8[], {}", r.limit)))
    }
}

/// The columns [`Sql::job_changes`] writes.
const UPDATE_FIELDS: &str = "id, priority, run_at, max_attempts, attempts, expiries, last_token, state, claim_holder, claim_token, lease_until, cancel_requested, last_error, finished_at";

fn ctx_key(what: &str, key: &str) -> String {
    format!("{what} lease {key:?}")
}

/// One UPDATE for `jobs` (rows read in this transaction): by key for one
/// row (it plans fastest), else one statement joining a VALUES list.
fn render_updates(sql: &mut Sql, schema: &str, jobs: &[&CachedJob]) -> Result<()> {
    match jobs {
        [] => Ok(()),
        [one] => {
            sql.raw("UPDATE ")
                .raw(schema)
                .raw(".jobs SET (")
                .raw(UPDATE_FIELDS)
                .raw(") = ")
                .job_changes(&one.record)?
                .raw(" WHERE id = ")
                .int("id", one.record.id.0)?
                .raw(";\n");
            Ok(())
        }
        many => {
            sql.raw("UPDATE ").raw(schema).raw(".jobs AS j SET priority = u.priority, run_at = u.run_at, max_attempts = u.max_attempts, attempts = u.attempts, expiries = u.expiries, last_token = u.last_token, state = u.state, claim_holder = u.claim_holder, claim_token = u.claim_token, lease_until = u.lease_until, cancel_requested = u.cancel_requested, last_error = u.last_error, finished_at = u.finished_at FROM (VALUES ");
            for (i, c) in many.iter().enumerate() {
                sql.raw(if i == 0 { "" } else { ",\n" });
                sql.job_changes(&c.record)?;
            }
            sql.raw(") AS u(")
                .raw(UPDATE_FIELDS)
                .raw(") WHERE j.id = u.id;\n");
            Ok(())
        }
    }
}

impl PgTxn<'_> {
    /// Render the pending job writes (deletes, then updates, then inserts)
    /// into `sql`; returns whether there were any.
    fn render_jobs(&mut self, sql: &mut Sql, schema: &str) -> Result<bool> {
        let mut any = false;
        if !self.deleted.is_empty() {
            sql.raw("DELETE FROM ")
                .raw(schema)
                .raw(".jobs WHERE id IN (");
            for (i, id) in self.deleted.iter().enumerate() {
                sql.raw(if i == 0 { "" } else { ", " }).int("id", id.0)?;
            }
            sql.raw(");\n");
            any = true;
        }
        // Rows that leave the live range of the unique-key index (a job
        // that reached a terminal state) are written in a statement before
        // the others: a row entering it (a retried job taking back its key)
        // must not meet the row leaving it inside one multi-row UPDATE,
        // whose order is unspecified.
        let in_db: Vec<&CachedJob> = self
            .pending
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(|c| c.in_db)
            .collect();
        let (leaving, staying): (Vec<&CachedJob>, Vec<&CachedJob>) = in_db
            .into_iter()
            .partition(|c| c.record.state.is_terminal());
        let updates = leaving.len() + staying.len();
        for group in [leaving, staying] {
            render_updates(sql, schema, &group)?;
        }
        let mut inserts = 0;
        for id in &self.pending {
            let Some(c) = self.jobs.get(id) else { continue };
            if !c.in_db {
                if inserts == 0 {
                    sql.raw("INSERT INTO ")
                        .raw(schema)
                        .raw(".jobs (")
                        .raw(COLUMNS)
                        .raw(") VALUES ");
                } else {
                    sql.raw(",\n");
                }
                sql.job_row(&c.record)?;
                inserts += 1;
            }
        }
        if inserts > 0 {
            sql.raw(";\n");
        }
        Ok(any || updates + inserts > 0)
    }

    /// Mark every pending job write as done.
    fn jobs_flushed(&mut self) {
        self.deleted.clear();
        for id in std::mem::take(&mut self.pending) {
            if let Some(c) = self.jobs.get_mut(&id) {
                c.in_db = true;
                c.db_state = Some(c.record.state);
            }
        }
    }

    /// Send the pending job writes before a query that could see them.
    fn flush_jobs(&mut self) -> Result<()> {
        let mut sql = Sql(String::new());
        let schema = self.schema;
        if !self.render_jobs(&mut sql, schema)? {
            return Ok(());
        }
        self.conn
            .client
            .batch_execute(&sql.0)
            .map_err(|e| pg_err("writing jobs", e, Stage::Work))?;
        self.jobs_flushed();
        Ok(())
    }

    /// Everything this transaction changed, the notifications and COMMIT,
    /// as one script.
    fn commit_script(&mut self, channel: &str) -> Result<String> {
        let mut sql = Sql(String::with_capacity(512));
        let schema = self.schema;
        self.render_jobs(&mut sql, schema)?;
        for c in self.leases.changed() {
            if c.original.is_some() {
                sql.raw("UPDATE ")
                    .raw(schema)
                    .raw(".leases SET (last_token, tokens, holders, labels, expires, lease_limit) = (")
                    .lease(&c.record)?
                    .raw(") WHERE key = ")
                    .text("key", &c.key)?
                    .raw(";\n");
            } else {
                sql.raw("INSERT INTO ")
                    .raw(schema)
                    .raw(".leases (key, last_token, tokens, holders, labels, expires, lease_limit) VALUES (")
                    .text("key", &c.key)?
                    .raw(", ")
                    .lease(&c.record)?
                    .raw(");\n");
            }
        }
        for wake in [Wake::LeaseFreed, Wake::JobReady] {
            if self.woke[wake as usize] {
                sql.raw("SELECT pg_notify(")
                    .text("channel", channel)?
                    .raw(&format!(", '{}');\n", wake as u8));
            }
        }
        sql.raw("COMMIT");
        Ok(sql.0)
    }

    fn load_lease(&mut self, key: &str) -> Result<Option<LeaseRecord>> {
        let row = self
            .conn
            .client
            .query_opt(&self.conn.st.lease_get, &[&key])
            .map_err(|e| pg_err(ctx_key("reading", key), e, Stage::Work))?;
        let Some(row) = row else { return Ok(None) };
        let decode = || -> std::result::Result<LeaseRecord, postgres::Error> {
            let tokens: Vec<i64> = row.try_get(1)?;
            let holders: Vec<Vec<u8>> = row.try_get(2)?;
            let labels: Vec<Option<String>> = row.try_get(3)?;
            let expires: Vec<i64> = row.try_get(4)?;
            let slots = tokens
                .iter()
                .zip(&holders)
                .zip(labels)
                .zip(&expires)
                .map(|(((&t, h), label), &e)| LeaseSlot {
                    token: u64_of(t),
                    holder: Holder {
                        id: holder_from(h),
                        label: label.map(|l| Arc::from(l.as_str())),
                    },
                    expires_at_ms: u64_of(e),
                })
                .collect();
            Ok(LeaseRecord {
                last_token: u64_of(row.try_get(0)?),
                limit: u32::try_from(row.try_get::<_, i32>(5)?).unwrap_or(0),
                slots,
            })
        };
        decode()
            .map(Some)
            .map_err(|e| pg_err(ctx_key("decoding", key), e, Stage::Work))
    }

    /// Cache rows a locking query returned; their ids are appended to `out`.
    fn absorb(&mut self, rows: &[Row], out: &mut Vec<JobId>) -> Result<()> {
        for row in rows {
            let job = job_from_row(row)?;
            out.push(job.id);
            let state = job.state;
            self.jobs.insert(
                job.id,
                CachedJob {
                    record: job,
                    in_db: true,
                    db_state: Some(state),
                },
            );
        }
        Ok(())
    }

    fn query(
        &mut self,
        what: &str,
        stmt: fn(&Statements) -> &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let Conn { client, st } = &mut *self.conn;
        client
            .query(stmt(st), params)
            .map_err(|e| pg_err(what.to_owned(), e, Stage::Work))
    }
}

impl Txn for PgTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn lease_mut(&mut self, key: &str, create: bool) -> Result<Option<&mut LeaseRecord>> {
        if !self.leases.contains(key) {
            let loaded = self.load_lease(key)?;
            if !self.leases.add(key, loaded, create) {
                return Ok(None);
            }
        }
        Ok(self.leases.get_mut(key))
    }

    fn wake(&mut self, wake: Wake) {
        self.woke[wake.index()] = true;
    }

    fn jobs(&mut self) -> Result<&mut dyn JobTxn> {
        Ok(self)
    }
}

impl JobTxn for PgTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn wake(&mut self, wake: Wake) {
        self.woke[wake.index()] = true;
    }

    fn next_job_id(&mut self) -> Result<JobId> {
        let row = self
            .conn
            .client
            .query_one(&self.conn.st.next_id, &[])
            .map_err(|e| pg_err("allocating a job id", e, Stage::Work))?;
        Ok(JobId(u64_of(row.get(0))))
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
            &[&i64_of("id", id.0)?],
        )?;
        let mut ids = Vec::new();
        self.absorb(&rows, &mut ids)?;
        Ok(self.jobs.get(&id).map(|c| c.record.clone()))
    }

    fn jobs_by_id(&mut self, ids: &[JobId]) -> Result<Vec<JobRecord>> {
        let mut jobs = Vec::with_capacity(ids.len());
        for &id in ids {
            jobs.extend(self.job(id)?);
        }
        Ok(jobs)
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

    fn delete_job(&mut self, id: JobId) -> Result<()> {
        self.pending.retain(|&p| p != id);
        match self.jobs.remove(&id) {
            Some(c) if !c.in_db => {}
            _ => self.deleted.push(id),
        }
        Ok(())
    }

    fn live_unique(&mut self, queue: &str, unique_key: &str) -> Result<Option<JobId>> {
        self.flush_jobs()?;
        let rows = self.query(
            &format!("looking up unique key {unique_key:?} in queue {queue:?}"),
            |st| &st.live_unique,
            &[&queue, &unique_key],
        )?;
        Ok(rows.first().map(|r| JobId(u64_of(r.get(0)))))
    }

    /// One round trip: the expired, due and (when asked) ready scans of
    /// the queue together, each locking its rows `FOR UPDATE SKIP LOCKED`.
    fn pending(&mut self, queue: &str, now_ms: u64, chunk: usize, ready: usize) -> Result<Pending> {
        self.flush_jobs()?;
        let what = format!("reading queue {queue:?}");
        let at = i64_of("now", now_ms)?;
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
        let mut ids = Vec::new();
        self.absorb(&rows, &mut ids)?;
        let mut read = Pending::default();
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
                let at = i64_of("cutoff", cutoff_ms)?;
                self.query(&what, |st| &st.scan_finished, &[&queue, &at, &n])?
            }
            JobQuery::Retrying => self.query(&what, |st| &st.scan_retrying, &[&queue, &n])?,
        };
        out.extend(rows.iter().map(|r| JobId(u64_of(r.get(0)))));
        Ok(())
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
        let after = i64_of("after", after.0)?;
        let state = state.map_or(-1i16, |s| i16::from(s.code()));
        let rows = self.query(
            &format!("listing queue {queue:?}"),
            |st| &st.list,
            &[&queue, &after, &state, &limit],
        )?;
        rows.iter().map(job_from_row).collect()
    }
}
