//! The SQLite store: the embedded default, safe for many processes and
//! threads on one machine.
//!
//! # Design
//! - **One connection per store handle**, behind a mutex: threads of a
//!   process share it safely (no unsynchronized shared session), and SQLite
//!   serializes writers across processes anyway.
//! - **Group commit**: threads that arrive while a transaction runs join
//!   it, each in its own savepoint (a failing one undoes only itself), and
//!   the last one commits for all, so one COMMIT (one WAL append; one fsync
//!   with FULL) carries up to 64 transactions. Each member reads the clock
//!   when its turn comes and returns only after the COMMIT that carries it.
//!   A lone caller pays nothing for this.
//! - **Every transaction begins with `BEGIN IMMEDIATE`**, so a transaction
//!   that will write takes the write lock before it reads: no deferred read
//!   that later upgrades (the source of the double claims and BUSY storms in
//!   the brief's queue report). `SQLITE_BUSY` waits in SQLite's busy handler
//!   up to `busy_timeout`, then surfaces as a transient error that the client
//!   retries with jittered backoff up to its own deadline.
//! - **WAL mode**, checked to have taken effect. `synchronous=NORMAL` by
//!   default: a committed transaction survives a crash of the process; after
//!   a power loss or OS crash the last transactions before the latest WAL
//!   checkpoint may be lost, never half-applied. `FULL` syncs the WAL on
//!   every commit and loses nothing that was acknowledged.
//! - **Indexes match the scans exactly**: one partial index per job state,
//!   ordered as the query orders (`priority DESC, run_at, id` for ready
//!   jobs), so a claim costs O(log n) whatever the number of finished jobs.
//! - **The clock** is the machine's boot-time clock (`CLOCK_BOOTTIME`), the
//!   same for every process on the machine and immune to wall-clock steps.
//!   The database stores the boot id and an offset; on the first open after a
//!   reboot the offset is moved so that store time continues above the
//!   highest instant the database has seen (holders died with the old boot,
//!   so their leases simply run out). Store time never goes backwards.
//! - **Fork**: the store remembers its process. Used in a forked child it
//!   returns [`Error::Forked`]; dropped there, it leaks the connection
//!   instead of closing the parent's file descriptors and locks.
//! - **Versioned schema** in `PRAGMA user_version`, marked with an
//!   `application_id`. A database from a newer version, a foreign SQLite
//!   database or a non-database file gets a clear error and is left
//!   untouched.
//! - **Network filesystems** (NFS, SMB/CIFS, FUSE) are refused: WAL needs
//!   shared memory between the processes of one machine, which they do not
//!   provide. `SqliteOptions::allow_network_fs` overrides, at your risk.

use crate::clock::{boot_id, BootClock, Clock};
use crate::core::{
    Claim, JobId, JobQuery, JobRecord, JobState, JobTxn, LeaseRecord, LeaseSlot, Pending,
    StateCounts, Txn, Wake,
};
use crate::error::{Error, Result, StoreFailure};
use crate::fork::ForkGuard;
use crate::store::{holder_bytes, holder_from, i64_of, u64_of, Epochs, LeaseCache, Store};
use crate::sync::{lock, Condvar, Mutex};
use crate::Holder;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
const MIGRATIONS: [&str; 2] = [
    SCHEMA_V1,
    // v2: a counting lease's limit belongs to the key (0: not recorded);
    // retries waiting out their backoff, for the drain rule.
    "ALTER TABLE leases ADD COLUMN lease_limit INTEGER NOT NULL DEFAULT 0;
     CREATE INDEX jobs_retrying ON jobs (queue, run_at, id) WHERE state = 1 AND attempts > 0;",
];

/// How hard SQLite syncs on commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Survives a process crash; a power loss may lose the last commits.
    #[default]
    Normal,
    /// Survives a power loss: the WAL is synced at every commit.
    Full,
}

/// Options of [`SqliteStore::open_with`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Commit durability.
    pub synchronous: Synchronous,
    /// How long SQLite waits for the write lock before reporting busy.
    pub busy_timeout: Duration,
    /// Open a database on NFS, SMB or FUSE anyway.
    pub allow_network_fs: bool,
    /// The clock (default: [`BootClock`]); tests inject a manual one.
    pub clock: Option<Arc<dyn Clock>>,
    /// The boot id (default: the kernel's); tests inject one to simulate reboots.
    pub boot_id: Option<String>,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Normal,
            busy_timeout: Duration::from_secs(5),
            allow_network_fs: false,
            clock: None,
            boot_id: None,
        }
    }
}

