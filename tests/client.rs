//! The client layer: guards, local deadlines, keep-alive, blocking
//! acquire, transient-error retry, queue handles and the worker loop.

#![allow(clippy::disallowed_methods)] // tests use real threads and time

use leasehold::core::Txn;
use leasehold::{
    Client, DriftBound, Error, Holder, HolderId, JobSpec, JobState, LeaseOptions, LostReason,
    ManualClock, MemStore, QueuePolicy, Store, WorkOptions,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "support/door.rs"]
mod door;
use door::{Door, Valve};
#[path = "support/flaky.rs"]
mod flaky;
use flaky::{ends_within, Flaky, Panicky};

fn manual_pair() -> (ManualClock, ManualClock, Arc<dyn Store>) {
    let store_clock = ManualClock::new(1_000_000);
    let local = ManualClock::new(5);
    let store: Arc<dyn Store> = Arc::new(MemStore::with_clock(Arc::new(store_clock.clone())));
    (store_clock, local, store)
}

#[test]
fn local_deadline_uses_send_time_and_drift() {
    let (_store_clock, local, store) = manual_pair();
    let client = Client::builder_shared(store)
        .clock(Arc::new(local.clone()))
        .drift(DriftBound {
            ppm: 10_000,
            margin_ms: 5,
        })
        .build();
    let guard = client
        .try_acquire("k", Duration::from_millis(1000))
        .unwrap();
    // Sent at local 5; 1000 ms minus 1 % minus 5 ms margin = 985 ms of validity.
    local.set(5 + 984);
    assert!(guard.is_valid());
    assert_eq!(guard.remaining(), Duration::from_millis(1));
    local.set(5 + 985);
    assert!(!guard.is_valid(), "L3: invalid at the local deadline");
    assert_eq!(guard.remaining(), Duration::ZERO);
}

/// A job claimed by hand with a run-time limit shorter than its lease is
/// valid until the limit (from the claim's send time, less the drift
/// allowance), not the lease, and no renewal moves it: past it the store's
/// claim has ended (F3, and L3 for the handle).
#[test]
fn a_hand_claimed_job_is_valid_until_its_run_time_limit_not_its_lease() {
    let (store_clock, local, store) = manual_pair();
    let client = Client::builder_shared(store)
        .clock(Arc::new(local.clone()))
        .drift(DriftBound {
            ppm: 10_000,
            margin_ms: 5,
        })
        .build();
    let q = client.queue("q").unwrap();
    let spec = leasehold::JobSpec {
        timeout: Some(Duration::from_millis(1_000)),
        ..leasehold::JobSpec::new("x")
    };
    q.push(&spec).unwrap();
    let job = q.claim(Duration::from_secs(60)).unwrap().unwrap();
    assert_eq!(
        job.record().claim.unwrap().lease_until_ms,
        1_000_000 + 1_000,
        "the store's claim ends at the deadline"
    );
    // Sent at local 5: 1000 ms minus 1 % minus 5 ms = 985 ms, as a lease.
    local.set(5 + 984);
    store_clock.set(1_000_000 + 984);
    assert!(job.is_valid());
    assert!(
        !job.heartbeat().unwrap(),
        "renewed (no cancel), the deadline unmoved"
    );
    local.set(5 + 985);
    assert!(!job.is_valid(), "invalid at the limit, whatever the lease");
}

#[test]
fn renew_extends_local_deadline_and_reports_loss() {
    let (store_clock, local, store) = manual_pair();
    let client = Client::builder_shared(store.clone())
        .clock(Arc::new(local.clone()))
        .drift(DriftBound {
            ppm: 0,
            margin_ms: 0,
        })
        .build();
    let guard = client.try_acquire("k", Duration::from_millis(100)).unwrap();
    local.set(95);
    store_clock.advance(90);
    guard.renew().unwrap();
    local.set(190);
    assert!(guard.is_valid(), "renewed at local 95: valid until 195");
    // The store's clock passes the expiry; someone else takes the key.
    store_clock.advance(100);
    let other = Client::builder_shared(store).build();
    let theirs = other.try_acquire("k", Duration::from_millis(100)).unwrap();
    assert!(theirs.token() > guard.token());
    let err = guard.renew().unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert_eq!(guard.lost(), Some(LostReason::StaleToken));
    assert!(!guard.is_valid());
    // Dropping the lost guard must not release the new holder's lease.
    drop(guard);
    assert_eq!(other.inspect("k").unwrap().holders[0].token, theirs.token());
}

#[test]
fn drop_releases_and_tokens_grow() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let a = Client::builder_shared(store.clone()).build();
    let b = Client::builder_shared(store).build();
    let t1 = {
        let g = a.try_acquire("k", Duration::from_secs(10)).unwrap();
        assert!(matches!(
            b.try_acquire("k", Duration::from_secs(10)),
            Err(Error::Held { .. })
        ));
        g.token()
    };
    let g = b.try_acquire("k", Duration::from_secs(10)).unwrap();
    assert!(g.token() > t1);
    // A second guard of the same client does not share the grant: it is
    // told the key is held (by us), and dropping it cannot free the key.
    match b.try_acquire("k", Duration::from_secs(10)) {
        Err(Error::Held { holders, .. }) => assert_eq!(holders[0].token, g.token()),
        other => panic!("expected Held, got {other:?}"),
    }
    assert!(g.is_valid());
    assert!(matches!(
        a.try_acquire("k", Duration::from_secs(10)),
        Err(Error::Held { .. })
    ));
    // Once released, the same client can acquire it again.
    g.release().unwrap();
    let again = b.try_acquire("k", Duration::from_secs(10)).unwrap();
    assert!(again.token() > t1 + 1);
}

