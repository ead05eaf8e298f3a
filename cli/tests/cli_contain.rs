//! Containment, on real processes: no process started under CMD outlives
//! the lease it runs under. For `run` and `queue work`, on SQLite and the
//! file store: leasehold SIGKILLed (everything gone within 1 s), the lease
//! or the job's claim lost, a cancel, and SIGTERM to leasehold (within
//! `--grace` + 1 s, even for processes that ignore SIGTERM). CMD is a
//! shell with background jobs, a pipeline, a nested shell and `nohup`;
//! every process it starts carries `LH_MARK` in its environment, which is
//! how the tests find them, however they detached themselves.

#![allow(clippy::disallowed_methods)] // real processes, real time

use std::process::{Child, Stdio};
use std::time::Duration;

#[path = "support/cli.rs"]
mod cli;
use cli::{code, mark, signal, survivors, within, Dir};

/// Background jobs, a pipeline, a nested shell, nohup; one process that
/// ignores SIGTERM (so only SIGKILL after the grace period stops it).
const TREE: &str = "sleep 37 & sleep 38 | cat & \
     sh -c 'sleep 39 & nohup sleep 40 >/dev/null 2>&1 & wait' & \
     sh -c 'trap \"\" TERM; sleep 41' & wait";

/// The tree is up once its deepest processes exist.
fn wait_for_tree(mark: &str, deepest: &[&str]) {
    let up = within(Duration::from_secs(15), || {
        let procs = survivors(mark);
        deepest
            .iter()
            .all(|d| procs.iter().any(|(_, cmd)| cmd == d))
    });
    assert!(
        up.is_some(),
        "the command's tree did not start: {:?}",
        survivors(mark)
    );
}

const DEEPEST: [&str; 5] = ["sleep 37", "cat", "sleep 39", "sleep 40", "sleep 41"];

