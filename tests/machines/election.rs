//! The election machine: campaign, lead until the local deadline or a
//! refused renewal, report each new leader once, resign (releasing the
//! key) or step down and campaign again.

use super::*;
use leasehold::{Holder, HolderInfo};

fn config(once: bool) -> ElectionConfig {
    ElectionConfig {
        lease: HolderConfig {
            ttl_ms: 300,
            limit: 1,
            wait_ms: 0,
            drift: DRIFT,
            keep_alive: true,
            seed: 5,
            busy_ms: 0,
        },
        once,
    }
}

fn actions(m: &mut ElectionMachine) -> Vec<ElectionAction> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

fn sends(a: &[ElectionAction]) -> Vec<HolderRequest> {
    a.iter()
        .filter_map(|a| match a {
            ElectionAction::Send(r) => Some(*r),
            _ => None,
        })
        .collect()
}

fn events(a: &[ElectionAction]) -> Vec<String> {
    a.iter()
        .filter_map(|a| match a {
            ElectionAction::Event(ElectionEvent::Elected { token }) => {
                Some(format!("elected {token}"))
            }
            ElectionAction::Event(ElectionEvent::Deposed(d)) => Some(format!("deposed: {d}")),
            ElectionAction::Event(ElectionEvent::Leader(h)) => Some(format!("leader {}", h.token)),
            ElectionAction::Event(ElectionEvent::Failed(e)) => Some(format!("failed: {e}")),
            ElectionAction::Send(_) => None,
        })
        .collect()
}

fn grant(token: u64) -> HolderReply {
    HolderReply::Acquired(Ok(Grant {
        token,
        expires_at_ms: 0,
        granted_at_ms: 0,
        renewed: false,
    }))
}

fn held_by(token: u64) -> HolderReply {
    HolderReply::Acquired(Err(Error::Held {
        key: "k".into(),
        holders: vec![HolderInfo {
            holder: Holder::with_label(HolderId(9), "other").unwrap(),
            token,
            expires_at_ms: 0,
        }],
    }))
}

/// Elected at `at` with `token` (the acquire sent at `at`).
/// The store's answer to an acquire that extended a grant this holder
/// already had (the same token, `renewed`).
fn extended(token: u64) -> HolderReply {
    HolderReply::Acquired(Ok(Grant {
        token,
        expires_at_ms: 0,
        granted_at_ms: 0,
        renewed: true,
    }))
}

/// [`extended`], the slot's expiry `left` ms after the store's grant
/// time (an earlier grant's longer TTL, kept by the extension).
fn extended_for(token: u64, left: u64) -> HolderReply {
    HolderReply::Acquired(Ok(Grant {
        token,
        expires_at_ms: 1_000 + left,
        granted_at_ms: 1_000,
        renewed: true,
    }))
}

/// A first campaign answered at `at` with `extending` (a grant of token 7
/// that extended an earlier one), and so giving that grant back.
fn giving_back(at: LocalMs, extending: HolderReply) -> ElectionMachine {
    let mut m = ElectionMachine::new(config(false), LocalMs(0));
    actions(&mut m);
    m.handle_reply(at, extending);
    assert_eq!(
        sends(&actions(&mut m)),
        [HolderRequest::Release { token: 7 }]
    );
    m
}

fn elected(once: bool, at: LocalMs, token: u64) -> ElectionMachine {
    let mut m = ElectionMachine::new(config(once), at);
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    m.handle_reply(at, grant(token));
    assert_eq!(events(&actions(&mut m)), [format!("elected {token}")]);
    m
}

