//! A lease holder: the real [`HolderMachine`] decides when to acquire,
//! renew, give up and whether the lease is still valid; around it, the
//! application writes to the protected resource while the machine says
//! the lease is valid, then releases it. A greedy holder keeps no lease
//! alive and writes up to its last valid local millisecond: the sharpest
//! test of L3.

use super::msg::{error_of, Answer, Line, Rep, Req};
use super::{RoleState, Sim};
use crate::plan::Canary;
use leasehold::client::machine::{
    HolderAction, HolderConfig, HolderEvent, HolderMachine, HolderReply, HolderRequest,
};
use leasehold::LocalMs;
use rand::Rng;

#[derive(Debug, Clone)]
pub(super) struct HolderState {
    key: usize,
    machine: Option<HolderMachine>,
    greedy: bool,
    writes_left: u32,
    next_write: LocalMs,
    next_acquire: LocalMs,
}

impl HolderState {
    pub(super) fn new(key: usize) -> Self {
        HolderState {
            key,
            machine: None,
            greedy: false,
            writes_left: 0,
            next_write: LocalMs::ZERO,
            next_acquire: LocalMs::ZERO,
        }
    }
}

impl HolderState {
    /// Not holding nor acquiring.
    pub(super) fn idle(&self) -> bool {
        self.machine.is_none()
    }

    /// A burst: acquire at the next poll, whatever the wait said.
    pub(super) fn acquire_now(&mut self) {
        self.next_acquire = LocalMs::ZERO;
    }
}

