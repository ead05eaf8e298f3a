//! How a [`WorkerMachine`]'s held job ends (rules as in `worker.rs`): its
//! handler returns, its local deadline or its run-time limit passes, the
//! store refuses its claim, or shutdown's grace runs out. A handler's
//! outcome, a passed run-time limit, a queued job's passed deadline and
//! shutdown's give-back put an outcome in the completer, settled in the
//! next batch; a loss (a running job's deadline passed, or the store
//! refused the claim) goes out at once (`WorkerAction::Settled`, lost).

use super::worker::{ClaimId, HandlerOutcome, JobOutcome, StopWhy, WorkerAction, WorkerMachine};
use crate::core::job::Settle;
use crate::core::JobId;
use crate::error::LostReason;
use crate::time::LocalMs;

impl WorkerMachine {
    /// Shutdown's grace ran out: every running handler is told to stop
    /// and its job given back (an attempt: it started).
    pub(super) fn give_back_running(&mut self, now: LocalMs) {
        let running: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, h)| h.running)
            .map(|(id, _)| *id)
            .collect();
        for id in running {
            if let Some(h) = self.jobs.get(&id) {
                let claim = h.claim();
                self.out.push_back(WorkerAction::Stop {
                    claim,
                    why: StopWhy::Shutdown,
                });
            }
            self.running -= 1;
            self.report(id, Settle::Abandon { started: true }, now);
        }
        self.flush_at = now;
    }

    /// The handler of `claim` finished at `now`: `Ok` completes the job,
    /// `Err(reason)` fails it (a reason too long for the store is cut,
    /// [`crate::client::fit_reason`]). Ignored for a claim no longer held:
    /// a handler stopped for a loss may report long after, when the job is
    /// claimed again (by this worker, too).
    pub fn handler_done(
        &mut self,
        now: LocalMs,
        claim: ClaimId,
        result: impl Into<HandlerOutcome>,
    ) {
        self.expire(now);
        if !self
            .jobs
            .get(&claim.job)
            .is_some_and(|h| h.running && h.token == claim.token)
        {
            return;
        }
        self.running -= 1;
        if self.queued.is_empty() && self.claim_sent.is_some() {
            self.starved += 1;
        }
        self.report(claim.job, result.into().settle(), now);
        self.step(now);
    }

    /// The job's outcome goes to the completer (its claim is renewed until
    /// the outcome is committed).
    pub(super) fn report(&mut self, id: JobId, settle: Settle, now: LocalMs) {
        let Some(h) = self.jobs.remove(&id) else {
            return;
        };
        #[cfg(feature = "canaries")]
        {
            self.outcomes += 1;
            if self.breakage.drop_outcomes && self.outcomes % 4 == 0 {
                return;
            }
        }
        let claim = h.claim();
        if self.completer.is_empty() {
            self.flush_at = now.saturating_add(self.cfg.flush_delay_ms);
        }
        self.reported.insert(claim);
        self.completer.push((claim, settle));
    }

    /// Local deadlines: a queued or running job whose deadline passed is
    /// lost (its handler is told; one never started is given back). A
    /// reported outcome is still sent (the store decides).
    pub(super) fn expire(&mut self, now: LocalMs) {
        let lost: Vec<(JobId, LostReason, bool)> = self
            .jobs
            .iter_mut()
            .filter_map(|(id, h)| {
                let timed_out = h.timeout_at.is_some_and(|at| now >= at);
                h.life.handle_timeout(now).map(|r| (*id, r, timed_out))
            })
            .collect();
        for (id, reason, timed_out) in lost {
            if timed_out {
                self.time_out(id, now);
            } else {
                self.lose(id, reason, now);
            }
        }
    }

    /// The run-time limit of `id` passed (F3): its handler is told to stop
    /// and the attempt fails saying so, sent while its claim still holds
    /// (the store's deadline is later by the drift allowance). One never
    /// started fails too, saying so: its limit counts from the claim, and
    /// given back for free it would be claimed and given back again for
    /// ever when the limit is shorter than a claim takes to start (Q3).
    pub(super) fn time_out(&mut self, id: JobId, now: LocalMs) {
        let Some(h) = self.jobs.get(&id) else {
            return;
        };
        let (claim, running) = (h.claim(), h.running);
        let limit_ms = h.record.timeout_ms.unwrap_or(0);
        if !running {
            self.queued.retain(|q| *q != id);
            let reason =
                format!("timed out before it started: the job's {limit_ms} ms limit passed first");
            return self.report(id, Settle::Fail(reason), now);
        }
        self.running -= 1;
        self.out.push_back(WorkerAction::Stop {
            claim,
            why: StopWhy::TimedOut,
        });
        let reason = format!("timed out: still running at the job's {limit_ms} ms limit");
        self.report(id, Settle::Fail(reason), now);
    }

    /// The claim of `id` may no longer be acted on. A running handler is
    /// told to stop and the job counts as lost; a job never started whose
    /// local deadline passed is given back at once, costing no attempt (the
    /// store refuses if its claim ran out meanwhile); one the store refused
    /// is just dropped.
    pub(super) fn lose(&mut self, id: JobId, reason: LostReason, now: LocalMs) {
        let Some(h) = self.jobs.get(&id) else {
            return;
        };
        let (claim, running) = (h.claim(), h.running);
        if !running {
            self.queued.retain(|q| *q != id);
            if reason == LostReason::LocalDeadline {
                return self.report(id, Settle::Abandon { started: false }, now);
            }
        }
        self.jobs.remove(&id);
        if running {
            self.running -= 1;
            self.out.push_back(WorkerAction::Stop {
                claim,
                why: StopWhy::Lost(reason),
            });
        }
        self.out.push_back(WorkerAction::Settled {
            claim,
            outcome: JobOutcome::Lost,
        });
    }
}
