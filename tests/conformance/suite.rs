//! The conformance suite: written once, run against every `Store`.
//!
//! Each case drives the pure rules (`leasehold::core`) through a store whose
//! clock is a `ManualClock`, so boundary instants are exact. A store joins
//! the suite with one line: `conformance_cases!(|clock| make_store(clock));`
//! in `main.rs`.

use leasehold::core::{self, lease::LeaseInfo, JobQuery, Txn};
use leasehold::{
    Error, Holder, HolderId, JobId, JobRecord, JobSpec, JobState, LostReason, ManualClock,
    QueuePolicy, StateCounts, Store, StoreExt,
};
use std::sync::Arc;

/// Builds a fresh, empty store on the given clock.
pub type Make = dyn Fn(&ManualClock) -> Arc<dyn Store>;

pub const T0: u64 = 1_000_000;

pub struct World {
    pub store: Arc<dyn Store>,
    pub clock: ManualClock,
    pub policy: QueuePolicy,
}

pub fn holder(n: u128) -> Holder {
    Holder::with_label(HolderId(n), &format!("h{n}")).unwrap()
}

impl World {
    pub fn new(make: &Make) -> World {
        let clock = ManualClock::new(T0);
        World {
            store: make(&clock),
            clock,
            policy: QueuePolicy {
                backoff_base_ms: 100,
                backoff_max_ms: 10_000,
                jitter_seed: 7,
                quarantine_expiries: 0,
            },
        }
    }

    pub fn at(&self, now_ms: u64) {
        self.clock.set(now_ms);
    }

    pub fn tx<R>(
        &self,
        f: impl FnMut(&mut dyn Txn) -> leasehold::Result<R>,
    ) -> leasehold::Result<R> {
        self.store.txn(f)
    }

    pub fn acquire(
        &self,
        key: &str,
        h: u128,
        ttl: u64,
        limit: u32,
    ) -> leasehold::Result<core::Grant> {
        let holder = holder(h);
        self.tx(|tx| core::lease::acquire(tx, key, &holder, ttl, limit))
    }

    pub fn renew(
        &self,
        key: &str,
        h: u128,
        token: u64,
        ttl: u64,
    ) -> leasehold::Result<core::Grant> {
        self.tx(|tx| core::lease::renew(tx, key, HolderId(h), token, ttl))
    }

    pub fn release(&self, key: &str, h: u128, token: u64) -> leasehold::Result<()> {
        self.tx(|tx| core::lease::release(tx, key, HolderId(h), token))
    }

    pub fn inspect(&self, key: &str) -> LeaseInfo {
        self.tx(|tx| core::lease::inspect(tx, key)).unwrap()
    }

    pub fn push(&self, queue: &str, spec: JobSpec) -> JobId {
        self.tx(|tx| core::job::enqueue(tx, queue, &spec, &QueuePolicy::default()))
            .unwrap()
            .id
    }

    pub fn claim(&self, queue: &str, h: u128, lease: u64, max: usize) -> Vec<JobRecord> {
        let policy = self.policy;
        self.tx(|tx| core::job::claim(tx, queue, HolderId(h), lease, max, &policy))
            .unwrap()
    }

    pub fn claim_one(&self, queue: &str, h: u128, lease: u64) -> JobRecord {
        let mut jobs = self.claim(queue, h, lease, 1);
        assert_eq!(jobs.len(), 1, "expected one claimable job");
        jobs.remove(0)
    }

    pub fn complete(&self, job: &JobRecord, h: u128) -> leasehold::Result<()> {
        let token = job.claim.unwrap().token;
        self.tx(|tx| core::job::complete(tx, job.id, HolderId(h), token))
    }

    pub fn fail(&self, job: &JobRecord, h: u128, reason: &str) -> leasehold::Result<JobState> {
        let token = job.claim.unwrap().token;
        let policy = self.policy;
        self.tx(|tx| core::job::fail(tx, job.id, HolderId(h), token, reason, &policy))
    }

    pub fn get(&self, id: JobId) -> JobRecord {
        let policy = self.policy;
        self.tx(|tx| core::job::get(tx, id, &policy)).unwrap()
    }

    pub fn stats(&self, queue: &str) -> StateCounts {
        let policy = self.policy;
        self.tx(|tx| core::job::stats(tx, queue, &policy)).unwrap()
    }

    pub fn list(&self, queue: &str, state: Option<JobState>) -> Vec<JobRecord> {
        let policy = self.policy;
        self.tx(|tx| core::job::list(tx, queue, state, JobId(0), 10_000, &policy))
            .unwrap()
    }

    /// Everything observable about the given keys and queues, for
    /// "nothing changed" checks.
    pub fn snapshot(&self, keys: &[&str], queues: &[&str]) -> String {
        let mut out = String::new();
        for key in keys {
            out += &format!("{key}: {:?}\n", self.inspect(key).holders);
            out += &format!("{key} last: {}\n", self.inspect(key).last_token);
        }
        for q in queues {
            out += &format!("{q}: {:?}\n", self.stats(q));
            for job in self.list(q, None) {
                out += &format!("{job:?}\n");
            }
        }
        out
    }
}

