//! When a worker fires its queue's schedules: at the tick the store
//! reported, at least every `fire_ms`, one at a time, never after
//! shutdown; jobs it enqueued are claimed at once.

use super::worker::{drain, job, requests, worker};
use super::*;

fn firing(fire_ms: u64) -> WorkerConfig {
    WorkerConfig {
        fire_ms,
        ..worker(1, 0, 1)
    }
}

fn fires(a: &[WorkerAction]) -> usize {
    requests(a)
        .iter()
        .filter(|r| **r == WorkerRequest::Fire)
        .count()
}

fn report(enqueued: usize, next_in_ms: Option<u64>) -> WorkerReply {
    WorkerReply::Fired(Ok(FireReport {
        enqueued,
        next_in_ms,
        jobs: Vec::new(),
    }))
}

#[test]
fn fires_at_the_next_tick_or_the_poll_interval_whichever_is_first() {
    let mut m = WorkerMachine::new(firing(5_000), LocalMs(0));
    let a = drain(&mut m);
    assert_eq!(fires(&a), 1, "fires at once: {a:?}");
    m.handle_reply(LocalMs(0), WorkerReply::Claimed(Ok(vec![])));
    drain(&mut m);
    m.handle_timeout(LocalMs(10));
    assert_eq!(fires(&drain(&mut m)), 0, "one fire in flight");
    m.handle_reply(LocalMs(20), report(0, Some(1_200)));
    assert!(m.poll_timeout().unwrap() <= LocalMs(1_220));
    m.handle_timeout(LocalMs(1_219));
    assert_eq!(fires(&drain(&mut m)), 0, "not before the tick");
    m.handle_timeout(LocalMs(1_220));
    assert_eq!(fires(&drain(&mut m)), 1);
    // No schedules (or a tick far away): look again after the interval.
    m.handle_reply(LocalMs(1_230), report(0, None));
    m.handle_timeout(LocalMs(6_229));
    assert_eq!(fires(&drain(&mut m)), 0);
    m.handle_timeout(LocalMs(6_230));
    assert_eq!(fires(&drain(&mut m)), 1);
    m.handle_reply(LocalMs(6_240), report(0, Some(3_600_000)));
    m.handle_timeout(LocalMs(11_240));
    assert_eq!(
        fires(&drain(&mut m)),
        1,
        "an hour away: still looks every 5 s"
    );
}

#[test]
fn a_failed_fire_is_retried_with_a_growing_backoff() {
    let mut m = WorkerMachine::new(firing(5_000), LocalMs(0));
    drain(&mut m);
    let busy = || WorkerReply::Fired(Err(Error::transient("firing", "busy")));
    let mut now = LocalMs(0);
    let mut waits = Vec::new();
    for n in 0..14u32 {
        m.handle_reply(now, busy());
        drain(&mut m);
        let failed_at = now;
        loop {
            now += 1;
            m.handle_timeout(now);
            if fires(&drain(&mut m)) == 1 {
                break;
            }
            assert!(now - failed_at <= 5_000, "retry {n} never came");
        }
        let wait = now - failed_at;
        // Equal jitter around a doubling ceiling, capped by the poll.
        let ceiling = (1u64 << n).min(5_000);
        assert!(
            (ceiling / 2).max(1) <= wait && wait <= ceiling,
            "retry {n} after {wait} ms, ceiling {ceiling}"
        );
        waits.push(wait);
    }
    assert!(waits[13] > waits[3] * 100, "it grows: {waits:?}");
}

