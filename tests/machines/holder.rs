//! The holder machine: acquire, keep-alive, loss and release.

use super::*;

fn grant(token: u64) -> Grant {
    Grant {
        token,
        expires_at_ms: 0,
        granted_at_ms: 0,
        renewed: false,
    }
}

fn held() -> Error {
    Error::Held {
        key: "k".into(),
        holders: vec![],
    }
}

fn lost(reason: LostReason) -> Error {
    Error::Lost {
        target: Target::Lease {
            key: "k".into(),
            token: 1,
        },
        reason,
    }
}

fn holder(wait_ms: u64, keep_alive: bool) -> HolderConfig {
    HolderConfig {
        ttl_ms: 300,
        limit: 1,
        wait_ms,
        drift: DRIFT,
        keep_alive,
        seed: 7,
        busy_ms: 1_000,
    }
}

fn actions(m: &mut HolderMachine) -> Vec<HolderAction> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

fn sends(a: &[HolderAction]) -> Vec<HolderRequest> {
    a.iter()
        .filter_map(|a| match a {
            HolderAction::Send(r) => Some(*r),
            _ => None,
        })
        .collect()
}

#[test]
fn a_granted_acquire_reads_no_reply_time_and_a_refused_one_reads_it_once() {
    let reads = std::cell::Cell::new(0);
    let at = |ms| {
        let reads = &reads;
        move || {
            reads.set(reads.get() + 1);
            LocalMs(ms)
        }
    };
    let mut m = HolderMachine::new(holder(100, false), LocalMs(1_000));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    m.handle_reply(at(1_040), HolderReply::Acquired(Err(held())));
    assert_eq!(reads.get(), 1);
    // The refusal at 1,040 (not at 0) leaves 60 ms of the wait: a retry.
    let retry_at = m.poll_timeout().expect("a retry is scheduled");
    assert!(
        retry_at > LocalMs(1_040) && retry_at <= LocalMs(1_100),
        "{retry_at}"
    );
    m.handle_timeout(retry_at);
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    m.handle_reply(at(5_000), HolderReply::Acquired(Ok(grant(3))));
    assert_eq!(reads.get(), 1);
    let life = m.lifetime().expect("granted");
    // Counted from the retry's send, not from the reply the closure gives.
    assert_eq!(life.deadline(), retry_at + 297);
}

#[test]
fn a_grant_is_valid_from_the_send_time_minus_drift_and_renewed_near_a_third() {
    let mut m = HolderMachine::new(holder(0, true), LocalMs(1_000));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    // The reply comes 50 ms later: the deadline still counts from the send.
    m.handle_reply(LocalMs(1_050), HolderReply::Acquired(Ok(grant(4))));
    let a = actions(&mut m);
    assert!(matches!(
        a[..],
        [HolderAction::Event(HolderEvent::Granted {
            token: 4,
            renewed: false
        })]
    ));
    // 300 ms minus 1 % (3 ms): valid until 1,297 exclusive.
    assert!(m.is_valid(LocalMs(1_296)));
    assert!(!m.is_valid(LocalMs(1_297)));
    let renew_at = m.poll_timeout().unwrap();
    assert!(
        (1_090..=1_110).contains(&renew_at.ms()),
        "about TTL/3 after the send: {renew_at}"
    );
    m.handle_timeout(renew_at - 1);
    assert!(sends(&actions(&mut m)).is_empty(), "not before it is due");
    m.handle_timeout(renew_at);
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Renew { token: 4 }]);
    // The renewal sent at `renew_at` moves the deadline from there.
    m.handle_reply(renew_at + 80, HolderReply::Renewed(Ok(grant(4))));
    assert!(m.is_valid(renew_at + 296));
    assert!(!m.is_valid(renew_at + 297));
}

#[test]
fn a_held_key_is_retried_with_growing_backoff_until_the_wait_runs_out() {
    let mut m = HolderMachine::new(holder(100, true), LocalMs(0));
    let _ = actions(&mut m);
    let mut now = LocalMs(0);
    let mut waits = Vec::new();
    loop {
        m.handle_reply(now, HolderReply::Acquired(Err(held())));
        let a = actions(&mut m);
        if let [HolderAction::Event(HolderEvent::GaveUp(Error::Held { .. }))] = a[..] {
            break;
        }
        let at = m.poll_timeout().expect("a retry is scheduled");
        waits.push(at - now);
        now = at;
        m.handle_timeout(now);
        assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    }
    assert!(
        now >= LocalMs(100),
        "gave up only once the wait had run out (at {now})"
    );
    assert!(waits.len() >= 4, "{waits:?}");
    assert!(waits[3] > waits[0], "the backoff grows: {waits:?}");
    assert!(waits.iter().all(|&w| w <= 250));
}

