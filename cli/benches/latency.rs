//! What users feel across processes, command line to command line (issue
//! 24), against the release binary, with the anchor each is judged by
//! measured in the same run:
//!
//! - `command/*`: a whole short command, start to exit: `flock FILE true`
//!   (the baseline), `leasehold run KEY --ttl 5s -- true` on SQLite and
//!   on the file store, `leasehold elect KEY --ttl 5s --once -- true`, and
//!   `leasehold queue work Q --drain -- true` over one job pushed before
//!   (the push is not timed).
//! - `handover/*`: a `leasehold lock acquire KEY --wait 30s` process waits
//!   for a key this process holds (through the library); timed from just
//!   before the release to the waiter's JSON line on its stdout.
//! - `push_to_start/*`: an idle `leasehold queue work Q -- sh -c 'echo >
//!   FIFO'` (one process for the whole run); timed from just before a push
//!   (through the library, in this process) to the line its command writes
//!   into a FIFO this process reads.
//!
//! Besides criterion's medians, every timed sample is kept and its
//! distribution (p50, p90, p99, max) printed and written to
//! `target/latency/NAME.txt` for BENCHMARKS.md. PostgreSQL rows run when
//! `LEASEHOLD_TEST_PG` is set (a schema `lh_bench_latency`, made afresh).
//!
//! Run: `cargo bench -p leasehold-cli --bench latency` (with
//! `LEASEHOLD_BENCH_BIN=PATH` to measure another build of `leasehold`).

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // processes, files, time

use criterion::Criterion;
use leasehold::{Client, JobSpec, LeaseOptions, PostgresStore, SqliteStore, Store};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary measured: this build's, or `LEASEHOLD_BENCH_BIN` (another
/// build, for a before/after in the same run).
fn bin() -> String {
    std::env::var("LEASEHOLD_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_leasehold").to_owned())
}

/// Every timed sample of one benchmark, for its percentiles.
#[derive(Default, Clone)]
struct Samples(Arc<Mutex<Vec<Duration>>>);

impl Samples {
    fn add(&self, d: Duration) {
        self.0.lock().unwrap().push(d);
    }

    /// Print and keep p50, p90, p99 and max of what was recorded.
    fn report(&self, name: &str) {
        let mut all = self.0.lock().unwrap().clone();
        if all.is_empty() {
            return;
        }
        all.sort();
        let at = |q: f64| all[((all.len() - 1) as f64 * q).round() as usize];
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let line = format!(
            "{name}: n={} p50={:.2}ms p90={:.2}ms p99={:.2}ms max={:.2}ms",
            all.len(),
            ms(at(0.5)),
            ms(at(0.9)),
            ms(at(0.99)),
            ms(all[all.len() - 1])
        );
        println!("{line}");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/latency");
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(
            dir.join(format!("{}.txt", name.replace('/', "_"))),
            line + "\n",
        );
    }
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leasehold-bench-latency-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn leasehold(store: &str) -> Command {
    let mut c = Command::new(bin());
    c.env_remove("LEASEHOLD_LOG")
        .env("LEASEHOLD_STORE", store)
        .stdin(Stdio::null());
    c
}

/// Run `cmd` to its end, quietly; panics unless it exits 0.
fn run_ok(cmd: &mut Command) {
    let status = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{cmd:?}: {status}");
}

/// Whole short commands, each against `flock FILE true` in the same run.
fn commands(c: &mut Criterion, dir: &Path, pg: Option<&str>) {
    let mut g = c.benchmark_group("command");
    g.sample_size(30);
    let lock_file = dir.join("flock.lock");
    g.bench_function("flock_true", |b| {
        b.iter(|| run_ok(Command::new("flock").arg(&lock_file).arg("true")))
    });
    let sqlite = format!("sqlite:{}", dir.join("cmd.db").display());
    let file = format!("file:{}", dir.join("cmd-leases").display());
    for (name, store) in [("sqlite", &sqlite), ("file", &file)] {
        g.bench_function(format!("run_true/{name}"), |b| {
            b.iter(|| run_ok(leasehold(store).args(["run", "k", "--ttl", "5s", "--", "true"])))
        });
    }
    g.bench_function("elect_once_true/sqlite", |b| {
        b.iter(|| {
            run_ok(leasehold(&sqlite).args(["elect", "e", "--ttl", "5s", "--once", "--", "true"]))
        })
    });
    let mut drains = vec![("sqlite", sqlite.clone())];
    if let Some(url) = pg {
        drains.push(("postgres", url.to_owned()));
    }
    for (name, store) in &drains {
        let client = Client::new(open(store));
        let queue = client.queue("drain1").unwrap();
        g.bench_function(format!("work_drain_one_job/{name}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    queue.push(&JobSpec::new("x")).unwrap();
                    let start = Instant::now();
                    run_ok(leasehold(store).args([
                        "queue",
                        "work",
                        "drain1",
                        "--drain",
                        "--no-schedules",
                        "--",
                        "true",
                    ]));
                    total += start.elapsed();
                }
                total
            })
        });
    }
    g.finish();
}

