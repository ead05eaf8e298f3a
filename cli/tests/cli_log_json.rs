//! `--log json` (or `LEASEHOLD_LOG=json`) means JSON on stderr: every
//! line leasehold itself writes there is one JSON object shaped like the
//! library's tracing events (timestamp, level, target, message, fields),
//! its notes and its errors included; only a job command's own output
//! stays raw. Without `--log`, or with `--log text`, the notes read as
//! they always have.

#![allow(clippy::disallowed_methods)] // real processes, real time

use serde_json::Value;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[path = "support/cli.rs"]
mod cli;
use cli::{code, Dir};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Each line as a JSON object with the tracing fields, or a panic naming
/// the line that is not one.
fn events(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON line: {l:?} ({e}) in:\n{text}"));
            for field in ["timestamp", "level", "target", "message"] {
                assert!(v[field].is_string(), "{field} missing from {l}");
            }
            let ts = v["timestamp"].as_str().unwrap_or_default();
            assert!(
                humantime::parse_rfc3339(ts).is_ok(),
                "timestamp {ts:?} is not RFC 3339"
            );
            v
        })
        .collect()
}

/// The one event whose message starts with `head`.
fn event<'a>(events: &'a [Value], head: &str) -> &'a Value {
    let found: Vec<&Value> = events
        .iter()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.starts_with(head)))
        .collect();
    assert_eq!(found.len(), 1, "one {head:?} event in {events:#?}");
    found[0]
}

fn pushed(tag: &str, n: usize) -> Dir {
    let d = Dir::new(tag);
    for _ in 0..n {
        d.json(&["queue", "push", "Q", "--payload", "x"]);
    }
    d
}

