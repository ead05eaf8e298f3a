//! The rules: pure lease and job-claim state machines.
//!
//! Nothing in this module reads a clock, touches a file or socket, spawns a
//! thread or draws unseeded randomness (`clippy.toml` forbids it and CI runs
//! clippy with `-D warnings`). Time is an argument (`now_ms`, read by the store
//! from its clock once per transaction), storage is the [`Txn`] trait, and
//! jitter comes from a seed the caller passes in. This is the only place the
//! rules live: stores map records to memory, rows or files and make a
//! transaction atomic; they never decide anything.
//!
//! # Leases ([`lease`])
//! State per key: a [`LeaseRecord`] with the key's `last_token` counter and
//! up to `limit` holder slots, each with its own token and `expires_at_ms`.
//! A slot is live while `now_ms < expires_at_ms`.
//! Transitions: acquire (new slot, token = ++last_token; by a current holder:
//! extend its slot, same token), renew (extend a live slot named by holder
//! and token), release (remove it), inspect.
//! Invariants: live slots <= limit (L1 for limit 1); `last_token` never
//! decreases and every grant gets a token greater than all earlier ones for the
//! key, because the record and its counter outlive every slot (L2); only the
//! holder id + token of a live slot can renew or release it (L5).
//!
//! # Jobs ([`job`])
//! State per job: a [`JobRecord`] in one of [`JobState`]; a running job
//! carries a claim (holder, token, `lease_until_ms`).
//! Transitions: enqueue (-> ready, or scheduled until `run_at_ms`), promote
//! (scheduled -> ready once due), claim (ready -> running, attempts += 1,
//! token = ++last_token), heartbeat (extend the claim), complete (-> done),
//! fail (-> scheduled with backoff, or dead after `max_attempts`), abandon
//! (running -> ready at once, the attempt given back if never started),
//! expire (running past its lease -> scheduled, or dead), cancel, retry,
//! purge.
//! Invariants: a job has at most one claim and only a running job has one
//! (Q1); complete/fail/heartbeat need the current token of an unexpired
//! claim (Q2); every job is in exactly one state and every transition moves
//! it between states without losing it (Q3); attempts grow at claim and a job
//! is dead once they reach `max_attempts` (Q4); claim takes the ready job
//! with the highest priority, then earliest `run_at_ms`, then lowest id (Q5).
//! Per queue, stored settings ([`QueueConfig`], `job::flow`) limit what a
//! claim may start: no claim makes a queue's running jobs exceed its
//! concurrency limit, nor one concurrency key's its per-key limit (F1); a
//! paused queue starts nothing (F2).
//!
//! # Schedules ([`schedule`])
//! State per queue and name: a [`ScheduleRecord`] with its rule and the
//! cursor of its next tick. Transitions: put, remove, fire (the ticks due
//! become jobs with a unique key per tick, the cursor moves past them in
//! the same transaction). Invariant: each tick is handled once.
//!
//! Every operation decides before it changes anything: a rule error (held,
//! lost, invalid) leaves the records untouched, so a store's rollback is only
//! ever needed for its own I/O errors (S1).
//!
//! # Storage ([`Txn`], [`JobTxn`])
//! The core asks for what it needs, on purpose: lease records by key; job
//! records by id; a queue's schedules; one batched read of a queue's
//! expired, due and ready jobs ([`JobTxn::pending`]); two ordered scans;
//! and, for people looking at the store, paged listings of held keys,
//! queues and one state's jobs, capped counts and a histogram of finished
//! jobs, each read from an index. It records in the
//! transaction's [`Journal`] the wake-ups it causes (a lease freed, a job
//! made ready), which the store delivers on commit, and the transitions it
//! makes ([`Event`]), which the store layer traces and counts on commit. A store that keeps no jobs says so in
//! one place ([`Txn::jobs`]).

mod backoff;
#[doc(hidden)]
pub mod event;
pub mod job;
pub mod lease;
pub mod schedule;
mod txn;

pub use backoff::Backoff;
#[doc(hidden)]
pub use event::{Event, JobChange, LeaseChange};
pub use job::{
    backoff_ms, Claim, ClaimRank, EnqueueOutcome, HeartbeatReply, JobCursor, JobId, JobPeek,
    JobRecord, JobSpec, JobState, Limits, QueueConfig, QueuePolicy, QueueSummary, Rate, RateLog,
    StateCounts, StateSet, SummaryOptions,
};
pub use lease::{
    local_deadline_ms, local_lapse_ms, DriftBound, Grant, LeaseInfo, LeasePage, LeaseRecord,
    LeaseSlot,
};
pub use schedule::{Missed, Rule, ScheduleRecord, ScheduleSpec};
#[doc(hidden)]
pub use txn::Exported;
pub use txn::{JobQuery, JobTxn, Journal, Pending, Txn, Wake};

use crate::error::Field;
use crate::error::{Error, Result};
use std::fmt;
use std::sync::Arc;

/// Longest accepted lease or claim TTL: one year.
pub const MAX_TTL_MS: u64 = 365 * 24 * 3600 * 1000;
/// Longest accepted key or queue name, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest accepted holder label, unique key or error text, in bytes.
pub const MAX_TEXT_BYTES: usize = 4096;
/// Largest accepted job payload.
pub const MAX_PAYLOAD_BYTES: usize = 16 * 1024 * 1024;
/// Most holders a counting lease may allow.
pub const MAX_LEASE_LIMIT: u32 = 1024;
/// Most attempts a job may allow.
pub const MAX_ATTEMPTS: u32 = 10_000;
/// Most items one call may take or return: jobs claimed in one batch,
/// pushed in one `push_many`, a listing's page.
pub const MAX_BATCH: usize = 10_000;
/// Most payload bytes one `push_many` may carry in all (a batch becomes
/// one statement on PostgreSQL, its payloads written out in hex).
pub const MAX_BATCH_PAYLOAD_BYTES: usize = 32 * 1024 * 1024;

