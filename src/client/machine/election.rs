//! [`ElectionMachine`]: leader election on one key, from one campaigner's
//! side. A term is one grant of the key; the machine campaigns, leads,
//! loses or resigns, and campaigns again, by driving a [`HolderMachine`]
//! per term (whose lifetime is the leader's local deadline, L3).
//!
//! # State
//! `Campaigning` (a holder machine acquiring without a time limit, with
//! its jittered backoff, woken early by a release), `Leading` (its grant:
//! the token and the lifetime), `Releasing` (resigned, stepped down,
//! deposed by the local deadline, or giving back a grant that was no
//! term: the release in flight, then campaign again or stop), `Done`.
//! Besides: the token of the last leader reported, so each change of
//! leader is reported once.
//!
//! # Transitions
//! Campaigning: granted → Leading (`Elected` with the token); granted by
//! extending a grant this holder already had (`renewed`) → given back,
//! then Campaigning again (whatever `once` says: it was no term), at once
//! if the release was answered, else once the store has surely let that
//! grant lapse (the extending answer's arrival plus the store time it had
//! left, stretched by the drift bound: until then the store may count it
//! live and would extend it again, and without the pause a store failing
//! releases and granting acquires would be asked over and over; wake-ups
//! do not cut the pause short); held by
//! another → the leader seen (`Leader`, when it changed); a permanent
//! store error → Done (`Failed`). Leading: a refused renewal or the local
//! deadline → `Deposed(Lost)` (past the deadline, the grant is released
//! first: it may still be live in the store, and the next term must not
//! extend it under the same token), then Campaigning again (Done if
//! `once`); `step_down` → `Deposed(Resigned)`, release, Campaigning
//! again; `resign` → `Deposed(Resigned)`, release, Done.
//!
//! # Invariants
//! [`ElectionMachine::is_leader`] holds only while Leading and before the
//! term's local deadline, so two leaders never act at the same true time
//! while clocks drift within the bound. `Elected` and `Deposed` alternate,
//! once per term. Every term's token is new: a grant that extends one of
//! this holder's earlier grants (a release that went unanswered, in this
//! election or in an earlier one of the same holder id, in this process or
//! another) carries that grant's token, so it never leads; fencing tells
//! every two terms apart. The price, in two rare cases: a campaign whose
//! acquire committed without an answer (ambiguous) finds its own grant
//! again, `renewed`, and gives it back too (a rival may win meanwhile);
//! and two live campaigners sharing one holder id (a misconfiguration:
//! the lease cannot tell them apart) keep giving each other's grants back,
//! taking turns under new tokens instead of leading together under one.
//! A resignation releases the key, so the next campaigner takes over at
//! once instead of after the TTL.

use super::holder::{
    HolderAction, HolderConfig, HolderEvent, HolderMachine, HolderReply, HolderRequest,
};
use super::Outbox;
use crate::core::{local_lapse_ms, HolderInfo};
use crate::error::{Error, LostReason};
use crate::time::LocalMs;

/// How to campaign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectionConfig {
    /// Each term's lease (TTL, drift allowance, jitter seed; renewed about
    /// every third of the TTL). Its `wait_ms` and `busy_ms` are ignored: a
    /// campaign waits, and rides out transient store errors, for as long
    /// as it takes.
    pub lease: HolderConfig,
    /// Stop after the first term instead of campaigning again.
    pub once: bool,
}

/// Why a term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deposed {
    /// The lease was lost (refused renewal, local deadline passed).
    Lost(LostReason),
    /// The leader resigned (or stepped down): the key is released.
    Resigned,
}

impl std::fmt::Display for Deposed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Deposed::Lost(reason) => write!(f, "leadership lost: {reason}"),
            Deposed::Resigned => f.write_str("resigned"),
        }
    }
}

/// What happened, for the application.
#[derive(Debug, Clone)]
pub enum ElectionEvent {
    /// This campaigner leads: act with this fencing token while
    /// [`ElectionMachine::is_leader`] holds.
    Elected {
        /// The term's token.
        token: u64,
    },
    /// This campaigner no longer leads: stop acting (once per term).
    Deposed(Deposed),
    /// Another campaigner leads (seen by a campaign attempt; reported when
    /// the leader changes).
    Leader(HolderInfo),
    /// A store error that retrying will not fix: the election is over.
    Failed(Error),
}

/// What the driver should do next.
#[derive(Debug, Clone)]
pub enum ElectionAction {
    /// Send this request to the store, then feed its answer back.
    Send(HolderRequest),
    /// Tell the application.
    Event(ElectionEvent),
}

