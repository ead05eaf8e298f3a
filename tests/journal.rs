//! A transaction's journal, as the rules fill it: one event per transition
//! (key or job id, token, attempt, and what happened) and the wake-ups the
//! transaction causes. Tracing, metrics and the idle workers' and blocked
//! acquirers' wake-ups are all built from it, so each rule's entry is
//! pinned here, on the mem store with a manual clock.

use leasehold::core::{self, Event, JobChange, LeaseChange, Txn, Wake};
use leasehold::{
    Holder, HolderId, JobId, JobSpec, JobState, ManualClock, MemStore, QueuePolicy, Result,
    StoreExt,
};
use std::sync::Arc;

const T0: u64 = 1_000_000;
const Q: &str = "q";

fn policy(quarantine_expiries: u32) -> QueuePolicy {
    QueuePolicy {
        backoff_base_ms: 1000,
        backoff_max_ms: 60_000,
        jitter_seed: 7,
        quarantine_expiries,
    }
}

struct World {
    clock: ManualClock,
    store: MemStore,
    policy: QueuePolicy,
}

/// What one transaction recorded: its result, its events, its wake-ups.
struct Journaled<R> {
    value: R,
    events: Vec<Event>,
    woke: [bool; 2],
}

impl World {
    fn new(quarantine_expiries: u32) -> World {
        let clock = ManualClock::new(T0);
        let store = MemStore::with_clock(Arc::new(clock.clone()));
        World {
            clock,
            store,
            policy: policy(quarantine_expiries),
        }
    }

    fn tx<R>(&self, recording: bool, mut f: impl FnMut(&mut dyn Txn) -> Result<R>) -> Journaled<R> {
        self.store
            .txn(|tx| {
                tx.journal().set_recording(recording);
                let value = f(tx)?;
                let journal = tx.journal();
                Ok(Journaled {
                    value,
                    events: journal.take_events(),
                    woke: journal.woke(),
                })
            })
            .unwrap()
    }

    fn push(&self, spec: JobSpec) -> JobId {
        let p = self.policy;
        self.tx(false, |tx| core::job::enqueue(tx, Q, &spec, &p))
            .value
            .id
    }

    /// Claim the one ready job (lease 1 s) as holder 1: its id and token.
    fn claim(&self) -> (JobId, u64) {
        let p = self.policy;
        let jobs = self
            .tx(false, |tx| {
                core::job::claim(tx, Q, HolderId(1), 1000, 1, &p)
            })
            .value;
        let job = jobs.first().expect("a job to claim");
        (job.id, job.claim.unwrap().token)
    }
}

fn job(id: JobId, token: u64, attempt: u32, change: JobChange) -> Event {
    Event::Job {
        queue: Arc::from(Q),
        id,
        token,
        attempt,
        change,
    }
}

const READY: usize = Wake::JobReady as usize;
const FREED: usize = Wake::LeaseFreed as usize;

#[test]
fn nothing_is_recorded_unless_asked() {
    let w = World::new(0);
    let p = w.policy;
    let j = w.tx(false, |tx| {
        core::job::enqueue(tx, Q, &JobSpec::new("x"), &p)
    });
    assert!(j.events.is_empty(), "{:?}", j.events);
    // The wake-up is not an event: it is kept either way.
    assert!(j.woke[READY]);
}

#[test]
fn a_push_wakes_idle_workers_delayed_or_not_and_a_claim_does_not() {
    let w = World::new(0);
    let p = w.policy;
    let ready = w.tx(true, |tx| core::job::enqueue(tx, Q, &JobSpec::new("x"), &p));
    let id = ready.value.id;
    assert_eq!(ready.events, vec![job(id, 0, 0, JobChange::Enqueued)]);
    assert_eq!(ready.woke, [false, true]);
    let mut later = JobSpec::new("y");
    later.delay_ms = 5000;
    let delayed = w.tx(true, |tx| core::job::enqueue(tx, Q, &later, &p));
    assert_eq!(
        delayed.events,
        vec![job(delayed.value.id, 0, 0, JobChange::Enqueued)]
    );
    // A scheduled job changes when the queue next changes by time: idle
    // workers read it again rather than poll for it.
    assert_eq!(delayed.woke, [false, true], "a scheduled job wakes workers");
    // A claim wakes nobody: where transactions run one at a time an
    // empty claim after it sees it (where claims overlap, an empty claim
    // that passed over it looks again soon: `tests/postgres.rs`), and an
    // empty one never.
    let claimed = w.tx(true, |tx| core::job::claim(tx, Q, HolderId(1), 1000, 1, &p));
    assert_eq!(claimed.value.len(), 1);
    assert!(!claimed.woke[READY]);
    let empty = w.tx(true, |tx| core::job::claim(tx, Q, HolderId(1), 1000, 1, &p));
    assert!(empty.value.is_empty());
    assert_eq!(empty.woke, [false, false]);
}

