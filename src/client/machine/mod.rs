//! The client's timing rules as sans-IO state machines: time and store
//! replies in, actions out. No clock reads, no threads, no sleeping, no
//! randomness but a seed (the same purity as [`crate::core`], enforced the
//! same way: `clippy.toml` bans clock reads and thread spawns crate-wide,
//! and this module forbids overriding that).
//!
//! - [`Lifetime`]: one grant's local deadline (L3) and renewal schedule.
//! - [`HolderMachine`]: a lease from the holder's side: acquire (waiting
//!   with backoff), keep alive, notice the loss, release.
//! - [`WorkerMachine`]: a process's worker loop: claims, handler slots,
//!   renewal rounds, the batching completer, idle backoff, the drain rule,
//!   shutdown, and when to fire the queue's schedules (`FireTimer`).
//! - [`ElectionMachine`]: leader election on one key: campaign, lead
//!   (a [`HolderMachine`] per term), lose or resign, campaign again.
//!
//! Each is driven the same way (quinn-proto's shape): call `handle_timeout`
//! when `poll_timeout` says, `handle_reply` with the store's answer to each
//! request, and do what `poll_action` returns until it returns `None`. The
//! keep-alive threads, `Queue::work`, the tokio API, the CLI and the
//! simulator are such drivers, so the simulator checks the code users run.

#![forbid(clippy::disallowed_methods, clippy::disallowed_types)]

mod election;
mod holder;
mod lifetime;
mod scheduler;
mod worker;
mod worker_check;
mod worker_ends;
mod worker_io;
mod worker_replies;

use std::collections::VecDeque;

#[cfg(feature = "canaries")]
pub use election::ElectionBreakage;
pub use election::{Deposed, ElectionAction, ElectionConfig, ElectionEvent, ElectionMachine};
pub use holder::{
    HolderAction, HolderConfig, HolderEvent, HolderMachine, HolderReply, HolderRequest,
};
#[cfg(feature = "canaries")]
pub use lifetime::Breakage;
pub use lifetime::{renew_every, renewal_retry, renewal_wait, run_limit, End, Lifetime};
pub use scheduler::FireReport;
#[cfg(feature = "canaries")]
pub use worker::WorkerBreakage;
pub use worker::WorkerMachine;
pub use worker_io::{
    ClaimId, HandlerOutcome, JobOutcome, StopWhy, WorkerAction, WorkerConfig, WorkerReply,
    WorkerRequest,
};

/// The local instant a reply arrived, for a step that reads it only if
/// it needs it: a [`LocalMs`](crate::time::LocalMs) already read (the
/// simulator, the tests), or a closure that reads the driver's clock (a
/// granted acquire counts from its send time and reads none).
pub trait ReplyTime {
    /// The instant.
    fn read(self) -> crate::time::LocalMs;
}

impl ReplyTime for crate::time::LocalMs {
    fn read(self) -> crate::time::LocalMs {
        self
    }
}

impl<F: FnOnce() -> crate::time::LocalMs> ReplyTime for F {
    fn read(self) -> crate::time::LocalMs {
        self()
    }
}

/// In debug builds, panic naming the machine, the instant and the broken
/// invariant if `check` finds one (release builds skip the check). Each
/// machine calls it after every step (TigerBeetle's style: an invariant
/// fails at the step that breaks it, not at an oracle much later).
pub(crate) fn debug_assert_holds(
    machine: &str,
    now: crate::time::LocalMs,
    check: impl FnOnce() -> Result<(), String>,
) {
    #[cfg(debug_assertions)]
    if let Err(broken) = check() {
        panic!("{machine} machine invariant broken at {now}: {broken}");
    }
    #[cfg(not(debug_assertions))]
    let _ = (machine, now, check);
}

/// An invariant of a machine: `Err` with what broke it unless it holds.
pub(crate) fn ensure(holds: bool, broken: impl FnOnce() -> String) -> Result<(), String> {
    if holds {
        Ok(())
    } else {
        Err(broken())
    }
}

/// A machine's queue of actions, oldest first. Most steps queue one
/// action and the driver takes it before the next step, so the first one
/// waits inline and only one queued behind it allocates (a `VecDeque`
/// alone was an allocation per acquire: one in eight of a lease pair's
/// cost on the mem store, over the store's own).
#[derive(Debug, Clone)]
pub(crate) struct Outbox<T> {
    first: Option<T>,
    rest: VecDeque<T>,
}

impl<T> Outbox<T> {
    pub(crate) const fn new() -> Self {
        Outbox {
            first: None,
            rest: VecDeque::new(),
        }
    }

    /// Queue `action` after every one queued.
    pub(crate) fn push_back(&mut self, action: T) {
        // `first` is older than all of `rest` whenever it is set.
        if self.first.is_none() && self.rest.is_empty() {
            self.first = Some(action);
        } else {
            self.rest.push_back(action);
        }
    }

    /// The oldest action queued.
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        self.first.take().or_else(|| self.rest.pop_front())
    }

    /// The actions queued, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(&self.rest)
    }
}

#[cfg(test)]
mod tests {
    use crate::time::LocalMs;

    #[test]
    #[should_panic(expected = "holder machine invariant broken at 7: two renewals")]
    fn a_broken_invariant_panics_in_debug_builds() {
        super::debug_assert_holds("holder", LocalMs(7), || Err("two renewals".to_owned()));
    }

    #[test]
    fn the_outbox_keeps_its_order() {
        let mut out = super::Outbox::new();
        out.push_back(1);
        out.push_back(2);
        assert_eq!(out.pop_front(), Some(1));
        out.push_back(3);
        assert_eq!(out.iter().copied().collect::<Vec<_>>(), [2, 3]);
        assert_eq!(out.pop_front(), Some(2));
        out.push_back(4);
        assert_eq!(out.pop_front(), Some(3));
        assert_eq!(out.pop_front(), Some(4));
        assert_eq!(out.pop_front(), None);
        out.push_back(5);
        assert_eq!(out.iter().count(), 1);
        assert_eq!(out.pop_front(), Some(5));
    }

    #[test]
    fn a_kept_invariant_is_silent() {
        super::debug_assert_holds("holder", LocalMs(7), || Ok(()));
    }
}
