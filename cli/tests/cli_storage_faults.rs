//! Storage faults injected into real `leasehold` processes with libfiu
//! (`fiu-run` from Debian's fiu-utils; `.ci/run` installs it): EIO and
//! ENOSPC on writes, short writes, EIO and ENOSPC on `fsync`/`fdatasync`, on the
//! SQLite database and on the file store's lease directory. Only commands
//! that do not fork run under the preload (it is not fork-safe).
//!
//! For each fault: every call either succeeds or exits 1 naming the cause
//! (never a panic, never "malformed"); every acknowledged push is kept;
//! tokens only rise; afterwards `PRAGMA integrity_check` is `ok` and a
//! fresh process carries on, its token above every one handed out.

#![allow(clippy::disallowed_methods)] // real processes

use std::process::Output;

#[path = "support/cli.rs"]
mod cli;
use cli::{bin, code, Dir};

/// `fiu-run`, or `None` with a skip notice when fiu-utils is missing.
fn fiu_run() -> Option<&'static str> {
    let found = std::process::Command::new("fiu-run")
        .arg("-h")
        .output()
        .is_ok();
    if !found {
        eprintln!("SKIPPED: fiu-run (Debian's fiu-utils) is not installed; .ci/run installs it");
    }
    found.then_some("fiu-run")
}

/// The faults, each as fiu-ctrl commands (`failinfo` is the errno).
/// A call makes tens of `pwrite`s (SQLite's WAL and shared memory):
/// 3 % of them failing fails about half the calls.
const FAULTS: [(&str, &[&str]); 6] = [
    (
        "a read-only filesystem (EROFS on every pwrite)",
        &["enable_random name=posix/io/rw/pwrite,probability=1,failinfo=30"],
    ),
    (
        "EIO on 3% of pwrite",
        &["enable_random name=posix/io/rw/pwrite,probability=0.03,failinfo=5"],
    ),
    (
        "ENOSPC on 3% of pwrite",
        &["enable_random name=posix/io/rw/pwrite,probability=0.03,failinfo=28"],
    ),
    (
        "ENOSPC on half the fsync and fdatasync calls",
        &[
            "enable_random name=posix/io/sync/fsync,probability=0.5,failinfo=28",
            "enable_random name=posix/io/sync/fdatasync,probability=0.5,failinfo=28",
        ],
    ),
    (
        "short writes on half the pwrites",
        &["enable_random name=posix/io/rw/pwrite/reduce,probability=0.5"],
    ),
    (
        "EIO on half the fsync and fdatasync calls",
        &[
            "enable_random name=posix/io/sync/fsync,probability=0.5,failinfo=5",
            "enable_random name=posix/io/sync/fdatasync,probability=0.5,failinfo=5",
        ],
    ),
];

/// Run the binary under `fiu-run` with `faults` enabled.
fn under(d: &Dir, fiu: &str, faults: &[&str], args: &[&str]) -> Output {
    let mut c = std::process::Command::new(fiu);
    c.arg("-x");
    for f in faults {
        c.args(["-c", f]);
    }
    c.arg(bin())
        .args(args)
        .env("LEASEHOLD_STORE", d.store())
        .current_dir(&d.0)
        .output()
        .unwrap()
}

/// A call under a fault: its JSON line if it succeeded; `None` if it
/// exited 1 naming an I/O cause (anything else fails the test).
fn outcome(out: &Output, what: &str) -> Option<serde_json::Value> {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("panicked") && !err.contains("malformed"),
        "{what}: {err}"
    );
    match code(out) {
        0 => Some(serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: {e}"))),
        1 => {
            let named = [
                "disk I/O error",
                "database or disk is full",
                "os error",
                "unable to open",
            ]
            .iter()
            .any(|c| err.contains(c));
            assert!(named, "{what}: the error names no cause: {err}");
            None
        }
        75 => None, // the 1 ms lease of an earlier call not seen expired yet
        c => panic!("{what}: exit {c}: {err}"),
    }
}

fn integrity(d: &Dir) -> String {
    let conn = rusqlite::Connection::open(d.0.join("test.db")).unwrap();
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn sqlite_calls_under_storage_faults_fail_cleanly_and_keep_what_was_acknowledged() {
    let Some(fiu) = fiu_run() else { return };
    for (name, faults) in FAULTS {
        let d = Dir::new("fiu-sqlite");
        d.json(&["queue", "push", "q", "--payload", "first"]);
        let (mut pushed, mut tokens, mut failed) = (Vec::new(), Vec::new(), 0);
        for i in 0..25 {
            let payload = format!("p{i}");
            let out = under(
                &d,
                fiu,
                faults,
                &["queue", "push", "q", "--payload", &payload],
            );
            match outcome(&out, &format!("{name}: push {i}")) {
                Some(v) => pushed.push((v["id"].as_u64().unwrap(), payload)),
                None => failed += 1,
            }
            let out = under(&d, fiu, faults, &["lock", "acquire", "k", "--ttl", "1ms"]);
            match outcome(&out, &format!("{name}: acquire {i}")) {
                Some(v) => tokens.push(v["token"].as_u64().unwrap()),
                None => failed += 1,
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{name}: tokens only rise: {tokens:?}"
        );
        // Without the fault: a consistent store, nothing acknowledged lost.
        assert_eq!(integrity(&d), "ok", "{name}");
        for (id, payload) in &pushed {
            let job = d.json(&["queue", "get", &id.to_string()]);
            assert_eq!(
                job["payload"].as_str(),
                Some(payload.as_str()),
                "{name}: job {id}"
            );
        }
        let fresh = d.json(&["lock", "acquire", "k", "--ttl", "1s"]);
        let fresh = fresh["token"].as_u64().unwrap();
        assert!(
            tokens.iter().all(|&t| t < fresh),
            "{name}: fresh token {fresh} after {tokens:?}"
        );
        eprintln!(
            "{name}: {} pushes and {} grants acknowledged, {failed} calls failed",
            pushed.len(),
            tokens.len()
        );
    }
}

#[test]
fn file_store_calls_under_storage_faults_fail_cleanly_and_tokens_only_rise() {
    let Some(fiu) = fiu_run() else { return };
    for (name, faults) in FAULTS {
        let d = Dir::new_file("fiu-file");
        d.json(&["lock", "acquire", "k", "--ttl", "1ms"]);
        let mut tokens = vec![1];
        for i in 0..40 {
            let out = under(&d, fiu, faults, &["lock", "acquire", "k", "--ttl", "1ms"]);
            if let Some(v) = outcome(&out, &format!("{name}: acquire {i}")) {
                tokens.push(v["token"].as_u64().unwrap());
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{name}: tokens only rise: {tokens:?}"
        );
        // Without the fault: the record reads, and the next grant is above
        // every token handed out.
        let status = d.json(&["lock", "status", "k"]);
        assert!(status.is_object(), "{name}: {status}");
        let fresh = d.json(&["lock", "acquire", "k", "--ttl", "1s"]);
        let fresh = fresh["token"].as_u64().unwrap();
        assert!(
            tokens.iter().all(|&t| t < fresh),
            "{name}: fresh token {fresh} after {tokens:?}"
        );
    }
}
