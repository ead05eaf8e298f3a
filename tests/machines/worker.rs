//! The worker machine: claims, handler slots, renewal rounds, the
//! completer, cancel, drain, idle backoff and shutdown.

use super::*;

pub(crate) fn worker(concurrency: usize, prefetch: usize, batch_max: usize) -> WorkerConfig {
    WorkerConfig {
        lease_ms: 3_000,
        concurrency,
        prefetch,
        batch_max,
        flush_delay_ms: 5,
        idle_max_ms: 200,
        announced: false,
        heartbeat_ms: 0,
        drain: false,
        drift: DRIFT,
        seed: 11,
        sample_ms: 0,
        fire_ms: 0,
    }
}

/// Job `id`'s claim with `token`.
pub(crate) fn c(id: u64, token: u64) -> ClaimId {
    ClaimId {
        job: JobId(id),
        token,
    }
}

pub(crate) fn job(id: u64, token: u64) -> JobRecord {
    JobRecord {
        id: JobId(id),
        queue: Arc::from("q"),
        payload: Arc::from(&b"x"[..]),
        priority: 0,
        run_at_ms: 0,
        created_at_ms: 0,
        max_attempts: 3,
        attempts: 1,
        expiries: 0,
        last_token: token,
        state: JobState::Running,
        claim: Some(Claim {
            holder: HolderId(1),
            token,
            lease_until_ms: 3_000,
            deadline_ms: None,
        }),
        cancel_requested: false,
        last_error: None,
        unique_key: None,
        finished_at_ms: None,
        result: None,
        key: None,
        parked: false,
        timeout_ms: None,
        progress: None,
        after: None,
        after_any: false,
        waiting_on: 0,
        has_children: false,
    }
}

pub(crate) fn drain(m: &mut WorkerMachine) -> Vec<WorkerAction> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

