//! `leasehold`: expiring, fenced locks and a leased job queue from the shell.
//!
//! Machine output is one JSON object per line on stdout; messages for people
//! go to stderr. Exit codes: 0 ok, 1 error, 2 usage, 75 the lease is held by
//! someone else, 76 the lease was lost while `run`'s command ran.

#![allow(clippy::disallowed_methods)] // the CLI spawns threads and reads real time

use clap::{Args, Parser, Subcommand};
use leasehold::core::lease::LeaseInfo;
use leasehold::{
    store, ClaimedJob, Client, Error, Holder, HolderId, JobId, JobRecord, JobSpec, JobState,
    LeaseOptions, Store,
};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const EXIT_ERROR: u8 = 1;
const EXIT_HELD: u8 = 75;
const EXIT_LOST: u8 = 76;

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Expiring, fenced leases and a leased job queue"
)]
struct Cli {
    /// Store URL: sqlite:PATH, or file:DIR (leases only; postgres://... is planned).
    #[arg(
        long,
        env = "LEASEHOLD_STORE",
        default_value = "sqlite:leasehold.db",
        global = true
    )]
    store: String,
    #[command(subcommand)]
    command: Cmd,
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
    Run(RunArgs),
}

#[derive(Subcommand)]
enum LockCmd {
    /// Acquire KEY; prints the holder and token to renew or release it with.
    Acquire {
        key: String,
        #[arg(long, value_parser = parse_duration)]
        ttl: Duration,
        /// Holder id (a UUID); a fresh one is made if absent.
        #[arg(long)]
        holder: Option<String>,
        /// Text recorded with the holder (default: host:pid).
        #[arg(long)]
        label: Option<String>,
        /// Wait this long for the key if it is held.
        #[arg(long, value_parser = parse_duration, default_value = "0s")]
        wait: Duration,
        /// Allow up to N holders at once.
        #[arg(long, default_value_t = 1)]
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
        #[arg(long, value_parser = parse_duration, default_value = "0s")]
        delay: Duration,
        #[arg(long, default_value_t = 3)]
        max_attempts: u32,
        /// Deduplicate: return the live job with this key instead.
        #[arg(long)]
        unique: Option<String>,
    },
    /// Claim jobs and run CMD for each (payload on stdin).
    Work(WorkArgs),
    /// Jobs per state.
    Stats { queue: String },
    /// Jobs, one JSON line each.
    List {
        queue: String,
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 0)]
        after: u64,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
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

