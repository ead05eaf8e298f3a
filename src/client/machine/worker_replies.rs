//! The [`WorkerMachine`]'s answers: what a claim, a renewal round, a
//! settle batch and a drain check mean when the store's reply arrives.
//! Rules as in `worker.rs`; the state is private to the machine.

use super::lifetime::{renewal_retry, run_limit, Lifetime};
use super::worker::{
    ClaimId, Held, JobOutcome, StopWhy, WorkerAction, WorkerMachine, WorkerReply, WorkerRequest,
};
use crate::core::job::Settle;
use crate::core::{HeartbeatReply, JobId, JobRecord, JobState};
use crate::error::{Error, LostReason, Result};
use crate::time::LocalMs;

/// Longest wait before a claim that got no answer is sent again.
const CLAIM_RETRY_CAP_MS: u64 = 1_000;

/// An empty claim's hint this close ("the queue changes at once", or
/// "look again soon": rows another transaction holds) counts toward
/// [`soon_floor_ms`].
pub(super) const SOON_MS: u64 = 16;

/// An empty claim's answer: `(next_change_in_ms, relook_in_ms)`.
type Hints = (Option<u64>, Option<u64>);

/// When to look again for one of an empty claim's hints (ms from now),
/// counting `streak`, its answers in a row within [`SOON_MS`].
fn follow(streak: &mut u32, hint: Option<u64>) -> Option<u64> {
    let soon = hint.filter(|&h| h <= SOON_MS);
    *streak = match soon {
        Some(_) => streak.saturating_add(1),
        None => 0,
    };
    let floor = soon.map_or(0, |_| soon_floor_ms(*streak));
    hint.map(|h| h.saturating_add(1).max(floor))
}

/// The least wait after `n` such hints in a row: none for the first four
/// (a claim in flight elsewhere commits within milliseconds), then 16 ms
/// doubling up to a second. A row held for long (a session idle in its
/// transaction until the server notices its client is gone, a long bulk
/// change) then costs each idle worker a look a second, not a hundred.
pub(super) fn soon_floor_ms(n: u32) -> u64 {
    match n.checked_sub(5) {
        None => 0,
        Some(k) => (SOON_MS << k.min(10)).min(1_000),
    }
}

impl WorkerMachine {
    /// The store answered a request (at local instant `now`).
    pub fn handle_reply(&mut self, now: LocalMs, reply: WorkerReply) {
        if self.over {
            return;
        }
        // Time passed too: a deadline seen passed first is a loss first.
        self.expire(now);
        match reply {
            WorkerReply::Claimed(r) => self.claimed(now, r, (None, None)),
            WorkerReply::Idle {
                next_change_in_ms,
                relook_in_ms,
            } => self.claimed(now, Ok(Vec::new()), (next_change_in_ms, relook_in_ms)),
            WorkerReply::Heartbeated(r) => self.heartbeated(now, r),
            WorkerReply::Settled(r) => self.settled(now, r),
            WorkerReply::Drained(r) => self.drained(r),
            WorkerReply::Fired(r) => {
                // Idle on a store that announces schedule changes: look
                // again when woken, else at the idle wait.
                let poll_ms = if self.cfg.announced && self.quiet() {
                    self.cfg.fire_ms.max(self.cfg.idle_max_ms)
                } else {
                    self.cfg.fire_ms
                };
                if self.fire.answered(now, &r, poll_ms) && self.may_claim() {
                    self.next_claim = self.next_claim.min(now);
                    self.idle.reset();
                }
            }
            WorkerReply::Sampled(r) => {
                self.sample_sent = false;
                self.next_sample = now.saturating_add(self.cfg.sample_ms);
                // Best effort: a failed sample waits for the next.
                if let Ok(counts) = r {
                    self.out.push_back(WorkerAction::Sampled(counts));
                }
            }
        }
        self.step(now);
    }

