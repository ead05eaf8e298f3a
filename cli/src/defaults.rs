//! The flags' defaults and bounds, taken from the library, so that a
//! change there (`QueuePolicy::default()`, `DriftBound::default()`,
//! `WorkOptions::default()`, `JobSpec::default()`, `LeaseOptions::new`,
//! `SummaryOptions::default()`, the `leasehold::core::MAX_*` limits, the
//! job states) is made once and `--help` shows it. Durations are the text
//! a flag takes (`1s`, `1h`); clap wants a `&'static str`, hence the
//! statics.

use leasehold::core::{self, schedule, Missed, SummaryOptions};
use leasehold::{DriftBound, JobSpec, JobState, LeaseOptions, QueuePolicy, WorkOptions};
use std::ops::RangeInclusive;
use std::sync::LazyLock;
use std::time::Duration;

/// A duration as the flags take it (the humantime grammar).
pub fn text(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn text_ms(ms: u64) -> String {
    text(Duration::from_millis(ms))
}

/// `--backoff`.
pub static BACKOFF: LazyLock<String> =
    LazyLock::new(|| text_ms(QueuePolicy::default().backoff_base_ms));
/// `--backoff-max`.
pub static BACKOFF_MAX: LazyLock<String> =
    LazyLock::new(|| text_ms(QueuePolicy::default().backoff_max_ms));
/// `--drift-margin`.
pub static DRIFT_MARGIN: LazyLock<String> =
    LazyLock::new(|| text_ms(DriftBound::default().margin_ms));
/// `queue work --lease`.
pub static LEASE: LazyLock<String> = LazyLock::new(|| text(WorkOptions::default().lease));
/// `lock acquire --wait` and `run --wait`: no waiting.
pub static WAIT: LazyLock<String> = LazyLock::new(|| text(lease_options().wait));
/// `ui --interval`.
pub static INTERVAL: LazyLock<String> =
    LazyLock::new(|| text_ms(SummaryOptions::default().bucket_ms));

/// A lease's options as the library makes them (the TTL is the flag's,
/// required, so any will do here).
fn lease_options() -> LeaseOptions {
    LeaseOptions::new(Duration::from_secs(1))
}

/// `--quarantine-after`.
pub fn quarantine_after() -> u32 {
    QueuePolicy::default().quarantine_expiries
}

/// `--drift-ppm`.
pub fn drift_ppm() -> u32 {
    DriftBound::default().ppm
}

/// `--max-attempts` of `queue push` and `queue schedule add`.
pub fn max_attempts() -> u32 {
    JobSpec::default().max_attempts
}

/// The attempts a job may allow.
pub fn attempts_range() -> RangeInclusive<i64> {
    1..=i64::from(core::MAX_ATTEMPTS)
}

/// `--priority` of `queue push` and `queue schedule add`.
pub fn priority() -> i32 {
    JobSpec::default().priority
}

/// The handlers `queue work --concurrency` may run at once.
pub fn concurrency_range() -> RangeInclusive<u64> {
    1..=WorkOptions::MAX_CONCURRENCY as u64
}

/// `queue work --concurrency`.
pub fn concurrency() -> u64 {
    u64::try_from(WorkOptions::default().concurrency).unwrap_or(1)
}

/// `lock acquire --limit`: one holder.
pub fn lease_limit() -> u32 {
    lease_options().limit
}

/// The holders a counting lease may allow.
pub fn lease_limit_range() -> RangeInclusive<i64> {
    1..=i64::from(core::MAX_LEASE_LIMIT)
}

/// The jobs one listing call may return.
pub fn batch_range() -> RangeInclusive<u64> {
    1..=u64::try_from(core::MAX_BATCH).unwrap_or(u64::MAX)
}

/// `ui --count-cap`.
pub fn count_cap() -> u64 {
    SummaryOptions::default().count_cap
}

/// The longest `ui --interval`: the dashboard's intervals together span
/// at most the library's longest TTL (what `summary` accepts).
pub fn interval_max() -> Duration {
    let buckets = u64::try_from(SummaryOptions::default().buckets).unwrap_or(1);
    Duration::from_millis(core::MAX_TTL_MS / buckets.max(1))
}

/// `queue schedule add --missed`: its choices, as stores name them.
pub fn missed_choices() -> [&'static str; Missed::ALL.len()] {
    Missed::ALL.map(Missed::as_str)
}

/// `queue schedule add --missed`: skip, the library's default.
pub fn missed() -> &'static str {
    Missed::Skip.as_str()
}

