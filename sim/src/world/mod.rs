//! The simulated world: one thread, one seeded RNG per concern, a true
//! clock in milliseconds and an ordered event queue. Processes talk to a
//! real `Store` through the real core functions over a simulated network
//! (latency, lost replies, transient errors); each has its own drifting,
//! skewed, stepping clock.
//!
//! The processes run the real client code: a holder is a
//! [`HolderMachine`](leasehold::client::machine::HolderMachine) (acquire,
//! renewal schedule, local deadline, loss, release), a worker is the real
//! worker session (`client::sim::Session`: the
//! [`WorkerMachine`](leasehold::client::machine::WorkerMachine) with the
//! records and handles of its claims, and `Exec`, the store side of every
//! request, run when the request reaches the store). The world only plays
//! the network, the application around them (the protected writes, the
//! handlers' work) and the faults; a bug in the client's timing rules or
//! its session bookkeeping is a bug the oracle sees, and every machine's
//! invariants are checked after every event.
//!
//! Fork safety is modelled the way `ForkGuard` behaves: every handle
//! remembers the incarnation that created it, and a forked child's use of
//! it fails with `Forked` before reaching the store. (`tests/fork.rs` in the
//! main crate checks the real `ForkGuard` with a real `fork`.)
//!
//! Nothing here reads the wall clock, spawns a thread or iterates a hash
//! map, so one seed gives one trace, byte for byte.
//!
//! Layout: this file (the world, its processes and the event loop),
//! `msg.rs` (requests, replies, trace lines), `apply.rs` (the store side
//! and the oracle), `holder.rs`, `campaigner.rs`, `worker.rs` and
//! `producer.rs` (the processes' drivers), `faults.rs` (faults, heal, the
//! final checks), `schedules.rs`, `stores.rs`.

mod apply;
mod campaigner;
mod faults;
mod holder;
mod msg;
mod producer;
mod schedules;
mod stores;
mod worker;

pub use msg::{Answer, Ev, Line, Rep, Req};
pub use stores::{file_store, mem_store, sqlite_store, StoreFactory};

