//! What a run does, as plain data: the scenario, the processes and their
//! clocks, the swarm of fault classes switched on for this seed, and the
//! fault schedule. One `u64` seed generates the plan; a failing plan can be
//! shrunk by deleting faults and shortening the run, then replayed exactly.

mod faults;

pub use faults::Fault;
use faults::Swarm;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A family of worlds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// Lease holders writing to a fenced resource, plus a boundary prober.
    Leases,
    /// Producers and workers on one queue.
    Queue,
    /// Both at once on one store.
    Mixed,
    /// Leases with clocks beyond the drift bound and backward steps: the
    /// strict L3 check is off and fencing must reject every stale write.
    ClockChaos,
    /// Campaigners for one key (the real election machine): the leader
    /// writes to the fenced resource while it leads (L3); after the faults
    /// the leader is killed and must be replaced within its TTL plus the
    /// campaign's retry (E1).
    Election,
    /// Workers that fire the queue's schedules (every second), skewed and
    /// drifting wall clocks included: every tick becomes exactly one job
    /// (P1), and ticks due before the heal phase are fired by the workers
    /// themselves (P2).
    Schedules,
}

impl Scenario {
    /// Every scenario.
    pub const ALL: [Scenario; 6] = [
        Scenario::Leases,
        Scenario::Queue,
        Scenario::Mixed,
        Scenario::ClockChaos,
        Scenario::Election,
        Scenario::Schedules,
    ];

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Leases => "leases",
            Scenario::Queue => "queue",
            Scenario::Mixed => "mixed",
            Scenario::ClockChaos => "clock-chaos",
            Scenario::Election => "election",
            Scenario::Schedules => "schedules",
        }
    }

    /// Parse [`Scenario::name`].
    pub fn parse(text: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == text)
    }
}

/// A deliberately broken variant that must be caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Canary {
    /// The store ignores fencing: renew, release, heartbeat and complete
    /// succeed with any token and holder.
    IgnoresFencing,
    /// Holders' clocks drift far beyond the configured bound and the
    /// resource does not fence: a holder trusts a lease that has ended.
    TrustsPastDeadline,
    /// A forked child keeps using its parent's lease and claim handles.
    ForkReusesHandle,
    /// Claim also takes running jobs whose lease has not expired.
    ClaimIgnoresLease,
    /// Workers stay alive but stop claiming once the faults stop: the
    /// liveness check (every job finishes) must notice.
    WorkerStopsClaiming,
    /// The holder machine counts its local deadline from when the reply
    /// arrived instead of when the request was sent (a client-machine bug
    /// that breaks L3 under latency).
    DeadlineFromReply,
    /// The worker machine's completer loses every fourth outcome its
    /// handlers report (a batching bug).
    CompleterDropsOutcome,
    /// The election machine's leader ignores its local deadline: it acts
    /// until a renewal is refused (through a pause past its TTL, too).
    LeaderIgnoresDeadline,
    /// Firing schedules forgets where it was (the cursor is never
    /// stored): a tick whose job has finished is enqueued again, the unique
    /// key only guarding live jobs.
    SchedulerForgetsTicks,
    /// The worker session keys its settle bookkeeping by job alone (the
    /// bug issue 23 found): the late outcome of an old claim removes the
    /// handle and record of the job's new claim, so its renewals no longer
    /// reach its handler and its outcome is reported for the wrong claim.
    SettleKeyedByJob,
    /// Claims never see the queue paused (F2).
    ClaimIgnoresPause,
    /// Claims never count the running jobs of a concurrency key: the
    /// per-key limit is never reached (F1).
    ClaimIgnoresKeyLimit,
    /// The store forgets a claim's deadline: renewals extend it past the
    /// job's run-time limit (F3).
    RenewsPastDeadline,
    /// The store forgets every start a rate bucket records: no window
    /// ever looks full (F4).
    ClaimIgnoresRate,
    /// A unique key's lookup sees live jobs only: a finished job pushed
    /// within the period blocks nothing (U1).
    UniqueForgetsFinished,
    /// The store never finds the jobs waiting for a job that ended: they
    /// stay waiting for ever (D2).
    DependentsLeftWaiting,
    /// A push sees every job it names as done: the new job is ready at
    /// once, before its parents ended (D1).
    DependentReadyTooSoon,
}

