//! The file store: leases in a plain directory, no server. The pidfile
//! replacement.
//!
//! # Layout
//! One file per key, `NAME.lease`, whose name encodes the key
//! ([`encode_key`]). It is never unlinked or replaced, so it doubles as the
//! key's lock: a transaction takes an exclusive `flock` on it, reads the
//! record, lets the rules decide, writes the new record in place, and closes
//! the file (which drops the lock).
//!
//! # Record
//! The file holds two slots, at offset 0 and at 16 MiB (the file is sparse:
//! the gap takes no disk space). Each slot is a header (magic, sequence
//! number, length, and a checksum over the sequence number, the length and
//! the record, so that a write torn anywhere, even inside the header,
//! leaves a slot that does not check out) and a short text record: a version line, the
//! key (hex), the key's token counter, one line per holder slot. A write
//! carries the next sequence number; a reader takes the valid slot with the
//! highest sequence. A write never goes to the slot whose record must stay
//! in force if it is torn (below), so a crash leaves that record: no
//! rename, no directory fsync. If neither slot is valid the file is
//! reported as corrupt, naming it, and left as it is: silently resetting it
//! would lose the token counter and break fencing (L2).
//!
//! # Durability
//! Not durable (`FileOptions::durable` false): no `fdatasync`; each write
//! goes to the slot that does not hold the current record. A commit
//! survives the process (the page cache has it), not the machine.
//!
//! Durable (the default): a commit survives a power loss, except a commit
//! that only drops holder slots (a release, or expired slots pruned),
//! which is not synced: one `fdatasync` per acquire + release pair, not
//! two. The argument:
//! - **A forgotten release only delays the key's expiry.** After a power
//!   loss the record may still show the releaser as a holder; every holder
//!   died with the machine (the store is one machine's: network
//!   filesystems are refused), and the slot runs out at the TTL of its
//!   last renewal, in store time that continues above every instant used
//!   before the reboot (Clock, below). L4 allows exactly that.
//! - **A forgotten grant would hand its token out twice** after the reboot
//!   (L2, and the token may already fence something outside): a grant is
//!   synced before it returns.
//! - **Renewals stay synced.** By the power-loss argument alone a renewal
//!   could be forgotten too (its holder dies with the machine). But an
//!   unsynced record may be overwritten in place (next paragraph), and a
//!   process killed in the middle of that write takes the unsynced record
//!   with it while every other process lives on: a live holder's renewal
//!   lost that way would let its lease run out while it still holds it
//!   (L1, L3). A release lost that way only keeps its slot until the TTL.
//!
//! Which slot a write goes to keeps the newest record known to be on disk
//! in force. After each `fdatasync` the writer records, in a durable
//! watermark (16 bytes before slot 1, with a checksum; written, not synced),
//! the sequence number the sync put on disk, before the transaction
//! returns. A write goes to the slot that does not hold that record: after
//! a grant, the release goes to the other slot; the next grant overwrites
//! the release in place, leaving the synced grant before it in force. If
//! neither slot holds the watermark's record (a new or upgraded file, a
//! lost watermark), the writer syncs first. So a slot being written, torn
//! or lost in a crash, only ever holds a record that is not needed: a run
//! of unsynced releases, or a write whose transaction never returned
//! success (a failed `fdatasync` or watermark write is reported as
//! ambiguous). `tests/file_store.rs` checks every torn and lost image of a
//! run of grants, renewals and releases.
//!
//! # Clock
//! As for SQLite: the machine's boot-time clock plus an offset kept in the
//! directory (`clock` file: boot id, offset, high water), so store time is
//! shared by every process of the machine and immune to wall-clock steps.
//! A transaction whose instant is more than a second above the high water
//! its handle last wrote first writes the high water (before it runs, so
//! no record is written at an instant the `clock` file does not cover);
//! the first open after a reboot continues above the high water plus that
//! second (the rule shared with SQLite). So store time after a reboot is
//! above every instant a transaction used before it: in durable mode
//! always, in non-durable mode as long as the `clock` file reached the
//! disk (a power loss may lose it, as it may lose records).
//!
//! # Scope
//! Leases only (counting leases included). Jobs need the ordered indexes of
//! a database: every job operation answers a clear error pointing to
//! `sqlite:`.
//!
//! Directories on NFS, SMB/CIFS or FUSE are refused unless
//! `FileOptions::allow_network_fs`: `flock` there is not reliable between
//! machines.

//!
//! The code: `record` (the text format and file names), `slots` (the two
//! slots, the lock, the writes) and `clock` (the `clock` file).

// This module's job is file I/O (clippy.toml keeps it out of the core).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod clock;
mod record;
mod slots;

pub use record::encode_key;

