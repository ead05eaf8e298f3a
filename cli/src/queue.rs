//! `leasehold queue ...`: push, inspect and manage jobs (`queue work` is
//! in `work.rs`); every command prints JSON lines.

use crate::defaults;
use crate::out::{self, emit, parse_duration, Times};
use crate::{client_for, work, CliResult, Fail, PolicyArgs, EXIT_ERROR, EXIT_USAGE};
use clap::Subcommand;
use leasehold::core::SummaryOptions;
use leasehold::{Error, JobId, JobSpec, JobState, Limits, QueuePolicy, Rate, Store, StoreExt};
use serde_json::{json, Value};
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

#[derive(Subcommand)]
pub enum QueueCmd {
    /// Add a job (payload from --payload or stdin), or with --lines one job per line of stdin.
    Push {
        queue: String,
        #[arg(long)]
        payload: Option<String>,
        /// One job per line of stdin (its bytes without the line ending), all with the same options: stdin is read to its end and every line checked first, then the jobs are pushed in transactions of up to 10,000 jobs and 32 MiB (one commit each); prints one line per job, a transaction's lines once it committed.
        #[arg(long, conflicts_with_all = ["payload", "unique"])]
        lines: bool,
        #[arg(long, default_value_t = defaults::priority(), allow_negative_numbers = true)]
        priority: i32,
        /// Not claimable before this long from now.
        #[arg(long, value_parser = parse_duration, conflicts_with = "at")]
        delay: Option<Duration>,
        /// Not claimable before this wall-clock time (RFC 3339, e.g. 2026-12-24T18:00:00Z).
        #[arg(long, value_parser = parse_time)]
        at: Option<SystemTime>,
        #[arg(long, default_value_t = defaults::max_attempts(), value_parser = clap::value_parser!(u32).range(defaults::attempts_range()))]
        max_attempts: u32,
        /// Deduplicate: if a job with this key blocks it (by default a live one: ready, scheduled, running or waiting), print that job's id as "duplicate_of" and create nothing.
        #[arg(long)]
        unique: Option<String>,
        /// With --unique: a job with the key pushed within this period blocks, whatever its state (e.g. 1h).
        #[arg(long, value_name = "DUR", value_parser = parse_duration, requires = "unique")]
        unique_for: Option<Duration>,
        /// With --unique: the states in which a job with the key blocks, comma-separated (e.g. ready,scheduled).
        #[arg(long, value_name = "STATES", value_parser = states_arg, requires = "unique")]
        unique_states: Option<leasehold::StateSet>,
        /// Concurrency key: the queue's per-key limit counts the running jobs sharing it.
        #[arg(long)]
        key: Option<String>,
        /// Run-time limit of each attempt, counted from its claim: past it CMD's tree is stopped and the attempt fails.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// Wait for these jobs (ids, comma-separated): "waiting" until all are done, then ready; cancelled if one ends dead or cancelled.
        #[arg(long, value_name = "ID,...", value_delimiter = ',')]
        after: Vec<u64>,
        /// With --after: run once they all ended, however they ended.
        #[arg(long, requires = "after")]
        after_any: bool,
    },
    /// Claim jobs and run CMD for each (payload on stdin); fire the queue's schedules.
    ///
    /// CMD gets LEASEHOLD_JOB_ID, LEASEHOLD_ATTEMPT, LEASEHOLD_TOKEN,
    /// LEASEHOLD_QUEUE (and LEASEHOLD_JOB_KEY) in its environment, and may
    /// report progress as lines `PERCENT [MESSAGE]` on file descriptor 3
    /// (LEASEHOLD_PROGRESS_FD), e.g. `echo "40 tiles 400/1000" >&3`.
    Work(work::WorkArgs),
    /// Periodic jobs: add, list or remove a queue's schedules.
    #[command(subcommand)]
    Schedule(crate::schedule::ScheduleCmd),
    /// Jobs per state, and whether the queue is paused.
    Stats { queue: String },
    /// Stop every worker from starting the queue's jobs (running ones finish; pushes are accepted).
    Pause { queue: String },
    /// Let workers start the queue's jobs again (idle workers are woken).
    Resume { queue: String },
    /// Concurrency and rate limits, fleet-wide: set, show or clear them.
    #[command(subcommand)]
    Limit(LimitCmd),
    #[command(about = defaults::QUEUES_ABOUT.as_str())]
    Queues,
    /// Jobs, one JSON line each (payload size and a short preview).
    List {
        queue: String,
        #[arg(long, value_parser = parse_state)]
        state: Option<JobState>,
        /// Only jobs with an id greater than this (for paging).
        #[arg(long, default_value_t = 0)]
        after: u64,
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(defaults::batch_range()))]
        limit: u64,
    },
    /// One job, with its whole payload (text when UTF-8, else base64).
    Get { id: u64 },
    /// Cancel a job (a running one is asked to stop at its next heartbeat).
    Cancel { id: u64 },
    #[command(about = defaults::RETRY_ABOUT.as_str())]
    Retry { id: u64 },
    /// Delete finished jobs older than a duration.
    Purge {
        queue: String,
        #[arg(long, value_parser = parse_duration)]
        older_than: Duration,
    },
}