/// The SQLite [`Store`].
pub struct SqliteStore {
    path: PathBuf,
    /// The connection and the group transaction left open on it.
    shared: Mutex<Shared>,
    /// Threads waiting for `shared` inside `transact` (group commit joins
    /// them to an open transaction).
    waiting: AtomicUsize,
    /// Outcomes of committed groups, for members waiting on them.
    committed: Mutex<Committed>,
    committed_cv: Condvar,
    /// Transactions run and COMMITs issued (see [`SqliteStore::group_stats`]).
    stats: [AtomicU64; 2],
    fork: ForkGuard,
    clock: Arc<dyn Clock>,
    offset_ms: i64,
    /// Highest store time handed out by this handle.
    high_water_ms: AtomicU64,
    /// Highest store time known to be persisted in the database.
    persisted_ms: AtomicU64,
    busy_timeout: Duration,
    /// Wake-ups for this process's waiters (other processes poll).
    epochs: Epochs,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Map a SQLite error to a typed store error naming what was being done;
/// the driver's error is kept as the source. Busy and locked are transient.
fn sql_err(context: impl FnOnce() -> String, e: rusqlite::Error) -> Error {
    let failure = if is_busy(&e) {
        StoreFailure::Transient
    } else {
        StoreFailure::Permanent
    };
    let context = match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => format!("{} (not a SQLite database)", context()),
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => {
            format!("{} (the database is corrupt)", context())
        }
        _ => context(),
    };
    Error::from_source(context, failure, e)
}

/// `text` as an SQL string literal. Safe for any text: the only special
/// character inside single quotes is the quote itself, which is doubled
/// (queue names are also checked by the core: no NUL or control characters).
pub fn sql_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

thread_local! {
    /// When the current wait for SQLite's write lock began, and how long it
    /// may last (set per transaction by the thread that holds the store).
    static BUSY: std::cell::Cell<(Option<std::time::Instant>, Duration)> =
        const { std::cell::Cell::new((None, Duration::from_secs(5))) };
}

/// SQLite's busy handler: short jittered sleeps (50 µs growing to 2 ms)
/// instead of SQLite's default of 1 ms and up, so that processes sharing a
/// database hand the write lock over quickly; gives up (SQLITE_BUSY, which
/// the client retries up to its own deadline) after the store's busy timeout.
// Real time is this adapter's business (clippy.toml keeps it out of the core).
#[allow(clippy::disallowed_methods)]
fn busy_wait(count: i32) -> bool {
    BUSY.with(|b| {
        let (start, limit) = b.get();
        let now = std::time::Instant::now();
        let start = match (count, start) {
            (0, _) | (_, None) => now,
            (_, Some(s)) => s,
        };
        b.set((Some(start), limit));
        if now.duration_since(start) >= limit {
            return false;
        }
        let step = u32::try_from(count.clamp(0, 24) / 4).unwrap_or(0);
        let base_us = (50u64 << step).min(2000);
        let seed = start.elapsed().as_nanos() as u64 ^ (count as u64).rotate_left(32);
        let jitter = crate::core::mix64(seed) % (base_us / 2 + 1);
        std::thread::sleep(Duration::from_micros(base_us / 2 + jitter));
        true
    })
}

/// Run a parameterless statement from the statement cache (BEGIN, COMMIT
/// and ROLLBACK would otherwise be parsed again for every transaction).
fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

pub use crate::store::network_fs;

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

