//! Storage adapters. A [`Store`] runs a closure over a [`Txn`] atomically;
//! the rules in [`crate::core`] do the rest. Adapters stay thin: they map
//! records to memory, rows or files, keep indexes, and make a transaction
//! all-or-nothing (S1). They never decide whether a lease is held or a job
//! is claimable.

pub(crate) mod boottime;
mod columns;
pub(crate) mod doorbell;
pub(crate) mod identity;
pub(crate) mod marks;
// The adapters' modules: their stores and options are re-exported here;
// the rest (SQL, file encodings) is the project's own (`#[doc(hidden)]`,
// no API promise), reachable for its tests.
#[doc(hidden)]
pub mod file;
#[doc(hidden)]
pub mod mem;
#[cfg(all(feature = "postgres", not(loom)))]
#[doc(hidden)]
pub mod postgres;
#[cfg(feature = "sqlite")]
#[doc(hidden)]
pub mod sqlite;

use crate::core::Txn;
use crate::error::Field;
use crate::error::Result;
use std::path::Path;
use std::time::Duration;

#[cfg(all(feature = "postgres", not(loom)))]
pub use self::postgres::{PostgresOptions, PostgresStore};
pub use file::{FileOptions, FileStore};
pub use mem::MemStore;
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteOptions, SqliteStore, Synchronous};

pub use crate::core::Wake;
#[doc(hidden)]
pub use marks::Marks;

pub(crate) use columns::*;