#[test]
fn a_release_seen_while_waiting_retries_at_once() {
    let mut m = HolderMachine::new(holder(10_000, true), LocalMs(0));
    let _ = actions(&mut m);
    for _ in 0..6 {
        m.handle_reply(LocalMs(0), HolderReply::Acquired(Err(held())));
        let at = m.poll_timeout().unwrap();
        m.handle_timeout(at);
        let _ = actions(&mut m);
    }
    m.handle_reply(LocalMs(40), HolderReply::Acquired(Err(held())));
    assert!(m.poll_timeout().unwrap() > LocalMs(41));
    m.handle_wake(LocalMs(41));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
}

#[test]
fn no_answer_retries_and_a_committed_grant_is_found_again() {
    let mut m = HolderMachine::new(holder(0, true), LocalMs(0));
    let _ = actions(&mut m);
    let ambiguous = Error::transient("committing", "reply lost")
        .with_failure(leasehold::StoreFailure::Ambiguous);
    m.handle_reply(LocalMs(5), HolderReply::Acquired(Err(ambiguous)));
    assert!(
        actions(&mut m).is_empty(),
        "no give-up on an unknown outcome"
    );
    let at = m.poll_timeout().unwrap();
    m.handle_timeout(at);
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    let again = Grant {
        renewed: true,
        ..grant(9)
    };
    m.handle_reply(at + 1, HolderReply::Acquired(Ok(again)));
    assert!(matches!(
        actions(&mut m)[..],
        [HolderAction::Event(HolderEvent::Granted {
            token: 9,
            renewed: true
        })]
    ));
}

#[test]
fn a_loss_is_reported_once_whether_refused_or_timed_out() {
    let mut m = HolderMachine::new(holder(0, true), LocalMs(0));
    let _ = actions(&mut m);
    m.handle_reply(LocalMs(1), HolderReply::Acquired(Ok(grant(1))));
    let _ = actions(&mut m);
    let at = m.poll_timeout().unwrap();
    m.handle_timeout(at);
    let _ = actions(&mut m);
    m.handle_reply(at + 1, HolderReply::Renewed(Err(lost(LostReason::Expired))));
    let a = actions(&mut m);
    assert!(matches!(
        a[..],
        [HolderAction::Event(HolderEvent::Lost(LostReason::Expired))]
    ));
    m.handle_timeout(LocalMs(10_000));
    assert!(actions(&mut m).is_empty(), "reported once");
    assert!(!m.is_valid(at + 2));
    // Releasing a lease the store refused sends nothing.
    m.release(LocalMs(10_001));
    assert!(matches!(
        actions(&mut m)[..],
        [HolderAction::Event(HolderEvent::Released)]
    ));

    let mut m = HolderMachine::new(holder(0, false), LocalMs(0));
    let _ = actions(&mut m);
    m.handle_reply(LocalMs(1), HolderReply::Acquired(Ok(grant(2))));
    let _ = actions(&mut m);
    assert_eq!(
        m.poll_timeout(),
        Some(LocalMs(297)),
        "without keep-alive: only the deadline"
    );
    m.handle_timeout(LocalMs(297));
    assert!(matches!(
        actions(&mut m)[..],
        [HolderAction::Event(HolderEvent::Lost(
            LostReason::LocalDeadline
        ))]
    ));
    // Lost only by the local clock, the grant may still be live in the
    // store: releasing it sends the release, and ends when it is answered.
    m.release(LocalMs(298));
    assert_eq!(
        sends(&actions(&mut m)),
        [HolderRequest::Release { token: 2 }]
    );
    m.handle_reply(LocalMs(299), HolderReply::Released(Ok(())));
    assert!(matches!(
        actions(&mut m)[..],
        [HolderAction::Event(HolderEvent::Released)]
    ));
}

#[test]
fn a_failed_renewal_is_retried_sooner() {
    let mut m = HolderMachine::new(holder(0, true), LocalMs(0));
    let _ = actions(&mut m);
    m.handle_reply(LocalMs(0), HolderReply::Acquired(Ok(grant(1))));
    let _ = actions(&mut m);
    let at = m.poll_timeout().unwrap();
    m.handle_timeout(at);
    let _ = actions(&mut m);
    m.handle_reply(
        at + 2,
        HolderReply::Renewed(Err(Error::transient("renewing", "busy"))),
    );
    let next = m.poll_timeout().unwrap();
    assert!(
        next <= at + 2 + 25,
        "retried within a quarter interval: {next}"
    );
    m.handle_timeout(next);
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Renew { token: 1 }]);
}

