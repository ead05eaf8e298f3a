//! Concurrency limits on every store (F1): per queue and per key, held
//! across holders, through expiries, lowered, raised and cleared, with a
//! blocked key's backlog set aside (parked) and given back one slot at a
//! time.

use super::*;
use leasehold::core::{Limits, Wake};

pub(super) fn set_limits(w: &World, queue: &str, limits: Limits) -> bool {
    w.tx(|tx| core::job::set_limits(tx, queue, limits)).unwrap()
}

pub(super) fn keyed(key: &str, payload: &str) -> JobSpec {
    JobSpec {
        key: Some(key.into()),
        ..JobSpec::new(payload)
    }
}

pub(super) fn ids(jobs: &[JobRecord]) -> Vec<JobId> {
    jobs.iter().map(|j| j.id).collect()
}

/// At most N jobs of a limited queue run at once, whoever claims; a slot
/// frees when a job completes (idle workers are woken) or its claim runs
/// out; a lowered limit starts nothing until the running jobs are under
/// it; other queues are untouched.
pub fn queue_concurrency_limit_holds_across_holders(make: &Make) {
    let w = World::new(make);
    let jobs: Vec<JobId> = (0..6)
        .map(|i| w.push("q", JobSpec::new(format!("j{i}"))))
        .collect();
    let two = Limits::none().with_concurrency(Some(2));
    assert!(set_limits(&w, "q", two));
    assert!(!set_limits(&w, "q", two), "unchanged");
    assert_eq!(ids(&w.claim("q", 1, 10_000, 10)), jobs[..2]);
    assert!(w.claim("q", 2, 1_000, 10).is_empty(), "full, whoever asks");
    let other = w.push("other", JobSpec::new("o"));
    assert_eq!(
        ids(&w.claim("other", 2, 1_000, 10)),
        [other],
        "only q is limited"
    );
    let running = w.list("q", Some(JobState::Running));
    let epoch = w.store.epoch(Wake::JobReady);
    w.complete(&running[0], 1).unwrap();
    assert!(
        w.store.epoch(Wake::JobReady) > epoch || w.store.epoch(Wake::JobReady) == 0,
        "a freed slot wakes idle workers (where the store can tell)"
    );
    assert_eq!(ids(&w.claim("q", 2, 1_000, 10)), [jobs[2]]);
    // A dead holder's slot comes free when its claim runs out.
    w.at(T0 + 500);
    assert!(w.claim("q", 3, 10_000, 10).is_empty());
    w.at(T0 + 2_000);
    assert_eq!(
        ids(&w.claim("q", 3, 10_000, 10)),
        [jobs[3]],
        "the expired claim's slot, and only it"
    );
    // Lowered under what runs: nothing starts until under the limit.
    assert!(set_limits(
        &w,
        "q",
        Limits::none().with_concurrency(Some(1))
    ));
    assert_eq!(w.stats("q").get(JobState::Running), 2);
    assert!(w.claim("q", 4, 10_000, 10).is_empty());
    let running = w.list("q", Some(JobState::Running));
    let h = |j: &JobRecord| j.claim.unwrap().holder.0;
    w.complete(&running[0], h(&running[0])).unwrap();
    assert!(w.claim("q", 4, 10_000, 10).is_empty(), "1 runs: still full");
    w.complete(&running[1], h(&running[1])).unwrap();
    assert_eq!(w.claim("q", 4, 10_000, 10).len(), 1);
    // Cleared: every ready job is claimable.
    assert!(set_limits(&w, "q", Limits::none()));
    let ready = w.stats("q").get(JobState::Ready);
    assert!(ready > 0);
    assert_eq!(w.claim("q", 5, 10_000, 10).len() as u64, ready);
}