fn lost_reason<T: std::fmt::Debug>(r: leasehold::Result<T>) -> LostReason {
    match r {
        Err(Error::Lost { reason, .. }) => reason,
        other => panic!("expected Lost, got {other:?}"),
    }
}

fn counts(
    ready: u64,
    scheduled: u64,
    running: u64,
    done: u64,
    dead: u64,
    cancelled: u64,
) -> StateCounts {
    StateCounts([ready, scheduled, running, done, dead, cancelled])
}

// ---------------------------------------------------------------- leases

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
            field: "limit",
            reason,
        }) => {
            assert!(reason.contains('2') && reason.contains('3'), "{reason}");
        }
        other => panic!("expected a limit refusal, got {other:?}"),
    }
    // A current holder asking with another limit is refused too.
    assert!(matches!(
        w.acquire("pool", 1, 100, 1),
        Err(Error::Invalid { field: "limit", .. })
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

pub fn txn_lease_rolls_back_on_error(make: &Make) {
    let w = World::new(make);
    let g = w.acquire("kept", 1, 1000, 1).unwrap();
    let before = w.snapshot(&["kept", "k"], &[]);
    let holder = holder(2);
    let result: leasehold::Result<()> = w.tx(|tx| {
        core::lease::acquire(tx, "k", &holder, 1000, 1)?;
        core::lease::release(tx, "kept", HolderId(1), g.token)?;
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

// ---------------------------------------------------------------- jobs

pub fn job_claim_order(make: &Make) {
    let w = World::new(make);
    let spec = |p: i32, run_at: Option<u64>| JobSpec {
        priority: p,
        run_at_ms: run_at,
        ..JobSpec::new(format!("p{p}"))
    };
    let a = w.push("q", spec(0, None)); // fifo 1
    let b = w.push("q", spec(5, None));
    let c = w.push("q", spec(0, None)); // fifo 2
    let d = w.push("q", spec(5, Some(T0 - 10_000))); // past: treated as now, after b by id
    let e = w.push("q", spec(-1, None));
    let f = w.push("q", spec(9, Some(T0 + 50))); // scheduled, highest priority
    let g = w.push("other", spec(100, None));
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(w.claim_one("q", 1, 1000).id);
    }
    assert_eq!(order, vec![b, d, a, c, e], "Q5 order");
    assert!(w.claim("q", 1, 1000, 1).is_empty(), "f is not due yet");
    w.at(T0 + 50);
    assert_eq!(w.claim_one("q", 1, 1000).id, f, "due exactly at run_at");
    assert_eq!(w.claim_one("other", 1, 1000).id, g);
}

pub fn job_priority_beats_earlier_run_at(make: &Make) {
    let w = World::new(make);
    let low = w.push(
        "q",
        JobSpec {
            priority: 1,
            ..JobSpec::new("low")
        },
    );
    w.at(T0 + 10);
    let high = w.push(
        "q",
        JobSpec {
            priority: 2,
            ..JobSpec::new("high")
        },
    );
    w.at(T0 + 20);
    let late_low = w.push(
        "q",
        JobSpec {
            priority: 1,
            ..JobSpec::new("low2")
        },
    );
    let got: Vec<JobId> = w.claim("q", 1, 100, 3).iter().map(|j| j.id).collect();
    assert_eq!(got, vec![high, low, late_low]);
}

pub fn job_lifecycle_complete(make: &Make) {
    let w = World::new(make);
    let id = w.push("q", JobSpec::new(vec![0u8, 1, 2, 255]));
    assert_eq!(w.stats("q"), counts(1, 0, 0, 0, 0, 0));
    let job = w.claim_one("q", 1, 100);
    assert_eq!(job.id, id);
    assert_eq!(&*job.payload, &[0u8, 1, 2, 255]);
    assert_eq!(job.attempts, 1, "Q4: counted at claim");
    assert_eq!(job.state, JobState::Running);
    let claim = job.claim.unwrap();
    assert_eq!(
        (claim.holder, claim.token, claim.lease_until_ms),
        (HolderId(1), 1, T0 + 100)
    );
    assert_eq!(w.stats("q"), counts(0, 0, 1, 0, 0, 0));
    assert!(w.claim("q", 2, 100, 5).is_empty(), "Q1: no double claim");
    // Wrong holder, wrong token: refused, nothing changes.
    let token = claim.token;
    let r = w.tx(|tx| core::job::complete(tx, id, HolderId(2), token));
    assert_eq!(lost_reason(r), LostReason::NotHolder);
    let r = w.tx(|tx| core::job::complete(tx, id, HolderId(1), token + 1));
    assert_eq!(lost_reason(r), LostReason::StaleToken);
    w.complete(&job, 1).unwrap();
    let done = w.get(id);
    assert_eq!(
        (done.state, done.claim, done.finished_at_ms),
        (JobState::Done, None, Some(T0))
    );
    assert_eq!(
        lost_reason(w.complete(&job, 1)),
        LostReason::StaleToken,
        "Q2: at most once"
    );
    assert_eq!(w.stats("q"), counts(0, 0, 0, 1, 0, 0));
}

pub fn job_heartbeat_extends_claim(make: &Make) {
    let w = World::new(make);
    let id = w.push("q", JobSpec::new("x"));
    let job = w.claim_one("q", 1, 100);
    let token = job.claim.unwrap().token;
    w.at(T0 + 99);
    let hb = w
        .tx(|tx| core::job::heartbeat(tx, id, HolderId(1), token, 100))
        .unwrap();
    assert_eq!((hb.lease_until_ms, hb.cancel_requested), (T0 + 199, false));
    w.at(T0 + 150);
    assert!(
        w.claim("q", 2, 100, 1).is_empty(),
        "still claimed after heartbeat"
    );
    let hb = w
        .tx(|tx| core::job::heartbeat(tx, id, HolderId(1), token, 10))
        .unwrap();
    assert_eq!(
        hb.lease_until_ms,
        T0 + 199,
        "a shorter lease never shortens"
    );
    w.at(T0 + 199);
    let r = w.tx(|tx| core::job::heartbeat(tx, id, HolderId(1), token, 100));
    assert_eq!(
        lost_reason(r),
        LostReason::Expired,
        "expired exactly at lease_until"
    );
    assert_eq!(lost_reason(w.complete(&job, 1)), LostReason::Expired);
}

pub fn job_expiry_counts_attempt(make: &Make) {
    let w = World::new(make);
    let id = w.push(
        "q",
        JobSpec {
            max_attempts: 2,
            ..JobSpec::new("x")
        },
    );
    let first = w.claim_one("q", 1, 100);
    w.at(T0 + 100);
    let c = w.stats("q");
    assert_eq!(
        c.get(JobState::Running),
        0,
        "Q3: not running past its lease"
    );
    let job = w.get(id);
    assert_eq!((job.attempts, job.expiries), (1, 1));
    assert_eq!(job.last_error.as_deref(), Some("lease expired"));
    assert!(matches!(job.state, JobState::Scheduled | JobState::Ready));
    w.at(job.run_at_ms);
    let second = w.claim_one("q", 2, 100);
    assert_eq!((second.attempts, second.claim.unwrap().token), (2, 2));
    assert_eq!(lost_reason(w.complete(&first, 1)), LostReason::StaleToken);
    w.at(job.run_at_ms + 100);
    let job = w.get(id);
    assert_eq!(
        job.state,
        JobState::Dead,
        "Q4: expiry is an attempt; out of attempts"
    );
    assert_eq!((job.attempts, job.expiries), (2, 2));
    assert_eq!(job.last_error.as_deref(), Some("lease expired"));
    assert_eq!(w.stats("q"), counts(0, 0, 0, 0, 1, 0));
}

pub fn job_quarantine_crash_loop(make: &Make) {
    let mut w = World::new(make);
    w.policy.quarantine_expiries = 2;
    w.policy.backoff_base_ms = 1;
    w.policy.backoff_max_ms = 1;
    let id = w.push(
        "q",
        JobSpec {
            max_attempts: 50,
            ..JobSpec::new("x")
        },
    );
    let mut now = T0;
    for round in 1..=2 {
        w.at(now);
        let job = w.claim_one("q", 1, 10);
        assert_eq!(job.attempts, round);
        now += 11;
    }
    w.at(now);
    let job = w.get(id);
    assert_eq!(job.state, JobState::Dead);
    assert_eq!(job.expiries, 2);
    assert!(job.last_error.as_deref().unwrap().contains("crash loop"));

    // When the expiry that trips the quarantine also used the last attempt,
    // the job is dead for running out of attempts: the plain reason.
    let id = w.push(
        "q2",
        JobSpec {
            max_attempts: 2,
            ..JobSpec::new("y")
        },
    );
    for round in 1..=2 {
        w.at(now);
        let job = w.claim_one("q2", 1, 10);
        assert_eq!(job.attempts, round);
        now += 11;
    }
    w.at(now);
    let job = w.get(id);
    assert_eq!(
        (job.state, job.attempts, job.expiries),
        (JobState::Dead, 2, 2)
    );
    assert_eq!(job.last_error.as_deref(), Some("lease expired"));
}

pub fn job_fail_backoff_then_dead(make: &Make) {
    let w = World::new(make);
    let id = w.push(
        "q",
        JobSpec {
            max_attempts: 3,
            ..JobSpec::new("x")
        },
    );
    let mut expected_min = T0;
    for attempt in 1..=2u32 {
        let job = w.claim_one("q", 1, 1000);
        assert_eq!(job.attempts, attempt);
        assert_eq!(
            w.fail(&job, 1, &format!("boom {attempt}")).unwrap(),
            JobState::Scheduled
        );
        let rec = w.get(id);
        let full = 100u64 << (attempt - 1);
        let now = w.tx(|tx| Ok(tx.now_ms())).unwrap();
        assert!(
            rec.run_at_ms >= now + full / 2 && rec.run_at_ms <= now + full,
            "backoff {} not in [{}, {}]",
            rec.run_at_ms - now,
            full / 2,
            full
        );
        assert_eq!(
            rec.run_at_ms,
            now + core::backoff_ms(&w.policy, id, attempt)
        );
        assert!(w.claim("q", 1, 1000, 1).is_empty(), "not before backoff");
        expected_min = rec.run_at_ms;
        w.at(rec.run_at_ms);
    }
    assert!(expected_min > T0);
    let job = w.claim_one("q", 1, 1000);
    assert_eq!(w.fail(&job, 1, "final").unwrap(), JobState::Dead);
    let rec = w.get(id);
    assert_eq!((rec.state, rec.attempts), (JobState::Dead, 3));
    assert_eq!(rec.last_error.as_deref(), Some("final"));
    assert_eq!(
        lost_reason(w.fail(&job, 1, "again")),
        LostReason::StaleToken
    );
}

pub fn job_cancel_and_retry(make: &Make) {
    let w = World::new(make);
    let policy = w.policy;
    let ready = w.push("q", JobSpec::new("r"));
    let later = w.push(
        "q",
        JobSpec {
            delay_ms: 1000,
            ..JobSpec::new("s")
        },
    );
    assert_eq!(w.stats("q"), counts(1, 1, 0, 0, 0, 0));
    assert_eq!(
        w.tx(|tx| core::job::cancel(tx, later, &policy)).unwrap(),
        JobState::Cancelled
    );
    let running = w.claim_one("q", 1, 100);
    assert_eq!(running.id, ready);
    assert_eq!(
        w.tx(|tx| core::job::cancel(tx, ready, &policy)).unwrap(),
        JobState::Running
    );
    let token = running.claim.unwrap().token;
    let hb = w
        .tx(|tx| core::job::heartbeat(tx, ready, HolderId(1), token, 100))
        .unwrap();
    assert!(
        hb.cancel_requested,
        "worker sees the cancel at its heartbeat"
    );
    assert_eq!(
        w.fail(&running, 1, "cancelled by request").unwrap(),
        JobState::Cancelled
    );
    assert_eq!(w.stats("q"), counts(0, 0, 0, 0, 0, 2));
    match w.tx(|tx| core::job::cancel(tx, ready, &policy)) {
        Err(Error::InvalidState {
            state: JobState::Cancelled,
            ..
        }) => {}
        other => panic!("expected InvalidState, got {other:?}"),
    }
    w.tx(|tx| core::job::retry(tx, ready, &QueuePolicy::default()))
        .unwrap();
    let rec = w.get(ready);
    assert_eq!(
        (rec.state, rec.attempts, rec.cancel_requested),
        (JobState::Ready, 0, false)
    );
    let job = w.claim_one("q", 2, 100);
    assert_eq!(
        (job.id, job.attempts, job.claim.unwrap().token),
        (ready, 1, 2)
    );
    match w.tx(|tx| core::job::retry(tx, ready, &QueuePolicy::default())) {
        Err(Error::InvalidState {
            state: JobState::Running,
            ..
        }) => {}
        other => panic!("expected InvalidState, got {other:?}"),
    }
    // A cancel requested on a job whose claim then expires ends cancelled.
    w.tx(|tx| core::job::cancel(tx, ready, &policy)).unwrap();
    w.at(T0 + 100);
    assert_eq!(w.get(ready).state, JobState::Cancelled);
    assert!(matches!(
        w.tx(|tx| core::job::cancel(tx, JobId(999), &policy)),
        Err(Error::NotFound(JobId(999)))
    ));
}

pub fn job_unique_key(make: &Make) {
    let w = World::new(make);
    let spec = || JobSpec {
        unique_key: Some("u".into()),
        ..JobSpec::new("x")
    };
    let first = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &QueuePolicy::default()))
        .unwrap();
    assert!(first.created);
    let second = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &QueuePolicy::default()))
        .unwrap();
    assert_eq!((second.id, second.created), (first.id, false));
    let other_queue = w
        .tx(|tx| core::job::enqueue(tx, "q2", &spec(), &QueuePolicy::default()))
        .unwrap();
    assert!(other_queue.created, "unique per queue");
    let job = w.claim_one("q", 1, 100);
    let while_running = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &QueuePolicy::default()))
        .unwrap();
    assert_eq!(while_running.id, first.id, "running is live");
    w.complete(&job, 1).unwrap();
    let after = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &QueuePolicy::default()))
        .unwrap();
    assert!(
        after.created && after.id > first.id,
        "terminal frees the key"
    );
    // Retrying a job whose key another live job holds is refused.
    let policy = w.policy;
    w.tx(|tx| core::job::cancel(tx, after.id, &policy)).unwrap();
    let holder_now = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &policy))
        .unwrap();
    assert!(holder_now.created);
    match w.tx(|tx| core::job::retry(tx, after.id, &policy)) {
        Err(Error::Invalid {
            field: "unique_key",
            ..
        }) => {}
        other => panic!("expected a unique_key refusal, got {other:?}"),
    }
    w.tx(|tx| core::job::cancel(tx, holder_now.id, &policy))
        .unwrap();
    w.tx(|tx| core::job::retry(tx, after.id, &policy)).unwrap();
    assert_eq!(w.stats("q"), counts(1, 0, 0, 1, 0, 1));
    // A key's holder may have expired into a terminal state that nothing
    // has written down yet: retry judges it as it is now.
    let spec2 = || JobSpec {
        unique_key: Some("u2".into()),
        max_attempts: 1,
        ..JobSpec::new("y")
    };
    let a = w
        .tx(|tx| core::job::enqueue(tx, "r", &spec2(), &policy))
        .unwrap();
    w.tx(|tx| core::job::cancel(tx, a.id, &policy)).unwrap();
    let b = w
        .tx(|tx| core::job::enqueue(tx, "r", &spec2(), &policy))
        .unwrap();
    assert!(b.created);
    assert_eq!(w.claim_one("r", 1, 100).id, b.id);
    w.at(T0 + 100);
    w.tx(|tx| core::job::retry(tx, a.id, &policy)).unwrap();
    assert_eq!(w.get(b.id).state, JobState::Dead);
    assert_eq!(w.get(a.id).state, JobState::Ready);
}

