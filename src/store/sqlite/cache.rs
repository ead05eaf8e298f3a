//! The store connection's copy of the running jobs it wrote last, so that
//! a settle or a renewal of jobs this handle claimed does not read them
//! back (the worker loop's completions read every job its claims wrote a
//! moment before: a 29-column row read and decode per job).
//!
//! **State.** `rows`: the jobs this connection's committed transactions
//! left running, each exactly as its row stands after that COMMIT; `seen`:
//! `PRAGMA data_version` read inside the last transaction; `staged`: what
//! the open transaction wrote, in order, each a job's running post-image
//! to keep or a mark to drop the job, the first `kept` of them from members
//! kept so far, the rest from the running member (not yet committed).
//!
//! **Transitions.**
//! - `begin` (after `BEGIN IMMEDIATE` holds the write lock): if another
//!   connection (of this process or another) committed since `seen`, SQLite
//!   says so by a different `data_version`, and every row is dropped. With
//!   no rows the version is not read (a transaction of leases alone pays
//!   nothing); `before_commit` reads it, still inside the transaction, if
//!   there are rows to keep.
//! - A write of a job through this connection drops its row at once (a
//!   later read in the same transaction goes to the database and sees the
//!   write) and stages its post-image if it leaves the job running, else a
//!   mark to drop it (over anything staged for it before).
//! - A member kept (`release`, or the next member joining) moves `kept` to
//!   the end of `staged`; a member undone (`ROLLBACK TO`) cuts `staged`
//!   back to `kept` (the database is back where those entries held).
//! - `COMMIT` done: `staged` is applied to the rows in order (if the
//!   version is known). `ROLLBACK`: what was staged is dropped, the rows
//!   stay (the database is back as it was at BEGIN, where they held, and
//!   the ones the transaction wrote are gone already). A COMMIT that
//!   failed: every row is dropped.
//!
//! **Invariant.** A row in `rows` equals what the database holds for that
//! job whenever a transaction of this connection holds the write lock: no
//! other connection wrote since `seen` (data_version), and every write of
//! this connection since either dropped the row or staged its exact
//! post-image, which enters `rows` only with the COMMIT that made it true,
//! unless a later write of the same transaction staged over it.
//!
//! The maps are keyed through [`IdHasher`](crate::hash::IdHasher), and a
//! write costs one lookup and one push, a commit one insert per entry: a
//! worker loop does this for every job it claims and settles.