pub(crate) fn requests(a: &[WorkerAction]) -> Vec<WorkerRequest> {
    a.iter()
        .filter_map(|a| match a {
            WorkerAction::Send(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn settles(a: &[WorkerAction]) -> Vec<Vec<(JobId, u64, Settle)>> {
    requests(a)
        .into_iter()
        .filter_map(|r| match r {
            WorkerRequest::Settle { settles } => Some(settles),
            _ => None,
        })
        .collect()
}

fn started(a: &[WorkerAction]) -> Vec<u64> {
    a.iter()
        .filter_map(|a| match a {
            WorkerAction::Start(j) => Some(j.id.0),
            _ => None,
        })
        .collect()
}

fn settled(a: &[WorkerAction]) -> Vec<(u64, JobOutcome)> {
    a.iter()
        .filter_map(|a| match a {
            WorkerAction::Settled { claim, outcome } => Some((claim.job.0, *outcome)),
            _ => None,
        })
        .collect()
}

/// A machine that claimed `ids` (token 1 each) at time 0.
fn claimed(cfg: WorkerConfig, ids: &[u64]) -> (WorkerMachine, Vec<WorkerAction>) {
    let mut m = WorkerMachine::new(cfg, LocalMs(0));
    let first = drain(&mut m);
    assert!(matches!(
        requests(&first)[..],
        [WorkerRequest::Claim { .. }]
    ));
    let jobs = ids.iter().map(|&i| job(i, 1)).collect();
    m.handle_reply(LocalMs(1), WorkerReply::Claimed(Ok(jobs)));
    let a = drain(&mut m);
    (m, a)
}

#[test]
fn claims_fill_handler_slots_and_the_bounded_prefetch() {
    let mut m = WorkerMachine::new(worker(3, 2, 64), LocalMs(0));
    assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 5 }]);
    let mut m = WorkerMachine::new(worker(3, 2, 4), LocalMs(0));
    assert_eq!(
        requests(&drain(&mut m)),
        [WorkerRequest::Claim { max: 4 }],
        "batch_max"
    );
    let (mut m, a) = claimed(worker(2, 2, 64), &[1, 2, 3]);
    assert_eq!(started(&a), [1, 2], "two handlers at once, in claim order");
    assert!(
        requests(&a).is_empty(),
        "one slot of four free: claims wait for half the room"
    );
    m.handler_done(LocalMs(3), c(1, 1), Ok(()));
    let a = drain(&mut m);
    assert_eq!(started(&a), [3], "a free slot starts the next queued job");
    assert_eq!(
        requests(&a),
        [WorkerRequest::Claim { max: 2 }],
        "half the room is free"
    );
    m.handle_reply(LocalMs(4), WorkerReply::Claimed(Ok(vec![])));
    m.handler_done(LocalMs(5), c(2, 1), Ok(()));
    m.handle_timeout(LocalMs(40));
    assert!(
        requests(&drain(&mut m)).contains(&WorkerRequest::Claim { max: 3 }),
        "a free slot with nothing queued claims at once (after the idle backoff)"
    );
}

/// The prefetch adapts: a full claim that handlers ran dry during doubles
/// it (up to twice `batch_max`); a short claim resets it; handlers that never
/// starve during a claim never raise it.
#[test]
fn prefetch_grows_while_claims_are_the_bottleneck_and_resets_when_the_queue_runs_dry() {
    let max_of = |a: &[WorkerAction]| {
        requests(a).iter().find_map(|r| match r {
            WorkerRequest::Claim { max } => Some(*max),
            _ => None,
        })
    };
    let mut m = WorkerMachine::new(worker(2, 1, 16), LocalMs(0));
    assert_eq!(max_of(&drain(&mut m)), Some(3));
    let mut next_id = 1;
    let mut batch = |n: usize| -> Vec<JobRecord> {
        let jobs = (0..n).map(|i| job(next_id + i as u64, 1)).collect();
        next_id += n as u64;
        jobs
    };
    let mut t = LocalMs(1);
    let mut asked = Vec::new();
    let mut max = 3;
    // Fast handlers: everything held finishes while each claim is out.
    for _ in 0..8 {
        m.handle_reply(t, WorkerReply::Claimed(Ok(batch(max))));
        let a = run_dry(&mut m, &mut t);
        max = max_of(&a).unwrap_or_else(|| panic!("a claim: {a:?}"));
        asked.push(max);
    }
    // Growing while handlers starve, until `ahead` reaches twice
    // batch_max (32): then each claim goes out once half the room (2 + 32)
    // is free, and asks for a whole batch (capped at `ahead` = batch_max,
    // claims asked for 9: every transaction carried half a batch).
    assert_eq!(asked[..5], [2, 2, 4, 6, 12], "{asked:?}");
    assert_eq!(asked[5..], [16, 16, 16], "{asked:?}");
    // A short claim: back to the configured prefetch.
    m.handle_reply(t, WorkerReply::Claimed(Ok(batch(max - 1))));
    let a = run_dry(&mut m, &mut t);
    assert_eq!(
        max_of(&a),
        Some(2),
        "reset to prefetch 1: one running, room 2"
    );

    // Slow handlers: nothing finishes while a claim is out: no growth.
    let mut m = WorkerMachine::new(worker(2, 1, 16), LocalMs(0));
    let _ = drain(&mut m);
    m.handle_reply(
        LocalMs(1),
        WorkerReply::Claimed(Ok((100..103).map(|i| job(i, 1)).collect())),
    );
    let _ = drain(&mut m);
    m.handler_done(LocalMs(1_000), c(100, 1), Ok(()));
    m.handler_done(LocalMs(1_000), c(101, 1), Ok(()));
    let a = drain(&mut m);
    assert_eq!(max_of(&a), Some(2));
    m.handle_reply(
        LocalMs(1_001),
        WorkerReply::Claimed(Ok((103..105).map(|i| job(i, 1)).collect())),
    );
    m.handler_done(LocalMs(2_000), c(102, 1), Ok(()));
    m.handler_done(LocalMs(2_000), c(103, 1), Ok(()));
    let a = drain(&mut m);
    assert_eq!(max_of(&a), Some(2), "no growth: {a:?}");
}

/// Fast handlers: finish every job started, and every job that starts
/// after, at `t`; the actions seen on the way.
fn run_dry(m: &mut WorkerMachine, t: &mut LocalMs) -> Vec<WorkerAction> {
    let mut seen = Vec::new();
    loop {
        let a = drain(m);
        let s = started(&a);
        seen.extend(a);
        if s.is_empty() {
            break;
        }
        for id in s {
            m.handler_done(*t, c(id, 1), Ok(()));
        }
    }
    *t += 1;
    seen
}

#[test]
fn outcomes_are_batched_until_full_delayed_or_idle() {
    let (mut m, _) = claimed(worker(4, 0, 3), &[1, 2, 3, 4]);
    m.handler_done(LocalMs(10), c(1, 1), Ok(()));
    assert!(settles(&drain(&mut m)).is_empty(), "waits for others");
    m.handler_done(LocalMs(11), c(2, 1), Err("boom".into()));
    m.handler_done(LocalMs(12), c(3, 1), Ok(()));
    let sent = settles(&drain(&mut m));
    let [batch] = &sent[..] else {
        panic!("one batch when full: {sent:?}");
    };
    let ids: Vec<u64> = batch.iter().map(|s| s.0 .0).collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(batch[1].2, Settle::Fail("boom".into()));
    m.handle_reply(
        LocalMs(13),
        WorkerReply::Settled(Ok(vec![
            Ok(JobState::Done),
            Ok(JobState::Scheduled),
            Ok(JobState::Done),
        ])),
    );
    let outcomes = settled(&drain(&mut m));
    assert_eq!(
        outcomes,
        [
            (1, JobOutcome::Done),
            (2, JobOutcome::Failed(JobState::Scheduled)),
            (3, JobOutcome::Done)
        ]
    );
    // The last one: nothing else runs, so it goes at once.
    m.handler_done(LocalMs(20), c(4, 1), Ok(()));
    assert_eq!(settles(&drain(&mut m)).len(), 1);

    let (mut m, _) = claimed(worker(2, 0, 64), &[1, 2]);
    m.handler_done(LocalMs(30), c(1, 1), Ok(()));
    assert!(settles(&drain(&mut m)).is_empty());
    m.handle_timeout(LocalMs(34));
    assert!(
        settles(&drain(&mut m)).is_empty(),
        "not before the flush delay"
    );
    m.handle_timeout(LocalMs(35));
    assert_eq!(settles(&drain(&mut m)).len(), 1, "the flush delay");
}

#[test]
fn one_renewal_round_carries_every_claim_held_and_moves_their_deadlines() {
    let (mut m, _) = claimed(worker(2, 1, 64), &[1, 2, 3]);
    m.handler_done(LocalMs(5), c(1, 1), Ok(()));
    let _ = drain(&mut m);
    // The outcome of job 1 is sent after the flush delay; its reply waits.
    m.handle_timeout(LocalMs(10));
    assert_eq!(settles(&drain(&mut m)).len(), 1);
    let at = m.poll_timeout().unwrap();
    assert!((900..=1_101).contains(&at.ms()), "a second at most: {at}");
    m.handle_timeout(at);
    let sent: Vec<WorkerRequest> = requests(&drain(&mut m))
        .into_iter()
        .filter(|r| matches!(r, WorkerRequest::Heartbeat { .. }))
        .collect();
    let [WorkerRequest::Heartbeat { claims }] = &sent[..] else {
        panic!("one round: {sent:?}");
    };
    let mut ids: Vec<u64> = claims.iter().map(|c| c.0 .0).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        [1, 2, 3],
        "queued, running, and the outcome being committed"
    );
    let hb = HeartbeatReply {
        lease_until_ms: 0,
        cancel_requested: false,
    };
    let replies = claims.iter().map(|_| Ok(hb)).collect();
    m.handle_reply(at + 2, WorkerReply::Heartbeated(Ok(replies)));
    let renewed: Vec<(u64, LocalMs)> = drain(&mut m)
        .iter()
        .filter_map(|a| match a {
            WorkerAction::Renewed { claim, deadline } => Some((claim.job.0, *deadline)),
            _ => None,
        })
        .collect();
    assert!(
        renewed.iter().all(|&(_, d)| d == at + 3_000 - 30),
        "{renewed:?}"
    );
}

#[test]
fn a_passed_deadline_stops_the_handler_and_its_late_outcome_is_dropped() {
    let (mut m, _) = claimed(worker(1, 0, 64), &[1]);
    assert!(m.is_valid(c(1, 1), LocalMs(2_969)));
    m.handle_timeout(LocalMs(2_970));
    let a = drain(&mut m);
    assert!(a.iter().any(|a| matches!(
        a,
        WorkerAction::Stop {
            why: StopWhy::Lost(LostReason::LocalDeadline),
            ..
        }
    )));
    assert_eq!(settled(&a), [(1, JobOutcome::Lost)]);
    m.handler_done(LocalMs(2_980), c(1, 1), Ok(()));
    assert!(requests(&drain(&mut m))
        .iter()
        .all(|r| !matches!(r, WorkerRequest::Settle { .. })));
}

#[test]
fn a_cancel_stops_a_running_handler_and_gives_back_a_queued_job() {
    let (mut m, _) = claimed(worker(1, 1, 64), &[1, 2]);
    let at = m.poll_timeout().unwrap();
    m.handle_timeout(at);
    let _ = drain(&mut m);
    let cancel = HeartbeatReply {
        lease_until_ms: 0,
        cancel_requested: true,
    };
    m.handle_reply(
        at,
        WorkerReply::Heartbeated(Ok(vec![Ok(cancel), Ok(cancel)])),
    );
    let a = drain(&mut m);
    assert!(a.iter().any(
        |a| matches!(a, WorkerAction::Stop { claim, why: StopWhy::Cancelled } if claim.job.0 == 1)
    ));
    m.handle_timeout(at + 5);
    let sent = settles(&drain(&mut m));
    assert_eq!(
        sent,
        [vec![(JobId(2), 1, Settle::Abandon { started: false })]]
    );
}