fn open(url: &str) -> Arc<dyn Store> {
    if let Some(path) = url.strip_prefix("sqlite:") {
        return Arc::new(SqliteStore::open(path).unwrap());
    }
    if url.starts_with("postgres") {
        return Arc::new(PostgresStore::open(url).unwrap());
    }
    leasehold::store::open_url(url).unwrap()
}

/// Samples kept per benchmark for its distribution (criterion's own
/// iterations, topped up to this many).
const SAMPLES: usize = 100;

/// Time `once` under criterion, then top its samples up to [`SAMPLES`]
/// and report their distribution.
fn timed(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    label: &str,
    mut once: impl FnMut() -> Duration,
) {
    let samples = Samples::default();
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let took = once();
                    samples.add(took);
                    took
                })
                .sum()
        })
    });
    while samples.0.lock().unwrap().len() < SAMPLES {
        samples.add(once());
    }
    samples.report(label);
}

/// A `lock acquire --wait` in another process, woken by a release here.
fn handover(c: &mut Criterion, stores: &[(&str, String)]) {
    let mut g = c.benchmark_group("handover");
    g.sample_size(10);
    for (name, url) in stores {
        let client = Client::new(open(url));
        let mut round = 0u64;
        timed(&mut g, name, &format!("handover/{name}"), || {
            // A key of its own each time: the waiter's grant just runs out.
            round += 1;
            let key = format!("handover-{round}");
            let guard = client
                .acquire(&key, LeaseOptions::new(Duration::from_secs(30)))
                .unwrap();
            let mut waiter = leasehold(url)
                .args(["lock", "acquire", &key, "--ttl", "5s", "--wait", "30s"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            // Long enough for it to find the key held and wait.
            std::thread::sleep(Duration::from_millis(300));
            let mut out = BufReader::new(waiter.stdout.take().unwrap());
            let start = Instant::now();
            guard.release().unwrap();
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            let took = start.elapsed();
            assert!(line.contains("\"token\""), "the waiter said {line:?}");
            finish(&mut waiter);
            took
        });
    }
    g.finish();
}

fn finish(child: &mut Child) {
    let _ = child.wait();
}

/// An idle `queue work` in another process, woken by a push here.
fn push_to_start(c: &mut Criterion, dir: &Path, stores: &[(&str, String)]) {
    let mut g = c.benchmark_group("push_to_start");
    g.sample_size(10);
    for (name, url) in stores {
        let fifo = dir.join(format!("started-{name}"));
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        // Read and write: opening never blocks, and no end of file between jobs.
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        let mut lines = BufReader::new(reader);
        let script = format!("echo \"$LEASEHOLD_JOB_ID\" > '{}'", fifo.display());
        let mut worker = leasehold(url)
            .args([
                "queue",
                "work",
                "p2s",
                "--lease",
                "30s",
                "--no-schedules",
                "--",
                "sh",
                "-c",
            ])
            .arg(&script)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let client = Client::new(open(url));
        let queue = client.queue("p2s").unwrap();
        timed(&mut g, name, &format!("push_to_start/{name}"), || {
            // Idle: its last job settled, its claims backing off.
            std::thread::sleep(Duration::from_millis(300));
            let start = Instant::now();
            let id = queue.push(&JobSpec::new("x")).unwrap().id;
            let mut line = String::new();
            lines.read_line(&mut line).unwrap();
            let took = start.elapsed();
            assert_eq!(line.trim(), id.to_string(), "the job started");
            took
        });
        // SAFETY: signalling our own child.
        unsafe { libc::kill(worker.id() as libc::pid_t, libc::SIGTERM) };
        let _ = worker.wait();
        let _ = lines.get_mut().flush();
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    let dir = scratch();
    let pg = std::env::var("LEASEHOLD_TEST_PG")
        .ok()
        .filter(|u| !u.is_empty())
        .map(|base| {
            let mut admin = postgres::Client::connect(&base, postgres::NoTls).unwrap();
            admin
                .batch_execute("DROP SCHEMA IF EXISTS lh_bench_latency CASCADE")
                .unwrap();
            let sep = if base.contains('?') { '&' } else { '?' };
            format!("{base}{sep}schema=lh_bench_latency")
        });
    commands(&mut c, &dir, pg.as_deref());
    let mut lease_stores = vec![
        (
            "sqlite",
            format!("sqlite:{}", dir.join("handover.db").display()),
        ),
        (
            "file",
            format!("file:{}", dir.join("handover-leases").display()),
        ),
    ];
    let mut queue_stores = vec![(
        "sqlite",
        format!("sqlite:{}", dir.join("queue.db").display()),
    )];
    if let Some(url) = &pg {
        lease_stores.push(("postgres", url.clone()));
        queue_stores.push(("postgres", url.clone()));
    }
    handover(&mut c, &lease_stores);
    push_to_start(&mut c, &dir, &queue_stores);
    c.final_summary();
    let _ = std::fs::remove_dir_all(&dir);
}