#[test]
fn two_threads_of_one_client_never_share_a_grant() {
    // Two threads acquire one key through one client at the same moment:
    // both pass the client's check of its held keys before either grant
    // is made. The store grants the first and, to the same holder, extends
    // it for the second (`renewed`, same token): one guard only may come
    // of it, and the other acquire is told the key is held.
    let door = Door::armed();
    let client = Client::builder_shared(door.clone()).build();
    let results: Vec<_> = std::thread::scope(|s| {
        let tries: Vec<_> = (0..2)
            .map(|_| s.spawn(|| client.try_acquire("k", Duration::from_secs(10))))
            .collect();
        tries.into_iter().map(|t| t.join().unwrap()).collect()
    });
    door.disarm();
    let (won, lost): (Vec<_>, Vec<_>) = results.into_iter().partition(|r| r.is_ok());
    assert_eq!(won.len(), 1, "two guards of one grant: {won:?}");
    let guard = won.into_iter().next().unwrap().unwrap();
    match &lost[0] {
        Err(Error::Held { holders, .. }) => assert_eq!(holders[0].token, guard.token()),
        other => panic!("expected Held, got {other:?}"),
    }
    // The loser left nothing behind: once released, the key is free.
    guard.release().unwrap();
    assert!(client.inspect("k").unwrap().holders.is_empty());
    client
        .try_acquire("k", Duration::from_secs(10))
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn a_new_grant_replaces_the_record_of_one_that_ran_out() {
    // B passes the client's check and its request waits on its way; A
    // acquires the key with a short TTL, which runs out in the store. B's
    // request then makes a new grant (a new token): B gets its guard, and
    // A's guard ending later does not take back B's record, so a third
    // acquire through the client is still refused rather than handed B's
    // grant.
    let valve = Valve::new();
    let client = Client::builder_shared(valve.clone()).build();
    valve.hold_next();
    let b = std::thread::scope(|s| {
        let b = s.spawn(|| client.try_acquire("k", Duration::from_secs(60)));
        assert!(valve.wait_held(), "B's request was not sent");
        let a = client.try_acquire("k", Duration::from_millis(50)).unwrap();
        std::thread::sleep(Duration::from_millis(120));
        valve.open();
        let b = b.join().unwrap().expect("B's new grant");
        assert!(b.token() > a.token());
        drop(a);
        b
    });
    match client.try_acquire("k", Duration::from_secs(60)) {
        Err(Error::Held { holders, .. }) => assert_eq!(holders[0].token, b.token()),
        other => panic!("B's grant handed out again: {other:?}"),
    }
    b.release().unwrap();
    client
        .try_acquire("k", Duration::from_secs(60))
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn keep_alive_holds_past_ttl_and_stops_on_release() {
    let client = Client::new(MemStore::new());
    let guard = client.try_acquire("k", Duration::from_millis(600)).unwrap();
    let lost = Arc::new(AtomicUsize::new(0));
    let l = lost.clone();
    guard
        .keep_alive(move |_| {
            l.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(guard.is_valid(), "renewed about every 200 ms");
    assert_eq!(client.inspect("k").unwrap().holders.len(), 1);
    guard.release().unwrap();
    assert!(client.inspect("k").unwrap().holders.is_empty());
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        client.inspect("k").unwrap().holders.is_empty(),
        "no renewal revives a released lease"
    );
    assert_eq!(lost.load(Ordering::SeqCst), 0);
}

#[test]
fn keep_alive_reports_loss_once() {
    let (store_clock, _local, store) = manual_pair();
    let client = Client::builder_shared(store.clone()).build();
    let guard = client.try_acquire("k", Duration::from_millis(60)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    guard
        .keep_alive(move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
    // The store's clock jumps past the TTL and another holder takes over.
    store_clock.advance(1000);
    let other = Client::builder_shared(store).build();
    let _theirs = other.try_acquire("k", Duration::from_secs(60)).unwrap();
    let err = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("loss reported");
    assert!(err.is_lost(), "{err}");
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "reported once"
    );
    assert!(!guard.is_valid());
    assert!(guard.lost().is_some());
}

#[test]
fn blocking_acquire_waits_for_release() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let a = Client::builder_shared(store.clone()).build();
    let b = Client::builder_shared(store).build();
    let held = a.try_acquire("k", Duration::from_secs(30)).unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        held.release().unwrap();
    });
    let start = Instant::now();
    let g = b
        .acquire(
            "k",
            LeaseOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(10)),
        )
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(g.token(), 2);
    t.join().unwrap();
    // And a wait that runs out answers Held.
    let c = Client::builder_shared(b.store().clone()).build();
    let start = Instant::now();
    let r = c.acquire(
        "k",
        LeaseOptions::new(Duration::from_secs(1)).wait(Duration::from_millis(120)),
    );
    assert!(matches!(r, Err(Error::Held { .. })), "{r:?}");
    // The client counts on its ms clock; allow for its rounding.
    assert!(
        start.elapsed() >= Duration::from_millis(110),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn keep_alive_declares_loss_at_the_local_deadline_when_renewals_fail() {
    // Every renewal fails transiently: the loss is reported at the local
    // deadline, not after the busy timeout.
    let flaky = Flaky {
        inner: MemStore::new(),
        failures_left: AtomicUsize::new(0),
    };
    let flaky = Arc::new(flaky);
    let client = Client::builder_shared(flaky.clone())
        .busy_timeout(Duration::from_secs(30))
        .build();
    let guard = client.try_acquire("k", Duration::from_millis(300)).unwrap();
    flaky.failures_left.store(usize::MAX, Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    let start = Instant::now();
    guard
        .keep_alive(move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
    let err = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("loss reported");
    let waited = start.elapsed();
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LostReason::LocalDeadline,
                ..
            }
        ),
        "{err}"
    );
    assert!(waited < Duration::from_secs(2), "reported after {waited:?}");
    assert!(!guard.is_valid());
    flaky.failures_left.store(0, Ordering::SeqCst);
}

#[test]
fn on_lost_fires_once_even_when_a_manual_renew_sees_the_loss_first() {
    let (store_clock, _local, store) = manual_pair();
    let client = Client::builder_shared(store.clone()).build();
    let guard = client.try_acquire("k", Duration::from_secs(60)).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    guard
        .keep_alive(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    store_clock.advance(61_000);
    let _other = Client::builder_shared(store)
        .build()
        .try_acquire("k", Duration::from_secs(60))
        .unwrap();
    assert!(guard.renew().unwrap_err().is_lost());
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    drop(guard);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn on_lost_may_drop_the_guard_and_panics_do_not_hang_release() {
    let (store_clock, _local, store) = manual_pair();
    let client = Client::builder_shared(store.clone()).build();
    let slot: Arc<std::sync::Mutex<Option<leasehold::LeaseGuard>>> = Default::default();
    let guard = client.try_acquire("k", Duration::from_millis(90)).unwrap();
    let s = slot.clone();
    guard
        .keep_alive(move |_| {
            // Dropping the guard from its own keep-alive thread must not
            // deadlock (no self-join).
            drop(s.lock().unwrap().take());
        })
        .unwrap();
    *slot.lock().unwrap() = Some(guard);
    store_clock.advance(10_000);
    let start = Instant::now();
    while slot.lock().unwrap().is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "on_lost never ran"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // A panicking callback ends the thread; release still returns.
    let g = client.try_acquire("k2", Duration::from_millis(90)).unwrap();
    g.keep_alive(|_| panic!("callback panics")).unwrap();
    store_clock.advance(10_000);
    std::thread::sleep(Duration::from_millis(200));
    let _ = g.release();
}

#[test]
fn transient_errors_are_retried_then_reported_busy() {
    let flaky = Flaky {
        inner: MemStore::new(),
        failures_left: AtomicUsize::new(5),
    };
    let client = Client::builder(flaky)
        .busy_timeout(Duration::from_secs(5))
        .build();
    let g = client.try_acquire("k", Duration::from_secs(1)).unwrap();
    assert_eq!(g.token(), 1);
    let always = Flaky {
        inner: MemStore::new(),
        failures_left: AtomicUsize::new(usize::MAX),
    };
    let client = Client::builder(always)
        .busy_timeout(Duration::from_millis(50))
        .build();
    match client.try_acquire("k", Duration::from_secs(1)) {
        Err(Error::Busy { waited_ms, last }) => {
            assert!(waited_ms >= 50);
            assert!(last.to_string().contains("SQLITE_BUSY"));
        }
        other => panic!("expected Busy, got {other:?}"),
    }
}

/// [`Flaky`] with its store's wake-ups: a release in it moves the epoch a
/// waiter compares against.
struct FlakyWaking(Flaky);

impl Store for FlakyWaking {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        self.0.transact(f)
    }
    fn describe(&self) -> String {
        "flaky, waking".into()
    }
    fn epoch(&self, wake: leasehold::Wake) -> u64 {
        self.0.inner.epoch(wake)
    }
    fn wait_epoch(&self, wake: leasehold::Wake, epoch: u64, timeout: Duration) -> bool {
        self.0.inner.wait_epoch(wake, epoch, timeout)
    }
}

/// A try-once acquire still backs off between its retries of a busy
/// store after a release in it moved the wake-up epoch: it has no epoch
/// of its own to wait on, and must not take the moved one for a wake-up
/// (it once retried with no pause at all until its busy timeout).
#[test]
fn a_try_once_acquire_backs_off_between_retries_after_a_release() {
    let store = Arc::new(FlakyWaking(Flaky {
        inner: MemStore::new(),
        failures_left: AtomicUsize::new(0),
    }));
    let client = Client::builder_shared(store.clone())
        .busy_timeout(Duration::from_millis(300))
        .build();
    client
        .try_acquire("other", Duration::from_secs(1))
        .unwrap()
        .release()
        .unwrap();
    store.0.failures_left.store(usize::MAX, Ordering::SeqCst);
    let busy = client.try_acquire("k", Duration::from_secs(1));
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    let tries = usize::MAX - store.0.failures_left.load(Ordering::SeqCst);
    // Backoff from 1 ms, doubling to its cap, for 300 ms: a few dozen
    // tries at most; with no pause, thousands.
    assert!(tries <= 100, "{tries} tries in 300 ms");
}

#[test]
fn claimed_job_heartbeat_complete_and_fail() {
    let client = Client::builder(MemStore::new())
        .policy(QueuePolicy {
            backoff_base_ms: 2,
            backoff_max_ms: 2,
            ..QueuePolicy::default()
        })
        .build();
    let q = client.queue("q").unwrap();
    let id = q.push(&JobSpec::new("a")).unwrap().id;
    let job = q.claim(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!((job.id(), job.attempt(), job.token()), (id, 1, 1));
    assert!(job.is_valid());
    assert!(!job.heartbeat().unwrap());
    assert_eq!(q.cancel(id).unwrap(), JobState::Running);
    assert!(job.heartbeat().unwrap(), "cancel seen at heartbeat");
    assert!(job.cancel_requested());
    assert_eq!(job.fail("stopping").unwrap(), JobState::Cancelled);
    assert!(job.complete().unwrap_err().is_lost(), "settled once");
    q.retry(id).unwrap();
    let job = q.claim(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(job.fail("boom").unwrap(), JobState::Scheduled);
    std::thread::sleep(Duration::from_millis(5));
    let job = q.claim(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(job.attempt(), 2);
    job.complete().unwrap();
    assert_eq!(q.get(id).unwrap().state, JobState::Done);
    assert_eq!(q.purge(Duration::ZERO).unwrap(), 1);
}

#[test]
fn worker_loop_drains_with_retries() {
    let client = Client::builder(MemStore::new())
        .policy(QueuePolicy {
            backoff_base_ms: 1,
            backoff_max_ms: 2,
            ..QueuePolicy::default()
        })
        .build();
    let q = client.queue("work").unwrap();
    for i in 0..20u8 {
        q.push(&JobSpec::new(vec![i])).unwrap();
    }
    let stop = AtomicBool::new(false);
    let seen = std::sync::Mutex::new(Vec::new());
    let opts = WorkOptions {
        lease: Duration::from_secs(5),
        batch: 4,
        drain: true,
        idle_poll: Duration::from_millis(5),
        ..WorkOptions::default()
    };
    // Drain stops once nothing is ready, running or due: the retries
    // waiting out their backoff are due, so one call finishes everything.
    let report = q
        .work(&opts, &stop, |job| {
            seen.lock().unwrap().push((job.payload()[0], job.attempt()));
            if job.payload()[0] % 5 == 0 && job.attempt() == 1 {
                Err("first attempt fails".into())
            } else {
                Ok(())
            }
        })
        .unwrap();
    assert_eq!(report.completed, 20);
    assert_eq!(report.failed, 4);
    assert_eq!(report.lost, 0);
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 24, "20 first attempts and 4 retries");
    assert_eq!(seen.iter().filter(|(_, a)| *a == 2).count(), 4);
    let counts = q.stats().unwrap();
    assert_eq!(counts.get(JobState::Done), 20);
    assert_eq!(counts.total(), 20);
}

#[test]
fn explicit_holder_can_renew_and_release_by_token() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let id = HolderId::parse("7f1d7c0e-7a43-4b5e-9d2a-0c6f3a1b2c3d").unwrap();
    let a = Client::builder_shared(store.clone())
        .holder(Holder::with_label(id, "cli").unwrap())
        .build();
    let (key, token) = a
        .try_acquire("k", Duration::from_secs(10))
        .unwrap()
        .detach();
    assert_eq!(key, "k");
    assert_eq!(
        a.inspect("k").unwrap().holders.len(),
        1,
        "detach keeps the lease"
    );
    // A second client with the same holder id (a later CLI call) can renew
    // and release by token; a different holder cannot.
    let b = Client::builder_shared(store.clone())
        .holder(Holder::new(id))
        .build();
    b.renew("k", token, Duration::from_secs(20)).unwrap();
    let stranger = Client::builder_shared(store).build();
    assert!(stranger.release("k", token).unwrap_err().is_lost());
    b.release("k", token).unwrap();
    assert!(b.inspect("k").unwrap().holders.is_empty());
}

/// A reason the store would refuse is rejected before anything changes:
/// the claim stays valid and heartbeating, and can still be settled.
#[test]
fn fail_with_an_overlong_reason_keeps_the_claim() {
    let client = Client::new(MemStore::new());
    let q = client.queue("q").unwrap();
    q.push(&JobSpec::new("x")).unwrap();
    let job = q.claim(Duration::from_secs(30)).unwrap().unwrap();
    job.heartbeat_in_background(|_| {}).unwrap();
    let long = "e".repeat(6_600);
    match job.fail(&long) {
        Err(Error::Invalid {
            field: leasehold::Field::Reason,
            ..
        }) => {}
        other => panic!("expected an invalid reason, got {other:?}"),
    }
    assert!(job.is_valid(), "nothing was consumed");
    assert!(job.heartbeat().is_ok(), "the claim is still ours");
    assert_eq!(
        job.fail(&leasehold::fit_reason(&long)).unwrap(),
        JobState::Scheduled
    );
    let record = q.get(job.id()).unwrap();
    let kept = record.last_error.unwrap();
    assert!(kept.len() <= leasehold::core::MAX_TEXT_BYTES);
    assert!(kept.starts_with("eee") && kept.ends_with("eee") && kept.contains("bytes cut"));
}

/// A handler's error of any length (a stack trace, captured stderr) is
/// recorded, cut to fit, and the loop goes on.
#[test]
fn worker_loop_records_overlong_errors_and_goes_on() {
    let client = Client::builder(MemStore::new())
        .policy(QueuePolicy {
            backoff_base_ms: 1,
            backoff_max_ms: 2,
            ..QueuePolicy::default()
        })
        .build();
    let q = client.queue("q").unwrap();
    for i in 0..3u8 {
        q.push(&JobSpec {
            max_attempts: 1,
            ..JobSpec::new(vec![i])
        })
        .unwrap();
    }
    let stop = AtomicBool::new(false);
    let opts = WorkOptions {
        drain: true,
        idle_poll: Duration::from_millis(5),
        ..WorkOptions::default()
    };
    let report = q
        .work(&opts, &stop, |_| {
            Err(format!("trace\0{}", "x".repeat(6_600)))
        })
        .unwrap();
    assert_eq!((report.failed, report.lost), (3, 0));
    assert_eq!(q.stats().unwrap().get(JobState::Dead), 3);
    for job in q
        .list(Some(JobState::Dead), leasehold::JobId(0), 10)
        .unwrap()
    {
        let e = job.last_error.unwrap();
        assert!(
            e.starts_with("trace\u{fffd}xx") && e.contains("bytes cut"),
            "{e}"
        );
    }
}

/// `concurrency` handlers run at once, each job exactly once.
#[test]
fn worker_loop_runs_jobs_concurrently() {
    let client = Client::new(MemStore::new());
    let q = client.queue("q").unwrap();
    for i in 0..12u8 {
        q.push(&JobSpec::new(vec![i])).unwrap();
    }
    let (now, peak) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let seen = std::sync::Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let opts = WorkOptions {
        concurrency: 4,
        drain: true,
        idle_poll: Duration::from_millis(5),
        ..WorkOptions::default()
    };
    let outcomes = AtomicUsize::new(0);
    let report = q
        .work_with(
            &opts,
            &stop,
            |job| {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(60));
                seen.lock().unwrap().push(job.payload()[0]);
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            },
            |_: &leasehold::JobRecord, outcome| {
                assert_eq!(outcome, leasehold::JobOutcome::Done);
                outcomes.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
    assert_eq!(report.completed, 12);
    assert_eq!(outcomes.load(Ordering::SeqCst), 12);
    assert_eq!(peak.load(Ordering::SeqCst), 4, "four at a time");
    let mut seen = seen.into_inner().unwrap();
    seen.sort_unstable();
    assert_eq!(seen, (0..12).collect::<Vec<u8>>(), "each job once");
}

/// A panic of `observe` ends the loop and reaches the caller: on 6178e9f it
/// unwound the driver while the handler threads waited on a pool nobody
/// closed, and `work_with` never returned.
#[test]
fn a_panicking_observer_ends_the_worker_loop_with_its_panic() {
    let client = Client::new(MemStore::new());
    let q = client.queue("q").unwrap();
    for i in 0..20u8 {
        q.push(&JobSpec::new(vec![i])).unwrap();
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let stop = AtomicBool::new(false);
        let opts = WorkOptions {
            concurrency: 4,
            drain: true,
            ..WorkOptions::default()
        };
        let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            q.work_with(
                &opts,
                &stop,
                |_| Ok(()),
                |_: &leasehold::JobRecord, _| panic!("observer says no"),
            )
        }));
        let _ = tx.send(ended.map(|r| r.is_ok()).map_err(|p| {
            p.downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .unwrap_or_default()
        }));
    });
    let ended = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("work_with returned within 20 s");
    assert_eq!(ended, Err("observer says no".to_owned()));
}

