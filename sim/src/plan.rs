//! What a run does, as plain data: the scenario, the processes and their
//! clocks, the swarm of fault classes switched on for this seed, and the
//! fault schedule. One `u64` seed generates the plan; a failing plan can be
//! shrunk by deleting faults and shortening the run, then replayed exactly.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fmt;

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
}

impl Canary {
    /// Every canary.
    pub const ALL: [Canary; 13] = [
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
            | Canary::RenewsPastDeadline => Scenario::Queue,
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

/// A fault, injected at a true time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The process vanishes (in-flight requests still land; replies are
    /// lost) and restarts with a new identity after a while.
    Kill {
        /// Which process.
        proc: usize,
        /// When it comes back.
        restart_after_ms: u64,
    },
    /// SIGSTOP / a long GC pause, then resume.
    Pause {
        /// Which process.
        proc: usize,
        /// For how long.
        for_ms: u64,
    },
    /// The process duplicates itself with all its handles.
    Fork {
        /// Which process.
        proc: usize,
    },
    /// Every worker and holder issues its next request at this instant.
    Burst,
    /// The process's clock jumps.
    ClockStep {
        /// Which process.
        proc: usize,
        /// By how much.
        delta_ms: i64,
    },
    /// The prober fires at the next expiry, one ms before and one after.
    Boundary,
    /// The store fails the process's renewals and settles transiently (as
    /// when the rows they write are locked by another connection) while its
    /// claims go on: a settle that stays unapplied past its claim's lease.
    Stall {
        /// Which process.
        proc: usize,
        /// For how long.
        for_ms: u64,
    },
    /// A latency spike: every request of the process, and every reply to
    /// it, takes `extra_ms` longer for a while (a congested link, a
    /// store's fsync stall); replies may come after the local deadline of
    /// what they grant.
    Slow {
        /// Which process.
        proc: usize,
        /// For how long.
        for_ms: u64,
        /// How much longer each way.
        extra_ms: u64,
    },
    /// The process dies in the middle of writing a renewal of a lease it
    /// holds, after `at_byte` bytes of the record's slot (the file store;
    /// elsewhere nothing happens): the record before the write must stay
    /// in force.
    TornWrite {
        /// Which process.
        proc: usize,
        /// Bytes of the slot written before it died.
        at_byte: usize,
    },
    /// An operator pauses the queue (`queue pause`): no claim may start a
    /// job until it is resumed (F2; the heal phase resumes it).
    PauseQueue,
    /// An operator resumes the queue.
    ResumeQueue,
    /// An operator replaces the queue's concurrency limits (`queue limit
    /// set`; none: cleared): no claim may exceed them (F1).
    SetLimits {
        /// Running jobs of the queue at most.
        concurrency: Option<u32>,
        /// Running jobs of one concurrency key at most.
        per_key: Option<u32>,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Fault::Kill {
                proc,
                restart_after_ms,
            } => write!(f, "kill p{proc} (restart after {restart_after_ms} ms)"),
            Fault::Pause { proc, for_ms } => write!(f, "pause p{proc} for {for_ms} ms"),
            Fault::Fork { proc } => write!(f, "fork p{proc}"),
            Fault::Burst => f.write_str("burst"),
            Fault::ClockStep { proc, delta_ms } => write!(f, "clock step p{proc} {delta_ms:+} ms"),
            Fault::Boundary => f.write_str("boundary probe"),
            Fault::Stall { proc, for_ms } => {
                write!(f, "stall p{proc}'s renewals and settles for {for_ms} ms")
            }
            Fault::Slow {
                proc,
                for_ms,
                extra_ms,
            } => write!(f, "slow p{proc}'s network by {extra_ms} ms for {for_ms} ms"),
            Fault::TornWrite { proc, at_byte } => {
                write!(f, "p{proc} dies writing a renewal, after {at_byte} bytes")
            }
            Fault::PauseQueue => f.write_str("pause the queue"),
            Fault::ResumeQueue => f.write_str("resume the queue"),
            Fault::SetLimits {
                concurrency,
                per_key,
            } => write!(
                f,
                "limit the queue to {} running, {} per key",
                concurrency.map_or("any".to_owned(), |n| n.to_string()),
                per_key.map_or("any".to_owned(), |n| n.to_string())
            ),
        }
    }
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
}

fn chance(rng: &mut StdRng, p: f64) -> bool {
    rng.random_bool(p)
}

/// The fault classes switched on for one seed (swarm testing: each class
/// is on or off as a whole, so some seeds see few kinds of trouble, hard).
struct Swarm {
    kills: bool,
    pauses: bool,
    forks: bool,
    bursts: bool,
    boundaries: bool,
    steps: bool,
    chaos: bool,
}

