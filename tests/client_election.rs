//! Leader election and schedules through the sync client: one leader at a
//! time, a resignation handed over at once, a leader deposed by its local
//! deadline, each new leader reported; workers firing a schedule's ticks
//! once each however many run.

#![allow(clippy::disallowed_methods)] // real threads, real time

use leasehold::core::{Missed, Rule, ScheduleSpec};
use leasehold::{
    Client, Deposed, ElectOptions, Election, Holder, HolderId, JobSpec, Leader, LeaderEvent,
    LostReason, ManualClock, MemStore, Store, WorkOptions,
};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

#[path = "support/door.rs"]
mod door;
use door::{Door, Valve};
#[path = "support/flaky.rs"]
mod flaky;
use flaky::{ends_within, Flaky, Panicky};

fn named(store: &Arc<dyn Store>, n: u128) -> Client {
    let holder = Holder::with_label(HolderId(n), &format!("replica-{n}")).unwrap();
    Client::builder_shared(store.clone()).holder(holder).build()
}

fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

#[test]
fn one_leader_at_a_time_and_a_resignation_hands_over_at_once() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let opts = ElectOptions::new(Duration::from_secs(10));
    let (tx, rx) = mpsc::channel();
    let mut elections: Vec<_> = (1..=3u128)
        .map(|n| {
            let tx = tx.clone();
            named(&store, n)
                .campaign("leader", opts, move |e| {
                    let _ = tx.send((n, e));
                })
                .unwrap()
        })
        .collect();
    let leaders = |e: &[leasehold::Election]| e.iter().filter(|e| e.leader().is_some()).count();
    assert!(wait_for(Duration::from_secs(5), || leaders(&elections) == 1));
    let first = elections.iter().position(|e| e.leader().is_some()).unwrap();
    let token = elections[first].leader().unwrap().token();
    let old = elections[first].leader().unwrap();
    // The others saw who leads, by label.
    assert!(wait_for(Duration::from_secs(5), || {
        rx.try_iter().any(|(n, e)| {
            matches!(e, LeaderEvent::NewLeader(ref h)
                if n as usize != first + 1 && h.holder.label.as_deref() == Some(&*format!("replica-{}", first + 1)))
        })
    }));
    let started = Instant::now();
    elections.remove(first).resign().unwrap();
    assert!(!old.is_valid(), "a resigned leader stops acting");
    assert!(wait_for(Duration::from_secs(5), || leaders(&elections) == 1));
    let handover = started.elapsed();
    assert!(
        handover < Duration::from_secs(2),
        "handed over in {handover:?}, TTL 10 s"
    );
    let next = elections.iter().find_map(|e| e.leader()).unwrap();
    assert!(next.token() > token);
    // Never two valid leaders while it settles.
    for _ in 0..50 {
        assert!(leaders(&elections) <= 1);
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn two_campaigns_of_one_client_never_both_lead() {
    // Both campaigns' first acquires pass the client's check of its held
    // keys and meet in the store: the second grant is the first's,
    // extended (one holder). One campaign leads; the other sees it lead.
    let door = Door::armed();
    let client = Client::builder_shared(door.clone()).build();
    let opts = ElectOptions::new(Duration::from_secs(10));
    let (tx, rx) = mpsc::channel();
    let elections: Vec<_> = (0..2)
        .map(|n| {
            let tx = tx.clone();
            client
                .campaign("leader", opts, move |e| {
                    let _ = tx.send((n, e));
                })
                .unwrap()
        })
        .collect();
    let leaders = || elections.iter().filter(|e| e.leader().is_some()).count();
    assert!(wait_for(Duration::from_secs(5), || leaders() >= 1));
    door.disarm();
    std::thread::sleep(Duration::from_millis(200));
    let elected: Vec<_> = rx
        .try_iter()
        .filter(|(_, e)| matches!(e, LeaderEvent::Elected(_)))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(leaders(), 1, "two leaders: elected {elected:?}");
    assert_eq!(elected.len(), 1, "{elected:?}");
}

/// A mem store whose first transaction commits and then waits to answer
/// until the test lets it go: a grant answered late.
struct LateAnswer {
    inner: MemStore,
    /// (the first has come, it is let go)
    state: std::sync::Mutex<(bool, bool)>,
    changed: std::sync::Condvar,
}

impl Store for LateAnswer {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn leasehold::core::Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        let r = self.inner.transact(f);
        let mut state = self.state.lock().unwrap();
        if !state.0 {
            state.0 = true;
            self.changed.notify_all();
            drop(self.changed.wait_while(state, |s| !s.1).unwrap());
        }
        r
    }
    fn describe(&self) -> String {
        "late answer".into()
    }
}