#[test]
fn drain_asks_the_store_once_idle_and_finishes_when_drained() {
    let mut cfg = worker(1, 0, 64);
    cfg.drain = true;
    let mut m = WorkerMachine::new(cfg, LocalMs(0));
    let _ = drain(&mut m);
    m.handle_reply(LocalMs(1), WorkerReply::Claimed(Ok(vec![])));
    assert!(matches!(
        requests(&drain(&mut m))[..],
        [WorkerRequest::DrainCheck]
    ));
    m.handle_reply(LocalMs(2), WorkerReply::Drained(Ok(false)));
    assert!(!m.is_finished(), "a retry in backoff somewhere");
    // It goes on claiming (at once, or once its backoff is over).
    let mut sent = requests(&drain(&mut m));
    let mut at = LocalMs(2);
    if sent.is_empty() {
        at = m.poll_timeout().unwrap();
        m.handle_timeout(at);
        sent = requests(&drain(&mut m));
    }
    assert!(
        matches!(sent[..], [WorkerRequest::Claim { .. }]),
        "{sent:?}"
    );
    m.handle_reply(at + 1, WorkerReply::Claimed(Ok(vec![])));
    assert!(matches!(
        requests(&drain(&mut m))[..],
        [WorkerRequest::DrainCheck]
    ));
    m.handle_reply(at + 2, WorkerReply::Drained(Ok(true)));
    assert!(matches!(drain(&mut m)[..], [WorkerAction::Finished]));
}

#[test]
fn idle_claims_back_off_with_jitter_and_a_wake_cuts_it_short() {
    let mut m = WorkerMachine::new(worker(1, 0, 64), LocalMs(0));
    let _ = drain(&mut m);
    let mut now = LocalMs(0);
    let mut waits = Vec::new();
    for _ in 0..10 {
        m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
        let at = m.poll_timeout().unwrap();
        waits.push(at - now);
        now = at;
        m.handle_timeout(now);
        assert!(matches!(
            requests(&drain(&mut m))[..],
            [WorkerRequest::Claim { .. }]
        ));
    }
    assert!(
        waits[9] > waits[1] && waits.iter().all(|&w| w <= 200),
        "{waits:?}"
    );
    m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
    m.wake(now + 1);
    assert!(matches!(
        requests(&drain(&mut m))[..],
        [WorkerRequest::Claim { .. }]
    ));
}

#[test]
fn shutdown_gives_queued_jobs_back_at_once_and_running_ones_at_the_deadline() {
    let (mut m, _) = claimed(worker(1, 1, 64), &[1, 2]);
    m.shutdown(LocalMs(10), LocalMs(1_000));
    let _ = drain(&mut m);
    m.handle_timeout(LocalMs(15));
    let sent = settles(&drain(&mut m));
    assert_eq!(
        sent,
        [vec![(JobId(2), 1, Settle::Abandon { started: false })]]
    );
    m.handle_reply(
        LocalMs(11),
        WorkerReply::Settled(Ok(vec![Ok(JobState::Ready)])),
    );
    let _ = drain(&mut m);
    assert!(
        m.is_valid(c(1, 1), LocalMs(999)),
        "the running handler may finish"
    );
    m.handle_timeout(LocalMs(1_000));
    let a = drain(&mut m);
    assert!(a.iter().any(|a| matches!(
        a,
        WorkerAction::Stop {
            why: StopWhy::Shutdown,
            ..
        }
    )));
    assert!(requests(&a).iter().any(|r| matches!(r, WorkerRequest::Settle { settles } if settles[0].2 == Settle::Abandon { started: true })));
    m.handle_reply(
        LocalMs(1_001),
        WorkerReply::Settled(Ok(vec![Ok(JobState::Ready)])),
    );
    let a = drain(&mut m);
    assert!(matches!(a.last(), Some(WorkerAction::Finished)), "{a:?}");
    assert!(
        requests(&a)
            .iter()
            .all(|r| !matches!(r, WorkerRequest::Claim { .. })),
        "no claim after shutdown"
    );
}

/// Found under EIO (issue 25): a settle that got no answer gave its
/// claims up as lost, and each job waited out its lease and ran again.
/// Transient or ambiguous, the same outcomes go again (a settle that finds
/// its own outcome recorded answers as the first would), their claims
/// renewed meanwhile; only the store's answer settles them.
#[test]
fn a_settle_without_an_answer_is_sent_again_and_its_claim_kept_alive() {
    for e in transient_and_ambiguous() {
        let (mut m, _) = claimed(worker(1, 0, 64), &[1]);
        m.handler_done(LocalMs(5), c(1, 1), Ok(()));
        let first = settles(&drain(&mut m));
        assert_eq!(first.len(), 1);
        m.handle_reply(LocalMs(6), WorkerReply::Settled(Err(e)));
        let a = drain(&mut m);
        assert!(settled(&a).is_empty(), "not lost: {a:?}");
        let retry = m.poll_timeout().unwrap();
        assert!(retry <= LocalMs(6 + 100), "after a short backoff: {retry}");
        m.handle_timeout(retry);
        assert_eq!(settles(&drain(&mut m)), first, "the same outcome again");
        // The claim still goes out in renewal rounds while it waits.
        let round = m.poll_timeout().unwrap();
        m.handle_timeout(round);
        assert!(
            requests(&drain(&mut m)).contains(&WorkerRequest::Heartbeat {
                claims: vec![(JobId(1), 1)]
            })
        );
        m.handle_reply(
            retry + 1,
            WorkerReply::Settled(Ok(vec![Ok(JobState::Done)])),
        );
        assert_eq!(settled(&drain(&mut m)), [(1, JobOutcome::Done)]);
    }
}

/// Found by the simulator: a job claimed again (a new token) before the
/// reply for its old claim's outcome arrives. The old reply must not touch
/// the new claim (it removed it, and a handler slot leaked).
#[test]
fn the_reply_for_an_old_claim_leaves_the_new_claim_alone() {
    let (mut m, _) = claimed(worker(1, 0, 64), &[7]);
    m.handler_done(LocalMs(5), c(7, 1), Err("boom".into()));
    let _ = drain(&mut m);
    // Retried at once and claimed again by us, before the settle reply.
    m.handle_timeout(LocalMs(6));
    let _ = drain(&mut m);
    m.handle_reply(LocalMs(7), WorkerReply::Claimed(Ok(vec![job(7, 2)])));
    assert_eq!(started(&drain(&mut m)), [7]);
    m.handle_reply(
        LocalMs(8),
        WorkerReply::Settled(Ok(vec![Ok(JobState::Scheduled)])),
    );
    let _ = drain(&mut m);
    assert!(
        m.is_valid(c(7, 2), LocalMs(9)),
        "the new claim is still held and running"
    );
    assert!(
        !m.is_valid(c(7, 1), LocalMs(9)),
        "not for the old claim's handler"
    );
    m.handler_done(LocalMs(10), c(7, 2), Ok(()));
    let sent = requests(&drain(&mut m));
    assert!(
        sent.iter().any(|r| matches!(r, WorkerRequest::Settle { settles } if settles == &vec![(JobId(7), 2, Settle::Complete)])),
        "{sent:?}"
    );
}