/// Deliberately broken variants, for the simulator's canaries.
#[cfg(feature = "canaries")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ElectionBreakage {
    /// A leader trusts its grant until a renewal is refused: it ignores its
    /// local deadline (and so keeps acting through a pause past its TTL).
    pub ignores_deadline: bool,
}

/// One campaigner; see the module docs.
#[derive(Debug, Clone)]
pub struct ElectionMachine {
    cfg: ElectionConfig,
    term: Option<HolderMachine>,
    leading: bool,
    /// A resignation's release is in flight: campaign again after it?
    releasing: Option<bool>,
    seen: Option<u64>,
    /// A campaign's grant that extended an earlier grant of this holder
    /// is being given back (with the local instant by which the store has
    /// surely let it lapse, [`local_lapse_ms`]); the campaign goes on once
    /// that is answered: at once, or at that instant if the release failed
    /// (the store may count the grant live until then, and would extend it
    /// again).
    giving_back: Option<LocalMs>,
    /// A campaign waits until then for a grant given back (a failed
    /// release) to lapse: wake-ups do not cut it short.
    paused_until: Option<LocalMs>,
    terms: u64,
    out: Outbox<ElectionAction>,
    #[cfg(feature = "canaries")]
    breakage: ElectionBreakage,
}

impl ElectionMachine {
    /// Start campaigning at local instant `now`.
    pub fn new(cfg: ElectionConfig, now: LocalMs) -> Self {
        let mut m = ElectionMachine {
            cfg,
            term: None,
            leading: false,
            releasing: None,
            seen: None,
            giving_back: None,
            paused_until: None,
            terms: 0,
            out: Outbox::new(),
            #[cfg(feature = "canaries")]
            breakage: ElectionBreakage::default(),
        };
        m.campaign(now);
        m
    }

    /// The same machine with a deliberate breakage (simulator canaries).
    #[cfg(feature = "canaries")]
    pub fn with_breakage(mut self, breakage: ElectionBreakage) -> Self {
        self.breakage = breakage;
        self
    }

    fn campaign(&mut self, now: LocalMs) {
        self.campaign_from(now, now);
    }

    /// A new term's campaign, its first acquire at `start`.
    fn campaign_from(&mut self, now: LocalMs, start: LocalMs) {
        self.terms += 1;
        self.paused_until = (start > now).then_some(start);
        let lease = HolderConfig {
            wait_ms: u64::MAX,
            busy_ms: u64::MAX,
            keep_alive: true,
            seed: crate::core::mix64(self.cfg.lease.seed ^ self.terms),
            ..self.cfg.lease
        };
        self.term = Some(HolderMachine::starting(lease, now, start));
        self.pump(now);
    }