/// Found by the history checker (`leasehold-history`, SQLite, kills and
/// pauses): a lease lost and then released left its key marked held by
/// the client, so every later acquire of that key by the same client was
/// refused as "held by nobody (limit reached)" while the key was free.
#[test]
fn a_lost_lease_released_lets_its_client_take_the_key_again() {
    let (store_clock, local, store) = manual_pair();
    let client = Client::builder_shared(store.clone())
        .clock(Arc::new(local.clone()))
        .build();
    let guard = client.try_acquire("k", Duration::from_millis(100)).unwrap();
    // It runs out; someone else takes the key and gives it back.
    store_clock.advance(200);
    local.set(300);
    let other = Client::builder_shared(store).build();
    other
        .try_acquire("k", Duration::from_secs(10))
        .unwrap()
        .release()
        .unwrap();
    assert!(matches!(guard.renew(), Err(Error::Lost { .. })));
    assert!(matches!(guard.release(), Err(Error::Lost { .. })));
    let again = client.try_acquire("k", Duration::from_secs(10));
    assert!(again.is_ok(), "{:?}", again.err());
    // The same through a wait.
    again.unwrap().release().unwrap();
    let waited = client.acquire(
        "k",
        LeaseOptions::new(Duration::from_secs(10)).wait(Duration::from_millis(50)),
    );
    assert!(waited.is_ok(), "{:?}", waited.err());
}

