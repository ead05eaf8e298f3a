//! Job cases: claim order, the lifecycle, heartbeats, expiry and
//! quarantine, failures and backoff, operator actions, unique keys.

use super::*;

pub fn job_claim_order(make: &Make) {
    let w = World::new(make);
    let spec = |p: i32, run_at: Option<u64>| JobSpec {
        priority: p,
        run_at: run_at.map(leasehold::StoreMs),
        ..JobSpec::new(format!("p{p}"))
    };
    let a = w.push("q", spec(0, None)); // fifo 1
    let b = w.push("q", spec(5, None));
    let c = w.push("q", spec(0, None)); // fifo 2
    let d = w.push("q", spec(5, Some(T0 - 10_000))); // past: treated as now, after b by id
    let e = w.push("q", spec(-1, None));
    let f = w.push("q", spec(9, Some(T0 + 50))); // scheduled, highest priority
    let g = w.push("other", spec(100, None));
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(w.claim_one("q", 1, 1000).id);
    }
    assert_eq!(order, vec![b, d, a, c, e], "Q5 order");
    assert!(w.claim("q", 1, 1000, 1).is_empty(), "f is not due yet");
    w.at(T0 + 50);
    assert_eq!(w.claim_one("q", 1, 1000).id, f, "due exactly at run_at");
    assert_eq!(w.claim_one("other", 1, 1000).id, g);
}

pub fn job_priority_beats_earlier_run_at(make: &Make) {
    let w = World::new(make);
    let low = w.push(
        "q",
        JobSpec {
            priority: 1,
            ..JobSpec::new("low")
        },
    );
    w.at(T0 + 10);
    let high = w.push(
        "q",
        JobSpec {
            priority: 2,
            ..JobSpec::new("high")
        },
    );
    w.at(T0 + 20);
    let late_low = w.push(
        "q",
        JobSpec {
            priority: 1,
            ..JobSpec::new("low2")
        },
    );
    let got: Vec<JobId> = w.claim("q", 1, 100, 3).iter().map(|j| j.id).collect();
    assert_eq!(got, vec![high, low, late_low]);
}

pub fn job_lifecycle_complete(make: &Make) {
    let w = World::new(make);
    let id = w.push("q", JobSpec::new(vec![0u8, 1, 2, 255]));
    assert_eq!(w.stats("q"), counts(1, 0, 0, 0, 0, 0));
    let job = w.claim_one("q", 1, 100);
    assert_eq!(job.id, id);
    assert_eq!(&*job.payload, &[0u8, 1, 2, 255]);
    assert_eq!(job.attempts, 1, "Q4: counted at claim");
    assert_eq!(job.state, JobState::Running);
    let claim = job.claim.unwrap();
    assert_eq!(
        (claim.holder, claim.token, claim.lease_until_ms),
        (HolderId(1), 1, T0 + 100)
    );
    assert_eq!(w.stats("q"), counts(0, 0, 1, 0, 0, 0));
    assert!(w.claim("q", 2, 100, 5).is_empty(), "Q1: no double claim");
    // Wrong holder, wrong token: refused, nothing changes.
    let token = claim.token;
    let r = w.tx(|tx| core::job::complete(tx, id, HolderId(2), token));
    assert_eq!(lost_reason(r), LostReason::NotHolder);
    let r = w.tx(|tx| core::job::complete(tx, id, HolderId(1), token + 1));
    assert_eq!(lost_reason(r), LostReason::StaleToken);
    w.complete(&job, 1).unwrap();
    let done = w.get(id);
    assert_eq!(
        (done.state, done.claim, done.finished_at_ms),
        (JobState::Done, None, Some(T0))
    );
    // Sent again (as after a lost answer): its own outcome is found
    // recorded, and nothing changes (Q2: completed at most once).
    w.at(T0 + 5);
    w.complete(&job, 1).unwrap();
    assert_eq!(w.get(id), done, "Q2: at most once");
    let r = w.tx(|tx| core::job::fail(tx, id, HolderId(1), token, "late", &w.policy));
    assert_eq!(
        lost_reason(r),
        LostReason::StaleToken,
        "not another outcome"
    );
    assert_eq!(w.stats("q"), counts(0, 0, 0, 1, 0, 0));
}

