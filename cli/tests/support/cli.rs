//! The `leasehold` binary in a fresh working directory, on SQLite, the
//! file store or a fresh PostgreSQL schema.

#![allow(dead_code, clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

// The library's PostgreSQL test support, shared rather than copied.
#[path = "../../../tests/support/pg.rs"]
pub mod pg;

pub const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// The binary under test: this build's, or `LEASEHOLD_TEST_BIN` (to show
/// that a test fails on an older build).
pub fn bin() -> String {
    std::env::var("LEASEHOLD_TEST_BIN").unwrap_or_else(|_| BIN.to_owned())
}

/// Which store a test directory's commands use.
pub enum Kind {
    Sqlite,
    File,
    /// A fresh schema on the `LEASEHOLD_TEST_PG` server.
    Postgres(pg::Schema),
}

/// A working directory (for logs and the SQLite or file store).
pub struct Dir(pub PathBuf, pub Kind);

impl Dir {
    /// A directory whose store is `file:DIR/leases` instead of SQLite.
    pub fn new_file(tag: &str) -> Dir {
        let mut d = Dir::new(tag);
        d.1 = Kind::File;
        d
    }

    /// A directory whose store is a fresh PostgreSQL schema, or `None`
    /// (with a skip notice) when `LEASEHOLD_TEST_PG` is unset.
    pub fn new_pg(tag: &str) -> Option<Dir> {
        if !pg::enabled() {
            return None;
        }
        let mut d = Dir::new(tag);
        d.1 = Kind::Postgres(pg::Schema::new(tag));
        Some(d)
    }

    pub fn new(tag: &str) -> Dir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "leasehold-cli-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d, Kind::Sqlite)
    }

    pub fn store(&self) -> String {
        match &self.1 {
            Kind::File => format!("file:{}", self.0.join("leases").display()),
            Kind::Sqlite => format!("sqlite:{}", self.0.join("test.db").display()),
            Kind::Postgres(schema) => schema.url(),
        }
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(bin());
        c.env("LEASEHOLD_STORE", self.store()).current_dir(&self.0);
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{args:?} printed {text:?}: {e}"))
    }

    /// Every JSON line a command printed (it must succeed).
    pub fn lines(&self, args: &[&str]) -> Vec<serde_json::Value> {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }

    /// The queue's counts per state (`queue stats` without `paused`).
    pub fn stats(&self, queue: &str) -> BTreeMap<String, u64> {
        let v = self.json(&["queue", "stats", queue]);
        v.as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k != "paused")
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

/// A marker unique to this test process and call, for [`survivors`].
pub fn mark(tag: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Processes whose environment holds `LH_MARK=<mark>`: everything started
/// under a command run with that variable, however it detached itself
/// (`setsid`, double fork, `nohup`), as pid and command line.
pub fn survivors(mark: &str) -> Vec<(u32, String)> {
    let needle = format!("LH_MARK={mark}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
            // A zombie keeps its environ only while it is alive: skip those.
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .map(|(_, r)| r.trim_start().chars().next());
            if state == Some(Some('Z')) {
                continue;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmdline.trim().to_owned()));
        }
    }
    found
}

/// Poll `cond` every 20 ms until it holds or `limit` passes; how long it took.
pub fn within(
    limit: std::time::Duration,
    mut cond: impl FnMut() -> bool,
) -> Option<std::time::Duration> {
    let start = std::time::Instant::now();
    loop {
        if cond() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Send `sig` to `pid`.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling a process this test started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}