/// A worker held back by a queue's rate sleeps until the next allowance
/// and starts the job then (F4), not at its idle poll: three jobs at one
/// per 300 ms start about 300 ms apart under a one-minute poll.
#[test]
fn a_rate_limited_worker_wakes_at_the_next_allowance_not_its_poll() {
    let client = Client::new(MemStore::new());
    let q = client.queue("q").unwrap();
    let rate = leasehold::Rate::new(1, 300);
    assert!(q
        .set_limits(leasehold::Limits::none().with_rate(Some(rate)))
        .unwrap());
    for i in 0..3u8 {
        q.push(&JobSpec::new(vec![i])).unwrap();
    }
    let stop = AtomicBool::new(false);
    let opts = WorkOptions {
        concurrency: 3,
        drain: true,
        idle_poll: Duration::from_secs(60),
        ..WorkOptions::default()
    };
    let begun = Instant::now();
    let starts = std::sync::Mutex::new(Vec::new());
    let report = q
        .work(&opts, &stop, |_| {
            starts.lock().unwrap().push(begun.elapsed());
            Ok(())
        })
        .unwrap();
    assert_eq!(report.completed, 3);
    let starts = starts.into_inner().unwrap();
    for pair in starts.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= Duration::from_millis(290), "too soon: {starts:?}");
    }
    assert!(
        begun.elapsed() < Duration::from_secs(10),
        "woke by its poll, not the allowance: {starts:?}"
    );
}