use crate::clock::{BootClock, Clock};
use crate::core::{JobTxn, Journal, LeaseRecord, Txn, Wake};
use crate::error::Field;
use crate::error::{Error, Result};
use crate::fork::ForkGuard;
use crate::store::boottime::{current_boot, StoreClock};
use crate::store::doorbell::Bell;
use crate::store::identity::Identity;
use crate::store::Store;
use crate::sync::{AtomicU64, Ordering};
use clock::ClockFile;
use slots::Locked;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Options of [`FileStore::open_with`].
#[derive(Debug, Clone)]
pub struct FileOptions {
    /// `fdatasync` record writes (default true; see the module docs for
    /// which writes).
    pub durable: bool,
    /// Open a directory on NFS, SMB or FUSE anyway.
    pub allow_network_fs: bool,
    /// The clock (default: [`BootClock`]).
    pub clock: Option<Arc<dyn Clock>>,
    /// The boot id (default: the kernel's).
    pub boot_id: Option<String>,
    /// The statfs magic number of the directory's filesystem, used instead
    /// of asking the kernel (tests inject a network filesystem's).
    #[doc(hidden)]
    pub statfs_magic: Option<i64>,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            durable: true,
            allow_network_fs: false,
            clock: None,
            boot_id: None,
            statfs_magic: None,
        }
    }
}

/// The file [`Store`] (leases only).
pub struct FileStore {
    dir: PathBuf,
    durable: bool,
    clock: StoreClock,
    clock_file: ClockFile,
    fork: ForkGuard,
    /// The directory as opened (a deleted or replaced one stops it).
    identity: Identity,
    /// Wake-ups (a release wakes an acquire) for the waiters of every
    /// process that opened the directory (its `wake` doorbell; this
    /// process only if it cannot be made).
    bell: Bell,
    /// `fdatasync`s of record files by this handle.
    record_syncs: AtomicU64,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore").field("dir", &self.dir).finish()
    }
}

/// The simulator's torn writes (feature `canaries`, never in a user's
/// build): the next record write of this thread stops after a given
/// number of bytes and fails, as when its process dies in the middle.
#[doc(hidden)]
pub mod torn {
    #[cfg(feature = "canaries")]
    std::thread_local! {
        static NEXT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    }

    /// Tear this thread's next record write after `bytes`.
    #[cfg(feature = "canaries")]
    pub fn arm(bytes: usize) {
        NEXT.with(|n| n.set(Some(bytes)));
    }

    /// Whether a tear is armed (and not yet used), disarming it.
    #[cfg(feature = "canaries")]
    pub fn disarm() -> bool {
        NEXT.with(|n| n.take().is_some())
    }

    pub(super) fn take() -> Option<usize> {
        #[cfg(feature = "canaries")]
        return NEXT.with(|n| n.take());
        #[cfg(not(feature = "canaries"))]
        None
    }
}

fn io_err(what: impl FnOnce() -> String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::store(what(), e.to_string())
}

/// The directory `dir` is in (what exists of it when `dir` does not).
fn parent_of(dir: &Path) -> &Path {
    match dir.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => Path::new("/"),
    }
}

/// Refuse a network filesystem before anything is created: the directory
/// if it exists, else its parent, is asked.
fn check_local(dir: &Path, opts: &FileOptions) -> Result<()> {
    if opts.allow_network_fs {
        return Ok(());
    }
    let asked = if dir.exists() { dir } else { parent_of(dir) };
    match crate::store::dir_network_fs(asked, opts.statfs_magic) {
        Some(fs) => {
            let shown = dir.display();
            Err(Error::store(
                format!("opening {shown}"),
                format!("{shown} is on {fs}, where flock is not reliable between machines; use a local disk (or allow_network_fs at your own risk)"),
            ))
        }
        None => Ok(()),
    }
}

/// Create `dir` (its last component only) if it does not exist.
fn create_dir(dir: &Path) -> Result<()> {
    let shown = dir.display().to_string();
    if !dir.exists() {
        let parent = parent_of(dir);
        if !parent.is_dir() {
            return Err(Error::store(
                format!("creating {shown}"),
                format!(
                    "its parent directory {} does not exist (only the last component is created)",
                    parent.display()
                ),
            ));
        }
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(|| format!("creating {shown}"))(e)),
        }
    }
    if !dir.is_dir() {
        return Err(Error::store(format!("opening {shown}"), "not a directory"));
    }
    Ok(())
}