#[test]
fn a_drain_under_log_json_writes_only_json_on_stderr() {
    let d = pushed("lj-drain", 3);
    let out = d.run(&[
        "--log", "json", "queue", "work", "Q", "--drain", "--", "true",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let events = events(&stderr(&out));
    let drained = event(&events, "drained");
    assert_eq!(drained["level"], "INFO");
    assert_eq!(drained["queue"], "Q");
    assert_eq!(
        (&drained["done"], &drained["failed"], &drained["lost"]),
        (&Value::from(3), &Value::from(0), &Value::from(0))
    );
    assert!(drained["elapsed_ms"].is_u64(), "{drained}");
    assert!(
        events.iter().any(|e| e["message"] == "lease released"),
        "the library's events are there too: {events:#?}"
    );
    // The environment variable means the same.
    let d = pushed("lj-drain-env", 2);
    let out = d
        .cmd()
        .args(["queue", "work", "Q", "--drain", "--", "true"])
        .env("LEASEHOLD_LOG", "json")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(event(&events_of(&out), "drained")["done"], 2);
}

fn events_of(out: &std::process::Output) -> Vec<Value> {
    events(&stderr(out))
}

#[test]
fn a_job_commands_own_output_stays_raw() {
    let d = pushed("lj-raw", 2);
    let out = d.run(&[
        "--log", "json", "queue", "work", "Q", "--drain", "--", "echo", "from-cmd",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stderr(&out);
    let (raw, json): (Vec<&str>, Vec<&str>) = text.lines().partition(|l| !l.starts_with('{'));
    assert_eq!(raw, ["from-cmd", "from-cmd"], "{text}");
    let events = events(&json.join("\n"));
    assert_eq!(event(&events, "drained")["done"], 2);
}

#[test]
fn errors_and_usage_errors_under_log_json_are_json() {
    let d = Dir::new("lj-errors");
    d.json(&["lock", "acquire", "k", "--ttl", "30s"]);
    for args in [
        &["--log", "json", "lock", "acquire", "k", "--ttl", "30s"][..],
        &["--log", "json", "run", "k", "--ttl", "30s", "--", "true"],
    ] {
        let out = d.run(args);
        assert_eq!(code(&out), 75, "{args:?}: {}", stderr(&out));
        let events = events_of(&out);
        let held = event(&events, "lease \"k\" is held by");
        assert_eq!(held["level"], "ERROR", "{held}");
        assert_eq!(held["exit_code"], 75, "{held}");
        assert_eq!(held["key"], "k", "{held}");
        let stdout: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(stdout["held"], true, "stdout keeps its JSON line");
    }
    // An error from the store, and one from a flag's value.
    let out = d.run(&["--log", "json", "queue", "get", "999"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_eq!(events_of(&out)[0]["exit_code"], 1);
    // Usage errors, found before the subscriber exists: the flag or the
    // variable is enough.
    let out = d.run(&["--log", "json", "queue", "push"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let usage = events_of(&out);
    assert_eq!(usage.len(), 1, "{usage:#?}");
    assert_eq!(usage[0]["level"], "ERROR");
    assert_eq!(usage[0]["exit_code"], 2);
    assert!(
        usage[0]["message"].as_str().unwrap().contains("<QUEUE>"),
        "{usage:#?}"
    );
    let out = d
        .cmd()
        .args(["lock", "acquire", "k", "--ttl", "never"])
        .env("LEASEHOLD_LOG", "json")
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(events_of(&out)[0]["message"]
        .as_str()
        .unwrap()
        .contains("--ttl"));
    let out = d.run(&[
        "--log=json",
        "--log-filter",
        "leasehold=[",
        "queue",
        "stats",
        "q",
    ]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(events_of(&out)[0]["message"]
        .as_str()
        .unwrap()
        .contains("--log-filter"));
}

#[test]
fn run_and_a_lost_lease_under_log_json() {
    let d = Dir::new("lj-run");
    let out = d.run(&["--log", "json", "run", "k", "--ttl", "5s", "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let events = events_of(&out);
    let running = events
        .iter()
        .find(|e| e["message"].as_str().is_some_and(|m| m.contains("running")))
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert_eq!(running["key"], "k");
    assert_eq!(running["token"], 1);
    assert!(running["supervisor_pid"].is_u64(), "{running}");

    // Stopped past its TTL: the lease is lost, and says so as JSON.
    use std::os::unix::process::CommandExt;
    let mut holder = d
        .cmd()
        .args([
            "--log", "json", "run", "job", "--ttl", "600ms", "--grace", "200ms", "--", "sleep",
            "30",
        ])
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Stopped once it holds the key, not during its start.
    cli::within(Duration::from_secs(10), || {
        d.json(&["lock", "status", "job"])["holders"]
            .as_array()
            .is_some_and(|h| !h.is_empty())
    })
    .expect("the holder holds the key");
    std::thread::sleep(Duration::from_millis(100));
    group_signal(holder.id(), libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(1200));
    d.json(&["lock", "acquire", "job", "--ttl", "10s"]);
    group_signal(holder.id(), libc::SIGCONT);
    let start = Instant::now();
    while holder.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(10), "did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 76);
    let events = events_of(&out);
    let lost = event(&events, "lease \"job\" lost");
    assert_eq!(lost["level"], "WARN", "{lost}");
    assert_eq!(lost["key"], "job", "{lost}");
    assert!(lost["reason"].is_string(), "{lost}");
}

/// A campaigner, stopped (SIGTERM, then waited for) when dropped, also
/// when an assertion fails first.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        cli::signal(self.0.id(), libc::SIGTERM);
        let _ = self.0.wait();
    }
}

fn group_signal(pid: u32, sig: i32) {
    // SAFETY: signalling a process group this test created.
    unsafe {
        libc::kill(-(pid as i32), sig);
    }
}

#[test]
fn elect_and_the_metrics_note_under_log_json() {
    let d = Dir::new("lj-elect");
    let _leader = Stopped(
        d.cmd()
            .args([
                "elect", "e", "--ttl", "5s", "--label", "first", "--", "sleep", "60",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let led = cli::within(Duration::from_secs(10), || {
        d.json(&["lock", "status", "e"])["holder_count"] == 1
    });
    assert!(led.is_some(), "the first campaigner leads");
    let mut follower = Stopped(
        d.cmd()
            .args(["--log", "json", "elect", "e", "--ttl", "5s", "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(follower.0.stderr.take().unwrap()));
    let noted = loop {
        let line = lines.next().expect("the follower says who leads").unwrap();
        let v = events(&line).remove(0);
        if v["message"]
            .as_str()
            .is_some_and(|m| m.contains("is led by"))
        {
            break v;
        }
    };
    assert_eq!(noted["key"], "e", "{noted}");
    assert_eq!(noted["label"], "first", "{noted}");
    assert_eq!(noted["token"], 1, "{noted}");
    drop(lines);

    let d = pushed("lj-metrics", 1);
    let out = d.run(&[
        "--log",
        "json",
        "queue",
        "work",
        "Q",
        "--drain",
        "--metrics",
        "127.0.0.1:0",
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let events = events_of(&out);
    let metrics = event(&events, "metrics at http://");
    assert!(
        metrics["url"].as_str().unwrap().ends_with("/metrics"),
        "{metrics}"
    );
}

#[test]
fn without_log_json_the_notes_read_as_before() {
    let d = pushed("lj-text", 3);
    for log in [&[][..], &["--log", "text"]] {
        let args: Vec<&str> = log
            .iter()
            .copied()
            .chain(["queue", "work", "Q", "--drain", "--", "true"])
            .collect();
        let out = d.run(&args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let text = stderr(&out);
        let drained: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("leasehold: drained"))
            .collect();
        assert_eq!(drained.len(), 1, "{text}");
        let rest = drained[0]
            .strip_prefix("leasehold: drained \"Q\": ")
            .and_then(|r| r.strip_suffix('s'))
            .unwrap_or_else(|| panic!("{text}"));
        let (counts, secs) = rest.split_once(" in ").unwrap();
        let expected = if log.is_empty() {
            "3 done, 0 failed, 0 lost"
        } else {
            "0 done, 0 failed, 0 lost"
        };
        assert_eq!(counts, expected, "{text}");
        assert!(secs.parse::<f64>().is_ok(), "{text}");
        if log.is_empty() {
            assert_eq!(text.lines().count(), 1, "only the summary: {text}");
        }
    }
    d.json(&["lock", "acquire", "k", "--ttl", "30s"]);
    let out = d.run(&["lock", "acquire", "k", "--ttl", "30s"]);
    assert_eq!(code(&out), 75);
    let text = stderr(&out);
    assert!(
        text.starts_with("leasehold: lease \"k\" is held by "),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "{text}");
    let out = d.run(&["queue", "push"]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).starts_with("error: "), "{}", stderr(&out));
}
