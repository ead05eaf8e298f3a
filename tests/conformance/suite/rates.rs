//! Rate limits on every store (F4): a sliding window of store time per
//! queue and per concurrency key, held across holders, parking a key out
//! of allowance and waking it when its window has room, counting past
//! starts when lowered, and checked like any input.

use super::limits::{ids, keyed, set_limits};
use super::*;
use leasehold::core::{Limits, Rate};

fn next_change(w: &World, queue: &str) -> Option<u64> {
    w.tx(|tx| core::job::next_look(tx, queue).map(|l| l.change_in_ms))
        .unwrap()
}

/// At most N jobs of a queue start in any window of W, whoever claims and
/// however the jobs end; the next start is allowed when the oldest start
/// of the window leaves it (and an idle worker is told when); other
/// queues are untouched.
pub fn queue_rate_holds_per_sliding_window(make: &Make) {
    let w = World::new(make);
    let jobs: Vec<JobId> = (0..7)
        .map(|i| w.push("q", JobSpec::new(format!("j{i}"))))
        .collect();
    let rate = Limits::none().with_rate(Some(Rate::new(2, 1_000)));
    assert!(set_limits(&w, "q", rate));
    assert!(!set_limits(&w, "q", rate), "unchanged");
    let got = w.tx(|tx| core::job::queue_config(tx, "q")).unwrap().limits;
    assert_eq!(got.rate, Some(Rate::new(2, 1_000)), "stored as set");
    assert_eq!(ids(&w.claim("q", 1, 60_000, 1)), jobs[..1]);
    w.at(T0 + 400);
    assert_eq!(ids(&w.claim("q", 2, 60_000, 10)), jobs[1..2], "one left");
    let done = w.list("q", Some(JobState::Running));
    w.complete(&done[0], 1).unwrap();
    assert!(
        w.claim("q", 3, 60_000, 10).is_empty(),
        "an end frees no start"
    );
    assert_eq!(next_change(&w, "q"), Some(600), "when j0 leaves the window");
    let other = w.push("other", JobSpec::new("o"));
    assert_eq!(ids(&w.claim("other", 3, 60_000, 10)), [other]);
    w.at(T0 + 999);
    assert!(
        w.claim("q", 3, 60_000, 10).is_empty(),
        "the window is (t-W, t]"
    );
    w.at(T0 + 1_000);
    assert_eq!(ids(&w.claim("q", 3, 60_000, 10)), jobs[2..3]);
    w.at(T0 + 1_400);
    assert_eq!(ids(&w.claim("q", 4, 60_000, 10)), jobs[3..4]);
    w.at(T0 + 3_000);
    assert_eq!(
        ids(&w.claim("q", 4, 60_000, 10)),
        jobs[4..6],
        "a whole window"
    );
    // Lowered: the starts already made count against the new rate.
    assert!(set_limits(
        &w,
        "q",
        Limits::none().with_rate(Some(Rate::new(1, 2_000)))
    ));
    w.at(T0 + 4_000);
    assert!(w.claim("q", 5, 60_000, 10).is_empty());
    assert_eq!(next_change(&w, "q"), Some(1_000));
    w.at(T0 + 5_000);
    assert_eq!(ids(&w.claim("q", 5, 60_000, 10)), jobs[6..]);
    // Cleared: nothing holds the queue back.
    assert!(set_limits(&w, "q", Limits::none()));
    let more = w.push("q", JobSpec::new("m"));
    assert_eq!(ids(&w.claim("q", 6, 60_000, 10)), [more]);
}

