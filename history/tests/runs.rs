//! Short runs of the harness on real processes: a run under kills and
//! pauses passes on SQLite (and on PostgreSQL when `LEASEHOLD_TEST_PG` is
//! set), so do runs under wall-clock steps and (PostgreSQL, as root)
//! network partitions, and the split-brain canary fails with the
//! categories it breaks.

use std::path::PathBuf;
use std::process::Command;

fn run(store: &str, dir: &PathBuf, extra: &[&str]) -> (i32, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold-history"))
        .args(["run", "--store", store, "--dir"])
        .arg(dir)
        .args([
            "--seconds",
            "8",
            "--ttl-ms",
            "1500",
            "--lease-procs",
            "3",
            "--queue-procs",
            "3",
        ])
        .args(extra)
        .output()
        .expect("the harness runs");
    let summary = std::fs::read_to_string(dir.join("summary.json")).expect("a summary");
    let summary: serde_json::Value = serde_json::from_str(&summary).expect("JSON");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    (out.status.code().unwrap_or(-1), summary)
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leasehold-history-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_run_under_kills_and_pauses_passes_on_sqlite() {
    let base = temp("sqlite");
    let store = format!("sqlite:{}", base.join("store.db").display());
    let (code, summary) = run(
        &store,
        &base.join("run"),
        &["--faults", "kill,stop", "--seed", "3"],
    );
    assert_eq!(code, 0, "{summary:#}");
    assert!(
        summary["counts"]["lease grants"].as_u64().unwrap() > 20,
        "{summary:#}"
    );
    assert!(
        summary["counts"]["pushes acknowledged"].as_u64().unwrap() > 20,
        "{summary:#}"
    );
    let faults = &summary["run"]["faults"];
    assert!(
        faults["kill"].as_u64().unwrap_or(0) + faults["stop"].as_u64().unwrap_or(0) > 0,
        "{summary:#}"
    );
}

/// Wall-clock steps of single clients (libfaketime, forward and back by
/// up to ten TTLs) change nothing the checker can see: leases and claims
/// run on monotonic and boot clocks. The stepped clients' records show
/// their wall clocks moved.
#[test]
fn a_run_under_wall_clock_steps_passes_on_sqlite() {
    let lib = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    if std::env::var_os("LEASEHOLD_FAKETIME").is_none() && !std::path::Path::new(lib).exists() {
        eprintln!("SKIPPED: libfaketime (Debian's faketime) is not installed; .ci/run installs it");
        return;
    }
    let base = temp("clock");
    let store = format!("sqlite:{}", base.join("store.db").display());
    let dir = base.join("run");
    let (code, summary) = run(
        &store,
        &dir,
        &[
            "--faults",
            "clock-step",
            "--max-faults",
            "30",
            "--seed",
            "4",
        ],
    );
    assert_eq!(code, 0, "{summary:#}");
    assert!(
        summary["run"]["faults"]["clock-step"].as_u64().unwrap_or(0) > 5,
        "{summary:#}"
    );
    // Some client's wall clock really moved against the monotonic one.
    let mut moved = false;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".jsonl") || name == "faults.jsonl" {
            continue;
        }
        let offsets: Vec<i64> = std::fs::read_to_string(entry.path())
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|e| e["wall"].as_i64().unwrap() - e["mono"].as_i64().unwrap() / 1_000_000)
            .collect();
        let (lo, hi) = (offsets.iter().min(), offsets.iter().max());
        moved |= matches!((lo, hi), (Some(lo), Some(hi)) if hi - lo > 1_000);
    }
    assert!(moved, "no client's wall clock moved");
}

/// Bursts of I/O errors (libfiu: EIO on a fifth of a client's writes and
/// half its syncs for 1.5 TTLs), with kills, pauses and clock steps: the
/// history checks out. This run found that the checker took a holder's
/// acquire after a release of unknown outcome (which had not committed)
/// for a second grant of the same token; an acquire by the holder extends
/// its grant.
#[test]
fn a_run_under_io_errors_passes_on_sqlite() {
    if !std::path::Path::new("/usr/lib/fiu/fiu_posix_preload.so").exists() {
        eprintln!("SKIPPED: libfiu (Debian's fiu-utils) is not installed; .ci/run installs it");
        return;
    }
    let mut faults = "io-error,kill,stop".to_owned();
    if std::path::Path::new("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1").exists() {
        faults += ",clock-step";
    }
    let base = temp("io");
    let store = format!("sqlite:{}", base.join("store.db").display());
    let (code, summary) = run(
        &store,
        &base.join("run"),
        &["--faults", &faults, "--max-faults", "20", "--seed", "8"],
    );
    assert_eq!(code, 0, "{summary:#}");
    assert!(
        summary["run"]["faults"]["io-error"].as_u64().unwrap_or(0) > 0,
        "{summary:#}"
    );
}

#[test]
fn the_split_brain_canary_is_caught() {
    let base = temp("canary");
    let store = format!("sqlite:{}", base.join("store.db").display());
    let (code, summary) = run(
        &store,
        &base.join("run"),
        &["--faults", "", "--canary", "split-brain", "--keys", "1"],
    );
    assert_eq!(code, 1, "{summary:#}");
    let counts = &summary["counts"];
    assert!(
        counts["protected intervals overlap"].as_u64().unwrap_or(0) > 0,
        "{summary:#}"
    );
    assert!(
        counts["not linearizable (mutex)"].as_u64().unwrap_or(0) > 0,
        "{summary:#}"
    );
    assert!(counts["lost"].as_u64().unwrap_or(0) > 0, "{summary:#}");
}

#[test]
fn a_run_under_kills_pauses_and_restarts_passes_on_postgres() {
    let Ok(pg) = std::env::var("LEASEHOLD_TEST_PG") else {
        eprintln!("LEASEHOLD_TEST_PG is unset: skipping the PostgreSQL history run");
        return;
    };
    // A restart of the server only where this harness may (root, the
    // machine's own cluster); else kills and pauses.
    let faults = if is_root() {
        "kill,stop,pg-restart"
    } else {
        "kill,stop"
    };
    let base = temp("pg");
    let (code, summary) = run(&pg, &base.join("run"), &["--faults", faults, "--seed", "5"]);
    assert_eq!(code, 0, "{summary:#}");
    assert!(
        summary["counts"]["lease grants"].as_u64().unwrap() > 10,
        "{summary:#}"
    );
}

/// Clients in a network namespace of the run's own, cut off from
/// PostgreSQL by taking their link down for 1.5 TTLs at a time (as root;
/// iproute2): the history still checks out.
#[test]
fn a_run_under_network_partitions_passes_on_postgres() {
    let Ok(pg) = std::env::var("LEASEHOLD_TEST_PG") else {
        eprintln!("LEASEHOLD_TEST_PG is unset: skipping the PostgreSQL partition run");
        return;
    };
    if !is_root() {
        eprintln!("SKIPPED: network namespaces need root (CI runs as root)");
        return;
    }
    let base = temp("partition");
    let (code, summary) = run(
        &pg,
        &base.join("run"),
        &["--faults", "partition,kill", "--seed", "6"],
    );
    assert_eq!(code, 0, "{summary:#}");
    assert!(
        summary["run"]["faults"]["partition"].as_u64().unwrap_or(0) > 0,
        "{summary:#}"
    );
    assert!(
        summary["counts"]["lease grants"].as_u64().unwrap() > 10,
        "{summary:#}"
    );
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}