/// A unique key held by a job whose last claim ran out with no attempts
/// left: enqueue finds the holder dead (as of now) and makes a new job.
pub fn job_unique_key_freed_by_a_final_expiry(make: &Make) {
    let w = World::new(make);
    let policy = w.policy;
    let spec = || JobSpec {
        max_attempts: 1,
        unique_key: Some("nightly".into()),
        ..JobSpec::new("x")
    };
    let first = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &policy))
        .unwrap();
    let claimed = w.claim_one("q", 1, 100);
    assert_eq!(claimed.id, first.id);
    // Its only attempt runs out; nothing has looked at the queue since.
    w.at(T0 + 100);
    let second = w
        .tx(|tx| core::job::enqueue(tx, "q", &spec(), &policy))
        .unwrap();
    assert!(second.created, "the dead holder does not keep its key");
    assert_ne!(second.id, first.id);
    assert_eq!(w.get(first.id).state, JobState::Dead);
    assert_eq!(w.get(second.id).state, JobState::Ready);
}

pub fn job_batch_claim(make: &Make) {
    let w = World::new(make);
    let ids: Vec<JobId> = (0..10)
        .map(|i| w.push("q", JobSpec::new(vec![i])))
        .collect();
    let first = w.claim("q", 1, 100, 4);
    assert_eq!(
        first.iter().map(|j| j.id).collect::<Vec<_>>(),
        ids[..4].to_vec()
    );
    let rest = w.claim("q", 2, 100, 100);
    assert_eq!(
        rest.iter().map(|j| j.id).collect::<Vec<_>>(),
        ids[4..].to_vec()
    );
    assert!(w.claim("q", 3, 100, 100).is_empty());
    assert_eq!(w.stats("q"), counts(0, 0, 10, 0, 0, 0));
}

