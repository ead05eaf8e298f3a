//! The simulated world: one thread, one seeded RNG per concern, a true
//! clock in milliseconds and an ordered event queue. Processes talk to a
//! real `Store` through the real core functions over a simulated network
//! (latency, lost replies, transient errors); each has its own drifting,
//! skewed, stepping clock and decides on its local deadline exactly as the
//! client layer does (`core::local_deadline_ms`).
//!
//! Fork safety is modelled the way `ForkGuard` behaves: every handle
//! remembers the incarnation that created it, and a forked child's use of
//! it fails with `Forked` before reaching the store. (`tests/fork.rs` in the
//! main crate checks the real `ForkGuard` with a real `fork`.)
//!
//! Nothing here reads the wall clock, spawns a thread or iterates a hash
//! map, so one seed gives one trace, byte for byte.

use crate::model::{Model, Outcome};
use crate::oracle::{Oracle, Owner, Violation};
use crate::plan::{Canary, Fault, Plan, Role};
use leasehold::core::{self, DriftBound, JobQuery, JobTxn, Pending, Txn};
use leasehold::{
    Holder, HolderId, JobId, JobRecord, JobSpec, JobState, ManualClock, MemStore, QueuePolicy,
    StateCounts, Store, StoreExt,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::fmt::{self, Write as _};
use std::sync::Arc;

const QUEUE: &str = "jobs";
const T0: u64 = 1_000_000;

fn key_name(key: usize) -> String {
    format!("key-{key}")
}

/// A request from a process to the store.
#[derive(Debug, Clone)]
pub enum Req {
    /// Acquire a key.
    Acquire {
        /// Key index.
        key: usize,
    },
    /// Renew a held key.
    Renew {
        /// Key index.
        key: usize,
        /// Token.
        token: u64,
    },
    /// Release a held key.
    Release {
        /// Key index.
        key: usize,
        /// Token.
        token: u64,
    },
    /// Push a job.
    Push(Box<JobSpec>),
    /// Claim up to `n` jobs.
    Claim {
        /// Batch size.
        n: usize,
    },
    /// Heartbeat a claim.
    Heartbeat {
        /// Job.
        job: u64,
        /// Token.
        token: u64,
    },
    /// Complete a job.
    Complete {
        /// Job.
        job: u64,
        /// Token.
        token: u64,
    },
    /// Fail a job.
    Fail {
        /// Job.
        job: u64,
        /// Token.
        token: u64,
    },
}

impl fmt::Display for Req {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Req::Acquire { key } => write!(f, "acquire key-{key}"),
            Req::Renew { key, token } => write!(f, "renew key-{key} token {token}"),
            Req::Release { key, token } => write!(f, "release key-{key} token {token}"),
            Req::Push(spec) => write!(
                f,
                "push prio {} delay {} attempts {} unique {:?}",
                spec.priority, spec.delay_ms, spec.max_attempts, spec.unique_key
            ),
            Req::Claim { n } => write!(f, "claim {n}"),
            Req::Heartbeat { job, token } => write!(f, "heartbeat job {job} token {token}"),
            Req::Complete { job, token } => write!(f, "complete job {job} token {token}"),
            Req::Fail { job, token } => write!(f, "fail job {job} token {token}"),
        }
    }
}

/// What comes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rep {
    /// The store answered.
    Done(Outcome),
    /// A transient store error; nothing was applied.
    Transient,
    /// The connection broke after the store committed: outcome unknown.
    Unknown,
    /// The handle belongs to another process (fork): nothing was sent.
    Forked,
}

#[derive(Debug, Clone)]
enum Ev {
    Wake {
        p: usize,
        gen: u32,
        timer: u64,
    },
    Arrive {
        p: usize,
        gen: u32,
        holder: HolderId,
        req: Req,
        reply: bool,
    },
    Reply {
        p: usize,
        gen: u32,
        rep: Rep,
    },
    Fault(usize),
    Restart {
        p: usize,
    },
    Resume {
        p: usize,
        pause: u64,
    },
    Heal,
}

/// One line of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A process sent a request.
    Send(usize, u32, String),
    /// The store applied a request.
    Apply(usize, u32, String, String),
    /// A reply reached a process.
    Reply(usize, u32, String),
    /// A write to the protected resource.
    Write {
        /// Process.
        p: usize,
        /// Key index.
        key: usize,
        /// Token.
        token: u64,
        /// Accepted by the fenced resource.
        accepted: bool,
    },
    /// A fault.
    Fault(String),
    /// Anything else.
    Note(String),
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Line::Send(p, g, r) => write!(f, "p{p}.{g} send {r}"),
            Line::Apply(p, g, r, o) => write!(f, "store applies p{p}.{g} {r} -> {o}"),
            Line::Reply(p, g, r) => write!(f, "p{p}.{g} gets {r}"),
            Line::Write {
                p,
                key,
                token,
                accepted,
            } => write!(
                f,
                "p{p} writes resource key-{key} token {token}: {}",
                if *accepted {
                    "accepted"
                } else {
                    "rejected (stale)"
                }
            ),
            Line::Fault(s) => write!(f, "FAULT {s}"),
            Line::Note(s) => f.write_str(s),
        }
    }
}

/// A process's clock: skewed, drifting, stepping. Monotonic clocks never
/// go back in reality; backward steps appear only in clock-chaos runs.
#[derive(Debug, Clone, Copy)]
struct LocalClock {
    offset_ms: u64,
    drift_ppm: i64,
    step_ms: i64,
}

impl LocalClock {
    fn read(&self, t: u64) -> u64 {
        let drift = (i128::from(t) * i128::from(self.drift_ppm)).div_euclid(1_000_000);
        let v = i128::from(self.offset_ms) + i128::from(t) + drift + i128::from(self.step_ms);
        u64::try_from(v.max(0)).unwrap_or(0)
    }

    /// True time until the local clock advances by `local_ms` (rounded up).
    fn true_delay(&self, local_ms: u64) -> u64 {
        let rate = 1_000_000 + self.drift_ppm.max(-900_000);
        let d = (u128::from(local_ms) * 1_000_000).div_ceil(rate as u128);
        u64::try_from(d).unwrap_or(u64::MAX)
    }
}

