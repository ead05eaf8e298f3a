//! Uniqueness: which existing job with a spec's unique key makes a push
//! return it instead of creating another.
//!
//! # The rule
//! A job with the same queue and unique key *blocks* a push when its state
//! is one of the spec's [`JobSpec::unique_states`] and, with a period
//! ([`JobSpec::unique_for`]), it was pushed within the period before now
//! (`created_at > now - period`). Without states, a spec blocks on the
//! live states (ready, scheduled, running, and waiting since dependencies: the default since the first
//! version) or, with a period, on every state: "no second job with this
//! key pushed within the hour, whatever became of the first". A blocked
//! push creates nothing and answers the blocking job's id
//! ([`EnqueueOutcome::created`] false).
//!
//! # Invariants
//! - **U1** Two pushes with one key never both create a job while the
//!   first would block the second: the lookup and the insert are one
//!   transaction, and stores whose transactions run side by side take a
//!   lock on the key first ([`JobTxn::lock_unique`]).
//! - A job's state is judged fresh: a running job whose claim ran out, or
//!   a scheduled one now due, is brought up to date before it is judged
//!   (it may be ready again, or dead), so the lookup reads running jobs
//!   whatever the states asked, and scheduled ones when ready blocks.

use super::rules::load_fresh;
use super::{EnqueueOutcome, JobId, JobSpec, JobState, QueuePolicy};
use crate::core::JobTxn;
use crate::error::{Error, Field, Result};
use std::fmt;

/// The most candidate jobs one push judges (jobs with its key, in states
/// that might block it); past them it creates the job.
pub const UNIQUE_READ: usize = 256;

/// A set of job states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StateSet(u8);

impl StateSet {
    /// Ready, scheduled, running and waiting: what a unique key blocks on
    /// by default.
    pub const LIVE: StateSet = StateSet(0b1_000_111);
    /// Every state.
    pub const ALL: StateSet = StateSet(0b1_111_111);

    /// The set of `states`.
    pub fn of(states: &[JobState]) -> StateSet {
        StateSet(states.iter().fold(0, |bits, s| bits | 1 << s.code()))
    }

    /// Whether `state` is in the set.
    pub fn contains(self, state: JobState) -> bool {
        self.0 & (1 << state.code()) != 0
    }

    /// The set with `state` added.
    pub fn with(self, state: JobState) -> StateSet {
        StateSet(self.0 | 1 << state.code())
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every state of the set is a live one.
    pub fn is_live(self) -> bool {
        self.0 & !StateSet::LIVE.0 == 0
    }

    /// The set as a bit mask over [`JobState::code`] (bit `1 << code`), as
    /// stores filter by it.
    #[doc(hidden)]
    pub fn bits(self) -> u8 {
        self.0
    }

    /// `ready,scheduled` (names of [`JobState::as_str`], comma-separated,
    /// at least one); an error names `field`.
    pub fn parse(field: Field, text: &str) -> Result<StateSet> {
        let mut set = StateSet::default();
        for name in text.split(',').map(str::trim) {
            let state = JobState::parse(name).map_err(|e| match e {
                Error::Invalid { reason, .. } => Error::invalid(field, reason),
                other => other,
            })?;
            set = set.with(state);
        }
        Ok(set)
    }
}

impl fmt::Display for StateSet {
    /// The states' names, comma-separated, in [`JobState::ALL`]'s order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = (JobState::ALL.into_iter())
            .filter(|s| self.contains(*s))
            .map(JobState::as_str)
            .collect();
        f.write_str(&names.join(","))
    }
}

