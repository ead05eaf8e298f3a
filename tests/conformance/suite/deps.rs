//! Dependencies on every store (D1, D2): a job pushed after others waits
//! until they are done (fan-in), ends cancelled when one ends dead or
//! cancelled (and its own waiters with it), runs after any ending with
//! `after_any`, and is listed, counted and cancelled as `waiting`; a push
//! naming an unknown job is refused by name and writes nothing.

use super::*;

fn after(ids: &[JobId]) -> JobSpec {
    JobSpec {
        after: ids.to_vec(),
        ..JobSpec::new("child")
    }
}

fn try_push(w: &World, spec: &JobSpec) -> leasehold::Result<leasehold::EnqueueOutcome> {
    w.tx(|tx| core::job::enqueue(tx, "q", spec, &QueuePolicy::default()))
}

/// Fan-in: a job waits for all of its parents to be done, whatever the
/// order they end in, is never claimable before, and its delay still
/// counts from its push.
pub fn job_after_waits_until_every_named_job_is_done(make: &Make) {
    let w = World::new(make);
    let a = w.push("q", JobSpec::new("a"));
    let b = w.push("q", JobSpec::new("b"));
    let c = w.push(
        "q",
        JobSpec {
            after: vec![b, a, b],
            delay_ms: 500,
            ..JobSpec::new("c")
        },
    );
    let waiting = w.get(c);
    assert_eq!(waiting.state, JobState::Waiting);
    assert_eq!(
        waiting.after.as_deref(),
        Some(&[a, b][..]),
        "deduplicated, in id order"
    );
    assert_eq!(waiting.waiting_on, 2);
    assert_eq!(w.stats("q").get(JobState::Waiting), 1);
    let listed: Vec<JobId> = w
        .list("q", Some(JobState::Waiting))
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(listed, [c]);
    let page = w
        .tx(|tx| {
            core::job::page(
                tx,
                "q",
                JobState::Waiting,
                None,
                10,
                0,
                &QueuePolicy::default(),
            )
        })
        .unwrap();
    assert_eq!(page.iter().map(|p| p.job.id).collect::<Vec<_>>(), [c]);
    let claimed = w.claim("q", 1, 60_000, 10);
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        [a, b],
        "D1"
    );
    w.complete(&claimed[1], 1).unwrap();
    assert_eq!(w.get(c).state, JobState::Waiting, "one left");
    assert_eq!(w.get(c).waiting_on, 1);
    w.at(T0 + 100);
    w.complete(&claimed[0], 1).unwrap();
    assert_eq!(
        w.get(c).state,
        JobState::Scheduled,
        "D2: decided with the last ending; its delay runs"
    );
    w.at(T0 + 500);
    let job = w.claim_one("q", 1, 60_000);
    assert_eq!(job.id, c);
    w.complete(&job, 1).unwrap();
    assert_eq!(w.stats("q"), counts(0, 0, 0, 3, 0, 0));
}