#[derive(Args)]
struct WorkArgs {
    queue: String,
    /// Lease of each claim; renewed about every third of it while CMD runs.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    lease: Duration,
    /// Jobs run at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Exit once no job is ready, running or waiting for a retry.
    #[arg(long)]
    drain: bool,
    /// After SIGTERM, or a lost claim, wait this long before SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    grace: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

#[derive(Args)]
struct RunArgs {
    key: String,
    #[arg(long, value_parser = parse_duration)]
    ttl: Duration,
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    wait: Duration,
    /// After the lease is lost, wait this long between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    grace: Duration,
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

/// `250ms`, `30s`, `5m`, `1h`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} needs a unit: ms, s, m or h"))?;
    let (num, unit) = text.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (ms, s, m or h)")),
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn emit(v: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// A failure with its exit code; the message goes to stderr.
struct Fail(u8, String);

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        match &e {
            Error::Held { .. } => Fail(EXIT_HELD, e.to_string()),
            _ => Fail(EXIT_ERROR, e.to_string()),
        }
    }
}

type CliResult = Result<u8, Fail>;

/// `expires_at_ms` is on the store's clock (boot time for SQLite);
/// `expires_in_ms` is what people want to read.
fn holder_json(h: &leasehold::HolderInfo, now_ms: u64) -> Value {
    json!({
        "holder": h.holder.id.to_string(),
        "label": h.holder.label.as_deref(),
        "token": h.token,
        "expires_at_ms": h.expires_at_ms,
        "expires_in_ms": h.expires_at_ms.saturating_sub(now_ms),
    })
}

fn status_json(key: &str, info: &LeaseInfo) -> Value {
    json!({
        "key": key,
        "last_token": info.last_token,
        "now_ms": info.now_ms,
        "holders": info.holders.iter().map(|h| holder_json(h, info.now_ms)).collect::<Vec<_>>(),
    })
}

fn job_json(j: &JobRecord) -> Value {
    let payload = match std::str::from_utf8(&j.payload) {
        Ok(s) => json!(s),
        Err(_) => {
            json!({ "hex": j.payload.iter().map(|b| format!("{b:02x}")).collect::<String>() })
        }
    };
    json!({
        "id": j.id.0,
        "queue": &*j.queue,
        "state": j.state.as_str(),
        "priority": j.priority,
        "run_at_ms": j.run_at_ms,
        "created_at_ms": j.created_at_ms,
        "attempts": j.attempts,
        "max_attempts": j.max_attempts,
        "expiries": j.expiries,
        "cancel_requested": j.cancel_requested,
        "last_error": j.last_error.as_deref(),
        "unique_key": j.unique_key.as_deref(),
        "finished_at_ms": j.finished_at_ms,
        "payload": payload,
    })
}

fn client_for(
    store: Arc<dyn Store>,
    holder: Option<&str>,
    label: Option<&str>,
) -> Result<Client, Fail> {
    let id = match holder {
        Some(h) => HolderId::parse(h)?,
        None => leasehold::random_holder_id(),
    };
    let holder = match label {
        Some(l) => Holder::with_label(id, l)?,
        None => Holder::new(id).labelled_default(),
    };
    Ok(Client::builder_shared(store).holder(holder).build())
}

fn held_message(client: &Client, key: &str, e: &Error) {
    if let Error::Held { .. } = e {
        // Re-read for the store's clock, so that "until when" is readable.
        if let Ok(info) = client.inspect(key) {
            let mut v = status_json(key, &info);
            v["held"] = json!(true);
            emit(v);
        }
    }
}

fn lock(store: Arc<dyn Store>, cmd: LockCmd) -> CliResult {
    match cmd {
        LockCmd::Acquire {
            key,
            ttl,
            holder,
            label,
            wait,
            limit,
        } => {
            let client = client_for(store, holder.as_deref(), label.as_deref())?;
            let opts = LeaseOptions::new(ttl).limit(limit).wait(wait);
            match client.acquire(&key, opts) {
                Ok(guard) => {
                    let info = client.inspect(&key)?;
                    let (key, token) = guard.detach();
                    let mine = info.holders.iter().find(|h| h.token == token);
                    emit(json!({
                        "key": key,
                        "holder": client.holder().id.to_string(),
                        "label": client.holder().label.as_deref(),
                        "token": token,
                        "ttl_ms": ms(ttl),
                        "expires_at_ms": mine.map(|h| h.expires_at_ms),
                    }));
                    Ok(0)
                }
                Err(e) => {
                    held_message(&client, &key, &e);
                    Err(e.into())
                }
            }
        }
        LockCmd::Renew {
            key,
            holder,
            token,
            ttl,
        } => {
            let client = client_for(store, Some(&holder), None)?;
            let grant = client.renew(&key, token, ttl)?;
            emit(
                json!({"key": key, "holder": holder, "token": token, "expires_at_ms": grant.expires_at_ms}),
            );
            Ok(0)
        }
        LockCmd::Release { key, holder, token } => {
            let client = client_for(store, Some(&holder), None)?;
            client.release(&key, token)?;
            emit(json!({"key": key, "released": true, "token": token}));
            Ok(0)
        }
        LockCmd::Status { key } => {
            let client = client_for(store, None, None)?;
            let info = client.inspect(&key)?;
            emit(status_json(&key, &info));
            Ok(0)
        }
    }
}

fn queue(store: Arc<dyn Store>, cmd: QueueCmd) -> CliResult {
    let client = client_for(store, None, None)?;
    match cmd {
        QueueCmd::Push {
            queue,
            payload,
            priority,
            delay,
            max_attempts,
            unique,
        } => {
            let payload = match payload {
                Some(p) => p.into_bytes(),
                None => {
                    let mut buf = Vec::new();
                    std::io::stdin().read_to_end(&mut buf).map_err(|e| {
                        Fail(EXIT_ERROR, format!("reading the payload from stdin: {e}"))
                    })?;
                    buf
                }
            };
            let spec = JobSpec {
                payload,
                priority,
                delay_ms: ms(delay),
                run_at_ms: None,
                max_attempts,
                unique_key: unique,
            };
            let out = client.queue(&queue)?.push(&spec)?;
            emit(json!({"id": out.id.0, "created": out.created}));
            Ok(0)
        }
        QueueCmd::Work(args) => work(client, args),
        QueueCmd::Stats { queue } => {
            let c = client.queue(&queue)?.stats()?;
            let mut obj = serde_json::Map::new();
            for s in JobState::ALL {
                obj.insert(s.as_str().to_owned(), json!(c.get(s)));
            }
            emit(Value::Object(obj));
            Ok(0)
        }
        QueueCmd::List {
            queue,
            state,
            after,
            limit,
        } => {
            let state = state.as_deref().map(JobState::parse).transpose()?;
            for j in client.queue(&queue)?.list(state, JobId(after), limit)? {
                emit(job_json(&j));
            }
            Ok(0)
        }
        QueueCmd::Cancel { id } => {
            let state = client.cancel_job(JobId(id))?;
            emit(
                json!({"id": id, "state": state.as_str(), "cancel_requested": state == JobState::Running}),
            );
            Ok(0)
        }
        QueueCmd::Retry { id } => {
            client.retry_job(JobId(id))?;
            emit(json!({"id": id, "state": "ready"}));
            Ok(0)
        }
        QueueCmd::Purge { queue, older_than } => {
            let n = client.queue(&queue)?.purge(older_than)?;
            emit(json!({"queue": queue, "purged": n}));
            Ok(0)
        }
    }
}

// ----------------------------------------------------------------- signals

/// The last SIGTERM/SIGINT received (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut action.sa_mask);
            action.sa_flags = libc::SA_RESTART;
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// A command that dies with us: if leasehold is killed, the command must
/// not go on acting under a lease nobody renews.
fn command(cmd: &[String]) -> Command {
    let mut c = Command::new(&cmd[0]);
    c.args(&cmd[1..]);
    // SAFETY: prctl is async-signal-safe and touches only the child.
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    c
}

/// Where a job command's stdout goes: our stderr.
fn child_stdout() -> Stdio {
    use std::os::fd::AsFd;
    match std::io::stderr().as_fd().try_clone_to_owned() {
        Ok(fd) => Stdio::from(fd),
        Err(_) => Stdio::null(),
    }
}

fn signal_child(child: &Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: sending a signal to our own child.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// SIGTERM, then SIGKILL after `grace`; returns the exit status.
fn stop_child(child: &mut Child, grace: Duration) -> std::process::ExitStatus {
    signal_child(child, libc::SIGTERM);
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        if start.elapsed() >= grace {
            let _ = child.kill();
            if let Ok(status) = child.wait() {
                return status;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn exit_code_of(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(EXIT_ERROR),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(EXIT_ERROR),
        _ => EXIT_ERROR,
    }
}

// -------------------------------------------------------------------- run

fn run(store: Arc<dyn Store>, args: RunArgs) -> CliResult {
    install_signal_handlers();
    let client = client_for(store, None, None)?;
    let guard = match client.acquire(&args.key, LeaseOptions::new(args.ttl).wait(args.wait)) {
        Ok(g) => g,
        Err(e) => {
            held_message(&client, &args.key, &e);
            return Err(e.into());
        }
    };
    let lost = Arc::new(AtomicBool::new(false));
    let flag = lost.clone();
    guard.keep_alive(move |_| flag.store(true, Ordering::SeqCst))?;
    let mut child = command(&args.cmd)
        .env("LEASEHOLD_TOKEN", guard.token().to_string())
        .env("LEASEHOLD_KEY", &args.key)
        .spawn()
        .map_err(|e| Fail(EXIT_ERROR, format!("starting {:?}: {e}", args.cmd[0])))?;
    eprintln!(
        "leasehold: {} holds {:?} with token {}; running {:?} (pid {})",
        client.holder().id,
        args.key,
        guard.token(),
        args.cmd[0],
        child.id()
    );
    let poll = Duration::from_millis((ms(args.ttl) / 20).clamp(5, 100));
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let released = guard.release();
            if let Err(e) = released {
                eprintln!("leasehold: releasing {:?}: {e}", args.key);
            }
            return Ok(exit_code_of(status));
        }
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            signal_child(&child, sig);
        }
        if lost.load(Ordering::SeqCst) || !guard.is_valid() {
            eprintln!(
                "leasehold: lease {:?} lost ({}); stopping {:?}",
                args.key,
                guard
                    .lost()
                    .map_or("local deadline passed".to_owned(), |r| r.to_string()),
                args.cmd[0]
            );
            stop_child(&mut child, args.grace);
            let _ = guard.release();
            return Ok(EXIT_LOST);
        }
        std::thread::sleep(poll);
    }
}

// ------------------------------------------------------------------- work

fn drained(client: &Client, queue: &str) -> Result<bool, Error> {
    let q = client.queue(queue)?;
    let c = q.stats()?;
    if c.get(JobState::Ready) > 0 || c.get(JobState::Running) > 0 {
        return Ok(false);
    }
    // Jobs waiting for a retry are part of the work; delayed new jobs are not.
    let scheduled = q.list(Some(JobState::Scheduled), JobId(0), 1000)?;
    Ok(!scheduled.iter().any(|j| j.attempts > 0))
}

fn run_job(job: &ClaimedJob, args: &WorkArgs) -> Result<(&'static str, Option<i32>), Error> {
    let lost = Arc::new(AtomicBool::new(false));
    let flag = lost.clone();
    job.heartbeat_in_background(move |_| flag.store(true, Ordering::SeqCst))?;
    let spawned = command(&args.cmd)
        .env("LEASEHOLD_JOB_ID", job.id().to_string())
        .env("LEASEHOLD_ATTEMPT", job.attempt().to_string())
        .env("LEASEHOLD_TOKEN", job.token().to_string())
        .env("LEASEHOLD_QUEUE", &args.queue)
        .stdin(Stdio::piped())
        // stdout carries our JSON lines: the command's output goes to stderr.
        .stdout(child_stdout())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let reason = format!("could not start {:?}: {e}", args.cmd[0]);
            let state = job.fail(&reason)?;
            return Ok((state.as_str(), None));
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its stdin is fine.
        let _ = stdin.write_all(job.payload());
    }
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if lost.load(Ordering::SeqCst) || !job.is_valid() {
            stop_child(&mut child, args.grace);
            return Ok(("lost", None));
        }
        if job.cancel_requested() {
            let status = stop_child(&mut child, args.grace);
            let state = job.fail("cancelled while running")?;
            return Ok((state.as_str(), status.code()));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if status.success() {
        job.complete()?;
        Ok(("done", Some(0)))
    } else {
        let reason = match (status.code(), status.signal()) {
            (Some(c), _) => format!("command exited with status {c}"),
            (None, Some(s)) => format!("command killed by signal {s}"),
            _ => "command failed".to_owned(),
        };
        let state = job.fail(&reason)?;
        Ok((state.as_str(), status.code()))
    }
}

fn work(client: Client, args: WorkArgs) -> CliResult {
    install_signal_handlers();
    let args = Arc::new(args);
    let threads = args.concurrency.clamp(1, 256);
    let mut handles = Vec::new();
    for _ in 0..threads {
        let (client, args) = (client.clone(), args.clone());
        handles.push(std::thread::spawn(move || -> Result<(), Error> {
            let q = client.queue(&args.queue)?;
            let mut idle_ms = 1u64;
            while SIGNAL.load(Ordering::SeqCst) == 0 {
                let Some(job) = q.claim(args.lease)? else {
                    if args.drain && drained(&client, &args.queue)? {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(idle_ms));
                    idle_ms = (idle_ms * 2).min(200);
                    continue;
                };
                idle_ms = 1;
                let (id, attempt) = (job.id().0, job.attempt());
                let outcome = match run_job(&job, &args) {
                    Ok(o) => o,
                    Err(e) if e.is_lost() || e.is_ambiguous() => ("lost", None),
                    Err(e) => return Err(e),
                };
                emit(
                    json!({"id": id, "attempt": attempt, "outcome": outcome.0, "exit": outcome.1}),
                );
            }
            Ok(())
        }));
    }
    let mut failure = None;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = Some(Fail::from(e)),
            Err(_) => failure = Some(Fail(EXIT_ERROR, "a worker thread panicked".to_owned())),
        }
    }
    match failure {
        Some(f) => Err(f),
        None => Ok(0),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = store::open_url(&cli.store)
        .map_err(Fail::from)
        .and_then(|store| match cli.command {
            Cmd::Lock(cmd) => lock(store, cmd),
            Cmd::Queue(cmd) => queue(store, cmd),
            Cmd::Run(args) => run(store, args),
        });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Fail(code, message)) => {
            eprintln!("leasehold: {message}");
            ExitCode::from(code)
        }
    }
}
