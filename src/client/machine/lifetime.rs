//! [`Lifetime`]: how long one grant (a lease or a job claim) may be acted
//! on, on the holder's own clock, and when it must be renewed.
//!
//! # State
//! `deadline`: the local instant at which the grant stops being valid (L3:
//! the send time of the request that granted or last renewed it, plus the
//! TTL, minus the drift allowance, [`crate::core::local_deadline_ms`]).
//! `cap`: an instant the deadline never passes (a job's run-time limit),
//! or none.
//! `next_renewal`: when the next renewal is due (about every third of the
//! TTL, jittered so that many holders do not renew in step), or never.
//! `in_flight`: the send time of the scheduled renewal awaiting its reply.
//! `end`: lost (with the reason) or finished (released, settled).
//!
//! # Transitions
//! granted → (renewal due → sent → renewed | failed (retry sooner) |
//! refused (lost)) … → finished, or lost when the deadline passes first.
//!
//! # Invariants
//! The deadline only moves forward, only by a renewal *sent* after the
//! last one (its send time starts the TTL), and never past the cap. A grant is never valid once
//! ended or at/after its deadline. A loss is reported exactly once.

use crate::core::{local_deadline_ms, mix64, DriftBound};
use crate::error::LostReason;
use crate::time::LocalMs;

/// Why a grant stopped being usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Lost: refused by the store, or the local deadline passed.
    Lost(LostReason),
    /// Released, completed, failed or given back by its holder.
    Finished,
}

/// Deliberately broken variants, for the simulator's canaries (cargo
/// feature `canaries`; never on in a normal build).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Breakage {
    /// Count the local deadline from when the reply arrived instead of
    /// from when the request was sent (breaks L3 under latency).
    pub deadline_from_reply: bool,
}

/// The validity and renewal schedule of one grant.
#[derive(Debug, Clone)]
pub struct Lifetime {
    ttl_ms: u64,
    drift: DriftBound,
    /// Renew this often (0: never; a holder that keeps no lease alive).
    every_ms: u64,
    seed: u64,
    round: u64,
    deadline: LocalMs,
    /// The deadline never passes this (a job's run-time limit).
    cap: LocalMs,
    next_renewal: LocalMs,
    in_flight: Option<LocalMs>,
    end: Option<End>,
    breakage: Breakage,
}

/// The usual renewal interval: a third of the TTL.
pub fn renew_every(ttl_ms: u64) -> u64 {
    (ttl_ms / 3).max(1)
}

/// The wait before the next renewal of something renewed about every
/// `every_ms`: the interval with ±10 % of jitter (drawn from `draw`), so
/// that many holders do not renew in step. The one renewal schedule of the
/// lease keep-alive and the worker loop's rounds.
pub fn renewal_wait(every_ms: u64, draw: u64) -> u64 {
    let span = (every_ms / 5).max(1);
    every_ms - every_ms / 10 + draw % span
}

/// After a renewal got no answer (a transient store error): try again after
/// a quarter of the interval, while the deadline allows.
pub fn renewal_retry(every_ms: u64) -> u64 {
    (every_ms / 4).max(1)
}

impl Lifetime {
    /// A grant whose request was sent at `sent_at` (local clock), renewed
    /// every `every_ms` (0: never), with jitter drawn from `seed`.
    pub fn granted(
        sent_at: LocalMs,
        ttl_ms: u64,
        drift: DriftBound,
        every_ms: u64,
        seed: u64,
    ) -> Self {
        let mut life = Lifetime {
            ttl_ms,
            drift,
            every_ms,
            seed,
            round: 0,
            deadline: deadline_of(sent_at, ttl_ms, drift),
            cap: LocalMs::MAX,
            next_renewal: LocalMs::MAX,
            in_flight: None,
            end: None,
            breakage: Breakage::default(),
        };
        life.schedule(sent_at);
        life
    }

    /// A grant valid until local instant `deadline`, renewed by someone
    /// else (a worker loop's renewal rounds): no schedule of its own.
    pub fn until(deadline: LocalMs) -> Self {
        Lifetime {
            ttl_ms: 0,
            drift: DriftBound::default(),
            every_ms: 0,
            seed: 0,
            round: 0,
            deadline,
            cap: LocalMs::MAX,
            next_renewal: LocalMs::MAX,
            in_flight: None,
            end: None,
            breakage: Breakage::default(),
        }
    }

    /// The same grant, never valid at or past `cap` however it is renewed
    /// (a job's run-time limit, counted from its claim); unchanged for
    /// `None`.
    pub fn capped(mut self, cap: Option<LocalMs>) -> Self {
        if let Some(cap) = cap {
            self.cap = cap;
            self.deadline = self.deadline.min(cap);
        }
        self
    }

    /// The deadline moves to `deadline` (never back, never past the cap):
    /// a renewal made by someone else (a worker loop's round).
    pub fn extend_to(&mut self, deadline: LocalMs) {
        if self.end.is_none() {
            self.deadline = self.deadline.max(deadline.min(self.cap));
        }
    }

    /// Mark it lost for `reason` (seen by someone else); the reason if this
    /// is the first loss.
    pub fn mark_lost(&mut self, reason: LostReason) -> Option<LostReason> {
        self.lose(reason)
    }

    /// The same grant with a deliberate breakage (the simulator's canaries).
    #[cfg(feature = "canaries")]
    pub fn broken(mut self, breakage: Breakage, replied_at: LocalMs) -> Self {
        self.breakage = breakage;
        if breakage.deadline_from_reply {
            self.deadline = deadline_of(replied_at, self.ttl_ms, self.drift);
        }
        self
    }

