//! `leasehold`: expiring, fenced locks and a leased job queue from the shell.
//!
//! Machine output is one JSON object per line on stdout; messages for people
//! go to stderr. Exit codes: 0 ok, 1 error, 2 usage, 74 stdout could not be
//! written, 75 the lease is held by someone else, 76 the lease was lost
//! while `run`'s command ran, 126/127 the command could not be executed or
//! was not found.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the CLI spawns threads, reads real time and does I/O

mod contain;
mod out;
mod run;
mod work;

use clap::{Args, CommandFactory, Parser, Subcommand};
use leasehold::{
    Client, DriftBound, Error, Holder, HolderId, JobId, JobSpec, JobState, LeaseOptions,
    QueuePolicy, Store,
};
use out::{emit, note, parse_duration, Times};
use serde_json::{json, Value};
use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const EXIT_ERROR: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_HELD: u8 = 75;
const EXIT_LOST: u8 = 76;

const AFTER_HELP: &str = "\
Durations use the humantime grammar: 250ms, 1.5s, 30s, 5m, 1h30m, 2d.

Exit codes: 0 ok, 1 error (the message names the cause), 2 usage, 74 stdout
could not be written, 75 the lease is held by someone else, 76 the lease was
lost while the command ran, 126 the command is not executable, 127 the
command was not found; otherwise `run` exits with its command's status
(128 + N when signal N killed it).

Containment (`run`, `queue work`): the command runs as a child of the init
of its own PID namespace when the kernel allows it (root, or unprivileged
user namespaces); nothing it starts outlives it, even after `setsid`.
Otherwise a supervisor that is a child subreaper finds and stops the whole
process tree. Either way the supervisor kills the tree when leasehold dies,
even by SIGKILL.";

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Expiring, fenced leases and a leased job queue",
    after_help = AFTER_HELP
)]
struct Cli {
    /// Store URL: sqlite:PATH[?synchronous=full], file:DIR[?durable=false]
    /// (leases only), or postgres://USER@HOST:PORT/DB[?schema=NAME].
    #[arg(
        long,
        env = "LEASEHOLD_STORE",
        default_value = "sqlite:leasehold.db",
        global = true
    )]
    store: String,
    #[command(flatten)]
    policy: PolicyArgs,
    #[command(subcommand)]
    command: Cmd,
}

/// How jobs are retried and how far a holder's clock may drift.
#[derive(Args)]
struct PolicyArgs {
    /// Backoff after a job's first failed attempt (doubles per attempt, with jitter).
    #[arg(long, global = true, value_parser = parse_duration, default_value = "1s", help_heading = "Policy")]
    backoff: Duration,
    /// Longest backoff between attempts.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "1h", help_heading = "Policy")]
    backoff_max: Duration,
    /// A job whose claims expired this many times is dead (a crash loop); 0: never.
    #[arg(long, global = true, default_value_t = 5, help_heading = "Policy")]
    quarantine_after: u32,
    /// Largest drift between a holder's clock and the store's, in parts per million.
    #[arg(long, global = true, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(0..=500_000), help_heading = "Policy")]
    drift_ppm: u32,
    /// Extra margin a holder keeps before its lease's end.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "0s", help_heading = "Policy")]
    drift_margin: Duration,
}

