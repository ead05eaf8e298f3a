//! Model-based tests: `leasehold::core` over every store (mem; SQLite; the
//! PostgreSQL store when `LEASEHOLD_TEST_PG` is set), compared after every
//! step with the reference model (`leasehold_sim::model`), with time ticks
//! (including exact expiry boundaries) among the transitions.
//!
//! After each step: the operation's outcome must match the model's, the
//! whole observable state (every key's holders and token counter, every
//! queue's counts and jobs) must equal the model's, and the guarantees are
//! checked directly on the system: L1 (holders within the limit), L2 (each
//! new grant's token above every earlier one), Q1/Q3 (a running job has one
//! unexpired claim; counts add up to the jobs listed).

use leasehold::core::{self, Txn};
use leasehold::{
    Holder, HolderId, JobId, JobRecord, JobSpec, JobState, ManualClock, MemStore, QueuePolicy,
    Store, StoreExt,
};
use leasehold_sim::model::{Job, Model, Outcome};
use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use std::collections::BTreeMap;
use std::sync::Arc;

const T0: u64 = 10_000;
const KEYS: [(&str, u32); 3] = [("a", 1), ("b", 1), ("../c", 2)];
const QUEUES: [&str; 2] = ["q1", "q2"];
const POLICY: QueuePolicy = QueuePolicy {
    backoff_base_ms: 5,
    backoff_max_ms: 40,
    jitter_seed: 3,
    quarantine_expiries: 3,
};

#[derive(Debug, Clone)]
enum Step {
    Tick(u64),
    TickTo(u64),
    Acquire {
        key: usize,
        holder: u128,
        ttl: u64,
        /// Ask for one more holder than the key's usual limit: refused
        /// while the key has holders, fixing the new limit when it has none.
        wider: bool,
    },
    Renew {
        key: usize,
        holder: u128,
        token: u64,
        ttl: u64,
    },
    Release {
        key: usize,
        holder: u128,
        token: u64,
    },
    Enqueue {
        queue: usize,
        priority: i32,
        delay: u64,
        attempts: u32,
        unique: Option<u8>,
        /// Concurrency key `k{n}`.
        key: Option<u8>,
        /// Run-time limit (ms; 0 is refused).
        timeout: Option<u64>,
    },
    /// Replace a queue's concurrency limits (F1).
    Limit {
        queue: usize,
        concurrency: Option<u32>,
        per_key: Option<u32>,
    },
    Claim {
        queue: usize,
        holder: u128,
        lease: u64,
        max: usize,
    },
    Heartbeat {
        job: u64,
        holder: u128,
        token: u64,
        lease: u64,
    },
    Complete {
        /// Completed with this result, if any.
        result: Option<Vec<u8>>,
        job: u64,
        holder: u128,
        token: u64,
    },
    Fail {
        job: u64,
        holder: u128,
        token: u64,
    },
    Abandon {
        job: u64,
        holder: u128,
        token: u64,
        started: bool,
    },
    Cancel {
        job: u64,
    },
    Retry {
        job: u64,
    },
    Purge {
        queue: usize,
        older: u64,
    },
}

struct Reference;

fn holder() -> BoxedStrategy<u128> {
    (1u128..=3).boxed()
}

