//! Every bad input gets a typed error naming the field, and changes nothing.

use leasehold::core::{self, MAX_KEY_BYTES, MAX_PAYLOAD_BYTES, MAX_TEXT_BYTES, MAX_TTL_MS};
use leasehold::{
    Error, Holder, HolderId, JobId, JobSpec, JobState, ManualClock, MemStore, QueuePolicy, Store,
    StoreExt,
};
use std::sync::Arc;

struct World {
    store: Arc<dyn Store>,
    clock: ManualClock,
}

fn world() -> World {
    let clock = ManualClock::new(1_000_000);
    let store: Arc<dyn Store> = Arc::new(MemStore::with_clock(Arc::new(clock.clone())));
    // Some state that must survive every refused call.
    let h = Holder::new(HolderId(1));
    store
        .txn(|tx| core::lease::acquire(tx, "k", &h, 1000, 1))
        .unwrap();
    store
        .txn(|tx| core::job::enqueue(tx, "q", &JobSpec::new("payload"), &QueuePolicy::default()))
        .unwrap();
    World { store, clock }
}

impl World {
    fn snapshot(&self) -> String {
        let p = QueuePolicy::default();
        let lease = self.store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
        let jobs = self
            .store
            .txn(|tx| core::job::list(tx, "q", None, JobId(0), 100, &p))
            .unwrap();
        let next = self
            .store
            .txn(|tx| core::job::enqueue(tx, "probe", &JobSpec::new(""), &QueuePolicy::default()))
            .unwrap();
        format!("{lease:?} {jobs:?} {}", next.id.0)
    }

    /// Runs `f`, expects `Invalid { field }`, and checks nothing changed
    /// (the probe enqueue in `snapshot` advances ids by one per snapshot).
    fn expect_invalid<T: std::fmt::Debug>(
        &self,
        field: &str,
        f: impl FnMut(&mut dyn core::Txn) -> leasehold::Result<T>,
    ) {
        let before = self.snapshot();
        match self.store.txn(f) {
            Err(e @ Error::Invalid { .. }) => {
                let Error::Invalid { field: got, .. } = &e else {
                    unreachable!()
                };
                assert_eq!(got.as_str(), field, "wrong field in {e}");
                assert!(
                    e.to_string().contains(field),
                    "message names the field: {e}"
                );
            }
            other => panic!("expected Invalid({field}), got {other:?}"),
        }
        let after = self.snapshot();
        let bump = |s: &str| {
            let (head, n) = s.rsplit_once(' ').unwrap();
            format!("{head} {}", n.parse::<u64>().unwrap() + 1)
        };
        assert_eq!(bump(&before), after, "state changed by a refused call");
    }
}

fn h() -> Holder {
    Holder::new(HolderId(9))
}

#[test]
fn bad_ttls() {
    let w = world();
    w.expect_invalid("ttl", |tx| core::lease::acquire(tx, "x", &h(), 0, 1));
    w.expect_invalid("ttl", |tx| {
        core::lease::acquire(tx, "x", &h(), MAX_TTL_MS + 1, 1)
    });
    w.expect_invalid("ttl", |tx| core::lease::renew(tx, "k", HolderId(1), 1, 0));
    w.expect_invalid("lease", |tx| {
        core::job::claim(tx, "q", HolderId(1), 0, 1, &QueuePolicy::default())
    });
    w.expect_invalid("lease", |tx| {
        core::job::claim(tx, "q", HolderId(1), u64::MAX, 1, &QueuePolicy::default())
    });
    // A clock near the end of time: now + ttl would overflow.
    w.clock.set(u64::MAX - 10);
    w.expect_invalid("ttl", |tx| core::lease::acquire(tx, "x", &h(), 100, 1));
}

#[test]
fn bad_keys() {
    let w = world();
    let long = "k".repeat(MAX_KEY_BYTES + 1);
    for key in ["", "a\0b", "line\nbreak", long.as_str()] {
        w.expect_invalid("key", |tx| core::lease::acquire(tx, key, &h(), 100, 1));
        w.expect_invalid("key", |tx| core::lease::release(tx, key, HolderId(1), 1));
        w.expect_invalid("queue", |tx| {
            core::job::enqueue(tx, key, &JobSpec::new("x"), &QueuePolicy::default())
        });
    }
}