impl Sim<'_> {
    fn holder(&mut self, p: usize) -> &mut HolderState {
        match &mut self.procs[p].state {
            RoleState::Holder(h) => h,
            _ => unreachable!("p{p} is a holder"),
        }
    }

    pub(super) fn poll_holder(&mut self, p: usize) {
        let local = self.local(p);
        let forked = self.procs[p].forked_child;
        if self.holder(p).machine.is_none() {
            if self.healing || forked {
                return self.exit(p);
            }
            if local < self.holder(p).next_acquire {
                let at = self.holder(p).next_acquire;
                return self.wake_at_local(p, at);
            }
            self.start_acquire(p, local);
        }
        let mut broken = None;
        if let Some(m) = &mut self.holder(p).machine {
            m.handle_timeout(local);
            broken = m.check(local, true).err();
        }
        if let Some(broken) = broken {
            let detail = format!("p{p}'s holder machine at local {local}: {broken}");
            return self.fail(self.violation_at("invariant", detail));
        }
        self.act_holder(p);
        self.holder_app(p);
        self.schedule_holder(p);
    }

    fn start_acquire(&mut self, p: usize, local: LocalMs) {
        let greedy = self.procs[p].rng.random_bool(0.3);
        let seed = self.procs[p].rng.random();
        let cfg = HolderConfig {
            ttl_ms: self.plan.ttl_ms,
            limit: self.plan.keys[self.holder(p).key],
            wait_ms: 0,
            drift: self.drift,
            keep_alive: !greedy,
            seed,
            busy_ms: u64::MAX,
        };
        let breakage = leasehold::client::machine::Breakage {
            deadline_from_reply: self.plan.canary == Some(Canary::DeadlineFromReply),
        };
        let h = self.holder(p);
        h.greedy = greedy;
        h.machine = Some(HolderMachine::new(cfg, local).with_breakage(breakage));
    }

    /// Do what the machine asks.
    fn act_holder(&mut self, p: usize) {
        loop {
            let Some(action) = self
                .holder(p)
                .machine
                .as_mut()
                .and_then(|m| m.poll_action())
            else {
                return;
            };
            let local = self.local(p);
            let key = self.holder(p).key;
            match action {
                HolderAction::Send(request) => {
                    let req = match request {
                        HolderRequest::Acquire => Req::Acquire { key },
                        HolderRequest::Renew { token } => Req::Renew { key, token },
                        HolderRequest::Release { token } => Req::Release { key, token },
                    };
                    self.send(p, req);
                }
                HolderAction::Event(HolderEvent::Granted { token, .. }) => {
                    let gen = self.procs[p].gen;
                    self.note(Line::Note(format!(
                        "p{p}.{gen} holder machine: granted token {token}"
                    )));
                    let writes = self.procs[p].rng.random_range(1..=8);
                    let h = self.holder(p);
                    h.writes_left = writes;
                    h.next_write = local;
                }
                HolderAction::Event(HolderEvent::Lost(reason)) => {
                    let gen = self.procs[p].gen;
                    self.note(Line::Note(format!("p{p}.{gen} lost its lease: {reason}")));
                    if let Some(m) = &mut self.holder(p).machine {
                        m.release(local);
                    }
                }
                HolderAction::Event(HolderEvent::Released | HolderEvent::GaveUp(_)) => {
                    let wait = self.procs[p]
                        .rng
                        .random_range(1..=(self.plan.ttl_ms / 2).max(1));
                    let h = self.holder(p);
                    h.machine = None;
                    h.next_acquire = local + wait;
                }
                HolderAction::Event(HolderEvent::Failed(_)) => {
                    // A forked child's handle: it gives up and exits.
                    self.holder(p).machine = None;
                    self.exit(p);
                    return;
                }
            }
        }
    }

    /// The application around the lease: protected writes while valid,
    /// then release.
    fn holder_app(&mut self, p: usize) {
        let local = self.local(p);
        let fork_ok =
            !self.procs[p].forked_child || self.plan.canary == Some(Canary::ForkReusesHandle);
        let healing = self.healing;
        let h = self.holder(p);
        let Some(m) = &h.machine else { return };
        let Some(token) = m.token() else { return };
        let valid = fork_ok && m.is_valid(local);
        let (greedy, writes_left, next_write, key) = (h.greedy, h.writes_left, h.next_write, h.key);
        if !m.is_valid(local) || healing || (writes_left == 0 && !greedy) {
            if let Some(m) = &mut self.holder(p).machine {
                m.release(local);
            }
            return self.act_holder(p);
        }
        if !valid || local < next_write {
            return;
        }
        if !self.protected_write(p, key, token) {
            return;
        }
        let gap = self.procs[p]
            .rng
            .random_range(1..=(self.plan.ttl_ms / 4).max(1));
        let deadline = self.holder(p).machine.as_ref().map_or(LocalMs::ZERO, |m| {
            m.lifetime().map_or(LocalMs::ZERO, |l| l.deadline())
        });
        let h = self.holder(p);
        h.writes_left = h.writes_left.saturating_sub(1);
        h.next_write = local + gap;
        if greedy {
            // Land the last write on the last valid local millisecond.
            h.next_write = h
                .next_write
                .min(deadline.saturating_sub_ms(1))
                .max(local + 1);
        }
    }

    /// A write to the resource `key` protects, with `token`, judged by the
    /// oracle (L3, L5, fencing); false once it found a violation.
    pub(super) fn protected_write(&mut self, p: usize, key: usize, token: u64) -> bool {
        let (fencing, owner) = (self.plan.fencing, self.owner(p));
        match self.oracle.write(self.now, key, owner, token, fencing) {
            Ok(accepted) => {
                self.note(Line::Write {
                    p,
                    key,
                    token,
                    accepted,
                });
                true
            }
            Err(v) => {
                self.fail(v);
                false
            }
        }
    }

    fn schedule_holder(&mut self, p: usize) {
        let h = self.holder(p);
        let Some(m) = &h.machine else {
            // Between leases: try again when the wait is over.
            let at = h.next_acquire;
            if !self.procs[p].exited {
                self.wake_at_local(p, at);
            }
            return;
        };
        let mut next = m.poll_timeout().unwrap_or(LocalMs::MAX);
        if m.token().is_some() && (h.writes_left > 0 || h.greedy) {
            next = next.min(h.next_write);
        }
        if let Some(deadline) = m.lifetime().map(|l| l.deadline()) {
            next = next.min(deadline);
        }
        if next < LocalMs::MAX {
            self.wake_at_local(p, next);
        }
    }

    pub(super) fn holder_reply(&mut self, p: usize, req: Req, _sent_local: LocalMs, rep: Rep) {
        let local = self.local(p);
        let Some(reply) = lease_reply(&req, rep) else {
            return;
        };
        if let Some(m) = &mut self.holder(p).machine {
            m.handle_reply(local, reply);
        }
    }
}

/// What a lease request's reply means to a holder machine (the holder's
/// and the campaigner's); `None` for a reply to another kind of request.
pub(super) fn lease_reply(req: &Req, rep: Rep) -> Option<HolderReply> {
    Some(match (req, rep) {
        (Req::Acquire { .. }, Rep::Done(Answer::Grant(r))) => HolderReply::Acquired(r),
        (Req::Acquire { .. }, rep) => HolderReply::Acquired(Err(error_of(&rep))),
        (Req::Renew { .. }, Rep::Done(Answer::Grant(r))) => HolderReply::Renewed(r),
        (Req::Renew { .. }, rep) => HolderReply::Renewed(Err(error_of(&rep))),
        (Req::Release { .. }, Rep::Done(Answer::Unit(r))) => HolderReply::Released(r),
        (Req::Release { .. }, rep) => HolderReply::Released(Err(error_of(&rep))),
        _ => return None,
    })
}