/// At most M jobs of one key run at once: a claim takes the best jobs
/// that fit and sets the blocked ones aside (still ready, listed and
/// counted as ready); a job of the key leaving running gives its slot to
/// the key's best waiting job; jobs without a key are not limited.
pub fn queue_per_key_limit_runs_one_per_key(make: &Make) {
    let w = World::new(make);
    assert!(set_limits(&w, "q", Limits::none().with_per_key(Some(1))));
    let a1 = w.push("q", keyed("a", "a1"));
    let a2 = w.push("q", keyed("a", "a2"));
    let b1 = w.push("q", keyed("b", "b1"));
    let n1 = w.push("q", JobSpec::new("n1"));
    let n2 = w.push("q", JobSpec::new("n2"));
    let first = w.claim("q", 1, 1_000, 10);
    assert_eq!(ids(&first), [a1, b1, n1, n2]);
    assert_eq!(first[0].key.as_deref(), Some("a"));
    let waiting = w.get(a2);
    assert_eq!((waiting.state, waiting.parked), (JobState::Ready, true));
    assert_eq!(
        w.stats("q").get(JobState::Ready),
        1,
        "set aside, still ready"
    );
    assert_eq!(ids(&w.list("q", Some(JobState::Ready))), [a2]);
    assert!(w.claim("q", 2, 1_000, 10).is_empty(), "a is full");
    // A third job of a, with a higher priority, waits too.
    let a3 = w.push(
        "q",
        JobSpec {
            priority: 5,
            ..keyed("a", "a3")
        },
    );
    assert!(w.claim("q", 2, 1_000, 10).is_empty());
    // Pages of ready jobs show the waiting ones in claim order, a page at
    // a time, whatever the store indexes apart.
    let n3 = w.push("q", JobSpec::new("n3"));
    let page = |after: Option<core::JobCursor>| -> Vec<JobId> {
        let policy = QueuePolicy::default();
        w.tx(|tx| core::job::page(tx, "q", JobState::Ready, after, 2, 0, &policy))
            .unwrap()
            .iter()
            .map(|p| p.job.id)
            .collect()
    };
    assert_eq!(page(None), [a3, a2], "priority 5 first, then by id");
    let cursor = core::JobCursor::of(&w.get(a2));
    assert_eq!(page(Some(cursor)), [n3]);
    // a1 fails: its slot goes to a's best waiting job, a3.
    assert_eq!(w.fail(&first[0], 1, "boom").unwrap(), JobState::Scheduled);
    assert!(!w.get(a3).parked);
    assert_eq!(ids(&w.claim("q", 2, 1_000, 10)), [a3, n3]);
    assert!(w.get(a2).parked, "one slot, one job");
    // b's slot is b's: nothing of a starts when b1 completes.
    w.complete(&first[1], 1).unwrap();
    assert!(w.claim("q", 2, 1_000, 10).is_empty());
}

/// The claim that finds a full key's running job expired (its holder
/// died) starts that key's waiting job in the same claim; a waiting job
/// given the slot and then cancelled passes it on; a cancel of a job
/// holding no slot passes nothing on.
pub fn queue_per_key_slot_frees_on_expiry_and_cancel(make: &Make) {
    let w = World::new(make);
    assert!(set_limits(&w, "q", Limits::none().with_per_key(Some(1))));
    let a: Vec<JobId> = (0..4)
        .map(|i| w.push("q", keyed("a", &format!("a{i}"))))
        .collect();
    assert_eq!(ids(&w.claim("q", 1, 100, 10)), [a[0]]);
    w.at(T0 + 150);
    // a0's claim ran out: the same claim starts a1 (a0 waits its backoff).
    assert_eq!(ids(&w.claim("q", 2, 1_000, 10)), [a[1]]);
    assert_eq!(w.get(a[0]).state, JobState::Scheduled);
    let running = w.get(a[1]);
    w.complete(&running, 2).unwrap();
    // a2 has the slot; cancelled before any claim, it passes it to a3.
    assert!(!w.get(a[2]).parked);
    assert!(w.get(a[3]).parked);
    assert_eq!(w.cancel(a[2]), JobState::Cancelled);
    assert!(!w.get(a[3]).parked);
    assert_eq!(ids(&w.claim("q", 3, 1_000, 10)), [a[3]]);
    // A cancel passes on only a slot its job held: not a running job's
    // (it keeps running until its worker sees the request), nor a waiting
    // job's that had none.
    let b: Vec<JobId> = (4..6)
        .map(|i| w.push("q", keyed("a", &format!("a{i}"))))
        .collect();
    assert!(w.claim("q", 4, 1_000, 10).is_empty(), "a3 runs");
    assert!(w.get(b[0]).parked && w.get(b[1]).parked);
    assert_eq!(w.cancel(a[3]), JobState::Running);
    assert!(w.get(b[0]).parked, "a3 still holds the slot");
    assert_eq!(w.cancel(b[1]), JobState::Cancelled);
    assert!(w.get(b[0]).parked, "a5 held no slot");
    assert!(w.claim("q", 4, 1_000, 10).is_empty());
}

