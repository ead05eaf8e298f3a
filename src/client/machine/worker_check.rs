//! The [`WorkerMachine`]'s invariants (the module docs of `worker.rs`),
//! each stated with its negative space: checked after every step by the
//! machine itself in debug builds, and by the simulator after every event,
//! so a run fails at the step that breaks one.

use super::ensure;
use super::worker::{ClaimId, Timer, WorkerAction, WorkerMachine, WorkerRequest};
use crate::core::JobId;
use crate::time::LocalMs;
use std::collections::BTreeSet;

impl WorkerMachine {
    /// Check the machine's invariants at local instant `now`, after a
    /// step: `Err` names the first one broken.
    pub fn check(&self, now: LocalMs) -> Result<(), String> {
        self.check_phases()?;
        self.check_outcomes()?;
        self.check_requests()?;
        if self.over {
            return Ok(());
        }
        for timer in Timer::ALL {
            if let Some(at) = self.timer(timer) {
                ensure(at > now, || {
                    format!("timer {timer:?} due at {at} was left undone at {now}")
                })?;
            }
        }
        Ok(())
    }

    /// Every claim in one phase; `running` and the queue agree with it.
    fn check_phases(&self) -> Result<(), String> {
        let running = self.jobs.values().filter(|h| h.running).count();
        ensure(running == self.running, || {
            format!("{running} jobs run but the count says {}", self.running)
        })?;
        ensure(self.running <= self.cfg.concurrency, || {
            format!(
                "{} handlers run, concurrency {}",
                self.running, self.cfg.concurrency
            )
        })?;
        for (id, h) in &self.jobs {
            ensure(
                *id == h.record.id && h.token == ClaimId::of(&h.record).token,
                || format!("job {id} is held under another job's record or token"),
            )?;
            ensure(!self.reported.contains(&h.claim()), || {
                format!("{} is both held and reported", h.claim())
            })?;
        }
        let waiting: BTreeSet<JobId> = self
            .jobs
            .iter()
            .filter(|(_, h)| !h.running)
            .map(|(id, _)| *id)
            .collect();
        let queued: BTreeSet<JobId> = self.queued.iter().copied().collect();
        ensure(queued.len() == self.queued.len(), || {
            "a job is queued twice".to_owned()
        })?;
        ensure(queued == waiting, || {
            format!("queued {queued:?}, but the held jobs not started are {waiting:?}")
        })?;
        ensure(self.shutdown_at.is_none() || self.queued.is_empty(), || {
            "jobs wait to start after shutdown".to_owned()
        })
    }

    /// Every outcome waiting or in flight is a reported claim, once.
    fn check_outcomes(&self) -> Result<(), String> {
        let mut pending = BTreeSet::new();
        let in_flight = self.settle_sent.iter().flatten();
        for (claim, _) in self.completer.iter().chain(in_flight) {
            ensure(self.reported.contains(claim), || {
                format!("an outcome of {claim} waits, but it is not reported")
            })?;
            ensure(pending.insert(*claim), || {
                format!("{claim}'s outcome would be sent twice")
            })?;
        }
        ensure(pending.len() == self.reported.len(), || {
            let lost: Vec<&ClaimId> = self.reported.difference(&pending).collect();
            format!("reported outcomes {lost:?} are neither waiting nor in flight")
        })
    }

    /// At most one request of each kind in flight, and one waiting for the
    /// driver only while its kind is marked in flight.
    fn check_requests(&self) -> Result<(), String> {
        let mut seen = [0usize; 6];
        for action in &self.out {
            if let WorkerAction::Send(request) = action {
                seen[kind(request)] += 1;
            }
        }
        let in_flight = [
            self.claim_sent.is_some(),
            self.round_sent.is_some(),
            self.settle_sent.is_some(),
            self.drain_sent,
            self.sample_sent,
            self.fire.in_flight(),
        ];
        for (k, (&n, &flying)) in seen.iter().zip(&in_flight).enumerate() {
            ensure(n <= usize::from(flying), || {
                format!("{n} requests of kind {k} queued, in flight: {flying}")
            })?;
        }
        ensure(!self.rewake || self.claim_sent.is_some(), || {
            "a wake-up is kept for a claim that is not in flight".to_owned()
        })?;
        Ok(())
    }
}