#[test]
fn a_leader_acts_until_its_local_deadline_then_campaigns_again() {
    let mut m = elected(false, LocalMs(1_000), 4);
    assert_eq!(m.token(), Some(4));
    // 300 ms minus 1 % from the send.
    assert!(m.is_leader(LocalMs(1_296)));
    assert!(!m.is_leader(LocalMs(1_297)));
    assert_eq!(m.deadline(), Some(LocalMs(1_297)));
    // Renewals go out on the lease's schedule...
    let renew_at = m.poll_timeout().unwrap();
    m.handle_timeout(renew_at);
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Renew { token: 4 }]);
    // ...and when none is answered the deadline deposes the leader, which
    // releases the grant it may still hold in the store (so the next term
    // is a new grant, not this one extended), then campaigns again.
    m.handle_timeout(LocalMs(1_297));
    let a = actions(&mut m);
    assert_eq!(
        events(&a),
        ["deposed: leadership lost: local validity deadline passed"]
    );
    assert_eq!(sends(&a), [HolderRequest::Release { token: 4 }]);
    assert!(!m.is_leader(LocalMs(1_297)));
    m.handle_reply(LocalMs(1_298), HolderReply::Released(Ok(())));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    assert_eq!(m.token(), None);
    m.handle_reply(LocalMs(1_300), grant(6));
    assert_eq!(events(&actions(&mut m)), ["elected 6"]);
}

#[test]
fn a_refused_renewal_deposes_and_once_stops_there() {
    let mut m = elected(true, LocalMs(0), 2);
    let renew_at = m.poll_timeout().unwrap();
    m.handle_timeout(renew_at);
    actions(&mut m);
    let refused = Error::Lost {
        target: Target::Lease {
            key: "k".into(),
            token: 2,
        },
        reason: LostReason::Expired,
    };
    m.handle_reply(renew_at + 5, HolderReply::Renewed(Err(refused)));
    let a = actions(&mut m);
    assert_eq!(events(&a), ["deposed: leadership lost: expired"]);
    assert!(sends(&a).is_empty(), "once: no second campaign");
    assert!(m.is_done());
}

#[test]
fn each_new_leader_is_reported_once_and_transient_errors_do_not_end_a_campaign() {
    let mut m = ElectionMachine::new(config(false), LocalMs(0));
    actions(&mut m);
    let mut now = LocalMs(0);
    let mut seen = Vec::new();
    for reply in [
        held_by(3),
        held_by(3),
        HolderReply::Acquired(Err(Error::transient("acquiring", "busy"))),
        held_by(3),
        held_by(5),
    ] {
        m.handle_reply(now, reply);
        seen.extend(events(&actions(&mut m)));
        // The campaign retries on its backoff, at most 250 ms away.
        let next = m.poll_timeout().expect("still campaigning");
        assert!(next <= now + 250, "retry at {next} after {now}");
        now = next;
        m.handle_timeout(now);
        assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    }
    assert_eq!(seen, ["leader 3", "leader 5"]);
    // A release announced by the store: try again now.
    m.handle_reply(now, held_by(5));
    actions(&mut m);
    m.handle_wake(now + 1);
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
}