impl SqliteStore {
    /// Open (creating if needed) the database at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Open (creating if needed) the database at `path`.
    pub fn open_with(path: impl AsRef<Path>, opts: SqliteOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let shown = path.display().to_string();
        let ctx = |what: &str| format!("{what} {shown}");
        let dir = parent_dir(&path);
        if !dir.is_dir() {
            return Err(Error::store(
                ctx("opening"),
                format!("directory {} does not exist", dir.display()),
            ));
        }
        if let (Some(fs), false) = (network_fs(&dir), opts.allow_network_fs) {
            return Err(Error::store(
                ctx("opening"),
                format!("{} is on {fs}, where SQLite's WAL locking is not safe across processes; use a local disk (or allow_network_fs at your own risk)", dir.display()),
            ));
        }
        BUSY.with(|b| b.set((None, opts.busy_timeout)));
        let mut conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| sql_err(|| ctx("opening"), e))?;
        conn.busy_handler(Some(busy_wait))
            .map_err(|e| sql_err(|| ctx("configuring"), e))?;
        // Room for the scans of many queues (one statement per queue each).
        conn.set_prepared_statement_cache_capacity(256);
        Self::check_schema(&conn, &shown)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(|e| sql_err(|| ctx("enabling WAL on"), e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::store(
                ctx("enabling WAL on"),
                format!("journal mode is {mode:?}, not WAL (is the filesystem able to hold the -wal and -shm files?)"),
            ));
        }
        let sync = match opts.synchronous {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        };
        conn.execute_batch(&format!(
            "PRAGMA synchronous={sync}; PRAGMA foreign_keys=OFF;"
        ))
        .map_err(|e| sql_err(|| ctx("configuring"), e))?;
        let clock = opts.clock.unwrap_or_else(|| Arc::new(BootClock));
        let boot = opts
            .boot_id
            .or_else(boot_id)
            .unwrap_or_else(|| "unknown-boot".to_owned());
        let (offset_ms, high_ms) = Self::init_clock(&conn, &*clock, &boot, &shown)?;
        Ok(SqliteStore {
            path,
            shared: Mutex::new(Shared {
                conn: Some(conn),
                open: None,
                next_seq: 0,
            }),
            waiting: AtomicUsize::new(0),
            committed: Mutex::new(Committed::default()),
            committed_cv: Condvar::new(),
            stats: [AtomicU64::new(0), AtomicU64::new(0)],
            fork: ForkGuard::new(),
            clock,
            offset_ms,
            high_water_ms: AtomicU64::new(high_ms),
            persisted_ms: AtomicU64::new(high_ms),
            busy_timeout: opts.busy_timeout,
            epochs: Epochs::default(),
        })
    }

    /// Group commit at work: (transactions run, COMMITs issued) by this
    /// handle. With threads sharing the handle, transactions exceed commits.
    pub fn group_stats(&self) -> (u64, u64) {
        (
            self.stats[0].load(Ordering::Relaxed),
            self.stats[1].load(Ordering::Relaxed),
        )
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Create the schema in a new database; refuse foreign or newer ones.
    fn check_schema(conn: &Connection, shown: &str) -> Result<()> {
        let ctx = || format!("reading the schema of {shown}");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| sql_err(ctx, e))?;
        let app: i64 = conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(|e| sql_err(ctx, e))?;
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(|e| sql_err(ctx, e))?;
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
        if version == SCHEMA_VERSION {
            return Ok(());
        }
        // Create or upgrade the schema once, even if many processes race:
        // the version is read again under the write lock.
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| sql_err(|| format!("migrating the schema of {shown}"), e))?;
        let result = (|| {
            let v: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            for sql in MIGRATIONS.iter().skip(usize::try_from(v).unwrap_or(0)) {
                conn.execute_batch(sql)?;
            }
            if v < SCHEMA_VERSION {
                conn.execute_batch(&format!(
                    "PRAGMA application_id={APPLICATION_ID}; PRAGMA user_version={SCHEMA_VERSION};"
                ))?;
            }
            Ok(())
        })();
        let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
        let ended = conn.execute_batch(end);
        result
            .and(ended)
            .map_err(|e: rusqlite::Error| sql_err(|| format!("migrating the schema of {shown}"), e))
    }

    /// Settle the offset from the boot-time clock to store time. Returns the
    /// offset and the database's high-water mark.
    fn init_clock(
        conn: &Connection,
        clock: &dyn Clock,
        boot: &str,
        shown: &str,
    ) -> Result<(i64, u64)> {
        let ctx = || format!("reading the clock state of {shown}");
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| sql_err(ctx, e))?;
        let result = (|| -> rusqlite::Result<(i64, u64)> {
            let get = |name: &str| -> rusqlite::Result<Option<String>> {
                conn.query_row(
                    "SELECT value FROM leasehold_meta WHERE name = ?1",
                    [name],
                    |r| r.get(0),
                )
                .optional()
            };
            let stored_boot = get("boot_id")?;
            let offset: i64 = get("clock_offset_ms")?
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let high: u64 = get("high_water_ms")?
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let now = i64::try_from(clock.now_ms()).unwrap_or(i64::MAX);
            if stored_boot.as_deref() == Some(boot) {
                return Ok((offset, high));
            }
            // A new boot (or a new database): continue above the high water.
            let offset = i64::try_from(high)
                .unwrap_or(i64::MAX)
                .saturating_add(1)
                .saturating_sub(now)
                .max(0);
            let set = "INSERT INTO leasehold_meta (name, value) VALUES (?1, ?2)
                       ON CONFLICT(name) DO UPDATE SET value = excluded.value";
            conn.execute(set, params!["boot_id", boot])?;
            conn.execute(set, params!["clock_offset_ms", offset.to_string()])?;
            Ok((offset, high))
        })();
        let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
        let ended = conn.execute_batch(end);
        let (offset, high) = result.map_err(|e| sql_err(ctx, e))?;
        ended.map_err(|e| sql_err(ctx, e))?;
        Ok((offset, high))
    }

    /// Store time now: boot clock plus offset, never below what this handle
    /// already handed out.
    fn now_ms(&self) -> u64 {
        let raw = i64::try_from(self.clock.now_ms())
            .unwrap_or(i64::MAX)
            .saturating_add(self.offset_ms);
        let now = u64::try_from(raw).unwrap_or(0);
        let prev = self.high_water_ms.fetch_max(now, Ordering::SeqCst);
        now.max(prev)
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        let conn = match self.shared.get_mut() {
            Ok(s) => s.conn.take(),
            Err(p) => p.into_inner().conn.take(),
        };
        if let Some(conn) = conn {
            if self.fork.is_origin_strict() {
                drop(conn);
            } else {
                // Closing in a forked child could disturb the parent's locks.
                std::mem::forget(conn);
            }
        }
    }
}

