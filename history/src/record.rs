//! The history format: one JSON object per line, appended by each process
//! to a file of its own (one `write` per line, so a SIGKILL leaves whole
//! lines), in Jepsen's shape: an `invoke` and then its completion, `ok`,
//! `fail` (it certainly did not happen) or `info` (unknown: an error that
//! may have committed; a process killed mid-operation leaves only the
//! `invoke`). Instants are `CLOCK_MONOTONIC` nanoseconds, one clock for
//! every process of the machine, beside the wall clock in milliseconds.
//! The orchestrator records its faults (`kill`, `stop`, `cont`,
//! `pg-restart`) in the same shape with type `fault`.

use serde_json::{json, Map, Value};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

/// `CLOCK_MONOTONIC` in nanoseconds.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One line of a history.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Event {
    /// The process (`L3`: the third lease process; `Q1`; `drain`).
    pub p: String,
    /// `invoke`, `ok`, `fail`, `info`, or `fault`.
    pub kind: String,
    /// The operation (`acquire`, `renew`, `release`, `write`, `push`,
    /// `claim`, `heartbeat`, `complete`, `fail`, `cancel`, `read`) or fault.
    pub f: String,
    pub key: Option<String>,
    pub job: Option<u64>,
    pub token: Option<u64>,
    pub value: Option<String>,
    pub mono: u64,
    pub wall: u64,
}

impl Event {
    pub fn new(p: &str, kind: &str, f: &str) -> Event {
        Event {
            p: p.to_owned(),
            kind: kind.to_owned(),
            f: f.to_owned(),
            ..Event::default()
        }
    }

    pub fn key(mut self, key: &str) -> Event {
        self.key = Some(key.to_owned());
        self
    }
    pub fn job(mut self, job: u64) -> Event {
        self.job = Some(job);
        self
    }
    pub fn token(mut self, token: u64) -> Event {
        self.token = Some(token);
        self
    }
    pub fn value(mut self, value: impl Into<String>) -> Event {
        self.value = Some(value.into());
        self
    }

    fn to_json(&self) -> String {
        let mut m = Map::new();
        m.insert("p".into(), json!(self.p));
        m.insert("type".into(), json!(self.kind));
        m.insert("f".into(), json!(self.f));
        for (name, v) in [
            ("key", self.key.as_ref().map(|k| json!(k))),
            ("value", self.value.as_ref().map(|v| json!(v))),
        ] {
            if let Some(v) = v {
                m.insert(name.into(), v);
            }
        }
        for (name, v) in [("job", self.job), ("token", self.token)] {
            if let Some(v) = v {
                m.insert(name.into(), json!(v));
            }
        }
        m.insert("mono".into(), json!(self.mono));
        m.insert("wall".into(), json!(self.wall));
        Value::Object(m).to_string()
    }

    fn from_json(v: &Value) -> Option<Event> {
        let s = |name: &str| v.get(name).and_then(Value::as_str).map(str::to_owned);
        let n = |name: &str| v.get(name).and_then(Value::as_u64);
        Some(Event {
            p: s("p")?,
            kind: s("type")?,
            f: s("f")?,
            key: s("key"),
            job: n("job"),
            token: n("token"),
            value: s("value"),
            mono: n("mono")?,
            wall: n("wall").unwrap_or(0),
        })
    }
}

/// Appends events to one process's history file.
pub struct Recorder {
    file: File,
    p: String,
}

impl Recorder {
    pub fn create(path: &Path, p: &str) -> std::io::Result<Recorder> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Recorder {
            file,
            p: p.to_owned(),
        })
    }

    pub fn p(&self) -> &str {
        &self.p
    }

    /// Stamp `event` with this process and the clocks, and append it (one
    /// write). A failed write ends the run: a history with holes would
    /// judge wrongly.
    pub fn log(&mut self, mut event: Event) -> Event {
        event.p.clone_from(&self.p);
        event.mono = mono_ns();
        event.wall = wall_ms();
        let mut line = event.to_json();
        line.push('\n');
        if let Err(e) = self.file.write_all(line.as_bytes()) {
            eprintln!("leasehold-history: cannot record the history: {e}");
            std::process::exit(3);
        }
        event
    }
}

/// Every event of every `*.jsonl` file under `dir`, in monotonic order
/// (ties: file order). A torn last line (a kill mid-write) is skipped.
pub fn load(dir: &Path) -> std::io::Result<Vec<Event>> {
    let mut events = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    names.sort();
    for path in names {
        for line in BufReader::new(File::open(&path)?).lines() {
            let line = line?;
            if let Some(e) = serde_json::from_str::<Value>(&line)
                .ok()
                .as_ref()
                .and_then(Event::from_json)
            {
                events.push(e);
            }
        }
    }
    events.sort_by_key(|e| e.mono);
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_back_as_written() {
        let e = Event::new("L1", "ok", "acquire").key("k0").token(7);
        let line = Event {
            mono: 5,
            wall: 9,
            ..e.clone()
        }
        .to_json();
        let back = Event::from_json(&serde_json::from_str(&line).unwrap()).unwrap();
        assert_eq!(
            back,
            Event {
                mono: 5,
                wall: 9,
                ..e
            }
        );
    }
}
