//! The SQLite store: the embedded default, safe for many processes and
//! threads on one machine.
//!
//! # Design
//! - **One connection per store handle**, behind a mutex: threads of a
//!   process share it safely (no unsynchronized shared session), and SQLite
//!   serializes writers across processes anyway.
//! - **Group commit** (a protocol of its own, which the loom models
//!   check): threads that arrive while a transaction runs join it, each in
//!   its own savepoint (a failing one undoes only itself), and the last one
//!   commits for all, so one COMMIT (one WAL append; one fsync with FULL)
//!   carries up to 64 transactions. Each member reads the clock when its
//!   turn comes and returns only after the COMMIT that carries it. A lone
//!   caller pays nothing for this.
//! - **Every transaction begins with `BEGIN IMMEDIATE`**, so a transaction
//!   that will write takes the write lock before it reads: no deferred read
//!   that later upgrades (the source of the double claims and BUSY storms in
//!   the brief's queue report). `SQLITE_BUSY` waits in SQLite's busy handler
//!   up to `busy_timeout`, then surfaces as a transient error that the client
//!   retries with jittered backoff up to its own deadline.
//! - **WAL mode**, checked to have taken effect. `synchronous=NORMAL` by
//!   default: a committed transaction survives a crash of the process; after
//!   a power loss or OS crash the last transactions since the latest WAL
//!   checkpoint may be lost, never half-applied. `FULL` syncs the WAL on
//!   every commit and loses nothing that was acknowledged. The last
//!   connection to close does not checkpoint unless the WAL file passed
//!   256 KiB (`conn::close`): a short-lived process pays no checkpoint
//!   fsyncs when it exits, and its commits stay in the WAL.
//! - **Indexes match the scans exactly**: one index of every job by queue,
//!   band (its state, roughly) and the band's own order (`priority DESC,
//!   run_at, id` for ready jobs, `lease_until` for running ones), so a
//!   claim costs O(log n) whatever the number of finished jobs. The bands
//!   lie finished | running | ready, so a claim and a completion each move
//!   an entry within one index page (schema v15; see `schema`).
//! - **The clock** is the machine's boot-time clock (`CLOCK_BOOTTIME`), the
//!   same for every process on the machine and immune to wall-clock steps.
//!   The database stores the boot id, an offset and a high water, which a
//!   transaction writes (in its own commit) when its instant is more than a
//!   second above the high water its handle last knew to be stored. On the
//!   first open after a reboot the offset is moved so that store time
//!   continues above the high water plus that second (the rule shared with
//!   the file store): above every instant a committed transaction used
//!   before the reboot (holders died with the old boot, so their leases
//!   simply run out). So store time never goes backwards for anything the
//!   database kept; with `synchronous=NORMAL` a power loss may drop the last
//!   transactions, and their instants with them, never half of one.
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
//!
//! The code: `schema` (migrations, refusals, the clock state),
//! `group` (group commit, generic over the connection), `conn` (the
//! connection's group-commit actions, errors, busy handler), `hot` (the
//! statements every lease transaction runs, kept on the connection), `txn` (the
//! transaction's lease and job reads and writes), `rows` (the job row
//! mapping and the indexed scans) and `listing` (what `leasehold ui` and
//! the listing commands read, and the two indexes only they need).

#[doc(hidden)]
pub mod group;

mod cache;
mod conn;
mod hot;
mod lease_rows;
mod listing;
mod rows;
mod schedules;
mod schema;
mod txn;

pub use crate::store::network_fs;
pub use rows::{sql_quote, SCAN_SQL};
pub use schema::{APPLICATION_ID, SCHEMA_VERSION};

use crate::clock::{BootClock, Clock};
use crate::core::Txn;
use crate::error::{Error, Result};
use crate::fork::ForkGuard;
use crate::store::boottime::{current_boot, StoreClock};
use crate::store::doorbell::Bell;
use crate::store::identity::Identity;
use crate::store::{Store, Wake};
use conn::{busy_wait, sql_err, SqlConn};
use group::{GroupCommit, GroupNote};
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use txn::SqlTxn;

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
    /// The statfs magic number of the database's directory, used instead
    /// of asking the kernel (tests inject a network filesystem's).
    #[doc(hidden)]
    pub statfs_magic: Option<i64>,
    /// Work on the database whatever its migration marks say (the
    /// handles of `leasehold migrate`).
    #[doc(hidden)]
    pub ignore_marks: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Normal,
            busy_timeout: Duration::from_secs(5),
            allow_network_fs: false,
            clock: None,
            boot_id: None,
            statfs_magic: None,
            ignore_marks: false,
        }
    }
}

