//! Job cases on batches and scans: batch claims, purge, listing, the
//! time-driven changes, hostile names, the drain rule, renewal rounds and
//! completer batches, the ordered reads.

use super::*;

pub fn job_batch_claim(make: &Make) {
    let w = World::new(make);
    let ids: Vec<JobId> = (0..10)
        .map(|i| w.push("q", JobSpec::new(vec![i])))
        .collect();
    let first = w.claim("q", 1, 100, 4);
    assert_eq!(
        first.iter().map(|j| j.id).collect::<Vec<_>>(),
        ids[..4].to_vec()
    );
    let rest = w.claim("q", 2, 100, 100);
    assert_eq!(
        rest.iter().map(|j| j.id).collect::<Vec<_>>(),
        ids[4..].to_vec()
    );
    assert!(w.claim("q", 3, 100, 100).is_empty());
    assert_eq!(w.stats("q"), counts(0, 0, 10, 0, 0, 0));
}

pub fn job_purge(make: &Make) {
    let w = World::new(make);
    let a = w.push("q", JobSpec::new("a"));
    let job = w.claim_one("q", 1, 10_000);
    w.complete(&job, 1).unwrap();
    w.at(T0 + 1000);
    let b = w.push("q", JobSpec::new("b"));
    let job_b = w.claim_one("q", 1, 10_000);
    w.complete(&job_b, 1).unwrap();
    let running = w.push("q", JobSpec::new("c"));
    w.claim_one("q", 1, 100_000);
    w.at(T0 + 1500);
    let n = w
        .tx(|tx| core::job::purge(tx, "q", 1000, 100, &QueuePolicy::default()))
        .unwrap();
    assert_eq!(n, 1, "only a finished 1500 ms ago");
    let policy = w.policy;
    assert!(matches!(
        w.tx(|tx| core::job::get(tx, a, &policy)),
        Err(Error::NotFound(_))
    ));
    assert_eq!(w.get(b).state, JobState::Done);
    assert_eq!(w.get(running).state, JobState::Running);
    let n = w
        .tx(|tx| core::job::purge(tx, "q", 0, 100, &QueuePolicy::default()))
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(w.stats("q"), counts(0, 0, 1, 0, 0, 0));
}

pub fn job_list_pages_and_filters(make: &Make) {
    let w = World::new(make);
    let ids: Vec<JobId> = (0..5).map(|i| w.push("q", JobSpec::new(vec![i]))).collect();
    w.claim_one("q", 1, 100);
    let policy = w.policy;
    let page = w
        .tx(|tx| core::job::list(tx, "q", None, ids[1], 2, &policy))
        .unwrap();
    assert_eq!(
        page.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![ids[2], ids[3]]
    );
    let running = w.list("q", Some(JobState::Running));
    assert_eq!(
        running.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![ids[0]]
    );
    assert_eq!(w.list("q", Some(JobState::Ready)).len(), 4);
    assert!(w.list("empty", None).is_empty());
}

pub fn job_time_driven_changes_are_complete_and_visible(make: &Make) {
    let w = World::new(make);
    // More due jobs than one maintenance chunk: all become ready at once.
    for i in 0..600u32 {
        let spec = JobSpec {
            delay_ms: 10,
            ..JobSpec::new(i.to_be_bytes().to_vec())
        };
        w.push("q", spec);
    }
    assert_eq!(w.stats("q"), counts(0, 600, 0, 0, 0, 0));
    w.at(T0 + 10);
    assert_eq!(w.stats("q"), counts(600, 0, 0, 0, 0, 0));
    // A single job read after its run_at reads as ready, without a claim.
    let id = w.push(
        "r",
        JobSpec {
            delay_ms: 5,
            ..JobSpec::new("x")
        },
    );
    assert_eq!(w.get(id).state, JobState::Scheduled);
    w.at(T0 + 15);
    assert_eq!(w.get(id).state, JobState::Ready);
    // run_at at the far edge (now + one year) is accepted.
    let edge = JobSpec {
        run_at: Some(leasehold::StoreMs(T0 + 15 + leasehold::core::MAX_TTL_MS)),
        ..JobSpec::new("edge")
    };
    let edge = w.push("r", edge);
    assert_eq!(w.get(edge).state, JobState::Scheduled);
}