#[derive(Subcommand)]
pub enum LimitCmd {
    /// Set the limits given (the others stay as they are); `none` clears one.
    Set {
        queue: String,
        /// At most N of the queue's jobs run at once, across every worker (none: no limit).
        #[arg(long, value_name = "N", value_parser = count_arg(leasehold::Field::Concurrency))]
        concurrency: Option<Setting<u32>>,
        /// At most N jobs of one concurrency key (`push --key`) run at once (none: no limit).
        #[arg(long, value_name = "N", value_parser = count_arg(leasehold::Field::PerKey))]
        per_key: Option<Setting<u32>>,
        /// At most N of the queue's jobs start per window, across every worker: N/DUR, e.g. 100/1m, 5/s (a sliding window of store time; N up to 1000; none: no limit).
        #[arg(long, value_name = "N/DUR", value_parser = rate_arg(leasehold::Field::Rate))]
        rate: Option<Setting<Rate>>,
        /// At most N jobs of one concurrency key start per window: N/DUR, e.g. 1/10s (none: no limit).
        #[arg(long, value_name = "N/DUR", value_parser = rate_arg(leasehold::Field::PerKeyRate))]
        per_key_rate: Option<Setting<Rate>>,
    },
    /// The queue's limits (JSON; null: none).
    Show { queue: String },
    /// Remove every limit (parked jobs become claimable).
    Clear { queue: String },
}

/// A state by its name; the library's message names them all.
fn parse_state(text: &str) -> Result<JobState, String> {
    JobState::parse(text).map_err(|e| match e {
        Error::Invalid { reason, .. } => reason,
        e => e.to_string(),
    })
}

fn parse_time(text: &str) -> Result<SystemTime, String> {
    humantime::parse_rfc3339_weak(text.trim())
        .map_err(|e| format!("{text:?} is not an RFC 3339 time ({e}), e.g. 2026-12-24T18:00:00Z"))
}

fn read_payload(payload: Option<String>) -> Result<Vec<u8>, Fail> {
    match payload {
        Some(p) => Ok(p.into_bytes()),
        None => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).map_err(|e| {
                Fail::new(EXIT_ERROR, format!("reading the payload from stdin: {e}"))
            })?;
            Ok(buf)
        }
    }
}

pub fn queue(store: Arc<dyn Store>, policy: &PolicyArgs, cmd: QueueCmd) -> CliResult {
    let client = client_for(store, policy, None, None)?;
    let lines = match cmd {
        QueueCmd::Work(args) => return work::work(client, args),
        QueueCmd::Schedule(cmd) => return crate::schedule::schedule(&client, cmd),
        QueueCmd::Push {
            queue,
            payload,
            lines: many,
            priority,
            delay,
            at,
            max_attempts,
            unique,
            unique_for,
            unique_states,
            key,
            timeout,
            after,
            after_any,
        } => {
            let run_at = at.map(|at| client.store_time(at)).transpose()?;
            let spec = JobSpec {
                // With --lines, each line's (push_lines).
                payload: if many {
                    Vec::new()
                } else {
                    read_payload(payload)?
                },
                priority,
                delay_ms: delay.map_or(0, out::ms),
                run_at,
                max_attempts,
                unique_key: unique,
                unique_for,
                unique_states,
                key,
                timeout,
                after: after.into_iter().map(leasehold::JobId).collect(),
                after_any,
            };
            let q = client.queue(&queue)?;
            if many {
                return push_lines(&q, &spec);
            }
            vec![pushed_line(&q.push(&spec)?)]
        }
        QueueCmd::Queues => return queues(client.store().as_ref(), client.policy()),
        QueueCmd::Stats { queue } => {
            // The counts and the pause as of one instant.
            let policy = *client.policy();
            let (c, config) = client.store().txn_as("stats", |tx| {
                let counts = leasehold::core::job::stats(tx, &queue, &policy)?;
                Ok((counts, leasehold::core::job::queue_config(tx, &queue)?))
            })?;
            let v: serde_json::Map<String, Value> = JobState::ALL
                .map(|s| (s.as_str().to_owned(), json!(c.get(s))))
                .into_iter()
                .collect();
            // Limits are `queue limit show`'s: the counts stay numbers.
            let mut v = Value::Object(v);
            v["paused"] = json!(config.paused);
            vec![v]
        }
        QueueCmd::Limit(cmd) => vec![limit(&client, cmd)?],
        QueueCmd::Pause { queue } => {
            let changed = client.queue(&queue)?.pause()?;
            vec![json!({"queue": queue, "paused": true, "changed": changed})]
        }
        QueueCmd::Resume { queue } => {
            let changed = client.queue(&queue)?.resume()?;
            vec![json!({"queue": queue, "paused": false, "changed": changed})]
        }
        QueueCmd::List {
            queue,
            state,
            after,
            limit,
        } => {
            let jobs = client
                .queue(&queue)?
                .list(state, JobId(after), limit as usize)?;
            let t = Times::new(client.store_now()?.ms());
            jobs.iter().map(|j| out::job_json(j, &t, false)).collect()
        }
        QueueCmd::Get { id } => {
            let job = client.job(JobId(id))?;
            let t = Times::new(client.store_now()?.ms());
            vec![out::job_json(&job, &t, true)]
        }
        QueueCmd::Cancel { id } => {
            let state = client.cancel_job(JobId(id))?;
            vec![json!({
                "id": id,
                "state": state.as_str(),
                "cancel_requested": state == JobState::Running,
            })]
        }
        QueueCmd::Retry { id } => {
            client.retry_job(JobId(id))?;
            vec![json!({"id": id, "state": JobState::Ready.as_str()})]
        }
        QueueCmd::Purge { queue, older_than } => {
            let n = client.queue(&queue)?.purge(older_than)?;
            vec![json!({"queue": queue, "purged": n})]
        }
    };
    for line in &lines {
        emit(line)?;
    }
    Ok(0)
}

