//! `leasehold`: expiring, fenced locks and a leased job queue from the shell.
//!
//! Machine output is one JSON object per line on stdout; messages for people
//! go to stderr. Exit codes: 0 ok, 1 error, 2 usage, 74 stdout could not be
//! written, 75 the lease is held by someone else, 76 the lease was lost
//! while `run`'s command ran, 126/127 the command could not be executed or
//! was not found.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the CLI spawns threads, reads real time and does I/O
#![cfg_attr(loom, allow(dead_code))] // under loom, without the dashboard

mod contain;
mod defaults;
mod elect;
mod lock;
mod migrate;
mod out;
mod presence;
mod queue;
mod run;
mod schedule;
mod telemetry;
mod watch;
// The dashboard's HTTP stack (tokio, axum) does not build under `--cfg
// loom`; the loom models never run the binary.
#[cfg(not(loom))]
mod ui;
mod work;

use clap::{Args, CommandFactory, Parser, Subcommand};
use leasehold::{Client, DriftBound, Error, Field, Holder, HolderId, QueuePolicy, Store};
use out::parse_duration;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

pub const EXIT_ERROR: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
const EXIT_HELD: u8 = 75;
const EXIT_LOST: u8 = 76;
/// The store was moved by `leasehold migrate` (the message names where).
pub const EXIT_MOVED: u8 = 78;

const AFTER_HELP: &str = "\
Durations use the humantime grammar: 250ms, 1.5s, 30s, 5m, 1h30m, 2d.

Exit codes: 0 ok, 1 error (the message names the cause), 2 usage, 74 stdout
could not be written, 75 the lease is held by someone else, 76 the lease was
lost while the command ran, 78 the store was moved by `leasehold migrate`
(the message names the new one), 126 the command is not executable, 127 the
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
    #[command(flatten)]
    log: telemetry::LogArgs,
    #[command(subcommand)]
    command: Cmd,
}

/// How jobs are retried and how far a holder's clock may drift.
#[derive(Args)]
pub struct PolicyArgs {
    /// Backoff after a job's first failed attempt (doubles per attempt, with jitter).
    #[arg(long, global = true, value_parser = parse_duration, default_value = defaults::BACKOFF.as_str(), help_heading = "Policy")]
    backoff: Duration,
    /// Longest backoff between attempts.
    #[arg(long, global = true, value_parser = parse_duration, default_value = defaults::BACKOFF_MAX.as_str(), help_heading = "Policy")]
    backoff_max: Duration,
    /// A job whose claims expired this many times is dead (a crash loop); 0: never.
    #[arg(long, global = true, default_value_t = defaults::quarantine_after(), help_heading = "Policy")]
    quarantine_after: u32,
    /// Largest drift between a holder's clock and the store's, in parts per million.
    #[arg(long, global = true, default_value_t = defaults::drift_ppm(), value_parser = clap::value_parser!(u32).range(0..=500_000), help_heading = "Policy")]
    drift_ppm: u32,
    /// Extra margin a holder keeps before its lease's end.
    #[arg(long, global = true, value_parser = parse_duration, default_value = defaults::DRIFT_MARGIN.as_str(), help_heading = "Policy")]
    drift_margin: Duration,
}

#[derive(Subcommand)]
enum Cmd {
    /// Locks: acquire, renew, release, status.
    #[command(subcommand)]
    Lock(lock::LockCmd),
    /// The job queue.
    #[command(subcommand)]
    Queue(queue::QueueCmd),
    /// Run a command under a lease (like flock(1), but expiring and fenced).
    Run(run::RunArgs),
    /// Campaign for leadership of a key; run a command while leader.
    Elect(elect::ElectArgs),
    /// Move everything to another store (SQLite -> PostgreSQL, or back), live.
    Migrate(migrate::MigrateArgs),
    /// Serve the web dashboard: queues, jobs, leases; retry, cancel, purge.
    #[cfg(not(loom))]
    Ui(ui::UiArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on stdout.
    Man,
}

/// A failure with its exit code; the message goes to stderr (under
/// `--log json`, an event with the exit code and the fields).
pub struct Fail {
    pub code: u8,
    pub message: String,
    pub fields: out::Fields,
}

impl Fail {
    pub fn new(code: u8, message: String) -> Fail {
        Fail {
            code,
            message,
            fields: Vec::new(),
        }
    }

