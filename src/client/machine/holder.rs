//! [`HolderMachine`]: one lease from the holder's side: acquire (waiting
//! with jittered backoff while it is held, woken early by a release), keep
//! it alive ([`Lifetime`]), notice its loss, release it.
//!
//! # State
//! `Acquiring` (a request in flight, or a retry scheduled; the wait's
//! deadline), `Held` (the token and its [`Lifetime`]; a release in
//! flight), `Done`.
//!
//! # Transitions
//! acquire sent → granted (Held) | held (retry after backoff, until the
//! wait runs out: gave up) | transient or ambiguous (retry: a grant that
//! did commit is found again, as a renewal with the same token; transient
//! errors until the busy timeout, then failed with `Busy`) | error
//! (failed). Held: renewals on the lifetime's schedule; a refused renewal
//! or the local deadline is a loss; release → released.
//!
//! # Invariants
//! At most one acquire or renewal in flight (a release may overlap the
//! renewal it makes pointless), and a request waits for the driver only
//! while it is marked in flight. Every event is reported once, and the
//! holder is valid only while `Held`, unreleased, and before the
//! lifetime's deadline. After a timeout nothing due is left undone.
//! Checked by [`HolderMachine::check`] after every step (by the machine in
//! debug builds, by the simulator after every event).

use super::ensure;
use super::lifetime::{renew_every, Lifetime};
use super::{Outbox, ReplyTime};
use crate::core::{Backoff, DriftBound, Grant};
use crate::error::{Error, LostReason, Result};
use crate::time::LocalMs;

/// How to hold one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HolderConfig {
    /// Time to live of each grant and renewal.
    pub ttl_ms: u64,
    /// Holders the key allows (1: a mutex).
    pub limit: u32,
    /// How long to keep trying while the key is held (0: once).
    pub wait_ms: u64,
    /// The drift allowance for the local deadline.
    pub drift: DriftBound,
    /// Renew about every third of the TTL (false: the grant just runs out).
    pub keep_alive: bool,
    /// Seed of the jitter (backoff, renewal schedule).
    pub seed: u64,
    /// How long transient store errors are retried, from the start,
    /// before acquiring fails with [`Error::Busy`] (`u64::MAX`: forever).
    pub busy_ms: u64,
}

/// A request the driver sends to the store for the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HolderRequest {
    /// `core::lease::acquire`.
    Acquire,
    /// `core::lease::renew` with this token.
    Renew {
        /// The grant's token.
        token: u64,
    },
    /// `core::lease::release` with this token.
    Release {
        /// The grant's token.
        token: u64,
    },
}

/// The store's answer to the request in flight.
#[derive(Debug, Clone)]
pub enum HolderReply {
    /// To [`HolderRequest::Acquire`].
    Acquired(Result<Grant>),
    /// To [`HolderRequest::Renew`].
    Renewed(Result<Grant>),
    /// To [`HolderRequest::Release`].
    Released(Result<()>),
}

/// What happened, for the application.
#[derive(Debug, Clone)]
pub enum HolderEvent {
    /// The lease is ours: act with this token.
    Granted {
        /// The fencing token.
        token: u64,
        /// The holder id already held it (an extended grant).
        renewed: bool,
    },
    /// The lease is lost: stop acting (reported once).
    Lost(LostReason),
    /// The key stayed held for the whole wait ([`Error::Held`]).
    GaveUp(Error),
    /// Acquiring failed with a store error that retrying will not fix.
    Failed(Error),
    /// The release is answered (or there was nothing to release: the
    /// store had refused the lease).
    Released,
}

/// What the driver should do next.
#[derive(Debug, Clone)]
pub enum HolderAction {
    /// Send this request to the store, then feed its answer back.
    Send(HolderRequest),
    /// Tell the application.
    Event(HolderEvent),
}

#[derive(Debug, Clone)]
enum Phase {
    Acquiring {
        in_flight: Option<LocalMs>,
        started: LocalMs,
        retry_at: LocalMs,
        backoff: Backoff,
    },
    Held {
        token: u64,
        life: Lifetime,
        release: Option<LocalMs>,
    },
    Done,
}