/// Instants worth landing on exactly: every future expiry, lease end and
/// run_at, and one before and after each.
fn boundaries(m: &Model) -> Vec<u64> {
    let mut out = Vec::new();
    for (_, k) in &m.keys {
        out.extend(k.slots.iter().map(|s| s.expires_at_ms));
    }
    for j in m.jobs.iter().filter(|j| !j.purged) {
        out.push(j.run_at_ms);
        if let Some((_, _, until)) = j.claim {
            out.push(until);
        }
    }
    let mut all: Vec<u64> = out
        .into_iter()
        .flat_map(|t| [t.saturating_sub(1), t, t + 1])
        .filter(|&t| t > m.now_ms)
        .collect();
    all.sort_unstable();
    all.dedup();
    all
}

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model::new(T0, POLICY)).boxed()
    }

    fn transitions(m: &Model) -> BoxedStrategy<Step> {
        let last: Vec<u64> = KEYS
            .iter()
            .map(|(k, _)| m.key(k).map_or(0, |k| k.last_token))
            .collect();
        let lease_token = (0..KEYS.len()).prop_flat_map(move |key| (Just(key), 0..=last[key] + 1));
        let lease_token = lease_token.boxed();
        let njobs = m.jobs.len() as u64;
        // Job targets: mostly the job's current claim, sometimes noise.
        let claims: Vec<(u64, u128, u64)> = m
            .jobs
            .iter()
            .filter_map(|j| j.claim.map(|(h, t, _)| (j.id, h, t)))
            .collect();
        let target = if claims.is_empty() {
            (1..=njobs + 1, holder(), 0u64..3).boxed()
        } else {
            prop_oneof![
                3 => proptest::sample::select(claims),
                1 => (1..=njobs + 1, holder(), 0u64..4),
            ]
            .boxed()
        };
        let bounds = boundaries(m);
        let tick_to = if bounds.is_empty() {
            Just(m.now_ms + 1).boxed()
        } else {
            proptest::sample::select(bounds).boxed()
        };
        prop_oneof![
            3 => (0u64..60).prop_map(Step::Tick),
            3 => tick_to.prop_map(Step::TickTo),
            4 => (0..KEYS.len(), holder(), 1u64..120, proptest::bool::weighted(0.2))
                .prop_map(|(key, holder, ttl, wider)| Step::Acquire { key, holder, ttl, wider }),
            2 => (lease_token.clone(), holder(), 1u64..120).prop_map(|((key, token), holder, ttl)| {
                Step::Renew { key, holder, token, ttl }
            }),
            2 => (lease_token, holder()).prop_map(|((key, token), holder)| Step::Release {
                key,
                holder,
                token
            }),
            4 => (0..QUEUES.len(), -1i32..2, prop_oneof![Just(0u64), 1u64..80], 1u32..4,
                  proptest::option::weighted(0.3, 0u8..2), proptest::option::weighted(0.5, 0u8..3),
                  proptest::option::weighted(0.3, 0u64..150))
                .prop_map(|(queue, priority, delay, attempts, unique, key, timeout)| Step::Enqueue {
                    queue, priority, delay, attempts, unique, key, timeout
                }),
            1 => (0..QUEUES.len(), proptest::option::weighted(0.4, 0u32..4),
                  proptest::option::weighted(0.6, 0u32..3))
                .prop_map(|(queue, concurrency, per_key)| Step::Limit { queue, concurrency, per_key }),
            4 => (0..QUEUES.len(), holder(), 1u64..100, 1usize..4)
                .prop_map(|(queue, holder, lease, max)| Step::Claim { queue, holder, lease, max }),
            2 => (target.clone(), 1u64..100).prop_map(|((job, holder, token), lease)| {
                Step::Heartbeat { job, holder, token, lease }
            }),
            3 => (target.clone(), proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)))
                .prop_map(|((job, holder, token), result)| Step::Complete { job, holder, token, result }),
            2 => target.clone().prop_map(|(job, holder, token)| Step::Fail { job, holder, token }),
            1 => (target, proptest::bool::ANY).prop_map(|((job, holder, token), started)| {
                Step::Abandon { job, holder, token, started }
            }),
            1 => (1..=njobs + 1).prop_map(|job| Step::Cancel { job }),
            1 => (1..=njobs + 1).prop_map(|job| Step::Retry { job }),
            1 => (0..QUEUES.len(), 0u64..100).prop_map(|(queue, older)| Step::Purge { queue, older }),
        ]
        .boxed()
    }

    fn apply(mut m: Model, step: &Step) -> Model {
        match *step {
            Step::Tick(d) => m.tick(m.now_ms + d),
            Step::TickTo(t) => m.tick(t),
            Step::Acquire {
                key,
                holder,
                ttl,
                wider,
            } => {
                m.acquire(KEYS[key].0, holder, ttl, KEYS[key].1 + u32::from(wider));
            }
            Step::Renew {
                key,
                holder,
                token,
                ttl,
            } => {
                m.renew(KEYS[key].0, holder, token, ttl);
            }
            Step::Release { key, holder, token } => {
                m.release(KEYS[key].0, holder, token);
            }
            Step::Enqueue { .. } => {
                let (queue, spec) = spec_of(step);
                m.enqueue(queue, &spec);
            }
            Step::Limit {
                queue,
                concurrency,
                per_key,
            } => {
                m.set_limits(QUEUES[queue], limits_of(concurrency, per_key));
            }
            Step::Claim {
                queue,
                holder,
                lease,
                max,
            } => {
                m.claim(QUEUES[queue], holder, lease, max);
            }
            Step::Heartbeat {
                job,
                holder,
                token,
                lease,
            } => {
                m.heartbeat(job, holder, token, lease);
            }
            Step::Complete {
                job,
                holder,
                token,
                ref result,
            } => {
                m.complete(job, holder, token, result.as_deref());
            }
            Step::Fail { job, holder, token } => {
                m.fail(job, holder, token, "handler failed");
            }
            Step::Abandon {
                job,
                holder,
                token,
                started,
            } => {
                m.abandon(job, holder, token, started);
            }
            Step::Cancel { job } => {
                m.cancel(job);
            }
            Step::Retry { job } => {
                m.retry(job);
            }
            Step::Purge { queue, older } => {
                m.purge(QUEUES[queue], older, 2);
            }
        }
        m
    }
}

