//! The oracle: checks every guarantee against what actually happened, in
//! true time, as the store applies operations and holders act.
//!
//! It records, per lease token and per job claim, which process incarnation
//! owns it and the interval of true time during which the store considered
//! it live (start at grant, end at expiry as extended by renewals, or at
//! release/settle). Then:
//! - L1: a grant at `t` finds fewer than `limit` other live grants of the key.
//! - L2: each new grant's token is above every earlier one of the key.
//! - L3 (strict runs, clocks within the bound): every resource write lies
//!   inside its token's live interval. In every run, the fenced resource
//!   accepts a write only if its token is at least the highest accepted.
//! - L5/Q2: every accepted renew, release, write, heartbeat, complete or
//!   fail comes from the incarnation that owns the token; a job is completed
//!   at most once, by its current claim.
//! - Q1: a claim at `t` finds the job's previous claim ended.
//! - Q3-Q5, S1: the reference model, run in lockstep with the store, must
//!   agree with every outcome; counts are compared at the end.
//! - B1 (the worker loop's completer): every outcome a handler reports is
//!   sent to the store in a settle batch (again after a transient error),
//!   unless its process dies first; every outcome sent is one a handler
//!   reported, with the same verdict (a give-back, and the loop's failure
//!   of a job whose run-time limit passed before it started, are the
//!   loop's own).
//! - B2 (the worker loop's reports, what `observe` and the CLI's log
//!   see): each claim's outcome is reported once, and only once the loop
//!   is done with that claim: nothing is sent for a claim (no renewal, no
//!   settle) after its outcome was reported.
//! - P1 (schedules): every tick becomes at most one job.
//! - F1: no claim makes the queue's live claims exceed its concurrency
//!   limit, nor the live claims of one concurrency key its per-key limit,
//!   at the claim's instant (a claim's interval ends at its settle or its
//!   expiry, as for Q1).
//! - F2: no claim applied while the queue is paused starts a job.
//! - F3: no claim of a job with a run-time limit is granted or renewed
//!   past its claim instant plus the limit.
//! - U1: a push with a unique key creates a job exactly when no job of
//!   the queue with the key blocks it (in a blocking state and, with a
//!   period, pushed within it): the reference model's answer, from the
//!   rule's statement.
//! - D1: no job is claimed before every job it names ended (done, unless
//!   it runs after any ending). D2: no job the model decided (every job
//!   it names ended, or one failed) is still waiting in the store, read
//!   after each operation and at the end.
//! - F4: under a rate of N per W, no window of length W holds more than N
//!   starts of the queue (or of one concurrency key), counting the starts
//!   since the rate was last set.
//! - L4, Q3 liveness, E1 (a dead leader replaced within its lease plus the
//!   campaign's retry) and P2 (every tick due before the heal phase fired
//!   by the workers): checked by the simulator around the heal phase.

use crate::model::{Model, Outcome};
use flow::within_deadline;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

mod completer;
mod flow;

/// Who: a process index and its incarnation (a restart is a new owner).
pub type Owner = (usize, u32);

/// A broken guarantee.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which guarantee ("L1", "Q2", ...).
    pub guarantee: &'static str,
    /// What happened.
    pub detail: String,
    /// True time.
    pub at_ms: u64,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} violated at t={} ms: {}",
            self.guarantee, self.at_ms, self.detail
        )
    }
}

#[derive(Debug, Clone)]
struct Interval {
    owner: Owner,
    start_ms: u64,
    end_ms: u64,
}

impl Interval {
    fn live_at(&self, t: u64) -> bool {
        self.start_ms <= t && t < self.end_ms
    }
}

/// The oracle's record of the run.
#[derive(Debug)]
pub struct Oracle {
    /// The reference model, stepped with every applied operation.
    pub model: Model,
    limits: Vec<u32>,
    grants: BTreeMap<(usize, u64), Interval>,
    last_token: BTreeMap<usize, u64>,
    accepted: BTreeMap<usize, u64>,
    claims: BTreeMap<u64, Vec<(u64, Interval)>>,
    completed: BTreeMap<u64, Owner>,
    /// Claims (job, token) whose settle the store accepted: a settle sent
    /// again after a lost answer is accepted again with no effect.
    settled: BTreeSet<(u64, u64)>,
    /// B1: outcomes handlers reported, by (owner, job, token): whether it
    /// completed, and whether a settle batch carried it yet.
    reported: BTreeMap<(Owner, u64, u64), (bool, bool)>,
    /// B2: the claims whose outcome each worker reported, by (owner, job,
    /// token).
    reports: BTreeSet<(Owner, u64, u64)>,
    /// P1: the unique keys of every tick's job created so far.
    ticks: BTreeSet<String>,
    /// F2: the queue is paused now (as the store applied it).
    paused: bool,
    /// F1: the queue's limits now (as the store applied them).
    queue_limits: leasehold::Limits,
    /// F4: the jobs started since the queue's rates were last set: the
    /// instant and the job's concurrency key.
    starts: Vec<(u64, Option<String>)>,
    strict_l3: bool,
}