    /// The next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<ElectionAction> {
        self.out.pop_front()
    }

    /// When [`ElectionMachine::handle_timeout`] should be called next.
    pub fn poll_timeout(&self) -> Option<LocalMs> {
        self.term.as_ref().and_then(HolderMachine::poll_timeout)
    }

    /// Whether this campaigner may act as leader at `now`: leading, and
    /// before the term's local deadline.
    pub fn is_leader(&self, now: LocalMs) -> bool {
        let Some(term) = &self.term else { return false };
        #[cfg(feature = "canaries")]
        if self.breakage.ignores_deadline {
            return self.leading && term.token().is_some();
        }
        // Only a leader's term is ever valid (`check` asserts it).
        term.is_valid(now)
    }

    /// Whether a grant of this election may still be live in the store:
    /// leading, or released (a term's end, or a grant being given back)
    /// but not yet answered (false once the release is answered, or the
    /// term ended without one).
    pub fn holds_grant(&self) -> bool {
        self.term.as_ref().is_some_and(|t| t.token().is_some())
    }

    /// The current term's token while leading.
    pub fn token(&self) -> Option<u64> {
        self.term
            .as_ref()
            .filter(|_| self.leading)
            .and_then(HolderMachine::token)
    }

    /// The local deadline of the current term while leading.
    pub fn deadline(&self) -> Option<LocalMs> {
        self.term
            .as_ref()
            .filter(|_| self.leading)
            .and_then(|t| t.lifetime().map(|l| l.deadline()))
    }

    /// Whether the election is over (resigned, once, failed).
    pub fn is_done(&self) -> bool {
        self.term.is_none()
    }

    /// Check the machine's invariants at local instant `now`: its term's
    /// ([`HolderMachine::check`]), and a leader always has its grant.
    pub fn check(&self, now: LocalMs) -> Result<(), String> {
        if let Some(term) = &self.term {
            term.check(now, false)?;
        }
        let granted = self.term.as_ref().is_some_and(|t| t.token().is_some());
        super::ensure(!self.leading || granted, || {
            "leading without a grant".to_owned()
        })?;
        super::ensure(!(self.leading && self.releasing.is_some()), || {
            "leading while resigning".to_owned()
        })?;
        super::ensure(
            self.giving_back.is_none() || (!self.leading && self.holds_grant()),
            || "giving a grant back while leading, or with none".to_owned(),
        )?;
        let valid = self.term.as_ref().is_some_and(|t| t.is_valid(now));
        super::ensure(self.leading || !valid, || {
            format!("a valid term at {now} while not leading")
        })
    }

    /// Time passed to `now`.
    pub fn handle_timeout(&mut self, now: LocalMs) {
        #[cfg(feature = "canaries")]
        if self.breakage.ignores_deadline && self.leading {
            // Broken on purpose: the deadline is never looked at, so the
            // lease is neither renewed past it nor seen lost.
            if self.deadline().is_some_and(|d| now >= d) {
                return;
            }
        }
        if self.releasing.is_some() {
            // Resigning (no longer leading): no new campaign attempt.
            return self.pump(now);
        }
        if let Some(term) = &mut self.term {
            term.handle_timeout(now);
        }
        self.pump(now);
    }

    /// The store announced a release: a campaign tries again now.
    pub fn handle_wake(&mut self, now: LocalMs) {
        if self.releasing.is_some() || self.paused_until.is_some_and(|t| now < t) {
            return;
        }
        if let Some(term) = &mut self.term {
            term.handle_wake(now);
        }
        self.pump(now);
    }

    /// The store answered the request in flight (at local instant `now`).
    pub fn handle_reply(&mut self, now: LocalMs, reply: HolderReply) {
        if let HolderReply::Acquired(Err(Error::Held { holders, .. })) = &reply {
            if let Some(leader) = holders.first() {
                if self.seen != Some(leader.token) {
                    self.seen = Some(leader.token);
                    self.event(ElectionEvent::Leader(leader.clone()));
                }
            }
        }
        if let Some(term) = &mut self.term {
            term.handle_reply(now, reply);
        }
        self.pump(now);
        if self.releasing.is_some() {
            self.end_campaign(now);
        }
    }

    /// Give up leadership for good: release the key (the next campaigner
    /// takes over at once) and stop; a campaign in progress just stops.
    pub fn resign(&mut self, now: LocalMs) {
        self.release(now, false);
    }

    /// Give up this term (the key is released) and campaign again once
    /// the release is answered.
    pub fn step_down(&mut self, now: LocalMs) {
        if self.leading {
            self.release(now, true);
        }
    }

    fn release(&mut self, now: LocalMs, again: bool) {
        if let Some(campaign_again) = &mut self.releasing {
            // Already releasing: a resignation after a step-down is final.
            *campaign_again &= again;
            return;
        }
        if self.term.is_none() {
            return;
        }
        self.releasing = Some(again);
        if std::mem::take(&mut self.leading) {
            self.event(ElectionEvent::Deposed(Deposed::Resigned));
            if let Some(term) = &mut self.term {
                term.release(now);
            }
            self.pump(now);
        } else {
            self.end_campaign(now);
        }
    }

    /// A resignation while campaigning: the campaign ends once no acquire
    /// is in flight (a grant that answers one is released at once).
    fn end_campaign(&mut self, now: LocalMs) {
        let idle = self
            .term
            .as_ref()
            .is_some_and(|t| t.token().is_none() && t.poll_timeout().is_some());
        if self.leading || !idle {
            return;
        }
        let again = self.releasing.take().unwrap_or(false);
        self.term = None;
        if again {
            self.campaign(now);
        }
    }

    fn event(&mut self, event: ElectionEvent) {
        self.out.push_back(ElectionAction::Event(event));
    }

    /// Turn what the term's machine did into this machine's actions.
    fn pump(&mut self, now: LocalMs) {
        let bound = 64;
        for _ in 0..bound {
            let Some(action) = self.term.as_mut().and_then(HolderMachine::poll_action) else {
                return;
            };
            match action {
                HolderAction::Send(request) => self.out.push_back(ElectionAction::Send(request)),
                HolderAction::Event(event) => self.term_event(now, event),
            }
        }
    }

    fn term_event(&mut self, now: LocalMs, event: HolderEvent) {
        match event {
            HolderEvent::Granted { .. } if self.releasing.is_some() => {
                // Resigned while this acquire was in flight: give it back.
                if let Some(term) = &mut self.term {
                    term.release(now);
                }
            }
            HolderEvent::Granted { renewed: true, .. } => {
                // An earlier grant of this holder, extended: a term whose
                // release went unanswered (lost, resigned, or an earlier
                // election's or process's under the same holder id) that
                // the store still counted live. Not a new term: give it
                // back by token and campaign on, so that the next term
                // has a new token and fencing tells the two apart.
                if let Some(term) = &mut self.term {
                    let lapse = local_lapse_ms(now.0, term.store_left_ms(), self.cfg.lease.drift);
                    self.giving_back = Some(LocalMs(lapse));
                    term.release(now);
                }
            }
            HolderEvent::Granted { token, .. } => {
                self.leading = true;
                self.seen = Some(token);
                self.event(ElectionEvent::Elected { token });
            }
            HolderEvent::Lost(reason) => {
                if std::mem::take(&mut self.leading) {
                    self.event(ElectionEvent::Deposed(Deposed::Lost(reason)));
                }
                // Refused: the term's machine just ends. Past the local
                // deadline: it releases the grant first (it may still be
                // live in the store), so the next term has a new token.
                if let Some(term) = &mut self.term {
                    term.release(now);
                }
            }
            HolderEvent::Released => {
                let gave_back = self.giving_back.take();
                let again = match self.releasing.take() {
                    Some(again) => again && !self.cfg.once,
                    None => gave_back.is_some() || !self.cfg.once,
                };
                // A grant given back that may still be live: the next
                // campaign waits for it to lapse, or the store would
                // extend it again.
                let failed = self
                    .term
                    .as_ref()
                    .is_some_and(HolderMachine::release_failed);
                let start = gave_back.filter(|_| failed).map_or(now, |d| d.max(now));
                self.term = None;
                if again {
                    self.campaign_from(now, start);
                }
            }
            HolderEvent::GaveUp(e) | HolderEvent::Failed(e) => {
                self.leading = false;
                self.giving_back = None;
                self.paused_until = None;
                self.term = None;
                self.event(ElectionEvent::Failed(e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{DriftBound, Grant};

    fn leader() -> ElectionMachine {
        let lease = HolderConfig {
            ttl_ms: 300,
            limit: 1,
            wait_ms: 0,
            drift: DriftBound::default(),
            keep_alive: true,
            seed: 1,
            busy_ms: 0,
        };
        let mut m = ElectionMachine::new(ElectionConfig { lease, once: false }, LocalMs(0));
        let grant = Grant {
            token: 2,
            expires_at_ms: 0,
            granted_at_ms: 0,
            renewed: false,
        };
        m.handle_reply(LocalMs(0), HolderReply::Acquired(Ok(grant)));
        m.check(LocalMs(1)).unwrap();
        m
    }

    /// The canary ignores only the deadline: renewals still go out on
    /// schedule before it, and past it the leader still says it leads.
    #[cfg(feature = "canaries")]
    #[test]
    fn the_deadline_canary_renews_on_schedule_and_leads_past_its_deadline() {
        let breakage = ElectionBreakage {
            ignores_deadline: true,
        };
        let mut m = leader().with_breakage(breakage);
        while m.poll_action().is_some() {}
        let renew_at = m.poll_timeout().unwrap();
        m.handle_timeout(renew_at);
        assert!(matches!(
            m.poll_action(),
            Some(ElectionAction::Send(HolderRequest::Renew { token: 2 }))
        ));
        let deadline = m.deadline().unwrap();
        m.handle_timeout(deadline);
        assert!(m.poll_action().is_none(), "no loss seen at the deadline");
        assert!(m.is_leader(deadline + 1_000));
        // Stepping down still ends its leadership (the grant is kept until
        // the release is answered).
        m.step_down(deadline + 1_000);
        assert!(m.term.as_ref().is_some_and(|t| t.token().is_some()));
        assert!(!m.is_leader(deadline + 1_000));
        let mut honest = leader();
        honest.handle_timeout(deadline);
        assert!(!honest.is_leader(deadline));
    }

    /// Each invariant `check` states fails when its state is broken.
    #[test]
    fn check_names_each_broken_invariant() {
        let mut m = leader();
        m.leading = false;
        let e = m.check(LocalMs(1)).unwrap_err();
        assert!(e.contains("valid term"), "{e}");

        let mut m = leader();
        m.releasing = Some(true);
        let e = m.check(LocalMs(1)).unwrap_err();
        assert!(e.contains("leading while resigning"), "{e}");

        let mut m = leader();
        m.term = None;
        let e = m.check(LocalMs(1)).unwrap_err();
        assert!(e.contains("leading without a grant"), "{e}");
    }
}