pub fn job_hostile_queue_names(make: &Make) {
    let w = World::new(make);
    let long = "q".repeat(leasehold::core::MAX_KEY_BYTES);
    let names = [
        "it's",
        "'; DROP TABLE jobs; --",
        "a\"b",
        "../../etc",
        "очередь",
        "{queue}",
        long.as_str(),
    ];
    for (i, name) in names.iter().enumerate() {
        let id = w.push(name, JobSpec::new(vec![i as u8]));
        assert_eq!(w.stats(name), counts(1, 0, 0, 0, 0, 0), "{name:?}");
        let job = w.claim_one(name, 1, 100);
        assert_eq!((job.id, &*job.queue), (id, *name));
        w.complete(&job, 1).unwrap();
    }
    for name in names {
        assert_eq!(
            w.stats(name),
            counts(0, 0, 0, 1, 0, 0),
            "queues stay apart: {name:?}"
        );
    }
    // Payload bytes, unique keys and fail reasons come back as given.
    let payload: Vec<u8> = (0..=255u8).chain(*b"'\\$$").collect();
    let spec = JobSpec {
        unique_key: Some("u'1\\; --".into()),
        ..JobSpec::new(payload.clone())
    };
    let id = w.push("bytes", spec);
    let job = w.claim_one("bytes", 1, 100);
    assert_eq!((job.id, &*job.payload), (id, payload.as_slice()));
    let reason = "it's broken \\ $$; DROP TABLE jobs; --";
    w.fail(&job, 1, reason).unwrap();
    let job = w.get(id);
    assert_eq!(job.last_error.as_deref(), Some(reason));
    assert_eq!(job.unique_key.as_deref(), Some("u'1\\; --"));
    assert_eq!(&*w.get(id).payload, payload.as_slice());
    // Extreme priorities round-trip through every write path.
    for priority in [i32::MIN, i32::MAX, -1] {
        let id = w.push(
            "extreme",
            JobSpec {
                priority,
                ..JobSpec::new("x")
            },
        );
        let job = w.claim_one("extreme", 1, 100);
        assert_eq!((job.id, job.priority), (id, priority));
        w.fail(&job, 1, "again").unwrap();
        assert_eq!(w.get(id).priority, priority);
    }
}

/// The one drain rule: nothing ready, running, or due, where a retry in
/// backoff counts as due and a first attempt's delay does not.
pub fn job_drain_rule(make: &Make) {
    let w = World::new(make);
    let drained = |w: &World| {
        let policy = w.policy;
        w.tx(|tx| core::job::drained(tx, "q", &policy)).unwrap()
    };
    assert!(drained(&w), "an empty queue is drained");
    w.push(
        "q",
        JobSpec {
            delay_ms: 3_600_000,
            ..JobSpec::new("later")
        },
    );
    assert!(drained(&w), "a delayed first attempt does not hold a drain");
    let id = w.push(
        "q",
        JobSpec {
            max_attempts: 2,
            ..JobSpec::new("flaky")
        },
    );
    assert!(!drained(&w), "ready");
    let job = w.claim_one("q", 1, 1_000);
    assert_eq!(job.id, id);
    assert!(!drained(&w), "running");
    assert_eq!(w.fail(&job, 1, "boom").unwrap(), JobState::Scheduled);
    assert!(!drained(&w), "a retry waiting out its backoff is due");
    w.at(T0 + 10_000);
    let job = w.claim_one("q", 1, 1_000);
    w.complete(&job, 1).unwrap();
    assert!(drained(&w));
}

