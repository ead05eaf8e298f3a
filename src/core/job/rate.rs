//! Rate limits: how many jobs of a queue, or of one concurrency key, may
//! start per window of store time.
//!
//! # Which algorithm, and why
//! An exact **sliding window**: a [`Rate`] of N per W lets a claim start a
//! job at store instant `t` only while fewer than N jobs of its bucket
//! started in `(t - W, t]`. That is what "N per W" reads as, and it is the
//! guarantee the simulator's oracle checks (F4): *no window of length W
//! holds more than N starts*. A token bucket of N refilled at N per W lets
//! up to 2N - 1 start within one W (a full bucket, then its refill), and a
//! fixed window lets 2N start across a boundary; both break that reading.
//! The price is memory: a bucket keeps the instants of its last N starts
//! ([`RateLog`]), so N is at most [`MAX_RATE`] (for more, use a shorter
//! window: 1000/6s rather than 10000/1m).
//!
//! # State
//! Per queue, a bucket for the queue's own rate (stored under the key `""`,
//! which no concurrency key can be), and one per concurrency key under a
//! per-key rate: its [`RateLog`], the instants of its newest starts
//! (ascending, at most N, none older than W once written) and, for a key,
//! when its parked jobs may start again (`wake_at_ms`). Store time only: a
//! store whose clock steps back sees its recent starts as still in the
//! window, which only delays starts.
//!
//! # Transitions
//! - **claim**: the queue's free allowance caps how many the claim takes;
//!   a job whose key has none left is parked (as under a per-key
//!   concurrency limit), and its bucket records when the key's next
//!   allowance comes. Every start is appended to its buckets' logs.
//! - **a key's allowance comes** ([`unpark_due`], in each claim): the
//!   best parked jobs of the key, as many as it may start, are unparked;
//!   an idle worker sleeps until then ([`super::next_look`]).
//! - **purge** ([`super::purge`]) removes the buckets whose newest start
//!   is older than the longest window ([`MAX_WINDOW_MS`]) and that wake
//!   nobody: no window can count them, so keys that came and went leave
//!   nothing behind, and removing them changes no claim.
//!
//! # Invariants
//! - **F4** No window of store time of length W holds more than N starts
//!   of a queue (or of one key) under a rate N/W. Claims of a rate-limited
//!   queue are serialized ([`crate::core::JobTxn::lock_queue`]) and each
//!   reads the log its predecessor wrote. A window that spans a change of
//!   rate counts the starts the old rate's log kept.
//! - A key with parked jobs always has a running job (a concurrency
//!   park, freed by `slot_freed`) or a wake-up instant in its bucket.

use super::JobRecord;
use crate::core::JobTxn;
use crate::error::{Error, Field, Result};
use std::fmt;
use std::sync::Arc;

/// The most starts a rate allows per window (the most instants a bucket
/// keeps).
pub const MAX_RATE: u32 = 1_000;

/// The longest window of a rate: one week.
pub const MAX_WINDOW_MS: u64 = 7 * 24 * 3600 * 1000;

/// The key of a queue's own bucket (a concurrency key is never empty).
pub const QUEUE_BUCKET: &str = "";

/// At most `count` starts in any window of `window_ms` of store time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Starts allowed per window, 1..=[`MAX_RATE`].
    pub count: u32,
    /// The window, in ms, 1..=[`MAX_WINDOW_MS`].
    pub window_ms: u64,
}

impl Rate {
    /// `count` starts per `window_ms` (checked when limits are set).
    pub fn new(count: u32, window_ms: u64) -> Rate {
        Rate { count, window_ms }
    }