pub fn job_purge(make: &Make) {
    let w = World::new(make);
    let a = w.push("q", JobSpec::new("a"));
    let job = w.claim_one("q", 1, 10_000);
    w.complete(&job, 1).unwrap();
    w.at(T0 + 1000);
    let b = w.push("q", JobSpec::new("b"));
    let job_b = w.claim_one("q", 1, 10_000);
    w.complete(&job_b, 1).unwrap();
    let running = w.push("q", JobSpec::new("c"));
    w.claim_one("q", 1, 100_000);
    w.at(T0 + 1500);
    let n = w
        .tx(|tx| core::job::purge(tx, "q", 1000, 100, &QueuePolicy::default()))
        .unwrap();
    assert_eq!(n, 1, "only a finished 1500 ms ago");
    let policy = w.policy;
    assert!(matches!(
        w.tx(|tx| core::job::get(tx, a, &policy)),
        Err(Error::NotFound(_))
    ));
    assert_eq!(w.get(b).state, JobState::Done);
    assert_eq!(w.get(running).state, JobState::Running);
    let n = w
        .tx(|tx| core::job::purge(tx, "q", 0, 100, &QueuePolicy::default()))
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(w.stats("q"), counts(0, 0, 1, 0, 0, 0));
}

pub fn job_list_pages_and_filters(make: &Make) {
    let w = World::new(make);
    let ids: Vec<JobId> = (0..5).map(|i| w.push("q", JobSpec::new(vec![i]))).collect();
    w.claim_one("q", 1, 100);
    let policy = w.policy;
    let page = w
        .tx(|tx| core::job::list(tx, "q", None, ids[1], 2, &policy))
        .unwrap();
    assert_eq!(
        page.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![ids[2], ids[3]]
    );
    let running = w.list("q", Some(JobState::Running));
    assert_eq!(
        running.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![ids[0]]
    );
    assert_eq!(w.list("q", Some(JobState::Ready)).len(), 4);
    assert!(w.list("empty", None).is_empty());
}

