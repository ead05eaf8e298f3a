//! What leasehold prints: one JSON object per line on stdout (a failed
//! write is an error: the caller lost data it was promised), messages for
//! people on stderr (a failed write is ignored: never a panic), instants as
//! RFC 3339 wall-clock times beside the milliseconds remaining.
//!
//! Under `--log json` a message for people is one JSON object instead,
//! shaped like the library's tracing events (`timestamp`, `level`,
//! `message`, its fields, `target`), so that every line leasehold writes
//! on stderr parses as one; the text stays the event's `message`.

use serde_json::{json, Value};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Exit code for output that could not be written (sysexits' EX_IOERR).
pub const EXIT_IOERR: u8 = 74;

/// A progress bar drawn on stderr while JSON lines go to stdout: lines are
/// printed around it, not through it.
pub static PROGRESS: Mutex<Option<indicatif::ProgressBar>> = Mutex::new(None);

fn with_progress_suspended<R>(f: impl FnOnce() -> R) -> R {
    let bar = PROGRESS.lock().ok().and_then(|g| g.clone());
    match bar {
        Some(bar) => bar.suspend(f),
        None => f(),
    }
}

/// Print one JSON line on stdout; an error (a full disk, a closed pipe)
/// means the output was lost, and the command must say so.
pub fn emit(v: &Value) -> std::io::Result<()> {
    with_progress_suspended(|| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{v}")?;
        out.flush()
    })
}

/// Set by `--log json` (or `LEASEHOLD_LOG=json`): notes are JSON lines.
static JSON_NOTES: AtomicBool = AtomicBool::new(false);

/// Write notes as JSON lines from now on.
pub fn notes_as_json() {
    JSON_NOTES.store(true, Ordering::SeqCst);
}

/// Whether notes are JSON lines.
pub fn json_notes() -> bool {
    JSON_NOTES.load(Ordering::SeqCst)
}

/// The target of leasehold's own events (the library's are
/// `leasehold::lease`, `leasehold::job`, ...).
const TARGET: &str = "leasehold::cli";

/// How much a note matters (the `level` of its JSON line).
#[derive(Clone, Copy)]
pub enum Level {
    Info,
    Warn,
    Error,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
    }
}

/// A note's fields: what a JSON line carries beside its message.
pub type Fields = Vec<(&'static str, Value)>;

/// A message for people on stderr: `leasehold: MESSAGE`, or under
/// `--log json` one JSON object with the level and the fields. Unwritable
/// stderr is ignored.
pub fn say(level: Level, message: &str, fields: &[(&'static str, Value)]) {
    let line = if json_notes() {
        json_line(level, message, fields)
    } else {
        format!("leasehold: {message}\n")
    };
    with_progress_suspended(|| {
        // One write per line: lines from several threads do not mix.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    });
}

/// A note as tracing-subscriber's JSON formatter writes an event (its
/// field order too): timestamp, level, message, fields, target.
fn json_line(level: Level, message: &str, fields: &[(&'static str, Value)]) -> String {
    let timestamp = humantime::format_rfc3339_micros(SystemTime::now()).to_string();
    let mut line = format!(
        "{{\"timestamp\":{},\"level\":\"{}\",\"message\":{}",
        json!(timestamp),
        level.as_str(),
        json!(message)
    );
    for (name, value) in fields {
        line.push_str(&format!(",{}:{value}", json!(name)));
    }
    line.push_str(&format!(",\"target\":\"{TARGET}\"}}\n"));
    line
}

/// `250ms`, `1.5s`, `1h30m`, `2d`: the humantime grammar. An overflow
/// says so.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| match e {
        humantime::DurationError::NumberOverflow => {
            format!("{text:?} overflows (the longest duration is about 584 billion years)")
        }
        other => format!("{text:?}: {other} (examples: 250ms, 1.5s, 1h30m, 2d)"),
    })
}

/// A duration in whole milliseconds, saturating.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// The JSON shapes of leases and jobs are the library's (`leasehold::render`),
// shared with the dashboard's API and the Python package.
pub use leasehold::render::{job_json, peek_json, status_json, summary_json, Times};