impl Canary {
    /// Every canary.
    pub const ALL: [Canary; 17] = [
        Canary::IgnoresFencing,
        Canary::TrustsPastDeadline,
        Canary::ForkReusesHandle,
        Canary::ClaimIgnoresLease,
        Canary::WorkerStopsClaiming,
        Canary::DeadlineFromReply,
        Canary::CompleterDropsOutcome,
        Canary::LeaderIgnoresDeadline,
        Canary::SchedulerForgetsTicks,
        Canary::SettleKeyedByJob,
        Canary::ClaimIgnoresPause,
        Canary::ClaimIgnoresKeyLimit,
        Canary::RenewsPastDeadline,
        Canary::ClaimIgnoresRate,
        Canary::UniqueForgetsFinished,
        Canary::DependentsLeftWaiting,
        Canary::DependentReadyTooSoon,
    ];

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Canary::IgnoresFencing => "ignores-fencing",
            Canary::TrustsPastDeadline => "trusts-past-deadline",
            Canary::ForkReusesHandle => "fork-reuses-handle",
            Canary::ClaimIgnoresLease => "claim-ignores-lease",
            Canary::WorkerStopsClaiming => "worker-stops-claiming",
            Canary::DeadlineFromReply => "deadline-from-reply",
            Canary::CompleterDropsOutcome => "completer-drops-outcome",
            Canary::LeaderIgnoresDeadline => "leader-ignores-deadline",
            Canary::SchedulerForgetsTicks => "scheduler-forgets-ticks",
            Canary::SettleKeyedByJob => "settle-keyed-by-job",
            Canary::ClaimIgnoresPause => "claim-ignores-pause",
            Canary::ClaimIgnoresKeyLimit => "claim-ignores-key-limit",
            Canary::RenewsPastDeadline => "renews-past-deadline",
            Canary::ClaimIgnoresRate => "claim-ignores-rate",
            Canary::UniqueForgetsFinished => "unique-forgets-finished",
            Canary::DependentsLeftWaiting => "dependents-left-waiting",
            Canary::DependentReadyTooSoon => "dependent-ready-too-soon",
        }
    }

    /// Parse [`Canary::name`].
    pub fn parse(text: &str) -> Option<Canary> {
        Canary::ALL.into_iter().find(|c| c.name() == text)
    }

    /// The scenario the canary runs in.
    pub fn scenario(self) -> Scenario {
        match self {
            Canary::IgnoresFencing | Canary::ForkReusesHandle => Scenario::Mixed,
            Canary::TrustsPastDeadline | Canary::DeadlineFromReply => Scenario::Leases,
            Canary::ClaimIgnoresLease
            | Canary::WorkerStopsClaiming
            | Canary::CompleterDropsOutcome
            | Canary::SettleKeyedByJob
            | Canary::ClaimIgnoresPause
            | Canary::ClaimIgnoresKeyLimit
            | Canary::RenewsPastDeadline
            | Canary::ClaimIgnoresRate
            | Canary::UniqueForgetsFinished
            | Canary::DependentsLeftWaiting
            | Canary::DependentReadyTooSoon => Scenario::Queue,
            Canary::LeaderIgnoresDeadline => Scenario::Election,
            Canary::SchedulerForgetsTicks => Scenario::Schedules,
        }
    }
}

/// What a simulated process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Acquires `key`, writes to the protected resource, renews, releases.
    Holder {
        /// Index into [`Plan::keys`].
        key: usize,
    },
    /// Pushes jobs.
    Producer {
        /// How many.
        jobs: u32,
    },
    /// Claims (in batches), heartbeats, completes or fails jobs.
    Worker {
        /// Claim batch size.
        batch: usize,
    },
    /// Fires operations exactly at expiry boundaries (on `Boundary` faults).
    Prober,
    /// Campaigns for `key` with the election machine; writes to the
    /// protected resource while it leads.
    Campaigner {
        /// Index into [`Plan::keys`].
        key: usize,
    },
}

/// One process at the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcSpec {
    /// What it does.
    pub role: Role,
    /// Its clock's rate error against true time, in ppm (negative: slow).
    pub drift_ppm: i64,
    /// Its clock's offset from true time (skew).
    pub offset_ms: u64,
}

