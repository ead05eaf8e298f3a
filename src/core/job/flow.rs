//! Flow control: what a queue's stored settings allow a claim to start.
//!
//! # State
//! Per queue, a [`QueueConfig`] kept by the store beside its jobs (a row
//! in SQL, an entry in memory): absent means the default, which limits
//! nothing. It is read with the claim's other reads ([`super::Pending`]),
//! so honouring it costs a claim no extra round trip.
//!
//! # Transitions
//! - **pause** sets `paused`; **resume** clears it and wakes idle workers
//!   ([`Wake::JobReady`]), so they claim at once rather than at their next
//!   poll. Both are idempotent and answer whether they changed anything.
//!
//! # Invariants
//! - **F2** A claim of a paused queue starts nothing: it still brings the
//!   queue up to date (claims that ran out are retried or dead as ever),
//!   running jobs keep their claims, renew and settle, and pushes are
//!   accepted; only `claim` is refused, and it answers no jobs rather
//!   than an error, so a worker on a paused queue idles as on an empty one
//!   ([`super::next_change_in`] answers "nothing by time alone": the
//!   worker sleeps until a wake-up or its idle poll).

use crate::core::{check_key, Txn, Wake};
use crate::error::{Field, Result};

/// A queue's stored flow-control settings ([`set_paused`]); the default
/// (what a queue never configured has) limits nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueConfig {
    /// No claim starts a job of this queue (F2) until it is resumed.
    pub paused: bool,
}

/// The stored settings of `queue` (the default if it has none).
pub fn queue_config(tx: &mut dyn Txn, queue: &str) -> Result<QueueConfig> {
    check_key(Field::Queue, queue)?;
    tx.jobs()?.queue_config(queue)
}

/// Pause (`true`) or resume (`false`) `queue`, fleet-wide and durably:
/// while paused, no claim starts one of its jobs (F2); running jobs keep
/// running, and pushes are accepted. Resuming wakes idle workers. Returns
/// whether the queue's state changed (false: it already was so).
pub fn set_paused(tx: &mut dyn Txn, queue: &str, paused: bool) -> Result<bool> {
    check_key(Field::Queue, queue)?;
    let tx = tx.jobs()?;
    let mut config = tx.queue_config(queue)?;
    if config.paused == paused {
        return Ok(false);
    }
    config.paused = paused;
    tx.put_queue_config(queue, &config)?;
    if !paused {
        // Its ready jobs are claimable again: idle workers claim now.
        tx.journal().wake(Wake::JobReady);
    }
    Ok(true)
}