    fn drained(&mut self, r: Result<bool>) {
        self.drain_sent = false;
        match r {
            Ok(true) if self.quiet() && self.cfg.drain && !self.fire.in_flight() => {
                self.over = true;
                self.out.push_back(WorkerAction::Finished);
            }
            Ok(_) => {}
            Err(e) if e.is_transient() || e.is_ambiguous() => {}
            Err(e) => self.fail(e),
        }
    }

    /// `hints`: an empty answer's `(next_change_in_ms, relook_in_ms)`
    /// ([`WorkerReply::Idle`]).
    fn claimed(&mut self, now: LocalMs, r: Result<Vec<JobRecord>>, hints: Hints) {
        let Some(sent_at) = self.claim_sent.take() else {
            return;
        };
        // (A claim without an answer backs off whatever came meanwhile.)
        let rewake = std::mem::take(&mut self.rewake) && r.is_ok();
        let jobs = match r {
            Ok(jobs) => jobs,
            // No answer: whatever was claimed expires and is retried; the
            // next claim comes soon (the wake-up that sent this one may be
            // lost with it), at most a second away, not an idle wait.
            Err(e) if e.is_transient() || e.is_ambiguous() => {
                self.adapt_ahead(0);
                self.last_claim_empty = false;
                let wait = self.idle.next_wait().min(CLAIM_RETRY_CAP_MS);
                self.next_claim = now.saturating_add(wait.max(1));
                return;
            }
            Err(e) => return self.fail(e),
        };
        self.adapt_ahead(jobs.len());
        self.last_claim_empty = jobs.is_empty();
        if jobs.is_empty() {
            self.idle(now, hints);
            if rewake {
                self.next_claim = now;
            }
            return;
        }
        self.idle.reset();
        self.soon_hints = [0; 2];
        self.next_claim = now;
        if self.jobs.is_empty() && self.reported.is_empty() {
            self.next_round = self.next_round_after(sent_at);
        }
        for record in jobs {
            let claim = ClaimId::of(&record);
            let id = record.id;
            if self.jobs.contains_key(&id) {
                // Granted again: the store says our earlier claim ran out.
                self.lose(id, LostReason::Expired, now);
            }
            // A run-time limit counts from the claim, as the store's does.
            let timeout_at = run_limit(sent_at, record.timeout_ms, self.cfg.drift);
            let life = Lifetime::granted(sent_at, self.cfg.lease_ms, self.cfg.drift, 0, 0)
                .capped(timeout_at);
            let held = Held {
                record,
                token: claim.token,
                life,
                running: false,
                cancel_seen: false,
                timeout_at,
            };
            self.jobs.insert(id, held);
            if self.shutdown_at.is_some() {
                // Not ours to run: given back at once, unstarted.
                self.report(id, Settle::Abandon { started: false }, now);
            } else {
                // One answered after its local deadline (sent during a
                // store stall) is given back unstarted, costing no
                // attempt, by the deadline timer of this same step.
                self.queued.push_back(id);
            }
        }
    }

    /// The prefetch rule (module docs of `worker.rs`): a full claim that
    /// handlers starved for doubles `ahead`; a short one resets it.
    fn adapt_ahead(&mut self, got: usize) {
        if got < self.claim_asked {
            self.ahead = self.cfg.prefetch;
        } else if self.starved > 0 {
            let cap = (2 * self.cfg.batch_max).max(self.cfg.prefetch);
            self.ahead = (self.ahead.max(1) * 2).min(cap);
        }
        self.starved = 0;
    }

    /// An empty claim: back off (jittered, doubling), but no later than
    /// the store's hints plus 1 ms (the queue's next change by time, a
    /// relook). Each hint keeps its own count of answers in a row that
    /// said "within [`SOON_MS`]": heard again and again, it waits at least
    /// [`soon_floor_ms`]; heard once, or further away, it is kept exactly
    /// (a job falls due on time beside a row held for hours). With the
    /// drain rule on and nothing held, ask the store whether the queue is
    /// drained.
    fn idle(&mut self, now: LocalMs, (change_in, relook_in): Hints) {
        let wait = self.idle.next_wait();
        let [changes, relooks] = &mut self.soon_hints;
        let hinted = [follow(changes, change_in), follow(relooks, relook_in)];
        let wait = hinted.into_iter().flatten().fold(wait, u64::min);
        self.next_claim = now.saturating_add(wait.max(1));
        self.check_drained();
    }