/// A worker's batch of outcomes frees slots as single settles do, each
/// job under its own queue's limits (a batch may span queues).
pub fn queue_per_key_slot_frees_in_a_settle_batch(make: &Make) {
    use leasehold::core::job::Settle;
    let w = World::new(make);
    assert!(set_limits(&w, "q", Limits::none().with_per_key(Some(1))));
    let other = w.push("free", keyed("a", "o"));
    let a: Vec<JobId> = (0..3)
        .map(|i| w.push("q", keyed("a", &format!("a{i}"))))
        .collect();
    let o = w.claim_one("free", 1, 10_000);
    assert_eq!(o.id, other);
    assert_eq!(ids(&w.claim("q", 1, 10_000, 10)), [a[0]]);
    assert!(w.get(a[1]).parked && w.get(a[2]).parked);
    let token = |id: JobId| w.get(id).claim.unwrap().token;
    let batch = vec![
        (other, token(other), Settle::Complete),
        (a[0], token(a[0]), Settle::Complete),
    ];
    let policy = QueuePolicy::default();
    let states = w
        .tx(|tx| core::job::settle_many(tx, HolderId(1), &batch, &policy))
        .unwrap();
    assert!(
        states.iter().all(|s| matches!(s, Ok(JobState::Done))),
        "{states:?}"
    );
    assert!(!w.get(a[1]).parked, "a0's slot went to a1");
    assert!(w.get(a[2]).parked, "one slot, one job");
    assert_eq!(ids(&w.claim("q", 2, 10_000, 10)), [a[1]]);
}

/// Raising or clearing a limit gives every waiting job its chance at
/// once; lowering stops nothing that runs.
pub fn queue_limits_raised_or_cleared_free_waiting_jobs(make: &Make) {
    let w = World::new(make);
    assert!(set_limits(&w, "q", Limits::none().with_per_key(Some(1))));
    let a: Vec<JobId> = (0..4)
        .map(|i| w.push("q", keyed("a", &format!("a{i}"))))
        .collect();
    assert_eq!(ids(&w.claim("q", 1, 10_000, 10)), [a[0]]);
    assert!(set_limits(&w, "q", Limits::none().with_per_key(Some(3))));
    assert_eq!(ids(&w.claim("q", 1, 10_000, 10)), [a[1], a[2]]);
    assert!(set_limits(&w, "q", Limits::none().with_per_key(Some(1))));
    assert_eq!(w.stats("q").get(JobState::Running), 3, "nothing stopped");
    assert!(w.claim("q", 1, 10_000, 10).is_empty());
    assert!(set_limits(&w, "q", Limits::none()));
    assert_eq!(ids(&w.claim("q", 1, 10_000, 10)), [a[3]]);
}

/// A claim sets a blocked key's backlog aside in bounded steps (the first
/// one here stops at the bound with nothing to start), and once it is
/// aside, claims find the free job behind it at once.
pub fn queue_blocked_key_backlog_is_set_aside(make: &Make) {
    let w = World::new(make);
    assert!(set_limits(&w, "q", Limits::none().with_per_key(Some(1))));
    let n = core::job::PARK_MAX + 300;
    let blocked: Vec<JobId> = w
        .tx(|tx| {
            (0..n)
                .map(|i| {
                    let spec = keyed("hot", &format!("h{i}"));
                    core::job::enqueue(tx, "q", &spec, &QueuePolicy::default()).map(|o| o.id)
                })
                .collect()
        })
        .unwrap();
    let free = w.push("q", JobSpec::new("free"));
    assert_eq!(ids(&w.claim("q", 1, 60_000, 1)), [blocked[0]]);
    let mut claims = 0;
    let found = loop {
        claims += 1;
        let got = w.claim("q", 2, 60_000, 1);
        if !got.is_empty() || claims > 3 {
            break got;
        }
    };
    assert_eq!(ids(&found), [free], "found after {claims} claims");
    assert!(
        claims == 2,
        "the first claim parks {} and answers nothing, the second finds it: {claims} claims",
        core::job::PARK_MAX
    );
    assert!(w.claim("q", 2, 60_000, 1).is_empty(), "all aside now");
    assert_eq!(w.stats("q").get(JobState::Ready) as usize, n - 1);
}