use crate::model::Model;
use crate::oracle::{Oracle, Owner, Violation};
use crate::plan::{Plan, Role};
use campaigner::CampaignerState;
use holder::HolderState;
use leasehold::core::DriftBound;
use leasehold::{HolderId, LocalMs, ManualClock, QueuePolicy, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use worker::{ProcClocks, WorkerState};

const QUEUE: &str = "jobs";
const T0: u64 = 1_000_000;

fn key_name(key: usize) -> String {
    format!("key-{key}")
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
enum RoleState {
    Holder(Box<HolderState>),
    Producer { left: u32, next_local: LocalMs },
    Worker(Box<WorkerState>),
    Campaigner(Box<CampaignerState>),
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
    /// Requests awaiting replies: id → (request, local send time).
    inflight: BTreeMap<u64, (Req, LocalMs)>,
    timer: u64,
    forked_child: bool,
    /// A burst fault: the next requests arrive at this true instant.
    burst_at: Option<u64>,
    /// A stall fault: until this true instant the store fails the
    /// process's renewals and settles transiently.
    stalled_until: u64,
    /// A latency spike: until this true instant its requests and replies
    /// each take this much longer.
    slow: (u64, u64),
    /// Its clocks as the client reads them ([`Sim::set_clocks`]).
    clocks: ProcClocks,
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
    next_rid: u64,
    /// Each schedule's first tick (Schedules runs).
    first_ticks: Vec<(String, u64)>,
    /// True wall time when the heal phase began.
    heal_wall: u64,
    /// E1: a new leader must be granted the key by this true instant.
    e1_by: Option<u64>,
    e1_done: bool,
    /// E1: the next process seen leading in the heal phase is killed.
    e1_armed: bool,
}

/// Run `plan` on the mem store.
pub fn run(plan: &Plan) -> RunResult {
    run_with(plan, &mem_store)
}

/// Run `plan` on the store `make` builds.
pub fn run_with(plan: &Plan, make: &StoreFactory) -> RunResult {
    let mut sim = Sim::new(plan, make);
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

impl<'a> Sim<'a> {
    fn new(plan: &'a Plan, make: &StoreFactory) -> Self {
        let clock = ManualClock::new(T0);
        let store = make(&clock);
        let policy = QueuePolicy {
            backoff_base_ms: 10,
            backoff_max_ms: 200,
            // Never 0: a client takes 0 as "draw one from the holder id".
            jitter_seed: leasehold::core::mix64(plan.seed) | 1,
            quarantine_expiries: 4,
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
            drift: DriftBound {
                ppm: plan.drift_bound_ppm,
                margin_ms: 1,
            },
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
            next_rid: 0,
            first_ticks: Vec::new(),
            heal_wall: u64::MAX,
            e1_by: None,
            e1_done: false,
            e1_armed: false,
        };
        if plan.scenario == crate::plan::Scenario::Schedules {
            sim.start_schedules();
        }
        for (i, spec) in plan.procs.iter().enumerate() {
            let seed = plan.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut rng = StdRng::seed_from_u64(seed);
            let holder = HolderId(rng.random());
            let clock = LocalClock {
                offset_ms: spec.offset_ms,
                drift_ppm: spec.drift_ppm,
                step_ms: 0,
            };
            sim.procs.push(Proc {
                gen: 0,
                alive: true,
                exited: false,
                paused_until: None,
                pause_id: 0,
                deferred: Vec::new(),
                holder,
                clock,
                rng,
                inflight: BTreeMap::new(),
                timer: 0,
                forked_child: false,
                burst_at: None,
                stalled_until: 0,
                slow: (0, 0),
                clocks: ProcClocks::new(),
                state: RoleState::Prober,
            });
            sim.procs[i].state = sim.fresh_state(i, spec.role);
            sim.wake_in(i, 0);
        }
        sim
    }

    fn fresh_state(&mut self, p: usize, role: Role) -> RoleState {
        match role {
            Role::Holder { key } => RoleState::Holder(Box::new(HolderState::new(key))),
            Role::Producer { jobs } => RoleState::Producer {
                left: jobs,
                next_local: LocalMs::ZERO,
            },
            Role::Worker { batch } => RoleState::Worker(Box::new(self.new_worker(p, batch))),
            Role::Campaigner { key } => {
                RoleState::Campaigner(Box::new(self.new_campaigner(p, key)))
            }
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

    /// Process `p`'s local (monotonic) clock now.
    fn local(&self, p: usize) -> LocalMs {
        LocalMs(self.procs[p].clock.read(self.now))
    }

    /// Set the clocks process `p`'s client reads to its simulated readings.
    fn set_clocks(&self, p: usize) {
        let clocks = &self.procs[p].clocks;
        clocks.local.set(self.local(p).ms());
        clocks.wall.set(self.wall(p));
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

    fn wake_at_local(&mut self, p: usize, local_target: LocalMs) {
        let wait = local_target.saturating_sub(self.local(p)).max(1);
        self.wake_in(p, wait);
    }

    /// One way's latency for process `p` (a spike added while it lasts).
    fn latency(&mut self, p: usize) -> u64 {
        let (lo, hi) = self.plan.latency_ms;
        let (until, extra) = self.procs[p].slow;
        let spike = if until > self.now { extra } else { 0 };
        self.net.random_range(lo..=hi) + spike
    }

    /// Send `req` for process `p`; its reply comes back as an
    /// [`Ev::Reply`] with the returned request id.
    fn send(&mut self, p: usize, req: Req) -> u64 {
        let at = match self.procs[p].burst_at {
            Some(at) if at >= self.now => at,
            _ => self.now + self.latency(p),
        };
        let why = if self.procs[p].burst_at.take().is_some() {
            " (burst)"
        } else {
            ""
        };
        let local = self.local(p);
        let (gen, holder) = (self.procs[p].gen, self.procs[p].holder);
        self.note(Line::Send(p, gen, format!("{req}{why}")));
        self.next_rid += 1;
        let rid = self.next_rid;
        self.procs[p].inflight.insert(rid, (req.clone(), local));
        let fork_ok = self.plan.canary == Some(crate::plan::Canary::ForkReusesHandle);
        if self.procs[p].forked_child && !fork_ok {
            // The handle's fork guard refuses before anything is sent.
            let rep = Rep::Forked;
            self.push(self.now, Ev::Reply { p, gen, rid, rep });
            return rid;
        }
        let ev = Ev::Arrive {
            p,
            gen,
            holder,
            req,
            rid,
        };
        self.push(at, ev);
        rid
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
            self.heal_deadline = self.heal_deadline.max(self.now + self.job_bound());
        }
    }

    /// The worst case for one job to finish from now: `heal_bound`, and
    /// under a rate (F4) the wait for every start the unfinished jobs may
    /// still make ahead of it (each attempt of each, at the slowest pace a
    /// rate in force allows).
    pub(super) fn job_bound(&self) -> u64 {
        let limits = self.oracle.model.limits_of(QUEUE);
        let pace = [limits.rate, limits.per_key_rate]
            .into_iter()
            .flatten()
            .map(|r| r.window_ms.div_ceil(u64::from(r.count)))
            .max()
            .unwrap_or(0);
        let counts = self.oracle.model.counts(QUEUE);
        let unfinished = counts[0] + counts[1] + counts[2];
        let starts = unfinished * u64::from(self.plan.max_attempts + 1);
        self.heal_bound + pace * starts
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
                rid,
            } => self.arrive(p, gen, holder, req, rid),
            Ev::Reply { p, gen, rid, rep } => {
                let proc = &self.procs[p];
                if !proc.alive || proc.gen != gen {
                    return;
                }
                let ev = Ev::Reply { p, gen, rid, rep };
                if self.defer_if_paused(p, ev.clone()) {
                    return;
                }
                if let Ev::Reply { rep, .. } = ev {
                    self.reply(p, rid, rep);
                }
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

    /// A reply reached process `p`: hand it to the role's driver.
    fn reply(&mut self, p: usize, rid: u64, rep: Rep) {
        let Some((req, sent_local)) = self.procs[p].inflight.remove(&rid) else {
            return;
        };
        let gen = self.procs[p].gen;
        self.note(Line::Reply(p, gen, format!("{} for {req}", short(&rep))));
        match &self.procs[p].state {
            RoleState::Holder(_) => self.holder_reply(p, req, sent_local, rep),
            RoleState::Producer { .. } => self.producer_reply(p, rep),
            RoleState::Worker(_) => self.worker_reply(p, req, rep),
            RoleState::Campaigner(_) => self.campaigner_reply(p, req, rep),
            RoleState::Prober => {}
        }
        self.poll(p);
    }

    /// Let process `p` act on what is due at its local time.
    fn poll(&mut self, p: usize) {
        if !self.procs[p].alive || self.procs[p].exited || self.violation.is_some() {
            return;
        }
        match &self.procs[p].state {
            RoleState::Holder(_) => self.poll_holder(p),
            RoleState::Producer { .. } => self.poll_producer(p),
            RoleState::Worker(_) => self.poll_worker(p),
            RoleState::Campaigner(_) => self.poll_campaigner(p),
            RoleState::Prober => {}
        }
    }

    fn exit(&mut self, p: usize) {
        if !self.procs[p].exited {
            self.procs[p].exited = true;
            let gen = self.procs[p].gen;
            self.note(Line::Note(format!("p{p}.{gen} exits")));
        }
    }
}

/// A reply, briefly, for the trace: answers as the model's normalized
/// outcomes (the same whatever the store).
fn short(rep: &Rep) -> String {
    match rep {
        Rep::Done(answer) => format!("Done({:?})", apply::outcome_of(answer)),
        other => format!("{other:?}"),
    }
}