/// Check a spec's uniqueness options (a period or states need a key; a
/// period within a year; at least one state).
pub(super) fn check(spec: &JobSpec) -> Result<()> {
    let (period, states) = (spec.unique_for, spec.unique_states);
    if spec.unique_key.is_none() && (period.is_some() || states.is_some()) {
        return Err(Error::invalid(
            Field::UniqueKey,
            "a uniqueness period or states need a unique key (--unique KEY)",
        ));
    }
    if let Some(p) = period {
        let ms = u64::try_from(p.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 || ms > crate::core::MAX_TTL_MS {
            let why = format!("{p:?} is outside 1 ms..=one year");
            return Err(Error::invalid(Field::UniqueFor, why));
        }
    }
    if states.is_some_and(StateSet::is_empty) {
        return Err(Error::invalid(Field::UniqueStates, "names no state"));
    }
    Ok(())
}

/// The job with `spec`'s unique key that blocks pushing it into `queue`
/// now, if any (see the module docs). The key is locked first.
pub(super) fn blocking(
    tx: &mut dyn JobTxn,
    queue: &str,
    spec: &JobSpec,
    policy: &QueuePolicy,
) -> Result<Option<EnqueueOutcome>> {
    let Some(key) = &spec.unique_key else {
        return Ok(None);
    };
    tx.lock_unique(queue, key)?;
    let now_ms = tx.now_ms();
    let period_ms = spec
        .unique_for
        .map(|p| u64::try_from(p.as_millis()).unwrap_or(u64::MAX));
    let states = spec.unique_states.unwrap_or(match period_ms {
        Some(_) => StateSet::ALL,
        None => StateSet::LIVE,
    });
    // Pushed within the period: created after now - period.
    let since_ms = period_ms.map_or(0, |p| now_ms.saturating_sub(p).saturating_add(1));
    // Stored states lag time: a running job may have run out into any
    // other state, a scheduled one may be due (ready).
    // A waiting job too: it may be decided by jobs that ended by time.
    let mut read = states.with(JobState::Running).with(JobState::Waiting);
    if states.contains(JobState::Ready) {
        read = read.with(JobState::Scheduled);
    }
    for id in tx.unique_jobs(queue, key, read, since_ms, UNIQUE_READ)? {
        match load_fresh(tx, id, policy) {
            Ok(job) if states.contains(job.state) => {
                return Ok(Some(EnqueueOutcome { id, created: false }));
            }
            Ok(_) | Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// A live job of `queue` other than `id` holding unique key `key` (what
/// keeps a retry from reviving a second holder), if any.
pub(super) fn live_holder(
    tx: &mut dyn JobTxn,
    queue: &str,
    key: &str,
    id: JobId,
    policy: &QueuePolicy,
) -> Result<Option<JobId>> {
    tx.lock_unique(queue, key)?;
    for other in tx.unique_jobs(queue, key, StateSet::LIVE, 0, UNIQUE_READ)? {
        if other != id && !load_fresh(tx, other, policy)?.state.is_terminal() {
            return Ok(Some(other));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_sets_parse_print_and_refuse_by_name() {
        let set = StateSet::parse(Field::UniqueStates, "scheduled, ready").unwrap();
        assert_eq!(set, StateSet::of(&[JobState::Ready, JobState::Scheduled]));
        assert_eq!(set.to_string(), "ready,scheduled");
        assert!(set.is_live() && !set.contains(JobState::Running));
        assert!(!StateSet::ALL.is_live());
        assert_eq!(
            StateSet::LIVE.to_string(),
            "ready,scheduled,running,waiting"
        );
        let e = StateSet::parse(Field::UniqueStates, "ready,finished").unwrap_err();
        assert!(e.to_string().contains("unique_states"), "{e}");
        assert!(StateSet::parse(Field::UniqueStates, "").is_err());
        let twice = StateSet::of(&[JobState::Ready, JobState::Ready]);
        assert_eq!(
            twice,
            StateSet::of(&[JobState::Ready]),
            "a state named twice"
        );
    }

    #[test]
    fn a_period_of_one_year_is_a_period() {
        let year = std::time::Duration::from_millis(crate::core::MAX_TTL_MS);
        let spec = |p| JobSpec {
            unique_key: Some("k".into()),
            unique_for: Some(p),
            ..JobSpec::new("x")
        };
        assert!(check(&spec(year)).is_ok());
        let over = year + std::time::Duration::from_millis(1);
        assert!(check(&spec(over)).is_err());
        assert!(check(&spec(std::time::Duration::from_millis(1))).is_ok());
    }
}