pub fn job_heartbeat_extends_claim(make: &Make) {
    let w = World::new(make);
    let id = w.push("q", JobSpec::new("x"));
    let job = w.claim_one("q", 1, 100);
    let token = job.claim.unwrap().token;
    w.at(T0 + 99);
    let hb = w
        .tx(|tx| core::job::heartbeat(tx, id, HolderId(1), token, 100))
        .unwrap();
    assert_eq!((hb.lease_until_ms, hb.cancel_requested), (T0 + 199, false));
    w.at(T0 + 150);
    assert!(
        w.claim("q", 2, 100, 1).is_empty(),
        "still claimed after heartbeat"
    );
    let hb = w
        .tx(|tx| core::job::heartbeat(tx, id, HolderId(1), token, 10))
        .unwrap();
    assert_eq!(
        hb.lease_until_ms,
        T0 + 199,
        "a shorter lease never shortens"
    );
    w.at(T0 + 199);
    let r = w.tx(|tx| core::job::heartbeat(tx, id, HolderId(1), token, 100));
    assert_eq!(
        lost_reason(r),
        LostReason::Expired,
        "expired exactly at lease_until"
    );
    assert_eq!(lost_reason(w.complete(&job, 1)), LostReason::Expired);
}

pub fn job_expiry_counts_attempt(make: &Make) {
    let w = World::new(make);
    let id = w.push(
        "q",
        JobSpec {
            max_attempts: 2,
            ..JobSpec::new("x")
        },
    );
    let first = w.claim_one("q", 1, 100);
    w.at(T0 + 100);
    let c = w.stats("q");
    assert_eq!(
        c.get(JobState::Running),
        0,
        "Q3: not running past its lease"
    );
    let job = w.get(id);
    assert_eq!((job.attempts, job.expiries), (1, 1));
    assert_eq!(job.last_error.as_deref(), Some("lease expired"));
    assert!(matches!(job.state, JobState::Scheduled | JobState::Ready));
    w.at(job.run_at_ms);
    let second = w.claim_one("q", 2, 100);
    assert_eq!((second.attempts, second.claim.unwrap().token), (2, 2));
    assert_eq!(lost_reason(w.complete(&first, 1)), LostReason::StaleToken);
    w.at(job.run_at_ms + 100);
    let job = w.get(id);
    assert_eq!(
        job.state,
        JobState::Dead,
        "Q4: expiry is an attempt; out of attempts"
    );
    assert_eq!((job.attempts, job.expiries), (2, 2));
    assert_eq!(job.last_error.as_deref(), Some("lease expired"));
    assert_eq!(w.stats("q"), counts(0, 0, 0, 0, 1, 0));
}

/// A claim that finds claims run out settles them first and claims only
/// those now ready: not one out of attempts (dead) nor one waiting out
/// its backoff (scheduled), even when nothing else brought the queue up
/// to date in between.
pub fn job_claim_after_expiry_takes_only_ready_jobs(make: &Make) {
    let w = World::new(make);
    let once = w.push(
        "q",
        JobSpec {
            max_attempts: 1,
            ..JobSpec::new("once")
        },
    );
    let thrice = w.push(
        "q",
        JobSpec {
            max_attempts: 3,
            ..JobSpec::new("thrice")
        },
    );
    assert_eq!(w.claim("q", 1, 100, 2).len(), 2);
    w.at(T0 + 100);
    assert_eq!(w.claim("q", 2, 100, 10), vec![], "nothing is ready");
    assert_eq!(w.get(once).state, JobState::Dead);
    let backing_off = w.get(thrice);
    assert_eq!(backing_off.state, JobState::Scheduled);
    w.at(backing_off.run_at_ms);
    let again = w.claim("q", 2, 100, 10);
    assert_eq!(again.iter().map(|j| j.id).collect::<Vec<_>>(), [thrice]);
}

pub fn job_quarantine_crash_loop(make: &Make) {
    let mut w = World::new(make);
    w.policy.quarantine_expiries = 2;
    w.policy.backoff_base_ms = 1;
    w.policy.backoff_max_ms = 1;
    let id = w.push(
        "q",
        JobSpec {
            max_attempts: 50,
            ..JobSpec::new("x")
        },
    );
    let mut now = T0;
    for round in 1..=2 {
        w.at(now);
        let job = w.claim_one("q", 1, 10);
        assert_eq!(job.attempts, round);
        now += 11;
    }
    w.at(now);
    let job = w.get(id);
    assert_eq!(job.state, JobState::Dead);
    assert_eq!(job.expiries, 2);
    assert!(job.last_error.as_deref().unwrap().contains("crash loop"));

    // When the expiry that trips the quarantine also used the last attempt,
    // the job is dead for running out of attempts: the plain reason.
    let id = w.push(
        "q2",
        JobSpec {
            max_attempts: 2,
            ..JobSpec::new("y")
        },
    );
    for round in 1..=2 {
        w.at(now);
        let job = w.claim_one("q2", 1, 10);
        assert_eq!(job.attempts, round);
        now += 11;
    }
    w.at(now);
    let job = w.get(id);
    assert_eq!(
        (job.state, job.attempts, job.expiries),
        (JobState::Dead, 2, 2)
    );
    assert_eq!(job.last_error.as_deref(), Some("lease expired"));
}

