//! Group commit as a protocol, apart from SQL: threads that arrive while a
//! transaction is open join it, each in its own savepoint, and the last one
//! commits for all. The connection is anything that can begin, mark, keep,
//! undo and commit ([`GroupConn`]); the SQLite store plugs in its
//! connection, and the loom models in `tests/loom.rs` plug in a fake one
//! that records what each COMMIT carried.
//!
//! The protocol, for one member:
//! 1. Take the connection. If a group is open, join it (`savepoint`);
//!    otherwise open one (`begin`).
//! 2. Run the member's closure. If it fails or panics, undo only its part
//!    (`rollback_to`); if even that fails, roll the whole group back and tell
//!    its members. If it succeeds, keep its part (`release`).
//! 3. If another thread is waiting for the connection and the group has room,
//!    leave the group open for it and wait until the group ends; otherwise
//!    commit now and tell the members how it went. Either way a member
//!    returns only once the COMMIT that carries its writes is done, with
//!    that COMMIT's error if it failed. A member that panicked does not
//!    wait: it ends its part and unwinds.
//!
//! Everything here uses `crate::sync`, so under `--cfg loom` the models
//! explore every interleaving of it.

use crate::error::{Error, Result, StoreFailure};
use crate::sync::{caught, lock, AtomicU64, Condvar, Mutex, MutexGuard, Ordering, Panic};
use std::collections::BTreeMap;

/// The connection actions group commit needs, in SQL terms.
pub trait GroupConn {
    /// Open a transaction (`BEGIN IMMEDIATE`), first rolling back one that
    /// a failed end left open.
    fn begin(&mut self) -> Result<()>;
    /// Mark where a joining member's writes start (`SAVEPOINT`).
    fn savepoint(&mut self) -> Result<()>;
    /// Keep a member's writes in the transaction (`RELEASE`).
    fn release(&mut self) -> Result<()>;
    /// Undo a member's writes since its savepoint and drop the savepoint
    /// (`ROLLBACK TO`, then `RELEASE`).
    fn rollback_to(&mut self) -> Result<()>;
    /// Undo the whole transaction (`ROLLBACK`). Nothing is kept whether or
    /// not it reports an error, so it reports none.
    fn rollback(&mut self);
    /// Make the transaction's writes durable (`COMMIT`). The error's
    /// [`StoreFailure`] says whether they may have been applied.
    fn commit(&mut self) -> Result<()>;
}

/// What a member leaves for its group, delivered once the group commits
/// (the SQLite store: its wake-ups and the clock's high water).
pub trait GroupNote: Default {
    /// Fold another member's note into this one.
    fn absorb(&mut self, other: Self);
}

impl GroupNote for () {
    fn absorb(&mut self, _: ()) {}
}

/// Most members one COMMIT carries.
pub const GROUP_MEMBERS_MAX: u64 = 64;
/// Failed groups remembered for their waiting members.
const FAILURES_KEPT_MAX: usize = 4096;

/// The connection and the group left open on it.
struct Shared<C, N> {
    conn: Option<C>,
    open: Option<OpenGroup<N>>,
    seq_last: u64,
}

/// A transaction left open for the threads waiting to join it.
struct OpenGroup<N> {
    seq: u64,
    members: u64,
    note: N,
}

/// How the groups ended, for the members waiting on them.
#[derive(Default)]
struct Ended {
    /// Every group up to this one has ended.
    seq: u64,
    /// Groups whose COMMIT failed, kept for their waiting members.
    failed: BTreeMap<u64, Error>,
    /// Failures of groups up to this one may have been forgotten.
    forgotten_up_to: u64,
    /// Members asleep on `ended_cv`: a group that ends with none wakes
    /// nobody (a notify is a system call even when nobody waits).
    sleepers: u64,
}

/// Deliberately broken variants of the protocol, for the loom models to
/// reject (compiled only under `--cfg loom`).
#[cfg(loom)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Canary {
    /// The real protocol.
    #[default]
    None,
    /// A member that leaves its group open returns at once, before the
    /// COMMIT that carries it.
    ReturnBeforeCommit,
    /// A failing member of a group is undone by rolling back the whole
    /// transaction, and the group carries on.
    UndoWholeGroup,
    /// A failed COMMIT is reported to the committing member only.
    FailureToCommitterOnly,
}