#[test]
fn jobs_a_fire_enqueued_are_claimed_at_once() {
    let mut m = WorkerMachine::new(firing(5_000), LocalMs(0));
    // Empty claims back off (the fire stays in flight meanwhile)...
    let mut now = LocalMs(0);
    for _ in 0..10 {
        if requests(&drain(&mut m)).contains(&WorkerRequest::Claim { max: 1 }) {
            m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
        }
        now = m.poll_timeout().unwrap();
        m.handle_timeout(now);
    }
    assert!(requests(&drain(&mut m)).contains(&WorkerRequest::Claim { max: 1 }));
    m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
    assert!(m.poll_timeout().unwrap() > now + 10, "backing off");
    // ...but a fire that enqueued a job claims without waiting it out.
    m.handle_reply(now, report(1, Some(1_000)));
    let a = drain(&mut m);
    assert!(
        requests(&a).contains(&WorkerRequest::Claim { max: 1 }),
        "{a:?}"
    );
    m.handle_reply(LocalMs(2), WorkerReply::Claimed(Ok(vec![job(1, 1)])));
    assert_eq!(m.held(), 1);
}

#[test]
fn a_fire_that_enqueued_nothing_leaves_the_claim_backoff_alone() {
    let mut m = WorkerMachine::new(firing(5_000), LocalMs(0));
    let mut now = LocalMs(0);
    for _ in 0..10 {
        if requests(&drain(&mut m)).contains(&WorkerRequest::Claim { max: 1 }) {
            m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
        }
        now = m.poll_timeout().unwrap();
        m.handle_timeout(now);
    }
    assert!(requests(&drain(&mut m)).contains(&WorkerRequest::Claim { max: 1 }));
    m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
    let backoff = m.poll_timeout().unwrap();
    assert!(backoff > now + 10, "backing off");
    m.handle_reply(now, report(0, Some(1_000)));
    assert!(
        !requests(&drain(&mut m)).contains(&WorkerRequest::Claim { max: 1 }),
        "nothing new to claim"
    );
    assert_eq!(m.poll_timeout(), Some(backoff), "the backoff stands");
}

#[test]
fn off_never_fires_and_shutdown_stops_firing() {
    let mut m = WorkerMachine::new(firing(0), LocalMs(0));
    assert_eq!(fires(&drain(&mut m)), 0);
    m.handle_timeout(LocalMs(1_000_000));
    assert_eq!(fires(&drain(&mut m)), 0);

    let mut m = WorkerMachine::new(firing(1_000), LocalMs(0));
    drain(&mut m);
    m.handle_reply(LocalMs(0), report(0, Some(100)));
    m.shutdown(LocalMs(50), LocalMs(50));
    m.handle_timeout(LocalMs(100));
    assert_eq!(fires(&drain(&mut m)), 0, "no fire after shutdown");
}

#[test]
fn a_draining_worker_waits_for_its_fire_before_it_finishes() {
    let mut m = WorkerMachine::new(
        WorkerConfig {
            drain: true,
            ..firing(5_000)
        },
        LocalMs(0),
    );
    let a = drain(&mut m);
    assert_eq!(fires(&a), 1);
    m.handle_reply(LocalMs(0), WorkerReply::Claimed(Ok(vec![])));
    let a = drain(&mut m);
    assert!(requests(&a).contains(&WorkerRequest::DrainCheck), "{a:?}");
    m.handle_reply(LocalMs(1), WorkerReply::Drained(Ok(true)));
    assert!(!m.is_finished(), "the fire may have enqueued a job");
    m.handle_reply(LocalMs(2), report(1, Some(1_000)));
    let a = drain(&mut m);
    assert!(requests(&a).contains(&WorkerRequest::Claim { max: 1 }));
}

/// A worker on a store that announces changes (30 s idle wait, a look at
/// the schedules every 5 s while busy), its first fire in flight and its
/// first claim answered empty: quiet.
fn quiet_announced() -> WorkerMachine {
    let cfg = WorkerConfig {
        announced: true,
        idle_max_ms: 30_000,
        ..firing(5_000)
    };
    let mut m = WorkerMachine::new(cfg, LocalMs(0));
    assert_eq!(fires(&drain(&mut m)), 1);
    m.handle_reply(LocalMs(0), WorkerReply::Claimed(Ok(vec![])));
    drain(&mut m);
    m
}

