//! The record file on disk: two checksummed slots with a sequence number,
//! the `flock` that makes the file its key's lock, and the writes.

// This module's job is file I/O (clippy.toml keeps it out of the core).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use super::io_err;
use super::record::{parse, render};
use crate::core::LeaseRecord;
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Where the second slot starts (the file is sparse up to it).
pub(super) const SLOT_BYTES: u64 = 16 << 20;
/// Slot header: magic, sequence number, payload length, payload checksum.
const HEADER_BYTES: usize = 4 + 8 + 4 + 8;
const SLOT_MAGIC: &[u8; 4] = b"LHS1";
/// Longest record a slot holds.
const RECORD_MAX: u64 = SLOT_BYTES - HEADER_BYTES as u64;

/// What one slot holds: its sequence number and record (or why the
/// record could not be read).
type SlotRead = (u64, std::result::Result<LeaseRecord, String>);

/// The record of one slot, if the slot holds a valid one.
fn read_slot(file: &File, slot: u64, key: &str) -> std::io::Result<Option<SlotRead>> {
    let mut header = [0u8; HEADER_BYTES];
    let base = slot * SLOT_BYTES;
    let n = read_full(file, &mut header, base)?;
    if n < HEADER_BYTES || &header[..4] != SLOT_MAGIC {
        return Ok(None);
    }
    let seq = u64::from_le_bytes(header[4..12].try_into().unwrap_or_default());
    let len = u32::from_le_bytes(header[12..16].try_into().unwrap_or_default()) as usize;
    let sum = u64::from_le_bytes(header[16..24].try_into().unwrap_or_default());
    if len as u64 > RECORD_MAX {
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

pub(super) fn checksum_bytes(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325_u64, |h, &b| {
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
        Ok(Some(Locked {
            key: key.to_owned(),
            path,
            file,
            current,
            record: original.clone().unwrap_or_default(),
            original,
        }))
    }

    /// Whether the transaction changed the record.
    pub fn changed(&self) -> bool {
        self.original.as_ref() != Some(&self.record)
    }

    /// Write the record into the slot that does not hold the current one
    /// (`fdatasync` if `durable`).
    pub fn write(&self, durable: bool) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let (slot, seq) = match self.current {
            Some((slot, seq)) => (1 - slot, seq + 1),
            None => (0, 1),
        };
        let payload = render(&self.key, &self.record).into_bytes();
        let writing = || format!("writing {}", self.path.display());
        if payload.len() as u64 > RECORD_MAX {
            return Err(Error::store(writing(), "record larger than a slot"));
        }
        let mut buf = Vec::with_capacity(HEADER_BYTES + payload.len());
        buf.extend_from_slice(SLOT_MAGIC);
        buf.extend_from_slice(&seq.to_le_bytes());
        buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        buf.extend_from_slice(&checksum_bytes(&payload).to_le_bytes());
        buf.extend_from_slice(&payload);
        self.file
            .write_all_at(&buf, slot * SLOT_BYTES)
            .map_err(io_err(writing))?;
        if durable {
            self.file.sync_data().map_err(io_err(writing))?;
        }
        Ok(())
    }
}