/// Group commit over a connection `C`, whose members leave notes `N`.
pub struct GroupCommit<C, N> {
    shared: Mutex<Shared<C, N>>,
    /// Threads waiting for `shared` (the open group is left for them).
    waiting: AtomicU64,
    ended: Mutex<Ended>,
    ended_cv: Condvar,
    /// Members run and COMMITs issued.
    members_run: AtomicU64,
    commits: AtomicU64,
    #[cfg(loom)]
    canary: Canary,
}

fn closed() -> Error {
    Error::store("running a transaction", "the connection is closed")
}

impl<C: GroupConn, N: GroupNote> GroupCommit<C, N> {
    /// Group commit over `conn`, with no transaction open on it.
    pub fn new(conn: C) -> Self {
        GroupCommit {
            shared: Mutex::new(Shared {
                conn: Some(conn),
                open: None,
                seq_last: 0,
            }),
            waiting: AtomicU64::new(0),
            ended: Mutex::new(Ended::default()),
            ended_cv: Condvar::new(),
            members_run: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            #[cfg(loom)]
            canary: Canary::None,
        }
    }

    /// The same protocol, broken as `canary` says (loom models only).
    #[cfg(loom)]
    pub fn with_canary(mut self, canary: Canary) -> Self {
        self.canary = canary;
        self
    }

    #[cfg(loom)]
    fn broken(&self, canary: Canary) -> bool {
        self.canary == canary
    }

