//! loom models of everything leasehold's threads share. Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test loom`.
//!
//! Each model runs against the real code and, beside it, a deliberately
//! broken variant that loom must reject, so that every model can fail:
//! - the mem store under concurrent acquire and claim: no double grant, no
//!   double claim, distinct increasing tokens (broken: check-then-act split
//!   across two transactions);
//! - blocking acquire woken by release: no lost wake-up (broken: the epoch
//!   is checked outside the lock, then the waiter sleeps);
//! - the keep-alive thread racing release: after release no renewal revives
//!   the lease and the thread always stops (broken: release that does not
//!   wait for the thread, with a renewal that re-acquires);
//! - a heartbeat racing complete: the claim is never revived;
//! - group commit (the SQLite store's protocol, over a fake connection
//!   that records what each COMMIT carried): a joiner and the committer
//!   are committed together and neither returns before that COMMIT
//!   (broken: a member that returns before its group's COMMIT); a failing
//!   or panicking member is undone alone while the other commits (broken:
//!   an undo that rolls back the whole group); a failed COMMIT is reported
//!   to every member of its group (broken: to the committer only).
#![cfg(loom)]

use leasehold::client::loom_canary;
use leasehold::core;
use leasehold::store::StoreExt;
use leasehold::{
    Client, Error, Holder, HolderId, JobSpec, JobState, LeaseOptions, ManualClock, MemStore,
    QueuePolicy, Store,
};
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Condvar, Mutex};
use loom::thread;
use std::sync::Arc;
use std::time::Duration;

/// Explore `model` with at least `preemptions` preemptions (more if
/// LOOM_MAX_PREEMPTIONS asks for more).
fn check(preemptions: usize, model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    let bound = builder.preemption_bound.unwrap_or(0).max(preemptions);
    builder.preemption_bound = Some(bound);
    builder.check(model);
}

/// `true` if loom finds a failing interleaving of `model`.
fn loom_rejects(preemptions: usize, model: impl Fn() + Sync + Send + 'static) -> bool {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let run = std::panic::AssertUnwindSafe(move || check(preemptions, model));
    let rejected = std::panic::catch_unwind(run).is_err();
    std::panic::set_hook(hook);
    rejected
}

fn mem() -> Arc<MemStore> {
    Arc::new(MemStore::with_clock(Arc::new(ManualClock::new(1_000))))
}

// ------------------------------------------------------------ store models

type Acquire = fn(&MemStore, u128) -> leasehold::Result<u64>;

fn acquire_atomic(store: &MemStore, h: u128) -> leasehold::Result<u64> {
    let holder = Holder::new(HolderId(h));
    store
        .txn(|tx| core::lease::acquire(tx, "k", &holder, 100, 1))
        .map(|g| g.token)
}

/// Broken: look, then act in a second transaction.
fn acquire_check_then_act(store: &MemStore, h: u128) -> leasehold::Result<u64> {
    let holder = Holder::new(HolderId(h));
    let free = store
        .txn(|tx| core::lease::inspect(tx, "k"))?
        .holders
        .is_empty();
    if !free {
        return Err(Error::Held {
            key: "k".into(),
            holders: vec![],
        });
    }
    store
        .txn(|tx| core::lease::acquire(tx, "k", &holder, 100, 1024))
        .map(|g| g.token)
}

fn grant_model(acquire: Acquire) -> impl Fn() + Sync + Send + 'static {
    move || {
        let store = mem();
        let handles: Vec<_> = (1..=2u128)
            .map(|h| {
                let store = store.clone();
                thread::spawn(move || acquire(&store, h).ok())
            })
            .collect();
        let tokens: Vec<u64> = handles
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(tokens.len(), 1, "L1: exactly one grant, got {tokens:?}");
        let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
        assert_eq!(info.holders.len(), 1);
        assert_eq!(info.last_token, tokens[0]);
    }
}

#[test]
fn store_grants_one_holder() {
    loom::model(grant_model(acquire_atomic));
}

#[test]
fn store_model_rejects_check_then_act() {
    assert!(loom_rejects(2, grant_model(acquire_check_then_act)));
}