#[test]
fn a_claim_a_heartbeat_and_a_completion_are_recorded_with_token_and_attempt() {
    let w = World::new(0);
    let p = w.policy;
    let id = w.push(JobSpec::new("x"));
    w.clock.advance(250);
    let claimed = w.tx(true, |tx| core::job::claim(tx, Q, HolderId(1), 1000, 1, &p));
    let token = claimed.value[0].claim.unwrap().token;
    assert_eq!(
        claimed.events,
        vec![job(id, token, 1, JobChange::Claimed { wait_ms: 250 })]
    );
    let beat = w.tx(true, |tx| {
        core::job::heartbeat(tx, id, HolderId(1), token, 1000)
    });
    assert_eq!(beat.events, vec![job(id, token, 1, JobChange::Heartbeat)]);
    let done = w.tx(true, |tx| core::job::complete(tx, id, HolderId(1), token));
    assert_eq!(done.events, vec![job(id, token, 1, JobChange::Completed)]);
    assert!(!done.woke[READY]);
}

#[test]
fn a_failure_is_followed_by_where_it_left_the_job() {
    let w = World::new(0);
    let p = w.policy;
    let mut spec = JobSpec::new("x");
    spec.max_attempts = 2;
    let id = w.push(spec);
    let (_, token) = w.claim();
    let failed = w.tx(true, |tx| {
        core::job::fail(tx, id, HolderId(1), token, "boom", &p)
    });
    assert_eq!(failed.value, JobState::Scheduled);
    let delay = core::backoff_ms(&p, id, 1);
    assert_eq!(
        failed.events,
        vec![
            job(id, token, 1, JobChange::Failed),
            job(id, token, 1, JobChange::Retried { delay_ms: delay }),
        ]
    );
    w.clock.advance(delay);
    let (_, token) = w.claim();
    let last = w.tx(true, |tx| {
        core::job::fail(tx, id, HolderId(1), token, "boom", &p)
    });
    assert_eq!(last.value, JobState::Dead);
    assert_eq!(
        last.events,
        vec![
            job(id, token, 2, JobChange::Failed),
            job(id, token, 2, JobChange::Dead),
        ]
    );
    // A dead job retried by hand is ready at once: recorded, and it wakes.
    let retried = w.tx(true, |tx| core::job::retry(tx, id, &p));
    assert_eq!(
        retried.events,
        vec![job(id, token, 0, JobChange::Retried { delay_ms: 0 })]
    );
    assert!(retried.woke[READY]);
}

/// A claim that runs out: `Expired`, then what the expiry left: a retry
/// after backoff, dead (no attempt left), or quarantined (a crash loop).
fn expiry(quarantine_expiries: u32, max_attempts: u32) -> (JobId, u64, Vec<Event>) {
    let w = World::new(quarantine_expiries);
    let p = w.policy;
    let mut spec = JobSpec::new("x");
    spec.max_attempts = max_attempts;
    let id = w.push(spec);
    let (_, token) = w.claim();
    w.clock.advance(1000);
    let events = w.tx(true, |tx| core::job::maintain(tx, Q, &p)).events;
    (id, token, events)
}

#[test]
fn an_expiry_is_followed_by_a_retry_a_death_or_a_quarantine() {
    let (id, token, events) = expiry(0, 3);
    let delay = core::backoff_ms(&policy(0), id, 1);
    assert_eq!(
        events,
        vec![
            job(id, token, 1, JobChange::Expired),
            job(id, token, 1, JobChange::Retried { delay_ms: delay }),
        ]
    );
    let (id, token, events) = expiry(0, 1);
    assert_eq!(
        events,
        vec![
            job(id, token, 1, JobChange::Expired),
            job(id, token, 1, JobChange::Dead),
        ]
    );
    let (id, token, events) = expiry(1, 3);
    assert_eq!(
        events,
        vec![
            job(id, token, 1, JobChange::Expired),
            job(id, token, 1, JobChange::Quarantined),
        ]
    );
}

#[test]
fn a_cancel_and_a_give_back_are_recorded() {
    let w = World::new(0);
    let p = w.policy;
    let id = w.push(JobSpec::new("x"));
    let cancelled = w.tx(true, |tx| core::job::cancel(tx, id, &p));
    assert_eq!(cancelled.value, JobState::Cancelled);
    assert_eq!(cancelled.events, vec![job(id, 0, 0, JobChange::Cancelled)]);
    let id = w.push(JobSpec::new("y"));
    let (_, token) = w.claim();
    let back = w.tx(true, |tx| {
        core::job::abandon(tx, id, HolderId(1), token, false)
    });
    assert_eq!(back.value, JobState::Ready);
    assert_eq!(back.events, vec![job(id, token, 0, JobChange::Abandoned)]);
    assert!(back.woke[READY], "a job given back is ready for the others");
}