type Check = Result<(), Violation>;

fn violation(guarantee: &'static str, at_ms: u64, detail: String) -> Check {
    Err(Violation {
        guarantee,
        detail,
        at_ms,
    })
}

impl Oracle {
    /// An oracle for keys with these limits.
    pub fn new(model: Model, limits: Vec<u32>, strict_l3: bool) -> Self {
        Oracle {
            model,
            limits,
            grants: BTreeMap::new(),
            last_token: BTreeMap::new(),
            accepted: BTreeMap::new(),
            claims: BTreeMap::new(),
            completed: BTreeMap::new(),
            settled: BTreeSet::new(),
            reported: BTreeMap::new(),
            reports: BTreeSet::new(),
            ticks: BTreeSet::new(),
            paused: false,
            queue_limits: leasehold::Limits::none(),
            starts: Vec::new(),
            strict_l3,
        }
    }

    /// P1: a schedule's tick became a job (its unique key `NAME@TICK`):
    /// never twice, whichever worker fired it and whatever its clock said.
    pub fn tick_enqueued(&mut self, t: u64, key: &str) -> Check {
        if self.ticks.insert(key.to_owned()) {
            return Ok(());
        }
        violation("P1", t, format!("tick {key} became a job a second time"))
    }

    /// Whether a tick became a job.
    pub fn tick_seen(&self, key: &str) -> bool {
        self.ticks.contains(key)
    }

    /// When the grants of `key` live at `t` end, at the latest.
    pub fn live_until(&self, key: usize, t: u64) -> Option<u64> {
        self.grants
            .range((key, 0)..(key, u64::MAX))
            .filter(|(_, g)| g.live_at(t))
            .map(|(_, g)| g.end_ms)
            .max()
    }

    /// Compare the store's outcome of an operation with the model's.
    pub fn compare(&self, t: u64, what: &str, expect: &Outcome, got: &Outcome) -> Check {
        if expect.accepts(got) {
            return Ok(());
        }
        // A push created a job where the model found one with its unique
        // key that blocks it, or answered one where none does: U1.
        let unique = matches!(
            (expect, got),
            (Outcome::Enqueued { created: a, .. }, Outcome::Enqueued { created: b, .. }) if a != b
        );
        violation(
            if unique { "U1" } else { "model (Q3-Q5/S1)" },
            t,
            format!("{what}: store answered {got:?}, reference model {expect:?}"),
        )
    }

    fn owner_of(&self, key: usize, token: u64) -> Option<Owner> {
        self.grants.get(&(key, token)).map(|g| g.owner)
    }

    /// A grant (new or renewed) applied at `t`.
    pub fn grant(
        &mut self,
        t: u64,
        key: usize,
        owner: Owner,
        token: u64,
        expires: u64,
        renewed: bool,
    ) -> Check {
        if renewed {
            return self.renewed(t, key, owner, token, expires);
        }
        let last = self.last_token.entry(key).or_default();
        if token <= *last {
            return violation(
                "L2",
                t,
                format!("key {key} granted token {token} after token {last}"),
            );
        }
        *last = token;
        let limit = self.limits.get(key).copied().unwrap_or(1) as usize;
        let live: Vec<u64> = self
            .grants
            .range((key, 0)..(key, u64::MAX))
            .filter(|(_, g)| g.live_at(t))
            .map(|(&(_, tok), _)| tok)
            .collect();
        if live.len() >= limit {
            return violation(
                "L1",
                t,
                format!("key {key} granted token {token} to p{}.{} while tokens {live:?} were live (limit {limit})", owner.0, owner.1),
            );
        }
        self.grants.insert(
            (key, token),
            Interval {
                owner,
                start_ms: t,
                end_ms: expires,
            },
        );
        Ok(())
    }

    /// A grant `owner` holds live at `t`: (key, token).
    pub fn live_grant_of(&self, owner: Owner, t: u64) -> Option<(usize, u64)> {
        self.grants
            .iter()
            .find(|(_, g)| g.owner == owner && g.live_at(t))
            .map(|(k, _)| *k)
    }