/// Under a per-key rate a key out of allowance is set aside while other
/// keys and unkeyed jobs run; its jobs start, in claim order, as its
/// window has room, even when each claim takes one job at a time.
pub fn queue_per_key_rate_parks_and_wakes_a_key(make: &Make) {
    let w = World::new(make);
    let a: Vec<JobId> = (0..5)
        .map(|i| w.push("q", keyed("a", &format!("a{i}"))))
        .collect();
    let b = w.push("q", keyed("b", "b0"));
    let free = w.push("q", JobSpec::new("u"));
    let rate = Rate::new(2, 1_000);
    assert!(set_limits(
        &w,
        "q",
        Limits::none().with_per_key_rate(Some(rate))
    ));
    assert_eq!(ids(&w.claim("q", 1, 60_000, 1)), [a[0]]);
    assert_eq!(ids(&w.claim("q", 1, 60_000, 10)), [a[1], b, free]);
    assert!(
        w.claim("q", 2, 60_000, 10).is_empty(),
        "a is out of allowance"
    );
    assert_eq!(
        w.stats("q").get(JobState::Ready),
        3,
        "set aside, still ready"
    );
    assert_eq!(next_change(&w, "q"), Some(1_000), "when a may start again");
    w.at(T0 + 1_000);
    assert_eq!(ids(&w.claim("q", 2, 60_000, 1)), [a[2]]);
    assert_eq!(ids(&w.claim("q", 3, 60_000, 1)), [a[3]]);
    assert!(w.claim("q", 3, 60_000, 1).is_empty(), "two per window");
    w.at(T0 + 2_000);
    assert_eq!(ids(&w.claim("q", 3, 60_000, 10)), [a[4]]);
    assert_eq!(w.stats("q").get(JobState::Ready), 0);
    // A key held back by a claim that starts none of its jobs still
    // wakes when its window has room.
    let c: Vec<JobId> = (0..2)
        .map(|i| w.push("q", keyed("c", &format!("c{i}"))))
        .collect();
    assert_eq!(ids(&w.claim("q", 4, 60_000, 10)), c);
    let c2 = w.push("q", keyed("c", "c2"));
    assert!(w.claim("q", 4, 60_000, 10).is_empty());
    w.at(T0 + 3_000);
    assert_eq!(ids(&w.claim("q", 4, 60_000, 10)), [c2]);
    // Exactly as many set aside as the window allows: all come back, and
    // nothing is left to wake for.
    let d: Vec<JobId> = (0..4)
        .map(|i| w.push("q", keyed("d", &format!("d{i}"))))
        .collect();
    assert_eq!(ids(&w.claim("q", 5, 60_000, 10)), d[..2]);
    w.at(T0 + 4_000);
    assert_eq!(ids(&w.claim("q", 5, 60_000, 10)), d[2..]);
    for job in w.list("q", Some(JobState::Running)) {
        let h = job.claim.unwrap().holder.0;
        w.complete(&job, h).unwrap();
    }
    assert_eq!(next_change(&w, "q"), None, "no key waits for its window");
}

/// A per-key rate, a per-key concurrency limit and a queue's rate hold
/// together: a key waits for whichever holds it back.
pub fn queue_rates_and_concurrency_hold_together(make: &Make) {
    let w = World::new(make);
    let limits = Limits::none()
        .with_per_key(Some(1))
        .with_per_key_rate(Some(Rate::new(1, 1_000)))
        .with_rate(Some(Rate::new(3, 1_000)));
    assert!(set_limits(&w, "q", limits));
    let a: Vec<JobId> = (0..3)
        .map(|i| w.push("q", keyed("a", &format!("a{i}"))))
        .collect();
    let b: Vec<JobId> = (0..3)
        .map(|i| w.push("q", keyed("b", &format!("b{i}"))))
        .collect();
    let running = |w: &World, id: JobId| {
        let jobs = w.list("q", Some(JobState::Running));
        jobs.into_iter().find(|j| j.id == id).unwrap()
    };
    assert_eq!(ids(&w.claim("q", 1, 60_000, 10)), [a[0], b[0]]);
    w.complete(&running(&w, a[0]), 1).unwrap();
    assert!(
        w.claim("q", 1, 60_000, 10).is_empty(),
        "a's slot is free, its rate is not"
    );
    w.at(T0 + 1_000);
    assert_eq!(ids(&w.claim("q", 2, 60_000, 10)), [a[1]], "b0 still runs");
    w.complete(&running(&w, b[0]), 1).unwrap();
    assert_eq!(ids(&w.claim("q", 2, 60_000, 10)), [b[1]]);
    w.complete(&running(&w, a[1]), 2).unwrap();
    w.complete(&running(&w, b[1]), 2).unwrap();
    w.at(T0 + 1_500);
    assert!(w.claim("q", 3, 60_000, 10).is_empty(), "both keys' rates");
    let u: Vec<JobId> = (0..2)
        .map(|i| w.push("q", JobSpec::new(format!("u{i}"))))
        .collect();
    assert_eq!(
        ids(&w.claim("q", 3, 60_000, 10)),
        [u[0]],
        "the queue's third"
    );
    w.at(T0 + 2_100);
    let got = ids(&w.claim("q", 3, 60_000, 10));
    assert_eq!(got, [a[2], b[2]], "u0's start is still in the window");
    w.at(T0 + 2_500);
    assert_eq!(ids(&w.claim("q", 3, 60_000, 10)), [u[1]]);
}