const JOB_COLUMNS: &str = "id, queue, payload, priority, run_at, created_at, max_attempts, attempts, expiries, last_token, state, claim_holder, claim_token, lease_until, cancel_requested, last_error, unique_key, finished_at";

/// A stored state code; an unknown one is an error naming the row.
fn state_of(id: i64, code: i64) -> rusqlite::Result<JobState> {
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

fn job_from_row(r: &Row<'_>) -> rusqlite::Result<JobRecord> {
    job_from_row_at(r, 0)
}

/// A job from [`JOB_COLUMNS`] starting at column `at`.
fn job_from_row_at(r: &Row<'_>, at: usize) -> rusqlite::Result<JobRecord> {
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
    })
}

/// The indexed reads: expired, due and ready jobs (for [`JobTxn::pending`]),
/// then the retrying and finished scans. Each has its state as a literal
/// so SQLite picks the matching partial index, whose order is exactly the
/// ORDER BY, and streams rows in that order; the time bound is checked on
/// each row (`bound` column) and reading stops at the first row past it. A
/// bound parameter in the SQL would make SQLite (built with STAT4)
/// re-prepare the statement on every call as `now` changes. `{queue}` is
/// replaced by the queue as a literal ([`sql_quote`]) and `{limit}` by the
/// limit: bound as parameters, either one makes SQLite re-prepare these
/// statements on every execution (measured: a fifth of a claim's cost).
/// The statement cache keeps one per queue and limit.
pub const SCAN_SQL: [&str; 5] = [
    "SELECT lease_until, {cols} FROM jobs WHERE queue = {queue} AND state = 2 ORDER BY lease_until, id LIMIT {limit}",
    "SELECT run_at, {cols} FROM jobs WHERE queue = {queue} AND state = 1 ORDER BY run_at, id LIMIT {limit}",
    "SELECT 0, {cols} FROM jobs WHERE queue = {queue} AND state = 0 ORDER BY priority DESC, run_at, id LIMIT {limit}",
    "SELECT finished_at, id FROM jobs WHERE queue = {queue} AND state >= 3 ORDER BY finished_at, id LIMIT {limit}",
    "SELECT 0, id FROM jobs WHERE queue = {queue} AND state = 1 AND attempts > 0 ORDER BY run_at, id LIMIT {limit}",
];

struct SqlTxn<'c> {
    conn: &'c Connection,
    now_ms: u64,
    leases: LeaseCache,
    /// Jobs read in this transaction: writing one back updates only the
    /// columns that can change (never the payload).
    loaded: Vec<JobId>,
    /// The [`Wake`] events this member raised (delivered with its group).
    woke: [bool; 2],
}

fn ctx_key(what: &str, key: &str) -> String {
    format!("{what} lease {key:?}")
}