/// What a transaction is about to read first, when its caller knows: a
/// store whose round trips cost (PostgreSQL) sends that read with its
/// `BEGIN`, one round trip fewer. A hint only: the transaction reads what
/// it reads either way, and a hint that does not match its first read costs
/// a wasted read, never a wrong one.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum FirstRead<'a> {
    /// The records of these jobs, locked (a completion, a settle, a
    /// renewal round).
    Jobs(&'a [crate::core::JobId]),
    /// The record of this lease key, locked (an acquire, a renewal, a
    /// release).
    Lease(&'a str),
    /// A claim's: the queue's expired and due jobs and its first `ready`
    /// claimable ones, locked, with its settings (`core::job::claim`
    /// reads these first, at the transaction's time).
    Claim {
        /// The queue.
        queue: &'a str,
        /// How many jobs the claim asks for.
        ready: usize,
    },
}

/// Atomic transactions over lease and job records.
///
/// `transact` runs `f` once per attempt; a store that retries internally
/// (on its own transient errors) may call it again, so `f` must not keep
/// effects outside the transaction between calls. When `f` returns `Err`,
/// nothing it did through the [`Txn`] is kept.
pub trait Store: Send + Sync {
    /// Run `f` in one atomic transaction.
    fn transact(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()>;

    /// [`Store::transact`], told what `f` reads first ([`FirstRead`]).
    /// The default ignores the hint.
    fn transact_reading(
        &self,
        first: FirstRead<'_>,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>,
    ) -> Result<()> {
        let _ = first;
        self.transact(f)
    }

    /// A short description for messages (`"mem"`, `"sqlite:/var/lib/x.db"`).
    fn describe(&self) -> String;

    /// A counter that changes whenever the event `wake` names happens (a
    /// lease slot freed, a job made ready). Stores that cannot tell return 0
    /// forever, and waiters poll.
    fn epoch(&self, wake: Wake) -> u64 {
        let _ = wake;
        0
    }

    /// Block until [`Store::epoch`] of `wake` differs from `epoch` or
    /// `timeout` passes; returns true if woken by a change. The default just
    /// sleeps. Waking is an optimization: callers re-check and still poll.
    fn wait_epoch(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        let _ = (wake, epoch);
        crate::sync::sleep(timeout);
        false
    }

    /// Whether [`Store::epoch`] moves for every event made by any process
    /// that opened the store (SQLite's and the file store's shared
    /// doorbell, PostgreSQL's `NOTIFY`, the mem store's one process): a
    /// worker loop then waits for announcements, and polls only as a
    /// backstop ([`crate::WorkOptions::idle_poll`]); else it polls at
    /// least every second. False, the default, for a store that cannot
    /// tell.
    fn announces_changes(&self) -> bool {
        false
    }

    /// Wake this process's threads blocked in [`Store::wait_epoch`] on
    /// `wake` with no event (they return false, as at their timeout): a
    /// waiter that is ending (a worker loop's waker thread) is told at
    /// once. A waiter about to block when this is called may miss it and
    /// wait out its timeout; a waiter of another process may wake too (a
    /// doorbell's sleepers are told apart by a bit per process, 32 bits)
    /// and finds no event. The default does nothing.
    fn interrupt_waits(&self, wake: Wake) {
        let _ = wake;
    }

    /// How many of one client's transactions gain by running at once: the
    /// store threads of a worker loop (its claim, renewal round and settle
    /// may be in flight together). 1, the default, where the store runs
    /// its writers one at a time anyway (SQLite, the file and mem stores:
    /// on SQLite a claim and a settle started together took twice as long
    /// each, waiting on each other, and the loop did a third fewer jobs a
    /// second); more where they overlap (PostgreSQL: round trips).
    fn concurrent_txns(&self) -> usize {
        1
    }

    /// Whether a transaction never waits on anything but the store's own
    /// short lock (no I/O, no sleeping, no retrying): the async client then
    /// runs it on the calling task instead of handing it to the blocking
    /// pool (two thread hops, tens of microseconds, against a transaction
    /// of well under one). False, the default, for every store that
    /// touches a disk or a server; true for [`crate::MemStore`].
    fn runs_inline(&self) -> bool {
        false
    }

    /// The quoted PostgreSQL schema holding this store's tables, when it is
    /// a PostgreSQL store (what [`crate::Queue::push_in`] writes into).
    #[doc(hidden)]
    fn postgres_schema(&self) -> Option<&str> {
        None
    }

    /// The store's migration marks (`store::marks`), read even on
    /// a moved store; a store that cannot be migrated says so.
    #[doc(hidden)]
    fn marks(&self) -> Result<Marks> {
        Err(unmovable(&self.describe()))
    }

    /// Replace the store's migration marks.
    #[doc(hidden)]
    fn set_marks(&self, marks: &Marks) -> Result<()> {
        let _ = marks;
        Err(unmovable(&self.describe()))
    }
}

/// The answer of a store `leasehold migrate` cannot move.
fn unmovable(store: &str) -> crate::error::Error {
    crate::error::Error::invalid(
        Field::Store,
        format!("{store}: `leasehold migrate` moves sqlite: and postgres:// stores only"),
    )
}

/// Split `rest?a=b&c=d` into the path and its parameters.
fn url_params(rest: &str) -> (&str, Vec<(&str, &str)>) {
    match rest.split_once('?') {
        None => (rest, Vec::new()),
        Some((path, query)) => (
            path,
            query
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| p.split_once('=').unwrap_or((p, "")))
                .collect(),
        ),
    }
}

fn bool_param(scheme: &str, name: &str, value: &str) -> Result<bool> {
    match value {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(crate::error::Error::invalid(
            Field::Store,
            format!("{scheme}: parameter {name}={value:?} is not true or false"),
        )),
    }
}

fn unknown_param(scheme: &str, name: &str, known: &str) -> crate::error::Error {
    crate::error::Error::invalid(
        Field::Store,
        format!("{scheme}: unknown parameter {name:?} (known: {known})"),
    )
}

/// Open a store from a URL: `sqlite:PATH` (the default scheme), `file:DIR`
/// (leases only), `postgres://USER@HOST:PORT/DB?schema=NAME&pool_size=N`
/// (many machines), `mem:` (in-process, for tests).
///
/// Store options travel as URL parameters, and an unknown one is an error
/// naming it: `sqlite:PATH?synchronous=normal|full&busy_timeout_ms=N&allow_network_fs=BOOL`,
/// `file:DIR?durable=BOOL&allow_network_fs=BOOL`; PostgreSQL takes
/// `schema`, `pool_size` and the driver's own parameters.
pub fn open_url(url: &str) -> Result<std::sync::Arc<dyn Store>> {
    open_url_as(url, false)
}

/// [`open_url`] for `leasehold migrate`: with `ignore_marks`, the handle
/// works on a store whatever its migration marks say (`store::marks`).
#[doc(hidden)]
pub fn open_url_as(url: &str, ignore_marks: bool) -> Result<std::sync::Arc<dyn Store>> {
    use crate::error::Error;
    if let Some(rest) = url.strip_prefix("sqlite:") {
        return open_sqlite_url(rest, ignore_marks);
    }
    if url == "mem:" {
        return Ok(std::sync::Arc::new(MemStore::new()));
    }
    if let Some(rest) = url.strip_prefix("file:") {
        return open_file_url(rest);
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(all(feature = "postgres", not(loom)))]
        return Ok(std::sync::Arc::new(
            self::postgres::PostgresStore::open_with(
                url,
                self::postgres::PostgresOptions {
                    ignore_marks,
                    ..Default::default()
                },
            )?,
        ));
        #[cfg(not(all(feature = "postgres", not(loom))))]
        return Err(Error::invalid(
            Field::Store,
            "this build has no postgres feature (cargo build --features postgres)",
        ));
    }
    let scheme = url.split(':').next().unwrap_or("");
    let reason = format!(
        "{url:?}: unknown store scheme {scheme:?}; expected sqlite:PATH, file:DIR, postgres://... or mem:"
    );
    Err(Error::invalid(Field::Store, reason))
}

