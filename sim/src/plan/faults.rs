//! The fault schedule: the faults a plan injects, the swarm of fault
//! classes switched on per seed, and how each kind of fault (and each
//! canary's trouble) is added to a plan. Each kind is drawn from a
//! generator of its own, so adding a kind leaves the plans drawn before
//! it as they were.

use super::{chance, Canary, Plan, Role, Scenario};
use rand::rngs::StdRng;
use rand::Rng;
use std::fmt;

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
        /// Jobs of the queue started per window at most (F4).
        rate: Option<leasehold::Rate>,
        /// Jobs of one concurrency key started per window at most.
        per_key_rate: Option<leasehold::Rate>,
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
                rate,
                per_key_rate,
            } => {
                let any = |n: Option<String>| n.unwrap_or_else(|| "any".to_owned());
                write!(
                    f,
                    "limit the queue to {} running, {} per key, {} started, {} per key",
                    any(concurrency.map(|n| n.to_string())),
                    any(per_key.map(|n| n.to_string())),
                    any(rate.map(|r| r.to_string())),
                    any(per_key_rate.map(|r| r.to_string())),
                )
            }
        }
    }
}

/// The fault classes switched on for one seed (swarm testing: each class
/// is on or off as a whole, so some seeds see few kinds of trouble, hard).
pub(super) struct Swarm {
    kills: bool,
    pauses: bool,
    forks: bool,
    bursts: bool,
    boundaries: bool,
    steps: bool,
    chaos: bool,
}

impl Swarm {
    pub(super) fn draw(rng: &mut StdRng, chaos: bool) -> Swarm {
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
    pub(super) fn fault(&self, rng: &mut StdRng, proc: usize, long: u64) -> Option<Fault> {
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

impl Plan {
    /// With probability `p`, up to `most` stalls of workers' renewals and
    /// settles, each longer than a claim's lease (queue and mixed runs).
    pub(super) fn add_stalls(
        &self,
        rng: &mut StdRng,
        faults: &mut Vec<(u64, Fault)>,
        p: f64,
        most: u32,
    ) {
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
    pub(super) fn add_queue_pauses(
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
    pub(super) fn add_limits(
        &mut self,
        rng: &mut StdRng,
        faults: &mut Vec<(u64, Fault)>,
        p: f64,
        most: u32,
    ) {
        if !matches!(self.scenario, Scenario::Queue | Scenario::Mixed) || !chance(rng, p) {
            return;
        }
        self.keyed = true;
        let rate = |rng: &mut StdRng, p: f64, most: u32| {
            chance(rng, p).then(|| {
                leasehold::Rate::new(rng.random_range(1..=most), rng.random_range(50..=600))
            })
        };
        let draw = |rng: &mut StdRng| Fault::SetLimits {
            concurrency: chance(rng, 0.5).then(|| rng.random_range(1..=4)),
            per_key: chance(rng, 0.7).then(|| rng.random_range(1..=2)),
            rate: rate(rng, 0.3, 6),
            per_key_rate: rate(rng, 0.3, 3),
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
    pub(super) fn add_timeouts(&mut self, rng: &mut StdRng, p: f64) {
        if !matches!(self.scenario, Scenario::Queue | Scenario::Mixed) || !chance(rng, p) {
            return;
        }
        let low = (self.work_max_ms / 2).max(1);
        self.timeouts = Some((low, 2 * self.work_max_ms + 1));
    }

    /// With probability `p`, up to `most` latency spikes of random actors,
    /// each way from a quarter of the longest lease to twice it.
    pub(super) fn add_spikes(
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
    pub(super) fn add_tears(
        &self,
        rng: &mut StdRng,
        faults: &mut Vec<(u64, Fault)>,
        p: f64,
        most: u32,
    ) {
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
    pub(super) fn apply_canary(
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
                    rate: None,
                    per_key_rate: None,
                };
                faults.retain(|(_, f)| !matches!(f, Fault::SetLimits { .. }));
                faults.push((0, limit));
            }
            Canary::ClaimIgnoresRate => {
                let limit = Fault::SetLimits {
                    concurrency: None,
                    per_key: None,
                    rate: Some(leasehold::Rate::new(2, 400)),
                    per_key_rate: None,
                };
                faults.retain(|(_, f)| !matches!(f, Fault::SetLimits { .. }));
                faults.push((0, limit));
            }
            // Most pushes unique, so that finished jobs within a period
            // are met often.
            Canary::UniqueForgetsFinished => self.unique_share = 0.8,
            // Most pushes after others, so that waiting jobs are many.
            Canary::DependentsLeftWaiting => self.after_share = 0.7,
            // And none unique: what a push's uniqueness reads is not
            // what this canary breaks.
            Canary::DependentReadyTooSoon => {
                self.after_share = 0.7;
                self.unique_share = 0.0;
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