pub fn job_time_driven_changes_are_complete_and_visible(make: &Make) {
    let w = World::new(make);
    // More due jobs than one maintenance chunk: all become ready at once.
    for i in 0..600u32 {
        let spec = JobSpec {
            delay_ms: 10,
            ..JobSpec::new(i.to_be_bytes().to_vec())
        };
        w.push("q", spec);
    }
    assert_eq!(w.stats("q"), counts(0, 600, 0, 0, 0, 0));
    w.at(T0 + 10);
    assert_eq!(w.stats("q"), counts(600, 0, 0, 0, 0, 0));
    // A single job read after its run_at reads as ready, without a claim.
    let id = w.push(
        "r",
        JobSpec {
            delay_ms: 5,
            ..JobSpec::new("x")
        },
    );
    assert_eq!(w.get(id).state, JobState::Scheduled);
    w.at(T0 + 15);
    assert_eq!(w.get(id).state, JobState::Ready);
    // run_at at the far edge (now + one year) is accepted.
    let edge = JobSpec {
        run_at_ms: Some(T0 + 15 + leasehold::core::MAX_TTL_MS),
        ..JobSpec::new("edge")
    };
    let edge = w.push("r", edge);
    assert_eq!(w.get(edge).state, JobState::Scheduled);
}

pub fn job_hostile_queue_names(make: &Make) {
    let w = World::new(make);
    let long = "q".repeat(leasehold::core::MAX_KEY_BYTES);
    let names = [
        "it's",
        "'; DROP TABLE jobs; --",
        "a\"b",
        "../../etc",
        "очередь",
        "{queue}",
        long.as_str(),
    ];
    for (i, name) in names.iter().enumerate() {
        let id = w.push(name, JobSpec::new(vec![i as u8]));
        assert_eq!(w.stats(name), counts(1, 0, 0, 0, 0, 0), "{name:?}");
        let job = w.claim_one(name, 1, 100);
        assert_eq!((job.id, &*job.queue), (id, *name));
        w.complete(&job, 1).unwrap();
    }
    for name in names {
        assert_eq!(
            w.stats(name),
            counts(0, 0, 0, 1, 0, 0),
            "queues stay apart: {name:?}"
        );
    }
    // Payload bytes, unique keys and fail reasons come back as given.
    let payload: Vec<u8> = (0..=255u8).chain(*b"'\\$$").collect();
    let spec = JobSpec {
        unique_key: Some("u'1\\; --".into()),
        ..JobSpec::new(payload.clone())
    };
    let id = w.push("bytes", spec);
    let job = w.claim_one("bytes", 1, 100);
    assert_eq!((job.id, &*job.payload), (id, payload.as_slice()));
    let reason = "it's broken \\ $$; DROP TABLE jobs; --";
    w.fail(&job, 1, reason).unwrap();
    let job = w.get(id);
    assert_eq!(job.last_error.as_deref(), Some(reason));
    assert_eq!(job.unique_key.as_deref(), Some("u'1\\; --"));
    assert_eq!(&*w.get(id).payload, payload.as_slice());
    // Extreme priorities round-trip through every write path.
    for priority in [i32::MIN, i32::MAX, -1] {
        let id = w.push(
            "extreme",
            JobSpec {
                priority,
                ..JobSpec::new("x")
            },
        );
        let job = w.claim_one("extreme", 1, 100);
        assert_eq!((job.id, job.priority), (id, priority));
        w.fail(&job, 1, "again").unwrap();
        assert_eq!(w.get(id).priority, priority);
    }
}

