//! `leasehold migrate` on real processes (issue 29 §1), SQLite →
//! PostgreSQL on the server in `LEASEHOLD_TEST_PG` (skipped with a notice
//! when it is unset): workers running on the source during the move stop
//! and exit 78, no job is lost or runs twice at once, a claim in flight is
//! handed over (its next run has a higher token), a lease holder is fenced
//! by the first grant on the target; a migration SIGKILLed at any point
//! ends, run again, in the same state as one never interrupted.

#![allow(clippy::disallowed_methods)] // real time and processes

#[path = "support/cli.rs"]
mod cli;

use cli::{code, within, Dir};
use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The handler: logs `start|end JOB TOKEN NANOS` around a short sleep (a
/// run stopped by SIGTERM logs its end too).
const HANDLER: &str = r#"
log="$LOG"; id="$LEASEHOLD_JOB_ID"; tok="$LEASEHOLD_TOKEN"
echo "start $id $tok $(date +%s%N)" >> "$log"
trap 'echo "end $id $tok $(date +%s%N) stopped" >> "$log"; exit 1' TERM
sleep 0.4 & wait $!
echo "end $id $tok $(date +%s%N)" >> "$log"
"#;

fn worker(dir: &Dir, store: &str, log: &std::path::Path, drain: bool) -> Child {
    let mut c = dir.cmd();
    c.env("LEASEHOLD_STORE", store).env("LOG", log);
    c.args(["queue", "work", "w", "--concurrency", "2", "--lease", "2s"]);
    if drain {
        c.arg("--drain");
    }
    c.args(["--", "sh", "-c", HANDLER]);
    c.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status.code().unwrap_or(-1));
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each job's runs, in start order: (token, start ns, end ns).
fn runs(log: &std::path::Path) -> BTreeMap<u64, Vec<(u64, u128, u128)>> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut open: BTreeMap<(u64, u64), u128> = BTreeMap::new();
    let mut out: BTreeMap<u64, Vec<(u64, u128, u128)>> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (id, tok, at): (u64, u64, u128) = (
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
        );
        match f[0] {
            "start" => {
                open.insert((id, tok), at);
            }
            _ => {
                let start = open.remove(&(id, tok)).expect("an end without its start");
                out.entry(id).or_default().push((tok, start, at));
            }
        }
    }
    assert!(
        open.is_empty(),
        "runs that never ended (killed without SIGTERM): {open:?}"
    );
    for v in out.values_mut() {
        v.sort_by_key(|r| r.1);
    }
    out
}

#[test]
fn workers_on_the_source_stop_with_78_and_every_job_runs_on_one_store_at_a_time() {
    let Some(dst) = Dir::new_pg("migrate_live") else {
        return;
    };
    let src = Dir::new("migrate-live");
    let log = src.0.join("runs.log");
    for i in 0..30 {
        assert_eq!(
            code(&src.run(&["queue", "push", "w", "--payload", &i.to_string()])),
            0
        );
    }
    // A holder with a source token, still running at the move.
    let held = src.json(&["lock", "acquire", "res", "--ttl", "2s"]);
    let old_token = held["token"].as_u64().unwrap();
    let mut workers: Vec<Child> = (0..2)
        .map(|_| worker(&src, &src.store(), &log, false))
        .collect();
    let started = within(Duration::from_secs(20), || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count()
            >= 12
    });
    assert!(started.is_some(), "the workers never got going");
    let out = src.run(&["migrate", "--to", &dst.store()]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["jobs"], 30);
    let handed_over = report["running_jobs"].as_u64().unwrap();
    assert!(
        handed_over >= 1,
        "no claim was in flight at the cut-over: {report}"
    );
    for w in &mut workers {
        let exit = wait_exit(w, Duration::from_secs(30));
        let mut err = String::new();
        use std::io::Read;
        w.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert_eq!(exit, Some(78), "a source worker after the move: {err}");
        assert!(err.contains(&report["to"].as_str().unwrap()[..20]), "{err}");
    }
    // The source refuses the command line too, naming the target.
    let refused = src.run(&["queue", "stats", "w"]);
    assert_eq!(code(&refused), 78);
    // The target's workers finish everything.
    let mut finisher = worker(&dst, &dst.store(), &log, true);
    assert_eq!(wait_exit(&mut finisher, Duration::from_secs(60)), Some(0));
    let stats = dst.stats("w");
    assert_eq!(stats.get("done"), Some(&30), "{stats:?}");
    // No job ran on two stores at once, and a rerun has a higher token.
    let runs = runs(&log);
    assert_eq!(runs.len(), 30);
    let rerun = runs.values().filter(|rs| rs.len() >= 2).count() as u64;
    // (A claim handed over may have been prefetched, not started.)
    assert!(
        rerun >= 1,
        "{handed_over} claims handed over, none ran again"
    );
    for (id, rs) in &runs {
        for pair in rs.windows(2) {
            let ((t0, _, end0), (t1, start1, _)) = (pair[0], pair[1]);
            assert!(end0 <= start1, "job {id} ran twice at once: {rs:?}");
            assert!(t1 > t0, "job {id} ran again with token {t1} after {t0}");
        }
    }
    // The lease's record came along: the next grant fences the old token.
    std::thread::sleep(Duration::from_millis(2100));
    let granted = dst.json(&["lock", "acquire", "res", "--ttl", "5s"]);
    assert!(granted["token"].as_u64().unwrap() > old_token, "{granted}");
}