#[test]
fn a_store_error_that_retrying_cannot_fix_ends_the_loop() {
    let mut m = WorkerMachine::new(worker(1, 0, 64), LocalMs(0));
    let _ = drain(&mut m);
    m.handle_reply(
        LocalMs(1),
        WorkerReply::Claimed(Err(Error::store("claiming", "disk I/O error"))),
    );
    assert!(matches!(drain(&mut m)[..], [WorkerAction::Failed(_)]));
    assert!(m.is_finished());
}

/// A handler stopped for a loss runs on (a thread cannot be interrupted)
/// and reports after the job was claimed again by this worker: its
/// outcome belongs to the old claim and is ignored; the new claim's
/// handler decides. (The tokio tests and the simulator found it.)
#[test]
fn a_late_outcome_of_an_old_claim_is_ignored() {
    let (mut m, _) = claimed(worker(1, 0, 64), &[7]);
    let deadline = m.deadline(c(7, 1)).unwrap();
    m.handle_timeout(deadline);
    let acts = drain(&mut m);
    assert_eq!(settled(&acts), [(7, JobOutcome::Lost)]);
    m.handle_timeout(deadline + 1);
    let _ = drain(&mut m);
    m.handle_reply(deadline + 2, WorkerReply::Claimed(Ok(vec![job(7, 2)])));
    assert_eq!(started(&drain(&mut m)), [7]);
    assert!(!m.is_valid(c(7, 1), deadline + 3));
    assert!(m.is_valid(c(7, 2), deadline + 3));
    m.handler_done(deadline + 3, c(7, 1), Ok(()));
    m.handle_timeout(deadline + 10);
    let sent = requests(&drain(&mut m));
    assert!(
        !sent
            .iter()
            .any(|r| matches!(r, WorkerRequest::Settle { .. })),
        "the old handler's outcome was sent: {sent:?}"
    );
    assert!(
        m.is_valid(c(7, 2), deadline + 10),
        "the new claim still runs"
    );
    m.handler_done(deadline + 11, c(7, 2), Err("boom".into()));
    m.handle_timeout(deadline + 20);
    let sent = requests(&drain(&mut m));
    assert!(
        sent.iter().any(|r| matches!(r, WorkerRequest::Settle { settles } if settles == &vec![(JobId(7), 2, Settle::Fail("boom".into()))])),
        "{sent:?}"
    );
}

/// Queue-depth samples: one at the start, then every `sample_ms` after
/// the previous answer, one in flight; a failed sample waits for the next.
#[test]
fn the_queue_is_sampled_on_its_schedule() {
    let cfg = WorkerConfig {
        sample_ms: 1_000,
        ..worker(1, 0, 64)
    };
    let mut m = WorkerMachine::new(cfg, LocalMs(0));
    let sent = requests(&drain(&mut m));
    assert!(sent.contains(&WorkerRequest::Sample), "{sent:?}");
    m.handle_timeout(LocalMs(500));
    assert!(
        !requests(&drain(&mut m)).contains(&WorkerRequest::Sample),
        "one in flight"
    );
    let counts = leasehold::StateCounts::default();
    m.handle_reply(LocalMs(600), WorkerReply::Sampled(Ok(counts)));
    let acts = drain(&mut m);
    assert!(
        acts.iter().any(|a| matches!(a, WorkerAction::Sampled(_))),
        "{acts:?}"
    );
    assert!(m.poll_timeout().is_some_and(|t| t <= LocalMs(1_600)));
    m.handle_timeout(LocalMs(1_599));
    assert!(!requests(&drain(&mut m)).contains(&WorkerRequest::Sample));
    m.handle_timeout(LocalMs(1_600));
    assert!(requests(&drain(&mut m)).contains(&WorkerRequest::Sample));
    m.handle_reply(
        LocalMs(1_700),
        WorkerReply::Sampled(Err(Error::transient("counting", "busy"))),
    );
    let acts = drain(&mut m);
    assert!(!acts.iter().any(|a| matches!(a, WorkerAction::Sampled(_))));
    m.handle_timeout(LocalMs(2_700));
    assert!(requests(&drain(&mut m)).contains(&WorkerRequest::Sample));
}

#[test]
fn a_claim_answered_after_its_local_deadline_is_given_back_unstarted() {
    let mut m = WorkerMachine::new(worker(1, 0, 64), LocalMs(0));
    drain(&mut m);
    // Sent at 0: valid until 3000 - 1 % drift = 2970; answered at 3500.
    m.handle_reply(LocalMs(3_500), WorkerReply::Claimed(Ok(vec![job(7, 1)])));
    let a = drain(&mut m);
    assert!(started(&a).is_empty(), "a late claim never starts");
    assert_eq!(
        settles(&a),
        [vec![(JobId(7), 1, Settle::Abandon { started: false })]],
        "given back at once, costing no attempt"
    );
    m.handle_reply(
        LocalMs(3_501),
        WorkerReply::Settled(Ok(vec![Ok(JobState::Ready)])),
    );
    assert_eq!(
        settled(&drain(&mut m)),
        [(7, JobOutcome::Abandoned(JobState::Ready))]
    );
    // Answered one millisecond before the deadline, it runs.
    let mut m = WorkerMachine::new(worker(1, 0, 64), LocalMs(0));
    drain(&mut m);
    m.handle_reply(LocalMs(2_969), WorkerReply::Claimed(Ok(vec![job(7, 1)])));
    assert_eq!(started(&drain(&mut m)), [7]);
}

#[test]
fn a_queued_job_whose_deadline_passes_is_given_back_and_a_running_one_lost() {
    let (mut m, a) = claimed(worker(1, 1, 64), &[1, 2]);
    assert_eq!(started(&a), [1], "one handler: job 2 waits");
    m.handle_timeout(LocalMs(2_970));
    let a = drain(&mut m);
    assert_eq!(
        settled(&a),
        [(1, JobOutcome::Lost)],
        "the running one is lost"
    );
    assert_eq!(
        settles(&a),
        [vec![(JobId(2), 1, Settle::Abandon { started: false })]],
        "the one never started is given back"
    );
    assert!(started(&a).is_empty());
}

