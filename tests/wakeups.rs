//! Wake-ups reach every process of the machine on the stores that have no
//! server (SQLite, the file store): a release or a push committed through
//! another handle, or by another process, wakes a waiter at once
//! (`Store::wait_epoch` returns true) instead of leaving it to poll until
//! its timeout. The doorbell behind it is `src/store/doorbell.rs`.

#![allow(clippy::disallowed_methods)] // real processes and threads

use leasehold::{Client, FileStore, JobSpec, SqliteStore, Store, Wake};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "support/dir.rs"]
mod dir;
use dir::Dir;

/// Long enough that a waiter that was not woken fails the test clearly.
const PATIENCE: Duration = Duration::from_secs(10);

fn open(url: &str) -> Arc<dyn Store> {
    if let Some(path) = url.strip_prefix("sqlite:") {
        Arc::new(SqliteStore::open(path).unwrap())
    } else if let Some(dir) = url.strip_prefix("file:") {
        Arc::new(FileStore::open(dir).unwrap())
    } else {
        panic!("no such store: {url}")
    }
}

/// What a committer does to raise `wake`: release a lease, push a job.
fn commit(store: Arc<dyn Store>, wake: Wake) {
    let client = Client::builder_shared(store).build();
    match wake {
        Wake::LeaseFreed => {
            let guard = client.try_acquire("k", Duration::from_secs(30)).unwrap();
            guard.release().unwrap();
        }
        Wake::JobReady => {
            client.queue("q").unwrap().push(&JobSpec::new("x")).unwrap();
        }
    }
}

fn wake_name(wake: Wake) -> &'static str {
    match wake {
        Wake::LeaseFreed => "lease",
        Wake::JobReady => "job",
    }
}

/// Wait on `waiter` for `wake` while `act` commits elsewhere; the wait
/// must end woken, well before its patience runs out.
fn woken_by(waiter: &dyn Store, wake: Wake, act: impl FnOnce() + Send) {
    let epoch = waiter.epoch(wake);
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(act);
        assert!(
            waiter.wait_epoch(wake, epoch, PATIENCE),
            "not woken by the commit elsewhere ({:?} later)",
            started.elapsed()
        );
    });
}

#[test]
fn a_commit_through_another_handle_wakes_a_waiter() {
    let dir = Dir::new("handle");
    let sqlite = format!("sqlite:{}", dir.0.join("q.db").display());
    let file = format!("file:{}", dir.0.join("leases").display());
    for (url, wakes) in [
        (&sqlite, &[Wake::LeaseFreed, Wake::JobReady][..]),
        (&file, &[Wake::LeaseFreed][..]),
    ] {
        let waiter = open(url);
        let other = open(url);
        for &wake in wakes {
            let other = other.clone();
            woken_by(&*waiter, wake, move || commit(other, wake));
        }
    }
    assert!(
        dir.0.join("q.db-wake").exists(),
        "the doorbell beside the database"
    );
    assert!(
        dir.0.join("leases/wake").exists(),
        "the doorbell in the directory"
    );
}

#[test]
fn a_commit_by_another_process_wakes_a_waiter() {
    let dir = Dir::new("process");
    let sqlite = format!("sqlite:{}", dir.0.join("q.db").display());
    let file = format!("file:{}", dir.0.join("leases").display());
    for (url, wakes) in [
        (&sqlite, &[Wake::LeaseFreed, Wake::JobReady][..]),
        (&file, &[Wake::LeaseFreed][..]),
    ] {
        let waiter = open(url);
        for &wake in wakes {
            woken_by(&*waiter, wake, || {
                let status = Command::new(std::env::current_exe().unwrap())
                    .args(["--ignored", "--exact", "child_commits", "--nocapture"])
                    .env("LEASEHOLD_WAKE_CHILD", format!("{}|{url}", wake_name(wake)))
                    .status()
                    .unwrap();
                assert!(status.success(), "the child: {status}");
            });
        }
    }
}

/// Not a test of its own: the other process of the test above, which
/// runs it with `LEASEHOLD_WAKE_CHILD=WAKE|URL`.
#[test]
#[ignore]
fn child_commits() {
    let Ok(spec) = std::env::var("LEASEHOLD_WAKE_CHILD") else {
        return;
    };
    let (wake, url) = spec.split_once('|').unwrap();
    let wake = if wake == "lease" {
        Wake::LeaseFreed
    } else {
        Wake::JobReady
    };
    commit(open(url), wake);
}

#[test]
fn without_a_doorbell_a_store_still_wakes_its_own_waiters() {
    let dir = Dir::new("nobell");
    let db = dir.0.join("q.db");
    // Something that cannot be a doorbell where the doorbell goes.
    std::fs::create_dir(dir.0.join("q.db-wake")).unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).unwrap());
    let committer = store.clone();
    woken_by(&*store, Wake::JobReady, move || {
        commit(committer, Wake::JobReady)
    });
    // The next handle finds it the same way, opens and works.
    let other: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).unwrap());
    commit(other, Wake::LeaseFreed);
}

#[test]
fn an_unrelated_wake_does_not_end_a_wait() {
    let dir = Dir::new("unrelated");
    let url = format!("sqlite:{}", dir.0.join("q.db").display());
    let waiter = open(&url);
    let epoch = waiter.epoch(Wake::LeaseFreed);
    commit(open(&url), Wake::JobReady);
    assert_eq!(
        waiter.epoch(Wake::LeaseFreed),
        epoch,
        "a push frees no lease"
    );
    assert!(!waiter.wait_epoch(Wake::LeaseFreed, epoch, Duration::from_millis(50)));
    assert_ne!(
        waiter.epoch(Wake::JobReady),
        0,
        "the push rang its own bell"
    );
}

