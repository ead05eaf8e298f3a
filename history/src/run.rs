//! The orchestrator: clients, faults, the drain, the verdict.

use crate::check::{self, Verdict};
use crate::record::{self, Event, Recorder};
use crate::resource::Resource;
use crate::{die, Args};
use leasehold::{Client, JobId, JobState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Proc {
    p: String,
    kind: &'static str,
    child: Child,
    /// Stopped until this instant (then SIGCONT).
    stopped_until: Option<Instant>,
}

fn signal(child: &Child, sig: i32) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(pid, sig) };
    }
}

/// PostgreSQL restarted under the clients (the cluster of this machine;
/// `pg_ctlcluster`, as root).
fn restart_postgres() -> bool {
    let Ok(versions) = std::fs::read_dir("/etc/postgresql") else {
        return false;
    };
    let mut ok = false;
    for v in versions.flatten() {
        let v = v.file_name().to_string_lossy().into_owned();
        ok |= Command::new("pg_ctlcluster")
            .args([
                "--skip-systemctl-redirect",
                &v,
                "main",
                "restart",
                "-m",
                "fast",
            ])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    }
    ok
}

pub fn run(args: &Args) -> i32 {
    let store = args.str("store", None);
    let dir = std::path::PathBuf::from(args.str("dir", None));
    let seconds: f64 = args.num("seconds", "20");
    let seed: u64 = args.num("seed", "1");
    let lease_procs: u32 = args.num("lease-procs", "4");
    // The file store keeps leases only: no queue clients there.
    let queue_procs: u32 = if store.starts_with("file:") {
        0
    } else {
        args.num("queue-procs", "4")
    };
    let max_faults: u32 = args.num("max-faults", "12");
    let ttl_ms: u64 = args.num("ttl-ms", "3000");
    let keys: u32 = args.num("keys", "2");
    let faults: Vec<String> = args
        .str("faults", Some("kill,stop"))
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    // The canary: half the clients on a copy of the store (split brain), which
    // the checker must catch (two holders at once; pushes lost).
    let canary = args.str("canary", Some(""));
    let split = match canary.as_str() {
        "" => None,
        "split-brain" if store.starts_with("sqlite:") || store.starts_with("file:") => {
            Some(format!("{store}.split"))
        }
        other => die(&format!(
            "--canary: unknown or unsupported here: {other:?} (split-brain, on sqlite: or file:)"
        )),
    };
    for f in &faults {
        if !matches!(
            f.as_str(),
            "kill" | "stop" | "pg-restart" | "clock-step" | "partition" | "io-error"
        ) {
            die(&format!(
                "--faults: unknown fault {f:?} (kill, stop, pg-restart, clock-step, partition, io-error)"
            ));
        }
    }
    // I/O errors: every client runs under libfiu's POSIX preload (the
    // clients never fork), its faults toggled from here with fiu-ctrl.
    let fiu = faults.iter().any(|f| f == "io-error").then(fiu_libs);
    // Clients whose I/O fails until this instant.
    let mut failing: Vec<(String, Instant)> = Vec::new();
    // Partitions: the clients in a network namespace of the run's own,
    // reaching PostgreSQL through a relay on the other end of a veth pair.
    let net = faults.iter().any(|f| f == "partition").then(|| {
        if !store.starts_with("postgres") {
            die("--faults partition: for a postgres:// store (clients and server on both sides of a link)");
        }
        crate::net::Net::new(&store)
    });
    let client_store = net
        .as_ref()
        .map_or(store.clone(), |n| n.url_through_relay(&store));
    // Links restored at this instant (a partition lasts 1.5 TTLs).
    let mut cut_until: Option<Instant> = None;
    // Clock steps: every client runs under libfaketime, its wall clock
    // offset by what its own file says (read at every clock call); the
    // monotonic and boot clocks stay true, as an NTP step leaves them.
    let faketime = faults.iter().any(|f| f == "clock-step").then(faketime_lib);
    clear_run_dir(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| die(&format!("{}: {e}", dir.display())));
    // The fenced resource is made (its journal mode, its tables) before any
    // client opens it: clients started at once raced to switch its journal
    // mode, and a client that lost the race died of "database is locked".
    Resource::open(&dir.join("resource.db"))
        .unwrap_or_else(|e| die(&format!("the fenced resource: {e}")));
    // Names of this run's keys and queue (a shared server keeps others').
    let ns = format!("h{seed}-{}", std::process::id());
    let exe = std::env::current_exe().unwrap_or_else(|e| die(&e.to_string()));
    let ttl = Duration::from_millis(ttl_ms);
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let mut next_id = 0u32;
    let mut spawn = |kind: &'static str, rng: &mut StdRng| -> Proc {
        next_id += 1;
        let p = format!("{}{next_id}", if kind == "lease" { "L" } else { "Q" });
        let left = end.saturating_duration_since(Instant::now()).as_secs_f64();
        let url = match &split {
            Some(other) if next_id % 2 == 0 => other,
            _ => &client_store,
        };
        let mut cmd = match &net {
            Some(net) => net.command(&exe),
            None => Command::new(&exe),
        };
        let mut preload: Vec<String> = fiu.clone().unwrap_or_default();
        if let Some(lib) = &faketime {
            preload.push(lib.display().to_string());
        }
        if fiu.is_some() {
            cmd.env("FIU_ENABLE", "")
                .env("FIU_CTRL_FIFO", fiu_fifo_prefix());
        }
        if !preload.is_empty() {
            cmd.env("LD_PRELOAD", preload.join(" "));
        }
        if faketime.is_some() {
            let offset = clock_file(&dir, &p);
            std::fs::write(&offset, "+0")
                .unwrap_or_else(|e| die(&format!("{}: {e}", offset.display())));
            cmd.env("FAKETIME_TIMESTAMP_FILE", &offset)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = cmd
            .args(["client", kind, "--store", url, "--p", &p, "--dir"])
            .arg(&dir)
            .args([
                "--seed",
                &rng.random::<u64>().to_string(),
                "--seconds",
                &format!("{left:.3}"),
            ])
            .args([
                "--ttl-ms",
                &ttl_ms.to_string(),
                "--keys",
                &keys.to_string(),
                "--ns",
                &ns,
            ])
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| die(&format!("starting a client: {e}")));
        Proc {
            p,
            kind,
            child,
            stopped_until: None,
        }
    };
    let mut procs: Vec<Proc> = Vec::new();
    for _ in 0..lease_procs {
        procs.push(spawn("lease", &mut rng));
    }
    for _ in 0..queue_procs {
        procs.push(spawn("queue", &mut rng));
    }
    let mut injected: std::collections::BTreeMap<String, u64> = Default::default();
    let mut count = 0;
    let mut next_fault = Instant::now() + Duration::from_millis(rng.random_range(300..1500));
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
        if let (Some(net), Some(t)) = (&net, cut_until) {
            if Instant::now() >= t {
                net.set_link(true);
                cut_until = None;
                log_fault(&dir, "network", "heal");
            }
        }
        failing.retain(|(pid, until)| {
            let over = Instant::now() >= *until;
            if over {
                let off: Vec<String> = IO_FAULTS
                    .iter()
                    .map(|(point, _)| format!("disable name={point}"))
                    .collect();
                fiu_ctrl(pid, &off);
            }
            !over
        });
        for proc in &mut procs {
            if proc.stopped_until.is_some_and(|t| Instant::now() >= t) {
                signal(&proc.child, libc::SIGCONT);
                proc.stopped_until = None;
                log_fault(&dir, &proc.p, "cont");
            }
        }
        if faults.is_empty() || count >= max_faults || Instant::now() < next_fault {
            continue;
        }
        next_fault = Instant::now() + Duration::from_millis(rng.random_range(300..1500));
        let fault = faults[rng.random_range(0..faults.len())].clone();
        let live: Vec<usize> = (0..procs.len())
            .filter(|&i| procs[i].stopped_until.is_none())
            .collect();
        if live.is_empty() {
            continue;
        }
        let i = live[rng.random_range(0..live.len())];
        count += 1;
        *injected.entry(fault.clone()).or_default() += 1;
        match fault.as_str() {
            "kill" => {
                signal(&procs[i].child, libc::SIGKILL);
                let _ = procs[i].child.wait();
                log_fault(&dir, &procs[i].p, "kill");
                let kind = procs[i].kind;
                procs[i] = spawn(kind, &mut rng);
            }
            "stop" => {
                signal(&procs[i].child, libc::SIGSTOP);
                log_fault(&dir, &procs[i].p, "stop");
                procs[i].stopped_until = Some(Instant::now() + ttl.mul_f64(1.5));
            }
            "clock-step" => {
                // Forward or back, by up to ten TTLs (from where it was).
                let step_ms = rng.random_range(1..=10 * ttl_ms) as i64;
                let step_ms = if rng.random_bool(0.5) {
                    step_ms
                } else {
                    -step_ms
                };
                let file = clock_file(&dir, &procs[i].p);
                let now: i64 = std::fs::read_to_string(&file)
                    .ok()
                    .and_then(|t| t.trim().trim_end_matches('s').parse::<f64>().ok())
                    .map_or(0, |s| (s * 1000.0) as i64);
                let to = now + step_ms;
                std::fs::write(&file, format!("{:+.3}s", to as f64 / 1000.0))
                    .unwrap_or_else(|e| die(&format!("{}: {e}", file.display())));
                log_fault(&dir, &procs[i].p, &format!("clock-step {step_ms:+} ms"));
            }
            "io-error" => {
                // EIO on a fifth of its writes and half its syncs, for 1.5
                // TTLs (SQLite's and the file store's pwrite and syncs).
                let pid = procs[i].child.id().to_string();
                let on: Vec<String> = IO_FAULTS
                    .iter()
                    .map(|(point, how)| format!("enable_random name={point},{how}"))
                    .collect();
                fiu_ctrl(&pid, &on);
                failing.push((pid, Instant::now() + ttl.mul_f64(1.5)));
                log_fault(&dir, &procs[i].p, "io-error");
            }
            "partition" => match &net {
                Some(net) if cut_until.is_none() => {
                    net.set_link(false);
                    cut_until = Some(Instant::now() + ttl.mul_f64(1.5));
                    log_fault(&dir, "network", "partition");
                }
                _ => {}
            },
            _ => {
                if restart_postgres() {
                    log_fault(&dir, "postgres", "pg-restart");
                }
            }
        }
    }
    if let (Some(net), Some(_)) = (&net, cut_until.take()) {
        net.set_link(true);
        log_fault(&dir, "network", "heal");
    }
    for proc in &mut procs {
        if proc.stopped_until.take().is_some() {
            signal(&proc.child, libc::SIGCONT);
        }
    }
    for proc in &mut procs {
        let _ = proc.child.wait();
    }
    if queue_procs > 0 {
        drain(&store, &ns, &dir, ttl);
    }
    eprintln!("faults injected: {injected:?}");
    std::fs::write(dir.join("run.json"), serde_json::json!({"seed": seed, "store": store, "faults": injected, "ttl_ms": ttl_ms, "canary": canary}).to_string())
        .unwrap_or_else(|e| die(&e.to_string()));
    judge(&dir, args)
}

