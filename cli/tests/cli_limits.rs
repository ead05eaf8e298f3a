//! Concurrency limits across real processes (F1): several `queue work`
//! processes, each running several jobs at once, never run more than the
//! queue's limit at once, nor more than the per-key limit of one key; a
//! slot that frees is taken at once; `queue limit set/show/clear` answer
//! in JSON (SQLite and PostgreSQL). Rate limits (F4): the same processes
//! start no more jobs per window than the queue's rate, nor per key than
//! its per-key rate, and the backlog still drains at that pace. And
//! run-time limits (F3): a job past its `--timeout` has CMD's whole tree
//! stopped and fails saying so.
//!
//! Each job's CMD takes a slot by `mkdir` (atomic: it fails if the
//! directory exists) and gives it back by `rmdir`. CMD runs inside its
//! job's claim, so two CMDs holding one slot at once means two claims ran
//! at once: a failed `mkdir` is logged as a violation.

#![allow(clippy::disallowed_methods)] // real processes, real time

use std::process::{Child, Stdio};
use std::time::Duration;

#[path = "support/cli.rs"]
mod cli;
use cli::{signal, within, Dir};

#[test]
fn limits_hold_across_worker_processes() {
    limits_hold(Dir::new("limits"));
}

#[test]
fn postgres_limits_hold_across_worker_processes() {
    if let Some(d) = Dir::new_pg("limits") {
        limits_hold(d);
    }
}

