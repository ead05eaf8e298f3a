//! Lease cases (L1-L5) and the atomicity of a transaction.

use super::*;

pub fn lease_exclusive_then_released(make: &Make) {
    let w = World::new(make);
    let g1 = w.acquire("k", 1, 1000, 1).unwrap();
    assert_eq!(g1.token, 1);
    assert!(!g1.renewed);
    assert_eq!(g1.expires_at_ms, T0 + 1000);
    match w.acquire("k", 2, 1000, 1) {
        Err(Error::Held { key, holders }) => {
            assert_eq!(key, "k");
            assert_eq!(holders.len(), 1);
            assert_eq!(holders[0].holder.id, HolderId(1));
            assert_eq!(holders[0].holder.label.as_deref(), Some("h1"));
            assert_eq!(holders[0].expires_at_ms, T0 + 1000);
        }
        other => panic!("expected Held, got {other:?}"),
    }
    w.release("k", 1, g1.token).unwrap();
    let g2 = w.acquire("k", 2, 1000, 1).unwrap();
    assert_eq!(g2.token, 2, "L2: token grows across release");
    assert_eq!(w.inspect("k").last_token, 2);
}

pub fn lease_expiry_boundary(make: &Make) {
    let w = World::new(make);
    let g1 = w.acquire("k", 1, 100, 1).unwrap();
    w.at(T0 + 99);
    assert!(matches!(w.acquire("k", 2, 100, 1), Err(Error::Held { .. })));
    assert_eq!(w.inspect("k").holders.len(), 1);
    w.at(T0 + 100);
    assert!(
        w.inspect("k").holders.is_empty(),
        "expired exactly at expires_at"
    );
    assert_eq!(
        lost_reason(w.renew("k", 1, g1.token, 100)),
        LostReason::Expired
    );
    let g2 = w.acquire("k", 2, 100, 1).unwrap();
    assert_eq!(g2.token, 2, "L2: token grows across expiry");
    w.at(T0 + 101);
    assert_eq!(
        lost_reason(w.renew("k", 1, g1.token, 100)),
        LostReason::StaleToken
    );
    assert_eq!(
        lost_reason(w.release("k", 1, g1.token)),
        LostReason::StaleToken
    );
    assert_eq!(
        w.inspect("k").holders[0].token,
        2,
        "stale calls changed nothing"
    );
}

pub fn lease_renew_and_reacquire(make: &Make) {
    let w = World::new(make);
    let g = w.acquire("k", 1, 100, 1).unwrap();
    w.at(T0 + 50);
    let r = w.renew("k", 1, g.token, 100).unwrap();
    assert_eq!(
        (r.token, r.expires_at_ms, r.renewed),
        (g.token, T0 + 150, true)
    );
    w.at(T0 + 120);
    let again = w.acquire("k", 1, 200, 1).unwrap();
    assert_eq!(
        again.token, g.token,
        "re-acquire by the holder keeps its token"
    );
    assert!(again.renewed);
    assert_eq!(again.expires_at_ms, T0 + 320);
    assert_eq!(w.inspect("k").holders.len(), 1);
    // A shorter TTL never shortens a live grant (its holder relies on it).
    let short = w.renew("k", 1, g.token, 10).unwrap();
    assert_eq!(short.expires_at_ms, T0 + 320);
    let short = w.acquire("k", 1, 10, 1).unwrap();
    assert_eq!((short.token, short.expires_at_ms), (g.token, T0 + 320));
    w.at(T0 + 319);
    assert!(matches!(w.acquire("k", 2, 10, 1), Err(Error::Held { .. })));
}

pub fn lease_identity_checks(make: &Make) {
    let w = World::new(make);
    let g = w.acquire("k", 1, 100, 1).unwrap();
    assert_eq!(
        lost_reason(w.renew("k", 2, g.token, 100)),
        LostReason::NotHolder
    );
    assert_eq!(
        lost_reason(w.release("k", 2, g.token)),
        LostReason::NotHolder
    );
    assert_eq!(
        lost_reason(w.renew("k", 1, g.token + 1, 100)),
        LostReason::StaleToken
    );
    assert_eq!(lost_reason(w.release("k", 1, 0)), LostReason::StaleToken);
    assert_eq!(
        lost_reason(w.release("other", 1, g.token)),
        LostReason::StaleToken
    );
    assert_eq!(w.inspect("k").holders[0].expires_at_ms, T0 + 100);
    w.release("k", 1, g.token).unwrap();
    assert_eq!(
        lost_reason(w.release("k", 1, g.token)),
        LostReason::StaleToken
    );
}