impl SqlTxn<'_> {
    fn err<'a>(&self, what: &'a str) -> impl FnOnce(rusqlite::Error) -> Error + 'a {
        move |e| sql_err(|| what.to_owned(), e)
    }

    fn load_lease(&self, key: &str) -> Result<Option<LeaseRecord>> {
        let head: Option<(i64, i64)> = self
            .conn
            .prepare_cached("SELECT last_token, lease_limit FROM leases WHERE key = ?1")
            .and_then(|mut s| {
                s.query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(|e| sql_err(|| ctx_key("reading", key), e))?;
        let Some((last, limit)) = head else {
            return Ok(None);
        };
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT token, holder, label, expires_at FROM lease_slots WHERE key = ?1 ORDER BY token",
            )
            .map_err(|e| sql_err(|| ctx_key("reading", key), e))?;
        let slots = stmt
            .query_map([key], |r| {
                let label: Option<String> = r.get(2)?;
                Ok(LeaseSlot {
                    token: u64_of(r.get(0)?),
                    holder: Holder {
                        id: holder_from(&r.get::<_, Vec<u8>>(1)?),
                        label: label.map(|l| Arc::from(l.as_str())),
                    },
                    expires_at_ms: u64_of(r.get(3)?),
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| sql_err(|| ctx_key("reading", key), e))?;
        Ok(Some(LeaseRecord {
            last_token: u64_of(last),
            limit: u32::try_from(limit).unwrap_or(0),
            slots,
        }))
    }

    /// Write back every lease record this transaction changed.
    fn flush(&mut self) -> Result<()> {
        for c in self.leases.changed() {
            let key = c.key.as_str();
            let fail = |e| sql_err(|| ctx_key("writing", key), e);
            let last = i64_of("token", c.record.last_token)?;
            self.conn
                .prepare_cached(
                    "INSERT INTO leases (key, last_token, lease_limit) VALUES (?1, ?2, ?3)
                     ON CONFLICT(key) DO UPDATE SET last_token = excluded.last_token,
                                                    lease_limit = excluded.lease_limit",
                )
                .and_then(|mut s| s.execute(params![key, last, c.record.limit]))
                .map_err(fail)?;
            self.conn
                .prepare_cached("DELETE FROM lease_slots WHERE key = ?1")
                .and_then(|mut s| s.execute([key]))
                .map_err(fail)?;
            let mut insert = self
                .conn
                .prepare_cached(
                    "INSERT INTO lease_slots (key, token, holder, label, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(fail)?;
            for s in &c.record.slots {
                insert
                    .execute(params![
                        key,
                        i64_of("token", s.token)?,
                        &holder_bytes(s.holder.id)[..],
                        s.holder.label.as_deref(),
                        i64_of("expires_at", s.expires_at_ms)?,
                    ])
                    .map_err(fail)?;
            }
        }
        Ok(())
    }
}

/// A job's fields as the database stores them (integers checked to fit).
struct JobRow {
    id: i64,
    run_at: i64,
    created: i64,
    last_token: i64,
    holder: Option<Vec<u8>>,
    token: Option<i64>,
    until: Option<i64>,
    finished: Option<i64>,
}

impl JobRow {
    fn of(job: &JobRecord) -> Result<JobRow> {
        let claim = job.claim;
        Ok(JobRow {
            id: i64_of("id", job.id.0)?,
            run_at: i64_of("run_at", job.run_at_ms)?,
            created: i64_of("created_at", job.created_at_ms)?,
            last_token: i64_of("token", job.last_token)?,
            holder: claim.map(|c| holder_bytes(c.holder).to_vec()),
            token: claim.map(|c| i64_of("token", c.token)).transpose()?,
            until: claim
                .map(|c| i64_of("lease_until", c.lease_until_ms))
                .transpose()?,
            finished: job
                .finished_at_ms
                .map(|f| i64_of("finished_at", f))
                .transpose()?,
        })
    }
}

impl SqlTxn<'_> {
    /// Write back a job read in this transaction: only what can change.
    fn update_job(&mut self, job: &JobRecord) -> Result<()> {
        let JobRow {
            id,
            run_at,
            last_token,
            holder,
            token,
            until,
            finished,
            ..
        } = JobRow::of(job)?;
        self.conn
            .prepare_cached(
                "UPDATE jobs SET priority = ?2, run_at = ?3, max_attempts = ?4, attempts = ?5,
                   expiries = ?6, last_token = ?7, state = ?8, claim_holder = ?9,
                   claim_token = ?10, lease_until = ?11, cancel_requested = ?12,
                   last_error = ?13, finished_at = ?14
                 WHERE id = ?1",
            )
            .and_then(|mut s| {
                s.execute(params![
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
                ])
            })
            .map(|_| ())
            .map_err(|e| sql_err(|| format!("writing job {}", job.id), e))
    }
}

impl Txn for SqlTxn<'_> {
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

impl SqlTxn<'_> {
    /// Run one of [`SCAN_SQL`] with its literals, calling `row` for each
    /// row up to the first whose bound column is past `bound`.
    fn scan_rows(
        &self,
        sql: &str,
        queue: &str,
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
        let mut rows = stmt.query([]).map_err(fail)?;
        while let Some(r) = rows.next().map_err(fail)? {
            let at: Option<i64> = r.get(0).map_err(fail)?;
            if u64_of(at.unwrap_or(0)) > bound {
                break;
            }
            row(r).map_err(fail)?;
        }
        Ok(())
    }

    /// Up to `limit` whole jobs from one of the pending reads.
    fn read_jobs(
        &mut self,
        sql: &str,
        queue: &str,
        limit: usize,
        bound: u64,
    ) -> Result<Vec<JobRecord>> {
        let mut jobs = Vec::new();
        self.scan_rows(sql, queue, limit, bound, |r| {
            jobs.push(job_from_row_at(r, 1)?);
            Ok(())
        })?;
        for job in &jobs {
            if !self.loaded.contains(&job.id) {
                self.loaded.push(job.id);
            }
        }
        Ok(jobs)
    }
}

impl JobTxn for SqlTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn wake(&mut self, wake: Wake) {
        self.woke[wake.index()] = true;
    }

    fn pending(&mut self, queue: &str, now_ms: u64, chunk: usize, ready: usize) -> Result<Pending> {
        Ok(Pending {
            expired: self.read_jobs(SCAN_SQL[0], queue, chunk, now_ms)?,
            due: self.read_jobs(SCAN_SQL[1], queue, chunk, now_ms)?,
            ready: self.read_jobs(SCAN_SQL[2], queue, ready, u64::MAX)?,
        })
    }

    fn next_job_id(&mut self) -> Result<JobId> {
        let id: String = self
            .conn
            .prepare_cached(
                "UPDATE leasehold_meta SET value = CAST(value AS INTEGER) + 1
                 WHERE name = 'last_job_id' RETURNING value",
            )
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .map_err(self.err("allocating a job id"))?;
        id.parse::<u64>()
            .map(JobId)
            .map_err(|_| Error::store("allocating a job id", format!("corrupt counter {id:?}")))
    }

    fn job(&mut self, id: JobId) -> Result<Option<JobRecord>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1");
        let key = i64_of("id", id.0)?;
        let job = self
            .conn
            .prepare_cached(&sql)
            .and_then(|mut s| s.query_row([key], job_from_row).optional())
            .map_err(|e| sql_err(|| format!("reading job {id}"), e))?;
        if job.is_some() && !self.loaded.contains(&id) {
            self.loaded.push(id);
        }
        Ok(job)
    }

    fn jobs_by_id(&mut self, ids: &[JobId]) -> Result<Vec<JobRecord>> {
        let mut jobs = Vec::with_capacity(ids.len());
        for &id in ids {
            jobs.extend(self.job(id)?);
        }
        Ok(jobs)
    }

    fn put_job(&mut self, job: &JobRecord) -> Result<()> {
        if self.loaded.contains(&job.id) {
            return self.update_job(job);
        }
        let sql = format!(
            "INSERT INTO jobs ({JOB_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)
             ON CONFLICT(id) DO UPDATE SET
               queue = excluded.queue, payload = excluded.payload, priority = excluded.priority,
               run_at = excluded.run_at, created_at = excluded.created_at,
               max_attempts = excluded.max_attempts, attempts = excluded.attempts,
               expiries = excluded.expiries, last_token = excluded.last_token, state = excluded.state,
               claim_holder = excluded.claim_holder, claim_token = excluded.claim_token,
               lease_until = excluded.lease_until, cancel_requested = excluded.cancel_requested,
               last_error = excluded.last_error, unique_key = excluded.unique_key,
               finished_at = excluded.finished_at"
        );
        let JobRow {
            id,
            run_at,
            created,
            last_token,
            holder,
            token,
            until,
            finished,
        } = JobRow::of(job)?;
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut s| {
                s.execute(params![
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
                ])
            })
            .map(|_| ())
            .map_err(|e| sql_err(|| format!("writing job {}", job.id), e))
    }

    fn delete_job(&mut self, id: JobId) -> Result<()> {
        let key = i64_of("id", id.0)?;
        self.conn
            .prepare_cached("DELETE FROM jobs WHERE id = ?1")
            .and_then(|mut s| s.execute([key]))
            .map(|_| ())
            .map_err(|e| sql_err(|| format!("deleting job {id}"), e))
    }

    fn live_unique(&mut self, queue: &str, unique_key: &str) -> Result<Option<JobId>> {
        self.conn
            .prepare_cached(
                "SELECT id FROM jobs WHERE queue = ?1 AND unique_key = ?2 AND state <= 2 AND unique_key IS NOT NULL LIMIT 1",
            )
            .and_then(|mut s| s.query_row(params![queue, unique_key], |r| r.get::<_, i64>(0)).optional())
            .map(|id| id.map(|i| JobId(u64_of(i))))
            .map_err(|e| sql_err(|| format!("looking up unique key {unique_key:?} in queue {queue:?}"), e))
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
        self.scan_rows(sql, queue, limit, bound, |r| {
            out.push(JobId(u64_of(r.get(1)?)));
            Ok(())
        })
    }

    fn counts(&mut self, queue: &str) -> Result<StateCounts> {
        // Each count reads one partial index (no index is kept just for
        // counting: every state change would have to update it).
        const LIVE: [&str; 3] = [
            "SELECT count(*) FROM jobs WHERE queue = ?1 AND state = 0",
            "SELECT count(*) FROM jobs WHERE queue = ?1 AND state = 1",
            "SELECT count(*) FROM jobs WHERE queue = ?1 AND state = 2",
        ];
        let fail = |e| sql_err(|| format!("counting queue {queue:?}"), e);
        let mut counts = StateCounts::default();
        for (state, sql) in JobState::ALL.into_iter().zip(LIVE) {
            let n: i64 = self
                .conn
                .prepare_cached(sql)
                .and_then(|mut s| s.query_row([queue], |r| r.get(0)))
                .map_err(fail)?;
            counts.add(state, n);
        }
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT state, count(*) FROM jobs INDEXED BY jobs_finished
                 WHERE queue = ?1 AND state >= 3 GROUP BY state",
            )
            .map_err(fail)?;
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

    fn list(
        &mut self,
        queue: &str,
        state: Option<JobState>,
        after: JobId,
        limit: usize,
    ) -> Result<Vec<JobRecord>> {
        let fail = |e| sql_err(|| format!("listing queue {queue:?}"), e);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let after = i64_of("after", after.0)?;
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE queue = ?1 AND id > ?2 AND (?3 < 0 OR state = ?3) ORDER BY id LIMIT ?4"
        );
        let state = state.map_or(-1, |s| i64::from(s.code()));
        let mut stmt = self.conn.prepare_cached(&sql).map_err(fail)?;
        let rows = stmt
            .query_map(params![queue, after, state, limit], job_from_row)
            .map_err(fail)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(fail)
    }
}

