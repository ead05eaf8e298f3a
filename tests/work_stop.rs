//! What stops a sync worker loop: a plain `AtomicBool`, looked at every
//! 200 ms while the loop is idle, or a `StopSignal` (any `Stop` that can
//! wake it), which the idle loop sleeps on instead.

#![allow(clippy::disallowed_methods)] // tests use real threads and time

use leasehold::{Client, JobSpec, JobState, MemStore, Stop, StopSignal, WorkOptions};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

/// A stop signal that counts the loop's looks at it, and that can
/// pretend it wakes nobody (as a plain flag does).
struct Counted {
    signal: StopSignal,
    looks: AtomicUsize,
    wakes: bool,
}

impl Stop for Counted {
    fn is_set(&self) -> bool {
        self.looks.fetch_add(1, Ordering::SeqCst);
        self.signal.is_set()
    }
    fn watch(&self, waker: &Waker) -> bool {
        self.wakes && self.signal.watch(waker)
    }
    fn unwatch(&self, waker: &Waker) {
        self.signal.unwatch(waker);
    }
}

fn idle_opts() -> WorkOptions {
    WorkOptions {
        // Empty claims back off toward this: by the window below, seconds
        // apart.
        idle_poll: Duration::from_secs(30),
        ..WorkOptions::default()
    }
}

/// An idle loop on a stop that wakes it looks at the flag only when it
/// steps for its own work; on one that cannot, it looks every 200 ms. Set,
/// either stops the loop; the waking one at once.
#[test]
fn an_idle_loop_sleeps_on_a_stop_that_wakes_it_and_looks_at_one_that_cannot() {
    let client = Client::new(MemStore::new());
    let q = client.queue("idle").unwrap();
    let mut seen = Vec::new();
    for wakes in [true, false] {
        let stop = Counted {
            signal: StopSignal::new(),
            looks: AtomicUsize::new(0),
            wakes,
        };
        let (looks, stopped_in) = std::thread::scope(|s| {
            let worker = s.spawn(|| q.work(&idle_opts(), &stop, |_| Ok(())));
            std::thread::sleep(Duration::from_secs(2));
            let before = stop.looks.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(2));
            let looks = stop.looks.load(Ordering::SeqCst) - before;
            let set_at = Instant::now();
            stop.signal.set();
            let report = worker.join().unwrap().unwrap();
            assert_eq!(report.completed, 0);
            (looks, set_at.elapsed())
        });
        seen.push((wakes, looks, stopped_in));
        if wakes {
            // Its idle claims, seconds apart by now: three steps each (3
            // measured; a loaded machine may fit a second claim in).
            assert!(looks <= 7, "looked at a waking stop: {seen:?}");
            assert!(
                stopped_in < Duration::from_millis(500),
                "the set did not wake the loop: {seen:?}"
            );
        } else {
            // Ten looks in two seconds, besides the claims' steps (12
            // measured).
            assert!(looks >= 8, "a plain flag must be looked at: {seen:?}");
            assert!(stopped_in < Duration::from_secs(2), "{seen:?}");
        }
        assert_eq!(
            format!("{:?}", stop.signal),
            "StopSignal { set: true, watchers: 0 }"
        );
    }
}

/// Wait (up to 10 s) until `n` loops watch `stop`.
fn wait_for_watchers(stop: &StopSignal, n: usize) {
    let want = format!("StopSignal {{ set: false, watchers: {n} }}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while format!("{stop:?}") != want {
        assert!(Instant::now() < deadline, "{stop:?}, want {n} watchers");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One signal stops every loop given it, a signal set before the loop
/// starts stops it before it claims anything, and a loop that ended takes
/// its waker off the signal.
#[test]
fn one_signal_stops_every_loop_and_an_ended_loop_leaves_no_waker() {
    let client = Client::new(MemStore::new());
    let q = client.queue("many").unwrap();
    let stop = StopSignal::new();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..3)
            .map(|_| s.spawn(|| q.work(&idle_opts(), &stop, |_| Ok(()))))
            .collect();
        wait_for_watchers(&stop, 3);
        let set_at = Instant::now();
        stop.set();
        for w in workers {
            w.join().unwrap().unwrap();
        }
        assert!(set_at.elapsed() < Duration::from_millis(500));
    });
    assert_eq!(format!("{stop:?}"), "StopSignal { set: true, watchers: 0 }");

    // Set before the loop starts: nothing claimed.
    q.push(&JobSpec::new("x")).unwrap();
    let ran = AtomicUsize::new(0);
    let report = q
        .work(&idle_opts(), &stop, |_| {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    assert_eq!((ran.into_inner(), report.completed), (0, 0));
    assert_eq!(q.stats().unwrap().get(JobState::Ready), 1);

    // A loop that ends by itself (a drain) takes its waker off too.
    let stop = StopSignal::new();
    let opts = WorkOptions {
        drain: true,
        ..idle_opts()
    };
    assert_eq!(q.work(&opts, &stop, |_| Ok(())).unwrap().completed, 1);
    assert_eq!(
        format!("{stop:?}"),
        "StopSignal { set: false, watchers: 0 }"
    );
}

/// A loop that ends by itself takes off its own waker and no other: the
/// loop still running on the same signal is woken by it.
#[test]
fn a_loop_that_ends_leaves_the_other_loops_waker() {
    let client = Client::new(MemStore::new());
    let stop = StopSignal::new();
    let (idle, drained) = (client.queue("idle").unwrap(), client.queue("d").unwrap());
    drained.push(&JobSpec::new("x")).unwrap();
    let gate = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let stays = s.spawn(|| idle.work(&idle_opts(), &stop, |_| Ok(())));
        let ends = s.spawn(|| {
            let opts = WorkOptions {
                drain: true,
                ..idle_opts()
            };
            drained.work(&opts, &stop, |_| {
                // Both loops watch by now.
                gate.wait();
                Ok(())
            })
        });
        wait_for_watchers(&stop, 2);
        gate.wait();
        assert_eq!(ends.join().unwrap().unwrap().completed, 1);
        assert_eq!(
            format!("{stop:?}"),
            "StopSignal { set: false, watchers: 1 }"
        );
        // Seconds from its next claim by now: only the signal stops it.
        std::thread::sleep(Duration::from_secs(2));
        let set_at = Instant::now();
        stop.set();
        stays.join().unwrap().unwrap();
        assert!(
            set_at.elapsed() < Duration::from_millis(500),
            "not woken: {:?}",
            set_at.elapsed()
        );
    });
}

/// `observe` runs inside the loop's step, under its lock: a signal set
/// there (stop after the first outcome) stops the loop, it does not hang
/// it taking that lock again.
#[test]
fn a_signal_set_from_observe_stops_the_loop() {
    let client = Client::new(MemStore::new());
    let q = client.queue("obs").unwrap();
    for i in 0..50u8 {
        q.push(&JobSpec::new(vec![i])).unwrap();
    }
    let stop = std::sync::Arc::new(StopSignal::new());
    let (tx, rx) = std::sync::mpsc::channel();
    // Detached: a hung loop fails the test instead of hanging it.
    let signal = stop.clone();
    std::thread::spawn(move || {
        let report = q.work_with(&idle_opts(), &signal, |_| Ok(()), |_, _| signal.set());
        tx.send(report).unwrap();
    });
    let report = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the loop hung after observe set its stop")
        .unwrap();
    assert!(report.completed >= 1 && report.completed < 50, "{report:?}");
    assert!(stop.is_set());
}
