//! What a worker loop is given and what it gives back: [`WorkOptions`],
//! [`WorkReport`], and [`fit_reason`] (a handler's failure reason cut to
//! what the store takes). The sync loop (`worker.rs`), the session both
//! loops drive (`session.rs`) and the tokio loop share them.

use super::machine::JobOutcome;
#[cfg(doc)]
use super::{job::ClaimedJob, queue::Queue};
use crate::core;
use std::time::Duration;

/// Options of [`Queue::work`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkOptions {
    /// Lease of each claim; renewal rounds extend it.
    pub lease: Duration,
    /// Most jobs claimed per transaction, and most outcomes committed per
    /// transaction (default 128: with fast handlers a job pays mostly its
    /// share of each transaction's fixed cost; against 64, in one run, 8
    /// handlers did 16-20 % more jobs/s on PostgreSQL, 4-8 % on SQLite).
    /// A higher-priority job pushed meanwhile starts after the jobs already
    /// claimed: 512 made the loop faster (10 % on SQLite, 27 % on
    /// PostgreSQL) but such a job's start 2 to 5 times later (BENCHMARKS.md).
    pub batch: usize,
    /// Handlers running at once (threads).
    pub concurrency: usize,
    /// Jobs claimed ahead of a free handler (bounded prefetch). While
    /// handlers run dry waiting on claims, the loop doubles it, up to twice
    /// `batch`; a claim that finds fewer jobs than it asked for resets it.
    pub prefetch: usize,
    /// Return once the queue is drained ([`crate::core::job::drained`]: no
    /// job ready, running, or due, retries in backoff included).
    pub drain: bool,
    /// Longest sleep between claims when the queue is empty (default
    /// 30 s; each sleep is drawn from its second half): a backstop, not a
    /// poll. Every change that can start a job sooner is announced by the
    /// store, in any process (SQLite's doorbell, PostgreSQL's `NOTIFY`):
    /// a push, a job given back or released, a retry or a delayed job
    /// scheduled, a schedule put, a queue resumed. The announcement wakes
    /// the loop, and an empty claim says when the queue next changes by
    /// time alone (a retry or a delayed job falls due, a claim runs out, a
    /// rate allows a start), which ends the sleep too. On PostgreSQL,
    /// where claims overlap, an empty claim that passed over rows another
    /// worker's claim held locked looks again about 10 ms later, and then
    /// sees that claim (it runs out if its worker dies); if the rows stay
    /// held, its looks back off to one a second. So an idle loop wakes only for this backstop
    /// while nothing happens. Where the store cannot announce other
    /// processes' changes ([`crate::Store::announces_changes`]: a SQLite
    /// database whose doorbell file could not be made), and with `drain`
    /// (the end of a job another worker runs is not announced), the loop
    /// polls instead: empty claims back off from 1 ms to at most a second
    /// (or this, if less).
    pub idle_poll: Duration,
    /// Longest an outcome waits for others to share its transaction.
    pub flush_delay: Duration,
    /// Renewal round interval (`None`: a third of the lease, at most a
    /// second, so a cancel reaches the handler within a second).
    pub heartbeat: Option<Duration>,
    /// After `stop`: how long running handlers may finish before their jobs
    /// are given back (to be retried) and [`ClaimedJob::is_valid`] turns false.
    pub shutdown_grace: Duration,
    /// Sample the queue's jobs per state this often for the
    /// `leasehold_queue_jobs` gauge (`None`: never; each sample is a
    /// transaction that counts the queue).
    pub sample: Option<Duration>,
    /// Fire the queue's schedules ([`Queue::schedule`]): each tick as it
    /// comes due, and a look at least this often for schedules added or
    /// changed elsewhere (`None`: this worker fires none).
    pub schedules: Option<Duration>,
}

impl WorkOptions {
    /// The most handlers a worker loop runs at once (a larger
    /// `concurrency` is taken as this).
    pub const MAX_CONCURRENCY: usize = 1024;

    /// The longest idle wait where the store cannot announce every
    /// change: a poll.
    const UNANNOUNCED_POLL_MS: u64 = 1_000;

    /// The machine's longest idle wait (ms): `idle_poll`, at most a
    /// second where the store's changes go unannounced.
    pub(crate) fn idle_max_ms(&self, announced: bool) -> u64 {
        let ms = super::ms_of(self.idle_poll).max(1);
        if announced {
            ms
        } else {
            ms.min(Self::UNANNOUNCED_POLL_MS)
        }
    }
}

impl Default for WorkOptions {
    fn default() -> Self {
        WorkOptions {
            lease: Duration::from_secs(30),
            batch: 128,
            concurrency: 1,
            prefetch: 1,
            drain: false,
            idle_poll: Duration::from_secs(30),
            flush_delay: Duration::from_millis(1),
            heartbeat: None,
            shutdown_grace: Duration::from_secs(30),
            sample: None,
            schedules: Some(Duration::from_secs(5)),
        }
    }
}

/// What a worker loop did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkReport {
    /// Jobs completed.
    pub completed: u64,
    /// Jobs reported failed.
    pub failed: u64,
    /// Jobs given back at shutdown.
    pub abandoned: u64,
    /// Jobs whose claim was lost (or whose outcome is unknown) before the
    /// outcome was recorded; the store retries them after their lease.
    pub lost: u64,
}

impl WorkReport {
    pub(crate) fn count(&mut self, outcome: JobOutcome) {
        match outcome {
            JobOutcome::Done => self.completed += 1,
            JobOutcome::Failed(_) => self.failed += 1,
            JobOutcome::Abandoned(_) => self.abandoned += 1,
            JobOutcome::Lost => self.lost += 1,
        }
    }
}

/// A failure reason as the store takes it: at most
/// [`crate::core::MAX_TEXT_BYTES`], without NUL. A longer one (a stack
/// trace, captured stderr) keeps its head and its tail around a marker
/// saying how much was cut: the worker loop cannot ask the handler for a
/// shorter one, and losing the job's outcome over its length would be worse.
pub fn fit_reason(reason: &str) -> std::borrow::Cow<'_, str> {
    let max = core::MAX_TEXT_BYTES;
    if reason.len() <= max && !reason.contains('\0') {
        return std::borrow::Cow::Borrowed(reason);
    }
    let clean = reason.replace('\0', "\u{fffd}");
    if clean.len() <= max {
        return std::borrow::Cow::Owned(clean);
    }
    let keep = (max - 64) / 2;
    let mut head = keep;
    while !clean.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = clean.len() - keep;
    while !clean.is_char_boundary(tail) {
        tail += 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}\n[... {} bytes cut ...]\n{}",
        &clean[..head],
        tail - head,
        &clean[tail..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_wait_is_the_backstop_where_announced_and_at_most_a_second_elsewhere() {
        let at = |ms: u64| WorkOptions {
            idle_poll: Duration::from_millis(ms),
            ..WorkOptions::default()
        };
        assert_eq!(WorkOptions::default().idle_max_ms(true), 30_000);
        assert_eq!(WorkOptions::default().idle_max_ms(false), 1_000);
        assert_eq!(at(250).idle_max_ms(false), 250, "a shorter poll is kept");
        assert_eq!(at(90_000).idle_max_ms(true), 90_000);
        assert_eq!(at(0).idle_max_ms(true), 1, "never zero: no busy loop");
    }
}