#[derive(Debug, Clone)]
struct HeldLease {
    key: usize,
    token: u64,
    deadline_local: u64,
    next_renew_local: u64,
    /// A greedy holder never renews and writes up to its last valid local
    /// millisecond: the sharpest test of L3.
    greedy: bool,
}

#[derive(Debug, Clone)]
struct HeldJob {
    id: u64,
    token: u64,
    deadline_local: u64,
    work_end_local: u64,
    next_hb_local: u64,
    /// Whether the handler fails (decided once, at claim).
    will_fail: bool,
    /// The worker has started settling: a retried complete or fail (after a
    /// lost reply) neither redoes the side effect nor changes its mind.
    settling: bool,
}

#[derive(Debug, Clone)]
enum RoleState {
    Holder {
        key: usize,
        lease: Option<HeldLease>,
        writes_left: u32,
        next_local: u64,
    },
    Producer {
        left: u32,
        next_local: u64,
    },
    Worker {
        batch: usize,
        jobs: VecDeque<HeldJob>,
        next_local: u64,
    },
    Prober,
}

#[derive(Debug, Clone)]
struct Proc {
    gen: u32,
    alive: bool,
    exited: bool,
    paused_until: Option<u64>,
    /// Which pause is in force (a stale Resume must not end a later one).
    pause_id: u64,
    deferred: Vec<Ev>,
    holder: HolderId,
    clock: LocalClock,
    rng: StdRng,
    inflight: Option<(Req, u64)>,
    timer: u64,
    forked_child: bool,
    state: RoleState,
}

/// The result of one run.
#[derive(Debug)]
pub struct RunResult {
    /// The first broken guarantee, if any.
    pub violation: Option<Violation>,
    /// Every trace line with its true time.
    pub trace: Vec<(u64, Line)>,
    /// Events processed.
    pub events: u64,
}

impl RunResult {
    /// The whole trace as text.
    pub fn trace_text(&self) -> String {
        let mut out = String::new();
        for (t, line) in &self.trace {
            let _ = writeln!(out, "t={t:>8} {line}");
        }
        out
    }
}

/// A transaction wrapper for the claim canary: "ready" also yields
/// running jobs whose lease has not expired.
struct BlindClaims<'a>(&'a mut dyn JobTxn);

impl Txn for BlindClaims<'_> {
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
    fn lease_mut(
        &mut self,
        _key: &str,
        _create: bool,
    ) -> leasehold::Result<Option<&mut leasehold::core::LeaseRecord>> {
        Ok(None)
    }
    fn wake(&mut self, wake: leasehold::Wake) {
        self.0.wake(wake);
    }
    fn jobs(&mut self) -> leasehold::Result<&mut dyn JobTxn> {
        Ok(self)
    }
}

impl JobTxn for BlindClaims<'_> {
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
    fn wake(&mut self, wake: leasehold::Wake) {
        self.0.wake(wake);
    }
    fn next_job_id(&mut self) -> leasehold::Result<JobId> {
        self.0.next_job_id()
    }
    fn job(&mut self, id: JobId) -> leasehold::Result<Option<JobRecord>> {
        self.0.job(id)
    }
    fn jobs_by_id(&mut self, ids: &[JobId]) -> leasehold::Result<Vec<JobRecord>> {
        self.0.jobs_by_id(ids)
    }
    fn put_job(&mut self, job: &JobRecord) -> leasehold::Result<()> {
        self.0.put_job(job)
    }
    fn delete_job(&mut self, id: JobId) -> leasehold::Result<()> {
        self.0.delete_job(id)
    }
    fn live_unique(&mut self, queue: &str, key: &str) -> leasehold::Result<Option<JobId>> {
        self.0.live_unique(queue, key)
    }
    fn pending(
        &mut self,
        queue: &str,
        now_ms: u64,
        chunk: usize,
        ready: usize,
    ) -> leasehold::Result<Pending> {
        let mut read = self.0.pending(queue, now_ms, chunk, ready)?;
        if ready > 0 {
            // Broken on purpose: every running job looks claimable.
            let running = self.0.pending(queue, u64::MAX, ready, 0)?.expired;
            let live = running
                .into_iter()
                .filter(|j| j.claim.is_some_and(|c| c.lease_until_ms > now_ms));
            read.ready.splice(0..0, live);
        }
        Ok(read)
    }
    fn scan(
        &mut self,
        queue: &str,
        query: JobQuery,
        limit: usize,
        out: &mut Vec<JobId>,
    ) -> leasehold::Result<()> {
        self.0.scan(queue, query, limit, out)
    }
    fn counts(&mut self, queue: &str) -> leasehold::Result<StateCounts> {
        self.0.counts(queue)
    }
    fn list(
        &mut self,
        queue: &str,
        state: Option<JobState>,
        after: JobId,
        limit: usize,
    ) -> leasehold::Result<Vec<JobRecord>> {
        self.0.list(queue, state, after, limit)
    }
}

/// A running simulation.
pub struct Sim<'a> {
    plan: &'a Plan,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    procs: Vec<Proc>,
    store: Arc<dyn Store>,
    clock: ManualClock,
    policy: QueuePolicy,
    drift: DriftBound,
    oracle: Oracle,
    net: StdRng,
    trace: Vec<(u64, Line)>,
    events: u64,
    healing: bool,
    /// The run ends here: the end of the faults plus the worst case for
    /// one job, pushed back by every job that finishes (progress), so the
    /// liveness check scales with the backlog instead of a fixed clock.
    heal_deadline: u64,
    /// The worst case for one job to finish once faults stop.
    heal_bound: u64,
    /// Jobs finished (done, dead, cancelled) as of the last look.
    finished: u64,
    violation: Option<Violation>,
    prober_gen: u32,
}

/// Builds the store a run uses, on the run's true clock.
pub type StoreFactory = dyn Fn(&ManualClock) -> Arc<dyn Store> + Sync;

/// The default store: in memory.
pub fn mem_store(clock: &ManualClock) -> Arc<dyn Store> {
    Arc::new(MemStore::with_clock(Arc::new(clock.clone())))
}

/// A real store in a fresh temporary directory, removed with the store.
struct TempStore<S> {
    store: S,
    dir: std::path::PathBuf,
}

impl<S> Drop for TempStore<S> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl<S: Store> Store for TempStore<S> {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        self.store.transact(f)
    }
    fn describe(&self) -> String {
        self.store.describe()
    }
}