/// Everything a run needs; nothing else influences it.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The seed of every random choice in the run.
    pub seed: u64,
    /// The scenario.
    pub scenario: Scenario,
    /// The canary, if this run is one.
    pub canary: Option<Canary>,
    /// Faults stop at this true time; the heal phase follows.
    pub duration_ms: u64,
    /// Lease TTL.
    pub ttl_ms: u64,
    /// Job claim lease.
    pub lease_ms: u64,
    /// The drift bound holders assume (their `DriftBound::ppm`).
    pub drift_bound_ppm: u32,
    /// One-way network latency range.
    pub latency_ms: (u64, u64),
    /// Chance of a transient store error per request, ppm.
    pub transient_ppm: u32,
    /// Chance the store commits but the reply is lost, ppm.
    pub ambiguous_ppm: u32,
    /// Chance a job handler fails, ppm.
    pub fail_ppm: u32,
    /// Holder limit of each key.
    pub keys: Vec<u32>,
    /// Attempts per job.
    pub max_attempts: u32,
    /// Longest job handler run.
    pub work_max_ms: u64,
    /// The processes.
    pub procs: Vec<ProcSpec>,
    /// The fault schedule, by time.
    pub faults: Vec<(u64, Fault)>,
    /// Whether the protected resource rejects stale tokens.
    pub fencing: bool,
    /// Whether L3 is checked strictly (clocks within the bound).
    pub strict_l3: bool,
    /// Whether jobs carry concurrency keys (runs with limits).
    pub keyed: bool,
    /// Jobs carry run-time limits in this range (ms), when set.
    pub timeouts: Option<(u64, u64)>,
    /// The share of pushes that carry a unique key (U1).
    pub unique_share: f64,
    /// The share of pushes that name jobs to run after (D1, D2).
    pub after_share: f64,
}

fn chance(rng: &mut StdRng, p: f64) -> bool {
    rng.random_bool(p)
}

/// A chance in ppm, drawn only when its class is on.
fn rate_ppm(rng: &mut StdRng, max: u32) -> u32 {
    if chance(rng, 0.6) {
        rng.random_range(1_000..=max)
    } else {
        0
    }
}

/// The processes of `scenario` and the holder limit of each key, with
/// clock drifts inside the bound (beyond it in clock-chaos).
fn processes(
    rng: &mut StdRng,
    scenario: Scenario,
    drift_bound_ppm: u32,
) -> (Vec<ProcSpec>, Vec<u32>) {
    let chaos = scenario == Scenario::ClockChaos;
    let bound = i64::from(drift_bound_ppm);
    let spec = |rng: &mut StdRng, role: Role| ProcSpec {
        role,
        drift_ppm: if chaos {
            rng.random_range(-5 * bound..=5 * bound)
        } else {
            // Inside the bound, leaving 10 % for ms rounding.
            rng.random_range(-bound * 9 / 10..=bound * 9 / 10)
        },
        offset_ms: rng.random_range(0..1_000_000),
    };
    let mut procs = Vec::new();
    let mut keys = Vec::new();
    if matches!(
        scenario,
        Scenario::Leases | Scenario::Mixed | Scenario::ClockChaos
    ) {
        let nkeys = rng.random_range(1..=3);
        for _ in 0..nkeys {
            keys.push(if chance(rng, 0.3) { 2 } else { 1 });
        }
        for i in 0..rng.random_range(2..=6) {
            procs.push(spec(rng, Role::Holder { key: i % nkeys }));
        }
    }
    if matches!(scenario, Scenario::Queue | Scenario::Mixed) {
        for _ in 0..rng.random_range(1..=2) {
            let jobs = rng.random_range(10..=60);
            procs.push(spec(rng, Role::Producer { jobs }));
        }
        for _ in 0..rng.random_range(2..=6) {
            let batch = rng.random_range(1..=3);
            procs.push(spec(rng, Role::Worker { batch }));
        }
    }
    if scenario == Scenario::Election {
        keys.push(1);
        for _ in 0..rng.random_range(3..=6) {
            procs.push(spec(rng, Role::Campaigner { key: 0 }));
        }
    }
    if scenario == Scenario::Schedules {
        for _ in 0..rng.random_range(0..=1) {
            let jobs = rng.random_range(5..=20);
            procs.push(spec(rng, Role::Producer { jobs }));
        }
        for _ in 0..rng.random_range(2..=5) {
            let batch = rng.random_range(1..=3);
            procs.push(spec(rng, Role::Worker { batch }));
        }
    }
    procs.push(ProcSpec {
        role: Role::Prober,
        drift_ppm: 0,
        offset_ms: 0,
    });
    (procs, keys)
}