/// `sqlite:PATH?params` (after the scheme).
#[cfg(feature = "sqlite")]
fn open_sqlite_url(rest: &str, ignore_marks: bool) -> Result<std::sync::Arc<dyn Store>> {
    use crate::error::Error;
    let (path, params) = url_params(rest);
    let path = path.strip_prefix("//").unwrap_or(path);
    if path.is_empty() {
        return Err(Error::invalid(
            Field::Store,
            "sqlite: needs a path, as in sqlite:leasehold.db",
        ));
    }
    let mut opts = sqlite::SqliteOptions {
        ignore_marks,
        ..Default::default()
    };
    for (name, value) in params {
        match name {
            "synchronous" => {
                opts.synchronous = match value.to_ascii_lowercase().as_str() {
                    "normal" => sqlite::Synchronous::Normal,
                    "full" => sqlite::Synchronous::Full,
                    _ => {
                        return Err(Error::invalid(
                            Field::Store,
                            format!("sqlite: synchronous={value:?} is not normal or full"),
                        ))
                    }
                }
            }
            "busy_timeout_ms" => {
                let ms: u64 = value.parse().map_err(|_| {
                    Error::invalid(
                        Field::Store,
                        format!("sqlite: busy_timeout_ms={value:?} is not a whole number"),
                    )
                })?;
                opts.busy_timeout = Duration::from_millis(ms);
            }
            "allow_network_fs" => opts.allow_network_fs = bool_param("sqlite", name, value)?,
            _ => {
                return Err(unknown_param(
                    "sqlite",
                    name,
                    "synchronous, busy_timeout_ms, allow_network_fs",
                ))
            }
        }
    }
    Ok(std::sync::Arc::new(sqlite::SqliteStore::open_with(
        path, opts,
    )?))
}

#[cfg(not(feature = "sqlite"))]
fn open_sqlite_url(_rest: &str, _ignore_marks: bool) -> Result<std::sync::Arc<dyn Store>> {
    Err(crate::error::Error::invalid(
        Field::Store,
        "this build has no sqlite feature",
    ))
}

/// `file:DIR?params` (after the scheme).
fn open_file_url(rest: &str) -> Result<std::sync::Arc<dyn Store>> {
    let (dir, params) = url_params(rest);
    let dir = dir.strip_prefix("//").unwrap_or(dir);
    if dir.is_empty() {
        return Err(crate::error::Error::invalid(
            Field::Store,
            "file: needs a directory, as in file:/run/leasehold",
        ));
    }
    let mut opts = file::FileOptions::default();
    for (name, value) in params {
        match name {
            "durable" => opts.durable = bool_param("file", name, value)?,
            "allow_network_fs" => opts.allow_network_fs = bool_param("file", name, value)?,
            _ => return Err(unknown_param("file", name, "durable, allow_network_fs")),
        }
    }
    Ok(std::sync::Arc::new(file::FileStore::open_with(dir, opts)?))
}

/// Filesystem magic numbers (statfs `f_type`) of network and FUSE
/// filesystems, where SQLite's WAL and `flock` are not safe between processes.
const NETWORK_FS: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0x517B, "SMB"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x6573_5546, "FUSE"),
    (0x0102_1997, "9P"),
];

/// The network filesystem a statfs magic number (`f_type`) names, if any.
/// Magic numbers are 32 bits: a sign-extended `f_type` (32-bit targets)
/// names the same filesystem.
#[doc(hidden)]
pub fn network_fs_name(magic: i64) -> Option<&'static str> {
    let magic = magic & 0xFFFF_FFFF;
    NETWORK_FS
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|&(_, name)| name)
}

/// The statfs magic number of the filesystem `dir` is on.
fn statfs_magic(dir: &Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: zeroed statfs is a valid out-parameter; `c` is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    Some(st.f_type as i64)
}

/// The network filesystem `dir` is on, if any.
#[doc(hidden)]
pub fn network_fs(dir: &Path) -> Option<&'static str> {
    statfs_magic(dir).and_then(network_fs_name)
}

/// The network filesystem a store's directory is on: from `injected` (a
/// test's statfs magic) if set, else from the kernel.
pub(crate) fn dir_network_fs(dir: &Path, injected: Option<i64>) -> Option<&'static str> {
    injected
        .or_else(|| statfs_magic(dir))
        .and_then(network_fs_name)
}