impl LateAnswer {
    fn new() -> Arc<LateAnswer> {
        Arc::new(LateAnswer {
            inner: MemStore::new(),
            state: std::sync::Mutex::new((false, false)),
            changed: std::sync::Condvar::new(),
        })
    }

    /// Wait (up to 5 s) until the first transaction has committed and
    /// holds its answer back.
    fn wait_first(&self) {
        let state = self.state.lock().unwrap();
        let (state, _) = self
            .changed
            .wait_timeout_while(state, Duration::from_secs(5), |s| !s.0)
            .unwrap();
        assert!(state.0, "the first transaction never reached the store");
    }

    /// Let the first transaction's answer go.
    fn let_go(&self) {
        self.state.lock().unwrap().1 = true;
        self.changed.notify_all();
    }
}

#[test]
fn a_grant_answered_after_a_sibling_claimed_and_gave_it_back_does_not_lead() {
    // Campaign A's acquire commits a new grant, and its answer is late.
    // Campaign B of the same client meets the grant in the store (the
    // same holder: extended), claims it, gives it back (not a term of its
    // own) and wins a new term. A's answer then comes: its grant is gone,
    // and A must not lead beside B.
    let store = LateAnswer::new();
    let client = Client::builder_shared(store.clone()).build();
    let opts = ElectOptions::new(Duration::from_secs(10));
    let (tx, a_events) = mpsc::channel();
    let a = client
        .campaign("leader", opts, move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
    store.wait_first();
    let b = client.campaign("leader", opts, |_| {}).unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || b.leader().is_some()),
        "B never led"
    );
    let b_token = b.leader().unwrap().token();
    store.let_go();
    std::thread::sleep(Duration::from_millis(300));
    assert!(a.leader().is_none(), "A leads beside B");
    let b_leader = b.leader().expect("B still leads");
    assert_eq!(b_leader.token(), b_token);
    assert!(b_leader.is_valid());
    // A says who leads: B's term, not A's late grant, which never led.
    let told: Vec<_> = a_events.try_iter().collect();
    assert!(
        !told.is_empty()
            && told.iter().all(|e| match e {
                LeaderEvent::NewLeader(info) => info.token == b_token,
                _ => false,
            }),
        "B leads with token {b_token}: {told:?}"
    );
}

#[test]
fn a_grant_answered_after_a_sibling_claimed_and_released_it_acquires_again() {
    // An acquire's grant is answered late; meanwhile a sibling acquire of
    // the same client claimed it by extension and released it. Nobody
    // holds the key: the late acquire asks the store again and gets a
    // grant of its own (before, it failed with `Held`, naming the grant
    // that had been released).
    let store = LateAnswer::new();
    let client = Client::builder_shared(store.clone()).build();
    let ttl = Duration::from_secs(10);
    std::thread::scope(|s| {
        let late = s.spawn(|| client.try_acquire("k", ttl));
        store.wait_first();
        let sibling = client.try_acquire("k", ttl).unwrap();
        assert!(sibling.renewed(), "the late acquire's grant, extended");
        let given_back = sibling.token();
        sibling.release().unwrap();
        store.let_go();
        let guard = late.join().unwrap().expect("acquired again");
        assert!(guard.token() > given_back, "a new grant");
        assert!(guard.is_valid());
        let holders = client.inspect("k").unwrap().holders;
        assert_eq!(holders.len(), 1);
        assert_eq!(holders[0].token, guard.token());
    });
}

