//! `lock list` and `queue queues` on real processes, on every store that
//! keeps what they list, and the presence lease `queue work` holds so that
//! a claim's worker can be named.

#![allow(clippy::disallowed_methods)] // real processes, real time

use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;

#[path = "support/cli.rs"]
mod cli;
use cli::{code, within, Dir};

fn lock_list_prints_each_held_key(d: &Dir) {
    let label = "<b>\"web\"</b>";
    d.json(&["lock", "acquire", "a/1", "--ttl", "1m", "--label", label]);
    for _ in 0..2 {
        d.json(&["lock", "acquire", "b", "--ttl", "1m", "--limit", "3"]);
    }
    let c = d.json(&["lock", "acquire", "c", "--ttl", "1m"]);
    let (holder, token) = (c["holder"].as_str().unwrap(), c["token"].to_string());
    let released = d.run(&[
        "lock", "release", "c", "--holder", holder, "--token", &token,
    ]);
    assert_eq!(code(&released), 0);
    d.json(&["lock", "acquire", "d", "--ttl", "300ms"]);
    std::thread::sleep(Duration::from_millis(400));
    let held = d.lines(&["lock", "list"]);
    let keys: Vec<&str> = held.iter().map(|v| v["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["a/1", "b"], "c released, d expired: {held:?}");
    let a = &held[0];
    assert_eq!(a["holders"][0]["label"].as_str(), Some(label));
    assert_eq!(
        (a["holder_count"].as_u64(), a["limit"].as_u64()),
        (Some(1), Some(1))
    );
    let b = &held[1];
    assert_eq!(
        (b["holder_count"].as_u64(), b["limit"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(b["holding"].as_str(), Some("2 of 3"));
    let tokens: Vec<u64> = (0..2)
        .map(|i| b["holders"][i]["token"].as_u64().unwrap())
        .collect();
    assert_eq!(tokens, [1, 2]);
    let left = b["holders"][0]["expires_in_ms"].as_u64().unwrap();
    assert!(left > 50_000 && left <= 60_000, "{left}");
    assert!(b["holders"][0]["expires_at"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
}

#[test]
fn lock_list_sqlite() {
    lock_list_prints_each_held_key(&Dir::new("lock-list"));
}

#[test]
fn lock_list_file() {
    lock_list_prints_each_held_key(&Dir::new_file("lock-list"));
}

#[test]
fn lock_list_postgres() {
    if let Some(d) = Dir::new_pg("locklist") {
        lock_list_prints_each_held_key(&d);
    }
}

fn queue_queues_prints_each_queue(d: &Dir) {
    d.json(&[
        "queue",
        "push",
        "q<1>",
        "--payload",
        "a",
        "--priority",
        "-1",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    d.json(&["queue", "push", "q<1>", "--payload", "b", "--priority", "5"]);
    d.json(&["queue", "push", "q<1>", "--payload", "c", "--delay", "1h"]);
    for payload in ["0", "1", "0"] {
        d.json(&[
            "queue",
            "push",
            "work",
            "--payload",
            payload,
            "--max-attempts",
            "1",
        ]);
    }
    let worked = d.run(&[
        "queue",
        "work",
        "work",
        "--drain",
        "--",
        "sh",
        "-c",
        "exit $(cat)",
    ]);
    assert_eq!(
        code(&worked),
        0,
        "{}",
        String::from_utf8_lossy(&worked.stderr)
    );
    let queues = d.lines(&["queue", "queues"]);
    let names: Vec<&str> = queues
        .iter()
        .map(|v| v["queue"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["q<1>", "work"]);
    let q = &queues[0];
    let counts = |v: &Value| -> Vec<u64> {
        ["ready", "scheduled", "running", "done", "dead", "cancelled"]
            .map(|s| v[s].as_u64().unwrap())
            .to_vec()
    };
    assert_eq!(counts(q), [2, 1, 0, 0, 0, 0]);
    let wait = q["oldest_ready_wait_ms"].as_u64().unwrap();
    assert!(
        wait >= 300,
        "the first job (lower priority) has waited longest: {wait}"
    );
    let w = &queues[1];
    assert_eq!(counts(w), [0, 0, 0, 2, 1, 0]);
    assert_eq!(w["oldest_ready_wait_ms"], Value::Null);
    let last_minute = &w["finished"][0];
    assert_eq!(
        (last_minute["done"].as_u64(), last_minute["dead"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(w["capped"], serde_json::json!([]), "exact counts");
}

#[test]
fn queue_queues_sqlite() {
    queue_queues_prints_each_queue(&Dir::new("queues"));
}

#[test]
fn queue_queues_postgres() {
    if let Some(d) = Dir::new_pg("queues") {
        queue_queues_prints_each_queue(&d);
    }
}

#[test]
fn queue_queues_on_the_file_store_says_it_keeps_no_jobs() {
    let d = Dir::new_file("queues");
    let out = d.run(&["queue", "queues"]);
    assert_eq!(code(&out), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("leases only") && err.contains("sqlite:"),
        "{err}"
    );
}

/// A worker holds `leasehold/worker/<its holder id>` while it runs, so a
/// claim's holder id leads to its label; it lets go when it stops.
#[test]
fn queue_work_announces_its_worker() {
    let d = Dir::new("presence");
    let id = d.json(&["queue", "push", "q", "--payload", "x"])["id"].to_string();
    let mut worker = d
        .cmd()
        .args(["queue", "work", "q", "--lease", "3s", "--", "sleep", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let running = within(Duration::from_secs(10), || {
        d.json(&["queue", "get", &id])["state"] == "running"
    });
    assert!(running.is_some(), "the worker claimed the job");
    let holder = d.json(&["queue", "get", &id])["claim"]["holder"]
        .as_str()
        .unwrap()
        .to_owned();
    let held = d.lines(&["lock", "list"]);
    let key = format!("leasehold/worker/{holder}");
    let me = held
        .iter()
        .find(|v| v["key"] == key.as_str())
        .unwrap_or_else(|| panic!("no {key} in {held:?}"));
    let label = me["holders"][0]["label"].as_str().unwrap();
    assert!(
        label.ends_with(&format!(":{}", worker.id())),
        "host:pid, got {label}"
    );
    cli::signal(worker.id(), libc::SIGTERM);
    worker.wait().unwrap();
    let held = d.lines(&["lock", "list"]);
    assert!(held.iter().all(|v| v["key"] != key.as_str()), "{held:?}");
}