/// One lease from the holder's side; see the module docs.
#[derive(Debug, Clone)]
pub struct HolderMachine {
    cfg: HolderConfig,
    phase: Phase,
    /// The release was answered with an error other than "not held" (the
    /// grant may stay live in the store until its TTL runs out there).
    release_failed: bool,
    /// Store time the last grant had left when it was made (at least the
    /// TTL asked for).
    store_left_ms: u64,
    out: Outbox<HolderAction>,
    #[cfg(feature = "canaries")]
    breakage: super::lifetime::Breakage,
}

/// Longest wait between two acquire attempts.
const BACKOFF_CAP_MS: u64 = 250;

impl HolderMachine {
    /// Start acquiring at local instant `now`.
    pub fn new(cfg: HolderConfig, now: LocalMs) -> Self {
        HolderMachine::starting(cfg, now, now)
    }

    /// Made at local instant `now`, the first acquire sent at `start`
    /// (now, if `start` is not later); a wake-up before then sends it. A
    /// wait (`wait_ms`) counts from `now`.
    pub fn starting(cfg: HolderConfig, now: LocalMs, start: LocalMs) -> Self {
        let mut m = HolderMachine {
            cfg,
            phase: Phase::Acquiring {
                in_flight: None,
                started: now,
                retry_at: start.max(now),
                backoff: Backoff::new(1, BACKOFF_CAP_MS, cfg.seed),
            },
            release_failed: false,
            store_left_ms: 0,
            out: Outbox::new(),
            #[cfg(feature = "canaries")]
            breakage: super::lifetime::Breakage::default(),
        };
        if start <= now {
            m.send_acquire(now);
        }
        m
    }

    /// The same machine with a deliberate breakage (simulator canaries).
    #[cfg(feature = "canaries")]
    pub fn with_breakage(mut self, breakage: super::lifetime::Breakage) -> Self {
        self.breakage = breakage;
        self
    }

    fn send_acquire(&mut self, now: LocalMs) {
        if let Phase::Acquiring { in_flight, .. } = &mut self.phase {
            *in_flight = Some(now);
            self.out
                .push_back(HolderAction::Send(HolderRequest::Acquire));
        }
    }