#[test]
fn store_claims_each_job_once_with_increasing_tokens() {
    loom::model(|| {
        let store = mem();
        let p = QueuePolicy::default();
        store
            .txn(|tx| core::job::enqueue(tx, "q", &JobSpec::new("x"), &p))
            .unwrap();
        let handles: Vec<_> = (1..=2u128)
            .map(|h| {
                let store = store.clone();
                thread::spawn(move || {
                    store
                        .txn(|tx| core::job::claim(tx, "q", HolderId(h), 100, 1, &p))
                        .unwrap()
                })
            })
            .collect();
        let claimed: Vec<_> = handles
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(claimed.len(), 1, "Q1: one claim");
        assert_eq!(claimed[0].claim.unwrap().token, 1);
        // Tokens across release: a third acquire after two sequential ones.
        let a = acquire_atomic(&store, 7).unwrap();
        store
            .txn(|tx| core::lease::release(tx, "k", HolderId(7), a))
            .unwrap();
        assert!(acquire_atomic(&store, 8).unwrap() > a);
    });
}

// ------------------------------------------------------------ wake-up model

/// A minimal store-like waiter protocol with the epoch check in or outside
/// the lock; the real one is `MemStore::wait_epoch`.
struct Epoch {
    state: Mutex<(u64, bool)>,
    cv: Condvar,
    broken: bool,
}

impl Epoch {
    fn release(&self) {
        let mut st = self.state.lock().unwrap();
        st.0 += 1;
        st.1 = false;
        self.cv.notify_all();
    }

    fn wait_free(&self) {
        let epoch = self.state.lock().unwrap().0;
        if self.state.lock().unwrap().1 {
            if self.broken {
                // Broken: the check above and this wait are separate lock
                // scopes; a release in between is missed.
                let st = self.state.lock().unwrap();
                drop(self.cv.wait(st).unwrap());
            } else {
                let mut st = self.state.lock().unwrap();
                while st.0 == epoch {
                    st = self.cv.wait(st).unwrap();
                }
            }
        }
    }
}

fn wakeup_model(broken: bool) -> impl Fn() + Sync + Send + 'static {
    move || {
        let e = Arc::new(Epoch {
            state: Mutex::new((0, true)),
            cv: Condvar::new(),
            broken,
        });
        let waiter = {
            let e = e.clone();
            thread::spawn(move || e.wait_free())
        };
        e.release();
        waiter.join().unwrap();
    }
}

#[test]
fn wakeup_protocol_loses_no_wakeup() {
    loom::model(wakeup_model(false));
}

#[test]
fn wakeup_model_rejects_check_outside_the_lock() {
    assert!(loom_rejects(2, wakeup_model(true)));
}

#[test]
fn blocking_acquire_is_woken_by_release() {
    loom::model(|| {
        let store: Arc<dyn Store> = Arc::new(MemStore::with_clock(Arc::new(ManualClock::new(1))));
        let clock = ManualClock::new(0);
        let a = Client::builder_shared(store.clone())
            .clock(Arc::new(clock.clone()))
            .build();
        let b = Client::builder_shared(store).clock(Arc::new(clock)).build();
        let held = a.try_acquire("k", Duration::from_secs(60)).unwrap();
        let waiter = thread::spawn(move || {
            // The local clock never moves: only a release can end the wait.
            let g = b
                .acquire(
                    "k",
                    LeaseOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(1)),
                )
                .unwrap();
            let token = g.token();
            g.detach();
            token
        });
        held.release().unwrap();
        assert_eq!(waiter.join().unwrap(), 2);
    });
}

// ---------------------------------------------------------- keep-alive model

/// A world for the client models: a mem store on `store_clock`, a client
/// whose local clock is returned, and a held lease on "k" (TTL 30 ms) whose
/// keep-alive counts the losses it reports.
struct World {
    store: Arc<dyn Store>,
    local: ManualClock,
    client: Client,
}

fn world(store_clock: &ManualClock) -> World {
    let store: Arc<dyn Store> = Arc::new(MemStore::with_clock(Arc::new(store_clock.clone())));
    let local = ManualClock::new(0);
    let client = Client::builder_shared(store.clone())
        .clock(Arc::new(local.clone()))
        .build();
    World {
        store,
        local,
        client,
    }
}