    /// An accepted renew (an extension).
    pub fn renewed(&mut self, t: u64, key: usize, owner: Owner, token: u64, expires: u64) -> Check {
        match self.grants.get_mut(&(key, token)) {
            Some(g) if g.owner == owner && !g.live_at(t) => violation(
                "L2",
                t,
                format!(
                    "key {key} token {token} extended at {t} after it ended at {}",
                    g.end_ms
                ),
            ),
            Some(g) if g.owner == owner => {
                g.end_ms = expires;
                Ok(())
            }
            Some(g) => violation(
                "L5",
                t,
                format!(
                    "p{}.{} extended key {key} token {token}, granted to p{}.{}",
                    owner.0, owner.1, g.owner.0, g.owner.1
                ),
            ),
            None => violation(
                "L2",
                t,
                format!("renewed unknown token {token} of key {key}"),
            ),
        }
    }

    /// An accepted release.
    pub fn released(&mut self, t: u64, key: usize, owner: Owner, token: u64) -> Check {
        match self.grants.get_mut(&(key, token)) {
            Some(g) if g.owner == owner && !g.live_at(t) => violation(
                "L2",
                t,
                format!(
                    "release of key {key} token {token} accepted at {t} after it ended at {}",
                    g.end_ms
                ),
            ),
            Some(g) if g.owner == owner => {
                g.end_ms = g.end_ms.min(t);
                Ok(())
            }
            Some(g) => violation(
                "L5",
                t,
                format!(
                    "p{}.{} released key {key} token {token}, granted to p{}.{}",
                    owner.0, owner.1, g.owner.0, g.owner.1
                ),
            ),
            None => violation(
                "L5",
                t,
                format!("release of unknown token {token} of key {key} accepted"),
            ),
        }
    }

    /// A write to the protected resource; returns whether the resource
    /// accepts it (it fences when `fencing`).
    pub fn write(
        &mut self,
        t: u64,
        key: usize,
        owner: Owner,
        token: u64,
        fencing: bool,
    ) -> Result<bool, Violation> {
        match self.owner_of(key, token) {
            Some(o) if o == owner => {}
            Some(o) => {
                return Err(Violation {
                    guarantee: "L5",
                    detail: format!(
                        "p{}.{} wrote with key {key} token {token}, granted to p{}.{}",
                        owner.0, owner.1, o.0, o.1
                    ),
                    at_ms: t,
                })
            }
            None => {
                return Err(Violation {
                    guarantee: "L2",
                    detail: format!("write with never-granted token {token} of key {key}"),
                    at_ms: t,
                })
            }
        }
        if self.strict_l3 {
            let g = &self.grants[&(key, token)];
            if !g.live_at(t) {
                let others: Vec<u64> = self
                    .grants
                    .range((key, 0)..(key, u64::MAX))
                    .filter(|(_, g)| g.live_at(t))
                    .map(|(&(_, tok), _)| tok)
                    .collect();
                return Err(Violation {
                    guarantee: "L3",
                    detail: format!(
                        "p{}.{} acted with key {key} token {token} outside its lease [{}, {}); live now: {others:?}",
                        owner.0, owner.1, g.start_ms, g.end_ms
                    ),
                    at_ms: t,
                });
            }
        }
        // One fenced resource per mutex key; a counting lease's holders
        // each act on their own share, so there is nothing to fence.
        let mutex = self.limits.get(key).copied().unwrap_or(1) == 1;
        let highest = self.accepted.entry(key).or_default();
        if fencing && mutex && token < *highest {
            return Ok(false);
        }
        *highest = (*highest).max(token);
        Ok(true)
    }

    /// Jobs claimed at `t`, each `(id, token, lease_until)`.
    pub fn claimed(&mut self, t: u64, owner: Owner, jobs: &[(u64, u64, u64)]) -> Check {
        if self.paused && !jobs.is_empty() {
            let ids: Vec<u64> = jobs.iter().map(|j| j.0).collect();
            return violation(
                "F2",
                t,
                format!(
                    "p{}.{} claimed jobs {ids:?} of the paused queue",
                    owner.0, owner.1
                ),
            );
        }
        for &(id, token, until) in jobs {
            self.after_ended(t, id)?;
            let timeout = self.model.job(id).and_then(|j| j.timeout_ms);
            within_deadline(t, id, t, timeout, until, "claimed")?;
            let history = self.claims.entry(id).or_default();
            if let Some((prev_token, prev)) = history.last() {
                if prev.live_at(t) {
                    return violation(
                        "Q1",
                        t,
                        format!("job {id} claimed by p{}.{} (token {token}) while p{}.{}'s claim (token {prev_token}) runs until {}", owner.0, owner.1, prev.owner.0, prev.owner.1, prev.end_ms),
                    );
                }
            }
            history.push((
                token,
                Interval {
                    owner,
                    start_ms: t,
                    end_ms: until,
                },
            ));
        }
        self.within_limits(t, owner, jobs)?;
        self.within_rates(t, owner, jobs)
    }