#[test]
fn release_sends_one_release_and_reports_it() {
    let mut m = HolderMachine::new(holder(0, true), LocalMs(0));
    let _ = actions(&mut m);
    m.handle_reply(LocalMs(0), HolderReply::Acquired(Ok(grant(3))));
    let _ = actions(&mut m);
    m.release(LocalMs(10));
    assert_eq!(
        sends(&actions(&mut m)),
        [HolderRequest::Release { token: 3 }]
    );
    assert!(!m.is_valid(LocalMs(11)), "not valid once released");
    m.handle_reply(LocalMs(12), HolderReply::Released(Ok(())));
    assert!(matches!(
        actions(&mut m)[..],
        [HolderAction::Event(HolderEvent::Released)]
    ));
    assert!(m.is_done());
}

#[test]
fn transient_errors_are_retried_until_the_busy_timeout_then_reported_busy() {
    let mut m = HolderMachine::new(holder(0, true), LocalMs(0));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    let transient = || Error::transient("acquiring", "database is locked");
    let mut now = LocalMs(0);
    let mut tries = 1;
    loop {
        m.handle_reply(now, HolderReply::Acquired(Err(transient())));
        let acts = actions(&mut m);
        if let Some(HolderAction::Event(HolderEvent::Failed(e))) = acts.first() {
            match e {
                Error::Busy { waited_ms, last } => {
                    assert!(*waited_ms >= 1_000, "gave up after {waited_ms} ms");
                    assert!(last.is_transient());
                }
                other => panic!("expected Busy, got {other:?}"),
            }
            break;
        }
        assert!(acts.is_empty(), "{acts:?}");
        now = m.poll_timeout().expect("a retry is scheduled");
        m.handle_timeout(now);
        assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
        tries += 1;
        assert!(now <= LocalMs(1_300), "still retrying at {now}");
    }
    assert!(tries > 5, "only {tries} tries in the busy timeout");
    assert!(m.is_done());
}

#[test]
fn the_invariant_check_catches_a_request_not_in_flight_and_a_timer_left_due() {
    let mut m = HolderMachine::new(holder(1_000, true), LocalMs(0));
    assert_eq!(
        m.check(LocalMs(0), true),
        Ok(()),
        "the acquire queued is in flight"
    );
    // Stopping while the acquire still waits for the driver: it is queued
    // but no longer in flight (drivers send before they stop).
    let mut stopped = m.clone();
    stopped.release(LocalMs(0));
    let e = stopped
        .check(LocalMs(0), false)
        .expect_err("queued, not in flight");
    assert!(e.contains("1 acquire"), "{e}");
    actions(&mut m);
    m.handle_reply(LocalMs(1), HolderReply::Acquired(Err(held())));
    let retry_at = m.poll_timeout().expect("a retry is scheduled");
    assert_eq!(m.check(retry_at, false), Ok(()), "due, but no timeout yet");
    let e = m.check(retry_at, true).expect_err("due and not done");
    assert!(e.contains("left undone"), "{e}");
    m.handle_timeout(retry_at);
    assert_eq!(m.check(retry_at, true), Ok(()));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
}

#[test]
fn a_retry_waits_out_its_backoff_and_a_stopped_acquire_sends_nothing_more() {
    let mut m = HolderMachine::new(holder(10_000, true), LocalMs(0));
    let _ = actions(&mut m);
    for _ in 0..5 {
        m.handle_reply(LocalMs(100), HolderReply::Acquired(Err(held())));
        let _ = actions(&mut m);
        let at = m.poll_timeout().expect("a retry");
        assert!(at > LocalMs(100));
        m.handle_timeout(at - 1);
        assert!(sends(&actions(&mut m)).is_empty(), "not before its backoff");
        m.handle_timeout(at);
        assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    }
    m.handle_reply(LocalMs(200), HolderReply::Acquired(Err(held())));
    let _ = actions(&mut m);
    m.release(LocalMs(201));
    assert!(m.is_done(), "released while acquiring: stopped");
    assert_eq!(m.poll_timeout(), None);
    m.handle_timeout(LocalMs(5_000));
    m.handle_wake(LocalMs(5_001));
    assert!(actions(&mut m).is_empty(), "no acquire after it stopped");
}

#[test]
fn a_grants_renewals_are_jittered_by_the_seed_and_its_token() {
    let mut m = HolderMachine::new(holder(0, true), LocalMs(1_000));
    let _ = actions(&mut m);
    m.handle_reply(LocalMs(1_010), HolderReply::Acquired(Ok(grant(4))));
    let seed = 7 ^ 4;
    let first = LocalMs(1_000)
        + leasehold::client::machine::renewal_wait(100, leasehold::core::mix64(seed));
    assert_eq!(m.poll_timeout(), Some(first));
    assert_eq!(m.token(), Some(4));
    assert!(!m.is_done());
}

