//! Leader election and schedules on real processes: three `leasehold
//! elect` processes run one CMD at a time; SIGKILL of the leader's
//! leasehold hands over within TTL + 1 s and its CMD's tree is gone;
//! SIGTERM resigns and hands over well under the TTL; `--once` exits with
//! CMD's status, or 76 after a loss; `lock watch` prints each change of
//! holder; three `queue work` processes fire a 1 s schedule once per tick.

#![allow(clippy::disallowed_methods)] // real processes, real time

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

#[path = "support/cli.rs"]
mod cli;
use cli::{code, mark, signal, survivors, within, Dir};

/// CMD: note who started it (its campaigner's name and token), then run
/// until stopped.
const CMD: &str = "echo \"$NAME $LEASEHOLD_TOKEN\" >> started; exec sleep 60";

struct Campaigner {
    name: String,
    mark: String,
    child: Child,
}

fn campaign(d: &Dir, name: &str, ttl: &str, extra: &[&str]) -> Campaigner {
    let m = mark(name);
    let child = d
        .cmd()
        .args([
            "elect", "leader", "--ttl", ttl, "--label", name, "--grace", "1s",
        ])
        .args(extra)
        .args(["--", "sh", "-c", CMD])
        .env("NAME", name)
        .env("LH_MARK", &m)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Campaigner {
        name: name.to_owned(),
        mark: m,
        child,
    }
}

/// Lines of `started`: (campaigner, token), in order.
fn started(d: &Dir) -> Vec<(String, u64)> {
    std::fs::read_to_string(d.0.join("started"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_owned(), t.parse().unwrap()))
        .collect()
}

/// Running CMDs (their `sleep 60`), by campaigner.
fn running(cs: &[Campaigner]) -> Vec<String> {
    cs.iter()
        .filter(|c| survivors(&c.mark).iter().any(|(_, cmd)| cmd == "sleep 60"))
        .map(|c| c.name.clone())
        .collect()
}

/// Watch for `limit`: never more than one CMD at a time.
fn one_at_a_time(cs: &[Campaigner], limit: Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        let now = running(cs);
        assert!(now.len() <= 1, "two leaders' commands at once: {now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop_all(cs: &mut [Campaigner]) {
    for c in cs.iter_mut() {
        signal(c.child.id(), libc::SIGKILL);
        let _ = c.child.wait();
    }
}

#[test]
fn three_campaigners_one_command_and_a_killed_leader_replaced_within_ttl() {
    let d = Dir::new("elect-kill");
    let mut cs: Vec<Campaigner> = ["a", "b", "c"]
        .iter()
        .map(|n| campaign(&d, n, "2s", &[]))
        .collect();
    within(Duration::from_secs(15), || started(&d).len() == 1).expect("a leader's command started");
    one_at_a_time(&cs, Duration::from_secs(2));
    let (leader, token) = started(&d)[0].clone();
    let i = cs.iter().position(|c| c.name == leader).unwrap();
    // SIGKILL the leader's leasehold: nobody renews or releases.
    let killed = Instant::now();
    signal(cs[i].child.id(), libc::SIGKILL);
    let _ = cs[i].child.wait();
    let gone = within(Duration::from_secs(3), || survivors(&cs[i].mark).is_empty());
    assert!(
        gone.is_some(),
        "the old command's tree survived: {:?}",
        survivors(&cs[i].mark)
    );
    let took = within(Duration::from_secs(10), || started(&d).len() == 2).expect("a new leader");
    let took = killed.elapsed().min(took + Duration::from_secs(1));
    assert!(
        took <= Duration::from_secs(3),
        "replaced after {took:?} (TTL 2 s + 1 s)"
    );
    let (next, next_token) = started(&d)[1].clone();
    assert_ne!(next, leader);
    assert!(next_token > token);
    let others: Vec<Campaigner> = cs
        .drain(..)
        .enumerate()
        .filter(|(j, _)| *j != i)
        .map(|(_, c)| c)
        .collect();
    one_at_a_time(&others, Duration::from_secs(2));
    let mut others = others;
    stop_all(&mut others);
}

#[test]
fn sigterm_resigns_and_hands_over_well_under_the_ttl() {
    let d = Dir::new("elect-term");
    let mut cs: Vec<Campaigner> = ["a", "b"]
        .iter()
        .map(|n| campaign(&d, n, "30s", &[]))
        .collect();
    within(Duration::from_secs(15), || started(&d).len() == 1).expect("a leader's command started");
    let (leader, _) = started(&d)[0].clone();
    let i = cs.iter().position(|c| c.name == leader).unwrap();
    let asked = Instant::now();
    signal(cs[i].child.id(), libc::SIGTERM);
    let status = cs[i].child.wait().unwrap();
    // CMD got the signal (sleep dies of it): leasehold exits with its status.
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    assert!(survivors(&cs[i].mark).is_empty());
    let stderr = |c: &mut Campaigner| {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(c.child.stderr.as_mut().unwrap(), &mut text);
        text
    };
    if within(Duration::from_secs(10), || started(&d).len() == 2).is_none() {
        let status = d.json(&["lock", "status", "leader"]);
        stop_all(&mut cs);
        panic!(
            "no new leader within 10 s; lock status {status}; the leader said {:?}; the other {:?}",
            stderr(&mut cs[i]),
            stderr(&mut cs[1 - i])
        );
    }
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "handed over in {took:?}, TTL 30 s"
    );
    stop_all(&mut cs);
}