fn kind(request: &WorkerRequest) -> usize {
    match request {
        WorkerRequest::Claim { .. } => 0,
        WorkerRequest::Heartbeat { .. } => 1,
        WorkerRequest::Settle { .. } => 2,
        WorkerRequest::DrainCheck => 3,
        WorkerRequest::Sample => 4,
        WorkerRequest::Fire => 5,
    }
}

#[cfg(test)]
mod tests {
    //! Each invariant can fail: a machine driven to a real state, then
    //! broken by hand in one place, is caught naming what broke.
    use super::super::worker::{WorkerConfig, WorkerReply};
    use super::*;
    use crate::core::job::Settle;
    use crate::core::{Claim, DriftBound, HolderId, JobRecord, JobState};

    fn job(id: u64) -> JobRecord {
        JobRecord {
            state: JobState::Running,
            claim: Some(Claim {
                holder: HolderId(1),
                token: 1,
                lease_until_ms: 3_000,
                deadline_ms: None,
            }),
            ..crate::core::job::sample_job(id)
        }
    }

    /// Three claimed at 0: job 3 ran and its outcome waits in the
    /// completer (its flush is 50 ms away), job 1 runs, job 2 waits.
    fn machine() -> WorkerMachine {
        let cfg = WorkerConfig {
            lease_ms: 3_000,
            concurrency: 1,
            prefetch: 2,
            batch_max: 8,
            flush_delay_ms: 50,
            idle_max_ms: 100,
            announced: false,
            heartbeat_ms: 0,
            drain: false,
            drift: DriftBound::default(),
            seed: 3,
            sample_ms: 0,
            fire_ms: 0,
        };
        let mut m = WorkerMachine::new(cfg, LocalMs(0));
        while m.poll_action().is_some() {}
        m.handle_reply(
            LocalMs(1),
            WorkerReply::Claimed(Ok(vec![job(3), job(1), job(2)])),
        );
        let three = ClaimId {
            job: JobId(3),
            token: 1,
        };
        m.handler_done(LocalMs(2), three, Ok(()));
        while m.poll_action().is_some() {}
        assert_eq!(
            m.check(LocalMs(2)),
            Ok(()),
            "a real state holds every invariant"
        );
        assert_eq!((m.running, m.queued.len(), m.completer.len()), (1, 1, 1));
        m
    }

    fn broken(m: &WorkerMachine, now: LocalMs, names: &str) {
        match m.check(now) {
            Err(e) => assert!(e.contains(names), "{e:?} should name {names:?}"),
            Ok(()) => panic!("the broken invariant ({names}) was not caught"),
        }
    }

    #[test]
    fn each_broken_invariant_is_named() {
        let mut m = machine();
        m.running += 1;
        broken(&m, LocalMs(2), "the count says");
        let mut m = machine();
        m.cfg.concurrency = 0;
        broken(&m, LocalMs(2), "concurrency 0");
        let mut m = machine();
        m.queued.push_back(JobId(2));
        broken(&m, LocalMs(2), "queued twice");
        let mut m = machine();
        m.queued.clear();
        broken(&m, LocalMs(2), "not started are");
        let mut m = machine();
        m.shutdown_at = Some(LocalMs(5));
        broken(&m, LocalMs(2), "after shutdown");
        let mut m = machine();
        if let Some(h) = m.jobs.get_mut(&JobId(2)) {
            h.token = 9;
        }
        broken(&m, LocalMs(2), "another job's record");
        let mut m = machine();
        let held = ClaimId {
            job: JobId(1),
            token: 1,
        };
        m.reported.insert(held);
        broken(&m, LocalMs(2), "both held and reported");
        let mut m = machine();
        m.reported.clear();
        broken(&m, LocalMs(2), "it is not reported");
        let mut m = machine();
        let (claim, settle) = m.completer[0].clone();
        m.completer.push((claim, settle));
        broken(&m, LocalMs(2), "sent twice");
        let mut m = machine();
        m.reported.insert(ClaimId {
            job: JobId(9),
            token: 1,
        });
        broken(&m, LocalMs(2), "neither waiting nor in flight");
        let mut m = machine();
        m.send(WorkerRequest::DrainCheck);
        broken(&m, LocalMs(2), "kind 3");
        let mut m = machine();
        m.settle_sent = Some(Vec::new());
        m.send(WorkerRequest::Settle {
            settles: vec![(JobId(3), 1, Settle::Complete)],
        });
        m.send(WorkerRequest::Settle {
            settles: Vec::new(),
        });
        broken(&m, LocalMs(2), "2 requests of kind 2");
    }