pub fn lease_counting(make: &Make) {
    let w = World::new(make);
    let mut tokens = Vec::new();
    for h in 1..=3 {
        w.at(T0 + h as u64);
        tokens.push(w.acquire("k", h, 100, 3).unwrap().token);
    }
    assert_eq!(tokens, vec![1, 2, 3]);
    match w.acquire("k", 4, 100, 3) {
        Err(Error::Held { holders, .. }) => assert_eq!(holders.len(), 3),
        other => panic!("expected Held, got {other:?}"),
    }
    // Holder 1 expires first (acquired at T0 + 1).
    w.at(T0 + 101);
    let g4 = w.acquire("k", 4, 100, 3).unwrap();
    assert_eq!(g4.token, 4);
    let info = w.inspect("k");
    let ids: Vec<u128> = info.holders.iter().map(|h| h.holder.id.0).collect();
    assert_eq!(ids, vec![2, 3, 4]);
    w.release("k", 3, 3).unwrap();
    assert_eq!(w.acquire("k", 5, 100, 3).unwrap().token, 5);
}

/// The key's limit, not the caller's: fixed by the grant that finds the
/// key free, kept while it has holders (across handles: the store keeps
/// it), replaced once they are gone.
pub fn lease_limit_belongs_to_the_key(make: &Make) {
    let w = World::new(make);
    w.acquire("pool", 1, 100, 2).unwrap();
    w.acquire("pool", 2, 100, 2).unwrap();
    let before = w.snapshot(&["pool"], &[]);
    match w.acquire("pool", 3, 100, 3) {
        Err(Error::Invalid {
            field: leasehold::Field::Limit,
            reason,
        }) => {
            assert!(reason.contains('2') && reason.contains('3'), "{reason}");
        }
        other => panic!("expected a limit refusal, got {other:?}"),
    }
    // A current holder asking with another limit is refused too.
    assert!(matches!(
        w.acquire("pool", 1, 100, 1),
        Err(Error::Invalid {
            field: leasehold::Field::Limit,
            ..
        })
    ));
    assert_eq!(w.snapshot(&["pool"], &[]), before, "nothing changed");
    assert_eq!(w.inspect("pool").limit, 2);
    // Free again: the next grant sets a new limit.
    w.at(T0 + 100);
    w.acquire("pool", 3, 100, 3).unwrap();
    assert_eq!(w.inspect("pool").limit, 3);
}

pub fn lease_inspect_creates_nothing(make: &Make) {
    let w = World::new(make);
    let info = w.inspect("never");
    assert_eq!((info.last_token, info.holders.len()), (0, 0));
    assert_eq!(info.now_ms, T0, "inspect reports the store's clock");
    assert_eq!(
        lost_reason(w.release("never", 1, 1)),
        LostReason::StaleToken
    );
    assert_eq!(w.acquire("never", 1, 10, 1).unwrap().token, 1);
}

pub fn lease_hostile_keys(make: &Make) {
    let w = World::new(make);
    let long = "x".repeat(leasehold::core::MAX_KEY_BYTES);
    for key in [
        "../x",
        "/etc/passwd",
        "a/b/../../c",
        "ключ-🔒",
        " spaced ",
        "it's",
        "'; DROP TABLE leases; --",
        "back\\slash\\'",
        "$$dollar$$",
        "E'\\x00'",
        long.as_str(),
    ] {
        let g = w.acquire(key, 1, 100, 1).unwrap();
        assert_eq!(g.token, 1, "key {key:?}");
        assert_eq!(w.inspect(key).holders.len(), 1);
    }
    assert_eq!(w.inspect("x").holders.len(), 0, "keys do not collide");
    // Labels and fail reasons are stored as given, quotes and all.
    let label = "o'brien \\ $$ '; --";
    let h = Holder::with_label(HolderId(9), label).unwrap();
    w.tx(|tx| core::lease::acquire(tx, "labelled", &h, 100, 1))
        .unwrap();
    let info = w.inspect("labelled");
    assert_eq!(info.holders[0].holder.label.as_deref(), Some(label));
}