pub fn job_fail_backoff_then_dead(make: &Make) {
    let w = World::new(make);
    let id = w.push(
        "q",
        JobSpec {
            max_attempts: 3,
            ..JobSpec::new("x")
        },
    );
    let mut expected_min = T0;
    for attempt in 1..=2u32 {
        let job = w.claim_one("q", 1, 1000);
        assert_eq!(job.attempts, attempt);
        assert_eq!(
            w.fail(&job, 1, &format!("boom {attempt}")).unwrap(),
            JobState::Scheduled
        );
        let rec = w.get(id);
        let full = 100u64 << (attempt - 1);
        let now = w.tx(|tx| Ok(tx.now_ms())).unwrap();
        assert!(
            rec.run_at_ms >= now + full / 2 && rec.run_at_ms <= now + full,
            "backoff {} not in [{}, {}]",
            rec.run_at_ms - now,
            full / 2,
            full
        );
        assert_eq!(
            rec.run_at_ms,
            now + core::backoff_ms(&w.policy, id, attempt)
        );
        assert!(w.claim("q", 1, 1000, 1).is_empty(), "not before backoff");
        expected_min = rec.run_at_ms;
        w.at(rec.run_at_ms);
    }
    assert!(expected_min > T0);
    let job = w.claim_one("q", 1, 1000);
    assert_eq!(w.fail(&job, 1, "final").unwrap(), JobState::Dead);
    let rec = w.get(id);
    assert_eq!((rec.state, rec.attempts), (JobState::Dead, 3));
    assert_eq!(rec.last_error.as_deref(), Some("final"));
    assert_eq!(
        lost_reason(w.fail(&job, 1, "again")),
        LostReason::StaleToken
    );
}

pub fn job_cancel_and_retry(make: &Make) {
    let w = World::new(make);
    let policy = w.policy;
    let ready = w.push("q", JobSpec::new("r"));
    let later = w.push(
        "q",
        JobSpec {
            delay_ms: 1000,
            ..JobSpec::new("s")
        },
    );
    assert_eq!(w.stats("q"), counts(1, 1, 0, 0, 0, 0));
    assert_eq!(
        w.tx(|tx| core::job::cancel(tx, later, &policy)).unwrap(),
        JobState::Cancelled
    );
    let running = w.claim_one("q", 1, 100);
    assert_eq!(running.id, ready);
    assert_eq!(
        w.tx(|tx| core::job::cancel(tx, ready, &policy)).unwrap(),
        JobState::Running
    );
    let token = running.claim.unwrap().token;
    let hb = w
        .tx(|tx| core::job::heartbeat(tx, ready, HolderId(1), token, 100))
        .unwrap();
    assert!(
        hb.cancel_requested,
        "worker sees the cancel at its heartbeat"
    );
    assert_eq!(
        w.fail(&running, 1, "cancelled by request").unwrap(),
        JobState::Cancelled
    );
    assert_eq!(w.stats("q"), counts(0, 0, 0, 0, 0, 2));
    match w.tx(|tx| core::job::cancel(tx, ready, &policy)) {
        Err(Error::InvalidState {
            state: JobState::Cancelled,
            ..
        }) => {}
        other => panic!("expected InvalidState, got {other:?}"),
    }
    w.tx(|tx| core::job::retry(tx, ready, &QueuePolicy::default()))
        .unwrap();
    let rec = w.get(ready);
    assert_eq!(
        (rec.state, rec.attempts, rec.cancel_requested),
        (JobState::Ready, 0, false)
    );
    let job = w.claim_one("q", 2, 100);
    assert_eq!(
        (job.id, job.attempts, job.claim.unwrap().token),
        (ready, 1, 2)
    );
    match w.tx(|tx| core::job::retry(tx, ready, &QueuePolicy::default())) {
        Err(Error::InvalidState {
            state: JobState::Running,
            ..
        }) => {}
        other => panic!("expected InvalidState, got {other:?}"),
    }
    // A cancel requested on a job whose claim then expires ends cancelled.
    w.tx(|tx| core::job::cancel(tx, ready, &policy)).unwrap();
    w.at(T0 + 100);
    assert_eq!(w.get(ready).state, JobState::Cancelled);
    assert!(matches!(
        w.tx(|tx| core::job::cancel(tx, JobId(999), &policy)),
        Err(Error::NotFound(JobId(999)))
    ));
}