    /// The drain rule's question: with `drain` on, nothing held and the
    /// last claim empty, ask the store whether the queue is drained (one
    /// question at a time). Asked after an empty claim, and after the
    /// settle that leaves the worker with nothing held (the last claim
    /// found nothing: no need to wait out the idle backoff first).
    fn check_drained(&mut self) {
        if self.cfg.drain
            && self.last_claim_empty
            && self.quiet()
            && !self.drain_sent
            && self.may_claim()
        {
            self.drain_sent = true;
            self.send(WorkerRequest::DrainCheck);
        }
    }

    fn heartbeated(&mut self, now: LocalMs, r: Result<Vec<Result<HeartbeatReply>>>) {
        let Some((sent_at, claims)) = self.round_sent.take() else {
            return;
        };
        let replies = match r {
            Ok(replies) => replies,
            Err(e) if e.is_transient() || e.is_ambiguous() => {
                self.next_round = now.saturating_add(renewal_retry(self.cfg.heartbeat_ms));
                return;
            }
            Err(e) => return self.fail(e),
        };
        self.next_round = self.next_round_after(sent_at);
        for ((id, token), reply) in claims.into_iter().zip(replies) {
            // Outcomes awaiting their commit: nothing to do either way.
            if self.jobs.get(&id).is_none_or(|h| h.token != token) {
                continue;
            }
            match reply {
                Ok(hb) => self.renewed(now, sent_at, id, hb.cancel_requested),
                Err(Error::Lost { reason, .. }) => self.lose(id, reason, now),
                Err(Error::NotFound(_)) => self.lose(id, LostReason::StaleToken, now),
                Err(_) => {}
            }
        }
    }

    fn renewed(&mut self, now: LocalMs, sent_at: LocalMs, id: JobId, cancel: bool) {
        let Some(h) = self.jobs.get_mut(&id) else {
            return;
        };
        h.life.renewed(sent_at, now);
        let (claim, deadline) = (h.claim(), h.life.deadline());
        self.out
            .push_back(WorkerAction::Renewed { claim, deadline });
        if !cancel || h.cancel_seen {
            return;
        }
        h.cancel_seen = true;
        if h.running {
            self.out.push_back(WorkerAction::Stop {
                claim,
                why: StopWhy::Cancelled,
            });
        } else {
            self.queued.retain(|q| *q != id);
            self.report(id, Settle::Abandon { started: false }, now);
        }
    }

    fn settled(&mut self, now: LocalMs, r: Result<Vec<Result<JobState>>>) {
        let Some(sent) = self.settle_sent.take() else {
            return;
        };
        let states = match r {
            Ok(states) => states,
            // No answer (nothing applied, or applied without its answer):
            // send the same outcomes again after a backoff. Their claims
            // are still renewed, and a settle that finds its own outcome
            // recorded answers as if it were the first (the store decides:
            // a claim that ran out meanwhile is lost).
            Err(e) if e.is_transient() || e.is_ambiguous() => {
                self.completer.splice(0..0, sent);
                self.settle_retry_at = now.saturating_add(self.settle_backoff.next_wait().max(1));
                return;
            }
            Err(e) => return self.fail(e),
        };
        self.settle_backoff.reset();
        self.settle_retry_at = LocalMs::ZERO;
        for ((claim, settle), state) in sent.into_iter().zip(states) {
            if !self.reported.remove(&claim) {
                continue;
            }
            let outcome = match (state, settle) {
                (Ok(_), Settle::Complete | Settle::CompleteWith(_)) => JobOutcome::Done,
                (Ok(s), Settle::Fail(_)) => JobOutcome::Failed(s),
                (Ok(s), Settle::Abandon { .. }) => JobOutcome::Abandoned(s),
                (Err(_), _) => JobOutcome::Lost,
            };
            self.out.push_back(WorkerAction::Settled { claim, outcome });
        }
        self.check_drained();
    }
}
