//! Storage adapters. A [`Store`] runs a closure over a [`Txn`] atomically;
//! the rules in [`crate::core`] do the rest. Adapters stay thin: they map
//! records to memory, rows or files, keep indexes, and make a transaction
//! all-or-nothing (S1). They never decide whether a lease is held or a job
//! is claimable.

pub mod file;
pub mod mem;
#[cfg(feature = "sqlite")]
pub mod sqlite;

use crate::core::Txn;
use crate::error::Result;
use std::path::Path;
use std::time::Duration;

pub use file::{FileOptions, FileStore};
pub use mem::MemStore;
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteOptions, SqliteStore, Synchronous};

/// Atomic transactions over lease and job records.
///
/// `transact` runs `f` once per attempt; a store that retries internally
/// (on its own transient errors) may call it again, so `f` must not keep
/// effects outside the transaction between calls. When `f` returns `Err`,
/// nothing it did through the [`Txn`] is kept.
pub trait Store: Send + Sync {
    /// Run `f` in one atomic transaction.
    fn transact(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()>;

    /// A short description for messages (`"mem"`, `"sqlite:/var/lib/x.db"`).
    fn describe(&self) -> String;

    /// A counter that changes whenever a lease slot is freed (released).
    /// Stores that cannot tell return 0 forever, and waiters poll.
    fn lease_epoch(&self) -> u64 {
        0
    }

    /// Block until [`Store::lease_epoch`] differs from `epoch` or `timeout`
    /// passes; returns true if woken by a change. The default just sleeps.
    fn wait_lease_epoch(&self, epoch: u64, timeout: Duration) -> bool {
        let _ = epoch;
        crate::sync::sleep(timeout);
        false
    }
}

/// Open a store from a URL: `sqlite:PATH` (the default scheme), `file:DIR`
/// (leases only), `mem:` (in-process, for tests). `postgres://` is reserved
/// for the PostgreSQL store and refused clearly until it exists.
pub fn open_url(url: &str) -> Result<std::sync::Arc<dyn Store>> {
    use crate::error::Error;
    if let Some(path) = url.strip_prefix("sqlite:") {
        #[cfg(feature = "sqlite")]
        {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(Error::invalid(
                    "store",
                    "sqlite: needs a path, as in sqlite:leasehold.db",
                ));
            }
            return Ok(std::sync::Arc::new(sqlite::SqliteStore::open(path)?));
        }
        #[cfg(not(feature = "sqlite"))]
        {
            let _ = path;
            return Err(Error::invalid("store", "this build has no sqlite feature"));
        }
    }
    if url == "mem:" {
        return Ok(std::sync::Arc::new(MemStore::new()));
    }
    if let Some(dir) = url.strip_prefix("file:") {
        let dir = dir.strip_prefix("//").unwrap_or(dir);
        if dir.is_empty() {
            return Err(Error::invalid(
                "store",
                "file: needs a directory, as in file:/run/leasehold",
            ));
        }
        return Ok(std::sync::Arc::new(file::FileStore::open(dir)?));
    }
    let scheme = url.split(':').next().unwrap_or("");
    let reason = match scheme {
        "postgres" | "postgresql" => {
            format!("{url:?}: the PostgreSQL store is not part of this build yet; use sqlite:PATH")
        }
        _ => format!(
            "{url:?}: unknown store; expected sqlite:PATH or file:DIR (postgres://... is planned)"
        ),
    };
    Err(Error::invalid("store", reason))
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

/// The network filesystem `dir` is on, if any.
pub fn network_fs(dir: &Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: zeroed statfs is a valid out-parameter; `c` is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    let kind = st.f_type as i64;
    NETWORK_FS
        .iter()
        .find(|(magic, _)| *magic == kind)
        .map(|&(_, name)| name)
}

/// Typed convenience over [`Store::transact`].
pub trait StoreExt: Store {
    /// Run `f` in one transaction and return its value.
    fn txn<R>(&self, mut f: impl FnMut(&mut dyn Txn) -> Result<R>) -> Result<R> {
        let mut out = None;
        self.transact(&mut |tx| {
            out = Some(f(tx)?);
            Ok(())
        })?;
        out.ok_or_else(|| crate::error::Error::store("running a transaction", "no result"))
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn transact(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()> {
        (**self).transact(f)
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn lease_epoch(&self) -> u64 {
        (**self).lease_epoch()
    }
    fn wait_lease_epoch(&self, epoch: u64, timeout: Duration) -> bool {
        (**self).wait_lease_epoch(epoch, timeout)
    }
}