    /// `N/DUR`, as the command line takes it: `100/1m`, `1/10s`, `5/s`,
    /// `20/250ms` (units `ms`, `s`, `m`, `h`, `d`; a bare unit is one of
    /// it). `field` names what is parsed in the error.
    pub fn parse(field: Field, text: &str) -> Result<Rate> {
        let bad = |why: &str| {
            Error::invalid(
                field,
                format!("{text:?}: {why} (examples: 100/1m, 1/10s, 5/s)"),
            )
        };
        let (count, window) = text.trim().split_once('/').ok_or_else(|| bad("no '/'"))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| bad("the count is not a whole number"))?;
        let window = window.trim();
        let digits = window
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(window.len());
        let (n, unit) = window.split_at(digits);
        let n: u64 = match n {
            "" => 1,
            n => n.parse().map_err(|_| bad("the window is too long"))?,
        };
        let unit_ms = match unit {
            "ms" => 1,
            "s" | "sec" => 1_000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad("the window's unit is not one of ms, s, m, h, d")),
        };
        let rate = Rate::new(count, n.saturating_mul(unit_ms));
        rate.check(field)?;
        Ok(rate)
    }

    /// Refuse a count outside 1..=[`MAX_RATE`] or a window outside
    /// 1 ms..=[`MAX_WINDOW_MS`].
    pub fn check(&self, field: Field) -> Result<()> {
        if self.count == 0 || self.count > MAX_RATE {
            let why = format!(
                "{} starts per window is outside 1..={MAX_RATE} (for more, use a shorter \
                 window; to start nothing, pause the queue)",
                self.count
            );
            return Err(Error::invalid(field, why));
        }
        if self.window_ms == 0 || self.window_ms > MAX_WINDOW_MS {
            let why = format!(
                "a window of {} ms is outside 1..={MAX_WINDOW_MS} (one week)",
                self.window_ms
            );
            return Err(Error::invalid(field, why));
        }
        Ok(())
    }
}

impl fmt::Display for Rate {
    /// `N/DUR` in the largest unit that divides the window, as parsed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.window_ms;
        let (n, unit) = [
            (86_400_000, "d"),
            (3_600_000, "h"),
            (60_000, "m"),
            (1_000, "s"),
        ]
        .into_iter()
        .find(|(u, _)| w % u == 0)
        .map_or((w, "ms"), |(u, name)| (w / u, name));
        write!(f, "{}/{n}{unit}", self.count)
    }
}

/// One bucket's recent starts (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLog {
    /// Store instants of its newest starts, ascending.
    pub starts: Vec<u64>,
    /// When the key's parked jobs may start again, if some are parked for
    /// its rate.
    pub wake_at_ms: Option<u64>,
}

impl RateLog {
    /// How many of the oldest starts have left `rate`'s window `(now - W,
    /// now]` (in this form, a store clock younger than W counts from 0).
    fn left(&self, rate: Rate, now_ms: u64) -> usize {
        (self.starts).partition_point(|&t| t.saturating_add(rate.window_ms) <= now_ms)
    }

    /// Starts still allowed at `now_ms` under `rate`.
    pub fn free(&self, rate: Rate, now_ms: u64) -> u32 {
        let in_window = self.starts.len() - self.left(rate, now_ms);
        rate.count
            .saturating_sub(u32::try_from(in_window).unwrap_or(u32::MAX))
    }

    /// The first instant after `now_ms` at which a start is allowed, or
    /// `None` if one is allowed now.
    pub fn next_allowance(&self, rate: Rate, now_ms: u64) -> Option<u64> {
        if self.free(rate, now_ms) > 0 {
            return None;
        }
        // The window has room once the N-th newest start has left it.
        let n = usize::try_from(rate.count).unwrap_or(usize::MAX);
        let nth = self.starts[self.starts.len().saturating_sub(n)];
        Some(
            nth.saturating_add(rate.window_ms)
                .max(now_ms.saturating_add(1)),
        )
    }

    /// The first instant after `now_ms` at which a start is allowed were
    /// `n` more started now (`None`: one would still be allowed now).
    pub fn allowance_after(&self, rate: Rate, now_ms: u64, n: usize) -> Option<u64> {
        let mut spent = self.clone();
        spent.record(rate, now_ms, n);
        spent.next_allowance(rate, now_ms)
    }

    /// Record `n` starts at `now_ms`, then keep what `rate` (the rate in
    /// force) can still count: the starts inside its window, at most its
    /// count. Nothing is dropped without a start (the retention is part of
    /// the rule: a later, longer window counts what was kept).
    pub fn record(&mut self, rate: Rate, now_ms: u64, n: usize) {
        if n == 0 {
            return;
        }
        self.starts.extend(std::iter::repeat_n(now_ms, n));
        // A clock that stepped back leaves later instants behind: keep the
        // log ascending (they count as in the window, which only delays).
        if self.starts.windows(2).any(|w| w[0] > w[1]) {
            self.starts.sort_unstable();
        }
        let stale = self.left(rate, now_ms);
        let keep = usize::try_from(rate.count).unwrap_or(usize::MAX);
        let cut = stale.max(self.starts.len().saturating_sub(keep));
        self.starts.drain(..cut);
    }