/// The connection, and the group transaction open on it (if any).
struct Shared {
    conn: Option<Connection>,
    open: Option<OpenGroup>,
    next_seq: u64,
}

/// A transaction left open for the threads waiting to join it.
struct OpenGroup {
    seq: u64,
    members: usize,
    /// The highest clock value a member of this group wrote as the
    /// database's high water (recorded as persisted once COMMIT succeeds).
    high_water_ms: u64,
    /// The wake-ups its members raised, delivered once COMMIT succeeds.
    woke: [bool; 2],
}

/// How the groups ended, for the members waiting on them.
#[derive(Default)]
struct Committed {
    /// Every group up to this one has ended.
    seq: u64,
    /// Groups whose COMMIT failed, kept for their waiting members.
    failed: std::collections::BTreeMap<u64, Error>,
    /// Failures of groups up to this one may have been forgotten (only
    /// the newest 4096 are kept).
    forgotten_up_to: u64,
}

/// Most transactions one group commit carries.
const MAX_GROUP: usize = 64;

impl SqliteStore {
    /// Run one member's closure on the open transaction: its own SqlTxn,
    /// its own reading of the clock (after it arrived, so L3's local
    /// deadline never starts before its grant), then its lease writes and,
    /// about once a second, the clock's high water (so that a reboot
    /// continues above it). Returns the high water it wrote, if any.
    fn run_member(
        &self,
        conn: &Connection,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>,
    ) -> Result<(Option<u64>, [bool; 2])> {
        let now_ms = self.now_ms();
        let mut tx = SqlTxn {
            conn,
            now_ms,
            leases: LeaseCache::default(),
            loaded: Vec::new(),
            woke: [false; 2],
        };
        f(&mut tx).and_then(|()| tx.flush())?;
        let woke = tx.woke;
        let persisted = self.persisted_ms.load(Ordering::Relaxed);
        if now_ms <= persisted.saturating_add(1000) {
            return Ok((None, woke));
        }
        conn.prepare_cached(
            "INSERT INTO leasehold_meta (name, value) VALUES ('high_water_ms', ?1)
             ON CONFLICT(name) DO UPDATE SET value = excluded.value
             WHERE CAST(value AS INTEGER) < CAST(excluded.value AS INTEGER)",
        )
        .and_then(|mut s| s.execute([now_ms.to_string()]))
        .map_err(|e| sql_err(|| "recording the clock".to_owned(), e))?;
        Ok((Some(now_ms), woke))
    }