impl Swarm {
    fn draw(rng: &mut StdRng, chaos: bool) -> Swarm {
        let mut on = || chance(rng, 0.6);
        Swarm {
            kills: on(),
            pauses: on(),
            forks: on(),
            bursts: on(),
            boundaries: on(),
            steps: chaos || on(),
            chaos,
        }
    }

    /// One fault at a random time for a random actor, or none when the
    /// class drawn is off.
    fn fault(&self, rng: &mut StdRng, proc: usize, long: u64) -> Option<Fault> {
        Some(match rng.random_range(0..6) {
            0 if self.kills => Fault::Kill {
                proc,
                restart_after_ms: rng.random_range(0..=2 * long),
            },
            1 if self.pauses => Fault::Pause {
                proc,
                for_ms: rng.random_range(long / 2..=3 * long),
            },
            2 if self.forks => Fault::Fork { proc },
            3 if self.bursts => Fault::Burst,
            4 if self.steps => {
                let limit = 2 * long as i64;
                // Forward steps only are conservative; backward ones
                // break the bound and appear in clock-chaos alone.
                let delta_ms = if self.chaos {
                    rng.random_range(-limit..=limit)
                } else {
                    rng.random_range(1..=limit)
                };
                Fault::ClockStep { proc, delta_ms }
            }
            5 if self.boundaries => Fault::Boundary,
            _ => return None,
        })
    }
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

    /// With probability `p`, up to `most` stalls of workers' renewals and
    /// settles, each longer than a claim's lease (queue and mixed runs).
    fn add_stalls(&self, rng: &mut StdRng, faults: &mut Vec<(u64, Fault)>, p: f64, most: u32) {
        if !matches!(self.scenario, Scenario::Queue | Scenario::Mixed) || !chance(rng, p) {
            return;
        }
        let workers: Vec<usize> = (0..self.procs.len())
            .filter(|&i| matches!(self.procs[i].role, Role::Worker { .. }))
            .collect();
        for _ in 0..rng.random_range(1..=most) {
            let proc = workers[rng.random_range(0..workers.len())];
            let at = rng.random_range(0..self.duration_ms);
            let for_ms = rng.random_range(self.lease_ms + 50..=3 * self.lease_ms + 100);
            faults.push((at, Fault::Stall { proc, for_ms }));
        }
    }

    /// With probability `p`, up to `most` times an operator pauses the
    /// queue and resumes it a little later (queue and mixed runs).
    fn add_queue_pauses(
        &self,
        rng: &mut StdRng,
        faults: &mut Vec<(u64, Fault)>,
        p: f64,
        most: u32,
    ) {
        if !matches!(self.scenario, Scenario::Queue | Scenario::Mixed) || !chance(rng, p) {
            return;
        }
        for _ in 0..rng.random_range(1..=most) {
            let at = rng.random_range(0..self.duration_ms);
            let for_ms = rng.random_range(1..=2 * self.lease_ms);
            faults.push((at, Fault::PauseQueue));
            faults.push((at + for_ms, Fault::ResumeQueue));
        }
    }

    /// With probability `p` (queue and mixed runs), the jobs carry
    /// concurrency keys and an operator limits the queue from the start,
    /// then changes its limits up to `most` times (lowered under what
    /// runs, raised, cleared). The limits stay through the heal phase: a
    /// job set aside for its key must still run (Q3).
    fn add_limits(&mut self, rng: &mut StdRng, faults: &mut Vec<(u64, Fault)>, p: f64, most: u32) {
        if !matches!(self.scenario, Scenario::Queue | Scenario::Mixed) || !chance(rng, p) {
            return;
        }
        self.keyed = true;
        let draw = |rng: &mut StdRng| Fault::SetLimits {
            concurrency: chance(rng, 0.5).then(|| rng.random_range(1..=4)),
            per_key: chance(rng, 0.7).then(|| rng.random_range(1..=2)),
        };
        faults.push((0, draw(rng)));
        for _ in 0..rng.random_range(0..=most) {
            let at = rng.random_range(0..self.duration_ms);
            faults.push((at, draw(rng)));
        }
    }