    /// Whether the bucket holds nothing worth keeping.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty() && self.wake_at_ms.is_none()
    }

    /// The log as stored: each instant as 8 little-endian bytes.
    pub fn encode_starts(&self) -> Vec<u8> {
        self.starts.iter().flat_map(|t| t.to_le_bytes()).collect()
    }

    /// A log read back from [`RateLog::encode_starts`]; a trailing partial
    /// instant (never written) is ignored.
    pub fn decode_starts(bytes: &[u8], wake_at_ms: Option<u64>) -> RateLog {
        let starts = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        RateLog { starts, wake_at_ms }
    }
}

/// The most keys whose allowance came that one claim unparks.
const WAKES_MAX: usize = 128;

/// Unpark the parked jobs of `queue` whose keys' allowance under
/// `per_key_rate` has come, as many per key as it may start now, and
/// merge them into `ready` (claim order, at most `max`): the head of the
/// ready index again. A key that keeps parked jobs wakes again when its
/// next allowance would come were those unparked started now, so no job
/// stays parked while its key has allowance.
pub(super) fn unpark_due(
    tx: &mut dyn JobTxn,
    queue: &str,
    per_key_rate: Rate,
    ready: &mut Vec<JobRecord>,
    max: usize,
) -> Result<()> {
    let now_ms = tx.now_ms();
    let due = tx.rate_wakes(queue, now_ms, WAKES_MAX)?;
    if due.is_empty() {
        return Ok(());
    }
    tx.lock_queue(queue, true)?;
    for (key, _) in due {
        let mut log = tx.rate_log(queue, &key)?;
        let free = usize::try_from(log.free(per_key_rate, now_ms)).unwrap_or(usize::MAX);
        let mut parked = tx.parked(queue, Some(&key), free.saturating_add(1))?;
        let more = parked.len() > free;
        parked.truncate(free);
        log.wake_at_ms = more
            .then(|| log.allowance_after(per_key_rate, now_ms, parked.len()))
            .flatten();
        tx.put_rate_log(queue, &key, &log)?;
        for mut job in parked {
            job.parked = false;
            tx.put_job(&job)?;
            ready.push(job);
        }
    }
    ready.sort_by_key(JobRecord::rank);
    ready.truncate(max);
    Ok(())
}

/// A key's rate bucket as one claim sees it, written back once.
pub(super) struct Bucket {
    pub(super) key: Arc<str>,
    pub(super) log: RateLog,
    pub(super) started: usize,
    pub(super) dirty: bool,
}

impl Bucket {
    /// `key`'s bucket of `queue`, read.
    pub(super) fn read(tx: &mut dyn JobTxn, queue: &str, key: Arc<str>) -> Result<Bucket> {
        let log = tx.rate_log(queue, &key)?;
        Ok(Bucket {
            key,
            log,
            started: 0,
            dirty: false,
        })
    }

    /// Starts still allowed to this claim.
    pub(super) fn free(&self, rate: Rate, now_ms: u64) -> usize {
        let free = usize::try_from(self.log.free(rate, now_ms)).unwrap_or(usize::MAX);
        free.saturating_sub(self.started)
    }

    /// A job of the bucket could not start: its parked jobs wake when the
    /// next allowance comes.
    pub(super) fn blocked(&mut self, rate: Rate, now_ms: u64) {
        let at = self.log.allowance_after(rate, now_ms, self.started);
        if at.is_some() && self.log.wake_at_ms != at {
            self.log.wake_at_ms = at;
            self.dirty = true;
        }
    }