    /// Undo one member's part after its closure failed or panicked: its
    /// savepoint if it joined a group, else the whole (one-member)
    /// transaction. If a savepoint cannot be undone, the whole group is
    /// rolled back and its members are told.
    fn undo_member(
        &self,
        conn: &Connection,
        open: &mut Option<OpenGroup>,
        joined: bool,
        seq: u64,
        why: &Error,
    ) {
        let undone = joined
            && exec_cached(conn, "ROLLBACK TO member").is_ok()
            && exec_cached(conn, "RELEASE member").is_ok();
        if undone {
            return;
        }
        let _ = exec_cached(conn, "ROLLBACK");
        *open = None;
        let failure = joined.then(|| {
            Error::transient(
                "committing a group of transactions",
                format!("rolled back because one of them could not be undone alone: {why}"),
            )
        });
        self.group_ended(seq, failure.as_ref());
    }

    /// End the open group: COMMIT (ROLLBACK if that fails), then tell its
    /// waiting members. Returns the COMMIT's error, if any.
    fn commit_group(&self, conn: &Connection, open: &mut Option<OpenGroup>) -> Result<()> {
        let Some(group) = open.take() else {
            return Ok(());
        };
        self.stats[1].fetch_add(1, Ordering::Relaxed);
        let committed = exec_cached(conn, "COMMIT").map_err(|e| {
            let busy = is_busy(&e);
            let mut e = sql_err(|| format!("committing to {}", self.path.display()), e);
            if !busy {
                // An I/O error during COMMIT may or may not have left the
                // transaction in the WAL: the callers cannot know.
                e = e.with_failure(StoreFailure::Ambiguous);
            }
            let _ = exec_cached(conn, "ROLLBACK");
            e
        });
        if committed.is_ok() {
            if group.high_water_ms > 0 {
                self.persisted_ms
                    .fetch_max(group.high_water_ms, Ordering::Relaxed);
            }
            self.epochs.raise(group.woke);
        }
        self.group_ended(group.seq, committed.as_ref().err());
        committed
    }

    /// Record how group `seq` ended and wake its members.
    fn group_ended(&self, seq: u64, failure: Option<&Error>) {
        let mut c = lock(&self.committed);
        c.seq = c.seq.max(seq);
        if let Some(e) = failure {
            c.failed.insert(seq, e.clone());
            while c.failed.len() > 4096 {
                if let Some((old, _)) = c.failed.pop_first() {
                    c.forgotten_up_to = c.forgotten_up_to.max(old);
                }
            }
        }
        drop(c);
        self.committed_cv.notify_all();
    }