    #[test]
    fn a_timer_left_due_is_caught_and_one_done_is_not() {
        let m = machine();
        let flush = m.timer(Timer::Flush).unwrap_or(LocalMs::ZERO);
        assert_eq!(flush, LocalMs(52), "the completer's flush is armed");
        broken(&m, flush, "Flush");
        let mut m = m;
        m.handle_timeout(flush);
        assert_eq!(m.check(flush), Ok(()), "once stepped, nothing is due");
        let mut over = machine();
        over.over = true;
        assert_eq!(
            over.check(LocalMs::MAX),
            Ok(()),
            "a finished loop has no timers"
        );
    }

    /// Renewal rounds are jittered round by round whatever the seed (one
    /// with every bit set included), so that many workers never renew in
    /// step (the round number must change the draw, not merely be
    /// combined into a seed that already has its bits).
    #[test]
    fn renewal_rounds_are_jittered_round_by_round_whatever_the_seed() {
        for seed in [0, 3, u64::MAX] {
            let cfg = WorkerConfig {
                lease_ms: 3_000,
                concurrency: 1,
                prefetch: 0,
                batch_max: 8,
                flush_delay_ms: 50,
                idle_max_ms: 100,
                announced: false,
                heartbeat_ms: 1_000,
                drain: false,
                drift: DriftBound::default(),
                seed,
                sample_ms: 0,
                fire_ms: 0,
            };
            let mut m = WorkerMachine::new(cfg, LocalMs(0));
            let waits: std::collections::BTreeSet<LocalMs> =
                (0..20).map(|_| m.next_round_after(LocalMs(0))).collect();
            assert!(waits.len() > 5, "seed {seed}: {waits:?}");
            assert!(
                waits.iter().all(|w| (900..=1_100).contains(&w.0)),
                "seed {seed}: a second, give or take a tenth: {waits:?}"
            );
        }
    }

    /// The completer canary loses exactly every fourth outcome.
    #[cfg(feature = "canaries")]
    #[test]
    fn the_outcome_canary_drops_every_fourth_outcome() {
        use super::super::worker::WorkerBreakage;
        let cfg = WorkerConfig {
            lease_ms: 3_000,
            concurrency: 8,
            prefetch: 0,
            batch_max: 8,
            flush_delay_ms: 1_000,
            idle_max_ms: 100,
            announced: false,
            heartbeat_ms: 0,
            drain: false,
            drift: DriftBound::default(),
            seed: 3,
            sample_ms: 0,
            fire_ms: 0,
        };
        let breakage = WorkerBreakage {
            drop_outcomes: true,
        };
        let mut m = WorkerMachine::new(cfg, LocalMs(0)).with_breakage(breakage);
        while m.poll_action().is_some() {}
        m.handle_reply(
            LocalMs(1),
            WorkerReply::Claimed(Ok((1..=8).map(job).collect())),
        );
        for id in 1..=7 {
            let claim = ClaimId {
                job: JobId(id),
                token: 1,
            };
            m.handler_done(LocalMs(2), claim, Ok(()));
        }
        let kept: Vec<u64> = m.completer.iter().map(|(c, _)| c.job.0).collect();
        assert_eq!(kept, [1, 2, 3, 5, 6, 7]);
    }
}