/// What `queue push` prints for a job.
fn pushed_line(pushed: &leasehold::EnqueueOutcome) -> Value {
    let mut v = json!({"id": pushed.id.0, "created": pushed.created});
    if !pushed.created {
        // The job whose unique key blocked the push.
        v["duplicate_of"] = json!(pushed.id.0);
    }
    v
}

/// `queue push --lines`: one job per line of stdin (read to its end
/// first), like `spec` but for its payload. Every line is checked before
/// anything is pushed (a refused one is named by its line and nothing is
/// written); then the jobs go in transactions of up to
/// [`leasehold::core::MAX_BATCH`] jobs and
/// [`leasehold::core::MAX_BATCH_PAYLOAD_BYTES`], each transaction's lines
/// printed once it committed (a store error after some committed leaves
/// those, printed).
fn push_lines(q: &leasehold::Queue, spec: &JobSpec) -> CliResult {
    use leasehold::core::{MAX_BATCH, MAX_BATCH_PAYLOAD_BYTES};
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| Fail::new(EXIT_ERROR, format!("reading the payloads from stdin: {e}")))?;
    let mut lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    if input.is_empty() || input.ends_with(b"\n") {
        // Not a line: what follows the last newline.
        lines.pop();
    }
    let specs: Vec<JobSpec> = lines
        .iter()
        .map(|line| JobSpec {
            payload: line.strip_suffix(b"\r").unwrap_or(line).to_vec(),
            ..spec.clone()
        })
        .collect();
    for (i, spec) in specs.iter().enumerate() {
        leasehold::core::job::check_spec(spec).map_err(|e| match e {
            Error::Invalid { field, reason } => Error::Invalid {
                field,
                reason: format!("stdin line {}: {reason}", i + 1),
            },
            e => e,
        })?;
    }
    let mut rest = &specs[..];
    let mut first = 0;
    while !rest.is_empty() {
        // As many as fit in one push, at least one (a payload alone fits).
        let mut bytes = 0;
        let n = rest
            .iter()
            .take(MAX_BATCH)
            .take_while(|s| {
                bytes += s.payload.len();
                bytes <= MAX_BATCH_PAYLOAD_BYTES
            })
            .count()
            .max(1);
        let (batch, after) = rest.split_at(n);
        let pushed = q.push_many(batch).map_err(|e| match e {
            // What the store refused (a named job not found, say): the
            // library names the job by its place in the batch.
            Error::Invalid { field, reason } => {
                let reason = match leasehold::core::job::batch_place(&reason) {
                    Some((i, rest)) => format!("stdin line {}: {rest}", first + i + 1),
                    None => reason,
                };
                Error::Invalid { field, reason }
            }
            e => e,
        })?;
        for p in &pushed {
            emit(&pushed_line(p))?;
        }
        first += n;
        rest = after;
    }
    Ok(0)
}

