//! An idle worker loop sleeps until something it can act on happens, and
//! acts on it at once: it waits for the store's announcements (SQLite's
//! doorbell here, shared by every handle and process) and for the
//! queue's next change by time, not for a poll. Its backstop
//! (`WorkOptions::idle_poll`, 30 s by default) is far longer than any
//! wait below, so each would fail if the loop only found out by polling.

#![allow(clippy::disallowed_methods)] // real threads and time

use leasehold::core::schedule::{Missed, Rule, ScheduleSpec};
use leasehold::{
    core::Txn, Client, FirstRead, JobSpec, SqliteStore, StopSignal, Store, Wake, WorkOptions,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "support/dir.rs"]
mod dir;
use dir::Dir;

/// Far below the 15-30 s an unannounced change would wait for the
/// backstop claim, far above a loaded machine's scheduling delays.
const PROMPT: Duration = Duration::from_secs(4);

/// A SQLite handle that counts its transactions.
struct Counting {
    inner: SqliteStore,
    txns: AtomicUsize,
}

impl Store for Counting {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        self.txns.fetch_add(1, Ordering::SeqCst);
        self.inner.transact(f)
    }
    fn transact_reading(
        &self,
        first: FirstRead<'_>,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        self.txns.fetch_add(1, Ordering::SeqCst);
        self.inner.transact_reading(first, f)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn epoch(&self, wake: Wake) -> u64 {
        self.inner.epoch(wake)
    }
    fn wait_epoch(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        self.inner.wait_epoch(wake, epoch, timeout)
    }
    fn announces_changes(&self) -> bool {
        self.inner.announces_changes()
    }
    fn interrupt_waits(&self, wake: Wake) {
        self.inner.interrupt_waits(wake)
    }
}

/// A worker loop on its own handle of `dir`'s database, run by `test`
/// with a handle of its own (another process, as far as the doorbell
/// goes); the loop's handler records when each job started and what it
/// carried; the loop's store counts its transactions.
fn with_idle_worker(
    dir: &Dir,
    opts: WorkOptions,
    test: impl FnOnce(&Client, &Counting, &Mutex<Vec<(Instant, Vec<u8>)>>),
) {
    let store = Arc::new(Counting {
        inner: SqliteStore::open(dir.db()).unwrap(),
        txns: AtomicUsize::new(0),
    });
    let worker = Client::builder_shared(store.clone()).build();
    let elsewhere = Client::new(SqliteStore::open(dir.db()).unwrap());
    let started = Mutex::new(Vec::new());
    let stop = StopSignal::new();
    let q = worker.queue("q").unwrap();
    std::thread::scope(|s| {
        let looping = s.spawn(|| {
            q.work(&opts, &stop, |job| {
                let mut started = started.lock().unwrap();
                started.push((Instant::now(), job.payload().to_vec()));
                Ok(())
            })
        });
        // The loop stops however the test ends (a failed assertion
        // included: the scope waits for the loop).
        struct SetOnDrop<'a>(&'a StopSignal);
        impl Drop for SetOnDrop<'_> {
            fn drop(&mut self) {
                self.0.set();
            }
        }
        let stopping = SetOnDrop(&stop);
        // Idle by now: its empty claims found nothing.
        std::thread::sleep(Duration::from_millis(500));
        test(&elsewhere, &store, &started);
        drop(stopping);
        looping.join().unwrap().unwrap();
    });
}

fn started_with(started: &Mutex<Vec<(Instant, Vec<u8>)>>, payload: &[u8]) -> Option<Instant> {
    let started = started.lock().unwrap();
    started
        .iter()
        .find(|(_, p)| p == payload)
        .map(|(at, _)| *at)
}

/// Wait up to `PROMPT` for a job with `payload` to start.
fn wait_start(started: &Mutex<Vec<(Instant, Vec<u8>)>>, payload: &[u8]) -> Option<Instant> {
    let deadline = Instant::now() + PROMPT;
    while Instant::now() < deadline {
        if let Some(at) = started_with(started, payload) {
            return Some(at);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

#[test]
fn an_idle_loop_starts_a_delayed_job_pushed_elsewhere_when_it_falls_due() {
    let dir = Dir::new("idle-delayed");
    with_idle_worker(&dir, WorkOptions::default(), |elsewhere, _, started| {
        let pushed = Instant::now();
        let delayed = JobSpec {
            delay_ms: 300,
            ..JobSpec::new("later")
        };
        elsewhere.queue("q").unwrap().push(&delayed).unwrap();
        let at = wait_start(started, b"later").expect("the delayed job never started");
        let after = at - pushed;
        assert!(after >= Duration::from_millis(300), "early: {after:?}");
    });
}

#[test]
fn an_idle_loop_runs_a_dead_workers_job_when_its_claim_runs_out() {
    let dir = Dir::new("idle-dead");
    // The dead worker claimed before this loop started, so the loop's
    // first empty claim learns when the claim runs out; a claim taken
    // after the loop last looked is seen by its next look (SQLite runs
    // them one at a time; on PostgreSQL a look that passed over a claim
    // in flight looks again soon: `postgres.rs`).
    let elsewhere = Client::new(SqliteStore::open(dir.db()).unwrap());
    let q = elsewhere.queue("q").unwrap();
    q.push(&JobSpec::new("orphan")).unwrap();
    // (Before the claim: its lease counts from the store's clock read in
    // the claim's transaction.)
    let claimed = Instant::now();
    let claim = q.claim(Duration::from_millis(1_500)).unwrap().unwrap();
    // It dies: never renewed, never settled.
    std::mem::forget(claim);
    with_idle_worker(&dir, WorkOptions::default(), |_, _, started| {
        let at = wait_start(started, b"orphan").expect("the orphan never ran again");
        assert!(at - claimed >= Duration::from_millis(1_500));
    });
}

#[test]
fn an_idle_loop_fires_a_schedule_put_elsewhere_at_its_first_tick() {
    let dir = Dir::new("idle-schedule");
    with_idle_worker(&dir, WorkOptions::default(), |elsewhere, _, started| {
        let spec = ScheduleSpec {
            name: "every-second".into(),
            rule: Rule::every(1_000),
            job: JobSpec::new("tick"),
            missed: Missed::Skip,
        };
        elsewhere.queue("q").unwrap().schedule(&spec).unwrap();
        // The first tick comes within a second; the loop's own look at
        // its schedules, without the announcement, within 30.
        wait_start(started, b"tick").expect("the schedule never fired");
    });
}

/// While nothing happens an idle loop makes almost no transactions: no
/// claims every second, no looks at its schedules every five (over 6 s:
/// before, 7-13 claims and a look; now at most its second look at the
/// schedules, 5 s after the first, and its backstop claim). A push then
/// starts at once.
#[test]
fn an_idle_loop_makes_almost_no_transactions_while_nothing_happens() {
    let dir = Dir::new("idle-quiet");
    with_idle_worker(&dir, WorkOptions::default(), |elsewhere, store, started| {
        // Its first claim and first look at the schedules are made.
        let begun = Instant::now();
        while store.txns.load(Ordering::SeqCst) < 2 && begun.elapsed() < PROMPT {
            std::thread::sleep(Duration::from_millis(10));
        }
        let before = store.txns.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(6));
        let made = store.txns.load(Ordering::SeqCst) - before;
        assert!(made <= 2, "{made} transactions in 6 s of nothing");
        let pushed = Instant::now();
        elsewhere
            .queue("q")
            .unwrap()
            .push(&JobSpec::new("now"))
            .unwrap();
        let at = wait_start(started, b"now").expect("the push never started");
        assert!(at - pushed < PROMPT);
    });
}