    /// Wait until group `seq` has ended; its COMMIT's error, if it failed.
    fn wait_group(&self, seq: u64) -> Result<()> {
        let mut c = lock(&self.committed);
        while c.seq < seq {
            c = match self.committed_cv.wait(c) {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
        }
        match c.failed.get(&seq) {
            Some(e) => Err(e.clone()),
            None if seq <= c.forgotten_up_to => Err(Error::store(
                "committing a group of transactions",
                "the outcome was forgotten while this thread waited (over 4096 failed groups since)",
            )
            .with_failure(StoreFailure::Ambiguous)),
            None => Ok(()),
        }
    }
}

impl Store for SqliteStore {
    /// Group commit: threads of one process that arrive while a transaction
    /// runs join it, each closure in its own savepoint (so a failing one
    /// undoes only itself, S1), and the last one commits for all: one
    /// commit (one WAL append, one fsync with FULL) for up to 64
    /// transactions. Each caller returns only after the COMMIT that carries
    /// its writes. A lone caller pays nothing for it (no savepoint).
    fn transact(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()> {
        self.fork.check()?;
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let mut guard = lock(&self.shared);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        let Shared {
            conn,
            open,
            next_seq,
        } = &mut *guard;
        let Some(conn) = conn.as_ref() else {
            return Err(Error::store(
                "running a transaction",
                "the connection is closed",
            ));
        };
        BUSY.with(|b| b.set((None, self.busy_timeout)));
        let (seq, joined) = match open.as_mut() {
            Some(group) => {
                group.members += 1;
                (group.seq, true)
            }
            None => {
                if !conn.is_autocommit() {
                    // A transaction that failed to end left its BEGIN open.
                    let _ = exec_cached(conn, "ROLLBACK");
                }
                let shown = || format!("beginning a transaction on {}", self.path.display());
                exec_cached(conn, "BEGIN IMMEDIATE").map_err(|e| sql_err(shown, e))?;
                *next_seq += 1;
                *open = Some(OpenGroup {
                    seq: *next_seq,
                    members: 1,
                    high_water_ms: 0,
                    woke: [false; 2],
                });
                (*next_seq, false)
            }
        };
        let mut member: Result<(Option<u64>, [bool; 2])> = if joined {
            exec_cached(conn, "SAVEPOINT member")
                .map(|()| (None, [false; 2]))
                .map_err(|e| sql_err(|| "joining a group commit".into(), e))
        } else {
            Ok((None, [false; 2]))
        };
        self.stats[0].fetch_add(1, Ordering::Relaxed);
        let mut panic = None;
        if member.is_ok() {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.run_member(conn, &mut *f)
            }));
            member = run.unwrap_or_else(|payload| {
                panic = Some(payload);
                Err(Error::store(
                    "running a transaction",
                    "the closure panicked",
                ))
            });
        }
        match &member {
            Err(e) => {
                self.undo_member(conn, open, joined, seq, e);
                if !joined {
                    // Alone in its transaction, now rolled back.
                    drop(guard);
                    if let Some(payload) = panic {
                        std::panic::resume_unwind(payload);
                    }
                    return member.map(|_| ());
                }
            }
            Ok((wrote, woke)) => {
                let (wrote, woke) = (*wrote, *woke);
                if joined {
                    if let Err(e) = exec_cached(conn, "RELEASE member") {
                        let e = sql_err(|| "leaving a group commit".into(), e);
                        self.undo_member(conn, open, joined, seq, &e);
                        member = Err(e);
                    }
                }
                if let (Ok(_), Some(group)) = (&member, open.as_mut()) {
                    group.high_water_ms = group.high_water_ms.max(wrote.unwrap_or(0));
                    group.woke[0] |= woke[0];
                    group.woke[1] |= woke[1];
                }
            }
        }
        let member = member.map(|_| ());
        // This member is done: leave the transaction open for a thread that
        // is waiting to join (it, or one after it, commits for all), or
        // commit now. Even a panicking member ends the group properly.
        let outcome = match open.as_ref() {
            // The group was rolled back (a savepoint could not be undone).
            None => {
                drop(guard);
                if panic.is_some() {
                    Ok(())
                } else {
                    self.wait_group(seq)
                }
            }
            Some(group) if self.waiting.load(Ordering::SeqCst) > 0 && group.members < MAX_GROUP => {
                drop(guard);
                if panic.is_some() {
                    Ok(())
                } else {
                    self.wait_group(seq)
                }
            }
            Some(_) => {
                let committed = self.commit_group(conn, open);
                drop(guard);
                committed
            }
        };
        if let Some(payload) = panic {
            std::panic::resume_unwind(payload);
        }
        member.and(outcome)
    }

    fn describe(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }

    fn epoch(&self, wake: Wake) -> u64 {
        self.epochs.epoch(wake)
    }

    fn wait_epoch(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        self.epochs.wait(wake, epoch, timeout)
    }
}
