//! The directory's clock state (`clock`: boot id, offset, high water),
//! read and written under `clock.lock`; the rule is
//! [`crate::store::boottime`]'s.

// This module's job is file I/O (clippy.toml keeps it out of the core).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use super::io_err;
use super::slots::open_locked;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::store::boottime::{self, Saved, StoreClock};
use crate::sync::{AtomicU64, Ordering};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The `clock` file of a lease directory.
#[derive(Debug)]
pub(super) struct ClockFile {
    dir: PathBuf,
    durable: bool,
    temp_seq: AtomicU64,
}

impl ClockFile {
    pub fn new(dir: &Path, durable: bool) -> Self {
        ClockFile {
            dir: dir.to_path_buf(),
            durable,
            temp_seq: AtomicU64::new(0),
        }
    }

    /// The stored state; `None` if the directory has none yet. Fields that
    /// do not parse read as a foreign boot with no high water.
    fn read(&self) -> Option<Saved> {
        let text = std::fs::read_to_string(self.dir.join("clock")).ok()?;
        if text.trim().is_empty() {
            return None;
        }
        let mut fields = text.split_whitespace();
        Some(Saved {
            boot_id: fields.next().unwrap_or("").to_owned(),
            offset_ms: fields.next().and_then(|s| s.parse().ok()).unwrap_or(0),
            high_water_ms: fields.next().and_then(|s| s.parse().ok()).unwrap_or(0),
        })
    }

    /// Settle this handle's store clock on `boot`, storing a new offset
    /// when the boot changed.
    pub fn open(&self, clock: Arc<dyn Clock>, boot: &str) -> Result<StoreClock> {
        let _lock = open_locked(&self.dir.join("clock.lock"))?;
        let saved = self.read();
        let (offset_ms, store) = boottime::rebase(saved.as_ref(), boot, clock.now_ms());
        let high_water_ms = saved.as_ref().map_or(0, |s| s.high_water_ms);
        if store {
            self.write(&Saved {
                boot_id: boot.to_owned(),
                offset_ms,
                high_water_ms,
            })?;
        }
        Ok(StoreClock::new(clock, offset_ms, high_water_ms))
    }

    /// Record `now_ms` as the high water (kept if a higher one is stored),
    /// if [`StoreClock::must_persist`] says so. Called before a
    /// transaction uses `now_ms`.
    pub fn persist(&self, clock: &StoreClock, now_ms: u64) -> Result<()> {
        if !clock.must_persist(now_ms) {
            return Ok(());
        }
        let _lock = open_locked(&self.dir.join("clock.lock"))?;
        let mut saved = self.read().unwrap_or(Saved {
            boot_id: "unknown-boot".to_owned(),
            offset_ms: 0,
            high_water_ms: 0,
        });
        saved.high_water_ms = saved.high_water_ms.max(now_ms);
        self.write(&saved)?;
        clock.persisted(now_ms);
        Ok(())
    }

    fn write(&self, saved: &Saved) -> Result<()> {
        let text = format!(
            "{} {} {}\n",
            saved.boot_id, saved.offset_ms, saved.high_water_ms
        );
        self.write_atomically(&self.dir.join("clock"), "clock", text.as_bytes())
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
