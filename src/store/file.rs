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
//! number, length, checksum) and a short text record: a version line, the
//! key (hex), the key's token counter, one line per holder slot. A write
//! goes to the slot that does not hold the current record, with the next
//! sequence number; a reader takes the valid slot with the highest sequence.
//! A write torn by a crash leaves the other slot, the previous record, in
//! force: no rename, no directory fsync, and one `fdatasync` per write in
//! durable mode (none otherwise). If neither slot is valid the file is
//! reported as corrupt, naming it, and left as it is: silently resetting it
//! would lose the token counter and break fencing (L2).
//!
//! # Clock
//! As for SQLite: the machine's boot-time clock plus an offset kept in the
//! directory (`clock` file), so store time is shared by every process of
//! the machine, immune to wall-clock steps, and continues above its highest
//! value after a reboot.
//!
//! # Scope
//! Leases only (counting leases included). Jobs need the ordered indexes of
//! a database: every job operation answers a clear error pointing to
//! `sqlite:`.
//!
//! Durability: durable mode survives power loss after each commit;
//! otherwise a commit survives the process (the page cache has it), not the
//! machine.
//!
//! Directories on NFS, SMB/CIFS or FUSE are refused unless
//! `FileOptions::allow_network_fs`: `flock` there is not reliable between
//! machines.

// This module's job is file I/O (clippy.toml keeps it out of the core).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use crate::clock::{boot_id, BootClock, Clock};
use crate::core::{mix64, HolderId, JobTxn, LeaseRecord, LeaseSlot, Txn, Wake};
use crate::error::{Error, Result};
use crate::fork::ForkGuard;
use crate::store::network_fs;
use crate::store::{Epochs, Store};
use crate::Holder;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The record version this build writes. v2 added the `limit` line; v1
/// records (no limit recorded) are still read.
const VERSION_LINE: &str = "leasehold-lease v2";
const VERSION_LINE_V1: &str = "leasehold-lease v1";
/// Where the second slot starts (the file is sparse up to it).
const SLOT_BYTES: u64 = 16 << 20;
/// Slot header: magic, sequence number, payload length, payload checksum.
const HEADER_BYTES: usize = 4 + 8 + 4 + 8;
const SLOT_MAGIC: &[u8; 4] = b"LHS1";
/// Longest encoded file name stem; longer keys are shortened and hashed.
const MAX_STEM: usize = 160;

/// Options of [`FileStore::open_with`].
#[derive(Debug, Clone)]
pub struct FileOptions {
    /// `fdatasync` every record write (default true).
    pub durable: bool,
    /// Open a directory on NFS, SMB or FUSE anyway.
    pub allow_network_fs: bool,
    /// The clock (default: [`BootClock`]).
    pub clock: Option<Arc<dyn Clock>>,
    /// The boot id (default: the kernel's).
    pub boot_id: Option<String>,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            durable: true,
            allow_network_fs: false,
            clock: None,
            boot_id: None,
        }
    }
}

/// The file [`Store`] (leases only).
pub struct FileStore {
    dir: PathBuf,
    durable: bool,
    clock: Arc<dyn Clock>,
    offset_ms: i64,
    high_water_ms: AtomicU64,
    persisted_ms: AtomicU64,
    temp_seq: AtomicU64,
    fork: ForkGuard,
    /// Wake-ups for this process's waiters (a release wakes an acquire).
    epochs: Epochs,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore").field("dir", &self.dir).finish()
    }
}

fn io_err(what: impl FnOnce() -> String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::store(what(), e.to_string())
}

/// A file name stem for `key`: bytes outside `[A-Za-z0-9_-]` are written
/// `%XX`, so `..`, `/`, NUL-free unicode and absolute paths all stay inside
/// the directory; a stem longer than 160 bytes keeps its first 120 and
/// appends a 128-bit hash of the whole key (the record stores the full key
/// and is checked on every read, so a hash collision is an error, never a
/// shared lease).
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for &b in key.as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() <= MAX_STEM {
        return out;
    }
    let (mut h1, mut h2) = (0x5EED_u64, 0x00C0_FFEE_u64);
    for &b in key.as_bytes() {
        h1 = mix64(h1 ^ u64::from(b));
        h2 = mix64(h2.rotate_left(7) ^ u64::from(b));
    }
    let mut cut = 120;
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{h1:016x}{h2:016x}", &out[..cut])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn checksum(body: &str) -> u64 {
    body.bytes().fold(0xCBF2_9CE4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    })
}