/// A renewal round and a completer batch: one transaction each, every job
/// decided on its own (a lost claim or a bad reason spoils nothing else).
pub fn job_batch_heartbeat_and_settle(make: &Make) {
    use leasehold::core::job::Settle;
    let w = World::new(make);
    for i in 0..5u8 {
        w.push(
            "q",
            JobSpec {
                max_attempts: 1,
                ..JobSpec::new(vec![i])
            },
        );
    }
    let jobs = w.claim("q", 1, 100, 5);
    let token = |i: usize| jobs[i].claim.unwrap().token;
    w.at(T0 + 50);
    let claims: Vec<(JobId, u64)> = (0..5).map(|i| (jobs[i].id, token(i))).collect();
    let mut with_stale = claims.clone();
    with_stale[4].1 += 7;
    let replies = w
        .tx(|tx| core::job::heartbeat_many(tx, HolderId(1), &with_stale, 100))
        .unwrap();
    assert_eq!(replies.len(), 5);
    for r in &replies[..4] {
        assert_eq!(r.as_ref().unwrap().lease_until_ms, T0 + 150);
    }
    assert_eq!(lost_reason(replies[4].clone()), LostReason::StaleToken);
    for job in &jobs[..4] {
        let claim = w.get(job.id).claim.unwrap();
        assert_eq!(claim.lease_until_ms, T0 + 150, "job {} extended", job.id);
    }
    assert_eq!(
        w.get(jobs[4].id).claim.unwrap().lease_until_ms,
        T0 + 100,
        "untouched"
    );
    let policy = w.policy;
    let settles = vec![
        (jobs[0].id, token(0), Settle::Complete),
        (jobs[1].id, token(1), Settle::Fail("boom".into())),
        (jobs[2].id, token(2), Settle::Abandon { started: false }),
        (jobs[3].id, token(3), Settle::Fail("x".repeat(5_000))),
        (jobs[4].id, token(4) + 1, Settle::Complete),
        (JobId(999), 1, Settle::Complete),
    ];
    let states = w
        .tx(|tx| core::job::settle_many(tx, HolderId(1), &settles, &policy))
        .unwrap();
    assert_eq!(states[0].as_ref().unwrap(), &JobState::Done);
    assert_eq!(
        states[1].as_ref().unwrap(),
        &JobState::Dead,
        "its only attempt"
    );
    assert_eq!(states[2].as_ref().unwrap(), &JobState::Ready, "given back");
    assert!(matches!(
        states[3],
        Err(Error::Invalid {
            field: leasehold::Field::Reason,
            ..
        })
    ));
    assert_eq!(lost_reason(states[4].clone()), LostReason::StaleToken);
    assert!(matches!(states[5], Err(Error::NotFound(_))));
    assert_eq!(
        w.get(jobs[2].id).attempts,
        0,
        "an unstarted attempt is given back"
    );
    assert_eq!(
        w.get(jobs[3].id).state,
        JobState::Running,
        "refused: unchanged"
    );
    assert_eq!(w.get(jobs[1].id).last_error.as_deref(), Some("boom"));
    // A started job given back on its last attempt is dead; with a cancel
    // asked, cancelled.
    let again = w.claim_one("q", 2, 100);
    assert_eq!(again.id, jobs[2].id);
    let t = again.claim.unwrap().token;
    assert_eq!(
        w.tx(|tx| core::job::abandon(tx, again.id, HolderId(2), t, true))
            .unwrap(),
        JobState::Dead
    );
    w.tx(|tx| core::job::cancel(tx, jobs[3].id, &policy))
        .unwrap();
    assert_eq!(
        w.tx(|tx| core::job::abandon(tx, jobs[3].id, HolderId(1), token(3), false))
            .unwrap(),
        JobState::Cancelled
    );
}

/// The batched read ([`core::JobTxn::pending`]) and the scans come in
/// their index order, limited, and only with what is due as of `now`.
pub fn job_scans_are_ordered(make: &Make) {
    let w = World::new(make);
    for i in 0..300u32 {
        let spec = JobSpec {
            priority: (i % 7) as i32,
            delay_ms: u64::from(i % 3) * 10,
            ..JobSpec::new(i.to_be_bytes().to_vec())
        };
        w.push("q", spec);
    }
    // Claims with leases of different lengths, to expire out of id order.
    let running: Vec<JobRecord> = (0..6u64)
        .map(|i| {
            let policy = w.policy;
            w.tx(|tx| core::job::claim(tx, "q", HolderId(1), 50 - i * 5, 1, &policy))
                .unwrap()
                .remove(0)
        })
        .collect();
    w.at(T0 + 20);
    let read = |now_ms: u64, chunk: usize, ready: usize| {
        w.tx(|tx| tx.jobs()?.pending("q", now_ms, chunk, ready))
            .unwrap()
    };
    let p = read(T0 + 20, 1000, 1000);
    assert!(
        p.expired.is_empty(),
        "nothing expired yet: {:?}",
        p.expired.len()
    );
    assert_eq!(
        p.due.len(),
        200,
        "the 10 ms and 20 ms delays are due at T0 + 20"
    );
    let due: Vec<_> = p.due.iter().map(|j| (j.run_at_ms, j.id)).collect();
    assert!(
        due.windows(2).all(|p| p[0] < p[1]),
        "due by run_at, then id"
    );
    assert_eq!(p.ready.len(), 94, "the undelayed jobs not claimed");
    let ranks: Vec<_> = p.ready.iter().map(JobRecord::rank).collect();
    assert!(
        ranks.windows(2).all(|p| p[0] < p[1]),
        "ready in claim order"
    );
    assert!(p.ready.iter().all(|j| j.state == JobState::Ready));
    let some = read(T0 + 20, 7, 5);
    assert_eq!((some.due.len(), some.ready.len()), (7, 5), "limits");
    assert_eq!(some.ready[..], p.ready[..5]);
    let at_10 = read(T0 + 10, 1000, 0);
    assert_eq!(
        (at_10.due.len(), at_10.ready.len()),
        (100, 0),
        "only what is due"
    );
    // Expired claims, earliest lease first.
    w.at(T0 + 60);
    let p = read(T0 + 60, 1000, 0);
    let expired: Vec<JobId> = p.expired.iter().map(|j| j.id).collect();
    let mut want: Vec<&JobRecord> = running.iter().collect();
    want.sort_by_key(|j| (j.claim.unwrap().lease_until_ms, j.id));
    assert_eq!(expired, want.iter().map(|j| j.id).collect::<Vec<_>>());
    // Up to date, the ready read is exactly the claim order.
    let policy = w.policy;
    w.tx(|tx| core::job::maintain(tx, "q", &policy)).unwrap();
    let ready: Vec<JobId> = read(T0 + 60, 1000, 1000)
        .ready
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ready.len(), 294, "the expired six wait out their backoff");
    let claimed: Vec<JobId> = w.claim("q", 1, 100, 300).iter().map(|j| j.id).collect();
    assert_eq!(claimed, ready);
    // Retries apart from first delays, earliest first.
    let mut ids = Vec::new();
    w.tx(|tx| tx.jobs()?.scan("q", JobQuery::Retrying, 100, &mut ids))
        .unwrap();
    let mut want: Vec<JobRecord> = running.iter().map(|j| w.get(j.id)).collect();
    want.sort_by_key(|j| (j.run_at_ms, j.id));
    assert_eq!(ids, want.iter().map(|j| j.id).collect::<Vec<_>>());
}

