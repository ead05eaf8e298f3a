//! Producers push jobs (one at a time, with random priorities, delays and
//! unique keys), and the world's own looks at the queue: whether every job
//! has finished, whether the producers are done.

use super::msg::{Answer, Rep, Req};
use super::{RoleState, Sim};
use leasehold::{JobSpec, StoreExt};
use rand::Rng;

impl Sim<'_> {
    pub(super) fn poll_producer(&mut self, p: usize) {
        let local = self.local(p);
        let RoleState::Producer { left, next_local } = self.procs[p].state else {
            return;
        };
        if left == 0 || self.healing || self.procs[p].forked_child {
            self.exit(p);
        } else if !self.procs[p].inflight.is_empty() {
            // One push at a time; the reply wakes it.
        } else if local >= next_local {
            let spec = self.random_spec(p);
            self.send(p, Req::Push(Box::new(spec)));
        } else {
            self.wake_at_local(p, next_local);
        }
    }

    pub(super) fn producer_reply(&mut self, p: usize, rep: Rep) {
        let local = self.local(p);
        let wait = self.procs[p].rng.random_range(0..=20);
        if let RoleState::Producer { left, next_local } = &mut self.procs[p].state {
            if matches!(rep, Rep::Done(Answer::Enqueued(Ok(_)))) {
                *left = left.saturating_sub(1);
            }
            *next_local = local + wait;
        }
    }

    fn random_spec(&mut self, p: usize) -> JobSpec {
        let rng = &mut self.procs[p].rng;
        // Drawn in keyed runs alone, so that other runs stay as they were.
        let key = match self.plan.keyed {
            true => chance_key(rng),
            false => None,
        };
        // Likewise run-time limits, in timed runs alone.
        let timeout = self.plan.timeouts.and_then(|(low, high)| {
            rng.random_bool(0.5)
                .then(|| std::time::Duration::from_millis(rng.random_range(low..=high)))
        });
        let unique = rng
            .random_bool(self.plan.unique_share)
            .then(|| format!("u{}", rng.random_range(0..3)));
        // D1, D2: a few of the jobs pushed so far (an id never pushed now
        // and then, which the push must refuse), after any ending at times.
        let pushed = self.oracle.model.jobs.len() as u64;
        let after: Vec<leasehold::JobId> = match rng.random_bool(self.plan.after_share) {
            true => (0..rng.random_range(1..=3))
                .map(|_| match rng.random_bool(0.02) {
                    true => pushed + 1_000,
                    false => rng.random_range(1..=pushed.max(1)),
                })
                .map(leasehold::JobId)
                .collect(),
            false => Vec::new(),
        };
        let after_any = !after.is_empty() && rng.random_bool(0.3);
        JobSpec {
            after,
            after_any,
            key,
            timeout,
            priority: rng.random_range(-1..=2),
            delay_ms: if rng.random_bool(0.3) {
                rng.random_range(1..=200)
            } else {
                0
            },
            max_attempts: self.plan.max_attempts,
            unique_key: unique.clone(),
            // U1: a period of up to a few leases, and states drawn from
            // all six, on some of the unique pushes.
            unique_for: (unique.is_some() && rng.random_bool(0.4))
                .then(|| std::time::Duration::from_millis(rng.random_range(1..=600))),
            unique_states: (unique.is_some() && rng.random_bool(0.4)).then(|| {
                let states: Vec<leasehold::JobState> = (leasehold::JobState::ALL.into_iter())
                    .filter(|_| rng.random_bool(0.5))
                    .collect();
                leasehold::StateSet::of(&states).with(leasehold::JobState::Ready)
            }),
            ..JobSpec::new(vec![rng.random::<u8>()])
        }
    }

    /// Whether every job of the queue is done, dead or cancelled (the
    /// world's own look at the store, not a process's).
    pub(super) fn queue_finished(&mut self) -> bool {
        let policy = self.policy;
        self.clock.set(self.now);
        match self
            .store
            .txn(|tx| leasehold::core::job::stats(tx, super::QUEUE, &policy))
        {
            Ok(c) => {
                use leasehold::JobState::{Ready, Running, Scheduled, Waiting};
                c.get(Ready) + c.get(Scheduled) + c.get(Running) + c.get(Waiting) == 0
            }
            Err(_) => false,
        }
    }

    /// Every producer has stopped and none of its pushes is still in the
    /// network (a worker that left earlier would strand them).
    pub(super) fn producers_quiet(&self) -> bool {
        let in_flight_bound =
            super::T0 + self.plan.duration_ms + 2 * self.plan.max_latency_ms() + 1;
        self.now >= in_flight_bound
            && self
                .procs
                .iter()
                .all(|pr| !matches!(pr.state, RoleState::Producer { .. }) || pr.exited || !pr.alive)
    }
}

/// A concurrency key for a job of a keyed run: one of a few, or none.
fn chance_key(rng: &mut rand::rngs::StdRng) -> Option<String> {
    rng.random_bool(0.7)
        .then(|| format!("k{}", rng.random_range(0..3)))
}