    /// D1: a job starts only once every job it names ended (done, unless
    /// it runs after any ending), as the model knows them.
    fn after_ended(&self, t: u64, id: u64) -> Check {
        let Some(job) = self.model.job(id) else {
            return Ok(());
        };
        for &p in &job.after {
            let state = self.model.job(p).map(|p| p.state);
            let ended = match state {
                Some(s) if job.after_any => s.is_terminal(),
                Some(s) => s == leasehold::JobState::Done,
                None => true,
            };
            if !ended {
                let detail = format!("job {id} claimed while job {p} it runs after is {state:?}");
                return violation("D1", t, detail);
            }
        }
        Ok(())
    }

    fn current_claim(
        &mut self,
        t: u64,
        id: u64,
        owner: Owner,
        token: u64,
        what: &str,
    ) -> Result<&mut Interval, Violation> {
        let current = self.claims.get(&id).and_then(|h| h.last());
        let detail = match current {
            Some((tok, c)) if *tok == token && c.owner == owner && !c.live_at(t) => Some(format!(
                "{what} of job {id} by p{}.{} with token {token} accepted at {t}, after its claim ended at {}",
                owner.0, owner.1, c.end_ms
            )),
            Some((tok, c)) if *tok == token && c.owner == owner => None,
            Some((tok, c)) => Some(format!(
                "{what} of job {id} by p{}.{} with token {token} accepted, but the current claim is p{}.{}'s token {tok}",
                owner.0, owner.1, c.owner.0, c.owner.1
            )),
            None => Some(format!("{what} of never-claimed job {id} accepted")),
        };
        if let Some(detail) = detail {
            return Err(Violation {
                guarantee: "Q2",
                detail,
                at_ms: t,
            });
        }
        match self.claims.get_mut(&id).and_then(|h| h.last_mut()) {
            Some((_, c)) => Ok(c),
            None => Err(Violation {
                guarantee: "Q2",
                detail: format!("{what} of never-claimed job {id} accepted"),
                at_ms: t,
            }),
        }
    }

    /// A worker's effect on the outside world while it believes its claim
    /// valid (the job's side effect, before it completes): with clocks
    /// within the bound it must fall inside the claim (L3 for jobs).
    pub fn effect(&mut self, t: u64, id: u64, owner: Owner, token: u64) -> Check {
        let current = self
            .claims
            .get(&id)
            .and_then(|h| h.iter().rev().find(|(tok, _)| *tok == token));
        match current {
            Some((_, c)) if c.owner != owner => violation(
                "L5",
                t,
                format!(
                    "p{}.{} acted on job {id} with token {token}, claimed by p{}.{}",
                    owner.0, owner.1, c.owner.0, c.owner.1
                ),
            ),
            Some((_, c)) if self.strict_l3 && !c.live_at(t) => violation(
                "L3",
                t,
                format!(
                    "p{}.{} acted on job {id} with token {token} outside its claim [{}, {})",
                    owner.0, owner.1, c.start_ms, c.end_ms
                ),
            ),
            Some(_) => Ok(()),
            None => violation(
                "Q2",
                t,
                format!("effect on job {id} with never-granted token {token}"),
            ),
        }
    }

    /// An accepted heartbeat.
    pub fn heartbeat(&mut self, t: u64, id: u64, owner: Owner, token: u64, until: u64) -> Check {
        let timeout = self.model.job(id).and_then(|j| j.timeout_ms);
        let claim = self.current_claim(t, id, owner, token, "heartbeat")?;
        claim.end_ms = until;
        let start = claim.start_ms;
        within_deadline(t, id, start, timeout, until, "renewed")
    }

    /// An accepted complete or fail (the claim's first: an accepted
    /// settle of a claim already settled is the same outcome answered
    /// again, which the model checked).
    pub fn settled(&mut self, t: u64, id: u64, owner: Owner, token: u64, complete: bool) -> Check {
        if !self.settled.insert((id, token)) {
            return Ok(());
        }
        let what = if complete { "complete" } else { "fail" };
        let c = self.current_claim(t, id, owner, token, what)?;
        c.end_ms = c.end_ms.min(t);
        if complete {
            if let Some(first) = self.completed.insert(id, owner) {
                return violation(
                    "Q2",
                    t,
                    format!(
                        "job {id} completed twice (first by p{}.{})",
                        first.0, first.1
                    ),
                );
            }
        }
        Ok(())
    }
}