// ------------------------------------------------------------ atomicity

pub fn txn_rolls_back_on_error(make: &Make) {
    let w = World::new(make);
    w.acquire("kept", 1, 1000, 1).unwrap();
    w.push("q", JobSpec::new("kept"));
    let before = w.snapshot(&["kept", "k"], &["q"]);
    let holder = holder(2);
    let result: leasehold::Result<()> = w.tx(|tx| {
        core::lease::acquire(tx, "k", &holder, 1000, 1)?;
        core::job::enqueue(tx, "q", &JobSpec::new("lost"), &QueuePolicy::default())?;
        let policy = QueuePolicy::default();
        core::job::claim(tx, "q", HolderId(2), 1000, 10, &policy)?;
        Err(Error::transient("testing", "injected failure after writes"))
    });
    assert!(result.unwrap_err().is_transient());
    assert_eq!(
        w.snapshot(&["kept", "k"], &["q"]),
        before,
        "S1: nothing kept"
    );
    let next = w.push("q", JobSpec::new("next"));
    assert!(next > JobId(1));
}

/// Many records, a failed transaction that changed every fifth: each
/// gets its own old value back. (The mem store finds a record to restore
/// by its key's identity; its unit test checks that with more keys.)
pub fn txn_rolls_back_each_of_many_leases(make: &Make) {
    let w = World::new(make);
    let keys: Vec<String> = (0..300).map(|i| format!("key-{i}")).collect();
    // Each record its own (a TTL of its own makes its expiry differ),
    // all made in one transaction.
    let mine = holder(1);
    let tokens: Vec<u64> = w
        .tx(|tx| {
            let mut tokens = Vec::new();
            for (i, k) in (0..).zip(&keys) {
                tokens.push(core::lease::acquire(tx, k, &mine, 60_000 + 7 * i, 1)?.token);
            }
            Ok(tokens)
        })
        .unwrap();
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let before = w.snapshot(&names, &[]);
    let other = holder(2);
    let result: leasehold::Result<()> = w.tx(|tx| {
        for (i, key) in keys.iter().enumerate().step_by(5) {
            core::lease::release(tx, key, HolderId(1), tokens[i])?;
            core::lease::acquire(tx, key, &other, 60_000, 1)?;
        }
        Err(Error::transient("testing", "injected failure after writes"))
    });
    assert!(result.unwrap_err().is_transient());
    assert_eq!(w.snapshot(&names, &[]), before, "S1: nothing kept");
}

pub fn txn_lease_rolls_back_on_error(make: &Make) {
    let w = World::new(make);
    let g = w.acquire("kept", 1, 1000, 1).unwrap();
    let before = w.snapshot(&["kept", "k"], &[]);
    let holder = holder(2);
    let result: leasehold::Result<()> = w.tx(|tx| {
        // Each record touched more than once: made, then changed again;
        // changed, then changed again.
        let made = core::lease::acquire(tx, "k", &holder, 1000, 1)?;
        core::lease::release(tx, "k", holder.id, made.token)?;
        core::lease::acquire(tx, "k", &holder, 1000, 1)?;
        core::lease::release(tx, "kept", HolderId(1), g.token)?;
        core::lease::acquire(tx, "kept", &holder, 1000, 1)?;
        Err(Error::transient("testing", "injected failure after writes"))
    });
    assert!(result.unwrap_err().is_transient());
    assert_eq!(w.snapshot(&["kept", "k"], &[]), before, "S1: nothing kept");
    assert_eq!(
        w.acquire("k", 3, 10, 1).unwrap().token,
        1,
        "the token was not spent"
    );
}

pub fn store_clock_never_goes_back(make: &Make) {
    let w = World::new(make);
    let first = w.tx(|tx| Ok(tx.now_ms())).unwrap();
    assert_eq!(first, T0);
    w.at(T0 - 500);
    let second = w.tx(|tx| Ok(tx.now_ms())).unwrap();
    assert!(second >= first, "store time went back: {first} -> {second}");
    w.at(T0 + 10);
    assert_eq!(w.tx(|tx| Ok(tx.now_ms())).unwrap(), T0 + 10);
}