/// A settle sent again after its answer was lost finds its own outcome
/// recorded: it answers the job's state and changes nothing. An outcome
/// that is not the one recorded, or a claim that expired, is still lost.
pub fn job_settle_again_finds_its_own_outcome(make: &Make) {
    use leasehold::core::job::Settle;
    let w = World::new(make);
    let spec = |max_attempts| JobSpec {
        max_attempts,
        ..JobSpec::new("x")
    };
    let mut ids: Vec<JobId> = (0..5u32).map(|i| w.push("q", spec(1 + (i % 2)))).collect();
    // Given back after it started, on its last attempt: dead.
    ids.push(w.push("q", spec(1)));
    let jobs = w.claim("q", 1, 1_000, 6);
    let tok = |i: usize| jobs[i].claim.unwrap().token;
    let settles = vec![
        (ids[0], tok(0), Settle::Complete),
        (ids[1], tok(1), Settle::Fail("boom".into())),
        (ids[2], tok(2), Settle::Abandon { started: false }),
        (ids[3], tok(3), Settle::Abandon { started: true }),
        (
            ids[4],
            tok(4),
            Settle::CompleteWith(std::sync::Arc::from(&b"r"[..])),
        ),
        (ids[5], tok(5), Settle::Abandon { started: true }),
    ];
    let policy = w.policy;
    let first = w
        .tx(|tx| core::job::settle_many(tx, HolderId(1), &settles, &policy))
        .unwrap();
    let states: Vec<JobState> = first.into_iter().map(Result::unwrap).collect();
    assert_eq!(states[5], JobState::Dead, "its last attempt given back");
    let before: Vec<JobRecord> = ids.iter().map(|id| w.get(*id)).collect();
    w.at(T0 + 10);
    let again = w
        .tx(|tx| core::job::settle_many(tx, HolderId(1), &settles, &policy))
        .unwrap();
    let again: Vec<JobState> = again.into_iter().map(Result::unwrap).collect();
    assert_eq!(again, states, "the same answers");
    let after: Vec<JobRecord> = ids.iter().map(|id| w.get(*id)).collect();
    assert_eq!(after, before, "nothing changed");
    // One at a time too.
    w.tx(|tx| core::job::complete(tx, ids[0], HolderId(1), tok(0)))
        .unwrap();
    // Another outcome than the one recorded: lost.
    let r = w.tx(|tx| core::job::fail(tx, ids[0], HolderId(1), tok(0), "no", &policy));
    assert_eq!(lost_reason(r), LostReason::StaleToken);
    let r = w.tx(|tx| core::job::fail(tx, ids[1], HolderId(1), tok(1), "other", &policy));
    assert_eq!(lost_reason(r), LostReason::StaleToken);
    // A claim that ran out is not a recorded give-back.
    let id = w.push("q2", spec(3));
    let job = w.claim_one("q2", 1, 100);
    assert_eq!(job.id, id);
    let token = job.claim.unwrap().token;
    w.at(T0 + 10_000);
    let r = w.tx(|tx| core::job::abandon(tx, id, HolderId(1), token, true));
    assert!(matches!(r, Err(Error::Lost { .. })), "{r:?}");
}

