//! The JSON shapes of leases, jobs and queues that the command line
//! prints, the dashboard's API answers and the Python package returns: one
//! place, so the three never drift apart. Instants are RFC 3339 wall-clock
//! times computed from their distance to the store's clock, beside the
//! milliseconds remaining; payloads and results are text when they are
//! UTF-8, else base64 (feature `serde`).

// The wall clock is read here, once per rendering (clippy.toml keeps it
// out of the core).
#![allow(clippy::disallowed_methods)]

use crate::core::lease::LeaseInfo;
use crate::core::{JobPeek, QueueSummary};
use crate::{HolderInfo, JobRecord, JobState};
use base64::Engine as _;
use serde_json::{json, Value};
use std::time::{Duration, SystemTime};

/// Converts instants of the store's clock to wall-clock time: the store's
/// reading `now_ms` was taken at about `wall`.
#[derive(Debug, Clone, Copy)]
pub struct Times {
    /// The store's clock (ms) at the reading.
    pub now_ms: u64,
    /// The wall clock at about the same moment.
    pub wall: SystemTime,
}

/// A wall-clock time as RFC 3339 in UTC with milliseconds
/// (`2026-12-03T12:26:45.643Z`).
fn rfc3339_millis(wall: SystemTime) -> String {
    let ms = wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| format!("{t:.3}"))
        .unwrap_or_default()
}

impl Times {
    /// A reading of the store's clock (`now_ms`) taken now.
    pub fn new(now_ms: u64) -> Times {
        Times {
            now_ms,
            wall: SystemTime::now(),
        }
    }

    /// RFC 3339 (UTC, milliseconds) of a store-clock instant.
    pub fn at(&self, store_ms: u64) -> String {
        let wall = if store_ms >= self.now_ms {
            self.wall
                .checked_add(Duration::from_millis(store_ms - self.now_ms))
        } else {
            self.wall
                .checked_sub(Duration::from_millis(self.now_ms - store_ms))
        };
        wall.map_or_else(String::new, rfc3339_millis)
    }

    /// Milliseconds from now until a store-clock instant (0 if past).
    pub fn until(&self, store_ms: u64) -> u64 {
        store_ms.saturating_sub(self.now_ms)
    }
}

/// One live holder of a lease: its id, label, token, and when it expires.
pub fn holder_json(h: &HolderInfo, t: &Times) -> Value {
    json!({
        "holder": h.holder.id.to_string(),
        "label": h.holder.label.as_deref(),
        "token": h.token,
        "expires_at": t.at(h.expires_at_ms),
        "expires_in_ms": t.until(h.expires_at_ms),
    })
}

/// A lease's status (`lock status`): its last token, limit and holders.
pub fn status_json(key: &str, info: &LeaseInfo) -> Value {
    let t = Times::new(info.now_ms);
    json!({
        "key": key,
        "last_token": info.last_token,
        "limit": (info.limit > 0).then_some(info.limit),
        "holder_count": info.holders.len(),
        "holding": (info.limit > 0).then(|| format!("{} of {}", info.holders.len(), info.limit)),
        "holders": info.holders.iter().map(|h| holder_json(h, &t)).collect::<Vec<_>>(),
    })
}

/// The payload as text when it is UTF-8, else base64.
fn payload_text(bytes: &[u8]) -> (&'static str, String) {
    match std::str::from_utf8(bytes) {
        Ok(s) => ("utf8", s.to_owned()),
        Err(_) => (
            "base64",
            base64::engine::general_purpose::STANDARD.encode(bytes),
        ),
    }
}

/// At most this many bytes of a payload in `queue list`.
const PREVIEW_BYTES: usize = 64;

/// The first `max` bytes of a payload (`whole`: all of it; else a cut
/// whose remainder is unknown): text, cut at a character boundary, when
/// the payload reads as UTF-8 (a cut may end inside a character), else
/// base64.
fn preview(bytes: &[u8], max: usize, whole: bool) -> (&'static str, String) {
    let head = &bytes[..bytes.len().min(max)];
    let text = match std::str::from_utf8(bytes) {
        Ok(_) => true,
        // A cut may end inside a character; a whole payload may not.
        Err(e) => !whole && e.error_len().is_none(),
    };
    if !text {
        return (
            "base64",
            base64::engine::general_purpose::STANDARD.encode(head),
        );
    }
    let cut = match std::str::from_utf8(head) {
        Ok(_) => head.len(),
        Err(e) => e.valid_up_to(),
    };
    ("utf8", String::from_utf8_lossy(&head[..cut]).into_owned())
}

/// A job for `queue list` (`full`: false, a preview of the payload) or
/// `queue get` (`full`: true, the whole payload).
pub fn job_json(j: &JobRecord, t: &Times, full: bool) -> Value {
    let (encoding, payload) = if full {
        payload_text(&j.payload)
    } else {
        preview(&j.payload, PREVIEW_BYTES, true)
    };
    let mut v = job_fields(j, t, j.payload.len() as u64, encoding);
    v[if full { "payload" } else { "payload_preview" }] = json!(payload);
    add_result(&mut v, j, full);
    v
}