#[test]
fn an_idle_worker_claims_again_when_the_queue_changes_by_time() {
    let mut m = WorkerMachine::new(worker(1, 0, 8), LocalMs(0));
    let mut now = LocalMs(0);
    // Empty claims: the backoff grows to its cap (200 ms, equal jitter).
    for _ in 0..12 {
        assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
        m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
        now = m.poll_timeout().unwrap();
        m.handle_timeout(now);
    }
    assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
    // A retry falls due in 30 ms: the next claim goes out then (+1 ms),
    // not at the end of the backoff.
    m.handle_reply(
        now,
        WorkerReply::Idle {
            next_change_in_ms: Some(30),
            relook_in_ms: None,
        },
    );
    assert_eq!(m.poll_timeout(), Some(now + 31));
    now += 31;
    m.handle_timeout(now);
    assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
    // A change far away: the backoff decides (100-200 ms at its cap).
    m.handle_reply(
        now,
        WorkerReply::Idle {
            next_change_in_ms: Some(60_000),
            relook_in_ms: None,
        },
    );
    let next = m.poll_timeout().unwrap();
    assert!(
        (now + 100..=now + 200).contains(&next),
        "{next} after {now}"
    );
    m.handle_timeout(next);
    now = next;
    drain(&mut m);
    // Nothing scheduled or running: the backoff too; a change due now: 1 ms.
    m.handle_reply(
        now,
        WorkerReply::Idle {
            next_change_in_ms: None,
            relook_in_ms: None,
        },
    );
    let next = m.poll_timeout().unwrap();
    assert!(next >= now + 100, "{next} after {now}");
    now = next;
    m.handle_timeout(now);
    assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
    assert_eq!(m.poll_timeout(), None, "the claim is in flight");
    m.handle_reply(
        now,
        WorkerReply::Idle {
            next_change_in_ms: Some(0),
            relook_in_ms: None,
        },
    );
    assert_eq!(m.poll_timeout(), Some(now + 1));
    // An Idle reply with no claim in flight changes nothing.
    m.handle_reply(
        now,
        WorkerReply::Idle {
            next_change_in_ms: Some(0),
            relook_in_ms: None,
        },
    );
    assert_eq!(m.poll_timeout(), Some(now + 1));
}

#[test]
fn where_every_change_is_announced_an_empty_claim_waits_the_whole_backstop() {
    let cfg = WorkerConfig {
        announced: true,
        idle_max_ms: 30_000,
        ..worker(1, 0, 8)
    };
    let mut m = WorkerMachine::new(cfg, LocalMs(0));
    let mut now = LocalMs(0);
    for _ in 0..5 {
        assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
        m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
        let next = m.poll_timeout().unwrap();
        // Equal jitter of the cap from the first wait: no ramp from 1 ms.
        assert!(
            (now + 15_000..=now + 30_000).contains(&next),
            "{next} after {now}"
        );
        now = next;
        m.handle_timeout(now);
    }
    // The queue's next change by time still ends the wait.
    assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
    m.handle_reply(
        now,
        WorkerReply::Idle {
            next_change_in_ms: Some(40),
            relook_in_ms: None,
        },
    );
    assert_eq!(m.poll_timeout(), Some(now + 41));
    // So does a wake-up.
    m.wake(now + 5);
    assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
}

#[test]
fn looks_again_soon_back_off_when_the_answer_keeps_saying_soon() {
    // Rows another transaction holds (PostgreSQL: a claim in flight, or a
    // session idle in its transaction for hours): each empty claim says
    // to look again in 10 ms. The first four are followed at once, then
    // the looks back off to one a second; a claim that takes a job, or a
    // hint further away or none, starts the count again.
    let cfg = WorkerConfig {
        announced: true,
        idle_max_ms: 30_000,
        ..worker(1, 0, 8)
    };
    let mut m = WorkerMachine::new(cfg, LocalMs(0));
    let mut now = LocalMs(0);
    let mut waits = Vec::new();
    let look = |m: &mut WorkerMachine, now: &mut LocalMs, due: Option<u64>, relook: Option<u64>| {
        assert_eq!(requests(&drain(m)), [WorkerRequest::Claim { max: 1 }]);
        m.handle_reply(
            *now,
            WorkerReply::Idle {
                next_change_in_ms: due,
                relook_in_ms: relook,
            },
        );
        let next = m.poll_timeout().unwrap();
        let wait = next - *now;
        *now = next;
        m.handle_timeout(*now);
        wait
    };
    for _ in 0..12 {
        waits.push(look(&mut m, &mut now, None, Some(10)));
    }
    assert_eq!(
        waits,
        [11, 11, 11, 11, 16, 32, 64, 128, 256, 512, 1_000, 1_000]
    );
    // A due time further away, beside the relook that keeps coming, is
    // kept to the millisecond: a delayed job starts on time even while a
    // row stays held.
    assert_eq!(look(&mut m, &mut now, Some(200), Some(10)), 201);
    assert_eq!(look(&mut m, &mut now, Some(5_000), Some(10)), 1_000);
    // So is one within the relook's own span (a delay of 10 ms, a short
    // retry): heard once, it is not the relook's to back off.
    assert_eq!(look(&mut m, &mut now, Some(10), Some(10)), 11);
    // A hint further away and no relook ends the run: the next "soon" is
    // followed at once.
    assert_eq!(look(&mut m, &mut now, Some(500), None), 501);
    assert_eq!(look(&mut m, &mut now, None, Some(10)), 11);
    // A change by time "at once", again and again, backs off the same
    // way, on its own count.
    let waits: Vec<u64> = (0..11)
        .map(|_| look(&mut m, &mut now, Some(0), None))
        .collect();
    assert_eq!(waits, [1, 1, 1, 1, 16, 32, 64, 128, 256, 512, 1_000]);
    // No hint at all ends it too.
    let backstop = look(&mut m, &mut now, None, None);
    assert!((15_000..=30_000).contains(&backstop), "{backstop}");
    assert_eq!(look(&mut m, &mut now, Some(0), None), 1);
}

#[test]
fn a_wake_up_during_a_claim_makes_its_empty_answer_claim_again_at_once() {
    for announced in [true, false] {
        let cfg = WorkerConfig {
            announced,
            idle_max_ms: 30_000,
            ..worker(1, 0, 8)
        };
        let mut m = WorkerMachine::new(cfg, LocalMs(0));
        let mut now = LocalMs(0);
        // Settle into idling: several empty claims.
        for _ in 0..6 {
            assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
            m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
            now = m.poll_timeout().unwrap();
            m.handle_timeout(now);
        }
        assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
        // A push is announced while the claim is in flight: the claim may
        // have read the queue before it.
        m.wake(now + 1);
        assert!(requests(&drain(&mut m)).is_empty(), "one claim in flight");
        m.handle_reply(
            now + 2,
            WorkerReply::Idle {
                next_change_in_ms: None,
                relook_in_ms: None,
            },
        );
        assert_eq!(
            requests(&drain(&mut m)),
            [WorkerRequest::Claim { max: 1 }],
            "claims again at once (announced: {announced})"
        );
        // Without a wake-up, the next empty answer waits again.
        m.handle_reply(now + 3, WorkerReply::Claimed(Ok(vec![])));
        assert!(m.poll_timeout().unwrap() > now + 3);
    }
}