/// What a store holds, without instants: jobs (id, queue, state,
/// attempts, payload) and keys' last tokens.
fn summary(dir: &Dir, store: &str) -> (Vec<String>, Vec<String>) {
    let mut c = dir.cmd();
    c.env("LEASEHOLD_STORE", store);
    let out = c
        .args(["queue", "list", "w", "--limit", "1000"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let jobs = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            format!(
                "{} {} {} {}",
                v["id"], v["state"], v["attempts"], v["payload_preview"]
            )
        })
        .collect();
    let mut keys = Vec::new();
    for k in ["a", "b", "c"] {
        let mut c = dir.cmd();
        c.env("LEASEHOLD_STORE", store);
        let out = c.args(["lock", "status", k]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        keys.push(format!("{k} {}", v["last_token"]));
    }
    (jobs, keys)
}

#[test]
fn a_migration_killed_at_any_point_ends_the_same_when_run_again() {
    let Some(reference) = Dir::new_pg("migrate_ref") else {
        return;
    };
    let Some(target) = Dir::new_pg("migrate_killed") else {
        return;
    };
    let src = Dir::new("migrate-kill");
    let push = |d: &Dir, args: &[&str]| assert_eq!(code(&d.run(args)), 0, "{args:?}");
    for i in 0..80 {
        push(
            &src,
            &["queue", "push", "w", "--payload", &format!("job-{i}")],
        );
    }
    for (k, n) in [("a", 1), ("b", 2), ("c", 3)] {
        for _ in 0..n {
            push(&src, &["lock", "acquire", k, "--ttl", "1ms"]);
            std::thread::sleep(Duration::from_millis(3));
        }
    }
    // The same source twice (a plain copy of the closed database and its
    // WAL): one copy is moved without interruption.
    let copy = src.0.join("copy.db");
    std::fs::copy(src.0.join("test.db"), &copy).unwrap();
    if let Ok(wal) = std::fs::read(src.0.join("test.db-wal")) {
        std::fs::write(src.0.join("copy.db-wal"), wal).unwrap();
    }
    let copy_url = format!("sqlite:{}", copy.display());
    let whole = src.run(&["migrate", "--from", &copy_url, "--to", &reference.store()]);
    assert_eq!(
        code(&whole),
        0,
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
    let expected = summary(&reference, &reference.store());
    assert_eq!(expected.0.len(), 80);

    killed_then_run_again(&src, &src.store(), &target.store());
    assert_eq!(summary(&target, &target.store()), expected);
    // The way back, interrupted the same way: PostgreSQL → SQLite.
    let back = Dir::new("migrate-back");
    killed_then_run_again(&target, &target.store(), &back.store());
    assert_eq!(summary(&back, &back.store()), expected);
    let refused = target.run(&["queue", "stats", "w"]);
    assert_eq!(code(&refused), 78);
    let target = back;
    // And the target works: the next push takes the next id.
    let pushed = target.json(&["queue", "push", "w", "--payload", "after"]);
    assert_eq!(pushed["id"], 81);
}

/// Run `from` → `to` with a chunk of 1, SIGKILLed after various delays,
/// then to the end.
fn killed_then_run_again(dir: &Dir, from: &str, to: &str) {
    // A dry run reads what the copy reads: about half its time.
    let started = Instant::now();
    let dry = dir.run(&[
        "migrate",
        "--from",
        from,
        "--to",
        to,
        "--chunk",
        "1",
        "--dry-run",
    ]);
    assert_eq!(code(&dry), 0, "{}", String::from_utf8_lossy(&dry.stderr));
    let dry_ms = started.elapsed().as_millis() as u64;
    let mut kills = 0;
    for percent in [30u64, 60, 90, 120, 150, 180, 210] {
        let delay_ms = dry_ms * percent / 100;
        let mut child = dir
            .cmd()
            .args(["migrate", "--from", from, "--to", to, "--chunk", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            kills += 1;
        }
        let _ = child.wait();
    }
    assert!(
        kills >= 3,
        "the migration ended before most kills ({kills}; dry run {dry_ms} ms)"
    );
    let last = dir.run(&["migrate", "--from", from, "--to", to]);
    assert_eq!(code(&last), 0, "{}", String::from_utf8_lossy(&last.stderr));
}