/// The result a job completed with, if any: whole, or a short preview.
fn add_result(v: &mut Value, j: &JobRecord, full: bool) {
    if let Some(result) = &j.result {
        let (encoding, text) = if full {
            payload_text(result)
        } else {
            preview(result, PREVIEW_BYTES, true)
        };
        v["result_bytes"] = json!(result.len());
        v["result_encoding"] = json!(encoding);
        v[if full { "result" } else { "result_preview" }] = json!(text);
    }
}

/// A job as a listing read it (its payload already cut by the store):
/// the dashboard's API.
pub fn peek_json(p: &JobPeek, t: &Times) -> Value {
    let whole = p.job.payload.len() as u64 == p.payload_bytes;
    let (encoding, payload) = preview(&p.job.payload, p.job.payload.len(), whole);
    let mut v = job_fields(&p.job, t, p.payload_bytes, encoding);
    v["payload_preview"] = json!(payload);
    add_result(&mut v, &p.job, false);
    v
}

/// Everything about a job but its payload's bytes.
fn job_fields(j: &JobRecord, t: &Times, payload_bytes: u64, encoding: &str) -> Value {
    let claim = j.claim.map(|c| {
        json!({
            "holder": c.holder.to_string(),
            "token": c.token,
            "lease_until": t.at(c.lease_until_ms),
            "lease_remaining_ms": t.until(c.lease_until_ms),
            "deadline": c.deadline_ms.map(|d| t.at(d)),
        })
    });
    json!({
        "id": j.id.0,
        "queue": &*j.queue,
        "state": j.state.as_str(),
        "priority": j.priority,
        "attempts": j.attempts,
        "max_attempts": j.max_attempts,
        "expiries": j.expiries,
        "created_at": t.at(j.created_at_ms),
        "run_at": t.at(j.run_at_ms),
        "finished_at": j.finished_at_ms.map(|f| t.at(f)),
        "cancel_requested": j.cancel_requested,
        "last_error": j.last_error.as_deref(),
        "unique_key": j.unique_key.as_deref(),
        "key": j.key.as_deref(),
        "parked": j.parked,
        "timeout_ms": j.timeout_ms,
        "progress": j.progress.as_ref().map(|p| json!({
            "fraction": p.fraction(),
            "message": &*p.message,
        })),
        "after": j.after.as_ref().map(|a| a.iter().map(|id| id.0).collect::<Vec<_>>()),
        "after_any": j.after_any,
        "waiting_on": j.waiting_on,
        "claim": claim,
        "payload_bytes": payload_bytes,
        "payload_encoding": encoding,
    })
}

/// A queue's concurrency and rate limits as JSON fields (`null`: none;
/// a rate as `N/DUR`, as `queue limit set --rate` takes it).
pub fn add_limits(v: &mut Value, limits: &crate::core::Limits) {
    v["concurrency"] = json!(limits.concurrency);
    v["per_key"] = json!(limits.per_key);
    v["rate"] = json!(limits.rate.map(|r| r.to_string()));
    v["per_key_rate"] = json!(limits.per_key_rate.map(|r| r.to_string()));
}

/// A queue's summary (`queue queues`, the dashboard's API): whether it
/// is paused and its limits, its counts
/// per state (with the states whose count reached the cap), the oldest
/// ready job, and the jobs finished per interval.
pub fn summary_json(queue: &str, s: &QueueSummary) -> Value {
    let t = Times::new(s.now_ms);
    let mut v = json!({"queue": queue, "paused": s.paused});
    add_limits(&mut v, &s.limits);
    for state in JobState::ALL {
        v[state.as_str()] = json!(s.counts.get(state));
    }
    let capped: Vec<&str> = JobState::ALL
        .into_iter()
        .filter(|&st| s.count_cap < u64::MAX && s.is_capped(st))
        .map(JobState::as_str)
        .collect();
    v["capped"] = json!(capped);
    v["oldest_ready_at"] = json!(s.oldest_ready_at_ms.map(|at| t.at(at)));
    v["oldest_ready_wait_ms"] = json!(s.oldest_ready_wait_ms());
    let mut from_ms = s.from_ms;
    let finished: Vec<Value> = s
        .finished
        .iter()
        .map(|c| {
            let mut v = json!({"from": t.at(from_ms)});
            for state in JobState::ALL.into_iter().filter(|s| s.is_terminal()) {
                v[state.as_str()] = json!(c.get(state));
            }
            from_ms = from_ms.saturating_add(s.bucket_ms);
            v
        })
        .collect();
    v["interval_ms"] = json!(s.bucket_ms);
    v["finished"] = json!(finished);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_read_as_rfc3339_with_milliseconds() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_300_805_643);
        let t = Times {
            now_ms: 5_000,
            wall,
        };
        assert_eq!(t.at(5_000), "2026-12-03T12:26:45.643Z");
        assert_eq!(t.at(6_000), "2026-12-03T12:26:46.643Z");
        assert_eq!(t.at(4_000), "2026-12-03T12:26:44.643Z");
        assert_eq!(t.until(4_000), 0);
        assert_eq!(t.until(5_250), 250);
    }
}