pub fn job_unique_key(make: &Make) {
    let w = World::new(make);
    let spec = || JobSpec {
        unique_key: Some("u".into()),
        ..JobSpec::new("x")
    };
    let first = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &QueuePolicy::default()))
        .unwrap();
    assert!(first.created);
    let second = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &QueuePolicy::default()))
        .unwrap();
    assert_eq!((second.id, second.created), (first.id, false));
    let other_queue = w
        .tx(|tx| core::job::enqueue(tx, "q2", &spec(), &QueuePolicy::default()))
        .unwrap();
    assert!(other_queue.created, "unique per queue");
    let job = w.claim_one("q", 1, 100);
    let while_running = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &QueuePolicy::default()))
        .unwrap();
    assert_eq!(while_running.id, first.id, "running is live");
    w.complete(&job, 1).unwrap();
    let after = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &QueuePolicy::default()))
        .unwrap();
    assert!(
        after.created && after.id > first.id,
        "terminal frees the key"
    );
    // Retrying a job whose key another live job holds is refused.
    let policy = w.policy;
    w.tx(|tx| core::job::cancel(tx, after.id, &policy)).unwrap();
    let holder_now = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &policy))
        .unwrap();
    assert!(holder_now.created);
    match w.tx(|tx| core::job::retry(tx, after.id, &policy)) {
        Err(Error::Invalid {
            field: leasehold::Field::UniqueKey,
            ..
        }) => {}
        other => panic!("expected a unique_key refusal, got {other:?}"),
    }
    w.tx(|tx| core::job::cancel(tx, holder_now.id, &policy))
        .unwrap();
    w.tx(|tx| core::job::retry(tx, after.id, &policy)).unwrap();
    assert_eq!(w.stats("q"), counts(1, 0, 0, 1, 0, 1));
    // A key's holder may have expired into a terminal state that nothing
    // has written down yet: retry judges it as it is now.
    let spec2 = || JobSpec {
        unique_key: Some("u2".into()),
        max_attempts: 1,
        ..JobSpec::new("y")
    };
    let a = w
        .tx(|tx| core::job::enqueue(tx, "r", &spec2(), &policy))
        .unwrap();
    w.tx(|tx| core::job::cancel(tx, a.id, &policy)).unwrap();
    let b = w
        .tx(|tx| core::job::enqueue(tx, "r", &spec2(), &policy))
        .unwrap();
    assert!(b.created);
    assert_eq!(w.claim_one("r", 1, 100).id, b.id);
    w.at(T0 + 100);
    w.tx(|tx| core::job::retry(tx, a.id, &policy)).unwrap();
    assert_eq!(w.get(b.id).state, JobState::Dead);
    assert_eq!(w.get(a.id).state, JobState::Ready);
}

/// A unique key held by a job whose last claim ran out with no attempts
/// left: enqueue finds the holder dead (as of now) and makes a new job.
pub fn job_unique_key_freed_by_a_final_expiry(make: &Make) {
    let w = World::new(make);
    let policy = w.policy;
    let spec = || JobSpec {
        max_attempts: 1,
        unique_key: Some("nightly".into()),
        ..JobSpec::new("x")
    };
    let first = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &policy))
        .unwrap();
    let claimed = w.claim_one("q", 1, 100);
    assert_eq!(claimed.id, first.id);
    // Its only attempt runs out; nothing has looked at the queue since.
    w.at(T0 + 100);
    let second = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &policy))
        .unwrap();
    assert!(second.created, "the dead holder does not keep its key");
    assert_ne!(second.id, first.id);
    assert_eq!(w.get(first.id).state, JobState::Dead);
    assert_eq!(w.get(second.id).state, JobState::Ready);
}