#[test]
fn a_renewal_by_hand_moves_the_deadline_from_its_send_and_a_refused_one_loses() {
    let mut m = HolderMachine::new(holder(0, true), LocalMs(0));
    let _ = actions(&mut m);
    m.handle_reply(LocalMs(0), HolderReply::Acquired(Ok(grant(5))));
    let _ = actions(&mut m);
    assert_eq!(m.lifetime().unwrap().deadline(), LocalMs(297));
    // A manual renew sent at 200, answered at 250: valid until 200 + 297.
    m.renewed_by_hand(LocalMs(200), LocalMs(250), &Ok(grant(5)));
    assert_eq!(m.lifetime().unwrap().deadline(), LocalMs(497));
    assert!(m.is_valid(LocalMs(496)));
    // One that got no answer changes nothing.
    m.renewed_by_hand(
        LocalMs(260),
        LocalMs(270),
        &Err(Error::transient("renewing", "busy")),
    );
    assert_eq!(m.lifetime().unwrap().deadline(), LocalMs(497));
    assert!(actions(&mut m).is_empty());
    // One the store refused: lost, reported once.
    m.renewed_by_hand(
        LocalMs(300),
        LocalMs(310),
        &Err(lost(LostReason::StaleToken)),
    );
    assert!(matches!(
        actions(&mut m)[..],
        [HolderAction::Event(HolderEvent::Lost(
            LostReason::StaleToken
        ))]
    ));
    assert!(!m.is_valid(LocalMs(311)));
    m.renewed_by_hand(
        LocalMs(320),
        LocalMs(330),
        &Err(lost(LostReason::StaleToken)),
    );
    assert!(actions(&mut m).is_empty(), "a loss is reported once");
    // Before a grant there is nothing to renew.
    let mut m = HolderMachine::new(holder(0, true), LocalMs(0));
    let _ = actions(&mut m);
    m.renewed_by_hand(LocalMs(1), LocalMs(2), &Err(lost(LostReason::StaleToken)));
    assert!(actions(&mut m).is_empty());
}

/// A holder made to start later sends nothing until then (its timer is
/// that instant), then acquires; a wake-up before then acquires at once;
/// one made to start now (or earlier) is `new`. A grant records the store
/// time it had left (at least the TTL) and a release refused as not held
/// is no failed release.
#[test]
fn a_holder_started_later_acquires_at_its_start_or_at_a_wake_up() {
    let mut m = HolderMachine::starting(holder(u64::MAX, false), LocalMs(10), LocalMs(500));
    assert!(sends(&actions(&mut m)).is_empty());
    assert_eq!(m.poll_timeout(), Some(LocalMs(500)));
    m.handle_timeout(LocalMs(499));
    assert!(sends(&actions(&mut m)).is_empty());
    m.handle_timeout(LocalMs(500));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);

    let mut m = HolderMachine::starting(holder(u64::MAX, false), LocalMs(10), LocalMs(500));
    m.handle_wake(LocalMs(20));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);

    for start in [0, 10] {
        let mut m = HolderMachine::starting(holder(0, false), LocalMs(10), LocalMs(start));
        assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
        assert_eq!(m.store_left_ms(), 0, "no grant yet");
        let longer = Grant {
            expires_at_ms: 9_000,
            granted_at_ms: 1_000,
            ..grant(2)
        };
        m.handle_reply(LocalMs(11), HolderReply::Acquired(Ok(longer)));
        assert_eq!(m.store_left_ms(), 8_000);
        m.release(LocalMs(12));
        assert_eq!(
            sends(&actions(&mut m)),
            [HolderRequest::Release { token: 2 }]
        );
        let refused = HolderReply::Released(Err(lost(LostReason::Expired)));
        m.handle_reply(LocalMs(13), refused);
        assert!(m.is_done() && !m.release_failed(), "refused: nothing left");
    }
    let mut m = HolderMachine::new(holder(0, false), LocalMs(0));
    actions(&mut m);
    m.handle_reply(LocalMs(1), HolderReply::Acquired(Ok(grant(2))));
    assert_eq!(m.store_left_ms(), 300, "at least the TTL");
    m.release(LocalMs(2));
    actions(&mut m);
    m.handle_reply(LocalMs(3), HolderReply::Released(Err(unreachable())));
    assert!(m.is_done() && m.release_failed());
}