#[test]
fn resigning_releases_the_key_and_ends_the_election() {
    let mut m = elected(false, LocalMs(0), 7);
    m.resign(LocalMs(50));
    let a = actions(&mut m);
    assert_eq!(events(&a), ["deposed: resigned"]);
    assert_eq!(sends(&a), [HolderRequest::Release { token: 7 }]);
    assert!(!m.is_leader(LocalMs(50)), "no acting once resigned");
    m.handle_reply(LocalMs(55), HolderReply::Released(Ok(())));
    assert!(actions(&mut m).is_empty());
    assert!(m.is_done());
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn stepping_down_releases_then_campaigns_again() {
    let mut m = elected(false, LocalMs(0), 7);
    m.step_down(LocalMs(50));
    let a = actions(&mut m);
    assert_eq!(events(&a), ["deposed: resigned"]);
    assert_eq!(sends(&a), [HolderRequest::Release { token: 7 }]);
    m.handle_reply(LocalMs(55), HolderReply::Released(Ok(())));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    assert!(!m.is_done());
}

#[test]
fn resigning_with_an_acquire_in_flight_gives_its_grant_back() {
    let mut m = ElectionMachine::new(config(false), LocalMs(0));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    m.resign(LocalMs(1));
    assert!(!m.is_done(), "the acquire in flight may be granted");
    m.handle_reply(LocalMs(2), grant(8));
    let a = actions(&mut m);
    assert!(events(&a).is_empty(), "never elected: {a:?}");
    assert_eq!(sends(&a), [HolderRequest::Release { token: 8 }]);
    m.handle_reply(LocalMs(3), HolderReply::Released(Ok(())));
    assert!(m.is_done());

    // Resigning between attempts ends the campaign at once.
    let mut m = ElectionMachine::new(config(false), LocalMs(0));
    actions(&mut m);
    m.handle_reply(LocalMs(1), held_by(2));
    actions(&mut m);
    m.resign(LocalMs(2));
    assert!(m.is_done());
    m.handle_timeout(LocalMs(1_000));
    assert!(sends(&actions(&mut m)).is_empty());
}

#[test]
fn a_permanent_store_error_ends_the_election() {
    let mut m = ElectionMachine::new(config(false), LocalMs(0));
    actions(&mut m);
    m.handle_reply(
        LocalMs(1),
        HolderReply::Acquired(Err(Error::invalid(leasehold::Field::Key, "bad"))),
    );
    let a = actions(&mut m);
    assert_eq!(events(&a), ["failed: invalid key: bad"]);
    assert!(m.is_done());
}

#[test]
fn deposed_variants_read_as_text() {
    assert_eq!(Deposed::Resigned.to_string(), "resigned");
}

#[test]
fn each_term_renews_on_its_own_jitter_from_the_seed_the_term_and_the_token() {
    use leasehold::client::machine::renewal_wait;
    use leasehold::core::mix64;
    // Term 1 (config seed 5): the holder's seed is mix64(5 ^ 1), its
    // grant's lifetime seed that ^ the token, and the first renewal (round
    // 0) comes renewal_wait(TTL / 3, mix64(seed ^ 0)) after the send.
    let mut m = elected(false, LocalMs(0), 4);
    let first = renewal_wait(100, mix64(mix64(5 ^ 1) ^ 4));
    assert_eq!(m.poll_timeout(), Some(LocalMs(first)));
    // Term 2 draws from mix64(5 ^ 2): terms do not renew in step.
    m.step_down(LocalMs(10));
    actions(&mut m);
    m.handle_reply(LocalMs(11), HolderReply::Released(Ok(())));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    m.handle_reply(LocalMs(20), grant(6));
    assert_eq!(events(&actions(&mut m)), ["elected 6"]);
    let second = renewal_wait(100, mix64(mix64(5 ^ 2) ^ 6));
    assert_eq!(m.poll_timeout(), Some(LocalMs(11 + second)));
}

#[test]
fn a_leader_keeps_its_term_alive_even_if_its_lease_config_says_not_to() {
    let mut cfg = config(false);
    cfg.lease.keep_alive = false;
    let mut m = ElectionMachine::new(cfg, LocalMs(0));
    actions(&mut m);
    m.handle_reply(LocalMs(0), grant(3));
    actions(&mut m);
    let renew_at = m.poll_timeout().unwrap();
    assert!(
        renew_at < m.deadline().unwrap(),
        "a renewal before the deadline: {renew_at:?}"
    );
    m.handle_timeout(renew_at);
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Renew { token: 3 }]);
}

#[test]
fn resigning_after_stepping_down_is_final() {
    let mut m = elected(false, LocalMs(0), 7);
    m.step_down(LocalMs(50));
    assert_eq!(
        sends(&actions(&mut m)),
        [HolderRequest::Release { token: 7 }]
    );
    m.resign(LocalMs(51));
    assert!(
        actions(&mut m).is_empty(),
        "the release is already on its way"
    );
    m.handle_reply(LocalMs(55), HolderReply::Released(Ok(())));
    assert!(
        sends(&actions(&mut m)).is_empty(),
        "resigned: no second campaign"
    );
    assert!(m.is_done());
    // Stepping down after stepping down changes nothing: it campaigns again.
    let mut m = elected(false, LocalMs(0), 7);
    m.step_down(LocalMs(50));
    m.step_down(LocalMs(51));
    actions(&mut m);
    m.handle_reply(LocalMs(55), HolderReply::Released(Ok(())));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
}