/// The one drain rule: nothing ready, running, or due, where a retry in
/// backoff counts as due and a first attempt's delay does not.
pub fn job_drain_rule(make: &Make) {
    let w = World::new(make);
    let drained = |w: &World| {
        let policy = w.policy;
        w.tx(|tx| core::job::drained(tx, "q", &policy)).unwrap()
    };
    assert!(drained(&w), "an empty queue is drained");
    w.push(
        "q",
        JobSpec {
            delay_ms: 3_600_000,
            ..JobSpec::new("later")
        },
    );
    assert!(drained(&w), "a delayed first attempt does not hold a drain");
    let id = w.push(
        "q",
        JobSpec {
            max_attempts: 2,
            ..JobSpec::new("flaky")
        },
    );
    assert!(!drained(&w), "ready");
    let job = w.claim_one("q", 1, 1_000);
    assert_eq!(job.id, id);
    assert!(!drained(&w), "running");
    assert_eq!(w.fail(&job, 1, "boom").unwrap(), JobState::Scheduled);
    assert!(!drained(&w), "a retry waiting out its backoff is due");
    w.at(T0 + 10_000);
    let job = w.claim_one("q", 1, 1_000);
    w.complete(&job, 1).unwrap();
    assert!(drained(&w));
}

/// A renewal round and a completer batch: one transaction each, every job
/// decided on its own (a lost claim or a bad reason spoils nothing else).
pub fn job_batch_heartbeat_and_settle(make: &Make) {
    use core::job::Settle;
    let w = World::new(make);
    for i in 0..5u8 {
        w.push(
            "q",
            JobSpec {
                max_attempts: 1,
                ..JobSpec::new(vec![i])
            },
        );
    }
    let jobs = w.claim("q", 1, 100, 5);
    let token = |i: usize| jobs[i].claim.unwrap().token;
    w.at(T0 + 50);
    let claims: Vec<(JobId, u64)> = (0..5).map(|i| (jobs[i].id, token(i))).collect();
    let mut with_stale = claims.clone();
    with_stale[4].1 += 7;
    let replies = w
        .tx(|tx| core::job::heartbeat_many(tx, HolderId(1), &with_stale, 100))
        .unwrap();
    assert_eq!(replies.len(), 5);
    for r in &replies[..4] {
        assert_eq!(r.as_ref().unwrap().lease_until_ms, T0 + 150);
    }
    assert_eq!(lost_reason(replies[4].clone()), LostReason::StaleToken);
    assert_eq!(
        w.get(jobs[4].id).claim.unwrap().lease_until_ms,
        T0 + 100,
        "untouched"
    );
    let policy = w.policy;
    let settles = vec![
        (jobs[0].id, token(0), Settle::Complete),
        (jobs[1].id, token(1), Settle::Fail("boom".into())),
        (jobs[2].id, token(2), Settle::Abandon { started: false }),
        (jobs[3].id, token(3), Settle::Fail("x".repeat(5_000))),
        (jobs[4].id, token(4) + 1, Settle::Complete),
        (JobId(999), 1, Settle::Complete),
    ];
    let states = w
        .tx(|tx| core::job::settle_many(tx, HolderId(1), &settles, &policy))
        .unwrap();
    assert_eq!(states[0].as_ref().unwrap(), &JobState::Done);
    assert_eq!(
        states[1].as_ref().unwrap(),
        &JobState::Dead,
        "its only attempt"
    );
    assert_eq!(states[2].as_ref().unwrap(), &JobState::Ready, "given back");
    assert!(matches!(
        states[3],
        Err(Error::Invalid {
            field: "reason",
            ..
        })
    ));
    assert_eq!(lost_reason(states[4].clone()), LostReason::StaleToken);
    assert!(matches!(states[5], Err(Error::NotFound(_))));
    assert_eq!(
        w.get(jobs[2].id).attempts,
        0,
        "an unstarted attempt is given back"
    );
    assert_eq!(
        w.get(jobs[3].id).state,
        JobState::Running,
        "refused: unchanged"
    );
    assert_eq!(w.get(jobs[1].id).last_error.as_deref(), Some("boom"));
    // A started job given back on its last attempt is dead; with a cancel
    // asked, cancelled.
    let again = w.claim_one("q", 2, 100);
    assert_eq!(again.id, jobs[2].id);
    let t = again.claim.unwrap().token;
    assert_eq!(
        w.tx(|tx| core::job::abandon(tx, again.id, HolderId(2), t, true))
            .unwrap(),
        JobState::Dead
    );
    w.tx(|tx| core::job::cancel(tx, jobs[3].id, &policy))
        .unwrap();
    assert_eq!(
        w.tx(|tx| core::job::abandon(tx, jobs[3].id, HolderId(1), token(3), false))
            .unwrap(),
        JobState::Cancelled
    );
}