/// A worker loop's handler reports progress: it is written by the loop's
/// renewal round while the job runs (none without a round), the last
/// report rides on the settle, and it stays with the job once done.
#[test]
fn a_handlers_progress_rides_on_the_renewal_round_and_the_settle() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let client = Client::new(store);
    let q = client.queue("q").unwrap();
    for (heartbeat_ms, seen_while_running) in [(50, true), (60_000, false)] {
        let id = q.push(&JobSpec::new("x")).unwrap().id;
        let stop = AtomicBool::new(false);
        let opts = WorkOptions {
            drain: true,
            lease: Duration::from_secs(30),
            heartbeat: Some(Duration::from_millis(heartbeat_ms)),
            ..WorkOptions::default()
        };
        let seen = std::sync::Mutex::new(None);
        let report = q
            .work(&opts, &stop, |job| {
                job.progress(0.25, "a quarter").unwrap();
                std::thread::sleep(Duration::from_millis(400));
                *seen.lock().unwrap() = q.get(job.id()).unwrap().progress;
                assert!(job.progress(1.5, "too far").is_err(), "checked by name");
                job.progress(1.0, "all tiles").unwrap();
                Ok(())
            })
            .unwrap();
        assert_eq!(report.completed, 1);
        let seen = seen.into_inner().unwrap();
        assert_eq!(
            seen.is_some(),
            seen_while_running,
            "heartbeat {heartbeat_ms} ms: seen while running: {seen:?}"
        );
        if let Some(p) = seen {
            assert_eq!((p.permyriad, &*p.message), (2_500, "a quarter"));
        }
        let job = q.get(id).unwrap();
        let kept = job.progress.expect("kept with the job");
        assert_eq!(
            (job.state, kept.to_string()),
            (JobState::Done, "100% all tiles".into())
        );
    }
}