/// Every change that lets an idle worker start a job sooner than it last
/// read moves the `JobReady` epoch (so a worker can wait for it instead of
/// polling): a delayed push, a retry scheduled, a schedule put, a job
/// parked until a rate allows it. What changes nothing for an idle worker
/// moves nothing: an empty claim, a claim (on SQLite), a renewal, a
/// completion (no waiting jobs), so a worker's own claims wake nobody.
#[test]
fn every_change_an_idle_worker_waits_for_is_announced() {
    use leasehold::core::schedule::{Missed, Rule, ScheduleSpec};
    use leasehold::{Limits, Rate};
    let dir = Dir::new("announced");
    let url = format!("sqlite:{}", dir.0.join("q.db").display());
    let waiter = open(&url);
    assert!(waiter.announces_changes(), "a shared doorbell");
    let client = Client::builder_shared(open(&url)).build();
    let queue = client.queue("q").unwrap();
    let lease = Duration::from_secs(30);
    let rings = |what: &str, act: &dyn Fn()| {
        let epoch = waiter.epoch(Wake::JobReady);
        act();
        assert_ne!(waiter.epoch(Wake::JobReady), epoch, "{what}: not announced");
    };
    let silent = |what: &str, act: &dyn Fn()| {
        let epoch = waiter.epoch(Wake::JobReady);
        act();
        assert_eq!(waiter.epoch(Wake::JobReady), epoch, "{what}: announced");
    };
    let delayed = JobSpec {
        delay_ms: 60_000,
        ..JobSpec::new("later")
    };
    rings("a delayed push", &|| {
        queue.push(&delayed).unwrap();
    });
    silent("an empty claim", &|| {
        assert!(queue.claim(lease).unwrap().is_none());
    });
    let retried = JobSpec {
        max_attempts: 3,
        ..JobSpec::new("retried")
    };
    queue.push(&retried).unwrap();
    // A claim: an empty claim after it sees it (SQLite runs one at a
    // time), so it wakes nobody (on PostgreSQL, where claims overlap, an
    // empty claim that passed over it looks again soon instead).
    let job = std::cell::RefCell::new(None);
    silent("a claim", &|| {
        *job.borrow_mut() = queue.claim(lease).unwrap();
    });
    let job = job.into_inner().expect("the ready job");
    silent("a renewal", &|| {
        assert!(!job.heartbeat().unwrap(), "no cancel asked");
    });
    rings("a retry scheduled after its backoff", &|| {
        assert_eq!(job.fail("flaky").unwrap(), leasehold::JobState::Scheduled);
    });
    let spec = ScheduleSpec {
        name: "hourly".into(),
        rule: Rule::every(3_600_000),
        job: JobSpec::new("report"),
        missed: Missed::Skip,
    };
    rings("a schedule put", &|| {
        queue.schedule(&spec).unwrap();
    });
    // A per-key rate of one start a minute: the second job of the key is
    // parked by a claim that starts nothing.
    let rated = client.queue("rated").unwrap();
    rated
        .set_limits(Limits::none().with_per_key_rate(Some(Rate::new(1, 60_000))))
        .unwrap();
    let keyed = || JobSpec {
        key: Some("k".into()),
        ..JobSpec::new("keyed")
    };
    rated.push(&keyed()).unwrap();
    let first = rated.claim(lease).unwrap().expect("the first of the key");
    rated.push(&keyed()).unwrap();
    rings("a job parked until its rate allows it", &|| {
        assert!(rated.claim(lease).unwrap().is_none());
    });
    silent("a completion with nothing waiting on it", &|| {
        first.complete().unwrap();
    });
}

/// A waker that is ending is told at once: `interrupt_waits` ends a wait
/// on the store's announcements (returning false: no event), whatever
/// carries them (a shared doorbell, a process-local bell, the mem store).
#[test]
fn interrupt_waits_ends_a_wait_at_once() {
    let dir = Dir::new("interrupt");
    std::fs::create_dir(dir.0.join("local.db-wake")).unwrap();
    let stores: [(&str, Arc<dyn Store>); 3] = [
        (
            "doorbell",
            open(&format!("sqlite:{}", dir.0.join("q.db").display())),
        ),
        (
            "local bell",
            Arc::new(SqliteStore::open(dir.0.join("local.db")).unwrap()),
        ),
        ("mem", Arc::new(leasehold::MemStore::new())),
    ];
    for (name, store) in stores {
        assert_eq!(store.announces_changes(), name != "local bell", "{name}");
        // A wait with no event and no interruption lasts its timeout.
        let epoch = store.epoch(Wake::JobReady);
        let started = Instant::now();
        assert!(!store.wait_epoch(Wake::JobReady, epoch, Duration::from_millis(200)));
        assert!(
            started.elapsed() >= Duration::from_millis(190),
            "{name}: a 200 ms wait returned after {:?}",
            started.elapsed()
        );
        let epoch = store.epoch(Wake::JobReady);
        let started = Instant::now();
        std::thread::scope(|s| {
            let waiting = s.spawn(|| store.wait_epoch(Wake::JobReady, epoch, PATIENCE));
            // Until it woke: an interruption before the wait began is
            // missed by design (the waiter's timeout bounds that race).
            while !waiting.is_finished() && started.elapsed() < PATIENCE {
                store.interrupt_waits(Wake::JobReady);
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(!waiting.join().unwrap(), "{name}: no event came");
        });
        assert!(
            started.elapsed() < PATIENCE / 2,
            "{name}: the wait ran {:?}",
            started.elapsed()
        );
    }
}