impl Plan {
    /// The plan for `seed` in `scenario`, optionally as a canary. The
    /// order of the draws is part of what a seed means: keep it.
    pub fn generate(seed: u64, scenario: Scenario, canary: Option<Canary>) -> Plan {
        let salt = scenario as u64 * 0x9E37_79B9 + canary.map_or(0, |c| c as u64 + 1) * 0x1234_5678;
        let mut rng = StdRng::seed_from_u64(seed ^ salt.rotate_left(17));
        let ttl_ms = rng.random_range(40..=200);
        let lease_ms = rng.random_range(40..=200);
        let drift_bound_ppm = rng.random_range(1_000..=50_000);
        let chaos = scenario == Scenario::ClockChaos;
        let swarm = Swarm::draw(&mut rng, chaos);
        let transient_ppm = rate_ppm(&mut rng, 100_000);
        let ambiguous_ppm = rate_ppm(&mut rng, 50_000);
        let lat_min = rng.random_range(0..=3);
        let latency_ms = (lat_min, lat_min + rng.random_range(0..=10));
        let (procs, keys) = processes(&mut rng, scenario, drift_bound_ppm);
        let mut duration_ms = rng.random_range(1_000..=4_000);
        if scenario == Scenario::Schedules {
            // Ticks come every second: a longer run sees more of them.
            duration_ms = rng.random_range(3_000..=8_000);
        }
        let mut plan = Plan {
            seed,
            scenario,
            canary,
            duration_ms,
            ttl_ms,
            lease_ms,
            drift_bound_ppm,
            latency_ms,
            transient_ppm,
            ambiguous_ppm,
            fail_ppm: rng.random_range(0..=200_000),
            keys,
            max_attempts: rng.random_range(1..=4),
            work_max_ms: rng.random_range(5..=lease_ms),
            procs,
            faults: Vec::new(),
            fencing: true,
            strict_l3: !chaos,
            keyed: false,
            timeouts: None,
            unique_share: 0.1,
            after_share: 0.15,
        };
        let actors: Vec<usize> = plan
            .procs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.role != Role::Prober)
            .map(|(i, _)| i)
            .collect();
        let mut faults = Vec::new();
        for _ in 0..rng.random_range(0..=12) {
            let at = rng.random_range(0..duration_ms);
            let proc = actors[rng.random_range(0..actors.len())];
            if let Some(fault) = swarm.fault(&mut rng, proc, ttl_ms.max(lease_ms)) {
                faults.push((at, fault));
            }
        }
        plan.add_stalls(&mut rng, &mut faults, 0.5, 3);
        // Drawn apart, so that the plans drawn before pauses existed stay
        // as they were, pauses added.
        let mut pauses = StdRng::seed_from_u64(seed ^ 0x9A05_E0F0_F00D);
        plan.add_queue_pauses(&mut pauses, &mut faults, 0.3, 3);
        let mut spikes = StdRng::seed_from_u64(seed ^ 0x0591_CE0F_1A7E);
        plan.add_spikes(&mut spikes, &mut faults, &actors, 0.3, 3);
        let mut tears = StdRng::seed_from_u64(seed ^ 0x07EA_20F5_A107);
        plan.add_tears(&mut tears, &mut faults, 0.3, 4);
        let mut limits = StdRng::seed_from_u64(seed ^ 0x0C0C_0C0C_11A1);
        plan.add_limits(&mut limits, &mut faults, 0.3, 3);
        let mut timeouts = StdRng::seed_from_u64(seed ^ 0x7100_0E0F_D0E5);
        plan.add_timeouts(&mut timeouts, 0.3);
        if let Some(c) = canary {
            plan.apply_canary(c, &mut rng, &mut faults, &actors);
        }
        faults.sort_by_key(|&(at, _)| at);
        plan.faults = faults;
        plan
    }

    /// The longest one-way latency of the run: the network's, plus the
    /// largest spike (a message sent during one is that late, even once
    /// the faults stop).
    pub fn max_latency_ms(&self) -> u64 {
        let spike = self
            .faults
            .iter()
            .filter_map(|(_, f)| match f {
                Fault::Slow { extra_ms, .. } => Some(*extra_ms),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        self.latency_ms.1 + spike
    }
}
