//! The connection: error mapping, the busy handler, and the
//! [`GroupConn`] actions in SQL.

use super::cache::RowCache;
use super::group::GroupConn;
use super::hot::{Hot, HotConn};
use crate::error::{Error, Result, StoreFailure};
use rusqlite::Connection;
use std::time::Duration;

pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Map a SQLite error to a typed store error naming what was being done;
/// the driver's error is kept as the source. Busy and locked are transient.
pub(super) fn sql_err(context: impl FnOnce() -> String, e: rusqlite::Error) -> Error {
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

thread_local! {
    /// When the current wait for SQLite's write lock began, and how long it
    /// may last (set per transaction by the thread that holds the store).
    static BUSY: std::cell::Cell<(Option<std::time::Instant>, Duration)> =
        const { std::cell::Cell::new((None, Duration::from_secs(5))) };
}

/// Give this thread's next waits for the write lock `limit`.
pub(super) fn arm_busy(limit: Duration) {
    BUSY.with(|b| b.set((None, limit)));
}

/// SQLite's busy handler: short jittered sleeps (50 µs growing to 2 ms)
/// instead of SQLite's default of 1 ms and up, so that processes sharing a
/// database hand the write lock over quickly; gives up (SQLITE_BUSY, which
/// the client retries up to its own deadline) after the store's busy timeout.
// Real time is this adapter's business (clippy.toml keeps it out of the core).
#[allow(clippy::disallowed_methods)]
pub(super) fn busy_wait(count: i32) -> bool {
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
        // The wait doubles every fourth call.
        let step = u32::try_from(count.clamp(0, 24) / 4).unwrap_or(0);
        let seed = start.elapsed().as_nanos() as u64 ^ (count as u64).rotate_left(32);
        let wait_us = crate::core::Backoff::new(50, 2_000, seed).wait(step);
        std::thread::sleep(Duration::from_micros(wait_us));
        true
    })
}

/// The store's connection, as group commit drives it.
pub(super) struct SqlConn {
    pub conn: HotConn,
    /// The database, for messages.
    pub shown: String,
    pub busy_timeout: Duration,
    /// Refuse transactions on a database that migration marks say is
    /// moved or being filled ([`crate::store::marks`]).
    pub check_marks: bool,
    /// When this connection last found no mark (read after that instant).
    pub marks_checked: Option<std::time::Instant>,
    /// The running jobs this connection wrote last ([`RowCache`]).
    pub rows: RowCache,
}

/// `PRAGMA data_version` inside the open transaction: another
/// connection's COMMIT since the last reading changes it (`None` if it
/// cannot be read: then nothing is trusted).
fn data_version(conn: &Connection) -> Option<i64> {
    conn.prepare_cached("PRAGMA data_version")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .ok()
}

use crate::store::marks::MARKS_FRESH;

/// What a cut-over does after committing its mark on `conn` (see
/// [`MARKS_FRESH`]): wait out every connection's trust, then take the
/// write lock once, so that a transaction that trusted an older reading
/// has ended.
pub(super) fn after_mark(conn: &Connection) -> rusqlite::Result<()> {
    crate::sync::sleep(MARKS_FRESH * 2);
    conn.execute_batch("BEGIN IMMEDIATE; COMMIT")
}

impl GroupConn for SqlConn {
    fn begin(&mut self) -> Result<()> {
        arm_busy(self.busy_timeout);
        if !self.conn.is_autocommit() {
            // A transaction that failed to end left its BEGIN open.
            self.rollback();
        }
        self.conn
            .exec(Hot::Begin)
            .map_err(|e| sql_err(|| format!("beginning a transaction on {}", self.shown), e))?;
        self.rows.begin(|| data_version(&self.conn));
        if self.check_marks {
            // Real time is this adapter's business (clippy.toml keeps it
            // out of the core).
            #[allow(clippy::disallowed_methods)]
            let now = std::time::Instant::now();
            if self
                .marks_checked
                .is_some_and(|at| now.saturating_duration_since(at) < MARKS_FRESH)
            {
                return Ok(());
            }
            self.marks_checked = None;
            let marked = super::schema::read_marks(&self.conn, &self.shown)
                .and_then(|marks| marks.check(&self.shown));
            if let Err(e) = marked {
                self.rollback();
                return Err(e);
            }
            self.marks_checked = Some(now);
        }
        Ok(())
    }

    fn savepoint(&mut self) -> Result<()> {
        // The member before this one stays in the group (one that failed
        // was undone, and its staging dropped, before this one joined).
        self.rows.keep_member();
        arm_busy(self.busy_timeout);
        self.conn
            .exec(Hot::Savepoint)
            .map_err(|e| sql_err(|| "joining a group commit".into(), e))
    }

    fn release(&mut self) -> Result<()> {
        self.conn
            .exec(Hot::Release)
            .map_err(|e| sql_err(|| "leaving a group commit".into(), e))?;
        self.rows.keep_member();
        Ok(())
    }

    fn rollback_to(&mut self) -> Result<()> {
        self.rows.undo_member();
        self.conn
            .exec(Hot::RollbackTo)
            .and_then(|()| self.conn.exec(Hot::Release))
            .map_err(|e| sql_err(|| "undoing one member of a group commit".into(), e))
    }

    fn rollback(&mut self) {
        self.rows.rolled_back();
        let _ = self.conn.exec(Hot::Rollback);
    }

    fn commit(&mut self) -> Result<()> {
        arm_busy(self.busy_timeout);
        self.rows.before_commit(|| data_version(&self.conn));
        let committed = self.conn.exec(Hot::Commit);
        match &committed {
            Ok(()) => self.rows.committed(),
            Err(_) => self.rows.commit_failed(),
        }
        committed.map_err(|e| {
            let busy = is_busy(&e);
            let e = sql_err(|| format!("committing to {}", self.shown), e);
            if busy {
                e
            } else {
                // An I/O error during COMMIT may or may not have left the
                // transaction in the WAL: the callers cannot know.
                e.with_failure(StoreFailure::Ambiguous)
            }
        })
    }
}

/// The WAL a closing handle leaves behind, at most: past this it lets
/// SQLite checkpoint at close. The next process to open the database when
/// no other has it open reads the whole WAL to rebuild its index (about
/// 0.7 ms a megabyte here), and SQLite's own checkpoint runs only every
/// 1,000 pages (4 MB), so a burst of short-lived processes would each pay
/// for a WAL near that size.
const WAL_LEFT_MAX_BYTES: u64 = 256 * 1024;

/// Close the store's connection. SQLite does not checkpoint when its
/// last connection closes (`SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`, set in
/// `connect`) unless the WAL file has grown past [`WAL_LEFT_MAX_BYTES`]:
/// then the option is cleared first, and SQLite's own rule applies (the
/// last connection to the database, and only it, checkpoints and deletes
/// the WAL; with another connection open, in any process, nothing
/// happens and nobody waits). The file's size overstates what the WAL
/// holds once SQLite's own checkpoints have run (it never shrinks the
/// file), which costs at most one checkpoint more: that one deletes it.
pub(super) fn close(c: SqlConn) {
    let wal = c.conn.path().map(|db| format!("{db}-wal"));
    let big = wal
        .and_then(|w| std::fs::metadata(w).ok())
        .is_some_and(|m| m.len() > WAL_LEFT_MAX_BYTES);
    if big {
        let _ = c.conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            false,
        );
    }
    drop(c);
}
