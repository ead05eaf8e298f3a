//! Uniqueness by period and by state on every store: which job with a
//! spec's unique key blocks a push (and is answered instead), checked
//! like any input.

use super::*;
use leasehold::core::StateSet;
use std::time::Duration;

fn unique(key: &str) -> JobSpec {
    JobSpec {
        unique_key: Some(key.into()),
        ..JobSpec::new("x")
    }
}

fn push(w: &World, spec: &JobSpec) -> leasehold::Result<leasehold::EnqueueOutcome> {
    w.tx(|tx| core::job::enqueue(tx, "q", spec, &QueuePolicy::default()))
}

/// With a period, a job with the key pushed within it blocks whatever
/// became of it (done, dead, cancelled), and stops blocking when the
/// period has passed since it was pushed.
pub fn job_unique_for_blocks_within_the_period_whatever_the_state(make: &Make) {
    let w = World::new(make);
    let spec = JobSpec {
        unique_for: Some(Duration::from_millis(1_000)),
        ..unique("daily")
    };
    let first = push(&w, &spec).unwrap();
    assert!(first.created);
    let job = w.claim_one("q", 1, 60_000);
    w.complete(&job, 1).unwrap();
    w.at(T0 + 999);
    let again = push(&w, &spec).unwrap();
    assert_eq!(
        (again.id, again.created),
        (first.id, false),
        "done, but within the period"
    );
    let plain = push(&w, &unique("daily")).unwrap();
    assert!(plain.created, "without a period a done job blocks nothing");
    w.at(T0 + 1_000);
    let cancelled = w.tx(|tx| core::job::cancel(tx, plain.id, &QueuePolicy::default()));
    assert!(cancelled.is_ok());
    let later = push(&w, &spec).unwrap();
    assert_eq!(
        (later.id, later.created),
        (plain.id, false),
        "the second job, pushed at T0 + 999, still blocks"
    );
    w.at(T0 + 1_999);
    assert!(push(&w, &spec).unwrap().created, "both pushed a period ago");
}

/// States say in which states a job with the key blocks: with `ready,
/// scheduled`, a running job lets a second one be pushed (one waiting
/// behind one running), and the second blocks a third.
pub fn job_unique_states_say_which_states_block(make: &Make) {
    let w = World::new(make);
    let states = StateSet::of(&[JobState::Ready, JobState::Scheduled]);
    let spec = JobSpec {
        unique_states: Some(states),
        ..unique("sync")
    };
    let first = push(&w, &spec).unwrap();
    assert_eq!(push(&w, &spec).unwrap().id, first.id, "ready blocks");
    let running = w.claim_one("q", 1, 1_000);
    let second = push(&w, &spec).unwrap();
    assert!(second.created, "running does not block: {second:?}");
    assert_eq!(push(&w, &spec).unwrap().id, second.id);
    assert_eq!(
        push(&w, &unique("sync")).unwrap().id,
        second.id,
        "the default (live states) finds a live one"
    );
    // A claim that ran out is judged as it is now: ready again, it blocks.
    let second_job = w.claim_one("q", 2, 60_000);
    assert_eq!(second_job.id, second.id);
    w.at(T0 + 1_000);
    let after = push(&w, &spec).unwrap();
    assert_eq!(
        after.id, running.id,
        "the expired claim made it ready again"
    );
    assert!(!after.created);
    // Only terminal states: a live job does not block, a done one does.
    let done_only = JobSpec {
        unique_states: Some(StateSet::of(&[JobState::Done])),
        ..unique("once")
    };
    let a = push(&w, &done_only).unwrap();
    assert!(
        push(&w, &done_only).unwrap().created,
        "ready does not block"
    );
    let policy = QueuePolicy::default();
    let job = w
        .tx(|tx| core::job::claim(tx, "q", leasehold::HolderId(3), 60_000, 10, &policy))
        .unwrap()
        .into_iter()
        .find(|j| j.id == a.id)
        .expect("a claimed");
    w.complete(&job, 3).unwrap();
    assert_eq!(push(&w, &done_only).unwrap().id, a.id, "done blocks");
}

/// Uniqueness options are checked like any input and name the cause.
pub fn job_unique_options_check_their_input(make: &Make) {
    let w = World::new(make);
    let field_of = |spec: &JobSpec| match push(&w, spec) {
        Err(Error::Invalid { field, .. }) => Some(field),
        other => panic!("{spec:?}: {other:?}"),
    };
    let keyless = JobSpec {
        unique_for: Some(Duration::from_secs(1)),
        ..JobSpec::new("x")
    };
    assert_eq!(field_of(&keyless), Some(leasehold::Field::UniqueKey));
    for period in [Duration::ZERO, Duration::from_secs(366 * 24 * 3600)] {
        let spec = JobSpec {
            unique_for: Some(period),
            ..unique("k")
        };
        assert_eq!(field_of(&spec), Some(leasehold::Field::UniqueFor));
    }
    let none = JobSpec {
        unique_states: Some(StateSet::default()),
        ..unique("k")
    };
    assert_eq!(field_of(&none), Some(leasehold::Field::UniqueStates));
    assert_eq!(w.stats("q").total(), 0, "nothing was pushed");
}
