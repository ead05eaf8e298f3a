//! A campaigner: the real [`ElectionMachine`] decides when to campaign,
//! renew, when a term is lost and whether this process may act as leader;
//! around it, the leader's work writes to the protected resource while the
//! machine says it leads (L3 for the leader's work, checked by the
//! oracle), and now and then steps down. In the heal phase the leader is
//! killed and the oracle checks that another takes over within the dead
//! leader's lease plus the campaign's retry (E1); then everyone resigns.

use super::msg::{Line, Rep, Req};
use super::{RoleState, Sim};
use crate::plan::Canary;
use leasehold::client::machine::{
    ElectionAction, ElectionBreakage, ElectionConfig, ElectionEvent, ElectionMachine, HolderConfig,
    HolderRequest,
};
use leasehold::LocalMs;
use rand::Rng;

/// Longest wait between two campaign attempts (the holder machine's
/// backoff cap), which a takeover may add to the dead leader's lease.
const RETRY_MAX_MS: u64 = 250;

#[derive(Debug, Clone)]
pub(super) struct CampaignerState {
    key: usize,
    machine: ElectionMachine,
    next_write: LocalMs,
    greedy: bool,
    resigning: bool,
}

impl Sim<'_> {
    pub(super) fn new_campaigner(&mut self, p: usize, key: usize) -> CampaignerState {
        let seed = self.procs[p].rng.random();
        let cfg = ElectionConfig {
            lease: HolderConfig {
                ttl_ms: self.plan.ttl_ms,
                limit: 1,
                wait_ms: 0,
                drift: self.drift,
                keep_alive: true,
                seed,
                busy_ms: u64::MAX,
            },
            once: false,
        };
        let breakage = ElectionBreakage {
            ignores_deadline: self.plan.canary == Some(Canary::LeaderIgnoresDeadline),
        };
        let local = self.local(p);
        CampaignerState {
            key,
            machine: ElectionMachine::new(cfg, local).with_breakage(breakage),
            next_write: LocalMs::ZERO,
            greedy: false,
            resigning: false,
        }
    }

    fn campaigner(&mut self, p: usize) -> &mut CampaignerState {
        match &mut self.procs[p].state {
            RoleState::Campaigner(c) => c,
            _ => unreachable!("p{p} is a campaigner"),
        }
    }

    /// A burst: campaign now, whatever the backoff says.
    pub(super) fn campaign_now(&mut self, p: usize) {
        let local = self.local(p);
        self.campaigner(p).machine.handle_wake(local);
    }

    pub(super) fn poll_campaigner(&mut self, p: usize) {
        let local = self.local(p);
        if self.e1_armed
            && !self.procs[p].forked_child
            && self.campaigner(p).machine.is_leader(local)
        {
            return self.kill_leader(p);
        }
        if self.healing && self.e1_done && !self.campaigner(p).resigning {
            let c = self.campaigner(p);
            c.resigning = true;
            c.machine.resign(local);
        }
        self.campaigner(p).machine.handle_timeout(local);
        if let Err(broken) = self.campaigner(p).machine.check(local) {
            let detail = format!("p{p}'s election machine at local {local}: {broken}");
            return self.fail(self.violation_at("invariant", detail));
        }
        self.act_campaigner(p);
        if self.procs[p].exited {
            return;
        }
        self.leader_work(p);
        let c = self.campaigner(p);
        if c.machine.is_done() {
            return self.exit(p);
        }
        let mut next = c.machine.poll_timeout().unwrap_or(LocalMs::MAX);
        if c.machine.is_leader(local) {
            next = next.min(c.next_write);
        }
        if let Some(deadline) = c.machine.deadline() {
            next = next.min(deadline);
        }
        if next < LocalMs::MAX {
            self.wake_at_local(p, next);
        }
    }

    /// Do what the machine asks.
    fn act_campaigner(&mut self, p: usize) {
        while let Some(action) = self.campaigner(p).machine.poll_action() {
            let local = self.local(p);
            let key = self.campaigner(p).key;
            let gen = self.procs[p].gen;
            match action {
                ElectionAction::Send(request) => {
                    let req = match request {
                        HolderRequest::Acquire => Req::Acquire { key },
                        HolderRequest::Renew { token } => Req::Renew { key, token },
                        HolderRequest::Release { token } => Req::Release { key, token },
                    };
                    self.send(p, req);
                }
                ElectionAction::Event(ElectionEvent::Elected { token }) => {
                    self.note(Line::Note(format!("p{p}.{gen} elected with token {token}")));
                    let greedy = self.procs[p].rng.random_bool(0.3);
                    let c = self.campaigner(p);
                    c.next_write = local;
                    c.greedy = greedy;
                }
                ElectionAction::Event(ElectionEvent::Deposed(why)) => {
                    self.note(Line::Note(format!("p{p}.{gen} deposed: {why}")));
                }
                ElectionAction::Event(ElectionEvent::Leader(info)) => {
                    let line = format!("p{p}.{gen} sees the leader's token {}", info.token);
                    self.note(Line::Note(line));
                }
                ElectionAction::Event(ElectionEvent::Failed(_)) => {
                    // A forked child's handle: it gives up and exits.
                    return self.exit(p);
                }
            }
        }
    }

    /// The leader's work: writes to the protected resource while the
    /// machine says it leads; a step down now and then.
    fn leader_work(&mut self, p: usize) {
        let local = self.local(p);
        let fork_ok =
            !self.procs[p].forked_child || self.plan.canary == Some(Canary::ForkReusesHandle);
        let c = self.campaigner(p);
        let (Some(token), true) = (c.machine.token(), c.machine.is_leader(local)) else {
            return;
        };
        if !fork_ok || local < c.next_write {
            return;
        }
        let (key, greedy, deadline) = (
            c.key,
            c.greedy,
            c.machine.deadline().unwrap_or(LocalMs::ZERO),
        );
        if !self.protected_write(p, key, token) {
            return;
        }
        let rng = &mut self.procs[p].rng;
        let gap = rng.random_range(1..=(self.plan.ttl_ms / 4).max(1));
        let step_down = !self.healing && rng.random_bool(0.03);
        let c = self.campaigner(p);
        c.next_write = local + gap;
        if greedy {
            // Land a write on the last valid local millisecond.
            c.next_write = c
                .next_write
                .min(deadline.saturating_sub_ms(1))
                .max(local + 1);
        }
        if step_down {
            c.machine.step_down(local);
            self.act_campaigner(p);
        }
    }

    pub(super) fn campaigner_reply(&mut self, p: usize, req: Req, rep: Rep) {
        let local = self.local(p);
        if let Some(reply) = super::holder::lease_reply(&req, rep) {
            self.campaigner(p).machine.handle_reply(local, reply);
        }
    }

    /// The heal phase of an election: the next process seen leading is
    /// killed (E1 then wants a successor in time).
    pub(super) fn heal_election(&mut self) {
        self.e1_armed = true;
    }

    /// Kill the leader `p`: another must be granted the key within its
    /// lease plus the campaign's retry (E1).
    fn kill_leader(&mut self, p: usize) {
        self.e1_armed = false;
        self.note(Line::Note(format!("heal: the leader p{p} is killed")));
        self.kill(p, 2 * self.plan.ttl_ms);
        let live_end = self.oracle.live_until(0, self.now).unwrap_or(self.now);
        let slack = RETRY_MAX_MS * 21 / 20 + 2 * self.plan.max_latency_ms() + 5;
        self.e1_by = Some(live_end.max(self.now) + slack);
    }

    /// A new grant of `key` (E1 in the heal phase of an election).
    pub(super) fn election_granted(&mut self, key: usize) {
        let (Some(by), false, true) = (self.e1_by, self.e1_done, self.healing) else {
            return;
        };
        if key != 0 {
            return;
        }
        if self.now > by {
            let detail = format!(
                "the dead leader was replaced at t={}, after the bound t={by}",
                self.now
            );
            return self.fail(self.violation_at("E1", detail));
        }
        self.e1_done = true;
        self.note(Line::Note("heal: a new leader took over in time".into()));
    }

    /// E1 at the end: a leader was elected after the faults, and a
    /// successor took over from it in time.
    pub(super) fn final_election_checks(&mut self) {
        if self.e1_armed {
            let detail = "nobody was elected after the faults stopped".to_owned();
            return self.fail(self.violation_at("E1", detail));
        }
        if let (Some(by), false) = (self.e1_by, self.e1_done) {
            let detail = format!("nobody took over the dead leader's key (bound t={by})");
            self.fail(self.violation_at("E1", detail));
        }
    }
}