fn spec_of(step: &Step) -> (&'static str, JobSpec) {
    let Step::Enqueue {
        queue,
        priority,
        delay,
        attempts,
        unique,
        key,
        timeout,
    } = *step
    else {
        unreachable!()
    };
    (
        QUEUES[queue],
        JobSpec {
            priority,
            delay_ms: delay,
            max_attempts: attempts,
            unique_key: unique.map(|u| format!("u{u}")),
            key: key.map(|k| format!("k{k}")),
            timeout: timeout.map(std::time::Duration::from_millis),
            ..JobSpec::new(format!("job-{priority}-{delay}"))
        },
    )
}

/// Limits as a step gives them (0 included: refused by both sides).
fn limits_of(concurrency: Option<u32>, per_key: Option<u32>) -> leasehold::Limits {
    leasehold::Limits::none()
        .with_concurrency(concurrency)
        .with_per_key(per_key)
}

/// Which store a run tests.
trait StoreKind: 'static {
    /// A fresh, empty store on `clock`, and what must live as long as it.
    fn open(clock: &ManualClock) -> (Arc<dyn Store>, Box<dyn std::any::Any>);
}

struct Mem;
struct Sqlite;
struct Postgres;

impl StoreKind for Mem {
    fn open(clock: &ManualClock) -> (Arc<dyn Store>, Box<dyn std::any::Any>) {
        (
            Arc::new(MemStore::with_clock(Arc::new(clock.clone()))),
            Box::new(()),
        )
    }
}

/// Removes its directory when dropped.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl StoreKind for Sqlite {
    fn open(clock: &ManualClock) -> (Arc<dyn Store>, Box<dyn std::any::Any>) {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "leasehold-model-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let opts = leasehold::SqliteOptions {
            clock: Some(Arc::new(clock.clone())),
            boot_id: Some("model".into()),
            ..leasehold::SqliteOptions::default()
        };
        let store = leasehold::SqliteStore::open_with(dir.join("m.db"), opts).unwrap();
        // The store is dropped (fields in order) before its directory.
        (Arc::new(store), Box::new(TempDir(dir)))
    }
}

/// Drops its schema when dropped.
struct PgSchema(String, String);

impl Drop for PgSchema {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.0, postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.1));
        }
    }
}

impl StoreKind for Postgres {
    fn open(clock: &ManualClock) -> (Arc<dyn Store>, Box<dyn std::any::Any>) {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let url = std::env::var("LEASEHOLD_TEST_PG").unwrap();
        let schema = format!(
            "lh_model_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let opts = leasehold::PostgresOptions {
            schema: schema.clone(),
            clock: Some(Arc::new(clock.clone())),
            ..leasehold::PostgresOptions::default()
        };
        let store = leasehold::PostgresStore::open_with(&url, opts).unwrap();
        (Arc::new(store), Box::new(PgSchema(url, schema)))
    }
}

struct Sut<K> {
    store: Arc<dyn Store>,
    clock: ManualClock,
    max_token: BTreeMap<&'static str, u64>,
    _keep: Box<dyn std::any::Any>,
    _kind: std::marker::PhantomData<K>,
}

impl<K> Sut<K> {
    fn run<R>(&self, f: impl FnMut(&mut dyn Txn) -> leasehold::Result<R>) -> Result<R, Outcome> {
        self.store.txn(f).map_err(|e| Outcome::of_error(&e))
    }
}

fn flatten(r: Result<Outcome, Outcome>) -> Outcome {
    r.unwrap_or_else(|o| o)
}

fn grant(g: core::Grant) -> Outcome {
    Outcome::Grant {
        token: g.token,
        expires_at_ms: g.expires_at_ms,
        renewed: g.renewed,
    }
}