#[derive(Subcommand)]
enum Cmd {
    /// Locks: acquire, renew, release, status.
    #[command(subcommand)]
    Lock(LockCmd),
    /// The job queue.
    #[command(subcommand)]
    Queue(QueueCmd),
    /// Run a command under a lease (like flock(1), but expiring and fenced).
    Run(run::RunArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on stdout.
    Man,
}

#[derive(Subcommand)]
enum LockCmd {
    /// Acquire KEY; prints the holder and token to renew or release it with.
    Acquire {
        key: String,
        #[arg(long, value_parser = parse_duration)]
        ttl: Duration,
        /// Holder id (a UUID); a fresh one is made if absent. The same id
        /// again renews its own grant.
        #[arg(long)]
        holder: Option<String>,
        /// Text recorded with the holder (default: host, parent pid and
        /// name: who called leasehold).
        #[arg(long)]
        label: Option<String>,
        /// Wait this long for the key if it is held.
        #[arg(long, value_parser = parse_duration, default_value = "0s")]
        wait: Duration,
        /// Allow up to N holders at once. The first grant fixes a key's
        /// limit while it has holders.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
        limit: u32,
    },
    /// Extend a held lease.
    Renew {
        key: String,
        #[arg(long)]
        holder: String,
        #[arg(long)]
        token: u64,
        #[arg(long, value_parser = parse_duration, default_value = "30s")]
        ttl: Duration,
    },
    /// Release a held lease.
    Release {
        key: String,
        #[arg(long)]
        holder: String,
        #[arg(long)]
        token: u64,
    },
    /// Who holds KEY, until when, and its token counter.
    Status { key: String },
}

#[derive(Subcommand)]
enum QueueCmd {
    /// Add a job (payload from --payload or stdin).
    Push {
        queue: String,
        #[arg(long)]
        payload: Option<String>,
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Not claimable before this long from now.
        #[arg(long, value_parser = parse_duration, conflicts_with = "at")]
        delay: Option<Duration>,
        /// Not claimable before this wall-clock time (RFC 3339, e.g. 2026-12-24T18:00:00Z).
        #[arg(long, value_parser = parse_time)]
        at: Option<SystemTime>,
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        max_attempts: u32,
        /// Deduplicate: return the live job with this key instead.
        #[arg(long)]
        unique: Option<String>,
    },
    /// Claim jobs and run CMD for each (payload on stdin).
    Work(work::WorkArgs),
    /// Jobs per state.
    Stats { queue: String },
    /// Jobs, one JSON line each (payload size and a short preview).
    List {
        queue: String,
        #[arg(long, value_parser = parse_state)]
        state: Option<JobState>,
        /// Only jobs with an id greater than this (for paging).
        #[arg(long, default_value_t = 0)]
        after: u64,
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        limit: u64,
    },
    /// One job, with its whole payload (text when UTF-8, else base64).
    Get { id: u64 },
    /// Cancel a job (a running one is asked to stop at its next heartbeat).
    Cancel { id: u64 },
    /// Make a dead or cancelled job ready again.
    Retry { id: u64 },
    /// Delete finished jobs older than a duration.
    Purge {
        queue: String,
        #[arg(long, value_parser = parse_duration)]
        older_than: Duration,
    },
}

fn parse_state(text: &str) -> Result<JobState, String> {
    JobState::parse(text).map_err(|_| {
        format!("{text:?} is not one of ready, scheduled, running, done, dead, cancelled")
    })
}

fn parse_time(text: &str) -> Result<SystemTime, String> {
    humantime::parse_rfc3339_weak(text.trim())
        .map_err(|e| format!("{text:?} is not an RFC 3339 time ({e}), e.g. 2026-12-24T18:00:00Z"))
}

/// A failure with its exit code; the message goes to stderr.
pub struct Fail(pub u8, pub String);

/// The command-line name of a field an error names.
fn flag_of(field: &str) -> &str {
    match field {
        "key" => "KEY",
        "queue" => "QUEUE",
        "ttl" => "--ttl",
        "lease" => "--lease",
        "limit" => "--limit",
        "batch" => "--limit",
        "payload" => "--payload",
        "max_attempts" => "--max-attempts",
        "delay" => "--delay",
        "run_at" => "--at",
        "unique_key" => "--unique",
        "holder" => "--holder",
        "holder label" => "--label",
        "state" => "--state",
        "store" => "--store",
        other => other,
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        match &e {
            Error::Held { .. } => Fail(EXIT_HELD, e.to_string()),
            Error::Invalid { field, reason } => {
                Fail(EXIT_ERROR, format!("invalid {}: {reason}", flag_of(field)))
            }
            _ => Fail(EXIT_ERROR, e.to_string()),
        }
    }
}

impl From<std::io::Error> for Fail {
    fn from(e: std::io::Error) -> Self {
        Fail(out::EXIT_IOERR, format!("writing to stdout: {e}"))
    }
}

pub type CliResult = Result<u8, Fail>;

/// What `lock acquire` records by default: who called leasehold (its
/// parent, which outlives this short-lived process).
fn caller_label() -> String {
    let ppid = std::os::unix::process::parent_id();
    let name = std::fs::read_to_string(format!("/proc/{ppid}/comm")).unwrap_or_default();
    let host = Holder::new(HolderId(0))
        .labelled_default()
        .label
        .as_deref()
        .and_then(|l| l.rsplit_once(':').map(|(h, _)| h.to_owned()))
        .unwrap_or_default();
    format!("{host}:{ppid} ({})", name.trim())
}

fn policy_of(p: &PolicyArgs) -> QueuePolicy {
    QueuePolicy {
        backoff_base_ms: out::ms(p.backoff),
        backoff_max_ms: out::ms(p.backoff_max),
        quarantine_expiries: p.quarantine_after,
        ..QueuePolicy::default()
    }
}

/// A client with the policy flags, a holder id (given or fresh) and a label.
fn client_for(
    store: Arc<dyn Store>,
    policy: &PolicyArgs,
    holder: Option<&str>,
    label: Option<String>,
) -> Result<Client, Fail> {
    let id = match holder {
        Some(h) => HolderId::parse(h)?,
        None => leasehold::random_holder_id(),
    };
    let holder = match label {
        Some(l) => Holder::with_label(id, &l)?,
        None => Holder::new(id).labelled_default(),
    };
    Ok(Client::builder_shared(store)
        .holder(holder)
        .policy(policy_of(policy))
        .drift(DriftBound {
            ppm: policy.drift_ppm,
            margin_ms: out::ms(policy.drift_margin),
        })
        .build())
}

/// When a lease is held: who holds it and until when, on stdout.
pub fn held_message(client: &Client, key: &str, e: &Error) -> Result<(), Fail> {
    if let Error::Held { .. } = e {
        if let Ok(info) = client.inspect(key) {
            let mut v = out::status_json(key, &info);
            v["held"] = json!(true);
            emit(&v)?;
        }
    }
    Ok(())
}

fn lock(store: Arc<dyn Store>, policy: &PolicyArgs, cmd: LockCmd) -> CliResult {
    match cmd {
        LockCmd::Acquire {
            key,
            ttl,
            holder,
            label,
            wait,
            limit,
        } => {
            let label = label.unwrap_or_else(caller_label);
            let client = client_for(store, policy, holder.as_deref(), Some(label))?;
            let opts = LeaseOptions::new(ttl).limit(limit).wait(wait);
            let guard = match client.acquire(&key, opts) {
                Ok(g) => g,
                Err(e) => {
                    held_message(&client, &key, &e)?;
                    return Err(e.into());
                }
            };
            let renewed = guard.renewed();
            let info = client.inspect(&key)?;
            let (key, token) = guard.detach();
            let t = Times::new(info.now_ms);
            let mine = info.holders.iter().find(|h| h.token == token);
            if renewed {
                note(&format!(
                    "{} already held {key:?} with token {token}: the acquire renewed it",
                    client.holder().id
                ));
            }
            emit(&json!({
                "key": key,
                "holder": client.holder().id.to_string(),
                "label": client.holder().label.as_deref(),
                "token": token,
                "renewed": renewed,
                "ttl_ms": out::ms(ttl),
                "expires_at": mine.map(|h| t.at(h.expires_at_ms)),
                "expires_in_ms": mine.map(|h| t.until(h.expires_at_ms)),
            }))?;
            Ok(0)
        }
        LockCmd::Renew {
            key,
            holder,
            token,
            ttl,
        } => {
            let client = client_for(store, policy, Some(&holder), None)?;
            let grant = client.renew(&key, token, ttl)?;
            let t = Times::new(grant.granted_at_ms);
            emit(&json!({
                "key": key,
                "holder": holder,
                "token": token,
                "expires_at": t.at(grant.expires_at_ms),
                "expires_in_ms": t.until(grant.expires_at_ms),
            }))?;
            Ok(0)
        }
        LockCmd::Release { key, holder, token } => {
            let client = client_for(store, policy, Some(&holder), None)?;
            client.release(&key, token)?;
            emit(&json!({"key": key, "released": true, "token": token}))?;
            Ok(0)
        }
        LockCmd::Status { key } => {
            let client = client_for(store, policy, None, None)?;
            let info = client.inspect(&key)?;
            emit(&out::status_json(&key, &info))?;
            Ok(0)
        }
    }
}

fn read_payload(payload: Option<String>) -> Result<Vec<u8>, Fail> {
    match payload {
        Some(p) => Ok(p.into_bytes()),
        None => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| Fail(EXIT_ERROR, format!("reading the payload from stdin: {e}")))?;
            Ok(buf)
        }
    }
}