#[test]
fn lease_grants_renewals_and_releases_are_recorded_and_a_release_wakes() {
    let w = World::new(0);
    let holder = Holder {
        id: HolderId(9),
        label: None,
    };
    let granted = w.tx(true, |tx| core::lease::acquire(tx, "k", &holder, 3000, 1));
    let token = granted.value.token;
    let event = |change| Event::Lease {
        key: Arc::from("k"),
        holder: HolderId(9),
        token,
        change,
    };
    assert_eq!(
        granted.events,
        vec![event(LeaseChange::Granted { ttl_ms: 3000 })]
    );
    assert!(!granted.woke[FREED]);
    let renewed = w.tx(true, |tx| {
        core::lease::renew(tx, "k", HolderId(9), token, 4000)
    });
    assert_eq!(
        renewed.events,
        vec![event(LeaseChange::Renewed { ttl_ms: 4000 })]
    );
    let released = w.tx(true, |tx| core::lease::release(tx, "k", HolderId(9), token));
    assert_eq!(released.events, vec![event(LeaseChange::Released)]);
    assert_eq!(released.woke, [true, false]);
}

#[test]
fn expired_slots_are_recorded_when_a_grant_or_a_release_removes_them() {
    let w = World::new(0);
    let holder = |id| Holder {
        id: HolderId(id),
        label: None,
    };
    let event = |id, token, change| Event::Lease {
        key: Arc::from("k"),
        holder: HolderId(id),
        token,
        change,
    };
    // Two slots of a counting lease: holder 1's ends first.
    let acquire = |id, ttl| {
        w.tx(true, |tx| {
            core::lease::acquire(tx, "k", &holder(id), ttl, 2)
        })
    };
    let short = acquire(1, 1_000).value.token;
    let long = acquire(2, 30_000).value.token;
    w.clock.advance(2_000);
    let third = acquire(3, 10_000);
    assert_eq!(
        third.events,
        vec![
            event(1, short, LeaseChange::Expired),
            event(
                3,
                third.value.token,
                LeaseChange::Granted { ttl_ms: 10_000 }
            ),
        ],
        "only the slot that ended is recorded expired"
    );
    // An acquire of one's own live slot is a renewal (it never shortens).
    let again = acquire(3, 5_000);
    assert_eq!(again.value.expires_at_ms, third.value.expires_at_ms);
    assert_eq!(
        again.events,
        vec![event(
            3,
            third.value.token,
            LeaseChange::Renewed { ttl_ms: 5_000 }
        )]
    );
    w.clock.advance(11_000);
    // Holder 3's slot has ended too; holder 2 releases and both go.
    let released = w.tx(true, |tx| core::lease::release(tx, "k", HolderId(2), long));
    assert_eq!(
        released.events,
        vec![
            event(3, third.value.token, LeaseChange::Expired),
            event(2, long, LeaseChange::Released),
        ]
    );
}

#[test]
fn a_schedules_ticks_are_recorded_enqueued_caught_up_or_skipped() {
    use core::schedule::{self, TickChange};
    use core::{Missed, Rule, ScheduleSpec};
    let w = World::new(0);
    let wall = 1_768_478_400_000; // a multiple of 10 s
    for (name, missed) in [("skip", Missed::Skip), ("catch", Missed::CatchUp)] {
        let spec = ScheduleSpec {
            name: name.into(),
            rule: Rule::every(10_000),
            job: JobSpec::new("tick"),
            missed,
        };
        w.tx(false, |tx| {
            schedule::put(tx, Q, &spec, leasehold::WallMs(wall))
        });
    }
    // Two minutes later: the ticks at 10 s to 50 s are missed (one event
    // each schedule), the seven from 60 s to 120 s on time.
    let p = w.policy;
    let fired = w.tx(true, |tx| {
        schedule::fire(tx, Q, leasehold::WallMs(wall + 120_000), &p)
    });
    let ticks: Vec<(String, u64, TickChange)> = fired
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Tick {
                queue,
                schedule,
                tick_ms,
                change,
            } => {
                assert_eq!(&**queue, Q);
                Some((schedule.to_string(), tick_ms - wall, *change))
            }
            _ => None,
        })
        .collect();
    let jobs: Vec<JobId> = fired.value.enqueued.iter().map(|e| e.2).collect();
    // The seven on-time ticks of `name`, whose jobs start at `jobs[first]`.
    let on_time = |name: &str, first: usize| -> Vec<(String, u64, TickChange)> {
        (60_000..=120_000)
            .step_by(10_000)
            .enumerate()
            .map(|(i, t)| {
                let change = TickChange::Enqueued {
                    id: jobs[first + i],
                    catch_up: false,
                };
                (name.to_string(), t, change)
            })
            .collect()
    };
    let caught_up = TickChange::Enqueued {
        id: jobs[0],
        catch_up: true,
    };
    let mut expected = vec![("catch".to_string(), 10_000, caught_up)];
    expected.extend(on_time("catch", 1));
    expected.push(("skip".into(), 10_000, TickChange::Skipped));
    expected.extend(on_time("skip", 8));
    assert_eq!(ticks, expected);
    // Each created job is recorded too, and wakes the workers.
    let enqueued = fired
        .events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::Job {
                    change: JobChange::Enqueued,
                    ..
                }
            )
        })
        .count();
    assert_eq!(enqueued, 15);
    assert!(fired.woke[READY]);
}