    /// With probability `p` (queue and mixed runs), jobs carry run-time
    /// limits around the handlers' run time, so that some attempts time
    /// out (F3).
    fn add_timeouts(&mut self, rng: &mut StdRng, p: f64) {
        if !matches!(self.scenario, Scenario::Queue | Scenario::Mixed) || !chance(rng, p) {
            return;
        }
        let low = (self.work_max_ms / 2).max(1);
        self.timeouts = Some((low, 2 * self.work_max_ms + 1));
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

    /// With probability `p`, up to `most` latency spikes of random actors,
    /// each way from a quarter of the longest lease to twice it.
    fn add_spikes(
        &self,
        rng: &mut StdRng,
        faults: &mut Vec<(u64, Fault)>,
        actors: &[usize],
        p: f64,
        most: u32,
    ) {
        if !chance(rng, p) {
            return;
        }
        let long = self.ttl_ms.max(self.lease_ms);
        for _ in 0..rng.random_range(1..=most) {
            let proc = actors[rng.random_range(0..actors.len())];
            let at = rng.random_range(0..self.duration_ms);
            let fault = Fault::Slow {
                proc,
                for_ms: rng.random_range(long / 2..=3 * long),
                extra_ms: rng.random_range(long / 4..=2 * long),
            };
            faults.push((at, fault));
        }
    }

    /// With probability `p`, up to `most` holders die in the middle of
    /// writing a renewal, torn at a random byte of the slot.
    fn add_tears(&self, rng: &mut StdRng, faults: &mut Vec<(u64, Fault)>, p: f64, most: u32) {
        let holders: Vec<usize> = (0..self.procs.len())
            .filter(|&i| matches!(self.procs[i].role, Role::Holder { .. }))
            .collect();
        if holders.is_empty() || !chance(rng, p) {
            return;
        }
        for _ in 0..rng.random_range(1..=most) {
            let proc = holders[rng.random_range(0..holders.len())];
            let at = rng.random_range(0..self.duration_ms);
            let at_byte = rng.random_range(0..=160);
            faults.push((at, Fault::TornWrite { proc, at_byte }));
        }
    }

    /// Make sure the broken behaviour has a chance to show.
    fn apply_canary(
        &mut self,
        canary: Canary,
        rng: &mut StdRng,
        faults: &mut Vec<(u64, Fault)>,
        actors: &[usize],
    ) {
        let long = self.ttl_ms.max(self.lease_ms);
        let pause_some = |rng: &mut StdRng, faults: &mut Vec<(u64, Fault)>, n: usize| {
            for _ in 0..n {
                let proc = actors[rng.random_range(0..actors.len())];
                let at = rng.random_range(0..self.duration_ms);
                faults.push((
                    at,
                    Fault::Pause {
                        proc,
                        for_ms: rng.random_range(long..=3 * long),
                    },
                ));
            }
        };
        match canary {
            Canary::IgnoresFencing | Canary::ClaimIgnoresLease => pause_some(rng, faults, 4),
            Canary::WorkerStopsClaiming | Canary::CompleterDropsOutcome => {}
            Canary::LeaderIgnoresDeadline => {
                // Pauses a little longer than the TTL: the leader wakes
                // believing it still leads while another one does.
                for _ in 0..6 {
                    let proc = actors[rng.random_range(0..actors.len())];
                    let at = rng.random_range(0..self.duration_ms);
                    let for_ms = self.ttl_ms + rng.random_range(1..=self.ttl_ms);
                    faults.push((at, Fault::Pause { proc, for_ms }));
                }
            }
            Canary::SchedulerForgetsTicks => {}
            Canary::SettleKeyedByJob => self.add_stalls(rng, faults, 1.0, 8),
            Canary::ClaimIgnoresPause => self.add_queue_pauses(rng, faults, 1.0, 4),
            Canary::ClaimIgnoresKeyLimit => {
                self.keyed = true;
                let limit = Fault::SetLimits {
                    concurrency: None,
                    per_key: Some(1),
                };
                faults.retain(|(_, f)| !matches!(f, Fault::SetLimits { .. }));
                faults.push((0, limit));
            }
            Canary::RenewsPastDeadline => {
                // Limits shorter than a lease: every renewal would pass them.
                self.timeouts = Some((1, self.lease_ms / 2 + 1));
            }
            Canary::DeadlineFromReply => {
                // Slow replies: the deadline counted from them runs late.
                self.latency_ms = (10, 25);
            }
            Canary::TrustsPastDeadline => {
                self.fencing = false;
                self.strict_l3 = true;
                for p in &mut self.procs {
                    if p.role != Role::Prober {
                        p.drift_ppm = -(rng.random_range(200_000..=400_000));
                    }
                }
                // Pauses a little longer than the TTL: the slow clock says
                // the lease is still good when the holder wakes.
                for _ in 0..6 {
                    let proc = actors[rng.random_range(0..actors.len())];
                    let at = rng.random_range(0..self.duration_ms);
                    let for_ms = self.ttl_ms + rng.random_range(1..=self.ttl_ms / 2);
                    faults.push((at, Fault::Pause { proc, for_ms }));
                }
            }
            Canary::ForkReusesHandle => {
                for _ in 0..4 {
                    let proc = actors[rng.random_range(0..actors.len())];
                    faults.push((rng.random_range(0..self.duration_ms), Fault::Fork { proc }));
                }
            }
        }
    }
}