    /// Say what failed (an error event under `--log json`); the exit code.
    fn report(self) -> u8 {
        let mut fields = self.fields;
        fields.push(("exit_code", self.code.into()));
        out::say(out::Level::Error, &self.message, &fields);
        self.code
    }
}

/// The command-line name of the field an error names.
fn flag_of(field: Field) -> &'static str {
    match field {
        Field::Key => "KEY",
        Field::Queue => "QUEUE",
        Field::Ttl => "--ttl",
        Field::Lease => "--lease",
        Field::Limit | Field::Batch => "--limit",
        Field::Payload => "--payload",
        Field::MaxAttempts => "--max-attempts",
        Field::Delay => "--delay",
        Field::RunAt => "--at",
        Field::UniqueKey => "--unique",
        Field::UniqueFor => "--unique-for",
        Field::UniqueStates => "--unique-states",
        Field::ConcurrencyKey => "--key",
        Field::Concurrency => "--concurrency",
        Field::PerKey => "--per-key",
        Field::Rate => "--rate",
        Field::PerKeyRate => "--per-key-rate",
        Field::Timeout => "--timeout",
        Field::Holder => "--holder",
        Field::HolderLabel => "--label",
        Field::State => "--state",
        Field::Store => "--store",
        Field::Every => "--every",
        Field::Cron => "--cron",
        Field::Tz => "--tz",
        Field::Missed => "--missed",
        Field::Schedule => "NAME",
        other => other.as_str(),
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        match &e {
            Error::Held { key, .. } => Fail {
                fields: vec![("key", key.as_str().into())],
                ..Fail::new(EXIT_HELD, e.to_string())
            },
            Error::Moved { to } => Fail {
                fields: vec![("moved_to", to.as_str().into())],
                ..Fail::new(EXIT_MOVED, e.to_string())
            },
            Error::Invalid { field, reason } => Fail {
                fields: vec![("flag", flag_of(*field).into())],
                ..Fail::new(EXIT_ERROR, format!("invalid {}: {reason}", flag_of(*field)))
            },
            _ => Fail::new(EXIT_ERROR, e.to_string()),
        }
    }
}

impl From<std::io::Error> for Fail {
    fn from(e: std::io::Error) -> Self {
        Fail::new(out::EXIT_IOERR, format!("writing to stdout: {e}"))
    }
}

pub type CliResult = Result<u8, Fail>;

/// What `lock acquire` records by default: who called leasehold (its
/// parent, which outlives this short-lived process).
pub fn caller_label() -> String {
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
pub fn client_for(
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

/// Open the store the URL names; `mem:` would be a store private to this
/// one process, so the command line refuses it.
fn open_store(url: &str) -> Result<Arc<dyn Store>, Fail> {
    if url == "mem:" || url.starts_with("mem:") {
        return Err(Fail::new(
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
            .map_err(|e| Fail::new(EXIT_ERROR, format!("rendering the man page: {e}")))?,
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
        Err(e) => return ExitCode::from(telemetry::usage_error(&e)),
    };
    let Cli {
        store,
        policy,
        log,
        command,
    } = cli;
    if let Err(fail) = telemetry::init_logging(&log) {
        return ExitCode::from(fail.report());
    }
    let result = match command {
        Cmd::Completions { shell } => generated(Some(shell)),
        Cmd::Man => generated(None),
        Cmd::Lock(cmd) => open_store(&store).and_then(|s| lock::lock(s, &policy, cmd)),
        Cmd::Migrate(args) => migrate::run(&store, args),
        Cmd::Queue(cmd) => open_store(&store).and_then(|s| queue::queue(s, &policy, cmd)),
        #[cfg(not(loom))]
        Cmd::Ui(args) => open_store(&store).and_then(|s| ui::ui(s, &policy, args)),
        Cmd::Run(args) => open_store(&store)
            .and_then(|s| client_for(s, &policy, None, None))
            .and_then(|c| run::run(c, args)),
        Cmd::Elect(args) => open_store(&store)
            .and_then(|s| client_for(s, &policy, None, args.label()))
            .and_then(|c| elect::elect(c, args)),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(fail) => ExitCode::from(fail.report()),
    }
}