#[test]
fn held_counts_running_queued_and_reported_claims_until_settled() {
    let (mut m, _) = claimed(worker(1, 2, 64), &[1, 2, 3]);
    assert_eq!(m.held(), 3, "one running, two queued");
    m.handler_done(LocalMs(2), c(1, 1), Ok(()));
    assert_eq!(m.held(), 3, "its outcome is not committed yet");
    m.handle_timeout(LocalMs(10));
    let sent = settles(&drain(&mut m));
    assert_eq!(sent.len(), 1, "{sent:?}");
    m.handle_reply(
        LocalMs(11),
        WorkerReply::Settled(Ok(vec![Ok(JobState::Done)])),
    );
    assert_eq!(m.held(), 2);
}

#[test]
fn a_free_handler_with_nothing_queued_claims_at_once_even_with_little_room() {
    // Four handlers, no prefetch: four claimed and started.
    let (mut m, a) = claimed(worker(4, 0, 64), &[1, 2, 3, 4]);
    assert_eq!(started(&a), [1, 2, 3, 4]);
    // One finishes: a quarter of the room is free, less than half, but
    // a handler would otherwise idle.
    m.handler_done(LocalMs(2), c(1, 1), Ok(()));
    let a = drain(&mut m);
    assert!(
        requests(&a).contains(&WorkerRequest::Claim { max: 1 }),
        "{a:?}"
    );
}

#[test]
fn switching_the_drain_rule_on_asks_whether_the_queue_is_drained() {
    let mut m = WorkerMachine::new(worker(1, 0, 8), LocalMs(0));
    drain(&mut m);
    m.handle_reply(LocalMs(1), WorkerReply::Claimed(Ok(vec![])));
    assert!(
        requests(&drain(&mut m)).is_empty(),
        "not draining: no check"
    );
    m.set_drain(LocalMs(1), true);
    assert!(requests(&drain(&mut m)).is_empty(), "the claim backs off");
    let next = m.poll_timeout().unwrap();
    m.handle_timeout(next);
    assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
    m.handle_reply(next, WorkerReply::Claimed(Ok(vec![])));
    assert_eq!(requests(&drain(&mut m)), [WorkerRequest::DrainCheck]);
    m.handle_reply(next, WorkerReply::Drained(Ok(true)));
    assert!(m.is_finished());
}

#[test]
fn a_second_shutdown_keeps_the_first_deadline() {
    let (mut m, _) = claimed(worker(1, 0, 64), &[1]);
    m.shutdown(LocalMs(10), LocalMs(1_000));
    m.shutdown(LocalMs(20), LocalMs(5_000));
    drain(&mut m);
    assert!(m.is_valid(c(1, 1), LocalMs(999)));
    m.handle_timeout(LocalMs(1_000));
    let a = drain(&mut m);
    assert!(
        a.iter().any(|a| matches!(
            a,
            WorkerAction::Stop {
                why: StopWhy::Shutdown,
                ..
            }
        )),
        "the handler is stopped at the first deadline: {a:?}"
    );
}

#[test]
fn prefetch_grows_only_when_handlers_starve_during_a_claim() {
    // One handler, four ahead: five claimed, one running, four queued.
    let (mut m, _) = claimed(worker(1, 4, 64), &[1, 2, 3, 4, 5]);
    let mut now = LocalMs(2);
    // Three finish (each starting the next queued job): then more than
    // half the room is free, and a claim of three goes out while one job
    // is still queued.
    for id in 1..=3 {
        m.handler_done(now, c(id, 1), Ok(()));
        now += 1;
    }
    let a = drain(&mut m);
    assert!(
        requests(&a).contains(&WorkerRequest::Claim { max: 3 }),
        "{a:?}"
    );
    // The fourth finishes while the fifth is still queued: not starved.
    m.handler_done(now, c(4, 1), Ok(()));
    drain(&mut m);
    // The claim comes back full: prefetch stays four, so the room left
    // (one) is less than half: no claim.
    m.handle_reply(
        now,
        WorkerReply::Claimed(Ok((6..=8).map(|i| job(i, 1)).collect())),
    );
    let a = drain(&mut m);
    assert!(
        !requests(&a)
            .iter()
            .any(|r| matches!(r, WorkerRequest::Claim { .. })),
        "{a:?}"
    );
}