#[test]
fn once_exits_with_the_commands_status_or_76_after_a_loss() {
    let d = Dir::new("elect-once");
    let out = d.run(&[
        "elect", "k", "--ttl", "5s", "--once", "--", "sh", "-c", "exit 3",
    ]);
    assert_eq!(code(&out), 3, "{}", String::from_utf8_lossy(&out.stderr));
    let status = d.json(&["lock", "status", "k"]);
    assert_eq!(
        status["holders"].as_array().unwrap().len(),
        0,
        "resigned: released"
    );
    // A leader stopped past its TTL finds its term lost: CMD is stopped
    // and leasehold exits 76.
    let m = mark("once-lost");
    let mut c = d
        .cmd()
        .args([
            "elect", "k", "--ttl", "1s", "--once", "--grace", "1s", "--", "sleep", "60",
        ])
        .env("LH_MARK", &m)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    within(Duration::from_secs(15), || {
        survivors(&m).iter().any(|(_, cmd)| cmd == "sleep 60")
    })
    .expect("elected");
    signal(c.id(), libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(1_500));
    signal(c.id(), libc::SIGCONT);
    let status = c.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(76), "{err}");
    assert!(err.contains("leadership of \"k\" lost"), "{err}");
    assert!(survivors(&m).is_empty());
}

#[test]
fn lock_watch_prints_each_change_of_holder() {
    let d = Dir::new("watch");
    let watch = d
        .cmd()
        .args(["lock", "watch", "w", "--count", "3", "--interval", "20ms"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let a = d.json(&["lock", "acquire", "w", "--ttl", "30s", "--label", "first"]);
    std::thread::sleep(Duration::from_millis(300));
    // A renewal is no change.
    let holder = a["holder"].as_str().unwrap();
    d.json(&[
        "lock", "renew", "w", "--holder", holder, "--token", "1", "--ttl", "30s",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    d.json(&["lock", "release", "w", "--holder", holder, "--token", "1"]);
    let out = watch.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let holders: Vec<usize> = lines
        .iter()
        .map(|l| l["holders"].as_array().unwrap().len())
        .collect();
    assert_eq!(holders, [0, 1, 0]);
    assert_eq!(lines[1]["holders"][0]["label"].as_str(), Some("first"));
    assert!(lines[1]["at"].as_str().unwrap().ends_with('Z'));
}

/// Three workers fire a 1 s schedule for 10 s: every tick once, none
/// missing between the first and the last.
fn workers_fire_each_tick_once(d: &Dir) {
    d.json(&[
        "queue",
        "schedule",
        "add",
        "q",
        "beat",
        "--every",
        "1s",
        "--payload",
        "tick",
    ]);
    let mut workers: Vec<Child> = (0..3)
        .map(|_| {
            d.cmd()
                .args(["queue", "work", "q", "--", "cat"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(10));
    for w in &mut workers {
        signal(w.id(), libc::SIGTERM);
    }
    for w in &mut workers {
        assert!(w.wait().unwrap().success());
    }
    let out = d.run(&["queue", "list", "q", "--limit", "1000"]);
    let mut ticks = BTreeMap::<String, usize>::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let key = v["unique_key"].as_str().expect("a tick's key").to_owned();
        *ticks.entry(key).or_default() += 1;
    }
    let twice: Vec<_> = ticks.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "ticks enqueued twice: {twice:?}");
    let secs: Vec<i64> = ticks
        .keys()
        .map(|k| {
            let t = k.strip_prefix("beat@").unwrap();
            humantime::parse_rfc3339(t)
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64
        })
        .collect();
    assert!(secs.len() >= 8, "{} ticks in 10 s", secs.len());
    for w in secs.windows(2) {
        assert_eq!(w[1] - w[0], 1, "a tick is missing: {secs:?}");
    }
}

#[test]
fn three_workers_fire_a_one_second_schedule_once_per_tick_sqlite() {
    workers_fire_each_tick_once(&Dir::new("ticks"));
}

#[test]
fn three_workers_fire_a_one_second_schedule_once_per_tick_postgres() {
    if let Some(d) = Dir::new_pg("ticks") {
        workers_fire_each_tick_once(&d);
    }
}