/// The states `pick` chooses, for people: `dead or cancelled`, `done,
/// dead and cancelled`.
pub fn states_text(pick: impl Fn(JobState) -> bool, conjunction: &str) -> String {
    let names: Vec<&str> = JobState::ALL
        .into_iter()
        .filter(|&s| pick(s))
        .map(JobState::as_str)
        .collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} {conjunction} {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// `queue retry`'s summary: the states [`JobState::is_retryable`] names.
pub static RETRY_ABOUT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "Make a {} job ready again",
        states_text(JobState::is_retryable, "or")
    )
});

/// `queue queues`' summary: the jobs finished in one summary interval.
pub static QUEUES_ABOUT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "Every queue that has jobs, one JSON line each: jobs per state, the oldest ready job's \
         wait, and the jobs finished in the last {}",
        text_ms(SummaryOptions::default().bucket_ms)
    )
});

/// `queue work --keep-stdout`'s help: the largest result.
pub static KEEP_STDOUT_HELP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "Keep CMD's stdout as the job's result (shown by `queue get`) instead of passing it to \
         stderr; more than {} fails the job",
        bytes_text(core::MAX_PAYLOAD_BYTES)
    )
});

/// `queue schedule add --every`'s help: the shortest period.
pub static EVERY_HELP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "Tick every DUR (at least {}), at its multiples since the Unix epoch",
        text_ms(schedule::PERIOD_MIN_MS)
    )
});

/// `queue schedule add --missed`'s help: when a tick counts as missed.
pub static MISSED_HELP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "Ticks missed while no worker ran (more than {} late): skip them, or catch up with one job",
        text_ms(schedule::ON_TIME_MS)
    )
});

/// `ui --interval`'s help: how many intervals the dashboard shows.
pub static INTERVAL_HELP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "The length of one of the {} intervals of \"finished per interval\" (the last one ends \
         now); {}",
        SummaryOptions::default().buckets,
        *INTERVAL_BOUNDS
    )
});

/// What `ui --interval` may be.
pub static INTERVAL_BOUNDS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "at least 1ms, and all {} together at most {}",
        SummaryOptions::default().buckets,
        days_text(core::MAX_TTL_MS)
    )
});

/// `365 days`; else the humantime text (whose months are not whole days).
fn days_text(ms: u64) -> String {
    const DAY_MS: u64 = 86_400_000;
    if ms >= DAY_MS && ms % DAY_MS == 0 {
        format!("{} days", ms / DAY_MS)
    } else {
        text_ms(ms)
    }
}

/// `16 MiB`, `4096 bytes`.
fn bytes_text(n: usize) -> String {
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_lists_read_as_prose() {
        assert_eq!(
            states_text(JobState::is_retryable, "or"),
            "dead or cancelled"
        );
        assert_eq!(
            states_text(JobState::is_terminal, "and"),
            "done, dead and cancelled"
        );
        assert_eq!(states_text(|s| s == JobState::Ready, "or"), "ready");
        assert_eq!(states_text(|_| false, "or"), "");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes_text(16 << 20), "16 MiB");
        assert_eq!(bytes_text(4096), "4096 bytes");
        assert_eq!(days_text(365 * 86_400_000), "365 days");
        assert_eq!(days_text(90_000), "1m 30s");
    }
}