    /// (members run, COMMITs issued) so far.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.members_run.load(Ordering::Relaxed),
            self.commits.load(Ordering::Relaxed),
        )
    }

    /// Take the connection out (no transaction may be running: `&mut`).
    pub fn take_conn(&mut self) -> Option<C> {
        match self.shared.get_mut() {
            Ok(s) => s.conn.take(),
            Err(p) => p.into_inner().conn.take(),
        }
    }

    /// Run `member` as one member of a group: its writes commit together
    /// with the group's, or not at all, and this returns only once that
    /// COMMIT is done (its error if it failed). `on_commit` gets the group's
    /// notes if this member is the one that commits it, before any member
    /// is told. A panic in `member` undoes its part, ends its group
    /// properly and resumes here.
    pub fn run(
        &self,
        member: impl FnOnce(&mut C) -> Result<N>,
        on_commit: impl FnOnce(N),
    ) -> Result<()> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let mut guard = lock(&self.shared);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        let (seq, joined) = self.enter(&mut guard)?;
        self.members_run.fetch_add(1, Ordering::Relaxed);
        let (ran, panic) = run_member(&mut guard, joined, member);
        let ran = self.settle(&mut guard, seq, joined, ran);
        if ran.is_err() && !joined {
            // It opened the transaction and was alone in it: rolled back.
            drop(guard);
            resume(panic);
            return ran;
        }
        let outcome = self.leave(guard, seq, panic.is_some(), on_commit);
        resume(panic);
        ran.and(outcome)
    }

    /// Join the open group, or open one. Returns (group, joined).
    fn enter(&self, shared: &mut Shared<C, N>) -> Result<(u64, bool)> {
        let Shared {
            conn,
            open,
            seq_last,
        } = shared;
        let conn = conn.as_mut().ok_or_else(closed)?;
        if let Some(group) = open.as_mut() {
            debug_assert!(group.members < GROUP_MEMBERS_MAX);
            group.members += 1;
            return Ok((group.seq, true));
        }
        conn.begin()?;
        *seq_last += 1;
        *open = Some(OpenGroup {
            seq: *seq_last,
            members: 1,
            note: N::default(),
        });
        Ok((*seq_last, false))
    }

    /// After the member ran: keep its part and its note, or undo it.
    fn settle(
        &self,
        shared: &mut Shared<C, N>,
        seq: u64,
        joined: bool,
        ran: Result<N>,
    ) -> Result<()> {
        let kept = match (ran, shared.conn.as_mut()) {
            (Ok(note), Some(conn)) if joined => conn.release().map(|()| note),
            (ran, _) => ran,
        };
        match kept {
            Ok(note) => {
                if let Some(group) = shared.open.as_mut() {
                    group.note.absorb(note);
                }
                Ok(())
            }
            Err(e) => {
                self.undo(shared, seq, joined, &e);
                Err(e)
            }
        }
    }

    /// Undo one member's part after it failed: its savepoint if it joined
    /// a group, else the whole (one-member) transaction. If a savepoint
    /// cannot be undone, the whole group is rolled back and its members
    /// are told.
    fn undo(&self, shared: &mut Shared<C, N>, seq: u64, joined: bool, why: &Error) {
        let Some(conn) = shared.conn.as_mut() else {
            return;
        };
        #[cfg(loom)]
        if joined && self.broken(Canary::UndoWholeGroup) {
            conn.rollback();
            return;
        }
        if joined && conn.rollback_to().is_ok() {
            return;
        }
        conn.rollback();
        shared.open = None;
        let failure = joined.then(|| {
            Error::transient(
                "committing a group of transactions",
                format!("rolled back because one of them could not be undone alone: {why}"),
            )
        });
        self.group_ended(seq, failure.as_ref());
    }

    /// This member is done: leave the group open for a thread waiting to
    /// join (it, or one after it, commits for all) and wait for the group
    /// to end, or commit it now. A panicking member does not wait.
    fn leave(
        &self,
        mut guard: MutexGuard<'_, Shared<C, N>>,
        seq: u64,
        panicking: bool,
        on_commit: impl FnOnce(N),
    ) -> Result<()> {
        let pass_on = match guard.open.as_ref() {
            // Rolled back whole: the members were told how.
            None => true,
            Some(group) => {
                self.waiting.load(Ordering::SeqCst) > 0 && group.members < GROUP_MEMBERS_MAX
            }
        };
        if !pass_on {
            let committed = self.commit(&mut guard, on_commit);
            drop(guard);
            return committed;
        }
        drop(guard);
        #[cfg(loom)]
        if self.broken(Canary::ReturnBeforeCommit) {
            return Ok(());
        }
        if panicking {
            return Ok(());
        }
        self.wait_group(seq)
    }

    /// End the open group: COMMIT (ROLLBACK if that fails), deliver its
    /// notes, then tell its members. Returns the COMMIT's error, if any.
    fn commit(&self, shared: &mut Shared<C, N>, on_commit: impl FnOnce(N)) -> Result<()> {
        let conn = shared.conn.as_mut().ok_or_else(closed)?;
        let Some(group) = shared.open.take() else {
            return Ok(());
        };
        self.commits.fetch_add(1, Ordering::Relaxed);
        let committed = conn.commit();
        match &committed {
            Ok(()) => on_commit(group.note),
            Err(_) => conn.rollback(),
        }
        let told = committed.as_ref().err();
        #[cfg(loom)]
        let told = told.filter(|_| !self.broken(Canary::FailureToCommitterOnly));
        self.group_ended(group.seq, told);
        committed
    }

    /// Record how group `seq` ended and wake its members.
    fn group_ended(&self, seq: u64, failure: Option<&Error>) {
        let mut ended = lock(&self.ended);
        ended.seq = ended.seq.max(seq);
        if let Some(e) = failure {
            ended.failed.insert(seq, e.clone());
            while ended.failed.len() > FAILURES_KEPT_MAX {
                if let Some((old, _)) = ended.failed.pop_first() {
                    ended.forgotten_up_to = ended.forgotten_up_to.max(old);
                }
            }
        }
        let sleepers = ended.sleepers;
        drop(ended);
        if sleepers > 0 {
            self.ended_cv.notify_all();
        }
    }

    /// Wait until group `seq` has ended; its COMMIT's error, if it failed.
    fn wait_group(&self, seq: u64) -> Result<()> {
        let mut ended = lock(&self.ended);
        while ended.seq < seq {
            ended.sleepers += 1;
            ended = match self.ended_cv.wait(ended) {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            ended.sleepers -= 1;
        }
        match ended.failed.get(&seq) {
            Some(e) => Err(e.clone()),
            None if seq <= ended.forgotten_up_to => Err(Error::store(
                "committing a group of transactions",
                "the outcome was forgotten while this thread waited (over 4096 failed groups since)",
            )
            .with_failure(StoreFailure::Ambiguous)),
            None => Ok(()),
        }
    }
}

/// Run the member's closure on the connection, in its savepoint if it
/// joined a group; a panic becomes an error and its payload is returned.
fn run_member<C: GroupConn, N>(
    shared: &mut Shared<C, N>,
    joined: bool,
    member: impl FnOnce(&mut C) -> Result<N>,
) -> (Result<N>, Option<Panic>) {
    let Some(conn) = shared.conn.as_mut() else {
        return (Err(closed()), None);
    };
    if joined {
        if let Err(e) = conn.savepoint() {
            return (Err(e), None);
        }
    }
    match caught(|| member(conn)) {
        Ok(ran) => (ran, None),
        Err(payload) => (
            Err(Error::store(
                "running a transaction",
                "the closure panicked",
            )),
            Some(payload),
        ),
    }
}

fn resume(panic: Option<Panic>) {
    if let Some(payload) = panic {
        std::panic::resume_unwind(payload);
    }
}