/// Serialize a record (see the module docs).
fn render(key: &str, rec: &LeaseRecord) -> String {
    let mut body = format!(
        "{VERSION_LINE}\nkey {}\nlast_token {}\nlimit {}\n",
        hex(key.as_bytes()),
        rec.last_token,
        rec.limit
    );
    for s in &rec.slots {
        let label = s
            .holder
            .label
            .as_deref()
            .map_or("-".to_owned(), |l| hex(l.as_bytes()));
        body += &format!(
            "slot {} {} {} {label}\n",
            s.token,
            uuid::Uuid::from_u128(s.holder.id.0).hyphenated(),
            s.expires_at_ms
        );
    }
    let sum = checksum(&body);
    body + &format!("checksum {sum:016x}\n")
}

/// Parse a record; `None` if it is torn, corrupt or not ours.
fn parse(text: &str, key: &str) -> std::result::Result<LeaseRecord, String> {
    let (body, last) = text
        .trim_end_matches('\n')
        .rsplit_once('\n')
        .ok_or("truncated record")?;
    let body = format!("{body}\n");
    let sum = last
        .strip_prefix("checksum ")
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .ok_or("missing checksum (truncated record?)")?;
    if sum != checksum(&body) {
        return Err("checksum mismatch (corrupt record)".into());
    }
    let mut lines = body.lines();
    let v1 = match lines.next() {
        Some(VERSION_LINE) => false,
        Some(VERSION_LINE_V1) => true,
        _ => return Err("unknown record version (written by a newer leasehold?)".into()),
    };
    let stored = lines
        .next()
        .and_then(|l| l.strip_prefix("key "))
        .and_then(unhex)
        .ok_or("bad key line")?;
    if stored != key.as_bytes() {
        return Err(format!(
            "record belongs to another key ({:?}); file names collided",
            String::from_utf8_lossy(&stored)
        ));
    }
    let last_token = lines
        .next()
        .and_then(|l| l.strip_prefix("last_token "))
        .and_then(|t| t.parse().ok())
        .ok_or("bad last_token line")?;
    let limit = if v1 {
        0
    } else {
        lines
            .next()
            .and_then(|l| l.strip_prefix("limit "))
            .and_then(|t| t.parse().ok())
            .ok_or("bad limit line")?
    };
    let mut slots = Vec::new();
    for line in lines {
        let f: Vec<&str> = line.split(' ').collect();
        let [tag, token, holder, expires, label] = f[..] else {
            return Err(format!("bad line {line:?}"));
        };
        if tag != "slot" {
            return Err(format!("bad line {line:?}"));
        }
        let label = match label {
            "-" => None,
            h => Some(Arc::from(
                String::from_utf8(unhex(h).ok_or("bad label")?)
                    .map_err(|_| "bad label")?
                    .as_str(),
            )),
        };
        slots.push(LeaseSlot {
            token: token.parse().map_err(|_| "bad token")?,
            holder: Holder {
                id: HolderId::parse(holder).map_err(|_| "bad holder")?,
                label,
            },
            expires_at_ms: expires.parse().map_err(|_| "bad expiry")?,
        });
    }
    Ok(LeaseRecord {
        last_token,
        limit,
        slots,
    })
}

/// The record of one slot, if the slot holds a valid one.
fn read_slot(
    file: &File,
    slot: u64,
    key: &str,
) -> std::io::Result<Option<(u64, std::result::Result<LeaseRecord, String>)>> {
    let mut header = [0u8; HEADER_BYTES];
    let base = slot * SLOT_BYTES;
    let n = read_full(file, &mut header, base)?;
    if n < HEADER_BYTES || &header[..4] != SLOT_MAGIC {
        return Ok(None);
    }
    let seq = u64::from_le_bytes(header[4..12].try_into().unwrap_or_default());
    let len = u32::from_le_bytes(header[12..16].try_into().unwrap_or_default()) as usize;
    let sum = u64::from_le_bytes(header[16..24].try_into().unwrap_or_default());
    if len as u64 > SLOT_BYTES - HEADER_BYTES as u64 {
        return Ok(None);
    }
    let mut payload = vec![0u8; len];
    let got = read_full(file, &mut payload, base + HEADER_BYTES as u64)?;
    if got < len || checksum_bytes(&payload) != sum {
        return Ok(None); // torn or never completed
    }
    let parsed = std::str::from_utf8(&payload)
        .map_err(|_| "record is not text".to_owned())
        .and_then(|text| parse(text, key));
    Ok(Some((seq, parsed)))
}

/// Read up to `buf.len()` bytes at `offset`; returns how many (short at EOF).
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn checksum_bytes(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    })
}

/// Take an exclusive `flock` on `file` (blocking; EINTR retried).
fn flock(file: &File, path: &Path) -> Result<()> {
    loop {
        // SAFETY: a valid open file descriptor.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::store(
                format!("locking {}", path.display()),
                e.to_string(),
            ));
        }
    }
}

