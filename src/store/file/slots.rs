//! The record file on disk: two checksummed slots with a sequence number,
//! the durable watermark, the `flock` that makes the file its key's lock,
//! and the writes (which slot, and when to `fdatasync`: see the module
//! docs of [`super`]).

// This module's job is file I/O (clippy.toml keeps it out of the core).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use super::io_err;
use super::record::{parse, record_key, render};
use crate::core::LeaseRecord;
use crate::error::{Error, Result, StoreFailure};
use crate::sync::{AtomicU64, Ordering};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Where the second slot starts (the file is sparse up to it).
pub(super) const SLOT_BYTES: u64 = 16 << 20;
/// Slot header: magic, sequence number, payload length, checksum.
const HEADER_BYTES: usize = 4 + 8 + 4 + 8;
/// The slot format this build writes: the checksum covers the sequence
/// number and the length as well as the payload, so a write torn inside
/// the header (a new sequence number over an older slot's whole record)
/// never reads as a newer record.
const SLOT_MAGIC: &[u8; 4] = b"LHS2";
/// The first format (still read): the checksum covers the payload only.
const SLOT_MAGIC_V1: &[u8; 4] = b"LHS1";
/// The durable watermark: the sequence number of the newest record known
/// to be on disk, and its checksum, in the last bytes before slot 1.
const WATERMARK_BYTES: u64 = 16;
const WATERMARK_AT: u64 = SLOT_BYTES - WATERMARK_BYTES;
/// Longest record a slot holds.
const RECORD_MAX: u64 = WATERMARK_AT - HEADER_BYTES as u64;

/// What one slot holds: its sequence number and record (or why the
/// record could not be read).
type SlotRead = (u64, std::result::Result<LeaseRecord, String>);

/// How much of a slot one read takes (header and a short record at once).
const SLOT_READ_BYTES: usize = 4096;

/// The record of one slot, if the slot holds a valid one.
fn read_slot(file: &File, slot: u64, key: &str) -> std::io::Result<Option<SlotRead>> {
    let Some((seq, payload)) = read_payload(file, slot)? else {
        return Ok(None);
    };
    let parsed = std::str::from_utf8(&payload)
        .map_err(|_| "record is not text".to_owned())
        .and_then(|text| parse(text, key));
    Ok(Some((seq, parsed)))
}

/// The sequence number and record text of one slot, if its header and
/// checksum are whole.
fn read_payload(file: &File, slot: u64) -> std::io::Result<Option<(u64, Vec<u8>)>> {
    let base = slot * SLOT_BYTES;
    let mut buf = vec![0u8; SLOT_READ_BYTES];
    let n = read_full(file, &mut buf, base)?;
    if n < HEADER_BYTES {
        return Ok(None);
    }
    let v1 = match &buf[..4] {
        m if m == SLOT_MAGIC => false,
        m if m == SLOT_MAGIC_V1 => true,
        _ => return Ok(None),
    };
    let seq = u64::from_le_bytes(buf[4..12].try_into().unwrap_or_default());
    let len = u32::from_le_bytes(buf[12..16].try_into().unwrap_or_default()) as usize;
    let sum = u64::from_le_bytes(buf[16..24].try_into().unwrap_or_default());
    if len as u64 > RECORD_MAX {
        return Ok(None);
    }
    let end = HEADER_BYTES + len;
    if end > SLOT_READ_BYTES {
        // A long record: read the rest.
        buf.resize(end, 0);
        let rest = read_full(
            file,
            &mut buf[SLOT_READ_BYTES..],
            base + SLOT_READ_BYTES as u64,
        )?;
        if SLOT_READ_BYTES + rest < end {
            return Ok(None); // torn or never completed
        }
    } else if n < end {
        return Ok(None); // torn or never completed
    }
    let covered = if v1 { 0 } else { 12 }; // v2: seq and len too
    if checksum_parts(&[&buf[4..4 + covered], &buf[HEADER_BYTES..end]]) != sum {
        return Ok(None); // torn or never completed
    }
    buf.truncate(end);
    buf.drain(..HEADER_BYTES);
    Ok(Some((seq, buf)))
}