#[test]
fn bad_limits_and_batches() {
    let w = world();
    w.expect_invalid("limit", |tx| core::lease::acquire(tx, "x", &h(), 100, 0));
    w.expect_invalid("limit", |tx| {
        core::lease::acquire(tx, "x", &h(), 100, core::MAX_LEASE_LIMIT + 1)
    });
    let p = QueuePolicy::default();
    w.expect_invalid("batch", |tx| {
        core::job::claim(tx, "q", HolderId(1), 10, 0, &p)
    });
    w.expect_invalid("batch", |tx| {
        core::job::claim(tx, "q", HolderId(1), 10, core::MAX_BATCH + 1, &p)
    });
    w.expect_invalid("batch", |tx| {
        core::job::purge(tx, "q", 0, 0, &QueuePolicy::default())
    });
}

#[test]
fn bad_job_specs() {
    let w = world();
    let huge = JobSpec::new(vec![0u8; MAX_PAYLOAD_BYTES + 1]);
    w.expect_invalid("payload", |tx| {
        core::job::enqueue(tx, "q", &huge, &QueuePolicy::default())
    });
    for max_attempts in [0, core::MAX_ATTEMPTS + 1] {
        let spec = JobSpec {
            max_attempts,
            ..JobSpec::new("x")
        };
        w.expect_invalid("max_attempts", |tx| {
            core::job::enqueue(tx, "q", &spec, &QueuePolicy::default())
        });
    }
    let far = JobSpec {
        run_at: Some(leasehold::StoreMs::MAX),
        ..JobSpec::new("x")
    };
    w.expect_invalid("run_at", |tx| {
        core::job::enqueue(tx, "q", &far, &QueuePolicy::default())
    });
    let long_delay = JobSpec {
        delay_ms: MAX_TTL_MS + 1,
        ..JobSpec::new("x")
    };
    w.expect_invalid("delay", |tx| {
        core::job::enqueue(tx, "q", &long_delay, &QueuePolicy::default())
    });
    for key in ["", "a\0b"] {
        let spec = JobSpec {
            unique_key: Some(key.into()),
            ..JobSpec::new("x")
        };
        w.expect_invalid("unique_key", |tx| {
            core::job::enqueue(tx, "q", &spec, &QueuePolicy::default())
        });
    }
    let long_reason = "r".repeat(MAX_TEXT_BYTES + 1);
    let p = QueuePolicy::default();
    w.expect_invalid("reason", |tx| {
        core::job::fail(tx, JobId(1), HolderId(1), 1, &long_reason, &p)
    });
}

#[test]
fn run_at_in_the_past_means_now() {
    let w = world();
    let spec = JobSpec {
        run_at: Some(leasehold::StoreMs::ZERO),
        ..JobSpec::new("x")
    };
    let id = w
        .store
        .txn(|tx| core::job::enqueue(tx, "past", &spec, &QueuePolicy::default()))
        .unwrap()
        .id;
    let p = QueuePolicy::default();
    let job = w.store.txn(|tx| core::job::get(tx, id, &p)).unwrap();
    assert_eq!((job.run_at_ms, job.state), (1_000_000, JobState::Ready));
}

#[test]
fn bad_text_fields() {
    assert!(matches!(
        Holder::with_label(HolderId(1), "a\0b"),
        Err(Error::Invalid {
            field: leasehold::Field::HolderLabel,
            ..
        })
    ));
    assert!(Holder::with_label(HolderId(1), &"x".repeat(MAX_TEXT_BYTES + 1)).is_err());
    let e = HolderId::parse("not-a-uuid").unwrap_err();
    assert!(e.to_string().contains("not-a-uuid"), "{e}");
    let e = JobState::parse("runing").unwrap_err();
    assert!(e.to_string().contains("runing"), "{e}");
    assert_eq!(JobState::parse("dead").unwrap(), JobState::Dead);
}

