//! One grant's lifetime: the local deadline (L3), the renewal schedule and
//! its jitter, what a renewal's answer does, the end. Every rule pinned to
//! its exact value, so a rule changed by one unit fails here.

use super::*;
use leasehold::client::machine::{renew_every, renewal_retry, renewal_wait, End, Lifetime};
use leasehold::core::mix64;

/// Sent at 1 000, TTL 300, renewed every 100 (1 % drift: valid to 1 297).
fn life(seed: u64) -> Lifetime {
    Lifetime::granted(LocalMs(1_000), 300, DRIFT, 100, seed)
}

#[test]
fn the_renewal_rules_have_their_exact_values() {
    assert_eq!(renew_every(300), 100);
    assert_eq!(renew_every(2), 1, "at least 1 ms");
    // The interval with -10 % .. +10 % of jitter, from the draw.
    assert_eq!(renewal_wait(100, 0), 90);
    assert_eq!(renewal_wait(100, 19), 109);
    assert_eq!(renewal_wait(100, 20), 90, "the draw wraps at a fifth");
    assert_eq!(renewal_wait(100, 7), 97);
    assert_eq!(renewal_wait(3, 5), 3, "a span of at least 1 ms");
    assert_eq!(renewal_wait(50, 13), 48);
    assert_eq!(renewal_retry(100), 25);
    assert_eq!(renewal_retry(3), 1, "at least 1 ms");
}

#[test]
fn the_deadline_counts_from_the_send_and_ends_exactly_there() {
    let l = life(9);
    assert_eq!(l.deadline(), LocalMs(1_297));
    assert!(l.is_valid(LocalMs(1_296)));
    assert!(!l.is_valid(LocalMs(1_297)));
    assert!(
        l.is_valid(LocalMs(0)),
        "before the send is before the deadline"
    );
    assert_eq!(l.end(), None);
    let mut l = life(9);
    assert_eq!(l.handle_timeout(LocalMs(1_296)), None);
    assert_eq!(
        l.handle_timeout(LocalMs(1_297)),
        Some(LostReason::LocalDeadline)
    );
    assert_eq!(l.end(), Some(End::Lost(LostReason::LocalDeadline)));
    assert_eq!(l.handle_timeout(LocalMs(1_400)), None, "reported once");
    assert_eq!(l.poll_timeout(), None, "nothing more once ended");
}

#[test]
fn each_renewal_is_scheduled_by_the_seed_and_its_round() {
    let seed = 0x5eed;
    let mut l = life(seed);
    let first = LocalMs(1_000) + renewal_wait(100, mix64(seed));
    assert_eq!(l.poll_timeout(), Some(first));
    assert!(!l.renewal_due(first - 1));
    assert!(l.renewal_due(first));
    l.renewal_sent(first);
    assert_eq!(l.in_flight(), Some(first));
    assert!(!l.renewal_due(first + 1), "one in flight at a time");
    assert_eq!(
        l.poll_timeout(),
        Some(l.deadline()),
        "the deadline while in flight"
    );
    l.renewed(first, first + 10);
    assert_eq!(l.in_flight(), None);
    assert_eq!(l.deadline(), first + 297, "the TTL from the renewal's send");
    let second = first + renewal_wait(100, mix64(seed ^ 1));
    assert_eq!(l.poll_timeout(), Some(second));
    l.renewal_sent(second);
    l.renewed(second, second);
    let third = second + renewal_wait(100, mix64(seed ^ 2));
    assert_eq!(l.poll_timeout(), Some(third));
    // Another seed, other waits.
    let waits: std::collections::BTreeSet<u64> = (0..40)
        .map(|s| life(s).poll_timeout().map_or(0, |t| t.ms()))
        .collect();
    assert!(waits.len() > 10, "jittered: {waits:?}");
}

#[test]
fn a_renewal_is_due_only_before_the_deadline_and_while_live() {
    // Renewed every 400 with a TTL of 300: the schedule falls past the
    // deadline, where no renewal is due.
    let l = Lifetime::granted(LocalMs(0), 300, DRIFT, 400, 1);
    let next = l.poll_timeout().unwrap_or(LocalMs::MAX);
    assert_eq!(next, l.deadline(), "the deadline comes first");
    assert!(!l.renewal_due(LocalMs(297)));
    assert!(!l.renewal_due(LocalMs(500)));
    let mut l = life(1);
    let due = l.poll_timeout().unwrap_or(LocalMs::MAX);
    l.finish();
    assert!(!l.renewal_due(due), "not once finished");
    let mut l = life(1);
    l.stop_renewing();
    assert!(!l.renewal_due(LocalMs(1_200)));
    assert_eq!(l.poll_timeout(), Some(LocalMs(1_297)));
    let never = Lifetime::granted(LocalMs(0), 300, DRIFT, 0, 1);
    assert!(!never.renewal_due(LocalMs(200)), "every 0: never renewed");
    assert_eq!(never.poll_timeout(), Some(never.deadline()));
}