impl FileStore {
    /// Open (creating if needed) the lease directory `dir`, durable.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(dir, FileOptions::default())
    }

    /// Open the lease directory `dir`, creating it if needed. Only the
    /// last component is created: a missing parent is an error naming it,
    /// so a typo in a path does not silently start a second set of locks.
    pub fn open_with(dir: impl AsRef<Path>, opts: FileOptions) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        check_local(&dir, &opts)?;
        create_dir(&dir)?;
        let clock: Arc<dyn Clock> = opts.clock.unwrap_or_else(|| Arc::new(BootClock));
        let clock_file = ClockFile::new(&dir, opts.durable);
        let clock = clock_file.open(clock, &current_boot(opts.boot_id))?;
        let bell = Bell::at(&dir.join("wake"));
        let identity = Identity::of(&dir, "lease directory")?;
        Ok(FileStore {
            dir,
            durable: opts.durable,
            clock,
            clock_file,
            fork: ForkGuard::new(),
            identity,
            bell,
            record_syncs: AtomicU64::new(0),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The record file of `key`.
    #[doc(hidden)]
    pub fn record_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{}.lease", encode_key(key)))
    }

    /// `fdatasync`s of record files issued by this handle (the clock
    /// file's are not counted).
    #[doc(hidden)]
    pub fn record_syncs(&self) -> u64 {
        self.record_syncs.load(Ordering::Relaxed)
    }
}

impl FileStore {
    /// The keys of the directory's record files that sort after `after`.
    fn keys_after(&self, after: &str) -> Result<Vec<String>> {
        let listing = || format!("listing {}", self.dir.display());
        let mut keys = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io_err(listing))? {
            let path = entry.map_err(io_err(listing))?.path();
            if path.extension().is_none_or(|e| e != "lease") {
                continue;
            }
            match slots::stored_key(&path)? {
                Some(key) if key.as_str() > after => keys.push(key),
                _ => {}
            }
        }
        Ok(keys)
    }
}

struct FileTxn<'s> {
    store: &'s FileStore,
    now_ms: u64,
    keys: Vec<Locked>,
    /// The wake-ups and events this transaction raised.
    journal: Journal,
}

impl Txn for FileTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn lease_mut(&mut self, key: &str, create: bool) -> Result<Option<&mut LeaseRecord>> {
        if let Some(i) = self.keys.iter().position(|k| k.key == key) {
            return Ok(Some(&mut self.keys[i].record));
        }
        let Some(locked) = Locked::open(self.store.record_path(key), key, create)? else {
            return Ok(None);
        };
        self.keys.push(locked);
        Ok(self.keys.last_mut().map(|k| &mut k.record))
    }

    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }

    /// Every record file of the directory is read for its key (names of
    /// long keys are hashed, so a file name does not give the key back):
    /// a page costs the whole directory, which for this store (the
    /// pidfile replacement) is small. Each record is read under its lock,
    /// one at a time, and copied.
    fn lease_scan(
        &mut self,
        after: &str,
        limit: usize,
        out: &mut Vec<(String, LeaseRecord)>,
    ) -> Result<()> {
        let mut keys = self.store.keys_after(after)?;
        keys.sort_unstable();
        for key in keys {
            if out.len() >= limit {
                break;
            }
            // A record this transaction holds is read from it (its file is
            // locked by us); any other under its own lock, released at once.
            let record = match self.keys.iter().position(|k| k.key == key) {
                Some(i) => Some(self.keys[i].record.clone()),
                None => Locked::open(self.store.record_path(&key), &key, false)?
                    .map(|locked| locked.record.clone()),
            };
            if let Some(record) = record.filter(|r| !r.slots.is_empty()) {
                out.push((key, record));
            }
        }
        Ok(())
    }

    /// Leases only: the one place this store refuses job work.
    fn jobs(&mut self) -> Result<&mut dyn JobTxn> {
        Err(Error::invalid(
            Field::Store,
            format!(
                "{} keeps leases only (run, lock); use a sqlite: or postgres:// store for queues",
                self.store.describe()
            ),
        ))
    }
}

impl FileStore {
    /// One transaction in the directory (see [`Store::transact`]).
    fn transact_here(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()> {
        let now_ms = self.clock.now_ms();
        // Before any record is written at `now_ms` (see the module docs).
        self.clock_file.persist(&self.clock, now_ms)?;
        let mut tx = FileTxn {
            store: self,
            now_ms,
            keys: Vec::new(),
            journal: Journal::default(),
        };
        f(&mut tx)?;
        // Commit: write each changed record, then close (dropping the locks).
        for k in tx.keys.iter().filter(|k| k.changed()) {
            k.write(self.durable, &self.record_syncs, torn::take())?;
        }
        let woke = tx.journal.woke();
        drop(tx);
        self.bell.ring(woke);
        Ok(())
    }
}

impl Store for FileStore {
    fn transact(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()> {
        self.fork.check()?;
        self.identity.check(false)?;
        let done = self.transact_here(f);
        if let Err(Error::Store { .. }) = &done {
            // An I/O error may mean the directory went away: say so if it did.
            self.identity.check(true)?;
        }
        done
    }

    fn describe(&self) -> String {
        format!("file:{}", self.dir.display())
    }

    fn epoch(&self, wake: Wake) -> u64 {
        self.bell.epoch(wake)
    }

    fn wait_epoch(&self, wake: Wake, epoch: u64, timeout: std::time::Duration) -> bool {
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
}