#[test]
fn a_quiet_worker_on_an_announcing_store_looks_at_its_schedules_when_woken() {
    let mut m = quiet_announced();
    // No schedule (or one far away): idle, it looks again at the idle
    // wait, not every 5 s.
    m.handle_reply(LocalMs(10), report(0, None));
    assert!(m.poll_timeout().unwrap() > LocalMs(5_010));
    m.handle_timeout(LocalMs(5_010));
    assert_eq!(fires(&drain(&mut m)), 0);
    // A wake-up (a schedule put elsewhere announces itself): a fire now.
    m.wake(LocalMs(6_000));
    let a = drain(&mut m);
    assert_eq!(fires(&a), 1, "{a:?}");
    m.handle_reply(LocalMs(6_010), report(0, Some(700)));
    assert_eq!(m.poll_timeout(), Some(LocalMs(6_710)));
    // The wake-up sent a claim too: it brings a job. A fire answered
    // while the worker holds it looks again within 5 s, not 30.
    m.handle_reply(LocalMs(6_011), WorkerReply::Claimed(Ok(vec![job(1, 1)])));
    drain(&mut m);
    m.handle_timeout(LocalMs(6_710));
    assert_eq!(fires(&drain(&mut m)), 1, "the tick");
    m.handle_reply(LocalMs(6_720), report(0, None));
    m.handle_timeout(LocalMs(11_719));
    assert_eq!(fires(&drain(&mut m)), 0);
    m.handle_timeout(LocalMs(11_720));
    assert_eq!(fires(&drain(&mut m)), 1, "busy: every 5 s");
}

#[test]
fn a_wake_up_during_a_fire_brings_the_next_fire_forward_but_not_closer_than_a_second() {
    let mut m = quiet_announced();
    // A put announced while the fire is in flight (it may have read the
    // schedules before): the answer does not push the next fire 30 s
    // away, but to a second after the last.
    m.wake(LocalMs(100));
    assert_eq!(
        requests(&drain(&mut m)),
        [WorkerRequest::Claim { max: 1 }],
        "a claim; the fire is in flight"
    );
    m.handle_reply(LocalMs(150), WorkerReply::Claimed(Ok(vec![])));
    m.handle_reply(LocalMs(200), report(0, None));
    m.handle_timeout(LocalMs(999));
    assert_eq!(fires(&drain(&mut m)), 0, "not closer than a second");
    m.handle_timeout(LocalMs(1_000));
    assert_eq!(fires(&drain(&mut m)), 1);
    m.handle_reply(LocalMs(1_010), report(0, None));
    // A storm of wake-ups: a fire a second at most.
    let mut fired = 0;
    for t in (1_020..6_000).step_by(10) {
        m.wake(LocalMs(t));
        let a = drain(&mut m);
        fired += fires(&a);
        // Answer every claim and fire at once.
        for r in requests(&a) {
            match r {
                WorkerRequest::Claim { .. } => {
                    m.handle_reply(LocalMs(t), WorkerReply::Claimed(Ok(vec![])))
                }
                WorkerRequest::Fire => m.handle_reply(LocalMs(t), report(0, None)),
                _ => {}
            }
        }
        drain(&mut m);
    }
    assert!((4..=5).contains(&fired), "{fired} fires in 5 s of wake-ups");
}

#[test]
fn without_announcements_a_quiet_worker_still_looks_every_fire_ms() {
    let mut m = WorkerMachine::new(
        WorkerConfig {
            idle_max_ms: 30_000,
            ..firing(5_000)
        },
        LocalMs(0),
    );
    assert_eq!(fires(&drain(&mut m)), 1);
    m.handle_reply(LocalMs(0), WorkerReply::Claimed(Ok(vec![])));
    drain(&mut m);
    m.handle_reply(LocalMs(10), report(0, None));
    m.handle_timeout(LocalMs(5_010));
    assert_eq!(fires(&drain(&mut m)), 1);
}
