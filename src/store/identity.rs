//! Which file a store has open: the device and inode of a SQLite database
//! or a lease directory when it was opened, looked at again at most once a
//! second and after every failed transaction. A process whose database
//! was deleted (`rm app.db*`) or replaced (a restore moved over it) would
//! otherwise go on working on an inode nobody else can see; instead its
//! next transaction fails with a permanent error naming the file, so the
//! worker loop or the command stops and says why.
//!
//! # State
//! The identity taken at open, and the instant of the next look.
//!
//! # Invariants
//! Once a look finds the path gone or another file there, every later
//! look does too (the handle never follows the new file: it is not the
//! one whose locks and tokens this process used).

// This module's job is the file system (clippy.toml keeps it out of the core).
#![allow(clippy::disallowed_methods)]

use crate::error::{Error, Result};
use crate::sync::{AtomicU64, Ordering};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a store looks at its file when nothing fails.
pub(crate) const LOOK_EVERY: Duration = Duration::from_secs(1);

/// A store's file and the identity it had at open; see the module docs.
#[derive(Debug)]
pub(crate) struct Identity {
    path: PathBuf,
    /// What it is, for the message ("database file", "lease directory").
    what: &'static str,
    dev: u64,
    ino: u64,
    base: Instant,
    /// Milliseconds after `base` of the next look.
    next_look_ms: AtomicU64,
    /// What a look found, once it found the file gone or replaced.
    gone: std::sync::OnceLock<String>,
}

impl Identity {
    /// The identity of `path` now.
    pub(crate) fn of(path: &Path, what: &'static str) -> Result<Identity> {
        let meta = std::fs::metadata(path)
            .map_err(|e| Error::store(format!("opening {}", path.display()), e.to_string()))?;
        Ok(Identity {
            path: path.to_path_buf(),
            what,
            dev: meta.dev(),
            ino: meta.ino(),
            base: Instant::now(),
            next_look_ms: AtomicU64::new(LOOK_EVERY.as_millis() as u64),
            gone: std::sync::OnceLock::new(),
        })
    }

    /// `Err` naming the file if it is gone or another file took its
    /// place; `now` looks at once, else only when a second has passed
    /// since the last look.
    pub(crate) fn check(&self, now: bool) -> Result<()> {
        if let Some(found) = self.gone.get() {
            return Err(self.error(found));
        }
        let elapsed = self.base.elapsed().as_millis() as u64;
        if !now && elapsed < self.next_look_ms.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.next_look_ms
            .store(elapsed + LOOK_EVERY.as_millis() as u64, Ordering::Relaxed);
        let found = match std::fs::metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == (self.dev, self.ino) => return Ok(()),
            Ok(meta) => format!(
                "was replaced by another file (inode {} where this process opened inode {})",
                meta.ino(),
                self.ino
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "was deleted".to_owned(),
            // Unreadable for another reason (permissions, I/O): not proof
            // of a replacement; the transaction's own error says more.
            Err(_) => return Ok(()),
        };
        Err(self.error(self.gone.get_or_init(|| found)))
    }

    fn error(&self, found: &str) -> Error {
        let shown = self.path.display();
        Error::store(
            format!("using {shown}"),
            format!(
                "the {} {shown} {found} while this process had it open: it no longer shares anything with the processes that open {shown} now; stop and start again",
                self.what
            ),
        )
    }
}
