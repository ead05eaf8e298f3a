//! The command line's logs and metrics: `--log json` prints one JSON
//! object per line on stderr (stdout keeps its own JSON lines), `--log
//! text` is readable, a bad filter is a usage error, nothing is printed
//! without `--log`; `queue work --metrics ADDR` serves Prometheus text.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // real processes, sockets, time

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[path = "support/cli.rs"]
mod cli;
use cli::{code, Dir};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn log_json_prints_one_parsable_event_per_line() {
    let d = Dir::new("o-json");
    let out = d.run(&[
        "--log",
        "json",
        "--log-filter",
        "debug",
        "queue",
        "push",
        "q",
        "--payload",
        "a",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let stdout: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stdout["id"], 1, "stdout keeps its own JSON");
    let events: Vec<serde_json::Value> = stderr(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    let enqueued = events
        .iter()
        .find(|e| e["message"] == "job enqueued")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(enqueued["queue"], "q");
    assert_eq!(enqueued["job_id"], 1);
    assert_eq!(enqueued["level"], "DEBUG");

    let out = d.run(&["--log", "json", "lock", "acquire", "k", "--ttl", "5s"]);
    let lines: Vec<serde_json::Value> = stderr(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    let granted = lines
        .iter()
        .find(|e| e["message"] == "lease granted")
        .unwrap();
    assert_eq!(
        (granted["key"].as_str(), granted["token"].as_u64()),
        (Some("k"), Some(1))
    );
    assert!(
        !lines.iter().any(|e| e["level"] == "DEBUG"),
        "the default filter is info: {lines:?}"
    );
}

#[test]
fn quiet_without_log_and_text_with_it() {
    let d = Dir::new("o-text");
    let out = d.run(&["lock", "acquire", "k", "--ttl", "5s"]);
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    let out = d.run(&["--log", "text", "lock", "acquire", "j", "--ttl", "5s"]);
    let text = stderr(&out);
    assert!(
        text.contains("lease granted") && text.contains("key=\"j\""),
        "{text}"
    );
    let out = d.run(&[
        "--log",
        "text",
        "--log-filter",
        "leasehold=[",
        "queue",
        "stats",
        "q",
    ]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("--log-filter"), "{}", stderr(&out));
}

fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

#[test]
fn queue_work_serves_prometheus_metrics() {
    let d = Dir::new("o-metrics");
    for _ in 0..3 {
        d.json(&["queue", "push", "q", "--payload", "x"]);
    }
    let mut worker = d
        .cmd()
        .args([
            "queue",
            "work",
            "q",
            "--metrics",
            "127.0.0.1:0",
            "--",
            "cat",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(worker.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "no metrics address printed"
        );
        if let Some(rest) = line.trim().strip_prefix("leasehold: metrics at http://") {
            break rest.trim_end_matches("/metrics").to_owned();
        }
    };
    let started = Instant::now();
    let text = loop {
        let text = scrape(&addr);
        if text.contains("transition=\"completed\"} 3") && text.contains("leasehold_queue_jobs") {
            break text;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        text.contains("leasehold_job_transitions_total{queue=\"q\",transition=\"claimed\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("leasehold_transaction_seconds_count{op=\"claim\""),
        "{text}"
    );
    assert!(
        text.contains("leasehold_job_run_seconds_count{queue=\"q\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("leasehold_queue_jobs{queue=\"q\",state=\"done\"}"),
        "{text}"
    );
    let _ = worker.kill();
    let _ = worker.wait();
    let out = d.run(&[
        "queue",
        "work",
        "q",
        "--metrics",
        "256.0.0.1:1",
        "--",
        "cat",
    ]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("--metrics"), "{}", stderr(&out));
}
