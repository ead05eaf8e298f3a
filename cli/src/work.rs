//! `leasehold queue work QUEUE -- CMD`: the library's worker loop
//! ([`leasehold::Queue::work_with`]) with a handler that runs CMD per job,
//! contained ([`crate::contain`]).
//!
//! The payload goes to CMD's stdin from a thread of its own, so a loss or a
//! cancel is acted on within the poll interval whatever the payload's size
//! and whether or not CMD reads it. CMD's stdout goes to our stderr: stdout
//! carries one JSON line per job. CMD's output is CMD's: under `--log
//! json` it stays as CMD wrote it, among leasehold's JSON lines.

use crate::contain::{self, Mode, Spec, StartError};
use crate::defaults;
use crate::out::{self, emit, parse_duration, Level};
use crate::run::{install_signal_handlers, poke_signal_pipe, sleep_until_signal, SIGNAL};
use crate::{CliResult, Fail};
use clap::Args;
use leasehold::core::job::Progress;
use leasehold::{ClaimedJob, Client, JobOutcome, JobRecord, JobState, StopSignal, WorkOptions};
use serde_json::json;
use std::io::{IsTerminal, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, LazyLock, Mutex};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct WorkArgs {
    queue: String,
    /// Lease of each claim; renewed about every third of it while CMD runs.
    #[arg(long, value_parser = parse_duration, default_value = defaults::LEASE.as_str())]
    lease: Duration,
    /// Jobs run at once.
    #[arg(long, default_value_t = defaults::concurrency(), value_parser = clap::value_parser!(u64).range(defaults::concurrency_range()))]
    concurrency: u64,
    /// Exit once nothing is ready, running or due (retries waiting out
    /// their backoff count as due; jobs delayed before their first attempt
    /// do not).
    #[arg(long)]
    drain: bool,
    /// Between SIGTERM and SIGKILL when a job's process tree is stopped (a
    /// lost claim, a cancel, SIGTERM to leasehold).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    grace: Duration,
    /// How each job's process tree is contained.
    #[arg(long, value_enum, env = "LEASEHOLD_CONTAIN", default_value = "auto")]
    contain: Mode,
    #[arg(long, help = defaults::KEEP_STDOUT_HELP.as_str())]
    keep_stdout: bool,
    /// Serve Prometheus metrics at this address (e.g. 127.0.0.1:9187), and
    /// sample the queue's depth every 5 s for them.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Fire none of the queue's schedules (by default a worker fires
    /// each tick as it comes due: one job per tick however many run).
    #[arg(long)]
    no_schedules: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

/// Set once SIGTERM or SIGINT arrived: claim nothing more.
static STOPPING: LazyLock<StopSignal> = LazyLock::new(StopSignal::new);

/// Where a job command's stdout goes: our stderr.
fn child_stdout() -> Stdio {
    match std::io::stderr().as_fd().try_clone_to_owned() {
        Ok(fd) => Stdio::from(fd),
        Err(_) => Stdio::null(),
    }
}

/// The payload on CMD's stdin, written by a thread of its own; it ends
/// with EPIPE once the whole tree is gone.
fn payload_stdin(payload: &[u8]) -> Result<Stdio, String> {
    let (reader, writer) =
        contain::pipe().map_err(|e| format!("creating the payload pipe: {e}"))?;
    let mut writer = std::fs::File::from(writer);
    let payload = payload.to_vec();
    std::thread::Builder::new()
        .name("leasehold-payload".to_owned())
        .spawn(move || {
            // A command that does not read its stdin is fine.
            let _ = writer.write_all(&payload);
        })
        .map_err(|e| format!("starting the payload writer: {e}"))?;
    Ok(Stdio::from(reader))
}

/// CMD's stdout, read to its end by a thread of its own (at most one
/// byte past the limit a result may have is kept; the rest is drained).
fn captured_stdout() -> Result<(Stdio, std::thread::JoinHandle<Vec<u8>>), String> {
    let (reader, writer) = contain::pipe().map_err(|e| format!("creating the stdout pipe: {e}"))?;
    let limit = leasehold::core::MAX_PAYLOAD_BYTES as u64 + 1;
    let thread = std::thread::Builder::new()
        .name("leasehold-stdout".to_owned())
        .spawn(move || {
            let mut out = Vec::new();
            let mut reader = std::fs::File::from(reader);
            let _ =
                std::io::Read::read_to_end(&mut std::io::Read::take(&mut reader, limit), &mut out);
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
            out
        })
        .map_err(|e| format!("starting the stdout reader: {e}"))?;
    Ok((Stdio::from(writer), thread))
}

/// The descriptor CMD writes its progress lines to (`LEASEHOLD_PROGRESS_FD`).
const PROGRESS_FD: i32 = 3;

/// A progress line CMD wrote on `LEASEHOLD_PROGRESS_FD`: `PERCENT
/// [MESSAGE]`, optionally after the word `LEASEHOLD_PROGRESS` (so that a
/// line written to stderr by mistake still reads the same), e.g.
/// `40 tiles 400/1000` or `LEASEHOLD_PROGRESS 12.5`.
fn progress_line(line: &str) -> Result<(f64, &str), String> {
    let line = line.trim_end_matches(['\r', '\n']);
    let line = line.strip_prefix("LEASEHOLD_PROGRESS ").unwrap_or(line);
    let (percent, message) = line.split_once(' ').unwrap_or((line, ""));
    let percent: f64 = percent
        .parse()
        .map_err(|_| format!("{percent:?} is not a percentage"))?;
    Ok((percent / 100.0, message.trim_start()))
}

/// The longest progress line kept (the rest of a longer one is read and
/// dropped, and the line skipped).
const PROGRESS_LINE_MAX: u64 = 4096;

/// A pipe whose write end CMD inherits (as `LEASEHOLD_PROGRESS_FD`), and
/// the progress reports read from it by a thread of its own, to the end of
/// the pipe whatever comes: a line that is too long, not UTF-8 or does not
/// parse is said on stderr and skipped, and reading goes on after the
/// handler stopped listening, so CMD never writes into a closed pipe.
fn progress_pipe(id: leasehold::JobId) -> Result<(OwnedFd, mpsc::Receiver<Progress>), String> {
    let (reader, writer) =
        contain::pipe().map_err(|e| format!("creating the progress pipe: {e}"))?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("leasehold-progress".to_owned())
        .spawn(move || {
            use std::io::{BufRead, Read};
            let mut pipe = std::io::BufReader::new(std::fs::File::from(reader));
            let mut line = Vec::new();
            loop {
                line.clear();
                match (&mut pipe)
                    .take(PROGRESS_LINE_MAX)
                    .read_until(b'\n', &mut line)
                {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let overlong = !line.ends_with(b"\n") && line.len() as u64 >= PROGRESS_LINE_MAX;
                if overlong {
                    // Drop the rest of the line.
                    let _ = pipe.skip_until(b'\n');
                }
                let text = String::from_utf8_lossy(&line);
                let parsed = match overlong {
                    true => Err(format!("longer than {PROGRESS_LINE_MAX} bytes")),
                    false => progress_line(&text)
                        .and_then(|(f, m)| Progress::new(f, m).map_err(|e| e.to_string())),
                };
                match parsed {
                    // A handler gone (its job ended) just stops listening.
                    Ok(p) => drop(tx.send(p)),
                    Err(e) => eprintln!(
                        "leasehold: job {id}: progress line {:?} skipped: {e}",
                        text.trim_end()
                    ),
                }
            }
        })
        .map_err(|e| format!("starting the progress reader: {e}"))?;
    Ok((writer, rx))
}

/// Pass the newest report read so far to the job (sent with its next
/// renewal round or its settle).
fn forward_progress(job: &ClaimedJob, reports: &mpsc::Receiver<Progress>) {
    if let Some(p) = reports.try_iter().last() {
        let _ = job.progress(p.fraction(), &p.message);
    }
}

/// Run CMD for one job: `Ok` on exit 0 (with its stdout as the job's
/// result under `--keep-stdout`), else the reason it failed.
fn handle(job: &ClaimedJob, args: &WorkArgs) -> Result<(), String> {
    let stdin = payload_stdin(job.payload())?;
    let (stdout, captured) = if args.keep_stdout {
        let (stdout, thread) = captured_stdout()?;
        (stdout, Some(thread))
    } else {
        (child_stdout(), None)
    };
    let mut env = vec![
        ("LEASEHOLD_JOB_ID", job.id().to_string()),
        ("LEASEHOLD_ATTEMPT", job.attempt().to_string()),
        ("LEASEHOLD_TOKEN", job.token().to_string()),
        ("LEASEHOLD_QUEUE", args.queue.clone()),
    ];
    if let Some(key) = &job.record().key {
        env.push(("LEASEHOLD_JOB_KEY", key.to_string()));
    }
    let (progress_w, reports) = progress_pipe(job.id())?;
    env.push(("LEASEHOLD_PROGRESS_FD", PROGRESS_FD.to_string()));
    let spawned = contain::spawn(Spec {
        cmd: &args.cmd,
        env,
        stdin,
        stdout,
        inherit: vec![(progress_w.as_raw_fd(), PROGRESS_FD)],
        grace: args.grace,
        mode: args.contain,
    });
    drop(progress_w);
    let mut child = match spawned {
        Ok(c) => c,
        Err(StartError::Exec { message, .. } | StartError::Other(message)) => return Err(message),
    };
    let mut forwarded = false;
    let code = loop {
        if let Some(code) = child.try_wait() {
            break code;
        }
        if !job.is_valid() {
            child.stop_and_wait(libc::SIGTERM, args.grace);
            return Err("the claim was lost while the command ran".to_owned());
        }
        if job.cancel_requested() {
            child.stop_and_wait(libc::SIGTERM, args.grace);
            return Err("cancelled while running".to_owned());
        }
        if !forwarded && STOPPING.is_set() {
            // Shutting down: the whole tree gets the signal, SIGKILL after
            // the grace period; its status decides the job.
            forwarded = true;
            let sig = match SIGNAL.load(Ordering::SeqCst) {
                0 => libc::SIGTERM,
                s => s,
            };
            child.stop(sig, args.grace);
        }
        forward_progress(job, &reports);
        // Woken at once by CMD's exit; loss, cancel, shutdown and progress
        // are looked at every 20 ms.
        child.sleep_until_exit(Duration::from_millis(20), None);
    };
    // CMD's tree is gone: the reader sees the end of the pipe soon after
    // its last lines, the newest of which goes with the settle (within
    // 200 ms: a process that escaped containment may hold the pipe open).
    let mut last = None;
    let until = Instant::now() + Duration::from_millis(200);
    while let Ok(p) = reports.recv_timeout(until.saturating_duration_since(Instant::now())) {
        last = Some(p);
    }
    if let Some(p) = last {
        let _ = job.progress(p.fraction(), &p.message);
    }
    let output = captured.map(|t| t.join().unwrap_or_default());
    match code {
        0 => match output {
            Some(result) => job
                .set_result(result)
                .map_err(|e| format!("its stdout: {e}")),
            None => Ok(()),
        },
        c if c > 128 => Err(format!(
            "command exited with status {c} (killed by signal {}?)",
            c - 128
        )),
        c => Err(format!("command exited with status {c}")),
    }
}

/// A progress line on a terminal while draining: jobs done, rate, ETA.
fn progress(client: &Client, queue: &str) -> Option<indicatif::ProgressBar> {
    // Under `--log json` stderr is for JSON lines only.
    let terminal = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    if !terminal || out::json_notes() {
        return None;
    }
    let counts = client.queue(queue).ok()?.stats().ok()?;
    let todo =
        counts.get(JobState::Ready) + counts.get(JobState::Running) + counts.get(JobState::Waiting);
    let bar = indicatif::ProgressBar::new(todo);
    let style =
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} jobs  {per_sec}  ETA {eta}")
            .ok()?;
    bar.set_style(style);
    Some(bar)
}

/// What the loop's outcomes add up to: one JSON line each, the progress
/// bar, and the first failure to write stdout.
struct Tally {
    bar: Option<indicatif::ProgressBar>,
    done: AtomicU64,
    emit_failed: Mutex<Option<std::io::Error>>,
}

impl Tally {
    fn record(&self, job: &JobRecord, outcome: JobOutcome) {
        let name = match outcome {
            JobOutcome::Done => "done",
            JobOutcome::Failed(state) => state.as_str(),
            JobOutcome::Abandoned(_) => "abandoned",
            JobOutcome::Lost => "lost",
        };
        let line = json!({"id": job.id.0, "attempt": job.attempts, "outcome": name});
        if let Err(e) = emit(&line) {
            // Keep working (the jobs are recorded in the store), but report
            // the lost output when the loop ends.
            if let Ok(mut slot) = self.emit_failed.lock() {
                slot.get_or_insert(e);
            }
        }
        let n = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(bar) = &self.bar {
            if n > bar.length().unwrap_or(0) {
                bar.set_length(n);
            }
            bar.set_position(n);
        }
    }
}

pub fn work(client: Client, args: WorkArgs) -> CliResult {
    install_signal_handlers();
    let queue = client.queue(&args.queue)?;
    // Released when dropped (on every way out of this function).
    let _presence = crate::presence::announce(&client, args.lease);
    let opts = WorkOptions {
        lease: args.lease,
        concurrency: args.concurrency as usize,
        drain: args.drain,
        // After SIGTERM the job's tree has --grace before SIGKILL; its
        // status then decides the job. Only a handler stuck past that is
        // given back.
        shutdown_grace: args.grace + Duration::from_secs(2),
        sample: args.metrics.as_ref().map(|_| Duration::from_secs(5)),
        schedules: if args.no_schedules {
            None
        } else {
            WorkOptions::default().schedules
        },
        ..WorkOptions::default()
    };
    if let Some(addr) = &args.metrics {
        crate::telemetry::serve_metrics(addr)?;
    }
    let started = Instant::now();
    let tally = Tally {
        bar: if args.drain {
            progress(&client, &args.queue)
        } else {
            None
        },
        done: AtomicU64::new(0),
        emit_failed: Mutex::new(None),
    };
    if let (Some(bar), Ok(mut slot)) = (&tally.bar, out::PROGRESS.lock()) {
        *slot = Some(bar.clone());
    }
    // SIGTERM/SIGINT: stop claiming; the running jobs' trees get the signal.
    let watcher_done = AtomicBool::new(false);
    let report = std::thread::scope(|s| {
        s.spawn(|| {
            // Asleep on the signal pipe while nothing happens (no timer).
            while !watcher_done.load(Ordering::SeqCst) {
                if SIGNAL.load(Ordering::SeqCst) != 0 {
                    STOPPING.set();
                }
                sleep_until_signal(Duration::from_secs(60));
            }
        });
        let report = queue.work_with(
            &opts,
            &*STOPPING,
            |job| handle(job, &args),
            |job, outcome| tally.record(job, outcome),
        );
        watcher_done.store(true, Ordering::SeqCst);
        poke_signal_pipe();
        report
    });
    if let Some(bar) = &tally.bar {
        bar.finish_and_clear();
    }
    let report = report?;
    if args.drain {
        let elapsed = started.elapsed();
        let secs = elapsed.as_secs_f64().max(1e-3);
        let message = format!(
            "drained {:?}: {} done, {} failed, {} lost in {secs:.1}s",
            args.queue, report.completed, report.failed, report.lost
        );
        let fields = [
            ("queue", json!(args.queue)),
            ("done", json!(report.completed)),
            ("failed", json!(report.failed)),
            ("lost", json!(report.lost)),
            ("abandoned", json!(report.abandoned)),
            ("elapsed_ms", json!(out::ms(elapsed))),
        ];
        out::say(Level::Info, &message, &fields);
    }
    match tally.emit_failed.into_inner().ok().flatten() {
        Some(e) => Err(Fail::from(e)),
        None => Ok(0),
    }
}