/// The key a record file holds, read without its lock (for listings):
/// every valid slot of a file names the same key, and a slot being
/// written fails its checksum. `None` for a file with no valid slot yet.
pub(super) fn stored_key(path: &Path) -> Result<Option<String>> {
    let reading = || format!("reading {}", path.display());
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(reading)(e)),
    };
    for slot in 0..2 {
        if let Some((_, payload)) = read_payload(&file, slot).map_err(io_err(reading))? {
            let text = String::from_utf8_lossy(&payload);
            return Ok(record_key(&text));
        }
    }
    Ok(None)
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

/// The durable watermark, if one was written and is whole.
fn read_watermark(file: &File) -> std::io::Result<Option<u64>> {
    let mut bytes = [0u8; WATERMARK_BYTES as usize];
    if read_full(file, &mut bytes, WATERMARK_AT)? < bytes.len() {
        return Ok(None);
    }
    let (seq, sum) = bytes.split_at(8);
    let whole = u64::from_le_bytes(sum.try_into().unwrap_or_default()) == checksum_bytes(seq);
    let seq = u64::from_le_bytes(seq.try_into().unwrap_or_default());
    Ok((whole && seq > 0).then_some(seq))
}

pub(super) fn checksum_bytes(bytes: &[u8]) -> u64 {
    checksum_parts(&[bytes])
}

/// [`checksum_bytes`] of the parts one after the other.
fn checksum_parts(parts: &[&[u8]]) -> u64 {
    parts
        .iter()
        .flat_map(|p| p.iter())
        .fold(0xCBF2_9CE4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
        })
}

/// Take an exclusive `flock` on `file` (blocking; EINTR retried).
pub(super) fn flock(file: &File, path: &Path) -> Result<()> {
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

/// Open (creating) and lock `path`.
pub(super) fn open_locked(path: &Path) -> Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io_err(|| format!("opening {}", path.display())))?;
    flock(&file, path)?;
    Ok(file)
}

/// A key's record file, locked for one transaction (closing it unlocks).
pub(super) struct Locked {
    pub key: String,
    pub path: PathBuf,
    file: File,
    /// The slot holding the current record and its sequence number.
    current: Option<(u64, u64)>,
    /// The sequence number of each slot's valid record.
    seqs: [Option<u64>; 2],
    pub original: Option<LeaseRecord>,
    pub record: LeaseRecord,
}