/// `retry` revives exactly the states [`JobState::is_retryable`] names
/// (the dashboard offers its Retry button by that predicate).
pub fn job_retry_takes_exactly_the_retryable_states(make: &Make) {
    let w = World::new(make);
    let policy = QueuePolicy::default();
    let one_attempt = |name: &str| JobSpec {
        max_attempts: 1,
        ..JobSpec::new(name)
    };
    let done = w.push("q", one_attempt("done"));
    let job = w.claim_one("q", 1, 100);
    w.complete(&job, 1).unwrap();
    let dead = w.push("q", one_attempt("dead"));
    let job = w.claim_one("q", 1, 100);
    assert_eq!(w.fail(&job, 1, "boom").unwrap(), JobState::Dead);
    let running = w.push("q", one_attempt("running"));
    assert_eq!(w.claim_one("q", 1, 100).id, running);
    let cancelled = w.push("q", one_attempt("cancelled"));
    w.tx(|tx| core::job::cancel(tx, cancelled, &policy))
        .unwrap();
    let scheduled = w.push(
        "q",
        JobSpec {
            delay_ms: 1_000,
            ..one_attempt("scheduled")
        },
    );
    let ready = w.push("q", one_attempt("ready"));
    let ids = [ready, scheduled, running, done, dead, cancelled];
    for (state, id) in JobState::ALL.into_iter().zip(ids) {
        assert_eq!(w.get(id).state, state);
        let retried = w.tx(|tx| core::job::retry(tx, id, &policy));
        match retried {
            Ok(()) => assert!(state.is_retryable(), "{state} was retried"),
            Err(Error::InvalidState { state: s, .. }) => {
                assert!(!state.is_retryable(), "{state} was refused");
                assert_eq!(s, state);
                assert_eq!(w.get(id).state, state, "a refused retry changes nothing");
            }
            Err(e) => panic!("{state}: {e}"),
        }
    }
    assert_eq!(w.get(dead).state, JobState::Ready);
    assert_eq!(w.get(cancelled).state, JobState::Ready);
}

/// How long an idle worker may sleep: until the earliest scheduled job
/// falls due or the earliest running claim runs out, whichever is first.
pub fn job_next_change_is_the_first_due_or_expiry(make: &Make) {
    let w = World::new(make);
    let next = |w: &World| {
        w.tx(|tx| core::job::next_look(tx, "q").map(|l| l.change_in_ms))
            .unwrap()
    };
    assert_eq!(next(&w), None, "an empty queue never changes by time");
    w.push("q", JobSpec::new("ready"));
    assert_eq!(next(&w), None, "a ready job is not a change by time");
    let later = JobSpec {
        run_at: Some(leasehold::StoreMs(T0 + 5_000)),
        ..JobSpec::new("later")
    };
    w.push("q", later);
    assert_eq!(next(&w), Some(5_000), "the delayed job falls due");
    w.claim_one("q", 1, 2_000);
    assert_eq!(next(&w), Some(2_000), "the claim runs out first");
    w.at(T0 + 1_500);
    assert_eq!(next(&w), Some(500));
    let sooner = JobSpec {
        run_at: Some(leasehold::StoreMs(T0 + 1_600)),
        ..JobSpec::new("sooner")
    };
    w.push("q", sooner);
    assert_eq!(next(&w), Some(100), "the earliest of them");
    w.push(
        "other",
        JobSpec {
            run_at: Some(leasehold::StoreMs(T0 + 1_501)),
            ..JobSpec::new("elsewhere")
        },
    );
    assert_eq!(next(&w), Some(100), "another queue's jobs do not count");
    // Past due, and nothing claimed them in this transaction: rows the
    // claim passed over, which another transaction holds. A look soon,
    // and the change by time is the first one after now.
    w.at(T0 + 9_000);
    let look = |w: &World, queue: &str| {
        let l = w.tx(|tx| core::job::next_look(tx, queue)).unwrap();
        (l.change_in_ms, l.relook_in_ms)
    };
    let soon = Some(core::job::OVERLAP_RELOOK_MS);
    assert_eq!(look(&w, "q"), (None, soon));
    let after = JobSpec {
        run_at: Some(leasehold::StoreMs(T0 + 9_700)),
        ..JobSpec::new("after")
    };
    w.push("q", after);
    assert_eq!(
        look(&w, "q"),
        (Some(700), soon),
        "a due time past the held rows is kept"
    );
    // A row due this very instant is one the claim would have taken.
    let exact = JobSpec {
        run_at: Some(leasehold::StoreMs(T0 + 9_800)),
        ..JobSpec::new("exact")
    };
    w.push("exact", exact);
    w.at(T0 + 9_800);
    assert_eq!(look(&w, "exact"), (None, soon), "due now: passed over");
    // Likewise a claim already run out, and the next one to run out.
    w.push("leases", JobSpec::new("short"));
    w.push("leases", JobSpec::new("long"));
    w.claim_one("leases", 3, 1_000);
    w.claim_one("leases", 3, 20_000);
    w.at(T0 + 14_800);
    assert_eq!(
        look(&w, "leases"),
        (Some(15_000), soon),
        "run out, then the next"
    );
}