fn queue(store: Arc<dyn Store>, policy: &PolicyArgs, cmd: QueueCmd) -> CliResult {
    let client = client_for(store, policy, None, None)?;
    match cmd {
        QueueCmd::Push {
            queue,
            payload,
            priority,
            delay,
            at,
            max_attempts,
            unique,
        } => {
            let payload = read_payload(payload)?;
            let run_at_ms = match at {
                None => None,
                Some(at) => {
                    // Wall-clock time to store time, through the store's now.
                    let now_ms = client.store_now_ms()?;
                    let wall = SystemTime::now();
                    Some(match at.duration_since(wall) {
                        Ok(ahead) => now_ms.saturating_add(out::ms(ahead)),
                        Err(behind) => now_ms.saturating_sub(out::ms(behind.duration())),
                    })
                }
            };
            let spec = JobSpec {
                payload,
                priority,
                delay_ms: delay.map_or(0, out::ms),
                run_at_ms,
                max_attempts,
                unique_key: unique,
            };
            let pushed = client.queue(&queue)?.push(&spec)?;
            emit(&json!({"id": pushed.id.0, "created": pushed.created}))?;
            Ok(0)
        }
        QueueCmd::Work(args) => work::work(client, args),
        QueueCmd::Stats { queue } => {
            let c = client.queue(&queue)?.stats()?;
            let mut obj = serde_json::Map::new();
            for s in JobState::ALL {
                obj.insert(s.as_str().to_owned(), json!(c.get(s)));
            }
            emit(&Value::Object(obj))?;
            Ok(0)
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
            let t = Times::new(client.store_now_ms()?);
            for j in &jobs {
                emit(&out::job_json(j, &t, false))?;
            }
            Ok(0)
        }
        QueueCmd::Get { id } => {
            let job = client.job(JobId(id))?;
            let t = Times::new(client.store_now_ms()?);
            emit(&out::job_json(&job, &t, true))?;
            Ok(0)
        }
        QueueCmd::Cancel { id } => {
            let state = client.cancel_job(JobId(id))?;
            emit(&json!({
                "id": id,
                "state": state.as_str(),
                "cancel_requested": state == JobState::Running,
            }))?;
            Ok(0)
        }
        QueueCmd::Retry { id } => {
            client.retry_job(JobId(id))?;
            emit(&json!({"id": id, "state": "ready"}))?;
            Ok(0)
        }
        QueueCmd::Purge { queue, older_than } => {
            let n = client.queue(&queue)?.purge(older_than)?;
            emit(&json!({"queue": queue, "purged": n}))?;
            Ok(0)
        }
    }
}