impl Locked {
    /// Open and lock the record file of `key` at `path` and read its
    /// record: `None` if there is none and not `create`; an error naming
    /// the file if no slot holds a valid record (the file is left as it is).
    pub fn open(path: PathBuf, key: &str, create: bool) -> Result<Option<Locked>> {
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
        let mut seqs = [None; 2];
        for slot in 0..2 {
            match read_slot(&file, slot, key).map_err(io_err(reading))? {
                Some((seq, Ok(rec))) => {
                    seqs[slot as usize] = Some(seq);
                    if best.as_ref().is_none_or(|b| seq > b.1) {
                        best = Some((slot, seq, rec));
                    }
                }
                Some((_, Err(why))) => broken = Some(why),
                _ => {}
            }
        }
        if best.is_none() && file.metadata().map_err(io_err(reading))?.len() > 0 {
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
        Ok(Some(Locked {
            key: key.to_owned(),
            path,
            file,
            current,
            seqs,
            record: original.clone().unwrap_or_default(),
            original,
        }))
    }

    /// Whether the transaction changed the record.
    pub fn changed(&self) -> bool {
        self.original.as_ref() != Some(&self.record)
    }

    /// Whether the new record must be on disk before the transaction
    /// returns: unless all it does is drop holder slots (a release,
    /// expired slots pruned), which a power loss may forget (module docs).
    fn must_sync(&self) -> bool {
        let Some(original) = &self.original else {
            return true;
        };
        let only_drops = self.record.last_token == original.last_token
            && self.record.limit == original.limit
            && self.record.slots.iter().all(|s| original.slots.contains(s));
        !only_drops
    }

    /// Where the new record goes, and whether the file must be synced
    /// first. Not durable: the slot that does not hold the current record.
    /// Durable: the slot that does not hold the newest record known to be
    /// on disk (the watermark's), so that record stays in force whatever a
    /// power loss or a torn write does to the slot written; when neither
    /// slot holds it (no watermark yet, or a stale one), sync first, which
    /// puts the current record on disk, and write the other slot.
    fn plan(&self, durable: bool) -> std::io::Result<(u64, bool)> {
        let Some((current, _)) = self.current else {
            return Ok((0, false));
        };
        if !durable {
            return Ok((1 - current, false));
        }
        let on_disk = read_watermark(&self.file)?
            .and_then(|d| (0..2u64).find(|&s| self.seqs[s as usize] == Some(d)));
        Ok(match on_disk {
            Some(slot) => (1 - slot, false),
            None => (1 - current, true),
        })
    }

    /// `fdatasync` the file, counted in `syncs`.
    fn sync(&self, syncs: &AtomicU64) -> std::io::Result<()> {
        syncs.fetch_add(1, Ordering::Relaxed);
        self.file.sync_data()
    }

    /// Record that the record `seq` is on disk (not synced itself: a lost
    /// or torn watermark only makes the next writer sync first).
    fn write_watermark(&self, seq: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut bytes = [0u8; WATERMARK_BYTES as usize];
        bytes[..8].copy_from_slice(&seq.to_le_bytes());
        let sum = checksum_bytes(&bytes[..8]);
        bytes[8..].copy_from_slice(&sum.to_le_bytes());
        self.file.write_all_at(&bytes, WATERMARK_AT)
    }

    /// The slot image of the record with sequence number `seq`.
    fn encode(&self, seq: u64) -> Result<Vec<u8>> {
        let payload = render(&self.key, &self.record).into_bytes();
        if payload.len() as u64 > RECORD_MAX {
            return Err(Error::store(
                format!("writing {}", self.path.display()),
                "record larger than a slot",
            ));
        }
        let mut buf = Vec::with_capacity(HEADER_BYTES + payload.len());
        buf.extend_from_slice(SLOT_MAGIC);
        buf.extend_from_slice(&seq.to_le_bytes());
        buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        let sum = checksum_parts(&[&buf[4..16], &payload]);
        buf.extend_from_slice(&sum.to_le_bytes());
        buf.extend_from_slice(&payload);
        Ok(buf)
    }

    /// Write the record (see [`Locked::plan`] and [`Locked::must_sync`]);
    /// `fdatasync`s are counted in `syncs`. With `tear` (the simulator's
    /// storage fault), only that many bytes of the slot are written and the
    /// write fails, as when the process dies in the middle of it.
    pub fn write(&self, durable: bool, syncs: &AtomicU64, tear: Option<usize>) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let writing = || format!("writing {}", self.path.display());
        let (slot, sync_first) = self.plan(durable).map_err(io_err(writing))?;
        let seq = self.current.map_or(1, |(_, seq)| seq + 1);
        debug_assert!(self
            .current
            .is_none_or(|(cur, _)| !sync_first || slot != cur));
        let buf = self.encode(seq)?;
        if let (true, Some((_, current_seq))) = (sync_first, self.current) {
            self.sync(syncs)
                .and_then(|()| self.write_watermark(current_seq))
                .map_err(io_err(writing))?;
        }
        if let Some(n) = tear {
            self.file
                .write_all_at(&buf[..n.min(buf.len())], slot * SLOT_BYTES)
                .map_err(io_err(writing))?;
            return Err(Error::store(writing(), "torn write (injected)"));
        }
        self.file
            .write_all_at(&buf, slot * SLOT_BYTES)
            .map_err(io_err(writing))?;
        if durable && self.must_sync() {
            // The record is in place for every reader now: if it cannot be
            // confirmed on disk, nobody can tell the caller what happened.
            self.sync(syncs)
                .and_then(|()| self.write_watermark(seq))
                .map_err(|e| io_err(writing)(e).with_failure(StoreFailure::Ambiguous))?;
        }
        Ok(())
    }
}