fn kept_alive(w: &World) -> (leasehold::LeaseGuard, Arc<AtomicU64>) {
    let guard = w
        .client
        .try_acquire("k", Duration::from_millis(30))
        .unwrap();
    let lost = Arc::new(AtomicU64::new(0));
    let l = lost.clone();
    guard
        .keep_alive(move |_| {
            l.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    (guard, lost)
}

fn keep_alive_model(naive: bool) -> impl Fn() + Sync + Send + 'static {
    move || {
        loom_canary::NAIVE_KEEP_ALIVE.with(|c| c.set(naive));
        let w = world(&ManualClock::new(1));
        let (guard, lost) = kept_alive(&w);
        // Time passes: a renewal is due, racing the release below.
        w.local.advance(15);
        guard.release().unwrap();
        let info = w.store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
        assert!(
            info.holders.is_empty(),
            "a renewal revived the released lease"
        );
        assert_eq!(lost.load(Ordering::SeqCst), 0, "release is not a loss");
    }
}

/// The revival needs three preemptions (start the thread, let it pass its
/// check after the clock moves, stop it before its store call), so these
/// two run with a bound of 3.
#[test]
fn keep_alive_never_revives_a_released_lease() {
    check(3, keep_alive_model(false));
}

#[test]
fn keep_alive_model_rejects_the_naive_keep_alive() {
    let rejected = loom_rejects(3, keep_alive_model(true));
    loom_canary::NAIVE_KEEP_ALIVE.with(|c| c.set(false));
    assert!(rejected);
}

#[test]
fn keep_alive_reports_a_loss_exactly_once() {
    loom::model(|| {
        let store_clock = ManualClock::new(1);
        let w = world(&store_clock);
        let (guard, lost) = kept_alive(&w);
        // The store's clock passes the TTL: the renewal is refused, while
        // the holder also renews by hand.
        store_clock.advance(100);
        w.local.advance(15);
        let _ = guard.renew();
        drop(guard);
        assert_eq!(lost.load(Ordering::SeqCst), 1, "reported exactly once");
    });
}

// ------------------------------------------------------- heartbeat model

fn heartbeat_model(naive: bool) -> impl Fn() + Sync + Send + 'static {
    move || {
        loom_canary::NAIVE_KEEP_ALIVE.with(|c| c.set(naive));
        let World {
            store,
            local,
            client,
        } = world(&ManualClock::new(1));
        let q = client.queue("q").unwrap();
        q.push(&JobSpec::new("x")).unwrap();
        let job = q.claim(Duration::from_millis(30)).unwrap().unwrap();
        job.heartbeat_in_background(|_| {}).unwrap();
        local.advance(15);
        job.complete().unwrap();
        let p = QueuePolicy::default();
        let rec = store.txn(|tx| core::job::get(tx, job.id(), &p)).unwrap();
        assert_eq!(rec.state, JobState::Done, "a heartbeat revived the claim");
        assert!(rec.claim.is_none());
    }
}

#[test]
fn heartbeat_racing_complete_never_revives_the_claim() {
    check(3, heartbeat_model(false));
}

#[test]
fn heartbeat_model_rejects_a_read_then_write_heartbeat() {
    let rejected = loom_rejects(3, heartbeat_model(true));
    loom_canary::NAIVE_KEEP_ALIVE.with(|c| c.set(false));
    assert!(rejected);
}

// ------------------------------------------------------- group commit models

use leasehold::store::sqlite::group::{Canary, GroupCommit, GroupConn};

/// What the fake database committed: the writes each COMMIT carried.
type CommitLog = Arc<Mutex<Vec<Vec<u64>>>>;

/// A fake connection: a transaction is a list of writes, a savepoint a
/// mark in it; COMMIT appends the list to the log (or fails, as told).
struct FakeConn {
    tx: Option<Vec<u64>>,
    mark: Option<usize>,
    commits_to_fail: u32,
    log: CommitLog,
}

fn fake_err(what: &str) -> Error {
    Error::store("fake connection", what.to_owned())
}