fn lines_of(d: &Dir, file: &str) -> Vec<String> {
    std::fs::read_to_string(d.0.join(file))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A worker running up to 4 jobs at once. A keyed job holds `key-$KEY`;
/// every job holds one of the queue's two slots (`slot-0`, `slot-1`).
fn worker(d: &Dir) -> Child {
    let script = r#"
        slot=""
        for s in 0 1; do
            if mkdir "slot-$s" 2>/dev/null; then slot="slot-$s"; break; fi
        done
        [ -n "$slot" ] || echo "queue over its limit: job $LEASEHOLD_JOB_ID" >> violations.log
        if [ -n "$LEASEHOLD_JOB_KEY" ]; then
            mkdir "key-$LEASEHOLD_JOB_KEY" 2>/dev/null \
              || echo "key $LEASEHOLD_JOB_KEY over its limit: job $LEASEHOLD_JOB_ID" >> violations.log
        fi
        echo "$LEASEHOLD_JOB_ID ${LEASEHOLD_JOB_KEY:--}" >> ran.log
        sleep 0.2
        [ -n "$LEASEHOLD_JOB_KEY" ] && rmdir "key-$LEASEHOLD_JOB_KEY"
        [ -n "$slot" ] && rmdir "$slot"
        exit 0
    "#;
    work(d, script)
}

/// `queue work q --concurrency 4 -- sh -c SCRIPT`, quiet.
fn work(d: &Dir, script: &str) -> Child {
    d.cmd()
        .args([
            "queue",
            "work",
            "q",
            "--concurrency",
            "4",
            "--",
            "sh",
            "-c",
            script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn limits_hold(d: Dir) {
    let set = d.json(&[
        "queue",
        "limit",
        "set",
        "q",
        "--concurrency",
        "2",
        "--per-key",
        "1",
    ]);
    assert_eq!(
        (&set["concurrency"], &set["per_key"], &set["changed"]),
        (&2.into(), &1.into(), &true.into()),
        "{set}"
    );
    let show = d.json(&["queue", "limit", "show", "q"]);
    assert_eq!(
        (&show["concurrency"], &show["per_key"]),
        (&2.into(), &1.into())
    );
    // Setting one limit keeps the other.
    let again = d.json(&["queue", "limit", "set", "q", "--per-key", "1"]);
    assert_eq!(
        (&again["concurrency"], &again["changed"]),
        (&2.into(), &false.into())
    );
    // Twelve jobs of one key, six of another, six without: the hot key's
    // backlog must not hold the others back.
    for i in 0..24 {
        let mut args = vec!["queue", "push", "q", "--payload", "x"];
        let key = match i % 4 {
            0 | 1 => Some("hot"),
            2 => Some("cold"),
            _ => None,
        };
        if let Some(k) = key {
            args.extend(["--key", k]);
        }
        let pushed = d.json(&args);
        assert_eq!(pushed["created"], true);
    }
    let job = d.json(&["queue", "get", "1"]);
    assert_eq!(job["key"], "hot", "{job}");
    let workers: Vec<Child> = (0..3).map(|_| worker(&d)).collect();
    let done = within(Duration::from_secs(60), || d.stats("q")["done"] == 24);
    let stats = d.stats("q");
    for mut w in workers {
        signal(w.id(), libc::SIGTERM);
        let _ = w.wait();
    }
    assert!(done.is_some(), "every job done: {stats:?}");
    assert_eq!(lines_of(&d, "violations.log"), Vec::<String>::new());
    let ran = lines_of(&d, "ran.log");
    assert_eq!(ran.len(), 24, "each job ran once: {ran:?}");
    // Two slots, four jobs per process, three processes: 24 jobs of 0.2 s
    // take at least 2.4 s; the limit, not the workers, set the pace.
    let queues = d.lines(&["queue", "queues"]);
    let line = queues.iter().find(|l| l["queue"] == "q").unwrap();
    assert_eq!(
        (&line["concurrency"], &line["per_key"]),
        (&2.into(), &1.into())
    );
    let cleared = d.json(&["queue", "limit", "clear", "q"]);
    assert_eq!(
        (
            &cleared["concurrency"],
            &cleared["per_key"],
            &cleared["changed"]
        ),
        (
            &serde_json::Value::Null,
            &serde_json::Value::Null,
            &true.into()
        )
    );
}

#[test]
fn rates_hold_across_worker_processes() {
    rates_hold(Dir::new("rates"));
}

#[test]
fn postgres_rates_hold_across_worker_processes() {
    if let Some(d) = Dir::new_pg("rates") {
        rates_hold(d);
    }
}

/// The most starts of `starts` (ms, sorted) within any window shorter
/// than `window_ms`.
fn most_within(starts: &[u64], window_ms: u64) -> usize {
    (0..starts.len())
        .map(|i| {
            starts[i..]
                .iter()
                .take_while(|&&t| t < starts[i] + window_ms)
                .count()
        })
        .max()
        .unwrap_or(0)
}

fn rates_hold(d: Dir) {
    let set = d.json(&[
        "queue",
        "limit",
        "set",
        "q",
        "--rate",
        "4/1s",
        "--per-key-rate",
        "1/2s",
    ]);
    assert_eq!(
        (&set["rate"], &set["per_key_rate"], &set["changed"]),
        (&"4/1s".into(), &"1/2s".into(), &true.into()),
        "{set}"
    );
    let show = d.json(&["queue", "limit", "show", "q"]);
    assert_eq!(
        (&show["rate"], &show["concurrency"]),
        (&"4/1s".into(), &serde_json::Value::Null)
    );
    for i in 0..11 {
        let mut args = vec!["queue", "push", "q", "--payload", "x"];
        if i < 3 {
            args.extend(["--key", "k"]);
        }
        assert_eq!(d.json(&args)["created"], true);
    }
    // Each start logged with the wall clock in ms (one machine, one clock).
    let script = r#"echo "$(date +%s%3N) ${LEASEHOLD_JOB_KEY:--}" >> starts.log; exit 0"#;
    let workers: Vec<Child> = (0..3).map(|_| work(&d, script)).collect();
    let done = within(Duration::from_secs(60), || d.stats("q")["done"] == 11);
    let stats = d.stats("q");
    for mut w in workers {
        signal(w.id(), libc::SIGTERM);
        let _ = w.wait();
    }
    assert!(done.is_some(), "every job done: {stats:?}");
    let lines = lines_of(&d, "starts.log");
    let parse = |keyed: bool| {
        let mut v: Vec<u64> = lines
            .iter()
            .filter(|l| l.ends_with(" k") == keyed || !keyed)
            .filter_map(|l| l.split(' ').next()?.parse().ok())
            .collect();
        v.sort_unstable();
        v
    };
    let (all, hot) = (parse(false), parse(true));
    assert_eq!(
        (all.len(), hot.len()),
        (11, 3),
        "each job ran once: {lines:?}"
    );
    // A CMD starts a little after its claim commits, and each start's lag
    // differs: a window a quarter shorter than the rate's still holds no
    // more than the rate allows (with no rate, all eleven start at once).
    assert!(most_within(&all, 750) <= 4, "over 4 per second: {all:?}");
    assert!(
        most_within(&hot, 1_500) <= 1,
        "key k over 1 per 2 s: {hot:?}"
    );
    // The backlog drains at the rate's pace, not at an idle poll's: eleven
    // starts at 4 per second take two windows, the key's three take two of
    // its own; the workers sleep until each allowance comes.
    let span = |v: &[u64]| v[v.len() - 1] - v[0];
    assert!(span(&all) >= 1_500, "{all:?}");
    assert!(span(&hot) >= 3_000 && span(&hot) < 12_000, "{hot:?}");
    let queues = d.lines(&["queue", "queues"]);
    let line = queues.iter().find(|l| l["queue"] == "q").unwrap();
    assert_eq!(
        (&line["rate"], &line["per_key_rate"]),
        (&"4/1s".into(), &"1/2s".into())
    );
    // `none` clears one limit and keeps the others.
    let cleared = d.json(&["queue", "limit", "set", "q", "--rate", "none"]);
    assert_eq!(
        (
            &cleared["rate"],
            &cleared["per_key_rate"],
            &cleared["changed"]
        ),
        (&serde_json::Value::Null, &"1/2s".into(), &true.into()),
        "{cleared}"
    );
}

#[test]
fn limit_commands_refuse_bad_input() {
    let d = Dir::new("limits-bad");
    for args in [
        &["queue", "limit", "set", "q"][..],
        &["queue", "limit", "set", "q", "--concurrency", "0"],
        &["queue", "limit", "set", "q", "--per-key", "-1"],
        &["queue", "limit", "set", "q", "--per-key", "many"],
        &["queue", "limit", "set", "q", "--rate", "0/1s"],
        &["queue", "limit", "set", "q", "--rate", "1001/1s"],
        &["queue", "limit", "set", "q", "--rate", "10"],
        &["queue", "limit", "set", "q", "--per-key-rate", "1/0s"],
        &["queue", "limit", "set", "q", "--per-key-rate", "1/1y"],
    ] {
        let out = d.run(args);
        assert_eq!(
            cli::code(&out),
            2,
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = d.run(&["queue", "push", "q", "--payload", "x", "--key", ""]);
    assert_eq!(
        cli::code(&out),
        1,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("key"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = d.run(&["queue", "limit", "set", "q", "--per-key-rate", "1/8d"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--per-key-rate") && err.contains("one week"),
        "{err}"
    );
    let show = d.json(&["queue", "limit", "show", "q"]);
    assert_eq!(
        (&show["concurrency"], &show["rate"], &show["per_key_rate"]),
        (
            &serde_json::Value::Null,
            &serde_json::Value::Null,
            &serde_json::Value::Null
        ),
        "nothing was set"
    );
}

/// The `sleep` processes (not zombies) whose argument is `mark` (the
/// worker's own command line carries the mark too, inside CMD).
fn running_with(mark: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            });
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            !zombie && args.len() >= 2 && args[0].ends_with(b"sleep") && args[1] == mark.as_bytes()
        })
        .collect()
}

#[test]
fn a_job_past_its_timeout_has_its_tree_stopped_and_fails_saying_so() {
    timeout_stops_the_tree(Dir::new("timeout"), 1);
}

#[test]
fn postgres_a_job_past_its_timeout_has_its_tree_stopped_and_fails_saying_so() {
    if let Some(d) = Dir::new_pg("timeout") {
        timeout_stops_the_tree(d, 2);
    }
}

fn timeout_stops_the_tree(d: Dir, tag: u32) {
    // A mark no other test's process carries: the sleeps' own argument.
    let mark = format!("{}.{tag}", 600 + std::process::id() % 1000);
    let pushed = d.json(&[
        "queue",
        "push",
        "q",
        "--payload",
        "x",
        "--timeout",
        "1s",
        "--max-attempts",
        "1",
    ]);
    let id = pushed["id"].to_string();
    assert_eq!(d.json(&["queue", "get", &id])["timeout_ms"], 1_000);
    // A lease far longer than the limit: only the limit can stop it.
    let script = format!("sleep {mark} & sleep {mark}; exit 0");
    let mut worker = d
        .cmd()
        .args([
            "queue", "work", "q", "--lease", "30s", "--", "sh", "-c", &script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = within(Duration::from_secs(10), || running_with(&mark).len() == 2);
    assert!(started.is_some(), "CMD and its child run");
    let dead = within(Duration::from_secs(15), || {
        d.json(&["queue", "get", &id])["state"] == "dead"
    });
    let job = d.json(&["queue", "get", &id]);
    let stopped = within(Duration::from_secs(5), || running_with(&mark).is_empty());
    signal(worker.id(), libc::SIGTERM);
    let _ = worker.wait();
    assert!(dead.is_some(), "the attempt failed: {job}");
    let took = dead.unwrap();
    assert!(
        took < Duration::from_secs(8),
        "stopped {took:?} after a 1 s limit"
    );
    assert!(
        job["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("timed out"),
        "{job}"
    );
    assert!(
        stopped.is_some(),
        "CMD's tree still runs: {:?}",
        running_with(&mark)
    );
}