/// A holder's identity: a random UUID, fixed for the life of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderId(pub u128);

impl HolderId {
    /// Parse the hyphenated UUID form.
    pub fn parse(text: &str) -> Result<Self> {
        uuid::Uuid::parse_str(text)
            .map(|u| HolderId(u.as_u128()))
            .map_err(|e| Error::invalid(Field::Holder, format!("{text:?} is not a UUID: {e}")))
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&uuid::Uuid::from_u128(self.0).hyphenated(), f)
    }
}

/// Who holds a lease: an id plus an optional human label (host, pid, start
/// time) so that "who holds it?" has an answer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Holder {
    /// The identity compared by every rule.
    pub id: HolderId,
    /// Free text for people; never compared.
    pub label: Option<Arc<str>>,
}

impl Holder {
    /// A holder with no label.
    pub fn new(id: HolderId) -> Self {
        Holder { id, label: None }
    }

    /// A holder with a label.
    pub fn with_label(id: HolderId, label: &str) -> Result<Self> {
        check_text(Field::HolderLabel, label)?;
        Ok(Holder {
            id,
            label: Some(Arc::from(label)),
        })
    }
}

/// One live holder as reported by inspect or by a [`Error::Held`] answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderInfo {
    /// Who.
    pub holder: Holder,
    /// The fencing token of its grant.
    pub token: u64,
    /// When its slot expires, on the store's clock (ms).
    pub expires_at_ms: u64,
}

impl fmt::Display for HolderInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.holder.id)?;
        if let Some(label) = &self.holder.label {
            write!(f, " ({label})")?;
        }
        write!(
            f,
            " with token {} until {} ms",
            self.token, self.expires_at_ms
        )
    }
}

/// Check a key or queue name: 1..=[`MAX_KEY_BYTES`] bytes, no NUL, no
/// control characters. Any other text (slashes, `..`, unicode) is a valid
/// key; stores that map keys to file names encode them.
#[doc(hidden)]
pub fn check_key(field: Field, key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::invalid(
            field,
            format!("{} bytes is longer than {MAX_KEY_BYTES}", key.len()),
        ));
    }
    if has_control(key) {
        return Err(Error::invalid(
            field,
            format!("{key:?} contains a control character"),
        ));
    }
    Ok(())
}

/// Whether `text` holds a control character ([`char::is_control`]: C0,
/// DEL and C1), read from its bytes without decoding: C0 and DEL are
/// single bytes, and C1 (U+0080..=U+009F) is `0xC2` then `0x80..=0x9F`
/// in UTF-8 (a `0xC2` byte is always the first of a character).
fn has_control(text: &str) -> bool {
    let bytes = text.as_bytes();
    // Most keys are printable ASCII: one pass the compiler vectorises.
    if bytes.iter().all(|&b| b.wrapping_sub(0x20) < 0x5f) {
        return false;
    }
    bytes.iter().enumerate().any(|(i, &b)| {
        b < 0x20 || b == 0x7f || (b == 0xc2 && matches!(bytes.get(i + 1), Some(0x80..=0x9f)))
    })
}

/// Check free text (labels, unique keys, error reasons): at most
/// [`MAX_TEXT_BYTES`] bytes and no NUL.
#[doc(hidden)]
pub fn check_text(field: Field, text: &str) -> Result<()> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(Error::invalid(
            field,
            format!("{} bytes is longer than {MAX_TEXT_BYTES}", text.len()),
        ));
    }
    if text.contains('\0') {
        return Err(Error::invalid(field, "contains a NUL byte"));
    }
    Ok(())
}

/// Check how many items one call may take or return (a batch claim, a
/// listing's page): 1..=[`MAX_BATCH`].
pub(crate) fn check_count(field: Field, n: usize) -> Result<()> {
    if n == 0 || n > MAX_BATCH {
        return Err(Error::invalid(
            field,
            format!("{n} is outside 1..={MAX_BATCH}"),
        ));
    }
    Ok(())
}

/// Check a TTL and compute `now_ms + ttl_ms` without overflow.
#[doc(hidden)]
pub fn expiry_ms(field: Field, now_ms: u64, ttl_ms: u64) -> Result<u64> {
    if ttl_ms == 0 {
        return Err(Error::invalid(field, "must be at least 1 ms"));
    }
    if ttl_ms > MAX_TTL_MS {
        return Err(Error::invalid(
            field,
            format!("{ttl_ms} ms is longer than the maximum of {MAX_TTL_MS} ms (one year)"),
        ));
    }
    now_ms
        .checked_add(ttl_ms)
        .ok_or_else(|| Error::invalid(field, format!("now + {ttl_ms} ms overflows the clock")))
}

/// A deterministic 64-bit mix (SplitMix64 finalizer): jitter from a seed
/// without any randomness source.
#[doc(hidden)]
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::has_control;

    #[test]
    fn a_control_character_is_found_in_the_bytes_as_char_is_control_finds_it() {
        for c in (0..=0x10_ffff_u32).filter_map(char::from_u32) {
            // Alone (all-ASCII texts take the fast path) and among others.
            for text in [c.to_string(), format!("a{c}\u{e9}")] {
                assert_eq!(has_control(&text), c.is_control(), "U+{:04X}", c as u32);
            }
        }
        assert!(!has_control("\u{a0}\u{c2}\u{100}"));
    }
}