/// A parent that ends dead cancels its waiting children, and theirs,
/// naming it; `after_any` runs anyway; cancelling a waiting job cancels
/// its own waiters.
pub fn job_after_a_failed_parent_cancels_its_waiters(make: &Make) {
    let w = World::new(make);
    let a = w.push(
        "q",
        JobSpec {
            max_attempts: 1,
            ..JobSpec::new("a")
        },
    );
    let child = w.push("q", after(&[a]));
    let grandchild = w.push("q", after(&[child]));
    let anyway = w.push(
        "q",
        JobSpec {
            after_any: true,
            ..after(&[a])
        },
    );
    let job = w.claim_one("q", 1, 60_000);
    assert_eq!(w.fail(&job, 1, "boom").unwrap(), JobState::Dead);
    for id in [child, grandchild] {
        let j = w.get(id);
        assert_eq!(j.state, JobState::Cancelled, "job {id}");
        assert!(j.finished_at_ms.is_some());
    }
    assert_eq!(
        w.get(child).last_error.as_deref(),
        Some(&*format!("job {a} it ran after ended dead"))
    );
    assert_eq!(
        w.get(grandchild).last_error.as_deref(),
        Some(&*format!("job {child} it ran after ended cancelled"))
    );
    assert_eq!(
        w.get(anyway).state,
        JobState::Ready,
        "after_any runs anyway"
    );
    // Cancelling a waiting job cancels it, and its waiters, at once.
    let b = w.push("q", JobSpec::new("b"));
    let x = w.push("q", after(&[b]));
    let y = w.push("q", after(&[x]));
    let cancelled = w.tx(|tx| core::job::cancel(tx, x, &QueuePolicy::default()));
    assert_eq!(cancelled.unwrap(), JobState::Cancelled);
    assert_eq!(w.get(y).state, JobState::Cancelled);
    // Retried, it waits again for what is not done yet (b still is not).
    w.tx(|tx| core::job::retry(tx, x, &QueuePolicy::default()))
        .unwrap();
    assert_eq!(
        (w.get(x).state, w.get(x).waiting_on),
        (JobState::Waiting, 1)
    );
    // A retried job whose named job was purged since counts it as ended.
    let p = w.push("q2", JobSpec::new("p"));
    let c = w
        .tx(|tx| core::job::enqueue(tx, "q2", &after(&[p]), &QueuePolicy::default()))
        .unwrap()
        .id;
    let job = w.claim_one("q2", 1, 60_000);
    w.complete(&job, 1).unwrap();
    w.at(T0 + 10);
    w.tx(|tx| core::job::cancel(tx, c, &QueuePolicy::default()))
        .unwrap();
    // The oldest finished: p, not c.
    let purged = w.tx(|tx| core::job::purge(tx, "q2", 0, 1, &QueuePolicy::default()));
    assert_eq!(purged.unwrap(), 1);
    w.tx(|tx| core::job::retry(tx, c, &QueuePolicy::default()))
        .unwrap();
    assert_eq!(w.get(c).state, JobState::Ready);
    // Pushed after jobs that already ended: done runs at once, dead cancels
    // at once, dead with after_any runs.
    let done = {
        let d = w.push("q", JobSpec::new("d"));
        let mut jobs = w.claim("q", 1, 60_000, 10);
        let j = jobs.iter().position(|j| j.id == d).unwrap();
        w.complete(&jobs.remove(j), 1).unwrap();
        d
    };
    assert_eq!(w.get(w.push("q", after(&[done]))).state, JobState::Ready);
    let late = w.get(w.push("q", after(&[done, a])));
    assert_eq!(late.state, JobState::Cancelled);
    assert_eq!(
        late.last_error.as_deref(),
        Some(&*format!("job {a} it ran after ended dead"))
    );
    let spec = JobSpec {
        after_any: true,
        ..after(&[a])
    };
    assert_eq!(w.get(w.push("q", spec)).state, JobState::Ready);
}

/// Only jobs that exist can be named; bad input changes nothing; a
/// waiting job blocks a second push of its unique key.
pub fn job_after_checks_its_input_and_blocks_its_unique_key(make: &Make) {
    let w = World::new(make);
    let a = w.push("q", JobSpec::new("a"));
    let before = w.snapshot(&[], &["q"]);
    let e = try_push(&w, &after(&[a, JobId(987_654)])).unwrap_err();
    assert!(
        matches!(&e, Error::Invalid { field, reason } if field.to_string() == "after" && reason.contains("987654")),
        "{e}"
    );
    let e = try_push(
        &w,
        &JobSpec {
            after_any: true,
            ..JobSpec::new("x")
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    let many: Vec<JobId> = (0..=leasehold::core::job::MAX_AFTER as u64)
        .map(JobId)
        .collect();
    assert!(matches!(
        try_push(&w, &after(&many)),
        Err(Error::Invalid { .. })
    ));
    assert_eq!(w.snapshot(&[], &["q"]), before, "nothing written");
    let unique = JobSpec {
        unique_key: Some("k".into()),
        ..after(&[a])
    };
    let first = try_push(&w, &unique).unwrap();
    assert!(first.created);
    let again = try_push(&w, &unique).unwrap();
    assert_eq!(
        (again.id, again.created),
        (first.id, false),
        "waiting is live"
    );
}

/// A chain of 300 waiting jobs (each after the two before it) is read in
/// one walk and ended in one transaction when its
/// root fails: every job of it cancelled, none left waiting.
pub fn job_after_chains_end_in_one_transaction(make: &Make) {
    let w = World::new(make);
    let root = w.push(
        "q",
        JobSpec {
            max_attempts: 1,
            ..JobSpec::new("root")
        },
    );
    let mut ids = vec![root];
    for _ in 0..300 {
        let last = ids[ids.len() - 1];
        let mut names = vec![last];
        // Two parents each: a walk without its visited set would read
        // the chain's early jobs a Fibonacci number of times.
        if ids.len() > 1 {
            names.push(ids[ids.len() - 2]);
        }
        ids.push(w.push("q", after(&names)));
    }
    let tail = *ids.last().unwrap();
    assert_eq!(w.get(tail).state, JobState::Waiting);
    assert_eq!(w.stats("q").get(JobState::Waiting), 300);
    let job = w.claim_one("q", 1, 1_000);
    // Its claim runs out: the chain is decided when that is written, and
    // a read of the tail is as fresh as its root.
    w.at(T0 + 1_000);
    assert_eq!(w.get(tail).state, JobState::Cancelled);
    assert_eq!(w.stats("q"), counts(0, 0, 0, 0, 1, 300));
    drop(job);
}