/// The in-process side of wake-ups: one counter per [`Wake`] event, bumped
/// when a transaction that raised it commits, and the waiters blocked on
/// them. The mem store delivers its wake-ups this way, PostgreSQL too
/// (and tells other processes by NOTIFY); SQLite and the file store ring
/// a doorbell every process of the machine hears
/// ([`doorbell`](self::doorbell)), and fall back to this when they cannot
/// make one.
#[derive(Debug, Default)]
pub(crate) struct Epochs {
    /// The counters, and how many threads wait on them (a notify is a
    /// system call: skipped when nobody waits).
    state: crate::sync::Mutex<([u64; 2], usize)>,
    changed: crate::sync::Condvar,
}

impl Epochs {
    /// A committed transaction raised the events marked in `woke`.
    pub fn raise(&self, woke: [bool; 2]) {
        if woke == [false; 2] {
            return;
        }
        let mut st = crate::sync::lock(&self.state);
        for (epoch, woke) in st.0.iter_mut().zip(woke) {
            *epoch = epoch.wrapping_add(u64::from(woke));
        }
        if st.1 > 0 {
            self.changed.notify_all();
        }
    }

    /// See [`Store::epoch`].
    pub fn epoch(&self, wake: Wake) -> u64 {
        crate::sync::lock(&self.state).0[wake.index()]
    }

    /// See [`Store::interrupt_waits`].
    pub fn interrupt(&self) {
        let st = crate::sync::lock(&self.state);
        if st.1 > 0 {
            self.changed.notify_all();
        }
    }

    /// See [`Store::wait_epoch`].
    pub fn wait(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        let mut st = crate::sync::lock(&self.state);
        if st.0[wake.index()] != epoch {
            return true;
        }
        st.1 += 1;
        let (mut st, _) = match self.changed.wait_timeout(st, timeout) {
            Ok(pair) => pair,
            Err(poisoned) => poisoned.into_inner(),
        };
        st.1 -= 1;
        st.0[wake.index()] != epoch
    }
}

/// Typed convenience over [`Store::transact`].
pub trait StoreExt: Store {
    /// Run `f` in one transaction and return its value.
    fn txn<R>(&self, f: impl FnMut(&mut dyn Txn) -> Result<R>) -> Result<R> {
        self.txn_as("txn", f)
    }

    /// [`StoreExt::txn`], named `op` in traces and metrics: a span around
    /// it, its latency, and (once it has committed) the transitions it
    /// made ([`crate::core::Event`]). A transaction that does not commit
    /// reports no transition.
    fn txn_as<R>(&self, op: &'static str, f: impl FnMut(&mut dyn Txn) -> Result<R>) -> Result<R> {
        self.txn_reading(op, None, f)
    }

    /// [`StoreExt::txn_as`], telling the store what `f` reads first
    /// ([`Store::transact_reading`]), when `first` says.
    fn txn_reading<R>(
        &self,
        op: &'static str,
        first: Option<FirstRead<'_>>,
        mut f: impl FnMut(&mut dyn Txn) -> Result<R>,
    ) -> Result<R> {
        let mut out = None;
        let transact = |f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>| match first {
            Some(first) => self.transact_reading(first, f),
            None => self.transact(f),
        };
        if !crate::observe::active() {
            transact(&mut |tx| {
                out = Some(f(tx)?);
                Ok(())
            })?;
            return out
                .ok_or_else(|| crate::error::Error::store("running a transaction", "no result"));
        }
        let _span = crate::observe::txn_span(op);
        let started = crate::observe::Started::now();
        let mut events = Vec::new();
        let done = transact(&mut |tx| {
            tx.journal().set_recording(true);
            let value = f(tx)?;
            // Taken on every attempt: a retried closure replaces them.
            events = tx.journal().take_events();
            out = Some(value);
            Ok(())
        });
        crate::observe::transaction(op, started, done.is_ok());
        done?;
        crate::observe::committed(&events);
        out.ok_or_else(|| crate::error::Error::store("running a transaction", "no result"))
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn transact(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()> {
        (**self).transact(f)
    }
    fn transact_reading(
        &self,
        first: FirstRead<'_>,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>,
    ) -> Result<()> {
        (**self).transact_reading(first, f)
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn epoch(&self, wake: Wake) -> u64 {
        (**self).epoch(wake)
    }
    fn wait_epoch(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        (**self).wait_epoch(wake, epoch, timeout)
    }
    fn announces_changes(&self) -> bool {
        (**self).announces_changes()
    }
    fn interrupt_waits(&self, wake: Wake) {
        (**self).interrupt_waits(wake)
    }

    fn concurrent_txns(&self) -> usize {
        (**self).concurrent_txns()
    }
    fn runs_inline(&self) -> bool {
        (**self).runs_inline()
    }
    fn postgres_schema(&self) -> Option<&str> {
        (**self).postgres_schema()
    }
    fn marks(&self) -> Result<Marks> {
        (**self).marks()
    }
    fn set_marks(&self, marks: &Marks) -> Result<()> {
        (**self).set_marks(marks)
    }
}