fn open_lock(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io_err(|| format!("opening {}", path.display())))
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
        let shown = dir.display().to_string();
        if !dir.exists() {
            let parent = match dir.parent() {
                Some(p) if p.as_os_str().is_empty() => Path::new("."),
                Some(p) => p,
                None => Path::new("/"),
            };
            if !parent.is_dir() {
                return Err(Error::store(
                    format!("creating {shown}"),
                    format!(
                        "its parent directory {} does not exist (only the last component is created)",
                        parent.display()
                    ),
                ));
            }
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(|| format!("creating {shown}"))(e)),
            }
        }
        if !dir.is_dir() {
            return Err(Error::store(format!("opening {shown}"), "not a directory"));
        }
        if let (Some(fs), false) = (network_fs(&dir), opts.allow_network_fs) {
            return Err(Error::store(
                format!("opening {shown}"),
                format!("{shown} is on {fs}, where flock is not reliable between machines; use a local disk (or allow_network_fs at your own risk)"),
            ));
        }
        let clock = opts.clock.unwrap_or_else(|| Arc::new(BootClock));
        let boot = opts
            .boot_id
            .or_else(boot_id)
            .unwrap_or_else(|| "unknown-boot".into());
        let mut store = FileStore {
            dir,
            durable: opts.durable,
            clock,
            offset_ms: 0,
            high_water_ms: AtomicU64::new(0),
            persisted_ms: AtomicU64::new(0),
            temp_seq: AtomicU64::new(0),
            fork: ForkGuard::new(),
            epochs: Epochs::default(),
        };
        store.init_clock(&boot)?;
        Ok(store)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The record file of `key`.
    pub fn record_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{}.lease", encode_key(key)))
    }

    fn init_clock(&mut self, boot: &str) -> Result<()> {
        let lock_path = self.dir.join("clock.lock");
        let lock = open_lock(&lock_path)?;
        flock(&lock, &lock_path)?;
        let path = self.dir.join("clock");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut fields = text.split_whitespace();
        let (stored_boot, offset, high) = (
            fields.next().unwrap_or(""),
            fields
                .next()
                .and_then(|s| s.parse::<i64>().ok())
                .unwrap_or(0),
            fields
                .next()
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0),
        );
        let now = i64::try_from(self.clock.now_ms()).unwrap_or(i64::MAX);
        self.offset_ms = if stored_boot == boot {
            offset
        } else {
            // A new boot (or directory): continue above the high water.
            let offset = i64::try_from(high)
                .unwrap_or(i64::MAX)
                .saturating_add(1)
                .saturating_sub(now)
                .max(0);
            self.write_clock(boot, offset, high)?;
            offset
        };
        self.high_water_ms.store(high, Ordering::SeqCst);
        self.persisted_ms.store(high, Ordering::SeqCst);
        Ok(())
    }

    fn write_clock(&self, boot: &str, offset: i64, high: u64) -> Result<()> {
        self.write_atomically(
            &self.dir.join("clock"),
            "clock",
            format!("{boot} {offset} {high}\n").as_bytes(),
        )
    }

    fn now_ms(&self) -> u64 {
        let raw = i64::try_from(self.clock.now_ms())
            .unwrap_or(i64::MAX)
            .saturating_add(self.offset_ms);
        let now = u64::try_from(raw).unwrap_or(0);
        now.max(self.high_water_ms.fetch_max(now, Ordering::SeqCst))
    }

    /// About once a second, record the clock's high water for reboots.
    fn persist_clock(&self, now: u64) -> Result<()> {
        if now
            <= self
                .persisted_ms
                .load(Ordering::Relaxed)
                .saturating_add(1000)
        {
            return Ok(());
        }
        let lock_path = self.dir.join("clock.lock");
        let lock = open_lock(&lock_path)?;
        flock(&lock, &lock_path)?;
        let path = self.dir.join("clock");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut f = text.split_whitespace();
        let boot = f.next().unwrap_or("unknown-boot").to_owned();
        let offset = f
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(self.offset_ms);
        let high = f
            .next()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
            .max(now);
        self.write_clock(&boot, offset, high)?;
        self.persisted_ms.fetch_max(now, Ordering::Relaxed);
        Ok(())
    }

    /// Write `bytes` to `path` through a temp file and a rename (fsyncs
    /// in durable mode). Only the clock file is written this way.
    fn write_atomically(&self, path: &Path, stem: &str, bytes: &[u8]) -> Result<()> {
        let seq = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{stem}.tmp.{}.{seq}", std::process::id()));
        let shown = || format!("writing {}", path.display());
        let mut f = File::create(&tmp).map_err(io_err(shown))?;
        f.write_all(bytes).map_err(io_err(shown))?;
        if self.durable {
            f.sync_all().map_err(io_err(shown))?;
        }
        drop(f);
        if let Err(e) = std::fs::rename(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::store(shown(), e.to_string()));
        }
        if self.durable {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err(|| format!("syncing {}", self.dir.display())))?;
        }
        Ok(())
    }
}