/// `queue limit set|show|clear`: one JSON line, the queue's limits after
/// the command (`changed`: whether it changed them).
fn limit(client: &leasehold::Client, cmd: LimitCmd) -> Result<Value, Fail> {
    let (queue, changed, limits) = match cmd {
        LimitCmd::Show { queue } => {
            let limits = client.queue(&queue)?.config()?.limits;
            let mut v = json!({ "queue": queue });
            leasehold::render::add_limits(&mut v, &limits);
            return Ok(v);
        }
        LimitCmd::Clear { queue } => {
            let changed = client.queue(&queue)?.set_limits(Limits::none())?;
            (queue, changed, Limits::none())
        }
        LimitCmd::Set {
            queue,
            concurrency,
            per_key,
            rate,
            per_key_rate,
        } => {
            if concurrency.is_none()
                && per_key.is_none()
                && rate.is_none()
                && per_key_rate.is_none()
            {
                return Err(Fail::new(
                    EXIT_USAGE,
                    "queue limit set: give at least one of --concurrency N, --per-key N, \
                     --rate N/DUR, --per-key-rate N/DUR"
                        .into(),
                ));
            }
            // Read and write in one transaction: a concurrent change of the
            // other limit is not lost.
            let (changed, limits) = client.store().txn_as("set_limits", |tx| {
                let old = leasehold::core::job::queue_config(tx, &queue)?.limits;
                let limits = Limits::none()
                    .with_concurrency(concurrency.map_or(old.concurrency, |s| s.0))
                    .with_per_key(per_key.map_or(old.per_key, |s| s.0))
                    .with_rate(rate.map_or(old.rate, |s| s.0))
                    .with_per_key_rate(per_key_rate.map_or(old.per_key_rate, |s| s.0));
                Ok((
                    leasehold::core::job::set_limits(tx, &queue, limits)?,
                    limits,
                ))
            })?;
            (queue, changed, limits)
        }
    };
    let mut v = json!({ "queue": queue, "changed": changed });
    leasehold::render::add_limits(&mut v, &limits);
    Ok(v)
}

/// Parse `ready,scheduled` as the library does.
fn states_arg(text: &str) -> Result<leasehold::StateSet, String> {
    leasehold::StateSet::parse(leasehold::Field::UniqueStates, text).map_err(|e| e.to_string())
}

/// A limit as `queue limit set` takes it: a value, or `none` (cleared).
#[derive(Debug, Clone, Copy)]
pub struct Setting<T>(Option<T>);

/// `none`, or what `parse` makes of the text.
fn setting<T>(text: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Setting<T>, String> {
    match text.trim() {
        "none" => Ok(Setting(None)),
        t => parse(t).map(|v| Setting(Some(v))),
    }
}

/// A concurrency limit (1..=the largest), or `none`, checked as the library
/// checks it.
fn count_arg(field: leasehold::Field) -> impl Fn(&str) -> Result<Setting<u32>, String> + Clone {
    move |text| {
        setting(text, |t| {
            let n: u32 = t
                .parse()
                .map_err(|_| format!("{t:?} is not a whole number or none"))?;
            let limits = match field {
                leasehold::Field::PerKey => Limits::none().with_per_key(Some(n)),
                _ => Limits::none().with_concurrency(Some(n)),
            };
            limits.check().map(|()| n).map_err(|e| e.to_string())
        })
    }
}

/// `N/DUR` as the library parses it (its error naming the flag's field),
/// or `none`.
fn rate_arg(field: leasehold::Field) -> impl Fn(&str) -> Result<Setting<Rate>, String> + Clone {
    move |text| setting(text, |t| Rate::parse(field, t).map_err(|e| e.to_string()))
}

/// Queue names read per transaction by `queue queues`.
const QUEUES_PAGE: usize = 1000;

/// `queue queues`: the names a page at a time, then each queue's summary
/// (exact counts) in a transaction of its own.
fn queues(store: &dyn Store, policy: &QueuePolicy) -> CliResult {
    // Exact counts, and the last interval of the library's summary only.
    let opts = SummaryOptions {
        count_cap: u64::MAX,
        buckets: 1,
        ..SummaryOptions::default()
    };
    let mut after = String::new();
    loop {
        let names = store.txn_as("queue_names", |tx| {
            leasehold::core::job::queues(tx, &after, QUEUES_PAGE)
        })?;
        for name in &names {
            let summary = store.txn_as("queue_summary", |tx| {
                leasehold::core::job::summary(tx, name, policy, &opts)
            })?;
            emit(&out::summary_json(name, &summary))?;
        }
        match names.last() {
            Some(last) if names.len() == QUEUES_PAGE => after = last.clone(),
            _ => return Ok(0),
        }
    }
}