/// The SQLite [`Store`].
pub struct SqliteStore {
    path: PathBuf,
    /// The connection, shared by the threads of a group commit.
    group: GroupCommit<SqlConn, SqlNote>,
    fork: ForkGuard,
    clock: StoreClock,
    /// The database file as opened (a deleted or replaced file stops it).
    identity: Identity,
    /// Wake-ups for the waiters of every process that opened the file
    /// (the doorbell `PATH-wake`; this process only if it cannot be made).
    bell: Bell,
    /// Reads served from the connection's copy of its running jobs.
    row_hits: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

/// What a member of a group commit leaves for its group: the clock's high
/// water it wrote (recorded as persisted once COMMIT succeeds) and the
/// wake-ups it raised (delivered once COMMIT succeeds).
#[derive(Debug, Default)]
struct SqlNote {
    high_water_ms: u64,
    woke: [bool; 2],
}

impl GroupNote for SqlNote {
    fn absorb(&mut self, other: SqlNote) {
        self.high_water_ms = self.high_water_ms.max(other.high_water_ms);
        self.woke[0] |= other.woke[0];
        self.woke[1] |= other.woke[1];
    }
}

/// The doorbell beside the database `path` (`PATH-wake`, as SQLite names
/// its `-wal` and `-shm`).
fn wake_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wake");
    PathBuf::from(name)
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Refuse a missing directory or a network filesystem, before anything
/// is created.
fn check_dir(path: &Path, opts: &SqliteOptions) -> Result<()> {
    let opening = || format!("opening {}", path.display());
    let dir = parent_dir(path);
    if !dir.is_dir() {
        return Err(Error::store(
            opening(),
            format!("directory {} does not exist", dir.display()),
        ));
    }
    if opts.allow_network_fs {
        return Ok(());
    }
    match crate::store::dir_network_fs(&dir, opts.statfs_magic) {
        Some(fs) => Err(Error::store(
            opening(),
            format!("{} is on {fs}, where SQLite's WAL locking is not safe across processes; use a local disk (or allow_network_fs at your own risk)", dir.display()),
        )),
        None => Ok(()),
    }
}

/// Open the connection: busy handler, schema, WAL, synchronous.
// Real time and sleeps are this adapter's business (clippy.toml keeps them out of the core).
#[allow(clippy::disallowed_methods)]
fn connect(path: &Path, opts: &SqliteOptions) -> Result<Connection> {
    let shown = path.display().to_string();
    let ctx = |what: &str| format!("{what} {shown}");
    conn::arm_busy(opts.busy_timeout);
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sql_err(|| ctx("opening"), e))?;
    conn.busy_handler(Some(busy_wait))
        .map_err(|e| sql_err(|| ctx("configuring"), e))?;
    // Plans never depend on bound values: built with STAT4, SQLite would
    // otherwise re-prepare a statement whose bound value might change its
    // plan on every execution (the slots of a lease, read by key prefix,
    // were re-parsed in every lease transaction).
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .map_err(|e| sql_err(|| ctx("configuring"), e))?;
    // The last connection to close does not checkpoint (two fsyncs, and a
    // third and a directory fsync when the next process creates the WAL
    // again): a short-lived process (`leasehold run`, `lock acquire`)
    // paid four fsyncs for two small transactions. What it leaves in the
    // WAL stays bounded: see `close`.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .map_err(|e| sql_err(|| ctx("configuring"), e))?;
    // Room for the scans of many queues (one statement per queue each).
    conn.set_prepared_statement_cache_capacity(256);
    // Processes started in a burst race to create the schema and to switch
    // a new file to WAL, which SQLite may refuse with BUSY without calling
    // the busy handler: each step is safe to run again, so the whole setup
    // is, until the busy timeout.
    let started = std::time::Instant::now();
    let seed = started.elapsed().as_nanos() as u64 ^ u64::from(std::process::id());
    let mut pause_us = crate::core::Backoff::new(200, 20_000, seed);
    loop {
        match prepare(&conn, &shown) {
            Err(e) if e.is_transient() && started.elapsed() < opts.busy_timeout => {
                std::thread::sleep(Duration::from_micros(pause_us.next_wait()));
            }
            other => break other?,
        }
    }
    let sync = match opts.synchronous {
        Synchronous::Normal => "NORMAL",
        Synchronous::Full => "FULL",
    };
    conn.execute_batch(&format!(
        "PRAGMA synchronous={sync}; PRAGMA foreign_keys=OFF;"
    ))
    .map_err(|e| sql_err(|| ctx("configuring"), e))?;
    Ok(conn)
}