/// By hand: a report waits for the claim's next transaction (a heartbeat,
/// the settle), and a lost claim's report is refused.
#[test]
fn a_hand_claimed_jobs_progress_goes_with_its_heartbeat_and_is_fenced() {
    let (store_clock, local, store) = manual_pair();
    let client = Client::builder_shared(store)
        .clock(Arc::new(local.clone()))
        .build();
    let q = client.queue("q").unwrap();
    let id = q.push(&JobSpec::new("x")).unwrap().id;
    let job = q.claim(Duration::from_secs(10)).unwrap().unwrap();
    job.progress(0.5, "half").unwrap();
    assert_eq!(
        q.get(id).unwrap().progress,
        None,
        "no transaction of its own"
    );
    job.heartbeat().unwrap();
    assert_eq!(q.get(id).unwrap().progress.unwrap().to_string(), "50% half");
    job.progress(0.75, "three quarters").unwrap();
    job.complete().unwrap();
    assert_eq!(
        q.get(id).unwrap().progress.unwrap().to_string(),
        "75% three quarters",
        "the settle carried it"
    );
    // A claim whose lease ran out: its report is refused here.
    let id = q.push(&JobSpec::new("y")).unwrap().id;
    let job = q.claim(Duration::from_secs(10)).unwrap().unwrap();
    store_clock.advance(20_000);
    local.advance(20_000);
    assert!(matches!(job.progress(0.1, "late"), Err(Error::Lost { .. })));
    assert_eq!(q.get(id).unwrap().progress, None);
}

/// A client and its flaky mem store, both on one manual clock.
fn on_a_manual_clock() -> (ManualClock, Arc<Flaky>, Client) {
    let clock = ManualClock::new(1_000_000);
    let flaky = Arc::new(Flaky::new(MemStore::with_clock(Arc::new(clock.clone())), 0));
    let client = Client::builder_shared(flaky.clone())
        .clock(Arc::new(clock.clone()))
        .build();
    (clock, flaky, client)
}

/// A guard lost at its local deadline (TTL minus the drift margin) while
/// the store still counts its grant live: releasing it (by hand or by
/// drop) frees the key in the store at once, so another holder need not
/// wait out the TTL, and this client's next grant is a new one with a
/// larger token (L2), not the lost grant extended under the same token.
fn lost_at_the_local_deadline(release: impl FnOnce(leasehold::LeaseGuard)) -> (u64, Client) {
    let (clock, flaky, client) = on_a_manual_clock();
    let guard = client.try_acquire("k", Duration::from_secs(3)).unwrap();
    let token = guard.token();
    // The store is out of reach past the local deadline (2,970 ms), but
    // not past the store's TTL (3,000): the renewal fails, and the guard
    // is lost at its local deadline.
    clock.advance(2_980);
    flaky.failing(true);
    let renewed = guard.renew();
    assert!(matches!(renewed, Err(Error::Busy { .. })), "{renewed:?}");
    assert_eq!(guard.lost(), Some(LostReason::LocalDeadline));
    // The store is back before the grant runs out there.
    flaky.failing(false);
    release(guard);
    let other = Client::builder_shared(flaky)
        .clock(Arc::new(clock.clone()))
        .holder(Holder::new(HolderId(77)))
        .build();
    let taken = other.try_acquire("k", Duration::from_secs(3));
    let taken = taken.unwrap_or_else(|e| panic!("the lost grant still holds the key: {e}"));
    assert!(taken.token() > token);
    taken.release().unwrap();
    (token, client)
}

#[test]
fn a_guard_lost_at_its_local_deadline_and_released_frees_the_key() {
    let (token, client) = lost_at_the_local_deadline(|guard| {
        let released = guard.release();
        // The caller is still told the lease was lost: the work under it
        // was not protected to the end.
        assert!(flaky::lost_at_the_deadline(&released), "{released:?}");
    });
    let again = client.try_acquire("k", Duration::from_secs(3)).unwrap();
    assert!(!again.renewed());
    assert!(again.token() > token, "reused token {token}");
}

#[test]
fn a_guard_lost_at_its_local_deadline_and_dropped_frees_the_key() {
    lost_at_the_local_deadline(drop);
}

/// A guard whose grant ran out in the store (it could not renew it) does
/// not keep its own client from the key: the client's next acquire gets a
/// new grant, with a larger token, while the old guard still exists; the
/// old guard's end leaves the new one's mark alone. Before, the client
/// refused itself the key (`Held`) until the old guard was dropped.
#[test]
fn a_guard_whose_grant_ran_out_does_not_keep_its_client_from_the_key() {
    let (clock, flaky, client) = on_a_manual_clock();
    let ttl = Duration::from_secs(3);
    let old = client.try_acquire("k", ttl).unwrap();
    // Past the store's TTL with the store out of reach: nothing renewed it.
    clock.advance(3_100);
    flaky.failing(true);
    assert!(old.renew().is_err());
    flaky.failing(false);
    let new = client
        .try_acquire("k", ttl)
        .expect("the ran-out grant kept the key");
    assert!(new.token() > old.token(), "token {}", new.token());
    assert!(!new.renewed());
    drop(old);
    // The new guard's mark outlived the old guard's end.
    let third = client.try_acquire("k", ttl);
    assert!(matches!(third, Err(Error::Held { .. })), "{third:?}");
    assert!(new.is_valid());
    new.release().unwrap();
}