/// Open the store the URL names; `mem:` would be a store private to this
/// one process, so the command line refuses it.
fn open_store(url: &str) -> Result<Arc<dyn Store>, Fail> {
    if url == "mem:" || url.starts_with("mem:") {
        return Err(Fail(
            EXIT_USAGE,
            "--store mem: keeps its state inside one process, and every leasehold command is a \
             process of its own: nothing would be shared (two commands would both get token 1). \
             Use sqlite:PATH (one machine), file:DIR (leases, one machine) or postgres://..."
                .to_owned(),
        ));
    }
    Ok(leasehold::store::open_url(url)?)
}

/// `completions` and `man`: generated from the clap definitions.
fn generated(completions: Option<clap_complete::Shell>) -> CliResult {
    let mut buf = Vec::new();
    match completions {
        Some(shell) => clap_complete::generate(shell, &mut Cli::command(), "leasehold", &mut buf),
        None => clap_mangen::Man::new(Cli::command())
            .render(&mut buf)
            .map_err(|e| Fail(EXIT_ERROR, format!("rendering the man page: {e}")))?,
    }
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&buf)?;
    stdout.flush()?;
    Ok(0)
}

fn main() -> ExitCode {
    if let Some(args) = contain::supervisor_args() {
        contain::supervisor_main(args);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout, errors to stderr; neither panics
            // when it cannot be written.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    let Cli {
        store,
        policy,
        command,
    } = cli;
    let result = match command {
        Cmd::Completions { shell } => generated(Some(shell)),
        Cmd::Man => generated(None),
        Cmd::Lock(cmd) => open_store(&store).and_then(|s| lock(s, &policy, cmd)),
        Cmd::Queue(cmd) => open_store(&store).and_then(|s| queue(s, &policy, cmd)),
        Cmd::Run(args) => open_store(&store)
            .and_then(|s| client_for(s, &policy, None, None))
            .and_then(|c| run::run(c, args)),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Fail(code, message)) => {
            note(&message);
            ExitCode::from(code)
        }
    }
}