#[test]
fn no_campaign_attempt_while_a_resignation_is_in_flight() {
    let mut m = elected(false, LocalMs(0), 7);
    m.step_down(LocalMs(50));
    actions(&mut m);
    // The release is unanswered: time passing sends nothing.
    m.handle_timeout(LocalMs(5_000));
    assert!(actions(&mut m).is_empty());
    assert!(!m.is_leader(LocalMs(5_000)));
    m.check(LocalMs(5_000)).unwrap();
}

/// The release after a loss at the local deadline failed (the store out
/// of reach), and the next campaign's acquire extended the lost term's
/// grant (the same token, `renewed`): that is not a new term. It is given
/// back by token, and the campaign goes on to a grant with a new token.
#[test]
fn a_campaign_that_extends_the_lost_terms_grant_gives_it_back() {
    let mut m = elected(false, LocalMs(1_000), 4);
    m.handle_timeout(LocalMs(1_297));
    assert_eq!(
        sends(&actions(&mut m)),
        [HolderRequest::Release { token: 4 }]
    );
    m.handle_reply(LocalMs(1_298), HolderReply::Released(Err(unreachable())));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    m.handle_reply(LocalMs(1_300), extended(4));
    let a = actions(&mut m);
    assert_eq!(events(&a), Vec::<String>::new(), "not a new term");
    assert_eq!(sends(&a), [HolderRequest::Release { token: 4 }]);
    assert!(!m.is_leader(LocalMs(1_300)));
    assert_eq!(m.token(), None);
    m.check(LocalMs(1_300)).unwrap();
    m.handle_reply(LocalMs(1_301), HolderReply::Released(Ok(())));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    m.handle_reply(LocalMs(1_302), grant(5));
    assert_eq!(events(&actions(&mut m)), ["elected 5"]);
}

/// A grant extended by an election's first campaign: an earlier grant of
/// the same holder id, whose release went unanswered (an earlier election
/// of the same client, or a process restarted under a fixed `--holder`,
/// maybe still running). Leading under its token would give two terms one
/// token: it is given back, and the campaign goes on to a new token, even
/// for an election of one term (`once`).
#[test]
fn a_first_campaign_that_extends_an_earlier_grant_gives_it_back() {
    for once in [false, true] {
        let mut fresh = ElectionMachine::new(config(once), LocalMs(0));
        actions(&mut fresh);
        fresh.handle_reply(LocalMs(0), extended(7));
        let a = actions(&mut fresh);
        assert_eq!(events(&a), Vec::<String>::new(), "not a new term");
        assert_eq!(sends(&a), [HolderRequest::Release { token: 7 }]);
        assert!(!fresh.is_leader(LocalMs(0)));
        fresh.check(LocalMs(0)).unwrap();
        fresh.handle_reply(LocalMs(1), HolderReply::Released(Ok(())));
        assert_eq!(sends(&actions(&mut fresh)), [HolderRequest::Acquire]);
        fresh.handle_reply(LocalMs(2), grant(8));
        assert_eq!(events(&actions(&mut fresh)), ["elected 8"]);
        assert!(fresh.is_leader(LocalMs(2)));
    }
}