#[test]
fn a_queued_job_the_store_refuses_is_dropped_and_the_rest_stay_queued() {
    let (mut m, _) = claimed(worker(1, 2, 64), &[1, 2, 3]);
    let round = m.poll_timeout().unwrap();
    m.handle_timeout(round);
    let claims = match &requests(&drain(&mut m))[..] {
        [WorkerRequest::Heartbeat { claims }] => claims.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(claims, [(JobId(1), 1), (JobId(2), 1), (JobId(3), 1)]);
    let lost = Error::Lost {
        target: Target::Job {
            id: JobId(2),
            token: 1,
        },
        reason: LostReason::Expired,
    };
    let ok = || {
        Ok(HeartbeatReply {
            lease_until_ms: 6_000,
            cancel_requested: false,
        })
    };
    m.handle_reply(
        round,
        WorkerReply::Heartbeated(Ok(vec![ok(), Err(lost), ok()])),
    );
    let a = drain(&mut m);
    assert_eq!(
        settled(&a),
        [(2, JobOutcome::Lost)],
        "dropped, not given back"
    );
    assert!(settles(&a).is_empty());
    // Job 3 is still queued: it starts when job 1's handler is done.
    m.handler_done(round + 1, c(1, 1), Ok(()));
    assert_eq!(started(&drain(&mut m)), [3]);
}

#[test]
fn renewal_rounds_follow_the_seed_and_the_round_number() {
    use leasehold::client::machine::renewal_wait;
    use leasehold::core::mix64;
    // Seed 11, heartbeat a third of 3 s (at most 1 s): round n comes
    // renewal_wait(1000, mix64(11 ^ n.rotate_left(17))) after the send
    // of the claim (n = 1) or of the round before.
    let (mut m, _) = claimed(worker(1, 0, 64), &[1]);
    let first = renewal_wait(1_000, mix64(11 ^ 1u64.rotate_left(17)));
    assert_eq!(m.poll_timeout(), Some(LocalMs(first)));
    m.handle_timeout(LocalMs(first));
    drain(&mut m);
    let ok = Ok(HeartbeatReply {
        lease_until_ms: 9_000,
        cancel_requested: false,
    });
    m.handle_reply(LocalMs(first + 3), WorkerReply::Heartbeated(Ok(vec![ok])));
    drain(&mut m);
    let second = renewal_wait(1_000, mix64(11 ^ 2u64.rotate_left(17)));
    assert_eq!(m.poll_timeout(), Some(LocalMs(first + second)));
}

#[test]
fn a_claim_reads_as_its_job_and_token() {
    assert_eq!(c(7, 3).to_string(), "job 7 (token 3)");
}

#[test]
fn a_drain_check_without_an_answer_is_asked_again_and_a_hard_error_ends_the_loop() {
    let cfg = WorkerConfig {
        drain: true,
        ..worker(1, 0, 8)
    };
    let check = |m: &mut WorkerMachine, now: LocalMs| {
        m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
        assert_eq!(requests(&drain(m)), [WorkerRequest::DrainCheck]);
    };
    for e in [
        Error::transient("checking", "busy"),
        Error::store("checking", "the connection dropped at COMMIT")
            .with_failure(leasehold::StoreFailure::Ambiguous),
    ] {
        let mut m = WorkerMachine::new(cfg, LocalMs(0));
        drain(&mut m);
        check(&mut m, LocalMs(1));
        m.handle_reply(LocalMs(2), WorkerReply::Drained(Err(e)));
        let mut a = drain(&mut m);
        assert!(!m.is_finished(), "{a:?}");
        // The next empty claim asks again.
        let mut now = LocalMs(2);
        if requests(&a).is_empty() {
            now = m.poll_timeout().unwrap();
            m.handle_timeout(now);
            a = drain(&mut m);
        }
        assert_eq!(requests(&a), [WorkerRequest::Claim { max: 1 }]);
        check(&mut m, now);
    }
    let mut m = WorkerMachine::new(cfg, LocalMs(0));
    drain(&mut m);
    check(&mut m, LocalMs(1));
    let hard = Error::store("checking", "disk I/O error");
    m.handle_reply(LocalMs(2), WorkerReply::Drained(Err(hard)));
    let a = drain(&mut m);
    assert!(matches!(a.last(), Some(WorkerAction::Failed(_))), "{a:?}");
    assert!(m.is_finished());
}

fn transient_and_ambiguous() -> [Error; 2] {
    [
        Error::transient("at the store", "busy"),
        Error::store("at the store", "the connection dropped at COMMIT")
            .with_failure(leasehold::StoreFailure::Ambiguous),
    ]
}

#[test]
fn a_claim_without_an_answer_is_sent_again_within_a_second() {
    for announced in [false, true] {
        for e in transient_and_ambiguous() {
            let cfg = WorkerConfig {
                announced,
                idle_max_ms: 30_000,
                ..worker(1, 0, 64)
            };
            let mut m = WorkerMachine::new(cfg, LocalMs(0));
            drain(&mut m);
            m.handle_reply(LocalMs(1), WorkerReply::Claimed(Err(e)));
            let a = drain(&mut m);
            assert!(!m.is_finished(), "{a:?}");
            // Not an idle wait (15-30 s where announced): the wake-up that
            // sent the claim may be lost with its answer.
            let next = m.poll_timeout().expect("claims again");
            assert!(next <= LocalMs(1_001), "{next} (announced: {announced})");
            m.handle_timeout(next);
            assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
        }
    }
}

#[test]
fn a_round_without_an_answer_is_sent_again_after_a_quarter_and_a_hard_error_ends_the_loop() {
    for e in transient_and_ambiguous() {
        let (mut m, _) = claimed(worker(1, 0, 64), &[1]);
        let round = m.poll_timeout().unwrap();
        m.handle_timeout(round);
        drain(&mut m);
        m.handle_reply(round + 2, WorkerReply::Heartbeated(Err(e)));
        assert!(!m.is_finished());
        // A quarter of the heartbeat interval (1 s) after the failure.
        assert_eq!(m.poll_timeout(), Some(round + 2 + 250));
        m.handle_timeout(round + 2 + 250);
        assert!(matches!(
            requests(&drain(&mut m))[..],
            [WorkerRequest::Heartbeat { .. }]
        ));
    }
    let (mut m, _) = claimed(worker(1, 0, 64), &[1]);
    let round = m.poll_timeout().unwrap();
    m.handle_timeout(round);
    drain(&mut m);
    let hard = Error::store("renewing", "disk I/O error");
    m.handle_reply(round + 2, WorkerReply::Heartbeated(Err(hard)));
    let a = drain(&mut m);
    assert!(matches!(a.last(), Some(WorkerAction::Failed(_))), "{a:?}");
}

#[test]
fn a_second_claim_keeps_the_renewal_round_already_scheduled() {
    use leasehold::client::machine::renewal_wait;
    use leasehold::core::mix64;
    // Two handlers: one job claimed (sent at 0), then a second claim.
    let (mut m, a) = claimed(worker(2, 0, 64), &[1]);
    let round = LocalMs(renewal_wait(1_000, mix64(11 ^ 1u64.rotate_left(17))));
    assert!(
        requests(&a).contains(&WorkerRequest::Claim { max: 1 }),
        "{a:?}"
    );
    m.handle_reply(LocalMs(5), WorkerReply::Claimed(Ok(vec![job(2, 1)])));
    drain(&mut m);
    m.handle_timeout(round - 1);
    assert!(
        !requests(&drain(&mut m))
            .iter()
            .any(|r| matches!(r, WorkerRequest::Heartbeat { .. })),
        "not before the round"
    );
    m.handle_timeout(round);
    let sent = requests(&drain(&mut m));
    assert!(
        sent.contains(&WorkerRequest::Heartbeat {
            claims: vec![(JobId(1), 1), (JobId(2), 1)]
        }),
        "one round at its time carries both: {sent:?}"
    );
}

#[test]
fn claims_answered_after_shutdown_are_given_back_unstarted() {
    let mut m = WorkerMachine::new(worker(2, 0, 64), LocalMs(0));
    assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 2 }]);
    m.shutdown(LocalMs(1), LocalMs(1_000));
    drain(&mut m);
    m.handle_reply(
        LocalMs(2),
        WorkerReply::Claimed(Ok(vec![job(1, 1), job(2, 1)])),
    );
    let a = drain(&mut m);
    assert!(started(&a).is_empty(), "{a:?}");
    assert_eq!(
        settles(&a),
        [vec![
            (JobId(1), 1, Settle::Abandon { started: false }),
            (JobId(2), 1, Settle::Abandon { started: false })
        ]]
    );
}

#[test]
fn a_plain_renewal_stops_nothing_and_a_cancel_stops_once() {
    let (mut m, _) = claimed(worker(1, 0, 64), &[1]);
    let stops = |a: &[WorkerAction]| {
        a.iter()
            .filter(|a| matches!(a, WorkerAction::Stop { .. }))
            .count()
    };
    let mut at = m.poll_timeout().unwrap();
    for (cancel, expected) in [(false, 0), (true, 1), (true, 0), (false, 0)] {
        m.handle_timeout(at);
        drain(&mut m);
        let hb = HeartbeatReply {
            lease_until_ms: 0,
            cancel_requested: cancel,
        };
        m.handle_reply(at, WorkerReply::Heartbeated(Ok(vec![Ok(hb)])));
        let a = drain(&mut m);
        assert_eq!(stops(&a), expected, "cancel {cancel}: {a:?}");
        at = m.poll_timeout().unwrap();
    }
}