impl FakeConn {
    fn write(&mut self, value: u64) -> leasehold::Result<()> {
        let tx = self
            .tx
            .as_mut()
            .ok_or_else(|| fake_err("write outside a transaction"))?;
        tx.push(value);
        Ok(())
    }
}

impl GroupConn for FakeConn {
    fn begin(&mut self) -> leasehold::Result<()> {
        self.tx = Some(Vec::new());
        self.mark = None;
        Ok(())
    }
    fn savepoint(&mut self) -> leasehold::Result<()> {
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| fake_err("savepoint outside a transaction"))?;
        self.mark = Some(tx.len());
        Ok(())
    }
    fn release(&mut self) -> leasehold::Result<()> {
        self.mark
            .take()
            .map(|_| ())
            .ok_or_else(|| fake_err("no savepoint"))
    }
    fn rollback_to(&mut self) -> leasehold::Result<()> {
        let (Some(tx), Some(mark)) = (self.tx.as_mut(), self.mark.take()) else {
            return Err(fake_err("no savepoint"));
        };
        tx.truncate(mark);
        Ok(())
    }
    fn rollback(&mut self) {
        self.tx = None;
        self.mark = None;
    }
    fn commit(&mut self) -> leasehold::Result<()> {
        let tx = self
            .tx
            .take()
            .ok_or_else(|| fake_err("no transaction is active"))?;
        if self.commits_to_fail > 0 {
            self.commits_to_fail -= 1;
            self.tx = Some(tx);
            return Err(fake_err("disk I/O error").with_failure(leasehold::StoreFailure::Ambiguous));
        }
        self.log.lock().unwrap().push(tx);
        Ok(())
    }
}

type Group = GroupCommit<FakeConn, ()>;

fn group(canary: Canary, commits_to_fail: u32) -> (Arc<Group>, CommitLog) {
    let log: CommitLog = Arc::new(Mutex::new(Vec::new()));
    let conn = FakeConn {
        tx: None,
        mark: None,
        commits_to_fail,
        log: log.clone(),
    };
    (Arc::new(GroupCommit::new(conn).with_canary(canary)), log)
}

/// How a member behaves: commits its two writes, fails after them, or
/// panics after them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fate {
    Commit,
    Fail,
    Panic,
}

/// Member `m` writes `2m` and `2m + 1`, then meets its fate. Returns
/// whether its call succeeded, and checks on return that a success is
/// already committed.
fn member(group: &Group, log: &CommitLog, m: u64, fate: Fate) -> bool {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        group.run(
            |c: &mut FakeConn| {
                c.write(2 * m)?;
                c.write(2 * m + 1)?;
                match fate {
                    Fate::Commit => Ok(()),
                    Fate::Fail => Err(Error::invalid(leasehold::Field::Reason, "fails on purpose")),
                    Fate::Panic => panic!("panics on purpose"),
                }
            },
            |()| {},
        )
    }));
    let ok = matches!(run, Ok(Ok(())));
    if ok {
        assert_eq!(
            commits_of(log, m),
            1,
            "member {m} returned success before (or without) a COMMIT that carries it"
        );
    }
    assert_eq!(run.is_err(), fate == Fate::Panic, "member {m}: {fate:?}");
    ok
}

/// How many COMMITs carried member `m`'s writes; each that did carried
/// both of them.
fn commits_of(log: &CommitLog, m: u64) -> usize {
    let log = log.lock().unwrap();
    let mut n = 0;
    for tx in log.iter() {
        let (a, b) = (tx.contains(&(2 * m)), tx.contains(&(2 * m + 1)));
        assert_eq!(a, b, "member {m} half committed: {tx:?}");
        n += usize::from(a);
    }
    n
}

