//! [`FireTimer`]: when a worker fires its queue's schedules (the rules of
//! a tick are [`crate::core::schedule`]'s; this is only the timing).
//!
//! # State
//! `next_at` (local instant of the next fire), whether one is in flight,
//! the poll interval, the backoff after a failed fire.
//!
//! # Transitions
//! due → sent → answered: the next fire is at the next tick the store
//! reported (a wall-clock wait, counted on the local clock from the
//! answer), at most one poll interval away (the machine's interval for
//! that answer), so schedules added or changed by others are seen within
//! it; a wake-up brings the next fire forward (`hurry`: a schedule put
//! announces itself), though no closer than a second (or the poll
//! interval) after the last fire, and one that comes while a fire is in
//! flight brings its successor forward; a failed fire is retried after a
//! [`Backoff`] (doubling, at most the poll interval).
//!
//! # Invariants
//! At most one fire in flight; off (`poll_ms` 0) means never.

use crate::core::Backoff;
use crate::error::Result;
use crate::time::LocalMs;

/// What a fire found, as the worker machine needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FireReport {
    /// Jobs it enqueued (the worker claims at once when some were).
    pub enqueued: usize,
    /// Each tick's job: (schedule, tick, job, created); `created` is false
    /// when a live job already had the tick's key.
    pub jobs: Vec<(std::sync::Arc<str>, u64, crate::core::JobId, bool)>,
    /// Wall-clock milliseconds until the next tick of any schedule of the
    /// queue (`None`: it has none).
    pub next_in_ms: Option<u64>,
}

/// When to fire; see the module docs.
#[derive(Debug, Clone)]
pub(super) struct FireTimer {
    poll_ms: u64,
    next_at: LocalMs,
    sent: bool,
    backoff: Backoff,
    /// When the last fire was sent: wake-ups bring the next one no closer
    /// than `spacing` after it.
    last_sent: LocalMs,
    /// A wake-up while a fire was in flight (it may have read the
    /// schedules before the put it announces): the next fire by then.
    hurried: Option<LocalMs>,
}

impl FireTimer {
    /// A timer that fires first at `now` and polls every `poll_ms` (0:
    /// off), its retries jittered from `seed`.
    pub(super) fn new(poll_ms: u64, now: LocalMs, seed: u64) -> FireTimer {
        FireTimer {
            poll_ms,
            next_at: now,
            sent: false,
            backoff: Backoff::new(1, poll_ms.max(1), crate::core::mix64(seed ^ 0xf1e)),
            last_sent: LocalMs::ZERO,
            hurried: None,
        }
    }

    /// The least time between fires that wake-ups bring forward: the poll
    /// interval, at most a second (a storm of wake-ups costs a fire a
    /// second at most).
    fn spacing(&self) -> u64 {
        self.poll_ms.min(1_000)
    }

    /// When the next fire is due, unless off or in flight.
    pub(super) fn poll_timeout(&self) -> Option<LocalMs> {
        (self.poll_ms > 0 && !self.sent).then_some(self.next_at)
    }

    /// Whether a fire is in flight (its jobs may be on their way).
    pub(super) fn in_flight(&self) -> bool {
        self.sent
    }

    /// The fire due was sent at `now`: it is in flight.
    pub(super) fn sent(&mut self, now: LocalMs) {
        self.sent = true;
        self.last_sent = now;
    }

    /// Fire by `at` at the latest (unless off or in flight): a wake-up
    /// may announce a schedule put elsewhere.
    pub(super) fn hurry(&mut self, at: LocalMs) {
        if self.poll_ms == 0 {
            return;
        }
        let at = at.max(self.last_sent.saturating_add(self.spacing()));
        if self.sent {
            self.hurried = Some(self.hurried.map_or(at, |h| h.min(at)));
        } else {
            self.next_at = self.next_at.min(at);
        }
    }

    /// The fire in flight was answered at `now`; whether it enqueued jobs.
    /// The next look is at the next tick, at most `poll_ms` away (the
    /// machine's interval: `poll_ms` of [`FireTimer::new`], or longer
    /// while the worker is idle on a store that announces changes).
    pub(super) fn answered(&mut self, now: LocalMs, r: &Result<FireReport>, poll_ms: u64) -> bool {
        if !std::mem::take(&mut self.sent) {
            return false;
        }
        let hurried = self.hurried.take();
        let enqueued = match r {
            Ok(report) => {
                self.backoff.reset();
                let poll_ms = poll_ms.max(1);
                let wait = report.next_in_ms.map_or(poll_ms, |w| w.min(poll_ms));
                self.next_at = now.saturating_add(wait.max(1));
                report.enqueued > 0
            }
            Err(_) => {
                self.next_at = now.saturating_add(self.backoff.next_wait().max(1));
                false
            }
        };
        if let Some(at) = hurried {
            self.next_at = self.next_at.min(at.max(now));
        }
        enqueued
    }
}
