//! Flow control across real processes: `queue pause` holds every
//! `queue work` process on the queue, running jobs finish, pushes are
//! accepted, `queue stats`/`queue queues` show it, and `queue resume`
//! wakes the idle workers (SQLite and PostgreSQL).

#![allow(clippy::disallowed_methods)] // real processes, real time

use std::process::{Child, Stdio};
use std::time::Duration;

#[path = "support/cli.rs"]
mod cli;
use cli::{signal, within, Dir};

#[test]
fn pause_holds_every_worker_and_resume_wakes_them() {
    pause_and_resume(Dir::new("pause"));
}

#[test]
fn postgres_pause_holds_every_worker_and_resume_wakes_them() {
    if let Some(d) = Dir::new_pg("pause") {
        pause_and_resume(d);
    }
}

fn ran(d: &Dir) -> Vec<String> {
    std::fs::read_to_string(d.0.join("ran.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A `queue work` process that logs each job's id and payload, taking
/// `secs` seconds per job.
fn worker(d: &Dir, secs: &str) -> Child {
    let script = format!("p=$(cat); echo \"$LEASEHOLD_JOB_ID $p\" >> ran.log; sleep {secs}");
    d.cmd()
        .args([
            "queue",
            "work",
            "q",
            "--concurrency",
            "2",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn queue_line(d: &Dir) -> serde_json::Value {
    d.lines(&["queue", "queues"])
        .into_iter()
        .find(|l| l["queue"] == "q")
        .expect("queue q is listed")
}

fn pause_and_resume(d: Dir) {
    // A job that runs while the queue is paused finishes.
    d.json(&["queue", "push", "q", "--payload", "long"]);
    let mut workers = vec![worker(&d, "1")];
    assert!(
        within(Duration::from_secs(10), || ran(&d).len() == 1).is_some(),
        "the first job started"
    );
    let paused = d.json(&["queue", "pause", "q"]);
    assert_eq!(paused["paused"], true);
    assert_eq!(paused["changed"], true);
    assert_eq!(
        d.json(&["queue", "pause", "q"])["changed"],
        false,
        "idempotent"
    );
    assert_eq!(d.json(&["queue", "stats", "q"])["paused"], true);
    assert_eq!(queue_line(&d)["paused"], true);
    // Pushes are accepted; no process starts them, however many there are.
    for i in 0..6 {
        d.json(&["queue", "push", "q", "--payload", &format!("j{i}")]);
    }
    workers.push(worker(&d, "0"));
    std::thread::sleep(Duration::from_millis(2_000));
    assert_eq!(
        ran(&d).len(),
        1,
        "nothing started while paused: {:?}",
        ran(&d)
    );
    let s = d.stats("q");
    assert_eq!((s["done"], s["ready"], s["running"]), (1, 6, 0), "{s:?}");
    // Resuming wakes the idle workers: the first job starts well within a
    // second (they would otherwise wait out their idle poll).
    let resumed = d.json(&["queue", "resume", "q"]);
    assert_eq!(
        (resumed["paused"].clone(), resumed["changed"].clone()),
        (false.into(), true.into())
    );
    assert_eq!(
        d.json(&["queue", "resume", "q"])["changed"],
        false,
        "idempotent"
    );
    let started = within(Duration::from_secs(10), || ran(&d).len() > 1);
    let started = started.expect("a job started after resume");
    assert!(
        started < Duration::from_secs(1),
        "the first job started {started:?} after resume"
    );
    assert!(
        within(Duration::from_secs(10), || d.stats("q")["done"] == 7).is_some(),
        "every job done: {:?}",
        d.stats("q")
    );
    assert_eq!(d.json(&["queue", "stats", "q"])["paused"], false);
    assert_eq!(queue_line(&d)["paused"], false);
    for mut w in workers {
        signal(w.id(), libc::SIGTERM);
        let status = w.wait().unwrap();
        assert!(status.success(), "{status:?}");
    }
    let mut ids: Vec<String> = ran(&d)
        .iter()
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 7, "each job ran once: {:?}", ran(&d));
}

#[test]
fn pause_refuses_a_bad_queue_name_and_a_leases_only_store() {
    let d = Dir::new("pause-bad");
    let out = d.run(&["queue", "pause", ""]);
    assert_eq!(
        cli::code(&out),
        1,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid QUEUE"));
    let f = Dir::new_file("pause-file");
    let out = f.run(&["queue", "pause", "q"]);
    assert_ne!(cli::code(&out), 0);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("keeps leases only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