/// A store whose transactions, once armed, each take 200 ms and then fail
/// transiently (a lock timeout on a busy database).
struct SlowBusy {
    inner: MemStore,
    armed: AtomicBool,
    attempts: AtomicUsize,
}

impl Store for SlowBusy {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        if self.armed.load(Ordering::SeqCst) {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(200));
            return Err(Error::transient("testing", "lock timeout (injected)"));
        }
        self.inner.transact(f)
    }
    fn describe(&self) -> String {
        "slow-busy".into()
    }
}

/// The busy timeout counts from the call's start, so a slow first attempt
/// uses it up: a release whose one attempt outlasts the timeout is not
/// tried again.
#[test]
fn the_busy_timeout_counts_from_the_calls_start() {
    let store = Arc::new(SlowBusy {
        inner: MemStore::new(),
        armed: AtomicBool::new(false),
        attempts: AtomicUsize::new(0),
    });
    let client = Client::builder_shared(store.clone())
        .busy_timeout(Duration::from_millis(100))
        .build();
    let guard = client.try_acquire("k", Duration::from_secs(30)).unwrap();
    store.armed.store(true, Ordering::SeqCst);
    match guard.release() {
        Err(Error::Busy { waited_ms, .. }) => {
            assert!(waited_ms >= 100, "waited {waited_ms} ms")
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    assert_eq!(store.attempts.load(Ordering::SeqCst), 1, "tried again");
}

/// A guard lost at its local deadline because the store is out of reach
/// is released in one attempt: its release (or drop) does not wait out
/// the busy timeout.
#[test]
fn a_lost_guards_release_tries_the_store_once() {
    let clock = ManualClock::new(1_000_000);
    let flaky = Arc::new(Flaky::new(MemStore::with_clock(Arc::new(clock.clone())), 0));
    let client = Client::builder_shared(flaky.clone())
        .clock(Arc::new(clock.clone()))
        .busy_timeout(Duration::from_secs(30))
        .build();
    let guard = client.try_acquire("k", Duration::from_secs(3)).unwrap();
    clock.advance(2_980);
    flaky.failing(true);
    assert!(guard.renew().is_err());
    assert_eq!(guard.lost(), Some(LostReason::LocalDeadline));
    let before = flaky.failures_left.load(Ordering::SeqCst);
    // On a thread: a release that retried on this clock (which stands
    // still) would never return.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(guard.release()));
    let released = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the release returned within 5 s");
    assert!(matches!(released, Err(Error::Lost { .. })), "{released:?}");
    let tries = before - flaky.failures_left.load(Ordering::SeqCst);
    assert_eq!(tries, 1, "the store was tried {tries} times");
}

/// A store call that panics (a bug in a store) ends the worker loop, and
/// the panic reaches `work`'s caller. Before, the loop waited forever for
/// the settle's answer.
#[test]
fn a_store_call_that_panics_ends_the_work_loop() {
    let store = Arc::new(Panicky::new(MemStore::new()));
    let q = Client::builder_shared(store.clone())
        .build()
        .queue("q")
        .unwrap();
    q.push(&JobSpec::new("x")).unwrap();
    let ended = ends_within(Duration::from_secs(10), move || {
        let opts = WorkOptions {
            concurrency: 2,
            ..WorkOptions::default()
        };
        // Never stopped: only the panic can end it. The handler arms the
        // store, so the settle of its outcome panics.
        q.work(&opts, &AtomicBool::new(false), |_| {
            store.arm();
            Ok(())
        })
    });
    match ended {
        Some(Err(message)) => assert!(message.contains("the store panicked"), "{message}"),
        other => panic!("work should resume the store's panic, got {other:?}"),
    }
}

/// A store that releases one grant (by holder and token, behind the
/// client's back) just before its `at`-th transaction: a guard of the same
/// client whose release commits between an acquire that extended its slot
/// and that acquire's guard.
struct ReleaseBefore {
    inner: MemStore,
    calls: AtomicUsize,
    at: AtomicUsize,
    grant: std::sync::Mutex<Option<(HolderId, u64)>>,
}

impl Store for ReleaseBefore {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.at.load(Ordering::SeqCst) {
            if let Some((id, token)) = self.grant.lock().unwrap().take() {
                self.inner
                    .transact(&mut |tx| leasehold::core::lease::release(tx, "k", id, token))
                    .unwrap();
            }
        }
        self.inner.transact(f)
    }
    fn describe(&self) -> String {
        "release-before".into()
    }
}

/// An acquire that extended a slot of its own holder, whose guard's
/// release then committed: the slot is gone, so the grant is no guard's.
/// Before, it became a guard of nothing (token 1, `renewed`) while the
/// next acquire made a new grant: two guards of one client at once
/// (tests/tokio `tasks_of_one_client_take_turns` on PostgreSQL, a quarter
/// of runs). Now the acquire marks the key, finds the slot gone and
/// acquires again: a new grant.
#[test]
fn an_acquire_whose_extended_slot_was_released_meanwhile_gets_a_new_grant() {
    let store = Arc::new(ReleaseBefore {
        inner: MemStore::new(),
        calls: AtomicUsize::new(0),
        at: AtomicUsize::new(usize::MAX),
        grant: std::sync::Mutex::new(None),
    });
    let holder = Holder::new(HolderId(7));
    let c = Client::builder_shared(store.clone())
        .holder(holder.clone())
        .build();
    // Token 1, live in the store, no longer this client's guard's.
    let (_, token) = c
        .try_acquire("k", Duration::from_secs(30))
        .unwrap()
        .detach();
    assert_eq!(token, 1);
    // The next acquire extends it; the store releases it right after.
    *store.grant.lock().unwrap() = Some((HolderId(7), 1));
    let next = store.calls.load(Ordering::SeqCst) + 2;
    store.at.store(next, Ordering::SeqCst);
    let guard = c.try_acquire("k", Duration::from_secs(30)).unwrap();
    assert_eq!(guard.token(), 2, "a guard of a released slot");
    assert!(!guard.renewed());
    let info = c.inspect("k").unwrap();
    let tokens: Vec<u64> = info.holders.iter().map(|h| h.token).collect();
    assert_eq!(tokens, [2]);
    guard.release().unwrap();
}

/// A store whose `at`-th transaction panics.
struct PanicAt {
    inner: MemStore,
    calls: AtomicUsize,
    at: AtomicUsize,
}

impl Store for PanicAt {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        assert_ne!(n, self.at.load(Ordering::SeqCst), "the store panicked");
        self.inner.transact(f)
    }
    fn describe(&self) -> String {
        "panic-at".into()
    }
}