    /// The next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<HolderAction> {
        self.out.pop_front()
    }

    /// When [`HolderMachine::handle_timeout`] should be called next.
    pub fn poll_timeout(&self) -> Option<LocalMs> {
        match &self.phase {
            Phase::Acquiring {
                in_flight: None,
                retry_at,
                ..
            } => Some(*retry_at),
            Phase::Held {
                life,
                release: None,
                ..
            } => life.poll_timeout(),
            _ => None,
        }
    }

    /// Whether the holder may act at `now` (held, before its deadline).
    pub fn is_valid(&self, now: LocalMs) -> bool {
        matches!(&self.phase, Phase::Held { life, release: None, .. } if life.is_valid(now))
    }

    /// The token while held.
    pub fn token(&self) -> Option<u64> {
        match &self.phase {
            Phase::Held { token, .. } => Some(*token),
            _ => None,
        }
    }

    /// The lifetime while held.
    pub fn lifetime(&self) -> Option<&Lifetime> {
        match &self.phase {
            Phase::Held { life, .. } => Some(life),
            _ => None,
        }
    }

    /// Whether its release was answered with an error other than "not
    /// held" (so the grant may stay live in the store until its TTL runs
    /// out there).
    pub fn release_failed(&self) -> bool {
        self.release_failed
    }

    /// The store time the grant had left when the store made it (its
    /// expiry less its grant time, at least the TTL; 0 before a grant).
    pub fn store_left_ms(&self) -> u64 {
        self.store_left_ms
    }

    /// Whether it is over (released, lost and released, gave up, failed).
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Check the machine's invariants at local instant `now`: `Err` names
    /// the first one broken. `after_timeout`: nothing due may be left
    /// undone (true only right after [`HolderMachine::handle_timeout`]).
    pub fn check(&self, now: LocalMs, after_timeout: bool) -> Result<(), String> {
        let sends = |kind: fn(&HolderRequest) -> bool| {
            self.out
                .iter()
                .filter(|a| matches!(a, HolderAction::Send(r) if kind(r)))
                .count()
        };
        let acquires = sends(|r| matches!(r, HolderRequest::Acquire));
        let renewals = sends(|r| matches!(r, HolderRequest::Renew { .. }));
        let releases = sends(|r| matches!(r, HolderRequest::Release { .. }));
        let flying = |f: bool| usize::from(f);
        let (acquiring, renewing, releasing) = match &self.phase {
            Phase::Acquiring { in_flight, .. } => (in_flight.is_some(), false, false),
            Phase::Held { life, release, .. } => {
                (false, life.in_flight().is_some(), release.is_some())
            }
            Phase::Done => (false, false, false),
        };
        ensure(
            acquires <= flying(acquiring)
                && renewals <= flying(renewing)
                && releases <= flying(releasing),
            || {
                format!("requests queued: {acquires} acquire, {renewals} renew, {releases} release; in flight: {acquiring}, {renewing}, {releasing}")
            },
        )?;
        if after_timeout {
            let due = self.poll_timeout().filter(|&at| at <= now);
            ensure(due.is_none(), || {
                format!("a timer due at {due:?} was left undone at {now}")
            })?;
        }
        Ok(())
    }

    /// Time passed to `now`.
    pub fn handle_timeout(&mut self, now: LocalMs) {
        self.timeout(now);
        super::debug_assert_holds("holder", now, || self.check(now, true));
    }

    fn timeout(&mut self, now: LocalMs) {
        match &mut self.phase {
            Phase::Acquiring {
                in_flight: None,
                retry_at,
                ..
            } if now >= *retry_at => self.send_acquire(now),
            Phase::Held {
                token,
                life,
                release: None,
            } => {
                if let Some(reason) = life.handle_timeout(now) {
                    self.out
                        .push_back(HolderAction::Event(HolderEvent::Lost(reason)));
                } else if life.renewal_due(now) {
                    life.renewal_sent(now);
                    let token = *token;
                    self.out
                        .push_back(HolderAction::Send(HolderRequest::Renew { token }));
                }
            }
            _ => {}
        }
    }

    /// A release of the key was seen (a wake-up): retry the acquire now.
    pub fn handle_wake(&mut self, now: LocalMs) {
        if let Phase::Acquiring {
            in_flight: None,
            retry_at,
            ..
        } = &mut self.phase
        {
            *retry_at = now;
            self.send_acquire(now);
        }
        super::debug_assert_holds("holder", now, || self.check(now, false));
    }

    /// The store answered the request in flight (at local instant `now`,
    /// read only if the step needs it: a grant's lifetime counts from its
    /// send time, so a granted acquire reads no clock; see [`ReplyTime`]).
    pub fn handle_reply(&mut self, now: impl ReplyTime, reply: HolderReply) {
        let now = match reply {
            HolderReply::Acquired(Ok(grant)) => self.granted(now, grant),
            HolderReply::Acquired(Err(e)) => {
                let now = now.read();
                self.refused(now, e);
                now
            }
            HolderReply::Renewed(r) => {
                let now = now.read();
                self.renewed(now, r);
                now
            }
            HolderReply::Released(r) => {
                if matches!(self.phase, Phase::Held { .. }) {
                    // Refused as not held: the slot is gone already.
                    self.release_failed = r.is_err_and(|e| !matches!(e, Error::Lost { .. }));
                    self.phase = Phase::Done;
                    self.out
                        .push_back(HolderAction::Event(HolderEvent::Released));
                }
                now.read()
            }
        };
        super::debug_assert_holds("holder", now, || self.check(now, false));
    }

    /// A grant answered the acquire in flight; returns the instant the
    /// step is checked at (the send time, unless a canary reads `now`).
    #[cfg_attr(not(feature = "canaries"), allow(unused_variables))]
    fn granted(&mut self, now: impl ReplyTime, grant: Grant) -> LocalMs {
        let Phase::Acquiring {
            in_flight: Some(sent_at),
            ..
        } = self.phase
        else {
            return now.read();
        };
        let every = if self.cfg.keep_alive {
            renew_every(self.cfg.ttl_ms)
        } else {
            0
        };
        let seed = self.cfg.seed ^ grant.token;
        // An extended slot keeps a later expiry if it had one.
        let left = grant.expires_at_ms.saturating_sub(grant.granted_at_ms);
        self.store_left_ms = left.max(self.cfg.ttl_ms);
        let life = Lifetime::granted(sent_at, self.cfg.ttl_ms, self.cfg.drift, every, seed);
        // Only the canary that counts the deadline from the reply reads it.
        #[cfg(feature = "canaries")]
        let (life, checked_at) = {
            let at = if self.breakage.deadline_from_reply {
                now.read()
            } else {
                sent_at
            };
            (life.broken(self.breakage, at), at)
        };
        #[cfg(not(feature = "canaries"))]
        let checked_at = sent_at;
        self.phase = Phase::Held {
            token: grant.token,
            life,
            release: None,
        };
        self.out
            .push_back(HolderAction::Event(HolderEvent::Granted {
                token: grant.token,
                renewed: grant.renewed,
            }));
        checked_at
    }

    /// The acquire in flight was refused or failed at `now`: give up, or
    /// retry after a backoff.
    fn refused(&mut self, now: LocalMs, e: Error) {
        let Phase::Acquiring {
            in_flight: Some(_),
            started,
            mut backoff,
            ..
        } = self.phase
        else {
            return;
        };
        match e {
            e @ Error::Held { .. } if now.saturating_sub(started) >= self.cfg.wait_ms => {
                self.phase = Phase::Done;
                self.out
                    .push_back(HolderAction::Event(HolderEvent::GaveUp(e)));
            }
            e if e.is_transient() && now.saturating_sub(started) >= self.cfg.busy_ms => {
                self.phase = Phase::Done;
                let busy = Error::Busy {
                    waited_ms: now.saturating_sub(started),
                    last: Box::new(e),
                };
                self.out
                    .push_back(HolderAction::Event(HolderEvent::Failed(busy)));
            }
            // Held (with time left to wait), or no answer (transient, or an
            // ambiguous commit: acquiring again finds a grant that did
            // commit, as a renewal with the same token).
            e if matches!(e, Error::Held { .. }) || e.is_transient() || e.is_ambiguous() => {
                let sleep = backoff.next_wait();
                let limit = if matches!(e, Error::Held { .. }) {
                    started.saturating_add(self.cfg.wait_ms)
                } else {
                    LocalMs::MAX
                };
                let soonest = now.saturating_add(1);
                self.phase = Phase::Acquiring {
                    in_flight: None,
                    started,
                    retry_at: now.saturating_add(sleep.max(1)).min(limit.max(soonest)),
                    backoff,
                };
            }
            e => {
                self.phase = Phase::Done;
                self.out
                    .push_back(HolderAction::Event(HolderEvent::Failed(e)));
            }
        }
    }

    fn renewed(&mut self, now: LocalMs, r: Result<Grant>) {
        let Phase::Held { life, .. } = &mut self.phase else {
            return;
        };
        let Some(sent_at) = life.in_flight() else {
            return;
        };
        match r {
            Ok(_) => life.renewed(sent_at, now),
            Err(Error::Lost { reason, .. }) => {
                if let Some(reason) = life.refused(sent_at, reason) {
                    self.out
                        .push_back(HolderAction::Event(HolderEvent::Lost(reason)));
                }
            }
            Err(_) => life.renewal_failed(sent_at, now),
        }
    }

    /// A renewal sent outside the schedule (a manual renew at `sent_at`)
    /// was answered at `now`.
    pub fn renewed_by_hand(&mut self, sent_at: LocalMs, now: LocalMs, r: &Result<Grant>) {
        let Phase::Held { life, .. } = &mut self.phase else {
            return;
        };
        match r {
            Ok(_) => life.renewed(sent_at, now),
            Err(Error::Lost { reason, .. }) => {
                if let Some(reason) = life.refused(sent_at, *reason) {
                    self.out
                        .push_back(HolderAction::Event(HolderEvent::Lost(reason)));
                }
            }
            Err(_) => {}
        }
    }

    /// The holder is done with the lease: release it (or, while still
    /// acquiring, stop trying).
    pub fn release(&mut self, now: LocalMs) {
        match &mut self.phase {
            Phase::Held {
                token,
                life,
                release: release @ None,
            } => {
                // Lost at the local deadline, the grant may still be live
                // in the store: release it by token all the same.
                let live = life.may_be_live_in_store();
                life.finish();
                *release = Some(now);
                let token = *token;
                if !live {
                    self.phase = Phase::Done;
                    self.out
                        .push_back(HolderAction::Event(HolderEvent::Released));
                } else {
                    self.out
                        .push_back(HolderAction::Send(HolderRequest::Release { token }));
                }
            }
            Phase::Acquiring { .. } => self.phase = Phase::Done,
            _ => {}
        }
    }
}