    /// Write the bucket back with this claim's starts.
    pub(super) fn write(mut self, tx: &mut dyn JobTxn, queue: &str, rate: Rate) -> Result<()> {
        if self.started == 0 && !self.dirty {
            return Ok(());
        }
        let now_ms = tx.now_ms();
        self.log.record(rate, now_ms, self.started);
        tx.put_rate_log(queue, &self.key, &self.log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_print_and_refuse_by_name() {
        let r = Rate::parse(Field::Rate, "100/1m").unwrap();
        assert_eq!(r, Rate::new(100, 60_000));
        assert_eq!(r.to_string(), "100/1m");
        assert_eq!(
            Rate::parse(Field::Rate, "5/s").unwrap(),
            Rate::new(5, 1_000)
        );
        assert_eq!(
            Rate::parse(Field::Rate, " 1/10s ").unwrap().to_string(),
            "1/10s"
        );
        assert_eq!(Rate::new(3, 1_500).to_string(), "3/1500ms");
        for (text, window_ms) in [
            ("250/500ms", 500),
            ("1/2m", 120_000),
            ("1/1h", 3_600_000),
            ("1/1d", 86_400_000),
            ("1/7d", 604_800_000),
            ("1/168h", 604_800_000),
        ] {
            let r = Rate::parse(Field::Rate, text).unwrap();
            assert_eq!(r.window_ms, window_ms, "{text}");
            assert_eq!(Rate::parse(Field::Rate, &r.to_string()).unwrap(), r);
        }
        assert!(
            Rate::parse(Field::Rate, "1/169h").is_err(),
            "a week at most"
        );
        for bad in [
            "", "10", "x/1s", "10/", "10/1y", "0/1s", "1001/1s", "1/0s", "1/8d", "-1/1s",
        ] {
            let e = Rate::parse(Field::PerKeyRate, bad).unwrap_err();
            assert!(e.to_string().contains("per_key_rate"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_window_holds_at_most_its_count_and_frees_as_starts_leave_it() {
        let rate = Rate::new(2, 1_000);
        let mut log = RateLog::default();
        assert_eq!(log.free(rate, 0), 2);
        log.record(rate, 100, 1);
        log.record(rate, 400, 1);
        assert_eq!(log.free(rate, 400), 0);
        assert_eq!(log.next_allowance(rate, 400), Some(1_100));
        assert_eq!(log.free(rate, 1_099), 0);
        assert_eq!(log.free(rate, 1_100), 1);
        assert_eq!(log.next_allowance(rate, 1_100), None);
        log.record(rate, 1_100, 1);
        assert_eq!(log.starts, vec![400, 1_100]);
        assert_eq!(log.next_allowance(rate, 1_100), Some(1_400));
        // Without a start nothing is dropped; with one, what the window
        // no longer holds is.
        log.record(rate, 5_000, 0);
        assert_eq!(log.starts, vec![400, 1_100]);
        log.record(rate, 5_000, 1);
        assert_eq!(log.starts, vec![5_000]);
        // A lowered count keeps counting the newest starts.
        let mut log = RateLog::default();
        log.record(Rate::new(5, 1_000), 10, 5);
        assert_eq!(log.free(Rate::new(2, 1_000), 20), 0);
        assert_eq!(log.next_allowance(Rate::new(2, 1_000), 20), Some(1_010));
    }

    #[test]
    fn a_clock_younger_than_the_window_counts_its_first_starts() {
        let rate = Rate::new(1, 300);
        let mut log = RateLog::default();
        log.record(rate, 0, 1);
        assert_eq!(log.free(rate, 0), 0);
        assert_eq!(log.free(rate, 299), 0);
        assert_eq!(log.next_allowance(rate, 1), Some(300));
        assert_eq!(log.free(rate, 300), 1);
    }

    #[test]
    fn a_log_survives_its_encoding_and_a_clock_stepped_back() {
        let rate = Rate::new(3, 1_000);
        let mut log = RateLog::default();
        log.record(rate, 900, 2);
        log.record(rate, 500, 1);
        assert_eq!(log.starts, vec![500, 900, 900]);
        assert_eq!(log.free(rate, 500), 0);
        let mut stepped = RateLog::default();
        stepped.record(rate, 900, 1);
        stepped.record(rate, 500, 1);
        assert_eq!(stepped.starts, vec![500, 900], "kept ascending");
        let back = RateLog::decode_starts(&log.encode_starts(), Some(7));
        assert_eq!(back.starts, log.starts);
        assert_eq!(back.wake_at_ms, Some(7));
    }
}