/// A result larger than a payload is refused by name, alone or in a
/// batch (where it fails only its own entry), and the claim is kept; one
/// of exactly the largest size is kept with the job.
#[test]
fn oversized_results_are_refused_and_the_claim_kept() {
    use core::job::Settle;
    let w = world();
    let p = QueuePolicy::default();
    let job = w
        .store
        .txn(|tx| core::job::claim(tx, "q", HolderId(1), 10_000, 1, &p))
        .unwrap()
        .remove(0);
    let token = job.claim.unwrap().token;
    let too_big: Arc<[u8]> = vec![1u8; MAX_PAYLOAD_BYTES + 1].into();
    w.expect_invalid("result", |tx| {
        core::job::complete_with(tx, job.id, HolderId(1), token, &too_big)
    });
    let batch = [(job.id, token, Settle::CompleteWith(too_big.clone()))];
    let before = w.snapshot();
    let states = w
        .store
        .txn(|tx| core::job::settle_many(tx, HolderId(1), &batch, &p))
        .unwrap();
    assert!(
        matches!(
            &states[..],
            [Err(Error::Invalid {
                field: leasehold::Field::Result,
                ..
            })]
        ),
        "{states:?}"
    );
    let after = w.snapshot();
    assert_eq!(
        before.rsplit_once(' ').unwrap().0,
        after.rsplit_once(' ').unwrap().0,
        "the job is still claimed, with no result"
    );
    let largest: Arc<[u8]> = vec![2u8; MAX_PAYLOAD_BYTES].into();
    let batch = [(job.id, token, Settle::CompleteWith(largest))];
    let states = w
        .store
        .txn(|tx| core::job::settle_many(tx, HolderId(1), &batch, &p))
        .unwrap();
    assert!(matches!(&states[..], [Ok(JobState::Done)]), "{states:?}");
    let stored = w.store.txn(|tx| core::job::get(tx, job.id, &p)).unwrap();
    assert_eq!(stored.result.map(|r| r.len()), Some(MAX_PAYLOAD_BYTES));
}