/// The batched read ([`core::JobTxn::pending`]) and the scans come in
/// their index order, limited, and only with what is due as of `now`.
pub fn job_scans_are_ordered(make: &Make) {
    let w = World::new(make);
    for i in 0..300u32 {
        let spec = JobSpec {
            priority: (i % 7) as i32,
            delay_ms: u64::from(i % 3) * 10,
            ..JobSpec::new(i.to_be_bytes().to_vec())
        };
        w.push("q", spec);
    }
    // Claims with leases of different lengths, to expire out of id order.
    let running: Vec<JobRecord> = (0..6u64)
        .map(|i| {
            let policy = w.policy;
            w.tx(|tx| core::job::claim(tx, "q", HolderId(1), 50 - i * 5, 1, &policy))
                .unwrap()
                .remove(0)
        })
        .collect();
    w.at(T0 + 20);
    let read = |now_ms: u64, chunk: usize, ready: usize| {
        w.tx(|tx| tx.jobs()?.pending("q", now_ms, chunk, ready))
            .unwrap()
    };
    let p = read(T0 + 20, 1000, 1000);
    assert!(
        p.expired.is_empty(),
        "nothing expired yet: {:?}",
        p.expired.len()
    );
    assert_eq!(
        p.due.len(),
        200,
        "the 10 ms and 20 ms delays are due at T0 + 20"
    );
    let due: Vec<_> = p.due.iter().map(|j| (j.run_at_ms, j.id)).collect();
    assert!(
        due.windows(2).all(|p| p[0] < p[1]),
        "due by run_at, then id"
    );
    assert_eq!(p.ready.len(), 94, "the undelayed jobs not claimed");
    let ranks: Vec<_> = p.ready.iter().map(JobRecord::rank).collect();
    assert!(
        ranks.windows(2).all(|p| p[0] < p[1]),
        "ready in claim order"
    );
    assert!(p.ready.iter().all(|j| j.state == JobState::Ready));
    let some = read(T0 + 20, 7, 5);
    assert_eq!((some.due.len(), some.ready.len()), (7, 5), "limits");
    assert_eq!(some.ready[..], p.ready[..5]);
    let at_10 = read(T0 + 10, 1000, 0);
    assert_eq!(
        (at_10.due.len(), at_10.ready.len()),
        (100, 0),
        "only what is due"
    );
    // Expired claims, earliest lease first.
    w.at(T0 + 60);
    let p = read(T0 + 60, 1000, 0);
    let expired: Vec<JobId> = p.expired.iter().map(|j| j.id).collect();
    let mut want: Vec<&JobRecord> = running.iter().collect();
    want.sort_by_key(|j| (j.claim.unwrap().lease_until_ms, j.id));
    assert_eq!(expired, want.iter().map(|j| j.id).collect::<Vec<_>>());
    // Up to date, the ready read is exactly the claim order.
    let policy = w.policy;
    w.tx(|tx| core::job::maintain(tx, "q", &policy)).unwrap();
    let ready: Vec<JobId> = read(T0 + 60, 1000, 1000)
        .ready
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ready.len(), 294, "the expired six wait out their backoff");
    let claimed: Vec<JobId> = w.claim("q", 1, 100, 300).iter().map(|j| j.id).collect();
    assert_eq!(claimed, ready);
    // Retries apart from first delays, earliest first.
    let mut ids = Vec::new();
    w.tx(|tx| tx.jobs()?.scan("q", JobQuery::Retrying, 100, &mut ids))
        .unwrap();
    let mut want: Vec<JobRecord> = running.iter().map(|j| w.get(j.id)).collect();
    want.sort_by_key(|j| (j.run_at_ms, j.id));
    assert_eq!(ids, want.iter().map(|j| j.id).collect::<Vec<_>>());
}

