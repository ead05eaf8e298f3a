//! `leasehold-sim [--scenario NAME|all] [--seed S | --seeds N [--seed-start S]
//! [--jobs N]] [--trace] [--shrink] [--canary NAME|all]`
//!
//! Many seeds run on `--jobs` threads (default: every core), from
//! `--seed-start`; a terminal gets a progress line, and the run ends with
//! one summary line (seeds, violations, events, events/s, seeds/s).
//!
//! Exit codes: 0 when every seed held every guarantee (or every selected
//! canary was caught), 1 on a violation (or a canary that slipped through),
//! 2 on a usage error.

#![allow(clippy::disallowed_methods)] // the runner measures real time for events/s

use leasehold_sim::plan::{Canary, Plan, Scenario};
use leasehold_sim::runner::{self, Failure};
use leasehold_sim::world;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "usage: leasehold-sim [--scenario NAME|all] [--seed S | --seeds N [--seed-start S] [--jobs N]] [--store mem|sqlite|file] [--trace] [--shrink] [--canary NAME|all]
(--canary NAME --seed S replays that canary's run of seed S; --trace prints it)
the file store keeps leases only: use it with --scenario leases, clock-chaos or election";

fn usage() -> String {
    let names = |all: Vec<&str>| all.join(", ");
    format!(
        "{USAGE}\nscenarios: {}\ncanaries:  {}",
        names(Scenario::ALL.iter().map(|s| s.name()).collect()),
        names(Canary::ALL.iter().map(|c| c.name()).collect()),
    )
}

struct Args {
    scenarios: Vec<Scenario>,
    seed: Option<u64>,
    seeds: u64,
    seed_start: u64,
    jobs: usize,
    trace: bool,
    shrink: bool,
    canaries: Vec<Canary>,
    store: &'static str,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        scenarios: Scenario::ALL.to_vec(),
        seed: None,
        seeds: 100,
        seed_start: 0,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        trace: false,
        shrink: false,
        canaries: Vec::new(),
        store: "mem",
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--scenario" => {
                let v = value("--scenario")?;
                args.scenarios = if v == "all" {
                    Scenario::ALL.to_vec()
                } else {
                    vec![Scenario::parse(&v).ok_or_else(|| format!("unknown scenario {v:?}"))?]
                };
            }
            "--seed" => args.seed = Some(number("--seed", &value("--seed")?)?),
            "--seeds" => args.seeds = number("--seeds", &value("--seeds")?)?,
            "--seed-start" => args.seed_start = number("--seed-start", &value("--seed-start")?)?,
            "--jobs" => {
                args.jobs = number("--jobs", &value("--jobs")?)?;
                if args.jobs == 0 {
                    return Err("--jobs 0 is not a positive number".into());
                }
            }
            "--store" => {
                args.store = match value("--store")?.as_str() {
                    "mem" => "mem",
                    "sqlite" => "sqlite",
                    "file" => "file",
                    other => return Err(format!("unknown store {other:?} (mem, sqlite or file)")),
                };
            }
            "--trace" => args.trace = true,
            "--shrink" => args.shrink = true,
            "--canary" => {
                let v = value("--canary")?;
                args.canaries = if v == "all" {
                    Canary::ALL.to_vec()
                } else {
                    vec![Canary::parse(&v).ok_or_else(|| format!("unknown canary {v:?}"))?]
                };
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{flag} {text:?} is not a number"))
}

fn store_of(name: &str) -> &'static world::StoreFactory {
    match name {
        "sqlite" => &world::sqlite_store,
        "file" => &world::file_store,
        _ => &world::mem_store,
    }
}