/// A batch push: in order, in one transaction, each outcome what one push
/// would give; a refused spec (checked up front, or only when enqueued)
/// leaves nothing and is named by its place; ids stay unique and
/// increasing across batches of every size.
pub fn job_push_many_is_all_or_nothing_in_order(make: &Make) {
    let w = World::new(make);
    let policy = w.policy;
    let push_many = |specs: &[JobSpec]| w.tx(|tx| core::job::enqueue_many(tx, "q", specs, &policy));
    let unique = |payload: &str, key: &str| JobSpec {
        unique_key: Some(key.into()),
        ..JobSpec::new(payload)
    };
    let before = w.push("q", unique("old", "u"));
    let out = push_many(&[
        unique("a", "u"),
        JobSpec::new("b"),
        unique("c", "v"),
        unique("d", "v"),
    ])
    .unwrap();
    let ids: Vec<(JobId, bool)> = out.iter().map(|o| (o.id, o.created)).collect();
    assert_eq!(
        ids[0],
        (before, false),
        "an existing key blocks, as in a push"
    );
    assert!(ids[1].1 && ids[2].1 && ids[1].0 > before && ids[2].0 > ids[1].0);
    assert_eq!(ids[3], (ids[2].0, false), "a key repeated in the batch");
    let claimed: Vec<JobId> = w.claim("q", 1, 100, 10).iter().map(|j| j.id).collect();
    assert_eq!(
        claimed,
        vec![before, ids[1].0, ids[2].0],
        "claimed in push order"
    );
    let stats = w.stats("q");

    // Refused before anything is written.
    let bad = JobSpec {
        max_attempts: 0,
        ..JobSpec::new("bad")
    };
    match push_many(&[JobSpec::new("x"), JobSpec::new("y"), bad]) {
        Err(Error::Invalid { field, reason }) => {
            assert_eq!(field, leasehold::Field::MaxAttempts);
            assert!(reason.contains("job 2 of the batch"), "{reason}");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    // Refused only once its turn came, after earlier jobs were written.
    let orphan = JobSpec {
        after: vec![JobId(u64::MAX / 2)],
        ..JobSpec::new("orphan")
    };
    match push_many(&[JobSpec::new("x"), orphan]) {
        Err(Error::Invalid { reason, .. }) => {
            assert!(reason.contains("job 1 of the batch"), "{reason}")
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let too_many = vec![JobSpec::new("z"); core::MAX_BATCH + 1];
    assert!(matches!(
        push_many(&too_many),
        Err(Error::Invalid {
            field: leasehold::Field::Batch,
            ..
        })
    ));
    let heavy = vec![JobSpec::new(vec![0u8; 11 << 20]); 3];
    match push_many(&heavy) {
        Err(Error::Invalid { field, reason }) => {
            assert_eq!(field, leasehold::Field::Batch);
            assert!(reason.contains("bytes of payloads"), "{reason}");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(w.stats("q"), stats, "refused batches wrote nothing");

    // Ids unique and increasing across batches of every size up to the
    // most (a store may take ids ahead in blocks).
    let mut last = ids[2].0;
    for n in [0, 1, 3, core::MAX_BATCH, 2] {
        let out = push_many(&vec![JobSpec::new("n"); n]).unwrap();
        assert_eq!(out.len(), n);
        for o in out {
            assert!(o.created && o.id > last, "{:?} after {last:?}", o.id);
            last = o.id;
        }
    }
    // The payload cap is inclusive: two payloads of the most one job takes.
    let full = vec![JobSpec::new(vec![1u8; core::MAX_PAYLOAD_BYTES]); 2];
    assert_eq!(2 * core::MAX_PAYLOAD_BYTES, core::MAX_BATCH_PAYLOAD_BYTES);
    let out = push_many(&full).unwrap();
    assert!(out.iter().all(|o| o.created && o.id > last));
    last = out[1].id;
    let after = w.push("q", JobSpec::new("one"));
    assert!(after > last);
    assert_eq!(
        w.stats("q").get(JobState::Ready),
        (1 + 3 + core::MAX_BATCH + 2 + 2 + 1) as u64
    );
}