use crate::core::{JobId, JobRecord, JobState};
use crate::hash::IdMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Most rows kept: past this the copy starts over (a worker holds far
/// fewer jobs; a caller that claims more reads the rest back).
const ROWS_MAX: usize = 8_192;

#[derive(Default)]
pub(super) struct RowCache {
    rows: IdMap<JobId, JobRecord>,
    seen: Option<i64>,
    /// The open transaction's writes in order: a running post-image, or
    /// `None` to drop the job.
    staged: Vec<(JobId, Option<JobRecord>)>,
    /// How many of `staged` come from members kept.
    kept: usize,
    /// Reads served from `rows` (for tests and benchmarks).
    hits: Arc<AtomicU64>,
}

impl RowCache {
    /// A transaction began holding the write lock; `version` reads its
    /// `data_version` (`None`: unknown, trust nothing), only if there are
    /// rows to check (a transaction of leases alone never pays for it).
    pub fn begin(&mut self, version: impl FnOnce() -> Option<i64>) {
        self.rolled_back();
        if self.rows.is_empty() {
            self.seen = None;
            return;
        }
        let now = version();
        if now.is_none() || now != self.seen {
            self.rows.clear();
        }
        self.seen = now;
    }

    /// The open transaction is about to commit: if it leaves rows to keep
    /// and its version is not yet known, `version` reads it (inside the
    /// transaction: after the COMMIT another connection could already
    /// have written).
    pub fn before_commit(&mut self, version: impl FnOnce() -> Option<i64>) {
        if self.seen.is_none() && self.staged.iter().any(|(_, job)| job.is_some()) {
            self.seen = version();
        }
    }

    /// Whether `id` is held (without counting a hit).
    pub fn has(&self, id: JobId) -> bool {
        self.rows.contains_key(&id)
    }

    /// `id` as this connection's last committed transaction left it,
    /// taken out of the copy: the transaction reading it is about to
    /// write it (a settle, a renewal), which would drop it anyway, and a
    /// second read in the same transaction goes to the database, which
    /// also sees what the transaction wrote. Dropping a row never breaks
    /// the invariant.
    pub fn take(&mut self, id: JobId) -> Option<JobRecord> {
        let job = self.rows.remove(&id);
        if job.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        job
    }

    /// The count of reads served so far, shared.
    pub fn hits(&self) -> Arc<AtomicU64> {
        self.hits.clone()
    }

    /// The open transaction wrote `job`, which is its row as it now stands
    /// (every column was written from it, or it was read in this
    /// transaction and the columns not written are the ones read).
    pub fn wrote(&mut self, job: &JobRecord) {
        self.rows.remove(&job.id);
        let keep = (job.state == JobState::Running).then(|| job.clone());
        self.staged.push((job.id, keep));
    }

    /// The open transaction changed or deleted `id` in a way not staged.
    pub fn forget(&mut self, id: JobId) {
        self.rows.remove(&id);
        // Nothing staged: no earlier entry of this transaction to drop.
        if !self.staged.is_empty() {
            self.staged.push((id, None));
        }
    }

    /// The running member's writes stay in the transaction.
    pub fn keep_member(&mut self) {
        self.kept = self.staged.len();
    }

    /// The running member's writes were undone (`ROLLBACK TO`).
    pub fn undo_member(&mut self) {
        self.staged.truncate(self.kept);
    }

    /// The transaction committed: its staged rows now stand (kept if its
    /// version is known).
    pub fn committed(&mut self) {
        if self.seen.is_none() {
            return self.rolled_back();
        }
        if self.rows.len() + self.staged.len() > ROWS_MAX {
            self.rows.clear();
        }
        for (id, job) in self.staged.drain(..) {
            match job {
                Some(job) => self.rows.insert(id, job),
                None => self.rows.remove(&id),
            };
        }
        self.kept = 0;
    }

    /// The transaction was rolled back: what it staged is dropped. The
    /// rows stay: each was the database's at its BEGIN (the version said
    /// so), the ones it wrote were dropped when it wrote them, and the
    /// ROLLBACK puts back the database as it was at that BEGIN.
    pub fn rolled_back(&mut self) {
        self.staged.clear();
        self.kept = 0;
    }

    /// The COMMIT failed (perhaps after reaching the file): drop
    /// everything, and trust nothing until the next `begin` reads the
    /// version again.
    pub fn commit_failed(&mut self) {
        self.rolled_back();
        self.rows.clear();
        self.seen = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::JobState;

    fn job(id: u64, state: JobState, attempts: u32) -> JobRecord {
        JobRecord {
            state,
            attempts,
            ..crate::core::job::sample_job(id)
        }
    }

    fn attempts(c: &RowCache, id: u64) -> Option<u32> {
        c.rows.get(&JobId(id)).map(|j| j.attempts)
    }

    /// One transaction that begins at `version` and commits.
    fn txn(c: &mut RowCache, version: i64, body: impl FnOnce(&mut RowCache)) {
        c.begin(|| Some(version));
        body(c);
        c.before_commit(|| Some(version));
        c.committed();
    }

    #[test]
    fn a_committed_write_is_kept_until_another_connection_writes() {
        let mut c = RowCache::default();
        txn(&mut c, 7, |c| {
            c.wrote(&job(1, JobState::Running, 1));
            assert_eq!(attempts(c, 1), None, "not before its COMMIT");
        });
        txn(&mut c, 7, |c| assert_eq!(attempts(c, 1), Some(1)));
        // Another connection committed: version 8.
        txn(&mut c, 8, |c| assert_eq!(attempts(c, 1), None));
        txn(&mut c, 8, |c| c.wrote(&job(1, JobState::Running, 2)));
        c.begin(|| None);
        assert_eq!(attempts(&c, 1), None, "an unknown version trusts nothing");
    }

    #[test]
    fn a_version_is_read_only_when_there_is_something_to_check_or_keep() {
        let mut c = RowCache::default();
        c.begin(|| panic!("nothing to check"));
        c.before_commit(|| panic!("nothing to keep"));
        c.committed();
        c.begin(|| panic!("nothing to check"));
        c.wrote(&job(1, JobState::Running, 1));
        c.before_commit(|| None);
        c.committed();
        assert_eq!(attempts(&c, 1), None, "kept only at a known version");
    }

    #[test]
    fn an_undone_member_leaves_nothing_and_a_kept_one_commits() {
        let mut c = RowCache::default();
        txn(&mut c, 1, |c| c.wrote(&job(1, JobState::Running, 1)));
        txn(&mut c, 1, |c| {
            // The first member rewrites job 1, the second joins, writes
            // job 2 and is undone; the third writes job 3 and is kept.
            c.wrote(&job(1, JobState::Running, 2));
            assert_eq!(attempts(c, 1), None, "a write drops the row at once");
            c.keep_member();
            c.wrote(&job(2, JobState::Running, 1));
            c.undo_member();
            c.wrote(&job(3, JobState::Running, 1));
            c.keep_member();
        });
        assert_eq!(attempts(&c, 1), Some(2));
        assert_eq!(attempts(&c, 2), None);
        assert_eq!(attempts(&c, 3), Some(1));
    }

    #[test]
    fn the_last_write_of_a_job_in_a_transaction_decides() {
        let mut c = RowCache::default();
        txn(&mut c, 1, |c| {
            // Staged running, then dropped: not kept.
            c.wrote(&job(1, JobState::Running, 1));
            c.forget(JobId(1));
            // Dropped, then staged running again: kept.
            c.wrote(&job(2, JobState::Running, 1));
            c.wrote(&job(2, JobState::Done, 1));
            c.wrote(&job(2, JobState::Running, 2));
            // A member drops job 3 and is undone: the kept member's
            // post-image of job 3 is what the database holds again.
            c.wrote(&job(3, JobState::Running, 1));
            c.keep_member();
            c.forget(JobId(3));
            c.wrote(&job(4, JobState::Running, 1));
            c.undo_member();
        });
        assert_eq!(attempts(&c, 1), None);
        assert_eq!(attempts(&c, 2), Some(2));
        assert_eq!(attempts(&c, 3), Some(1));
        assert_eq!(attempts(&c, 4), None);
    }

    #[test]
    fn a_rollback_or_a_job_leaving_running_drops_its_row() {
        let mut c = RowCache::default();
        txn(&mut c, 1, |c| {
            c.wrote(&job(1, JobState::Running, 1));
            c.wrote(&job(2, JobState::Running, 1));
        });
        txn(&mut c, 1, |c| {
            c.wrote(&job(1, JobState::Done, 1));
            c.forget(JobId(2));
        });
        assert_eq!((attempts(&c, 1), attempts(&c, 2)), (None, None));
        txn(&mut c, 1, |c| c.wrote(&job(3, JobState::Running, 1)));
        // A rollback drops what it wrote and keeps what it did not touch.
        c.begin(|| Some(1));
        c.wrote(&job(3, JobState::Running, 2));
        c.wrote(&job(4, JobState::Running, 1));
        c.rolled_back();
        txn(&mut c, 1, |c| c.wrote(&job(5, JobState::Running, 1)));
        c.begin(|| Some(1));
        c.wrote(&job(6, JobState::Running, 1));
        c.rolled_back();
        c.begin(|| Some(1));
        assert_eq!((attempts(&c, 3), attempts(&c, 4)), (None, None));
        assert_eq!((attempts(&c, 5), attempts(&c, 6)), (Some(1), None));
        // A failed COMMIT trusts nothing.
        c.wrote(&job(7, JobState::Running, 1));
        c.before_commit(|| Some(1));
        c.commit_failed();
        c.begin(|| panic!("nothing to check"));
        assert_eq!((attempts(&c, 5), attempts(&c, 7)), (None, None));
    }

    #[test]
    fn past_its_bound_the_copy_starts_over() {
        let mut c = RowCache::default();
        txn(&mut c, 1, |c| {
            for id in 0..ROWS_MAX as u64 {
                c.wrote(&job(id, JobState::Running, 1));
            }
        });
        assert_eq!(attempts(&c, 0), Some(1));
        txn(&mut c, 1, |c| c.wrote(&job(u64::MAX, JobState::Running, 1)));
        assert_eq!(attempts(&c, 0), None);
        assert_eq!(attempts(&c, u64::MAX), Some(1));
        assert_eq!(c.rows.len(), 1);
    }
}