#[test]
fn renewals_move_the_deadline_forward_only() {
    let mut l = life(3);
    // A renewal sent before the grant's own send (a manual one racing it)
    // cannot move the deadline back.
    l.renewed(LocalMs(900), LocalMs(1_100));
    assert_eq!(l.deadline(), LocalMs(1_297));
    l.renewed(LocalMs(1_100), LocalMs(1_150));
    assert_eq!(l.deadline(), LocalMs(1_397));
    // A reply for another send leaves the one in flight alone.
    l.renewal_sent(LocalMs(1_200));
    l.renewed(LocalMs(1_150), LocalMs(1_210));
    assert_eq!(l.in_flight(), Some(LocalMs(1_200)));
    assert_eq!(l.deadline(), LocalMs(1_447));
    let mut ended = life(3);
    ended.finish();
    ended.renewed(LocalMs(1_100), LocalMs(1_110));
    assert_eq!(ended.deadline(), LocalMs(1_297), "no renewal revives it");
    assert!(!ended.is_valid(LocalMs(1_200)));
}

#[test]
fn a_failed_renewal_is_retried_after_a_quarter_and_a_refused_one_loses() {
    let mut l = life(3);
    l.renewal_sent(LocalMs(1_100));
    l.renewal_failed(LocalMs(1_100), LocalMs(1_110));
    assert_eq!(l.in_flight(), None);
    assert_eq!(
        l.poll_timeout(),
        Some(LocalMs(1_135)),
        "a quarter of 100 later"
    );
    assert_eq!(l.deadline(), LocalMs(1_297), "no answer, no extension");
    // A failure of some other send keeps the one in flight.
    l.renewal_sent(LocalMs(1_135));
    l.renewal_failed(LocalMs(1_100), LocalMs(1_140));
    assert_eq!(l.in_flight(), Some(LocalMs(1_135)));
    let mut never = Lifetime::granted(LocalMs(0), 300, DRIFT, 0, 1);
    never.renewal_failed(LocalMs(0), LocalMs(10));
    assert_eq!(
        never.poll_timeout(),
        Some(never.deadline()),
        "not rescheduled"
    );
    let mut ended = life(3);
    ended.finish();
    ended.renewal_failed(LocalMs(1_100), LocalMs(1_110));
    assert_eq!(ended.poll_timeout(), None);
    let mut l = life(3);
    l.renewal_sent(LocalMs(1_100));
    assert_eq!(
        l.refused(LocalMs(1_100), LostReason::StaleToken),
        Some(LostReason::StaleToken)
    );
    assert_eq!(l.in_flight(), None);
    assert_eq!(l.refused(LocalMs(1_100), LostReason::Expired), None, "once");
    assert_eq!(l.end(), Some(End::Lost(LostReason::StaleToken)));
}

#[test]
fn marked_lost_finished_and_extended_by_someone_else() {
    let mut l = Lifetime::until(LocalMs(500));
    assert_eq!(l.deadline(), LocalMs(500));
    assert_eq!(
        l.poll_timeout(),
        Some(LocalMs(500)),
        "no schedule of its own"
    );
    l.extend_to(LocalMs(400));
    assert_eq!(l.deadline(), LocalMs(500), "never back");
    l.extend_to(LocalMs(700));
    assert_eq!(l.deadline(), LocalMs(700));
    assert!(l.is_valid(LocalMs(699)));
    assert_eq!(l.mark_lost(LostReason::Expired), Some(LostReason::Expired));
    assert_eq!(l.mark_lost(LostReason::StaleToken), None, "reported once");
    assert!(!l.is_valid(LocalMs(10)));
    l.extend_to(LocalMs(900));
    assert_eq!(l.deadline(), LocalMs(700), "a lost grant is not extended");
    let mut f = Lifetime::until(LocalMs(500));
    assert!(f.finish());
    assert!(!f.finish(), "finished once");
    assert_eq!(f.end(), Some(End::Finished));
    assert!(!f.is_valid(LocalMs(10)));
    assert_eq!(f.mark_lost(LostReason::Expired), None);
}

#[test]
fn a_renewal_due_at_the_deadline_is_not_due() {
    // Renewed every 300 (± 10 %) with a TTL of 300: the first renewal
    // falls at 270..=329, around the deadline (297).
    let l = (0..64)
        .map(|seed| Lifetime::granted(LocalMs(0), 300, DRIFT, 300, seed))
        .find(|l| l.renewal_due(LocalMs(296)))
        .expect("a seed whose renewal falls before the deadline");
    assert!(l.renewal_due(LocalMs(296)), "one ms before the deadline");
    assert!(
        !l.renewal_due(LocalMs(297)),
        "at the deadline: lost, not due"
    );
}

#[test]
fn only_a_live_grant_or_one_lost_at_its_local_deadline_is_left_to_release() {
    let mut l = life(4);
    assert!(l.may_be_live_in_store(), "live");
    assert_eq!(
        l.handle_timeout(LocalMs(1_297)),
        Some(LostReason::LocalDeadline)
    );
    assert!(
        l.may_be_live_in_store(),
        "past the local deadline the store may still count it live"
    );
    for reason in [LostReason::StaleToken, LostReason::Expired] {
        let mut refused = life(4);
        refused.renewal_sent(LocalMs(1_100));
        refused.refused(LocalMs(1_100), reason);
        assert!(!refused.may_be_live_in_store(), "refused: {reason:?}");
    }
    let mut finished = life(4);
    finished.finish();
    assert!(!finished.may_be_live_in_store(), "finished");
}