#[test]
fn a_stepping_down_leaders_grant_is_not_handed_to_a_guard_of_its_client() {
    // The leader steps down; its release is still on its way to the store
    // when a guard of the same client asks for the key. The store would
    // extend the leader's grant for it (one holder) just before releasing
    // it: the guard must be told the key is held until the release is
    // answered.
    let valve = Valve::new();
    let client = Client::builder_shared(valve.clone()).build();
    let (tx, rx) = mpsc::channel();
    let election = client
        .campaign("k", ElectOptions::new(Duration::from_secs(10)), move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
    assert!(wait_for(Duration::from_secs(5), || election
        .leader()
        .is_some()));
    let token = election.leader().unwrap().token();
    valve.hold_next();
    election.step_down();
    assert!(valve.wait_held(), "the release was not sent");
    assert!(rx
        .iter()
        .any(|e| matches!(e, LeaderEvent::Deposed(Deposed::Resigned))));
    let r = client.try_acquire("k", Duration::from_secs(10));
    valve.open();
    assert!(
        matches!(r, Err(leasehold::Error::Held { .. })),
        "a guard of the grant being released (token {token}): {r:?}"
    );
    drop(election);
}

/// Elected on a manual clock with a 3 s TTL, then the clock jumps
/// `advance_ms` with no renewal run: the term is lost at its local deadline
/// and a new one is elected. Returns the lost leader, the new one and the
/// election.
fn deposed_by_the_deadline_then_elected_again(advance_ms: u64) -> (Leader, Leader, Election) {
    let clock = ManualClock::new(1_000_000);
    let store: Arc<dyn Store> = Arc::new(MemStore::with_clock(Arc::new(clock.clone())));
    let client = Client::builder_shared(store)
        .clock(Arc::new(clock.clone()))
        .build();
    let (tx, rx) = mpsc::channel();
    let election = client
        .campaign("k", ElectOptions::new(Duration::from_secs(3)), move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
    let next = || rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let LeaderEvent::Elected(leader) = next() else {
        panic!("expected to be elected")
    };
    assert!(leader.is_valid());
    clock.advance(advance_ms);
    match next() {
        LeaderEvent::Deposed(Deposed::Lost(LostReason::LocalDeadline)) => {}
        other => panic!("expected a loss, got {other:?}"),
    }
    let LeaderEvent::Elected(again) = next() else {
        panic!("expected a new term")
    };
    (leader, again, election)
}

/// A resignation whose one release attempt went unanswered leaves the
/// term's grant live in the store, and the same client's next campaign
/// extends it (one holder id). That campaign used to lead under the
/// resigned term's token: two terms, one token, which fencing cannot tell
/// apart. It gives that grant back and leads under a new token.
#[test]
fn a_campaign_after_an_unanswered_resignation_leads_under_a_new_token() {
    let store = Arc::new(Flaky::new(MemStore::new(), 0));
    let client = Client::builder_shared(store.clone()).build();
    let opts = ElectOptions::new(Duration::from_secs(30));
    let first = client.campaign("k", opts, |_| {}).unwrap();
    assert!(wait_for(Duration::from_secs(5), || first
        .leader()
        .is_some()));
    let old = first.leader().unwrap().token();
    store.failing(true);
    let _ = first.resign();
    store.failing(false);
    let second = client.campaign("k", opts, |_| {}).unwrap();
    assert!(wait_for(Duration::from_secs(5), || second
        .leader()
        .is_some()));
    let new = second.leader().unwrap().token();
    assert!(
        new > old,
        "the new term leads under the old term's token {old}"
    );
    second.resign().unwrap();
}

#[test]
fn a_leader_past_its_local_deadline_is_deposed_and_campaigns_again() {
    // The process "pauses" past its TTL: no renewal ran in time.
    let (leader, again, election) = deposed_by_the_deadline_then_elected_again(3_500);
    assert!(!leader.is_valid());
    assert_eq!(leader.lost(), Some(LostReason::LocalDeadline));
    assert!(again.token() > leader.token());
    election.resign().unwrap();
}

#[test]
fn a_term_lost_at_its_local_deadline_is_released_and_the_next_term_has_a_new_token() {
    // The local deadline (TTL minus the 1 % drift margin) passes while the
    // store still counts the grant live: the next term must be a new grant
    // (a higher token), not the old one extended under the same token.
    // Past the local deadline (2,970 ms), inside the store's TTL (3,000).
    let (leader, again, election) = deposed_by_the_deadline_then_elected_again(2_980);
    assert!(
        again.token() > leader.token(),
        "the next term reused token {} of the lost one",
        again.token()
    );
    election.resign().unwrap();
}

#[test]
fn workers_fire_each_tick_of_a_schedule_once() {
    const WALL: u64 = 1_768_478_400_000;
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let wall = ManualClock::new(WALL);
    let client = |n| {
        Client::builder_shared(store.clone())
            .holder(Holder::new(HolderId(n)))
            .wall_clock(Arc::new(wall.clone()))
            .build()
    };
    let queue = client(1).queue("reports").unwrap();
    let spec = ScheduleSpec {
        name: "hourly".into(),
        rule: Rule::every(1_000),
        job: JobSpec::new("report"),
        missed: Missed::Skip,
    };
    queue.schedule(&spec).unwrap();
    wall.set(WALL + 3_500);
    let opts = WorkOptions {
        drain: true,
        ..WorkOptions::default()
    };
    let stop = AtomicBool::new(false);
    let done: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (1..=3)
            .map(|n| {
                let q = client(n).queue("reports").unwrap();
                let (opts, stop) = (&opts, &stop);
                s.spawn(move || q.work(opts, stop, |_| Ok(())).unwrap().completed)
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    assert_eq!(done, 3, "three ticks, one job each");
    let keys: Vec<String> = queue
        .list(None, leasehold::JobId(0), 100)
        .unwrap()
        .iter()
        .filter_map(|j| j.unique_key.as_deref().map(str::to_owned))
        .collect();
    assert_eq!(
        keys,
        [
            "hourly@2026-01-15T12:00:01Z",
            "hourly@2026-01-15T12:00:02Z",
            "hourly@2026-01-15T12:00:03Z"
        ]
    );
    // Nothing more until the next tick.
    assert!(queue.fire_schedules().unwrap().enqueued.is_empty());
    assert_eq!(queue.schedules().unwrap()[0].next_ms, WALL + 4_000);
}

/// While a store call hangs (another connection holds SQLite's write lock
/// for 3 s), the sync campaign's `Deposed` reaches `on_event` at the
/// term's local deadline, not when the store answers.
#[test]
fn a_hung_store_call_does_not_delay_deposed() {
    let dir = std::env::temp_dir().join(format!("leasehold-elect-hung-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("lh.db");
    let client = Client::new(leasehold::SqliteStore::open(&db).unwrap());
    let (tx, rx) = mpsc::channel();
    let election = client
        .campaign(
            "k",
            ElectOptions::new(Duration::from_millis(600)),
            move |e| {
                let _ = tx.send((Instant::now(), e));
            },
        )
        .unwrap();
    let leader = loop {
        match rx.recv_timeout(Duration::from_secs(5)).expect("elected") {
            (_, LeaderEvent::Elected(leader)) => break leader,
            _ => continue,
        }
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(leader.is_valid());
    let (held_tx, held_rx) = mpsc::channel();
    let path = db.clone();
    let blocker = std::thread::spawn(move || {
        let c = rusqlite::Connection::open(path).unwrap();
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        held_tx.send(Instant::now()).unwrap();
        std::thread::sleep(Duration::from_secs(3));
        c.execute_batch("COMMIT").unwrap();
    });
    let locked = held_rx.recv().unwrap();
    let deposed_at = loop {
        match rx.recv_timeout(Duration::from_secs(5)).expect("deposed") {
            (at, LeaderEvent::Deposed(Deposed::Lost(_))) => break at,
            _ => continue,
        }
    };
    assert!(!leader.is_valid());
    let late = deposed_at.saturating_duration_since(locked);
    assert!(
        late < Duration::from_millis(1_500),
        "Deposed {late:?} after the lock was taken (it is held 3 s)"
    );
    blocker.join().unwrap();
    election.resign().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A campaign on `store` with a 30 s TTL whose `on_event` panics when it
/// is elected; returned once it was.
fn elected_with_a_panicking_on_event(store: &Arc<dyn Store>) -> Election {
    let (elected_tx, elected_rx) = mpsc::channel();
    let election = named(store, 1)
        .campaign("k", ElectOptions::new(Duration::from_secs(30)), move |e| {
            if let LeaderEvent::Elected(_) = e {
                let _ = elected_tx.send(());
                panic!("on_event failed");
            }
        })
        .unwrap();
    let elected = elected_rx.recv_timeout(Duration::from_secs(5));
    elected.expect("elected");
    election
}

/// A panic in `on_event` (the application's code) ends the election: the
/// term is released, so the next campaigner leads at once, and the panic
/// reaches whoever resigns. Before, the election thread unwound while its
/// store thread waited for requests that never came, and `resign` hung.
#[test]
fn a_panic_in_on_event_releases_the_term_and_reaches_resign() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let election = elected_with_a_panicking_on_event(&store);
    match ends_within(Duration::from_secs(10), move || election.resign()) {
        Some(Err(message)) => assert!(message.contains("on_event failed"), "{message}"),
        other => panic!("resign should resume the callback's panic, got {other:?}"),
    }
    // The term's 30 s grant was given back: another campaigner leads now.
    let (tx, rx) = mpsc::channel();
    let next = named(&store, 2)
        .campaign("k", ElectOptions::new(Duration::from_secs(30)), move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
    let elected = std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(5)).ok())
        .any(|e| matches!(e, LeaderEvent::Elected(_)));
    assert!(elected, "the panicking leader's term was not released");
    next.resign().unwrap();
}

/// A store call that panics (a bug in a store) ends the election, and the
/// panic reaches whoever joins it. Before, the election waited forever for
/// the answer.
#[test]
fn a_store_call_that_panics_ends_the_election() {
    let store = Arc::new(Panicky::new(MemStore::new()));
    let (tx, rx) = mpsc::channel();
    let client = Client::builder_shared(store.clone()).build();
    let election = client
        .campaign("k", ElectOptions::new(Duration::from_secs(3)), move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
    let leader = std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(5)).ok())
        .find_map(|e| match e {
            LeaderEvent::Elected(leader) => Some(leader),
            _ => None,
        })
        .expect("elected");
    // The next renewal (about a second from now) panics.
    store.arm();
    match ends_within(Duration::from_secs(10), move || election.join()) {
        Some(Err(message)) => assert!(message.contains("the store panicked"), "{message}"),
        other => panic!("join should resume the store's panic, got {other:?}"),
    }
    // The term ended with the election, well before its local deadline
    // (about 3 s after the grant), and the application was told.
    assert!(!leader.is_valid(), "the term outlived its election");
    let told = rx.try_iter().any(|e| matches!(e, LeaderEvent::Deposed(_)));
    assert!(told, "the application was not told its term ended");
}

/// Dropping an election whose `on_event` panicked resigns without
/// resuming the panic (a drop while unwinding would abort the process).
#[test]
fn dropping_an_election_whose_on_event_panicked_does_not_panic() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let election = elected_with_a_panicking_on_event(&store);
    let dropped = ends_within(Duration::from_secs(10), move || drop(election));
    assert!(matches!(dropped, Some(Ok(()))), "{dropped:?}");
}
