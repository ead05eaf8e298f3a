//! The pure modules stay pure: the core (`src/core`) and the client's
//! sans-IO machines (`src/client/machine`) read no clock, spawn no thread,
//! sleep never, touch no file or socket, and draw no unseeded randomness.
//! clippy (`clippy.toml`, `-D warnings`, and `forbid` in the machines)
//! refuses the calls; this test also refuses the *names*, so that a clock
//! or a sync primitive cannot come in through a trait or a re-export.

use std::path::Path;

const FORBIDDEN: [&str; 14] = [
    "Instant",
    "SystemTime",
    "thread::",
    "sleep(",
    "Clock",
    "crate::sync",
    "std::sync::Mutex",
    "Condvar",
    "std::fs",
    "std::net",
    "std::process",
    "rand::",
    "std::env",
    "allow(clippy::disallowed",
];

fn scan(dir: &Path, found: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            scan(&path, found);
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in FORBIDDEN {
                if code.contains(word) {
                    found.push(format!("{}:{}: {word}: {line}", path.display(), n + 1));
                }
            }
        }
    }
}

#[test]
fn the_core_and_the_client_machines_are_pure() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for dir in ["src/core", "src/client/machine"] {
        scan(&root.join(dir), &mut found);
    }
    assert!(found.is_empty(), "impure code:\n{}", found.join("\n"));
}

/// The scan itself can fail: it finds a clock read planted in a file.
#[test]
fn the_scan_finds_what_it_looks_for() {
    let dir = std::env::temp_dir().join(format!("leasehold-purity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("x.rs"),
        "fn f() { let t = std::time::Instant::now(); }\n",
    )
    .unwrap();
    let mut found = Vec::new();
    scan(&dir, &mut found);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(found.len(), 1, "{found:?}");
}