fn start_run(d: &Dir, mark: &str, extra: &[&str], tree: &str) -> Child {
    let mut args = vec!["run", "job", "--ttl", "1s", "--grace", "300ms"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", tree]);
    d.cmd()
        .args(&args)
        .env("LH_MARK", mark)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Everything carrying the mark, except `keep` (a worker that goes on).
fn left(mark: &str, keep: Option<u32>) -> Vec<(u32, String)> {
    survivors(mark)
        .into_iter()
        .filter(|(pid, _)| Some(*pid) != keep)
        .collect()
}

/// The pids of the tree as it runs now (a worker may start another tree
/// for its next job under the same mark: that one is not asked about).
fn tree_now(mark: &str, keep: u32) -> Vec<u32> {
    left(mark, Some(keep))
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

fn alive(pids: &[u32]) -> Vec<u32> {
    pids.iter()
        .copied()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                !s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
        })
        .collect()
}

fn assert_pids_gone_within(pids: &[u32], limit: Duration, what: &str) {
    assert!(!pids.is_empty());
    let took = within(limit, || alive(pids).is_empty());
    assert!(
        took.is_some(),
        "{what}: still running after {limit:?}: {:?}",
        alive(pids)
    );
}

/// Kills a worker (and so, through containment, its job's tree) however a
/// test ends.
struct Reaped(Option<Child>);

impl Reaped {
    fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }
    fn finish(mut self) -> std::process::Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn assert_gone_within(mark: &str, keep: Option<u32>, limit: Duration, what: &str) {
    let took = within(limit, || left(mark, keep).is_empty());
    assert!(
        took.is_some(),
        "{what}: still running after {limit:?}: {:?}",
        left(mark, keep)
    );
}

fn run_sigkilled(d: Dir) {
    let m = mark("runkill");
    let mut run = start_run(&d, &m, &[], TREE);
    wait_for_tree(&m, &DEEPEST);
    signal(run.id(), libc::SIGKILL);
    assert_gone_within(&m, None, Duration::from_secs(1), "leasehold SIGKILLed");
    let _ = run.wait();
}

#[test]
fn run_sigkilled_leaves_no_process_of_its_command() {
    run_sigkilled(Dir::new("ck-run"));
}

#[test]
fn run_on_the_file_store_sigkilled_leaves_no_process_of_its_command() {
    run_sigkilled(Dir::new_file("ck-run"));
}

fn run_lease_lost(d: Dir) {
    let m = mark("runlost");
    let run = start_run(&d, &m, &[], TREE);
    wait_for_tree(&m, &DEEPEST);
    // Take the lease away: release it with the holder's own id and token.
    let s = d.json(&["lock", "status", "job"]);
    let holder = s["holders"][0]["holder"].as_str().unwrap().to_owned();
    let token = s["holders"][0]["token"].as_u64().unwrap().to_string();
    d.json(&[
        "lock", "release", "job", "--holder", &holder, "--token", &token,
    ]);
    // Seen at the next renewal (about TTL/3), then grace + 1 s.
    assert_gone_within(
        &m,
        Some(run.id()),
        Duration::from_millis(400 + 300 + 1000),
        "lease lost",
    );
    let out = run.wait_with_output().unwrap();
    assert_eq!(code(&out), 76, "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn run_that_loses_its_lease_stops_its_whole_tree() {
    run_lease_lost(Dir::new("ck-lost"));
}

#[test]
fn run_on_the_file_store_that_loses_its_lease_stops_its_whole_tree() {
    run_lease_lost(Dir::new_file("ck-lost"));
}

fn run_sigtermed(d: Dir) {
    let m = mark("runterm");
    let run = start_run(&d, &m, &[], TREE);
    wait_for_tree(&m, &DEEPEST);
    signal(run.id(), libc::SIGTERM);
    assert_gone_within(
        &m,
        Some(run.id()),
        Duration::from_millis(300 + 1000),
        "SIGTERM to leasehold",
    );
    let out = run.wait_with_output().unwrap();
    assert_eq!(code(&out), 128 + 15, "the command's status");
    let s = d.json(&["lock", "status", "job"]);
    assert!(s["holders"].as_array().unwrap().is_empty(), "released");
}

#[test]
fn run_sigtermed_stops_its_whole_tree_after_the_grace_period() {
    run_sigtermed(Dir::new("ck-term"));
}

#[test]
fn run_on_the_file_store_sigtermed_stops_its_whole_tree() {
    run_sigtermed(Dir::new_file("ck-term"));
}

#[test]
fn run_leaves_nothing_behind_when_its_command_exits() {
    let d = Dir::new("ck-exit");
    let m = mark("runexit");
    // Not `output()`: it would wait for leftovers holding the pipes.
    let status = d
        .cmd()
        .args(["run", "job", "--ttl", "5s", "--grace", "300ms", "--"])
        .args(["sh", "-c", "sleep 37 & setsid sleep 38 & exit 3"])
        .env("LH_MARK", &m)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(3));
    assert!(
        left(&m, None).is_empty(),
        "leftovers are stopped before the lease is released: {:?}",
        left(&m, None)
    );
}

/// `setsid` and a double fork detach a daemon from its process group and
/// parent. The PID namespace holds it anyway, even when the supervisor
/// itself is SIGKILLed; the subreaper finds it through re-parenting.
#[test]
fn setsid_daemons_do_not_escape() {
    let daemon = "setsid sh -c 'sleep 42 & exit 0'; sleep 43";
    for (mode, victim) in [
        ("namespace", "leasehold"),
        ("namespace", "supervisor"),
        ("subreaper", "leasehold"),
    ] {
        let d = Dir::new("ck-setsid");
        let m = mark("setsid");
        let mut run = start_run(&d, &m, &["--contain", mode], daemon);
        wait_for_tree(&m, &["sleep 42", "sleep 43"]);
        let pid = match victim {
            "leasehold" => run.id(),
            _ => survivors(&m)
                .into_iter()
                .find(|(_, cmd)| cmd.starts_with("leasehold-supervisor"))
                .map(|(pid, _)| pid)
                .expect("the supervisor"),
        };
        signal(pid, libc::SIGKILL);
        let keep = (victim == "supervisor").then(|| run.id());
        assert_gone_within(
            &m,
            keep,
            Duration::from_secs(1),
            &format!("{mode}: {victim} SIGKILLed"),
        );
        signal(run.id(), libc::SIGKILL);
        let _ = run.wait();
    }
}

#[test]
fn the_mode_in_force_is_reported() {
    let d = Dir::new("ck-mode");
    for (mode, says) in [
        ("auto", "in its own PID namespace"),
        ("namespace", "in its own PID namespace"),
        ("subreaper", "under a subreaper supervisor"),
    ] {
        let out = d.run(&["run", "job", "--ttl", "5s", "--contain", mode, "--", "true"]);
        assert!(out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{mode}: {err}");
    }
}

/// As an unprivileged user, the namespace comes through a user namespace
/// that maps the user's own ids (skipped where `setpriv` is missing or the
/// kernel forbids unprivileged user namespaces).
#[test]
fn unprivileged_users_get_a_pid_namespace_too() {
    let probe = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["unshare", "--user", "--pid", "--fork", "true"])
        .output();
    if !matches!(&probe, Ok(o) if o.status.success()) {
        eprintln!("SKIPPED: no unprivileged user namespaces here (or no setpriv, or not root)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("leasehold-ck-nobody-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let m = mark("nobody");
    let run = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(cli::bin())
        .arg("--store")
        .arg(format!("sqlite:{}", dir.join("x.db").display()))
        .args(["run", "job", "--ttl", "1s", "--", "sh", "-c"])
        .arg("echo uid=$(id -u); setsid sleep 44 & sleep 45")
        .env("LH_MARK", &m)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_tree(&m, &["sleep 44", "sleep 45"]);
    signal(run.id(), libc::SIGKILL);
    assert_gone_within(
        &m,
        None,
        Duration::from_secs(1),
        "nobody's leasehold SIGKILLed",
    );
    let out = run.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in its own PID namespace"), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("uid=65534"),
        "the user keeps its own uid inside"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------ queue work

fn start_worker(d: &Dir, mark: &str, lease: &str) -> Child {
    d.cmd()
        .args(["queue", "work", "q", "--lease", lease, "--grace", "300ms"])
        .args(["--", "sh", "-c", TREE])
        .env("LH_MARK", mark)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn work_cases(d: Dir) {
    // SIGKILL of the worker.
    d.json(&["queue", "push", "q", "--payload", "x"]);
    let m = mark("wkill");
    let w = Reaped(Some(start_worker(&d, &m, "30s")));
    wait_for_tree(&m, &DEEPEST);
    signal(w.id(), libc::SIGKILL);
    assert_gone_within(&m, None, Duration::from_secs(1), "worker SIGKILLed");
    drop(w);

    // A cancel, seen at the next heartbeat (lease/3).
    let id = d.json(&["queue", "push", "q", "--payload", "y"])["id"].to_string();
    let m = mark("wcancel");
    let w = Reaped(Some(start_worker(&d, &m, "1500ms")));
    wait_for_tree(&m, &DEEPEST);
    let tree = tree_now(&m, w.id());
    d.json(&["queue", "cancel", &id]);
    assert_pids_gone_within(
        &tree,
        Duration::from_millis(600 + 300 + 1000),
        "job cancelled",
    );
    signal(w.id(), libc::SIGTERM);
    let out = w.finish();
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"outcome\":\"cancelled\""));

    // A lost claim: the worker is stopped past its lease.
    d.json(&["queue", "push", "q", "--payload", "z"]);
    let m = mark("wlost");
    let w = Reaped(Some(start_worker(&d, &m, "1s")));
    wait_for_tree(&m, &DEEPEST);
    let tree = tree_now(&m, w.id());
    signal(w.id(), libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(1500));
    signal(w.id(), libc::SIGCONT);
    assert_pids_gone_within(&tree, Duration::from_millis(300 + 1000), "claim lost");

    // SIGTERM to the worker: its job's tree gets it, SIGKILL after the grace.
    wait_for_tree(&m, &DEEPEST);
    let tree = tree_now(&m, w.id());
    signal(w.id(), libc::SIGTERM);
    assert_pids_gone_within(
        &tree,
        Duration::from_millis(300 + 1000),
        "SIGTERM to the worker",
    );
    let out = w.finish();
    let lines = String::from_utf8_lossy(&out.stdout);
    assert!(lines.contains("\"outcome\":\"lost\""), "{lines}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(left(&m, None).is_empty(), "{:?}", left(&m, None));
}

#[test]
fn queue_work_never_leaves_a_job_command_running() {
    work_cases(Dir::new("ck-work"));
}

/// Whatever CMD does with its stdin, a cancel is acted on at once: the
/// payload is written by a thread of its own.
#[test]
fn queue_work_stops_a_command_that_ignores_a_large_payload() {
    let d = Dir::new("ck-stdin");
    let payload = "x".repeat(1 << 20);
    let mut push = d
        .cmd()
        .args(["queue", "push", "q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    push.stdin
        .take()
        .unwrap()
        .write_all(payload.as_bytes())
        .unwrap();
    assert!(push.wait_with_output().unwrap().status.success());
    let m = mark("stdin");
    let w = Reaped(Some(
        d.cmd()
            .args([
                "queue", "work", "q", "--lease", "2s", "--grace", "1s", "--", "sleep", "8",
            ])
            .env("LH_MARK", &m)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    wait_for_tree(&m, &["sleep 8"]);
    std::thread::sleep(Duration::from_millis(300));
    d.json(&["queue", "cancel", "1"]);
    // The next heartbeat (lease/3) sees the cancel; sleep dies of SIGTERM.
    assert_gone_within(
        &m,
        Some(w.id()),
        Duration::from_millis(700 + 1000),
        "cancelled",
    );
    let s = d.stats("q");
    assert_eq!(s["cancelled"], 1, "{s:?}");
    signal(w.id(), libc::SIGTERM);
    assert!(w.finish().status.success());
}