/// Open a store of kind `tag` in a fresh temporary directory.
fn temp_store<S: Store + 'static>(
    tag: &str,
    open: impl FnOnce(&std::path::Path) -> leasehold::Result<S>,
) -> Arc<dyn Store> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "leasehold-sim-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let opened = std::fs::create_dir_all(&dir)
        .map_err(|e| leasehold::Error::store("creating a temp dir", e.to_string()))
        .and_then(|()| open(&dir));
    match opened {
        Ok(store) => Arc::new(TempStore { store, dir }),
        Err(e) => panic!("the simulator could not open its {tag} store: {e}"),
    }
}

/// A SQLite store on the run's clock: the simulator drives the real adapter.
pub fn sqlite_store(clock: &ManualClock) -> Arc<dyn Store> {
    let opts = leasehold::SqliteOptions {
        clock: Some(Arc::new(clock.clone())),
        boot_id: Some("sim".into()),
        ..leasehold::SqliteOptions::default()
    };
    temp_store("sqlite", |dir| {
        leasehold::SqliteStore::open_with(dir.join("sim.db"), opts)
    })
}

/// A file store (durable writes off) on the run's clock. Leases only: use it
/// with lease scenarios.
pub fn file_store(clock: &ManualClock) -> Arc<dyn Store> {
    let opts = leasehold::FileOptions {
        clock: Some(Arc::new(clock.clone())),
        boot_id: Some("sim".into()),
        durable: false,
        ..leasehold::FileOptions::default()
    };
    temp_store("file", |dir| {
        leasehold::FileStore::open_with(dir.join("leases"), opts)
    })
}

/// Run `plan` on the mem store.
pub fn run(plan: &Plan) -> RunResult {
    run_with(plan, &mem_store)
}