/// An acquire that extended a slot of its own holder marks the key before
/// it looks whether the slot is still live. A panic in that look took the
/// mark with it: every later acquire of the key through the client was
/// refused (`Held`, by the client itself) for the client's life.
#[test]
fn a_store_panic_while_an_extended_grant_is_checked_leaves_the_key_free() {
    let store = Arc::new(PanicAt {
        inner: MemStore::new(),
        calls: AtomicUsize::new(0),
        at: AtomicUsize::new(usize::MAX),
    });
    let c = Client::builder_shared(store.clone())
        .holder(Holder::new(HolderId(7)))
        .build();
    // Live in the store, no guard's.
    let (_, token) = c
        .try_acquire("k", Duration::from_secs(30))
        .unwrap()
        .detach();
    // The next acquire extends it; its look at the slot panics.
    let next = store.calls.load(Ordering::SeqCst) + 2;
    store.at.store(next, Ordering::SeqCst);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.try_acquire("k", Duration::from_secs(30))
    }));
    assert!(panicked.is_err(), "{panicked:?}");
    assert_eq!(store.calls.load(Ordering::SeqCst), next);
    let guard = c.try_acquire("k", Duration::from_secs(30)).unwrap();
    assert_eq!(guard.token(), token, "the live grant, extended");
    guard.release().unwrap();
    assert!(c.inspect("k").unwrap().holders.is_empty());
}

/// A loop ended by a store call's panic tells the handlers still running
/// to stop: their handles turn invalid at once, not at their claims' local
/// deadlines (the loop renews nothing any more).
#[test]
fn a_loop_ended_by_a_store_panic_tells_its_running_handlers_to_stop() {
    let store = Arc::new(Panicky::new(MemStore::new()));
    let q = Client::builder_shared(store.clone())
        .build()
        .queue("q")
        .unwrap();
    q.push(&JobSpec::new("quick")).unwrap();
    q.push(&JobSpec::new("slow")).unwrap();
    let slow_started = AtomicBool::new(false);
    let told = Arc::new(AtomicBool::new(false));
    let saw = told.clone();
    let ended = ends_within(Duration::from_secs(10), move || {
        let opts = WorkOptions {
            concurrency: 2,
            lease: Duration::from_secs(60),
            ..WorkOptions::default()
        };
        q.work(&opts, &AtomicBool::new(false), |job| {
            if job.payload() == b"slow" {
                slow_started.store(true, Ordering::SeqCst);
                let since = Instant::now();
                while job.is_valid() && since.elapsed() < Duration::from_secs(60) {
                    std::thread::sleep(Duration::from_millis(2));
                }
                saw.store(!job.is_valid(), Ordering::SeqCst);
            } else {
                while !slow_started.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                // The settle of this outcome panics.
                store.arm();
            }
            Ok(())
        })
    });
    match ended {
        Some(Err(message)) => assert!(message.contains("the store panicked"), "{message}"),
        None => panic!("the running handler was never told to stop"),
        other => panic!("work should resume the store's panic, got {other:?}"),
    }
    assert!(told.load(Ordering::SeqCst));
}

/// Once a store call's panic has ended the loop, the requests queued
/// behind it (here a settle or an idle poll's claim, queued while the
/// loop's one store thread is held in the call) are not sent: a claim sent
/// then would take jobs nobody runs (held until their claims ran out, an
/// attempt counted).
#[test]
fn a_loop_ended_by_a_store_panic_claims_nothing_more() {
    let store = Arc::new(Panicky::new(MemStore::new()));
    let client = Client::builder_shared(store.clone()).build();
    let q = client.queue("q").unwrap();
    q.push(&JobSpec::new("first")).unwrap();
    let worker = q.clone();
    let armer = store.clone();
    let ended = std::thread::spawn(move || {
        ends_within(Duration::from_secs(20), move || {
            let opts = WorkOptions {
                concurrency: 1,
                idle_poll: Duration::from_millis(20),
                ..WorkOptions::default()
            };
            worker.work(&opts, &AtomicBool::new(false), |_| {
                // The loop's next store call (on its one store thread)
                // waits at the gate, then panics.
                armer.arm_once_gated();
                Ok(())
            })
        })
    });
    store.wait_at_gate();
    // A job to claim, while the loop's store thread is held at the gate:
    // the loop's idle polls queue claims behind the held call.
    let second = q.push(&JobSpec::new("second")).unwrap().id;
    std::thread::sleep(Duration::from_millis(300));
    store.open_gate();
    match ended.join().unwrap() {
        Some(Err(message)) => assert!(message.contains("the store panicked"), "{message}"),
        other => panic!("work should resume the store's panic, got {other:?}"),
    }
    // (Read before this test's own reads, which count too.)
    let sent_after = store.after_panic.load(Ordering::SeqCst);
    assert_eq!(sent_after, 0, "store calls made after the loop ended");
    let state = q.get(second).unwrap().state;
    assert_eq!(state, JobState::Ready, "claimed after the loop ended");
}
