//! Flow control on every store: pause and resume (F2).

use super::*;
use leasehold::core::{QueueConfig, Wake};

fn config(w: &World, queue: &str) -> QueueConfig {
    w.tx(|tx| core::job::queue_config(tx, queue)).unwrap()
}

fn set_paused(w: &World, queue: &str, paused: bool) -> bool {
    w.tx(|tx| core::job::set_paused(tx, queue, paused)).unwrap()
}

/// A paused queue starts nothing, fleet-wide, until it is resumed: its
/// running jobs renew and settle, pushes are accepted, its claims that run
/// out are retried as ever; another queue is untouched; resuming wakes
/// idle workers and claims go on in claim order.
pub fn queue_pause_starts_nothing_until_resumed(make: &Make) {
    let w = World::new(make);
    assert_eq!(config(&w, "q"), QueueConfig::default(), "never configured");
    let a = w.push("q", JobSpec::new("a"));
    let b = w.push("q", JobSpec::new("b"));
    let running = w.claim_one("q", 1, 1_000);
    assert_eq!(running.id, a);
    assert!(set_paused(&w, "q", true), "paused");
    assert!(!set_paused(&w, "q", true), "already paused");
    assert!(config(&w, "q").paused);
    assert!(!config(&w, "other").paused, "only the queue named");
    // Pushes are accepted; claims start nothing, whoever asks.
    let c = w.push("q", JobSpec::new("c"));
    for h in [1, 2] {
        assert!(w.claim("q", h, 1_000, 10).is_empty(), "paused: holder {h}");
    }
    let next = w
        .tx(|tx| core::job::next_look(tx, "q").map(|l| l.change_in_ms))
        .unwrap();
    assert_eq!(next, None, "nothing starts by time alone while paused");
    // Another queue claims as ever.
    let o = w.push("other", JobSpec::new("o"));
    assert_eq!(w.claim_one("other", 2, 1_000).id, o);
    // The running job renews and completes.
    let token = running.claim.unwrap().token;
    w.tx(|tx| core::job::heartbeat(tx, a, HolderId(1), token, 1_000))
        .unwrap();
    w.complete(&running, 1).unwrap();
    assert_eq!(w.get(a).state, JobState::Done);
    // A claim taken just before the pause that runs out meanwhile is
    // retried as ever, and still not claimed.
    set_paused(&w, "q", false);
    let lapsing = w.claim_one("q", 3, 100);
    assert_eq!(lapsing.id, b);
    set_paused(&w, "q", true);
    w.at(T0 + 5_000);
    assert!(w.claim("q", 1, 1_000, 10).is_empty());
    assert_eq!(w.get(b).state, JobState::Ready, "its claim ran out");
    assert_eq!(w.stats("q"), counts(2, 0, 0, 1, 0, 0));
    // Resuming wakes idle workers; claims go on in claim order.
    let epoch = w.store.epoch(Wake::JobReady);
    assert!(set_paused(&w, "q", false), "resumed");
    assert!(!set_paused(&w, "q", false), "already running");
    assert!(
        w.store.epoch(Wake::JobReady) > epoch || w.store.epoch(Wake::JobReady) == 0,
        "a resume wakes idle workers (where the store can tell)"
    );
    let ids: Vec<JobId> = w.claim("q", 1, 1_000, 10).iter().map(|j| j.id).collect();
    assert_eq!(
        ids,
        vec![c, b],
        "b's retry runs after its backoff, behind c"
    );
}

/// Pausing names a queue like any queue operation; a pause in a
/// transaction that fails is not kept (S1).
pub fn queue_pause_checks_its_input_and_rolls_back(make: &Make) {
    let w = World::new(make);
    for bad in ["", "a\nb"] {
        let r = w.tx(|tx| core::job::set_paused(tx, bad, true));
        assert!(
            matches!(&r, Err(Error::Invalid { field, .. }) if *field == leasehold::Field::Queue),
            "{bad:?}: {r:?}"
        );
    }
    let id = w.push("q", JobSpec::new("a"));
    let r: leasehold::Result<()> = w.tx(|tx| {
        core::job::set_paused(tx, "q", true)?;
        Err(Error::NotFound(JobId(0)))
    });
    assert!(r.is_err());
    assert!(
        !config(&w, "q").paused,
        "the failed transaction's pause is gone"
    );
    assert_eq!(w.claim_one("q", 1, 1_000).id, id);
}