/// The idempotent part of opening: the schema (created or migrated), the
/// listing indexes, WAL.
fn prepare(conn: &Connection, shown: &str) -> Result<()> {
    schema::check_schema(conn, shown)?;
    listing::ensure_indexes(conn, shown)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| sql_err(|| format!("enabling WAL on {shown}"), e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::store(
            format!("enabling WAL on {shown}"),
            format!("journal mode is {mode:?}, not WAL (is the filesystem able to hold the -wal and -shm files?)"),
        ));
    }
    Ok(())
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
        check_dir(&path, &opts)?;
        let conn = connect(&path, &opts)?;
        let clock: Arc<dyn Clock> = opts.clock.unwrap_or_else(|| Arc::new(BootClock));
        let boot = current_boot(opts.boot_id);
        let clock = schema::open_clock(&conn, clock, &boot, &shown)?;
        if !opts.ignore_marks {
            // A moved database is refused at once (a copy in progress
            // only fails transactions: it ends by itself).
            if let Some(to) = schema::read_marks(&conn, &shown)?.moved_to {
                return Err(Error::Moved { to });
            }
        }
        let rows = cache::RowCache::default();
        let row_hits = rows.hits();
        let conn = SqlConn {
            conn: hot::HotConn::new(conn),
            shown,
            busy_timeout: opts.busy_timeout,
            check_marks: !opts.ignore_marks,
            marks_checked: None,
            rows,
        };
        let bell = Bell::at(&wake_path(&path));
        let identity = Identity::of(&path, "database file")?;
        Ok(SqliteStore {
            path,
            group: GroupCommit::new(conn),
            fork: ForkGuard::new(),
            clock,
            identity,
            bell,
            row_hits,
        })
    }

    /// Job reads served from the connection's copy of the running jobs it
    /// wrote last, not from the database (tests and benchmarks).
    #[doc(hidden)]
    pub fn row_copy_hits(&self) -> u64 {
        self.row_hits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Group commit at work: (transactions run, COMMITs issued) by this
    /// handle. With threads sharing the handle, transactions exceed commits.
    #[doc(hidden)]
    pub fn group_stats(&self) -> (u64, u64) {
        self.group.stats()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A connection beside the group's, for the rare reads and writes of
    /// migration marks.
    fn side_connection(&self) -> Result<Connection> {
        let conn = Connection::open(&self.path)
            .map_err(|e| conn::sql_err(|| format!("opening {}", self.path.display()), e))?;
        conn.busy_timeout(Duration::from_secs(30))
            .map_err(|e| conn::sql_err(|| format!("opening {}", self.path.display()), e))?;
        Ok(conn)
    }

    /// Run one member's closure on the open transaction: its own SqlTxn,
    /// its own reading of the clock (after it arrived, so L3's local
    /// deadline never starts before its grant), then its lease writes and,
    /// when [`StoreClock::must_persist`] says so, the clock's high water
    /// (so that a reboot continues above it).
    fn run_member(
        &self,
        c: &mut SqlConn,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>,
    ) -> Result<SqlNote> {
        let now_ms = self.clock.now_ms();
        let SqlConn { conn, rows, .. } = c;
        let mut tx = SqlTxn::new(conn, rows, now_ms);
        f(&mut tx)?;
        let woke = tx.finish()?;
        if !self.clock.must_persist(now_ms) {
            return Ok(SqlNote {
                high_water_ms: 0,
                woke,
            });
        }
        schema::write_high_water(conn, now_ms)?;
        Ok(SqlNote {
            high_water_ms: now_ms,
            woke,
        })
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        if let Some(conn) = self.group.take_conn() {
            if self.fork.is_origin_strict() {
                conn::close(conn);
            } else {
                // Closing in a forked child could disturb the parent's locks.
                std::mem::forget(conn);
            }
        }
    }
}

impl Store for SqliteStore {
    /// Group commit: threads of one process that arrive while
    /// a transaction runs join it, each closure in its own savepoint (so a
    /// failing one undoes only itself, S1), and the last one commits for
    /// all: one commit (one WAL append, one fsync with FULL) for up to 64
    /// transactions. Each caller returns only after the COMMIT that carries
    /// its writes. A lone caller pays nothing for it (no savepoint).
    fn transact(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()> {
        self.fork.check()?;
        self.identity.check(false)?;
        let done = self.group.run(
            |c: &mut SqlConn| self.run_member(c, &mut *f),
            |note: SqlNote| {
                if note.high_water_ms > 0 {
                    self.clock.persisted(note.high_water_ms);
                }
                self.bell.ring(note.woke);
            },
        );
        if let Err(Error::Store { .. }) = &done {
            // An I/O error may mean the file went away: say so if it did.
            self.identity.check(true)?;
        }
        done
    }

    fn describe(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }

    fn epoch(&self, wake: Wake) -> u64 {
        self.bell.epoch(wake)
    }

    fn wait_epoch(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        self.bell.wait(wake, epoch, timeout)
    }

    /// Only where the doorbell is shared: without it, other processes'
    /// events go unannounced.
    fn announces_changes(&self) -> bool {
        self.bell.is_shared()
    }

    fn interrupt_waits(&self, wake: Wake) {
        self.bell.interrupt(wake);
    }

    /// Read on a connection of its own (marks are read and written
    /// rarely; the group's connection may be inside a transaction).
    fn marks(&self) -> Result<crate::store::Marks> {
        self.fork.check()?;
        let shown = self.path.display().to_string();
        schema::read_marks(&self.side_connection()?, &shown)
    }

    fn set_marks(&self, marks: &crate::store::Marks) -> Result<()> {
        self.fork.check()?;
        let shown = self.path.display().to_string();
        let conn = self.side_connection()?;
        schema::write_marks(&conn, &shown, marks)?;
        if *marks != crate::store::Marks::default() {
            conn::after_mark(&conn)
                .map_err(|e| sql_err(|| format!("waiting out the cut-over on {shown}"), e))?;
        }
        Ok(())
    }
}