/// Rates are checked like any input and named in the error, and a change
/// in a transaction that fails is not kept (S1).
pub fn queue_rates_check_their_input_and_roll_back(make: &Make) {
    let w = World::new(make);
    let field_of = |r: leasehold::Result<bool>| match r {
        Err(Error::Invalid { field, .. }) => Some(field),
        _ => None,
    };
    let max = core::job::MAX_RATE;
    for (limits, field) in [
        (
            Limits::none().with_rate(Some(Rate::new(0, 1_000))),
            leasehold::Field::Rate,
        ),
        (
            Limits::none().with_rate(Some(Rate::new(1, 0))),
            leasehold::Field::Rate,
        ),
        (
            Limits::none().with_rate(Some(Rate::new(1, core::job::MAX_WINDOW_MS + 1))),
            leasehold::Field::Rate,
        ),
        (
            Limits::none().with_per_key_rate(Some(Rate::new(max + 1, 1_000))),
            leasehold::Field::PerKeyRate,
        ),
    ] {
        let r = w.tx(|tx| core::job::set_limits(tx, "q", limits));
        assert_eq!(field_of(r), Some(field), "{limits:?}");
    }
    let most = Limits::none()
        .with_rate(Some(Rate::new(max, core::job::MAX_WINDOW_MS)))
        .with_per_key_rate(Some(Rate::new(max, 1)));
    assert!(set_limits(&w, "most", most), "the bounds are rates");
    let got = w
        .tx(|tx| core::job::queue_config(tx, "most"))
        .unwrap()
        .limits;
    assert_eq!(got, most);
    let r: leasehold::Result<()> = w.tx(|tx| {
        core::job::set_limits(tx, "q", Limits::none().with_rate(Some(Rate::new(1, 1_000))))?;
        Err(Error::NotFound(JobId(0)))
    });
    assert!(r.is_err());
    let limits = w.tx(|tx| core::job::queue_config(tx, "q")).unwrap().limits;
    assert!(!limits.any(), "the failed transaction's rate is gone");
}

/// `purge` forgets the rate buckets no window can count any more (idle
/// for longer than the longest window) and keeps the others: keys that
/// came and went leave nothing behind.
pub fn queue_idle_rate_buckets_are_purged(make: &Make) {
    let w = World::new(make);
    let limits = Limits::none()
        .with_rate(Some(Rate::new(5, 1_000)))
        .with_per_key_rate(Some(Rate::new(1, 1_000)));
    assert!(set_limits(&w, "q", limits));
    w.push("q", keyed("old", "o"));
    for job in w.claim("q", 1, 60_000, 10) {
        w.complete(&job, 1).unwrap();
    }
    let week = core::job::MAX_WINDOW_MS;
    w.at(T0 + week);
    w.push("q", keyed("new", "n"));
    for job in w.claim("q", 1, 60_000, 10) {
        w.complete(&job, 1).unwrap();
    }
    let log = |w: &World, key: &str| {
        w.tx(|tx| tx.jobs()?.rate_log("q", key))
            .unwrap()
            .starts
            .len()
    };
    assert_eq!((log(&w, "old"), log(&w, "new")), (1, 1));
    w.at(T0 + week + 1);
    w.tx(|tx| core::job::purge(tx, "q", 0, 100, &QueuePolicy::default()))
        .unwrap();
    assert_eq!(log(&w, "old"), 0, "idle for longer than any window");
    assert_eq!(log(&w, "new"), 1, "still counts");
    assert_eq!(log(&w, core::job::QUEUE_BUCKET), 1, "the queue's own");
}
