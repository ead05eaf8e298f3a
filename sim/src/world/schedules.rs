//! Schedules in the simulated world: the schedules a run starts with, a
//! process's wall clock, and the store side of a fire: the worker's real
//! `Exec` (under the canary, on a store whose cursor is never stored),
//! mirrored in the reference model job by job, every tick's job recorded
//! by the oracle (P1).

use super::msg::Answer;
use super::{RoleState, Sim, QUEUE, T0};
use crate::model::Outcome;
use leasehold::client::machine::{WorkerReply, WorkerRequest};
use leasehold::client::sim::Exec;
use leasehold::core::schedule::{self, tick_key};
use leasehold::core::{Missed, Rule, ScheduleSpec};
use leasehold::{JobSpec, StoreExt};

/// True wall-clock time at the start of a run (Unix ms; a whole minute).
pub(super) const WALL0: u64 = 1_768_478_400_000;

/// The schedules every Schedules run starts with.
pub(super) fn specs() -> Vec<ScheduleSpec> {
    let job = |p: &str| JobSpec {
        max_attempts: 3,
        ..JobSpec::new(p)
    };
    vec![
        ScheduleSpec {
            name: "beat".into(),
            rule: Rule::every(1_000),
            job: job("beat"),
            missed: Missed::Skip,
        },
        ScheduleSpec {
            name: "cron".into(),
            rule: Rule::cron("*/2 * * * * *", "Europe/Paris").unwrap_or(Rule::every(2_000)),
            job: job("cron"),
            missed: Missed::CatchUp,
        },
    ]
}

impl Sim<'_> {
    /// Process `p`'s wall clock: true wall time with its drift and steps
    /// (not its monotonic clock's offset).
    pub(super) fn wall(&self, p: usize) -> u64 {
        let c = &self.procs[p].clock;
        (WALL0 + c.read(self.now)).saturating_sub(c.offset_ms + T0)
    }

    /// The wall clock of true time.
    pub(super) fn true_wall(&self) -> u64 {
        WALL0 + self.now - T0
    }

    /// The wall clock of the worker furthest behind (P2 judges ticks by
    /// it: a tick is due for every worker once it is due by that clock).
    pub(super) fn slowest_worker_wall(&self) -> u64 {
        (0..self.procs.len())
            .filter(|&p| matches!(self.procs[p].state, RoleState::Worker(_)))
            .map(|p| self.wall(p))
            .min()
            .unwrap_or_else(|| self.true_wall())
    }

    /// Put the run's schedules in the store (none in the model: the model
    /// only sees the jobs they make).
    pub(super) fn start_schedules(&mut self) {
        self.clock.set(self.now);
        let wall = self.true_wall();
        for spec in specs() {
            let r = self
                .store
                .txn(|tx| schedule::put(tx, QUEUE, &spec, leasehold::WallMs(wall)));
            if let Err(e) = r {
                panic!(
                    "the simulator could not add its schedule {}: {e}",
                    spec.name
                );
            }
            self.first_ticks.push((
                spec.name.clone(),
                spec.rule
                    .next_at_or_after(wall + 1)
                    .ok()
                    .flatten()
                    .unwrap_or(u64::MAX),
            ));
        }
    }

    /// A fire by a worker's `Exec` (at its process's wall clock; under the
    /// canary, on a store that never stores a cursor), the model's
    /// enqueues of the same jobs, and the oracle's record of every tick's
    /// job.
    pub(super) fn apply_fire(&mut self, exec: &Exec) -> (Answer, Outcome, String) {
        let reply = exec.run(WorkerRequest::Fire);
        let mut expect = Vec::new();
        if let WorkerReply::Fired(Ok(fired)) = &reply {
            let templates = specs();
            for (name, tick, _, _) in &fired.jobs {
                let Some(t) = templates.iter().find(|s| *s.name == **name) else {
                    continue;
                };
                let spec = JobSpec {
                    unique_key: Some(tick_key(name, *tick)),
                    ..t.job.clone()
                };
                expect.push(self.oracle.model.enqueue(QUEUE, &spec));
            }
            for (name, tick, _, created) in &fired.jobs {
                if *created {
                    let c = self.oracle.tick_enqueued(self.now, &tick_key(name, *tick));
                    self.check(c);
                }
            }
        }
        (
            Answer::Worker(reply),
            Outcome::Batch(expect),
            "fire".to_owned(),
        )
    }

    /// P2 at the end of a run: every tick from each schedule's first up to
    /// the heal phase (by the slowest worker's clock, less two seconds) was
    /// fired by the workers (P1 has checked each was fired once).
    pub(super) fn final_tick_checks(&mut self) {
        let until = self.heal_wall.saturating_sub(2_000);
        for (name, first) in self.first_ticks.clone() {
            let rule = specs().into_iter().find(|s| s.name == name).map(|s| s.rule);
            let Some(rule) = rule else { continue };
            let mut tick = Some(first);
            for _ in 0..100_000 {
                let Some(t) = tick.filter(|t| *t <= until) else {
                    break;
                };
                let key = tick_key(&name, t);
                if !self.oracle.tick_seen(&key) {
                    let detail = format!(
                        "tick {key} (due before the heal phase) was never enqueued by a worker"
                    );
                    return self.fail(self.violation_at("P2", detail));
                }
                tick = rule.next_at_or_after(t + 1).ok().flatten();
            }
        }
    }
}
