//! The flags' defaults are the library's: `--help` of the real binary
//! shows `WorkOptions::default()`, `JobSpec::default()`, `LeaseOptions`,
//! `QueuePolicy::default()`, `DriftBound::default()` and
//! `SummaryOptions::default()`, and the help texts name the library's
//! limits and states. A library default changed without the CLI following
//! fails here.

#![allow(clippy::disallowed_methods)] // runs the binary

use leasehold::core::{self, schedule, SummaryOptions};
use leasehold::{DriftBound, JobSpec, JobState, LeaseOptions, QueuePolicy, WorkOptions};
use std::collections::BTreeMap;
use std::time::Duration;

#[path = "support/cli.rs"]
mod cli;
use cli::Dir;

/// `leasehold ARGS --help`, as text.
fn help(args: &[&str]) -> String {
    let d = Dir::new("defaults");
    let mut all = args.to_vec();
    all.push("--help");
    let out = d
        .cmd()
        .env_remove("LEASEHOLD_CONTAIN")
        .args(&all)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// Each flag's `[default: ...]`, by the flag's long name.
fn defaults(help: &str) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut flag: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        let names_a_flag = trimmed.starts_with("--") || trimmed.starts_with('-');
        if names_a_flag && line.len() - trimmed.len() <= 6 {
            let long = trimmed.split_whitespace().find(|w| w.starts_with("--"));
            flag = long.map(|w| w.trim_end_matches(',').to_owned());
        }
        if let (Some(f), Some(at)) = (&flag, line.find("[default: ")) {
            let rest = &line[at + "[default: ".len()..];
            let end = rest.find(']').unwrap();
            found.insert(f.clone(), rest[..end].to_owned());
        }
    }
    found
}

fn duration_of(shown: &BTreeMap<String, String>, flag: &str) -> Duration {
    let text = shown
        .get(flag)
        .unwrap_or_else(|| panic!("{flag} shows no default"));
    humantime::parse_duration(text).unwrap_or_else(|e| panic!("{flag}'s default {text:?}: {e}"))
}

fn number_of(shown: &BTreeMap<String, String>, flag: &str) -> i64 {
    let text = shown
        .get(flag)
        .unwrap_or_else(|| panic!("{flag} shows no default"));
    text.parse()
        .unwrap_or_else(|e| panic!("{flag}'s default {text:?}: {e}"))
}

/// The global policy flags, as every subcommand's help shows them.
fn assert_policy_defaults(shown: &BTreeMap<String, String>) {
    let policy = QueuePolicy::default();
    let drift = DriftBound::default();
    let ms = |flag| u64::try_from(duration_of(shown, flag).as_millis()).unwrap();
    assert_eq!(ms("--backoff"), policy.backoff_base_ms);
    assert_eq!(ms("--backoff-max"), policy.backoff_max_ms);
    assert_eq!(
        number_of(shown, "--quarantine-after"),
        i64::from(policy.quarantine_expiries)
    );
    assert_eq!(number_of(shown, "--drift-ppm"), i64::from(drift.ppm));
    assert_eq!(ms("--drift-margin"), drift.margin_ms);
}

#[test]
fn queue_work_defaults_are_the_workers() {
    let text = help(&["queue", "work"]);
    let shown = defaults(&text);
    let work = WorkOptions::default();
    assert_eq!(duration_of(&shown, "--lease"), work.lease, "{text}");
    assert_eq!(
        number_of(&shown, "--concurrency"),
        i64::try_from(work.concurrency).unwrap()
    );
    let largest = format!("{} MiB", core::MAX_PAYLOAD_BYTES >> 20);
    assert!(
        text.contains(&largest),
        "--keep-stdout names {largest}: {text}"
    );
    assert_policy_defaults(&shown);
}

#[test]
fn queue_push_defaults_are_a_jobspecs() {
    let text = help(&["queue", "push"]);
    let shown = defaults(&text);
    let spec = JobSpec::default();
    assert_eq!(
        number_of(&shown, "--max-attempts"),
        i64::from(spec.max_attempts),
        "{text}"
    );
    assert_eq!(number_of(&shown, "--priority"), i64::from(spec.priority));
    assert_policy_defaults(&shown);
}

#[test]
fn lock_acquire_defaults_are_lease_options() {
    let text = help(&["lock", "acquire"]);
    let shown = defaults(&text);
    let opts = LeaseOptions::new(Duration::from_secs(1));
    assert_eq!(duration_of(&shown, "--wait"), opts.wait, "{text}");
    assert_eq!(number_of(&shown, "--limit"), i64::from(opts.limit));
    assert_eq!(duration_of(&defaults(&help(&["run"])), "--wait"), opts.wait);
    assert_policy_defaults(&shown);
}

#[test]
fn schedule_and_dashboard_defaults_are_the_librarys() {
    let text = help(&["queue", "schedule", "add"]);
    let shown = defaults(&text);
    let spec = JobSpec::default();
    assert_eq!(
        number_of(&shown, "--max-attempts"),
        i64::from(spec.max_attempts)
    );
    assert_eq!(number_of(&shown, "--priority"), i64::from(spec.priority));
    let shortest = humantime::format_duration(Duration::from_millis(schedule::PERIOD_MIN_MS));
    assert!(text.contains(&format!("at least {shortest}")), "{text}");
    let text = help(&["ui"]);
    let shown = defaults(&text);
    let summary = SummaryOptions::default();
    let interval = duration_of(&shown, "--interval");
    assert_eq!(
        u64::try_from(interval.as_millis()).unwrap(),
        summary.bucket_ms
    );
    assert_eq!(
        number_of(&shown, "--count-cap"),
        i64::try_from(summary.count_cap).unwrap()
    );
    assert!(
        text.contains(&format!("the {} intervals", summary.buckets)),
        "{text}"
    );
}

#[test]
fn retry_help_names_the_retryable_states() {
    let text = help(&["queue"]);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("retry "))
        .unwrap_or_else(|| panic!("no retry in {text}"));
    // "Make a dead or cancelled job ready again": the states before "job".
    let named: Vec<&str> = line
        .split(" job")
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    for state in JobState::ALL {
        assert_eq!(
            named.contains(&state.as_str()),
            state.is_retryable(),
            "{state} in {line:?}"
        );
    }
}