/// Limits and keys are checked like any input, and a change of limits in
/// a transaction that fails is not kept (S1).
pub fn queue_limits_check_their_input_and_roll_back(make: &Make) {
    let w = World::new(make);
    let field_of = |r: leasehold::Result<bool>| match r {
        Err(Error::Invalid { field, .. }) => Some(field),
        _ => None,
    };
    for (limits, field) in [
        (
            Limits::none().with_concurrency(Some(0)),
            leasehold::Field::Concurrency,
        ),
        (
            Limits::none().with_per_key(Some(0)),
            leasehold::Field::PerKey,
        ),
        (
            Limits::none().with_per_key(Some(core::job::MAX_LIMIT + 1)),
            leasehold::Field::PerKey,
        ),
        (
            Limits::none().with_concurrency(Some(core::job::MAX_LIMIT + 1)),
            leasehold::Field::Concurrency,
        ),
    ] {
        let r = w.tx(|tx| core::job::set_limits(tx, "q", limits));
        assert_eq!(field_of(r), Some(field), "{limits:?}");
    }
    for bad in ["", "a\nb"] {
        let r = w.tx(|tx| core::job::enqueue(tx, "q", &keyed(bad, "x"), &QueuePolicy::default()));
        assert!(
            matches!(&r, Err(Error::Invalid { field, .. }) if *field == leasehold::Field::ConcurrencyKey),
            "{bad:?}: {r:?}"
        );
    }
    let most = Limits::none()
        .with_concurrency(Some(core::job::MAX_LIMIT))
        .with_per_key(Some(core::job::MAX_LIMIT));
    assert!(
        set_limits(&w, "most", most),
        "the largest limits are limits"
    );
    let r: leasehold::Result<()> = w.tx(|tx| {
        core::job::set_limits(tx, "q", Limits::none().with_concurrency(Some(1)))?;
        Err(Error::NotFound(JobId(0)))
    });
    assert!(r.is_err());
    let limits = w.tx(|tx| core::job::queue_config(tx, "q")).unwrap().limits;
    assert!(!limits.any(), "the failed transaction's limits are gone");
}

/// F3: a job's run-time limit counts from its claim. The claim's lease
/// never reaches past the deadline, renewals never move it past, and a
/// claim that runs out there is settled saying the job timed out; a
/// worker's own failure before the deadline is accepted as any failure.
pub fn job_timeout_caps_the_claim_and_its_renewals(make: &Make) {
    let w = World::new(make);
    let timed = |ms: u64, payload: &str| JobSpec {
        timeout: Some(std::time::Duration::from_millis(ms)),
        ..JobSpec::new(payload)
    };
    let a = w.push("q", timed(500, "a"));
    let plain = w.push("q", JobSpec::new("plain"));
    assert_eq!(w.get(a).timeout_ms, Some(500));
    let claimed = w.claim("q", 1, 1_000, 10);
    assert_eq!(ids(&claimed), [a, plain]);
    let c = claimed[0].claim.unwrap();
    assert_eq!(
        (c.lease_until_ms, c.deadline_ms),
        (T0 + 500, Some(T0 + 500))
    );
    let p = claimed[1].claim.unwrap();
    assert_eq!((p.lease_until_ms, p.deadline_ms), (T0 + 1_000, None));
    w.at(T0 + 100);
    let hb = w
        .tx(|tx| core::job::heartbeat(tx, a, HolderId(1), c.token, 1_000))
        .unwrap();
    assert_eq!(
        hb.lease_until_ms,
        T0 + 500,
        "no renewal passes the deadline"
    );
    w.at(T0 + 500);
    let late = w.tx(|tx| core::job::heartbeat(tx, a, HolderId(1), c.token, 1_000));
    assert!(
        matches!(
            late,
            Err(Error::Lost {
                reason: leasehold::LostReason::Expired,
                ..
            })
        ),
        "{late:?}"
    );
    let job = w.get(a);
    assert_eq!(job.state, JobState::Scheduled, "retried as any expiry");
    assert_eq!(
        job.last_error.as_deref(),
        Some("lease expired at the job's deadline (timed out)")
    );
    // The next attempt's deadline counts from its own claim.
    w.at(T0 + 60_000);
    let again = w.claim_one("q", 2, 200);
    assert_eq!(again.id, a);
    assert_eq!(
        again.claim.map(|c| (c.lease_until_ms, c.deadline_ms)),
        Some((T0 + 60_200, Some(T0 + 60_500))),
        "a lease shorter than the limit is the lease"
    );
    // A worker that stops it first fails it with its own reason.
    assert_eq!(
        w.fail(
            &again,
            2,
            "timed out: still running at the job's 500 ms limit"
        )
        .unwrap(),
        JobState::Scheduled
    );
    for bad in [0, core::MAX_TTL_MS + 1] {
        let r = w.tx(|tx| core::job::enqueue(tx, "q", &timed(bad, "x"), &QueuePolicy::default()));
        assert!(
            matches!(&r, Err(Error::Invalid { field, .. }) if *field == leasehold::Field::Timeout),
            "{bad}: {r:?}"
        );
    }
}