#[test]
fn a_settle_the_store_refuses_outright_ends_the_loop() {
    let (mut m, _) = claimed(worker(1, 0, 64), &[1]);
    m.handler_done(LocalMs(2), c(1, 1), Ok(()));
    let sent = settles(&drain(&mut m));
    assert_eq!(sent, [vec![(JobId(1), 1, Settle::Complete)]]);
    let hard = Error::store("settling", "disk I/O error");
    m.handle_reply(LocalMs(3), WorkerReply::Settled(Err(hard)));
    let a = drain(&mut m);
    assert!(matches!(a.last(), Some(WorkerAction::Failed(_))), "{a:?}");
    assert!(m.is_finished());
}

#[test]
fn draining_asks_at_once_when_the_last_outcome_settles_after_an_empty_claim() {
    let cfg = WorkerConfig {
        drain: true,
        ..worker(1, 1, 64)
    };
    // One job claimed; the claim ahead of it comes back empty while it
    // runs (nothing held is false then: no question yet).
    let (mut m, a) = claimed(cfg, &[1]);
    assert!(
        requests(&a).contains(&WorkerRequest::Claim { max: 1 }),
        "{a:?}"
    );
    let mut now = LocalMs(2);
    for _ in 0..6 {
        m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
        assert!(requests(&drain(&mut m)).is_empty());
        now = m.poll_timeout().unwrap();
        m.handle_timeout(now);
        assert_eq!(requests(&drain(&mut m)), [WorkerRequest::Claim { max: 1 }]);
    }
    m.handle_reply(now, WorkerReply::Claimed(Ok(vec![])));
    let next_claim = m.poll_timeout().unwrap();
    assert!(
        next_claim > now + 2,
        "backing off: {next_claim} after {now}"
    );
    // Its outcome settles: nothing is held and the last claim was empty:
    // ask now, not after the idle backoff's next claim.
    m.handler_done(now, c(1, 1), Ok(()));
    assert_eq!(settles(&drain(&mut m)).len(), 1);
    m.handle_reply(now + 1, WorkerReply::Settled(Ok(vec![Ok(JobState::Done)])));
    assert_eq!(requests(&drain(&mut m)), [WorkerRequest::DrainCheck]);
    // Without an empty claim since, a settle asks nothing.
    let (mut m, _) = claimed(cfg, &[1]);
    m.handle_reply(LocalMs(2), WorkerReply::Claimed(Ok(vec![job(2, 1)])));
    drain(&mut m);
    m.handler_done(LocalMs(3), c(1, 1), Ok(()));
    drain(&mut m);
    m.handle_reply(
        LocalMs(4),
        WorkerReply::Settled(Ok(vec![Ok(JobState::Done)])),
    );
    assert!(!requests(&drain(&mut m)).contains(&WorkerRequest::DrainCheck));
}

/// A queued job whose run-time limit passes leaves the queue alone, and
/// the jobs queued behind it start in their turn.
#[test]
fn a_queued_job_past_its_limit_fails_and_the_rest_stay_queued() {
    let mut m = WorkerMachine::new(worker(1, 2, 64), LocalMs(0));
    drain(&mut m);
    let timed = JobRecord {
        timeout_ms: Some(1_000),
        ..job(2, 1)
    };
    m.handle_reply(
        LocalMs(1),
        WorkerReply::Claimed(Ok(vec![job(1, 1), timed, job(3, 1)])),
    );
    assert_eq!(started(&drain(&mut m)), [1]);
    let limit = leasehold::core::local_deadline_ms(0, 1_000, DRIFT);
    m.handle_timeout(LocalMs(limit));
    let mut all = drain(&mut m);
    assert!(started(&all).is_empty(), "job 1 still runs: {all:?}");
    m.handler_done(LocalMs(limit + 1), c(1, 1), Ok(()));
    let a = drain(&mut m);
    assert_eq!(started(&a), [3], "{a:?}");
    all.extend(a);
    // The completer flushes within its delay.
    m.handle_timeout(LocalMs(limit + 10));
    all.extend(drain(&mut m));
    let sent: Vec<(JobId, u64, Settle)> = settles(&all).concat();
    assert!(
        sent.iter().any(|(id, _, s)| *id == JobId(2)
            && matches!(s, Settle::Fail(r) if r.contains("timed out before it started"))),
        "{sent:?}"
    );
}

/// F3 on the worker's side: a running job with a run-time limit is
/// stopped when the limit passes on the worker's clock (its claim's send
/// time plus the limit, less the drift allowance), whatever the renewals
/// say, and fails saying so; its handler's late outcome changes nothing.
/// A queued one whose limit passes fails too (given back for free, a job
/// whose limit is shorter than a claim takes to start would go round for
/// ever: simulator seed 8489 of the mixed scenario).
#[test]
fn a_job_past_its_run_time_limit_is_stopped_and_fails_saying_so() {
    let mut m = WorkerMachine::new(worker(1, 1, 64), LocalMs(0));
    drain(&mut m);
    let timed = |id| JobRecord {
        timeout_ms: Some(1_000),
        ..job(id, 1)
    };
    m.handle_reply(
        LocalMs(1),
        WorkerReply::Claimed(Ok(vec![timed(1), timed(2)])),
    );
    let a = drain(&mut m);
    assert_eq!(started(&a), [1]);
    let limit = leasehold::core::local_deadline_ms(0, 1_000, DRIFT);
    assert!(limit <= 1_000, "the drift allowance comes off: {limit}");
    let deadline = m.poll_timeout().unwrap();
    assert!(
        deadline <= LocalMs(limit),
        "capped at the limit: {deadline:?}"
    );
    // A renewal round answered with a long lease moves nothing past it.
    m.handle_timeout(LocalMs(limit - 1));
    let a = drain(&mut m);
    assert!(
        a.iter().all(|a| !matches!(a, WorkerAction::Stop { .. })),
        "{a:?}"
    );
    m.handle_timeout(LocalMs(limit));
    let a = drain(&mut m);
    let stopped: Vec<_> = a
        .iter()
        .filter_map(|a| match a {
            WorkerAction::Stop { claim, why } => Some((*claim, *why)),
            _ => None,
        })
        .collect();
    assert_eq!(stopped, [(c(1, 1), StopWhy::TimedOut)], "{a:?}");
    let sent: Vec<(JobId, u64, Settle)> = settles(&a).concat();
    assert!(
        sent.iter()
            .any(|(id, _, s)| *id == JobId(1)
                && matches!(s, Settle::Fail(r) if r.contains("timed out"))),
        "{sent:?}"
    );
    assert!(
        sent.iter().any(|(id, _, s)| *id == JobId(2)
            && matches!(s, Settle::Fail(r) if r.contains("timed out before it started"))),
        "the queued one fails too, its attempt counted: {sent:?}"
    );
    // The handler, stopped, reports late: nothing more is sent for it.
    m.handler_done(LocalMs(limit + 5), c(1, 1), Ok(()));
    let late = drain(&mut m);
    assert!(
        settles(&late)
            .concat()
            .iter()
            .all(|(id, _, _)| *id != JobId(1)),
        "{late:?}"
    );
}