/// Empty `dir` of an earlier run's files; refuse a directory holding
/// anything else (a mistyped `--dir` never deletes someone's files).
fn clear_run_dir(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let ours = |name: &str| {
        name.ends_with(".jsonl")
            || (name.starts_with("clock-") && name.ends_with(".rc"))
            || matches!(name, "run.json" | "summary.json")
            || name.starts_with("resource.db")
    };
    let paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    if let Some(other) = paths
        .iter()
        .find(|p| !p.file_name().is_some_and(|n| ours(&n.to_string_lossy())))
    {
        die(&format!(
            "--dir {}: holds {} which is not a history run's; give a new or a former run's directory",
            dir.display(),
            other.display()
        ));
    }
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

/// The file that sets client `p`'s wall-clock offset (libfaketime's
/// `FAKETIME_TIMESTAMP_FILE`: `+12.5s`, `-3s`).
fn clock_file(dir: &Path, p: &str) -> std::path::PathBuf {
    dir.join(format!("clock-{p}.rc"))
}

/// libfaketime (Debian's faketime), or `LEASEHOLD_FAKETIME` if set.
fn faketime_lib() -> std::path::PathBuf {
    let candidates = std::env::var_os("LEASEHOLD_FAKETIME")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain(
            [
                "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                "/usr/lib/faketime/libfaketime.so.1",
            ]
            .map(std::path::PathBuf::from),
        );
    for lib in candidates {
        if lib.exists() {
            return lib;
        }
    }
    die("--faults clock-step needs libfaketime (Debian's faketime package), or LEASEHOLD_FAKETIME=/path/to/libfaketime.so.1")
}

/// libfiu's preloads (Debian's fiu-utils), or `LEASEHOLD_FIU_DIR` if set.
fn fiu_libs() -> Vec<String> {
    let dir = std::env::var("LEASEHOLD_FIU_DIR").unwrap_or_else(|_| "/usr/lib/fiu".to_owned());
    let libs: Vec<String> = ["fiu_run_preload.so", "fiu_posix_preload.so"]
        .iter()
        .map(|l| format!("{dir}/{l}"))
        .collect();
    if libs.iter().any(|l| !Path::new(l).exists()) {
        die("--faults io-error needs libfiu (Debian's fiu-utils), or LEASEHOLD_FIU_DIR=/path/to/its/preloads");
    }
    libs
}

/// The `io-error` fault: each libfiu point and how it fails (`failinfo` is
/// the errno, 5 EIO), enabled for a while and then disabled by name.
const IO_FAULTS: [(&str, &str); 3] = [
    ("posix/io/rw/pwrite", "probability=0.2,failinfo=5"),
    ("posix/io/sync/fdatasync", "probability=0.5,failinfo=5"),
    ("posix/io/sync/fsync", "probability=0.5,failinfo=5"),
];

/// Where each client's fiu-ctrl FIFOs are (fiu-run's default).
fn fiu_fifo_prefix() -> String {
    let tmp = std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".to_owned());
    format!("{tmp}/fiu-ctrl")
}

/// Send libfiu commands to a client, best effort (it may have exited) and
/// on a thread of their own (a stopped client answers only once it is
/// continued).
fn fiu_ctrl(pid: &str, commands: &[String]) {
    let pid = pid.to_owned();
    let commands = commands.to_vec();
    std::thread::spawn(move || {
        for c in commands {
            let _ = Command::new("fiu-ctrl")
                .args(["-c", &c, &pid])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    });
}

/// A fault, recorded under the process it hit (after the signal went).
fn log_fault(dir: &Path, p: &str, what: &str) {
    let mut rec =
        Recorder::create(&dir.join("faults.jsonl"), p).unwrap_or_else(|e| die(&e.to_string()));
    rec.log(Event::new(p, "fault", what));
}

/// One process free of faults claims and completes whatever is left, then
/// reads every job's end state.
fn drain(store: &str, ns: &str, dir: &Path, lease: Duration) {
    let client = match leasehold::store::open_url(store) {
        Ok(s) => Client::builder_shared(s).build(),
        Err(e) => die(&format!("the drain: {e}")),
    };
    let queue = client
        .queue(&format!("{ns}-queue"))
        .unwrap_or_else(|e| die(&e.to_string()));
    let mut rec =
        Recorder::create(&dir.join("drain.jsonl"), "drain").unwrap_or_else(|e| die(&e.to_string()));
    let give_up = Instant::now() + Duration::from_secs(120);
    while Instant::now() < give_up {
        rec.log(Event::new("", "invoke", "claim"));
        match queue.claim(lease) {
            Ok(Some(job)) => {
                let (id, token) = (job.id().0, job.token());
                rec.log(
                    Event::new("", "ok", "claim")
                        .job(id)
                        .token(token)
                        .value(String::from_utf8_lossy(job.payload())),
                );
                rec.log(Event::new("", "invoke", "complete").job(id).token(token));
                match job.complete() {
                    Ok(()) => rec.log(Event::new("", "ok", "complete").job(id).token(token)),
                    Err(e) => rec.log(
                        Event::new("", "info", "complete")
                            .job(id)
                            .token(token)
                            .value(e.to_string()),
                    ),
                };
            }
            Ok(None) => {
                rec.log(Event::new("", "ok", "claim"));
                let counts = queue.stats().unwrap_or_else(|e| die(&e.to_string()));
                let left = [JobState::Ready, JobState::Scheduled, JobState::Running]
                    .iter()
                    .map(|&s| counts.get(s))
                    .sum::<u64>();
                if left == 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => {
                rec.log(Event::new("", "info", "claim").value(e.to_string()));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    // Every job the history names, read.
    let events = record::load(dir).unwrap_or_else(|e| die(&e.to_string()));
    let mut ids: Vec<u64> = events
        .iter()
        .filter(|e| matches!(e.f.as_str(), "push" | "claim"))
        .filter_map(|e| e.job)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        match queue.get(JobId(id)) {
            Ok(job) => rec.log(
                Event::new("", "ok", "read")
                    .job(id)
                    .value(job.state.as_str()),
            ),
            Err(e) => rec.log(Event::new("", "fail", "read").job(id).value(e.to_string())),
        };
    }
}

/// Judge the run recorded in `dir`: print the counts, write
/// `summary.json`; 0 when every check passed, 1 otherwise.
pub fn judge(dir: &Path, args: &Args) -> i32 {
    let events = record::load(dir).unwrap_or_else(|e| die(&format!("{}: {e}", dir.display())));
    let meta: serde_json::Value = std::fs::read_to_string(dir.join("run.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let ttl = Duration::from_millis(
        meta.get("ttl_ms")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(3000),
    );
    let max_states: usize = args.num("check-max-states", "5000000");
    let accepted = Resource::open(&dir.join("resource.db"))
        .and_then(|r| r.accepted())
        .unwrap_or_else(|e| die(&format!("the fenced resource: {e}")));
    let mut v = Verdict::default();
    v.counts.insert(
        "operations",
        events.iter().filter(|e| e.kind == "invoke").count() as u64,
    );
    v.counts
        .insert("unknown outcomes (info or in flight)", unknown(&events));
    check::check_leases(&events, ttl, max_states, &accepted, &mut v);
    check::check_queue(&events, ttl, &mut v);
    let summary = serde_json::json!({
        "run": meta,
        "counts": v.counts,
        "failures": v.failures,
        "ok": v.failures.is_empty(),
    });
    let _ = std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&summary).unwrap_or_default(),
    );
    for (what, n) in &v.counts {
        println!("{what:>40}: {n}");
    }
    if v.failures.is_empty() {
        println!("history ok ({})", dir.display());
        0
    } else {
        for f in &v.failures {
            println!("FAILED {f}");
        }
        println!(
            "history FAILED: reproduce with {meta} (recorded in {})",
            dir.display()
        );
        1
    }
}

/// Operations whose outcome is unknown: `info`, or an `invoke` never
/// completed (a kill).
fn unknown(events: &[Event]) -> u64 {
    let mut open: std::collections::HashMap<&str, bool> = Default::default();
    let mut n = 0;
    for e in events.iter().filter(|e| e.kind != "fault") {
        match e.kind.as_str() {
            "invoke" => {
                if open.insert(&e.p, true) == Some(true) {
                    n += 1;
                }
            }
            "info" => {
                n += 1;
                open.insert(&e.p, false);
            }
            _ => {
                open.insert(&e.p, false);
            }
        }
    }
    n + open.values().filter(|&&o| o).count() as u64
}