fn as_model_job(r: &JobRecord) -> Job {
    Job {
        id: r.id.0,
        queue: r.queue.to_string(),
        payload: r.payload.to_vec(),
        priority: r.priority,
        run_at_ms: r.run_at_ms,
        created_at_ms: r.created_at_ms,
        max_attempts: r.max_attempts,
        attempts: r.attempts,
        expiries: r.expiries,
        last_token: r.last_token,
        state: r.state,
        claim: r.claim.map(|c| (c.holder.0, c.token, c.lease_until_ms)),
        cancel_requested: r.cancel_requested,
        last_error: r.last_error.as_deref().map(str::to_owned),
        unique_key: r.unique_key.as_deref().map(str::to_owned),
        finished_at_ms: r.finished_at_ms,
        result: r.result.as_deref().map(<[u8]>::to_vec),
        purged: false,
        key: r.key.as_deref().map(str::to_owned),
        timeout_ms: r.timeout_ms,
        deadline_ms: r.claim.and_then(|c| c.deadline_ms),
        after: r
            .after
            .iter()
            .flat_map(|a| a.iter().map(|id| id.0))
            .collect(),
        after_any: r.after_any,
    }
}

impl<K: StoreKind> StateMachineTest for Sut<K> {
    type SystemUnderTest = Sut<K>;
    type Reference = Reference;

    fn init_test(_: &Model) -> Sut<K> {
        let clock = ManualClock::new(T0);
        let (store, keep) = K::open(&clock);
        Sut {
            store,
            clock,
            max_token: BTreeMap::new(),
            _keep: keep,
            _kind: std::marker::PhantomData,
        }
    }

    fn apply(mut sut: Sut<K>, m: &Model, step: Step) -> Sut<K> {
        let p = POLICY;
        let got = match step {
            Step::Tick(_) | Step::TickTo(_) => {
                sut.clock.set(m.now_ms);
                Outcome::Ok
            }
            Step::Acquire {
                key,
                holder,
                ttl,
                wider,
            } => {
                let h = Holder::new(HolderId(holder));
                let (name, limit) = KEYS[key];
                let limit = limit + u32::from(wider);
                let r = sut.run(|tx| core::lease::acquire(tx, name, &h, ttl, limit));
                if let Ok(g) = &r {
                    let max = sut.max_token.entry(name).or_default();
                    if g.renewed {
                        assert!(g.token <= *max, "L2: a renewal keeps an old token");
                    } else {
                        assert!(g.token > *max, "L2: token {} not above {}", g.token, max);
                        *max = g.token;
                    }
                }
                flatten(r.map(grant))
            }
            Step::Renew {
                key,
                holder,
                token,
                ttl,
            } => flatten(
                sut.run(|tx| core::lease::renew(tx, KEYS[key].0, HolderId(holder), token, ttl))
                    .map(grant),
            ),
            Step::Release { key, holder, token } => flatten(
                sut.run(|tx| core::lease::release(tx, KEYS[key].0, HolderId(holder), token))
                    .map(|()| Outcome::Ok),
            ),
            Step::Enqueue { .. } => {
                let (queue, spec) = spec_of(&step);
                flatten(
                    sut.run(|tx| core::job::enqueue(tx, queue, &spec, &p))
                        .map(|o| Outcome::Enqueued {
                            id: o.id.0,
                            created: o.created,
                        }),
                )
            }
            Step::Claim {
                queue,
                holder,
                lease,
                max,
            } => flatten(
                sut.run(|tx| core::job::claim(tx, QUEUES[queue], HolderId(holder), lease, max, &p))
                    .map(|jobs| Outcome::claimed(&jobs)),
            ),
            Step::Heartbeat {
                job,
                holder,
                token,
                lease,
            } => flatten(
                sut.run(|tx| core::job::heartbeat(tx, JobId(job), HolderId(holder), token, lease))
                    .map(|r| Outcome::Heartbeat {
                        lease_until_ms: r.lease_until_ms,
                        cancel_requested: r.cancel_requested,
                    }),
            ),
            Step::Complete {
                job,
                holder,
                token,
                ref result,
            } => flatten(
                sut.run(|tx| match result {
                    None => core::job::complete(tx, JobId(job), HolderId(holder), token),
                    Some(r) => core::job::complete_with(tx, JobId(job), HolderId(holder), token, r),
                })
                .map(|()| Outcome::Ok),
            ),
            Step::Fail { job, holder, token } => flatten(
                sut.run(|tx| {
                    core::job::fail(
                        tx,
                        JobId(job),
                        HolderId(holder),
                        token,
                        "handler failed",
                        &p,
                    )
                })
                .map(Outcome::State),
            ),
            Step::Abandon {
                job,
                holder,
                token,
                started,
            } => flatten(
                sut.run(|tx| core::job::abandon(tx, JobId(job), HolderId(holder), token, started))
                    .map(Outcome::State),
            ),
            Step::Cancel { job } => flatten(
                sut.run(|tx| core::job::cancel(tx, JobId(job), &p))
                    .map(Outcome::State),
            ),
            Step::Retry { job } => flatten(
                sut.run(|tx| core::job::retry(tx, JobId(job), &p))
                    .map(|()| Outcome::Ok),
            ),
            Step::Purge { queue, older } => flatten(
                sut.run(|tx| core::job::purge(tx, QUEUES[queue], older, 2, &p))
                    .map(Outcome::Purged),
            ),
            Step::Limit {
                queue,
                concurrency,
                per_key,
            } => flatten(
                sut.run(|tx| {
                    core::job::set_limits(tx, QUEUES[queue], limits_of(concurrency, per_key))
                })
                .map(Outcome::Bool),
            ),
        };
        assert!(
            m.last.accepts(&got),
            "outcome of {step:?}: model {:?}, system {got:?}",
            m.last
        );
        sut
    }