/// A give-back whose release fails (the store may still count the grant
/// live) campaigns again only once the store has surely let that grant
/// lapse: the extending answer's arrival plus the store time the grant had
/// left (at least the TTL), stretched by the drift bound. At once, the
/// store would extend the same grant again, to be given back again, with
/// no pause for as long as releases fail and acquires succeed. A release
/// refused as not held (the slot is gone) lets it campaign at once.
#[test]
fn a_give_back_whose_release_fails_campaigns_again_once_the_grant_has_lapsed() {
    // The store's answer: the TTL asked for (300), or more left from an
    // earlier grant with a longer TTL.
    for (store_left, extending) in [(300, extended(7)), (5_000, extended_for(7, 5_000))] {
        let lapse = LocalMs(leasehold::core::local_lapse_ms(10, store_left, DRIFT));
        assert!(
            lapse.0 > 10 + store_left,
            "stretched past the store's own time"
        );
        let mut m = giving_back(LocalMs(10), extending);
        m.handle_reply(LocalMs(11), HolderReply::Released(Err(unreachable())));
        assert!(sends(&actions(&mut m)).is_empty(), "no acquire at once");
        assert!(!m.is_done() && !m.holds_grant());
        assert_eq!(m.poll_timeout(), Some(lapse));
        m.check(LocalMs(11)).unwrap();
        // Wake-ups (a release elsewhere) do not cut the pause short.
        m.handle_wake(LocalMs(12));
        m.handle_timeout(LocalMs(lapse.0 - 1));
        m.handle_wake(LocalMs(lapse.0 - 1));
        assert!(sends(&actions(&mut m)).is_empty());
        // From the lapse on, its timer or a wake-up sends the acquire.
        if store_left == 300 {
            m.handle_timeout(lapse);
        } else {
            m.handle_wake(lapse);
        }
        assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
        m.handle_reply(lapse, grant(8));
        assert_eq!(events(&actions(&mut m)), ["elected 8"]);
    }

    // Refused as not held: nothing left to lapse, the campaign goes on.
    let mut m = giving_back(LocalMs(0), extended(7));
    let gone = Error::Lost {
        target: Target::Lease {
            key: "k".into(),
            token: 7,
        },
        reason: LostReason::Expired,
    };
    m.handle_reply(LocalMs(1), HolderReply::Released(Err(gone)));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);

    // Resigned while it waits: the election ends, nothing more is sent.
    let mut m = giving_back(LocalMs(0), extended(7));
    m.handle_reply(LocalMs(1), HolderReply::Released(Err(unreachable())));
    m.resign(LocalMs(2));
    assert!(m.is_done());
    m.handle_timeout(LocalMs(1_000_000));
    assert!(sends(&actions(&mut m)).is_empty());
}

/// A step-down whose release went unanswered, then the next campaign's
/// acquire extends the resigned term's grant: given back, as after a loss.
#[test]
fn a_campaign_that_extends_a_resigned_terms_grant_gives_it_back() {
    let mut m = elected(false, LocalMs(0), 4);
    m.step_down(LocalMs(10));
    assert_eq!(
        sends(&actions(&mut m)),
        [HolderRequest::Release { token: 4 }]
    );
    m.handle_reply(LocalMs(11), HolderReply::Released(Err(unreachable())));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    m.handle_reply(LocalMs(12), extended(4));
    let a = actions(&mut m);
    assert_eq!(events(&a), Vec::<String>::new(), "not a new term");
    assert_eq!(sends(&a), [HolderRequest::Release { token: 4 }]);
    m.check(LocalMs(12)).unwrap();
    // Resigned meanwhile: the give-back's answer ends the election.
    m.resign(LocalMs(13));
    m.handle_reply(LocalMs(14), HolderReply::Released(Ok(())));
    assert!(sends(&actions(&mut m)).is_empty());
    assert!(m.is_done());
}

/// Whether a grant may still be live in the store (the driver keeps the
/// key's mark until it may not): not while campaigning; while leading;
/// while a release (a step-down's, or a give-back's) is unanswered; not
/// once it is answered.
#[test]
fn a_grant_is_held_from_its_answer_until_its_release_is_answered() {
    let mut m = ElectionMachine::new(config(false), LocalMs(0));
    actions(&mut m);
    assert!(!m.holds_grant(), "campaigning");
    m.handle_reply(LocalMs(1), grant(3));
    actions(&mut m);
    assert!(m.holds_grant(), "leading");
    m.step_down(LocalMs(2));
    assert_eq!(
        sends(&actions(&mut m)),
        [HolderRequest::Release { token: 3 }]
    );
    assert!(m.holds_grant(), "the release is unanswered");
    m.handle_reply(LocalMs(3), HolderReply::Released(Ok(())));
    assert_eq!(sends(&actions(&mut m)), [HolderRequest::Acquire]);
    assert!(!m.holds_grant(), "released, campaigning again");
    m.handle_reply(LocalMs(4), extended(3));
    actions(&mut m);
    assert!(m.holds_grant(), "being given back");
    m.handle_reply(LocalMs(5), HolderReply::Released(Ok(())));
    actions(&mut m);
    assert!(!m.holds_grant(), "given back");
}