/// Run `plan` on the store `make` builds.
pub fn run_with(plan: &Plan, make: &StoreFactory) -> RunResult {
    let clock = ManualClock::new(T0);
    let store = make(&clock);
    let policy = QueuePolicy {
        backoff_base_ms: 10,
        backoff_max_ms: 200,
        jitter_seed: plan.seed,
        quarantine_expiries: 4,
    };
    let drift = DriftBound {
        ppm: plan.drift_bound_ppm,
        margin_ms: 1,
    };
    let long = plan.ttl_ms.max(plan.lease_ms);
    let heal_bound = u64::from(plan.max_attempts + 1)
        * (long + policy.backoff_max_ms + plan.work_max_ms + 50)
        + 5 * long
        + 2_000;
    let mut sim = Sim {
        plan,
        now: T0,
        seq: 0,
        queue: BTreeMap::new(),
        procs: Vec::new(),
        store,
        clock,
        policy,
        drift,
        oracle: Oracle::new(Model::new(T0, policy), plan.keys.clone(), plan.strict_l3),
        net: StdRng::seed_from_u64(plan.seed ^ 0x006E_6574_776F_726B),
        trace: Vec::new(),
        events: 0,
        healing: false,
        heal_deadline: T0 + plan.duration_ms + heal_bound,
        heal_bound,
        finished: 0,
        violation: None,
        prober_gen: 0,
    };
    for (i, spec) in plan.procs.iter().enumerate() {
        let mut rng =
            StdRng::seed_from_u64(plan.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let holder = HolderId(rng.random());
        let state = sim.fresh_state(spec.role);
        sim.procs.push(Proc {
            gen: 0,
            alive: true,
            exited: false,
            paused_until: None,
            pause_id: 0,
            deferred: Vec::new(),
            holder,
            clock: LocalClock {
                offset_ms: spec.offset_ms,
                drift_ppm: spec.drift_ppm,
                step_ms: 0,
            },
            rng,
            inflight: None,
            timer: 0,
            forked_child: false,
            state,
        });
        sim.wake_in(i, 0);
    }
    for (i, &(at, _)) in plan.faults.iter().enumerate() {
        sim.push(T0 + at, Ev::Fault(i));
    }
    sim.push(T0 + plan.duration_ms, Ev::Heal);
    sim.run_loop();
    if sim.violation.is_none() {
        sim.final_checks();
    }
    RunResult {
        violation: sim.violation,
        trace: sim.trace,
        events: sim.events,
    }
}

impl Sim<'_> {
    fn fresh_state(&self, role: Role) -> RoleState {
        match role {
            Role::Holder { key } => RoleState::Holder {
                key,
                lease: None,
                writes_left: 0,
                next_local: 0,
            },
            Role::Producer { jobs } => RoleState::Producer {
                left: jobs,
                next_local: 0,
            },
            Role::Worker { batch } => RoleState::Worker {
                batch,
                jobs: VecDeque::new(),
                next_local: 0,
            },
            Role::Prober => RoleState::Prober,
        }
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((at, self.seq), ev);
    }

    fn note(&mut self, line: Line) {
        self.trace.push((self.now, line));
    }

    fn fail(&mut self, v: Violation) {
        if self.violation.is_none() {
            self.note(Line::Note(format!("VIOLATION {v}")));
            self.violation = Some(v);
        }
    }

    fn check(&mut self, r: Result<(), Violation>) {
        if let Err(v) = r {
            self.fail(v);
        }
    }

    fn local(&self, p: usize) -> u64 {
        self.procs[p].clock.read(self.now)
    }

    fn owner(&self, p: usize) -> Owner {
        (p, self.procs[p].gen)
    }

    /// Schedule process `p` to run after `local_ms` of its own clock.
    fn wake_in(&mut self, p: usize, local_ms: u64) {
        let delay = self.procs[p].clock.true_delay(local_ms);
        let proc = &mut self.procs[p];
        proc.timer += 1;
        let ev = Ev::Wake {
            p,
            gen: proc.gen,
            timer: proc.timer,
        };
        self.push(self.now.saturating_add(delay), ev);
    }

    fn wake_at_local(&mut self, p: usize, local_target: u64) {
        let wait = local_target.saturating_sub(self.local(p)).max(1);
        self.wake_in(p, wait);
    }

    fn latency(&mut self) -> u64 {
        let (lo, hi) = self.plan.latency_ms;
        self.net.random_range(lo..=hi)
    }

    fn send(&mut self, p: usize, req: Req) {
        let at = self.now + self.latency();
        self.send_arriving(p, req, at, "");
    }

    /// Send `req` so that it reaches the store at `at` (bursts land together).
    fn send_arriving(&mut self, p: usize, req: Req, at: u64, why: &str) {
        let local = self.local(p);
        let (gen, holder) = (self.procs[p].gen, self.procs[p].holder);
        self.note(Line::Send(p, gen, format!("{req}{why}")));
        self.procs[p].inflight = Some((req.clone(), local));
        if self.procs[p].forked_child && self.plan.canary != Some(Canary::ForkReusesHandle) {
            // The handle's fork guard refuses before anything is sent.
            let ev = Ev::Reply {
                p,
                gen,
                rep: Rep::Forked,
            };
            self.push(self.now, ev);
            return;
        }
        self.push(
            at,
            Ev::Arrive {
                p,
                gen,
                holder,
                req,
                reply: true,
            },
        );
    }

    fn run_loop(&mut self) {
        const MAX_EVENTS: u64 = 5_000_000;
        while let Some(((at, _), ev)) = self.queue.pop_first() {
            if self.violation.is_some() || at > self.heal_deadline || self.events >= MAX_EVENTS {
                break;
            }
            self.now = at;
            self.events += 1;
            let arrival = matches!(ev, Ev::Arrive { .. });
            self.dispatch(ev);
            if arrival {
                self.note_progress();
            }
        }
    }

    /// A job that finished is progress: the deadline moves to one job's
    /// worst case from now. A run whose jobs stop finishing while some
    /// remain ends at the deadline, and the final checks report them (Q3).
    fn note_progress(&mut self) {
        let counts = self.oracle.model.counts(QUEUE);
        let finished = counts[3] + counts[4] + counts[5];
        if finished > self.finished {
            self.finished = finished;
            self.heal_deadline = self.heal_deadline.max(self.now + self.heal_bound);
        }
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Wake { p, gen, timer } => {
                let proc = &self.procs[p];
                if !proc.alive || proc.gen != gen || proc.timer != timer {
                    return;
                }
                if self.defer_if_paused(p, Ev::Wake { p, gen, timer }) {
                    return;
                }
                self.poll(p);
            }
            Ev::Arrive {
                p,
                gen,
                holder,
                req,
                reply,
            } => self.arrive(p, gen, holder, req, reply),
            Ev::Reply { p, gen, rep } => {
                let proc = &self.procs[p];
                if !proc.alive || proc.gen != gen {
                    return;
                }
                if self.defer_if_paused(
                    p,
                    Ev::Reply {
                        p,
                        gen,
                        rep: rep.clone(),
                    },
                ) {
                    return;
                }
                self.reply(p, rep);
            }
            Ev::Fault(i) => {
                if !self.healing {
                    let fault = self.plan.faults[i].1;
                    self.fault(fault);
                }
            }
            Ev::Restart { p } => self.restart(p),
            Ev::Resume { p, pause } => {
                if self.procs[p].pause_id == pause {
                    self.resume(p);
                }
            }
            Ev::Heal => self.heal(),
        }
    }

    fn defer_if_paused(&mut self, p: usize, ev: Ev) -> bool {
        match self.procs[p].paused_until {
            Some(until) if self.now < until => {
                self.procs[p].deferred.push(ev);
                true
            }
            _ => false,
        }
    }

    // ---------------------------------------------------------- the store

    /// The store applies `req` at `now` (it arrived over the network).
    fn arrive(&mut self, p: usize, gen: u32, holder: HolderId, req: Req, reply: bool) {
        let owner = (p, gen);
        let healing = self.healing;
        if !healing
            && self.plan.transient_ppm > 0
            && self.net.random_range(0..1_000_000) < self.plan.transient_ppm
        {
            self.note(Line::Apply(
                p,
                gen,
                req.to_string(),
                "transient error (nothing applied)".into(),
            ));
            if reply {
                let at = self.now + self.latency();
                self.push(
                    at,
                    Ev::Reply {
                        p,
                        gen,
                        rep: Rep::Transient,
                    },
                );
            }
            return;
        }
        self.clock.set(self.now);
        self.oracle.model.tick(self.now);
        let got = self.apply(owner, holder, &req);
        self.note(Line::Apply(p, gen, req.to_string(), format!("{got:?}")));
        if self.violation.is_some() {
            return;
        }
        if !reply {
            return;
        }
        let rep = if !healing
            && self.plan.ambiguous_ppm > 0
            && self.net.random_range(0..1_000_000) < self.plan.ambiguous_ppm
        {
            Rep::Unknown
        } else {
            Rep::Done(got)
        };
        let at = self.now + self.latency();
        self.push(at, Ev::Reply { p, gen, rep });
    }

    fn apply(&mut self, owner: Owner, holder: HolderId, req: &Req) -> Outcome {
        let t = self.now;
        let policy = self.policy;
        let canary = self.plan.canary;
        let h = Holder::new(holder);
        // Under the fencing canary the store swaps in the current token and
        // holder, as a store that ignored them would behave.
        let (holder, req_token) = match (canary, req) {
            (Some(Canary::IgnoresFencing), Req::Renew { key, .. } | Req::Release { key, .. }) => {
                let info = self
                    .store
                    .txn(|tx| core::lease::inspect(tx, &key_name(*key)))
                    .ok();
                match info.and_then(|i| i.holders.first().cloned()) {
                    Some(hi) => (hi.holder.id, Some(hi.token)),
                    None => (holder, None),
                }
            }
            (
                Some(Canary::IgnoresFencing),
                Req::Heartbeat { job, .. } | Req::Complete { job, .. } | Req::Fail { job, .. },
            ) => {
                let rec = self
                    .store
                    .txn(|tx| core::job::get(tx, JobId(*job), &policy))
                    .ok();
                match rec.and_then(|r| r.claim) {
                    Some(c) => (c.holder, Some(c.token)),
                    None => (holder, None),
                }
            }
            _ => (holder, None),
        };
        let tok = |t: u64| req_token.unwrap_or(t);
        let model = &mut self.oracle.model;
        let (got, expect) = match req {
            Req::Acquire { key } => {
                let name = key_name(*key);
                let limit = self.plan.keys[*key];
                let r = self
                    .store
                    .txn(|tx| core::lease::acquire(tx, &name, &h, self.plan.ttl_ms, limit));
                model.acquire(&name, holder.0, self.plan.ttl_ms, limit);
                let got = Outcome::of(&r, Outcome::grant);
                if let Ok(g) = &r {
                    let c = self
                        .oracle
                        .grant(t, *key, owner, g.token, g.expires_at_ms, g.renewed);
                    self.check(c);
                }
                (got, format!("acquire {name}"))
            }
            Req::Renew { key, token } => {
                let name = key_name(*key);
                let r = self
                    .store
                    .txn(|tx| core::lease::renew(tx, &name, holder, tok(*token), self.plan.ttl_ms));
                model.renew(&name, holder.0, tok(*token), self.plan.ttl_ms);
                if let Ok(g) = &r {
                    let c = self.oracle.renewed(t, *key, owner, *token, g.expires_at_ms);
                    self.check(c);
                }
                (Outcome::of(&r, Outcome::grant), format!("renew {name}"))
            }
            Req::Release { key, token } => {
                let name = key_name(*key);
                let r = self
                    .store
                    .txn(|tx| core::lease::release(tx, &name, holder, tok(*token)));
                model.release(&name, holder.0, tok(*token));
                if r.is_ok() {
                    let c = self.oracle.released(t, *key, owner, *token);
                    self.check(c);
                }
                (Outcome::of(&r, |()| Outcome::Ok), format!("release {name}"))
            }
            Req::Push(spec) => {
                let r = self
                    .store
                    .txn(|tx| core::job::enqueue(tx, QUEUE, spec, &policy));
                model.enqueue(QUEUE, spec);
                (
                    Outcome::of(&r, |o| Outcome::Enqueued {
                        id: o.id.0,
                        created: o.created,
                    }),
                    "push".to_owned(),
                )
            }
            Req::Claim { n } => {
                let lease = self.plan.lease_ms;
                let blind = canary == Some(Canary::ClaimIgnoresLease);
                let r = self.store.txn(|tx| {
                    if blind {
                        let mut tx = BlindClaims(tx.jobs()?);
                        core::job::claim(&mut tx, QUEUE, holder, lease, *n, &policy)
                    } else {
                        core::job::claim(tx, QUEUE, holder, lease, *n, &policy)
                    }
                });
                if let Ok(jobs) = &r {
                    let claimed: Vec<(u64, u64, u64)> = jobs
                        .iter()
                        .map(|j| {
                            let c = j.claim.map_or((0, 0), |c| (c.token, c.lease_until_ms));
                            (j.id.0, c.0, c.1)
                        })
                        .collect();
                    let c = self.oracle.claimed(t, owner, &claimed);
                    self.check(c);
                }
                self.oracle.model.claim(QUEUE, holder.0, lease, *n);
                (
                    Outcome::of(&r, |jobs| Outcome::claimed(jobs)),
                    "claim".to_owned(),
                )
            }
            Req::Heartbeat { job, token } => {
                let lease = self.plan.lease_ms;
                let r = self
                    .store
                    .txn(|tx| core::job::heartbeat(tx, JobId(*job), holder, tok(*token), lease));
                model.heartbeat(*job, holder.0, tok(*token), lease);
                if let Ok(hb) = &r {
                    let c = self
                        .oracle
                        .heartbeat(t, *job, owner, *token, hb.lease_until_ms);
                    self.check(c);
                }
                (
                    Outcome::of(&r, Outcome::heartbeat),
                    format!("heartbeat {job}"),
                )
            }
            Req::Complete { job, token } => {
                let r = self
                    .store
                    .txn(|tx| core::job::complete(tx, JobId(*job), holder, tok(*token)));
                model.complete(*job, holder.0, tok(*token));
                if r.is_ok() {
                    let c = self.oracle.settled(t, *job, owner, *token, true);
                    self.check(c);
                }
                (Outcome::of(&r, |()| Outcome::Ok), format!("complete {job}"))
            }
            Req::Fail { job, token } => {
                let r = self.store.txn(|tx| {
                    core::job::fail(
                        tx,
                        JobId(*job),
                        holder,
                        tok(*token),
                        "handler failed",
                        &policy,
                    )
                });
                model.fail(*job, holder.0, tok(*token), "handler failed");
                if r.is_ok() {
                    let c = self.oracle.settled(t, *job, owner, *token, false);
                    self.check(c);
                }
                (
                    Outcome::of(&r, |s| Outcome::State(*s)),
                    format!("fail {job}"),
                )
            }
        };
        if self.violation.is_none() {
            let c = self.oracle.compare(t, &expect, &got);
            self.check(c);
        }
        got
    }

    // ---------------------------------------------------------- processes

    fn poll(&mut self, p: usize) {
        if self.procs[p].inflight.is_some() || !self.procs[p].alive || self.procs[p].exited {
            return;
        }
        let local = self.local(p);
        let state = self.procs[p].state.clone();
        match state {
            RoleState::Holder {
                key,
                lease,
                writes_left,
                next_local,
            } => self.poll_holder(p, local, key, lease, writes_left, next_local),
            RoleState::Producer { left, next_local } => {
                if left == 0 || self.healing || self.procs[p].forked_child {
                    self.exit(p);
                } else if local >= next_local {
                    let spec = self.random_spec(p);
                    self.send(p, Req::Push(Box::new(spec)));
                } else {
                    self.wake_at_local(p, next_local);
                }
            }
            RoleState::Worker {
                batch,
                jobs,
                next_local,
            } => self.poll_worker(p, local, batch, jobs, next_local),
            RoleState::Prober => {}
        }
    }

    fn random_spec(&mut self, p: usize) -> JobSpec {
        let rng = &mut self.procs[p].rng;
        JobSpec {
            priority: rng.random_range(-1..=2),
            delay_ms: if rng.random_bool(0.3) {
                rng.random_range(1..=200)
            } else {
                0
            },
            max_attempts: self.plan.max_attempts,
            unique_key: rng
                .random_bool(0.1)
                .then(|| format!("u{}", rng.random_range(0..3))),
            ..JobSpec::new(vec![rng.random::<u8>()])
        }
    }

    fn set_holder(
        &mut self,
        p: usize,
        lease: Option<HeldLease>,
        writes_left: u32,
        next_local: u64,
    ) {
        if let RoleState::Holder {
            lease: l,
            writes_left: w,
            next_local: n,
            ..
        } = &mut self.procs[p].state
        {
            *l = lease;
            *w = writes_left;
            *n = next_local;
        }
    }

    fn poll_holder(
        &mut self,
        p: usize,
        local: u64,
        key: usize,
        lease: Option<HeldLease>,
        writes_left: u32,
        next_local: u64,
    ) {
        let Some(l) = lease else {
            if self.healing || self.procs[p].forked_child {
                self.exit(p);
            } else if local >= next_local {
                self.send(p, Req::Acquire { key });
            } else {
                self.wake_at_local(p, next_local);
            }
            return;
        };
        // A forked child's guard is never valid (unless the canary breaks it).
        let forked_ok =
            !self.procs[p].forked_child || self.plan.canary == Some(Canary::ForkReusesHandle);
        let valid = forked_ok && local < l.deadline_local;
        if !valid || (writes_left == 0 && !l.greedy) || self.healing {
            // Lost locally, done, or shutting down: release (a stale release
            // is refused by the store, which is fine).
            self.send(
                p,
                Req::Release {
                    key: l.key,
                    token: l.token,
                },
            );
            return;
        }
        if local >= l.next_renew_local && !l.greedy {
            self.send(
                p,
                Req::Renew {
                    key: l.key,
                    token: l.token,
                },
            );
            return;
        }
        if local >= next_local {
            let fencing = self.plan.fencing;
            let owner = self.owner(p);
            let r = self.oracle.write(self.now, l.key, owner, l.token, fencing);
            match r {
                Ok(accepted) => self.note(Line::Write {
                    p,
                    key: l.key,
                    token: l.token,
                    accepted,
                }),
                Err(v) => {
                    self.fail(v);
                    return;
                }
            }
            let gap = self.procs[p]
                .rng
                .random_range(1..=(self.plan.ttl_ms / 4).max(1));
            let mut next = local + gap;
            if l.greedy {
                // Land the last write on the last valid local millisecond.
                next = next.min(l.deadline_local.saturating_sub(1)).max(local + 1);
            }
            self.set_holder(p, Some(l), writes_left.saturating_sub(1), next);
            self.wake_in(p, 0);
            return;
        }
        let renew_at = if l.greedy {
            u64::MAX
        } else {
            l.next_renew_local
        };
        let next = next_local.min(renew_at).min(l.deadline_local);
        self.set_holder(p, Some(l), writes_left, next_local);
        self.wake_at_local(p, next);
    }

    fn poll_worker(
        &mut self,
        p: usize,
        local: u64,
        batch: usize,
        mut jobs: VecDeque<HeldJob>,
        next_local: u64,
    ) {
        let forked = self.procs[p].forked_child;
        if forked && jobs.is_empty() {
            self.exit(p);
            return;
        }
        let Some(front) = jobs.front().cloned() else {
            if self.healing && self.plan.canary == Some(Canary::WorkerStopsClaiming) {
                // Broken on purpose: alive, polling, never claiming again.
                self.wake_in(p, 10);
            } else if self.healing && self.producers_quiet() && self.queue_drained() {
                self.exit(p);
            } else if local >= next_local {
                self.send(p, Req::Claim { n: batch });
            } else {
                self.wake_at_local(p, next_local);
            }
            return;
        };
        if local >= front.deadline_local || local >= front.work_end_local {
            // Done, or the claim ran out locally: report it either way (the
            // store refuses a stale outcome). The job's side effect happens
            // only while the claim is locally valid.
            let fails = front.will_fail;
            let (job, token) = (front.id, front.token);
            let forked_ok = !forked || self.plan.canary == Some(Canary::ForkReusesHandle);
            if !fails && forked_ok && !front.settling && local < front.deadline_local {
                let owner = self.owner(p);
                let c = self.oracle.effect(self.now, job, owner, token);
                self.note(Line::Note(format!(
                    "p{p} performs job {job}'s effect with token {token}"
                )));
                if let Err(v) = c {
                    self.fail(v);
                    return;
                }
            }
            if let RoleState::Worker { jobs, .. } = &mut self.procs[p].state {
                if let Some(j) = jobs.iter_mut().find(|j| j.id == job) {
                    j.settling = true;
                }
            }
            if fails {
                self.send(p, Req::Fail { job, token });
            } else {
                self.send(p, Req::Complete { job, token });
            }
            return;
        }
        // Then heartbeat whichever held job is due (the outcome goes first:
        // a worker busy heartbeating must not starve its finished work).
        if let Some(j) = jobs
            .iter()
            .find(|j| local >= j.next_hb_local && local < j.deadline_local)
        {
            let (job, token) = (j.id, j.token);
            self.send(p, Req::Heartbeat { job, token });
            return;
        }
        let next = jobs
            .iter()
            .map(|j| j.next_hb_local.min(j.deadline_local))
            .min()
            .unwrap_or(u64::MAX)
            .min(front.work_end_local);
        jobs.make_contiguous();
        self.procs[p].state = RoleState::Worker {
            batch,
            jobs,
            next_local,
        };
        self.wake_at_local(p, next);
    }

    /// Every producer has stopped and none of its pushes is still in the
    /// network (a worker that left earlier would strand them).
    fn producers_quiet(&self) -> bool {
        let in_flight_bound = T0 + self.plan.duration_ms + 2 * self.plan.latency_ms.1 + 1;
        self.now >= in_flight_bound
            && self
                .procs
                .iter()
                .all(|pr| !matches!(pr.state, RoleState::Producer { .. }) || pr.exited || !pr.alive)
    }

    fn queue_drained(&mut self) -> bool {
        let policy = self.policy;
        self.clock.set(self.now);
        match self.store.txn(|tx| core::job::stats(tx, QUEUE, &policy)) {
            Ok(c) => {
                c.get(JobState::Ready) + c.get(JobState::Scheduled) + c.get(JobState::Running) == 0
            }
            Err(_) => false,
        }
    }

    fn reply(&mut self, p: usize, rep: Rep) {
        let Some((req, sent_local)) = self.procs[p].inflight.take() else {
            return;
        };
        let gen = self.procs[p].gen;
        self.note(Line::Reply(p, gen, format!("{rep:?} for {req}")));
        if rep == Rep::Forked {
            // The child gives up its inherited handles and exits.
            self.exit(p);
            return;
        }
        let local = self.local(p);
        let (ttl, lease_ms, work_max) =
            (self.plan.ttl_ms, self.plan.lease_ms, self.plan.work_max_ms);
        let fail_ppm = self.plan.fail_ppm;
        let drift = self.drift;
        let pr = &mut self.procs[p];
        let retry = matches!(rep, Rep::Transient | Rep::Unknown);
        match (&mut pr.state, req) {
            (
                RoleState::Holder {
                    lease,
                    writes_left,
                    next_local,
                    ..
                },
                Req::Acquire { key },
            ) => match rep {
                Rep::Done(Outcome::Grant { token, .. }) => {
                    *lease = Some(HeldLease {
                        key,
                        token,
                        deadline_local: core::local_deadline_ms(sent_local, ttl, drift),
                        next_renew_local: sent_local + ttl / 3,
                        greedy: pr.rng.random_bool(0.3),
                    });
                    *writes_left = pr.rng.random_range(1..=8);
                    *next_local = local;
                }
                // Unknown: maybe granted; acquiring again renews it if so.
                Rep::Transient | Rep::Unknown => *next_local = local + pr.rng.random_range(1..=10),
                _ => *next_local = local + pr.rng.random_range(1..=(ttl / 2).max(1)),
            },
            (RoleState::Holder { lease: Some(l), .. }, Req::Renew { .. }) if retry => {
                l.next_renew_local = local + 2;
            }
            (
                RoleState::Holder {
                    lease, next_local, ..
                },
                Req::Renew { .. },
            ) => match (rep, lease.as_mut()) {
                (Rep::Done(Outcome::Grant { .. }), Some(l)) => {
                    l.deadline_local = core::local_deadline_ms(sent_local, ttl, drift);
                    l.next_renew_local = sent_local + ttl / 3;
                }
                _ => {
                    *lease = None;
                    *next_local = local + pr.rng.random_range(1..=(ttl / 2).max(1));
                }
            },
            (
                RoleState::Holder {
                    lease, next_local, ..
                },
                Req::Release { .. },
            ) if rep != Rep::Transient => {
                // The lease is gone either way (released, or already lost);
                // after a transient error the release is retried.
                *lease = None;
                *next_local = local + pr.rng.random_range(1..=ttl.max(1));
            }
            (RoleState::Producer { left, next_local }, Req::Push(_)) => {
                if matches!(rep, Rep::Done(Outcome::Enqueued { .. })) {
                    *left = left.saturating_sub(1);
                }
                *next_local = local + pr.rng.random_range(0..=20);
            }
            (
                RoleState::Worker {
                    jobs, next_local, ..
                },
                Req::Claim { .. },
            ) => match rep {
                Rep::Done(Outcome::Claimed(claimed)) if !claimed.is_empty() => {
                    let deadline = core::local_deadline_ms(sent_local, lease_ms, drift);
                    for (id, token, _attempts, _until) in claimed {
                        jobs.push_back(HeldJob {
                            id,
                            token,
                            deadline_local: deadline,
                            work_end_local: local + pr.rng.random_range(1..=work_max.max(1)),
                            next_hb_local: sent_local + lease_ms / 3,
                            will_fail: pr.rng.random_range(0..1_000_000) < fail_ppm,
                            settling: false,
                        });
                    }
                }
                _ => *next_local = local + pr.rng.random_range(2..=30),
            },
            (RoleState::Worker { jobs, .. }, Req::Heartbeat { job, .. }) => {
                if let Some(j) = jobs.iter_mut().find(|j| j.id == job) {
                    match rep {
                        Rep::Done(Outcome::Heartbeat {
                            cancel_requested, ..
                        }) => {
                            j.deadline_local = core::local_deadline_ms(sent_local, lease_ms, drift);
                            j.next_hb_local = sent_local + lease_ms / 3;
                            if cancel_requested {
                                j.work_end_local = local;
                            }
                        }
                        Rep::Transient | Rep::Unknown => j.next_hb_local = local + 2,
                        _ => jobs.retain(|j| j.id != job),
                    }
                }
            }
            (RoleState::Worker { jobs, .. }, Req::Complete { job, .. } | Req::Fail { job, .. })
                if !retry =>
            {
                jobs.retain(|j| j.id != job);
            }
            _ => {}
        }
        self.poll(p);
    }

    fn exit(&mut self, p: usize) {
        if !self.procs[p].exited {
            self.procs[p].exited = true;
            let gen = self.procs[p].gen;
            self.note(Line::Note(format!("p{p}.{gen} exits")));
        }
    }

    // ------------------------------------------------------------- faults

    fn fault(&mut self, fault: Fault) {
        self.note(Line::Fault(fault.to_string()));
        match fault {
            Fault::Kill {
                proc,
                restart_after_ms,
            } => {
                let pr = &mut self.procs[proc];
                if !pr.alive || pr.exited {
                    return;
                }
                pr.alive = false;
                pr.gen += 1;
                pr.inflight = None;
                pr.deferred.clear();
                pr.paused_until = None;
                self.push(self.now + restart_after_ms, Ev::Restart { p: proc });
            }
            Fault::Pause { proc, for_ms } => {
                let pr = &mut self.procs[proc];
                if !pr.alive || pr.exited || pr.paused_until.is_some() {
                    return;
                }
                pr.paused_until = Some(self.now + for_ms);
                pr.pause_id += 1;
                let pause = pr.pause_id;
                self.push(self.now + for_ms, Ev::Resume { p: proc, pause });
            }
            Fault::Fork { proc } => {
                let parent = self.procs[proc].clone();
                if !parent.alive || parent.exited || parent.paused_until.is_some() {
                    return;
                }
                let mut child = parent;
                child.forked_child = true;
                child.inflight = None;
                child.deferred.clear();
                let child_idx = self.procs.len();
                // The child keeps the parent's handles (same owner in the
                // oracle's eyes is exactly what must never act).
                child.rng = StdRng::seed_from_u64(self.plan.seed ^ 0xF0F0 ^ child_idx as u64);
                self.procs.push(child);
                self.note(Line::Note(format!("p{proc} forked into p{child_idx}")));
                self.wake_in(child_idx, 0);
            }
            Fault::Burst => {
                let at = self.now + self.plan.latency_ms.0;
                for p in 0..self.procs.len() {
                    let pr = &self.procs[p];
                    if !pr.alive || pr.exited || pr.paused_until.is_some() || pr.inflight.is_some()
                    {
                        continue;
                    }
                    let req = match &pr.state {
                        RoleState::Worker { batch, jobs, .. } if jobs.is_empty() => {
                            Req::Claim { n: *batch }
                        }
                        RoleState::Holder {
                            key, lease: None, ..
                        } => Req::Acquire { key: *key },
                        _ => continue,
                    };
                    self.procs[p].timer += 1;
                    self.send_arriving(p, req, at, " (burst)");
                }
            }
            Fault::ClockStep { proc, delta_ms } => {
                self.procs[proc].clock.step_ms += delta_ms;
            }
            Fault::Boundary => self.probe_boundary(),
        }
    }

    /// Land operations exactly at one ms before, at, and one ms after the
    /// next expiry in the store.
    fn probe_boundary(&mut self) {
        let prober = self.procs.len() - 1;
        let policy = self.policy;
        self.clock.set(self.now);
        let mut target: Option<(u64, Req)> = None;
        for key in 0..self.plan.keys.len() {
            let name = key_name(key);
            if let Ok(info) = self.store.txn(|tx| core::lease::inspect(tx, &name)) {
                if let Some(h) = info.holders.iter().min_by_key(|h| h.expires_at_ms) {
                    if target.as_ref().is_none_or(|(t, _)| h.expires_at_ms < *t) {
                        target = Some((h.expires_at_ms, Req::Acquire { key }));
                    }
                }
            }
        }
        if let Ok(running) = self
            .store
            .txn(|tx| core::job::list(tx, QUEUE, Some(JobState::Running), JobId(0), 100, &policy))
        {
            if let Some(c) = running
                .iter()
                .filter_map(|j| j.claim)
                .min_by_key(|c| c.lease_until_ms)
            {
                if target.as_ref().is_none_or(|(t, _)| c.lease_until_ms < *t) {
                    target = Some((c.lease_until_ms, Req::Claim { n: 1 }));
                }
            }
        }
        let Some((at, req)) = target else {
            return;
        };
        self.prober_gen += 1;
        let holder = HolderId(0xB0B0_0000 + u128::from(self.prober_gen));
        for t in [at.saturating_sub(1), at, at + 1] {
            if t >= self.now {
                let gen = self.procs[prober].gen;
                self.push(
                    t,
                    Ev::Arrive {
                        p: prober,
                        gen,
                        holder,
                        req: req.clone(),
                        reply: false,
                    },
                );
            }
        }
    }

    fn restart(&mut self, p: usize) {
        let role = self.plan.procs.get(p).map(|s| s.role);
        let Some(role) = role else { return };
        let state = self.fresh_state(role);
        let pr = &mut self.procs[p];
        if pr.alive {
            return;
        }
        pr.alive = true;
        pr.exited = false;
        pr.holder = HolderId(pr.rng.random());
        pr.state = state;
        pr.inflight = None;
        self.note(Line::Note(format!(
            "p{p}.{} restarts with a new identity",
            self.procs[p].gen
        )));
        self.wake_in(p, 0);
    }

    fn resume(&mut self, p: usize) {
        let pr = &mut self.procs[p];
        if pr.paused_until.is_none() {
            return;
        }
        pr.paused_until = None;
        let deferred = std::mem::take(&mut pr.deferred);
        self.note(Line::Note(format!("p{p} resumes")));
        for ev in deferred {
            self.push(self.now, ev);
        }
        self.wake_in(p, 0);
    }

    fn heal(&mut self) {
        self.healing = true;
        self.note(Line::Note(
            "heal: faults stop; holders finish; workers drain".into(),
        ));
        for p in 0..self.procs.len() {
            if self.procs[p].paused_until.is_some() {
                self.resume(p);
            }
            if !self.procs[p].alive && p < self.plan.procs.len() {
                self.restart(p);
            }
            if self.procs[p].inflight.is_none() {
                self.wake_in(p, 0);
            }
        }
    }

    /// Liveness after the heal phase: every key acquirable (L4) and every
    /// job finished (Q3); the model and the store agree on the counts.
    fn final_checks(&mut self) {
        let long = self.plan.ttl_ms.max(self.plan.lease_ms);
        self.now = self.now.max(T0 + self.plan.duration_ms) + long + 1;
        self.clock.set(self.now);
        self.oracle.model.tick(self.now);
        let healer = Holder::new(HolderId(0xFEED));
        for (key, &limit) in self.plan.keys.iter().enumerate() {
            let name = key_name(key);
            let r = self
                .store
                .txn(|tx| core::lease::acquire(tx, &name, &healer, 1, limit));
            if let Err(e) = r {
                let v = Violation {
                    guarantee: "L4",
                    detail: format!("{name} not acquirable after the heal phase: {e}"),
                    at_ms: self.now,
                };
                return self.fail(v);
            }
        }
        let has_jobs = self
            .plan
            .procs
            .iter()
            .any(|p| matches!(p.role, Role::Producer { .. } | Role::Worker { .. }));
        if !has_jobs {
            return;
        }
        let policy = self.policy;
        let counts = match self.store.txn(|tx| core::job::stats(tx, QUEUE, &policy)) {
            Ok(c) => c,
            Err(e) => {
                let v = Violation {
                    guarantee: "S1",
                    detail: format!("stats failed: {e}"),
                    at_ms: self.now,
                };
                return self.fail(v);
            }
        };
        if counts.0 != self.oracle.model.counts(QUEUE) {
            let v = Violation {
                guarantee: "Q3",
                detail: format!(
                    "store counts {:?} differ from the model's {:?}",
                    counts.0,
                    self.oracle.model.counts(QUEUE)
                ),
                at_ms: self.now,
            };
            return self.fail(v);
        }
        let unfinished = counts.get(JobState::Ready)
            + counts.get(JobState::Scheduled)
            + counts.get(JobState::Running);
        if unfinished > 0 {
            let v = Violation {
                guarantee: "Q3",
                detail: format!("{unfinished} jobs not done, dead or cancelled after the heal phase ({counts:?})"),
                at_ms: self.now,
            };
            self.fail(v);
        }
    }
}