    fn check_invariants(sut: &Sut<K>, m: &Model) {
        let p = POLICY;
        let now = m.now_ms;
        for (name, _) in KEYS {
            let info = sut.run(|tx| core::lease::inspect(tx, name)).unwrap();
            let limit = m.key(name).map_or(0, |k| k.limit);
            assert_eq!(info.limit, limit, "the limit of {name}");
            let mut got: Vec<(u128, u64, u64)> = info
                .holders
                .iter()
                .map(|h| (h.holder.id.0, h.token, h.expires_at_ms))
                .collect();
            got.sort_by_key(|h| h.1);
            assert!(
                got.len() <= limit as usize,
                "L1: {name} has {} holders",
                got.len()
            );
            let want: Vec<(u128, u64, u64)> = m
                .live(name)
                .iter()
                .map(|s| (s.holder, s.token, s.expires_at_ms))
                .collect();
            assert_eq!(got, want, "holders of {name}");
            assert_eq!(info.last_token, m.key(name).map_or(0, |k| k.last_token));
        }
        for queue in QUEUES {
            let counts = sut.run(|tx| core::job::stats(tx, queue, &p)).unwrap();
            assert_eq!(counts.0, m.counts(queue), "counts of {queue}");
            let jobs = sut
                .run(|tx| core::job::list(tx, queue, None, JobId(0), 10_000, &p))
                .unwrap();
            assert_eq!(jobs.len() as u64, counts.total(), "Q3: counts add up");
            for j in &jobs {
                let running = j.state == JobState::Running;
                assert_eq!(running, j.claim.is_some(), "Q1: claim iff running");
                if let Some(c) = j.claim {
                    assert!(
                        c.lease_until_ms > now,
                        "Q3: job {} running past its lease",
                        j.id
                    );
                }
            }
            let got: Vec<Job> = jobs.iter().map(as_model_job).collect();
            let want: Vec<Job> = m
                .jobs
                .iter()
                .filter(|j| !j.purged && j.queue == queue)
                .cloned()
                .collect();
            assert_eq!(got, want, "jobs of {queue}");
        }
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 4096,
        .. ProptestConfig::default()
    })]

    #[test]
    fn core_matches_reference_model(sequential 1..60 => Sut<Mem>);
}

/// The same test on another store, with fewer cases (each opens a store).
fn run_on<K: StoreKind>(cases: u32) {
    use proptest::test_runner::{Config, TestRunner};
    let config = Config {
        cases,
        max_shrink_iters: 512,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config.clone());
    let result = runner.run(
        &Reference::sequential_strategy(1..40),
        |(init, steps, seen)| {
            Sut::<K>::test_sequential(config.clone(), init, steps, seen);
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn core_over_sqlite_matches_reference_model() {
    run_on::<Sqlite>(48);
}

#[test]
fn core_over_postgres_matches_reference_model() {
    if std::env::var("LEASEHOLD_TEST_PG").map_or(true, |u| u.is_empty()) {
        eprintln!("SKIPPED: the PostgreSQL model test: LEASEHOLD_TEST_PG is not set");
        return;
    }
    run_on::<Postgres>(32);
}