#[test]
fn unknown_jobs_and_wrong_states() {
    let w = world();
    let p = QueuePolicy::default();
    let before = w.snapshot();
    for r in [
        w.store
            .txn(|tx| core::job::complete(tx, JobId(77), HolderId(1), 1)),
        w.store
            .txn(|tx| core::job::retry(tx, JobId(77), &QueuePolicy::default())),
    ] {
        assert!(matches!(r, Err(Error::NotFound(JobId(77)))), "{r:?}");
    }
    match w
        .store
        .txn(|tx| core::job::retry(tx, JobId(1), &QueuePolicy::default()))
    {
        Err(e @ Error::InvalidState { .. }) => {
            assert!(e.to_string().contains("job 1 is ready"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // A never-claimed job cannot be completed, failed or heartbeaten.
    for r in [
        w.store
            .txn(|tx| core::job::complete(tx, JobId(1), HolderId(1), 0)),
        w.store
            .txn(|tx| core::job::fail(tx, JobId(1), HolderId(1), 0, "x", &p).map(|_| ())),
        w.store
            .txn(|tx| core::job::heartbeat(tx, JobId(1), HolderId(1), 0, 10).map(|_| ())),
    ] {
        assert!(r.as_ref().is_err_and(Error::is_lost), "{r:?}");
    }
    let after = w.snapshot();
    assert_ne!(before, after); // only the probe id moved
    assert_eq!(
        before.rsplit_once(' ').unwrap().0,
        after.rsplit_once(' ').unwrap().0
    );
}

#[test]
fn held_error_names_holder_and_expiry() {
    let w = world();
    let h = Holder::with_label(HolderId(2), "host-a:42").unwrap();
    let e = w
        .store
        .txn(|tx| core::lease::acquire(tx, "k", &h, 100, 1))
        .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("\"k\""), "{text}");
    assert!(
        text.contains("00000000-0000-0000-0000-000000000001"),
        "{text}"
    );
    assert!(text.contains("1001000"), "{text}");
}

/// The documented limits, as literals, are inclusive.
#[test]
fn limits_are_inclusive() {
    let w = world();
    let year_ms = 365 * 24 * 3600 * 1000;
    assert_eq!(MAX_TTL_MS, year_ms);
    w.store
        .txn(|tx| core::lease::acquire(tx, "year", &h(), year_ms, 1))
        .unwrap();
    let p = QueuePolicy::default();
    let max_payload = JobSpec::new(vec![7u8; 16 * 1024 * 1024]);
    assert_eq!(MAX_PAYLOAD_BYTES, 16 * 1024 * 1024);
    w.store
        .txn(|tx| core::job::enqueue(tx, "big", &max_payload, &p))
        .unwrap();
    let text = "t".repeat(4096);
    assert_eq!(MAX_TEXT_BYTES, 4096);
    Holder::with_label(HolderId(1), &text).unwrap();
    let spec = JobSpec {
        unique_key: Some(text.clone()),
        max_attempts: 10_000,
        ..JobSpec::new("x")
    };
    w.store
        .txn(|tx| core::job::enqueue(tx, "q", &spec, &p))
        .unwrap();
    w.store
        .txn(|tx| core::lease::acquire(tx, "many", &h(), 10, 1024))
        .unwrap();
    w.store
        .txn(|tx| core::job::claim(tx, "q", HolderId(1), 10, 10_000, &p))
        .unwrap();
    assert_eq!(MAX_KEY_BYTES, 1024);
}

/// A store that implements the rules' interface but not every listing
/// (the listings have defaults, so a store written elsewhere compiles
/// without them) answers each listing it lacks with a typed error naming
/// what it cannot list, never an empty page that would read as "no
/// leases" or "no jobs".
#[test]
fn a_store_that_cannot_list_says_so() {
    use lacking::Lacking;
    let w = world();
    let policy = QueuePolicy::default();
    type Call = fn(&mut dyn core::Txn, &QueuePolicy) -> leasehold::Result<()>;
    let calls: [(&str, Call); 5] = [
        ("leases", |tx, _| core::lease::list(tx, "", 10).map(drop)),
        ("queues", |tx, _| core::job::queues(tx, "", 10).map(drop)),
        ("jobs by state", |tx, p| {
            core::job::page(tx, "q", JobState::Ready, None, 10, 0, p).map(drop)
        }),
        ("job counts", |tx, p| {
            core::job::summary(tx, "q", p, &Default::default()).map(drop)
        }),
        ("finished jobs", |tx, p| {
            core::job::summary(tx, "q", p, &Default::default()).map(drop)
        }),
    ];
    for (lacks, call) in calls {
        // With every listing, the call works...
        w.store
            .txn(|tx| {
                call(
                    &mut Lacking {
                        inner: tx,
                        lacks: "",
                    },
                    &policy,
                )
            })
            .unwrap();
        // ...and with one missing, it names what is missing.
        let r = w
            .store
            .txn(|tx| call(&mut Lacking { inner: tx, lacks }, &policy));
        match r {
            Err(Error::Invalid {
                field: leasehold::Field::Store,
                reason,
            }) => {
                assert!(
                    reason.ends_with(&format!("cannot list {lacks}")),
                    "{reason}"
                )
            }
            other => panic!("{lacks}: expected the store to say it cannot list, got {other:?}"),
        }
    }
}

/// The wrappers of that test.
mod lacking {
    use leasehold::core::{
        JobCursor, JobId, JobPeek, JobQuery, JobRecord, JobState, JobTxn, Journal, LeaseRecord,
        Pending, QueueConfig, ScheduleRecord, StateCounts, Txn,
    };
    use leasehold::Result;

    /// Forward the interface's required methods to the transaction in
    /// field `$f`.
    macro_rules! required {
        ($t:ident, $f:tt) => {
            impl Txn for $t<'_> {
                fn now_ms(&self) -> u64 {
                    self.$f.now_ms()
                }
                fn lease_mut(&mut self, key: &str, c: bool) -> Result<Option<&mut LeaseRecord>> {
                    self.$f.lease_mut(key, c)
                }
                fn journal(&mut self) -> &mut Journal {
                    self.$f.journal()
                }
                fn jobs(&mut self) -> Result<&mut dyn JobTxn> {
                    Ok(self)
                }
                listings!(lease_scan);
            }
            impl JobTxn for $t<'_> {
                fn now_ms(&self) -> u64 {
                    self.$f.now_ms()
                }
                fn journal(&mut self) -> &mut Journal {
                    self.$f.journal()
                }
                required!(@jobs $f;
                    next_job_id() -> JobId;
                    job(id: JobId) -> Option<JobRecord>;
                    jobs_by_id(ids: &[JobId]) -> Vec<JobRecord>;
                    put_job(job: &JobRecord) -> ();
                    delete_job(id: JobId) -> ();
                    link(parent: JobId, child: JobId) -> ();
                    children(parent: JobId, out: &mut Vec<JobId>) -> ();
                    unlink(parent: JobId) -> ();
                    unique_jobs(queue: &str, key: &str, states: leasehold::StateSet, since_ms: u64,
                        limit: usize) -> Vec<JobId>;
                    pending(queue: &str, now_ms: u64, chunk: usize, ready: usize) -> Pending;
                    scan(queue: &str, query: JobQuery, limit: usize, out: &mut Vec<JobId>) -> ();
                    counts(queue: &str) -> StateCounts;
                    list(queue: &str, state: Option<JobState>, after: JobId, limit: usize)
                        -> Vec<JobRecord>;
                    queue_config(queue: &str) -> QueueConfig;
                    put_queue_config(queue: &str, config: &QueueConfig) -> ();
                    running_count(queue: &str, key: Option<&str>) -> u64;
                    parked(queue: &str, key: Option<&str>, limit: usize) -> Vec<JobRecord>;
                    lock_queue(queue: &str, exclusive: bool) -> ();
                    rate_log(queue: &str, key: &str) -> leasehold::core::RateLog;
                    put_rate_log(queue: &str, key: &str, log: &leasehold::core::RateLog) -> ();
                    rate_wakes(queue: &str, until_ms: u64, limit: usize)
                        -> Vec<(std::sync::Arc<str>, u64)>;
                    forget_idle_rates(queue: &str, before_ms: u64, limit: usize) -> usize;
                    schedules(queue: &str) -> Vec<ScheduleRecord>;
                    put_schedule(schedule: &ScheduleRecord) -> ();
                    delete_schedule(queue: &str, name: &str) -> bool;
                );
                listings!(queue_names, page, counts_capped, finished_histogram);
            }
        };
        (@jobs $f:tt; $($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
            $(fn $name(&mut self, $($arg: $ty),*) -> Result<$ret> {
                self.$f.jobs()?.$name($($arg),*)
            })*
        };
    }

    /// No listing at all: its calls reach the interface's defaults.
    pub struct Bare<'a>(pub &'a mut dyn Txn);
    macro_rules! listings {
        ($($name:ident),*) => {};
    }
    required!(Bare, 0);

    /// Every listing of the store it wraps but the one it `lacks`, which
    /// it answers as a store without it does.
    pub struct Lacking<'a> {
        pub inner: &'a mut dyn Txn,
        pub lacks: &'static str,
    }
    macro_rules! listings {
        (lease_scan) => {
            fn lease_scan(
                &mut self,
                after: &str,
                limit: usize,
                out: &mut Vec<(String, LeaseRecord)>,
            ) -> Result<()> {
                match self.lacks {
                    "leases" => Bare(&mut *self.inner).lease_scan(after, limit, out),
                    _ => self.inner.lease_scan(after, limit, out),
                }
            }
        };
        ($($name:ident),*) => {
            fn queue_names(
                &mut self,
                after: &str,
                limit: usize,
                out: &mut Vec<String>,
            ) -> Result<()> {
                match self.lacks {
                    "queues" => Bare(&mut *self.inner).queue_names(after, limit, out),
                    _ => self.inner.jobs()?.queue_names(after, limit, out),
                }
            }
            fn page(
                &mut self,
                queue: &str,
                state: JobState,
                after: Option<JobCursor>,
                limit: usize,
                preview: usize,
            ) -> Result<Vec<JobPeek>> {
                match self.lacks {
                    "jobs by state" => {
                        Bare(&mut *self.inner).page(queue, state, after, limit, preview)
                    }
                    _ => self.inner.jobs()?.page(queue, state, after, limit, preview),
                }
            }
            fn counts_capped(&mut self, queue: &str, cap: u64) -> Result<StateCounts> {
                match self.lacks {
                    "job counts" => Bare(&mut *self.inner).counts_capped(queue, cap),
                    _ => self.inner.jobs()?.counts_capped(queue, cap),
                }
            }
            fn finished_histogram(
                &mut self,
                queue: &str,
                from_ms: u64,
                bucket_ms: u64,
                out: &mut [StateCounts],
            ) -> Result<()> {
                match self.lacks {
                    "finished jobs" => {
                        Bare(&mut *self.inner).finished_histogram(queue, from_ms, bucket_ms, out)
                    }
                    _ => self
                        .inner
                        .jobs()?
                        .finished_histogram(queue, from_ms, bucket_ms, out),
                }
            }
        };
    }
    required!(Lacking, inner);
}