    /// The next renewal after one sent (or granted) at `from`: the interval
    /// with ±10 % of jitter, so that many holders do not renew in step.
    fn schedule(&mut self, from: LocalMs) {
        if self.every_ms == 0 {
            self.next_renewal = LocalMs::MAX;
            return;
        }
        let wait = renewal_wait(self.every_ms, mix64(self.seed ^ self.round));
        self.round += 1;
        self.next_renewal = from.saturating_add(wait);
    }

    /// Whether the holder may act at local instant `now`.
    pub fn is_valid(&self, now: LocalMs) -> bool {
        self.end.is_none() && now < self.deadline
    }

    /// The local deadline.
    pub fn deadline(&self) -> LocalMs {
        self.deadline
    }

    /// How it ended, if it has.
    pub fn end(&self) -> Option<End> {
        self.end
    }

    /// Whether the store may still count the grant live, so that a holder
    /// done with it must release it by token: not ended, or lost only at
    /// the local deadline (the store's TTL runs on past the drift margin;
    /// released, the key is free at once and the holder's next grant is a
    /// new one with a new token, not this one extended). Refused by the
    /// store, or finished, there is nothing left to release. Ask it once,
    /// before [`Lifetime::finish`] (which leaves a loss as it is).
    pub fn may_be_live_in_store(&self) -> bool {
        matches!(self.end, None | Some(End::Lost(LostReason::LocalDeadline)))
    }

    /// Whether a scheduled renewal should be sent now.
    pub fn renewal_due(&self, now: LocalMs) -> bool {
        self.end.is_none()
            && self.in_flight.is_none()
            && now >= self.next_renewal
            && now < self.deadline
    }

    /// A scheduled renewal was sent at `now`.
    pub fn renewal_sent(&mut self, now: LocalMs) {
        self.in_flight = Some(now);
    }

    /// The send time of the scheduled renewal awaiting its reply.
    pub fn in_flight(&self) -> Option<LocalMs> {
        self.in_flight
    }

    /// A renewal sent at `sent_at` succeeded (reply at `now`). Renewals
    /// sent by anyone count (a manual renew beside the schedule); the
    /// deadline never moves back.
    pub fn renewed(&mut self, sent_at: LocalMs, now: LocalMs) {
        if self.in_flight == Some(sent_at) {
            self.in_flight = None;
        }
        if self.end.is_some() {
            return;
        }
        let from = if self.breakage.deadline_from_reply {
            now
        } else {
            sent_at
        };
        self.deadline = self
            .deadline
            .max(deadline_of(from, self.ttl_ms, self.drift).min(self.cap));
        self.schedule(sent_at);
    }

    /// A renewal failed without an answer (a transient store error): retry
    /// sooner, while the deadline allows.
    pub fn renewal_failed(&mut self, sent_at: LocalMs, now: LocalMs) {
        if self.in_flight == Some(sent_at) {
            self.in_flight = None;
        }
        if self.every_ms > 0 && self.end.is_none() {
            self.next_renewal = now.saturating_add(renewal_retry(self.every_ms));
        }
    }

    /// The store refused a renewal: the grant is lost. Returns the reason
    /// if this is the first loss (report it once).
    pub fn refused(&mut self, sent_at: LocalMs, reason: LostReason) -> Option<LostReason> {
        if self.in_flight == Some(sent_at) {
            self.in_flight = None;
        }
        self.lose(reason)
    }

    fn lose(&mut self, reason: LostReason) -> Option<LostReason> {
        if self.end.is_some() {
            return None;
        }
        self.end = Some(End::Lost(reason));
        Some(reason)
    }

    /// Time passed: the loss, the first time the deadline is seen passed.
    pub fn handle_timeout(&mut self, now: LocalMs) -> Option<LostReason> {
        if now >= self.deadline {
            return self.lose(LostReason::LocalDeadline);
        }
        None
    }

    /// The next instant something happens: the renewal due (unless one is
    /// in flight) or the deadline. `None` once ended.
    pub fn poll_timeout(&self) -> Option<LocalMs> {
        if self.end.is_some() {
            return None;
        }
        let renewal = if self.in_flight.is_none() {
            self.next_renewal
        } else {
            LocalMs::MAX
        };
        Some(renewal.min(self.deadline))
    }

    /// The holder is done with it (released, settled): nothing more is
    /// renewed and it is no longer valid. Returns false if it had ended.
    pub fn finish(&mut self) -> bool {
        if self.end.is_some() {
            return false;
        }
        self.end = Some(End::Finished);
        true
    }

    /// Stop renewing on a schedule (renewals already sent still count).
    pub fn stop_renewing(&mut self) {
        self.every_ms = 0;
        self.next_renewal = LocalMs::MAX;
    }
}

/// The local instant a claim requested at `sent_at` of a job with run-time
/// limit `timeout_ms` stops being valid, if it has one (F3, and L3: the
/// store's deadline counts from the claim, later than the request's send
/// time, and the drift allowance comes off). Every holder of a claim, the
/// worker loop's and a hand-claimed one, caps its lifetime here.
pub fn run_limit(sent_at: LocalMs, timeout_ms: Option<u64>, drift: DriftBound) -> Option<LocalMs> {
    timeout_ms.map(|t| deadline_of(sent_at, t, drift))
}

/// The local deadline of a grant requested at `sent_at` (L3).
fn deadline_of(sent_at: LocalMs, ttl_ms: u64, drift: DriftBound) -> LocalMs {
    LocalMs(local_deadline_ms(sent_at.ms(), ttl_ms, drift))
}