/// Generates one `#[test]` per lease case for a store factory. With
/// `@guard GUARD;` first, each case runs only when `GUARD()` is true (a
/// store that needs a server prints why it skips).
#[macro_export]
macro_rules! conformance_lease_cases {
    (@guard $guard:expr; $make:expr) => {
        $crate::conformance_cases!(@cases $guard, $make;
            lease_exclusive_then_released, lease_expiry_boundary, lease_renew_and_reacquire,
            lease_identity_checks, lease_counting, lease_limit_belongs_to_the_key,
            lease_inspect_creates_nothing,
            lease_hostile_keys, txn_lease_rolls_back_on_error, store_clock_never_goes_back
        );
    };
    ($make:expr) => {
        $crate::conformance_lease_cases!(@guard || true; $make);
    };
}

/// Generates one `#[test]` per case (leases and jobs) for a store factory
/// (`@guard` as in [`conformance_lease_cases`]).
#[macro_export]
macro_rules! conformance_cases {
    (@guard $guard:expr; $make:expr) => {
        $crate::conformance_lease_cases!(@guard $guard; $make);
        $crate::conformance_cases!(@cases $guard, $make;
            txn_rolls_back_on_error,
            job_claim_order, job_priority_beats_earlier_run_at, job_lifecycle_complete,
            job_heartbeat_extends_claim, job_expiry_counts_attempt, job_quarantine_crash_loop,
            job_fail_backoff_then_dead, job_cancel_and_retry, job_unique_key, job_batch_claim,
            job_purge, job_list_pages_and_filters, job_drain_rule, job_scans_are_ordered,
            job_unique_key_freed_by_a_final_expiry, job_batch_heartbeat_and_settle,
            job_time_driven_changes_are_complete_and_visible, job_hostile_queue_names
        );
    };
    (@cases $guard:expr, $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let run: fn() -> bool = $guard;
                if !run() {
                    return;
                }
                let make: &$crate::suite::Make = &$make;
                $crate::suite::$case(make);
            }
        )*
    };
    ($make:expr) => {
        $crate::conformance_cases!(@guard || true; $make);
    };
}