struct Locked {
    key: String,
    path: PathBuf,
    file: File,
    /// The slot holding the current record and its sequence number.
    current: Option<(u64, u64)>,
    original: Option<LeaseRecord>,
    record: LeaseRecord,
}

struct FileTxn<'s> {
    store: &'s FileStore,
    now_ms: u64,
    keys: Vec<Locked>,
    /// The [`Wake`] events this transaction raised.
    woke: [bool; 2],
}

impl Txn for FileTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn lease_mut(&mut self, key: &str, create: bool) -> Result<Option<&mut LeaseRecord>> {
        if let Some(i) = self.keys.iter().position(|k| k.key == key) {
            return Ok(Some(&mut self.keys[i].record));
        }
        let path = self.store.record_path(key);
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(Error::store(
                    format!("opening {}", path.display()),
                    e.to_string(),
                ))
            }
        };
        flock(&file, &path)?;
        let reading = || format!("reading {}", path.display());
        let mut best: Option<(u64, u64, LeaseRecord)> = None;
        let mut broken = None;
        for slot in 0..2 {
            match read_slot(&file, slot, key).map_err(io_err(reading))? {
                Some((seq, Ok(rec))) if best.as_ref().is_none_or(|b| seq > b.1) => {
                    best = Some((slot, seq, rec));
                }
                Some((_, Err(why))) => broken = Some(why),
                _ => {}
            }
        }
        let len = file.metadata().map_err(io_err(reading))?.len();
        if best.is_none() && len > 0 {
            let why =
                broken.unwrap_or_else(|| "no valid record slot (corrupt or truncated)".into());
            return Err(Error::store(
                reading(),
                format!("{why}; the file is left as it is"),
            ));
        }
        if best.is_none() && !create {
            return Ok(None);
        }
        let (current, original) = match best {
            Some((slot, seq, rec)) => (Some((slot, seq)), Some(rec)),
            None => (None, None),
        };
        self.keys.push(Locked {
            key: key.to_owned(),
            path,
            file,
            current,
            record: original.clone().unwrap_or_default(),
            original,
        });
        let last = self.keys.len() - 1;
        Ok(Some(&mut self.keys[last].record))
    }

    fn wake(&mut self, wake: Wake) {
        self.woke[wake.index()] = true;
    }

    /// Leases only: the one place this store refuses job work.
    fn jobs(&mut self) -> Result<&mut dyn JobTxn> {
        Err(Error::invalid(
            "store",
            format!(
                "{} keeps leases only (run, lock); use a sqlite: or postgres:// store for queues",
                self.store.describe()
            ),
        ))
    }
}

impl FileStore {
    /// Write `rec` into the slot that does not hold the current record.
    fn write_record(&self, k: &Locked) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let (slot, seq) = match k.current {
            Some((slot, seq)) => (1 - slot, seq + 1),
            None => (0, 1),
        };
        let payload = render(&k.key, &k.record).into_bytes();
        let writing = || format!("writing {}", k.path.display());
        if payload.len() as u64 > SLOT_BYTES - HEADER_BYTES as u64 {
            return Err(Error::store(writing(), "record larger than a slot"));
        }
        let mut buf = Vec::with_capacity(HEADER_BYTES + payload.len());
        buf.extend_from_slice(SLOT_MAGIC);
        buf.extend_from_slice(&seq.to_le_bytes());
        buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        buf.extend_from_slice(&checksum_bytes(&payload).to_le_bytes());
        buf.extend_from_slice(&payload);
        k.file
            .write_all_at(&buf, slot * SLOT_BYTES)
            .map_err(io_err(writing))?;
        if self.durable {
            k.file.sync_data().map_err(io_err(writing))?;
        }
        Ok(())
    }
}

impl Store for FileStore {
    fn transact(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()> {
        self.fork.check()?;
        let now_ms = self.now_ms();
        let mut tx = FileTxn {
            store: self,
            now_ms,
            keys: Vec::new(),
            woke: [false; 2],
        };
        f(&mut tx)?;
        // Commit: write each changed record, then close (dropping the locks).
        for k in &tx.keys {
            if k.original.as_ref() != Some(&k.record) {
                self.write_record(k)?;
            }
        }
        let woke = tx.woke;
        drop(tx);
        self.epochs.raise(woke);
        self.persist_clock(now_ms)
    }

    fn describe(&self) -> String {
        format!("file:{}", self.dir.display())
    }

    fn epoch(&self, wake: Wake) -> u64 {
        self.epochs.epoch(wake)
    }

    fn wait_epoch(&self, wake: Wake, epoch: u64, timeout: std::time::Duration) -> bool {
        self.epochs.wait(wake, epoch, timeout)
    }
}