/// Some explored interleaving had both members in one COMMIT (the join).
static JOINED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn note_join(log: &CommitLog) {
    if log.lock().unwrap().iter().any(|tx| tx.len() == 4) {
        JOINED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Members 0 (this thread) and 1 (another), with the fates given; the
/// fake's first `commits_to_fail` COMMITs fail. Every member that returned
/// success was committed (exactly once, both writes) before it returned;
/// every member that failed was never committed.
fn group_model(
    canary: Canary,
    fates: [Fate; 2],
    commits_to_fail: u32,
) -> impl Fn() + Sync + Send + 'static {
    move || {
        let (g, log) = group(canary, commits_to_fail);
        let other = {
            let (g, log) = (g.clone(), log.clone());
            thread::spawn(move || member(&g, &log, 1, fates[1]))
        };
        let ok0 = member(&g, &log, 0, fates[0]);
        let ok1 = other.join().unwrap();
        for (m, (ok, fate)) in [(ok0, fates[0]), (ok1, fates[1])].into_iter().enumerate() {
            let m = m as u64;
            assert_eq!(commits_of(&log, m), usize::from(ok), "member {m} ok={ok}");
            if commits_to_fail == 0 {
                assert_eq!(ok, fate == Fate::Commit, "member {m} ({fate:?})");
            }
        }
        note_join(&log);
    }
}

fn quiet<R>(f: impl FnOnce() -> R) -> R {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let out = f();
    std::panic::set_hook(hook);
    out
}

/// (a) A joiner and the committer: both members' writes are committed
/// (together, when the second joined the first's group), and neither call
/// returns before that COMMIT.
#[test]
fn group_commit_members_return_after_the_commit_that_carries_them() {
    JOINED.store(false, std::sync::atomic::Ordering::SeqCst);
    check(3, group_model(Canary::None, [Fate::Commit; 2], 0));
    assert!(
        JOINED.load(std::sync::atomic::Ordering::SeqCst),
        "no explored interleaving joined a group"
    );
}

#[test]
fn group_commit_model_rejects_a_member_returning_before_the_commit() {
    assert!(loom_rejects(
        3,
        group_model(Canary::ReturnBeforeCommit, [Fate::Commit; 2], 0)
    ));
}

/// (b) A failing or panicking member is undone alone; the other member's
/// writes commit.
#[test]
fn group_commit_undoes_a_failing_member_alone() {
    check(3, group_model(Canary::None, [Fate::Commit, Fate::Fail], 0));
    quiet(|| check(3, group_model(Canary::None, [Fate::Commit, Fate::Panic], 0)));
}

#[test]
fn group_commit_model_rejects_an_undo_that_rolls_back_the_group() {
    assert!(loom_rejects(
        3,
        group_model(Canary::UndoWholeGroup, [Fate::Commit, Fate::Fail], 0)
    ));
}

/// (c) A failed COMMIT is reported to every member of its group (and a
/// member reported committed was).
#[test]
fn group_commit_reports_a_failed_commit_to_every_member() {
    check(3, group_model(Canary::None, [Fate::Commit; 2], 1));
}

#[test]
fn group_commit_model_rejects_a_failure_told_to_the_committer_only() {
    assert!(loom_rejects(
        3,
        group_model(Canary::FailureToCommitterOnly, [Fate::Commit; 2], 1)
    ));
}

// ------------------------------------------------------- the worker's channel

/// Two poppers take one item each of two pushed together: the pushes wake
/// one popper, and the one that takes the first item passes the wake-up on
/// (broken: it does not, and the other sleeps forever: loom reports the
/// deadlock).
fn channel_model(silent: bool) -> impl Fn() + Sync + Send + 'static {
    move || {
        loom_canary::SILENT_POP.with(|c| c.set(silent));
        let ch = Arc::new(loom_canary::Channel::new());
        let poppers: Vec<_> = (0..2)
            .map(|_| {
                let ch = ch.clone();
                thread::spawn(move || ch.pop())
            })
            .collect();
        ch.push(1u8);
        ch.push(2u8);
        let mut got: Vec<u8> = poppers
            .into_iter()
            .map(|p| p.join().unwrap().unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
    }
}

#[test]
fn channel_never_strands_an_item_while_a_popper_sleeps() {
    check(2, channel_model(false));
}

#[test]
fn channel_model_rejects_a_pop_that_keeps_the_wake_up() {
    let rejected = loom_rejects(2, channel_model(true));
    loom_canary::SILENT_POP.with(|c| c.set(false));
    assert!(rejected);
}