fn report(f: &Failure, shrink: bool, make: &world::StoreFactory) {
    eprintln!();
    println!(
        "VIOLATION seed {} scenario {}: {}",
        f.plan.seed,
        f.plan.scenario.name(),
        f.violation
    );
    let tail: Vec<String> = f
        .result
        .trace
        .iter()
        .rev()
        .take(25)
        .rev()
        .map(|(t, l)| format!("  t={t:>8} {l}"))
        .collect();
    println!("last trace lines:\n{}", tail.join("\n"));
    println!("replay: {}", f.replay_command());
    if shrink {
        let (small, result) = runner::shrink(&f.plan, f.violation.guarantee, make);
        println!(
            "shrunk to {} faults over {} ms: {:?}",
            small.faults.len(),
            small.duration_ms,
            small.faults
        );
        print!("{}", result.trace_text());
    }
}

fn run_canaries(canaries: &[Canary], shrink: bool) -> ExitCode {
    let mut missed = 0;
    for &c in canaries {
        match runner::hunt_canary(c, 200) {
            Some((seed, v)) => {
                println!("canary {} caught at seed {seed}: {v}", c.name());
                if shrink {
                    let plan = Plan::generate(seed, c.scenario(), Some(c));
                    let (small, result) = runner::shrink(&plan, v.guarantee, &world::mem_store);
                    println!(
                        "shrunk to {} faults over {} ms (from {} over {} ms): {:?}",
                        small.faults.len(),
                        small.duration_ms,
                        plan.faults.len(),
                        plan.duration_ms,
                        small.faults
                    );
                    print!("{}", result.trace_text());
                }
            }
            None => {
                missed += 1;
                println!("canary {} NOT caught in 200 seeds", c.name());
            }
        }
    }
    if missed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("{}", usage());
            return ExitCode::from(2);
        }
    };
    if !args.canaries.is_empty() && args.seed.is_none() {
        return run_canaries(&args.canaries, args.shrink);
    }
    if let Some(seed) = args.seed {
        return run_seed(&args, seed);
    }
    run_many(&args)
}

/// Every scenario of `--seed S`, its trace on `--trace`.
fn run_seed(args: &Args, seed: u64) -> ExitCode {
    let mut status = ExitCode::SUCCESS;
    // A canary replays in its own scenario.
    let runs: Vec<(Scenario, Option<Canary>)> = if args.canaries.is_empty() {
        args.scenarios.iter().map(|&s| (s, None)).collect()
    } else {
        args.canaries
            .iter()
            .map(|&c| (c.scenario(), Some(c)))
            .collect()
    };
    for (scenario, canary) in runs {
        let plan = Plan::generate(seed, scenario, canary);
        let result = world::run_with(&plan, store_of(args.store));
        if args.trace {
            print!("{}", result.trace_text());
        }
        match result.violation.clone() {
            Some(violation) => {
                let failure = Failure {
                    plan,
                    violation,
                    result,
                };
                report(&failure, args.shrink, store_of(args.store));
                status = ExitCode::FAILURE;
            }
            None => println!(
                "seed {seed} scenario {}: ok ({} events)",
                scenario.name(),
                result.events
            ),
        }
    }
    status
}

/// `--seeds N` on `--jobs` threads, with a progress bar on a terminal and
/// one summary line.
fn run_many(args: &Args) -> ExitCode {
    let total = args.seeds * args.scenarios.len() as u64;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(total);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} runs  {per_sec}  ETA {eta}",
        ) {
            bar.set_style(style);
        }
        bar
    });
    let start = Instant::now();
    let tick = || {
        if let Some(bar) = &bar {
            bar.inc(1);
        }
    };
    let summary = runner::run_seeds_parallel(
        &args.scenarios,
        args.seed_start,
        args.seeds,
        args.jobs,
        store_of(args.store),
        &tick,
    );
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    for f in &summary.failures {
        report(f, args.shrink, store_of(args.store));
    }
    let (seeds, events) = (summary.seeds, summary.events);
    let violations = summary.failures.len() as u64;
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    println!(
        "runs: {seeds} ({} seeds from {} x {} scenarios), violations: {violations}, events: {events}, events/s: {:.0}, runs/s: {:.1}, jobs: {}",
        args.seeds,
        args.seed_start,
        args.scenarios.len(),
        events as f64 / secs,
        seeds as f64 / secs,
        args.jobs,
    );
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
