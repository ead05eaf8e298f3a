//! Running many seeds, hunting canaries, and shrinking a failing plan.

use crate::oracle::Violation;
use crate::plan::{Canary, Plan, Scenario};
use crate::world::{self, RunResult, StoreFactory};

/// One failing seed.
#[derive(Debug)]
pub struct Failure {
    /// The plan that failed.
    pub plan: Plan,
    /// What broke.
    pub violation: Violation,
    /// Its trace.
    pub result: RunResult,
}

impl Failure {
    /// The command that replays it.
    pub fn replay_command(&self) -> String {
        let mut cmd = format!(
            "cargo run --release -p leasehold-sim -- --scenario {} --seed {}",
            self.plan.scenario.name(),
            self.plan.seed
        );
        if let Some(c) = self.plan.canary {
            cmd += &format!(" --canary {}", c.name());
        }
        cmd + " --trace"
    }
}

/// What a batch of seeds did.
#[derive(Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: u64,
    /// Events processed.
    pub events: u64,
    /// Failing seeds.
    pub failures: Vec<Failure>,
}

/// Run seeds `first..first + count` of `scenario` on the store `make` builds,
/// calling `progress` after each.
pub fn run_seeds(
    scenario: Scenario,
    first: u64,
    count: u64,
    make: &StoreFactory,
    mut progress: impl FnMut(u64),
) -> Summary {
    let mut summary = Summary::default();
    for seed in first..first + count {
        let plan = Plan::generate(seed, scenario, None);
        let result = world::run_with(&plan, make);
        summary.seeds += 1;
        summary.events += result.events;
        if let Some(violation) = result.violation.clone() {
            summary.failures.push(Failure {
                plan,
                violation,
                result,
            });
        }
        progress(seed);
    }
    summary
}

/// Run seeds `first..first + count` of every scenario in `scenarios` on
/// `jobs` threads (each run is independent and single-threaded, so the
/// trace of a seed does not depend on `jobs`), calling `progress` after
/// each run. Failures come back ordered by scenario, then seed.
pub fn run_seeds_parallel(
    scenarios: &[Scenario],
    first: u64,
    count: u64,
    jobs: usize,
    make: &StoreFactory,
    progress: &(dyn Fn() + Sync),
) -> Summary {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    let total = count.saturating_mul(scenarios.len() as u64);
    let next = AtomicU64::new(0);
    let merged = Mutex::new(Summary::default());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                let mut mine = Summary::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let scenario = scenarios[(i / count) as usize];
                    let part = run_seeds(scenario, first + i % count, 1, make, |_| {});
                    mine.seeds += part.seeds;
                    mine.events += part.events;
                    mine.failures.extend(part.failures);
                    progress();
                }
                let mut all = merged.lock().unwrap_or_else(|p| p.into_inner());
                all.seeds += mine.seeds;
                all.events += mine.events;
                all.failures.extend(mine.failures);
            });
        }
    });
    let mut summary = merged.into_inner().unwrap_or_else(|p| p.into_inner());
    summary
        .failures
        .sort_by_key(|f| (f.plan.scenario as u8, f.plan.seed));
    summary
}

/// Search seeds `0..max_seeds` for one where `canary` is caught; returns
/// the seed and the violation.
pub fn hunt_canary(canary: Canary, max_seeds: u64) -> Option<(u64, Violation)> {
    (0..max_seeds).find_map(|seed| {
        let plan = Plan::generate(seed, canary.scenario(), Some(canary));
        world::run(&plan).violation.map(|v| (seed, v))
    })
}

/// Shrink a failing plan: delete faults one at a time, then shorten the
/// run, keeping each change that still breaks the same guarantee.
pub fn shrink(plan: &Plan, guarantee: &str, make: &StoreFactory) -> (Plan, RunResult) {
    let fails = |p: &Plan| {
        let r = world::run_with(p, make);
        let same = r
            .violation
            .as_ref()
            .is_some_and(|v| v.guarantee == guarantee);
        (same, r)
    };
    let mut best = plan.clone();
    let mut best_result = world::run_with(&best, make);
    let mut i = best.faults.len();
    while i > 0 {
        i -= 1;
        let mut candidate = best.clone();
        candidate.faults.remove(i);
        let (same, r) = fails(&candidate);
        if same {
            best = candidate;
            best_result = r;
        }
    }
    loop {
        let mut candidate = best.clone();
        candidate.duration_ms /= 2;
        candidate
            .faults
            .retain(|&(at, _)| at < candidate.duration_ms);
        if candidate.duration_ms < 50 {
            break;
        }
        let (same, r) = fails(&candidate);
        if !same {
            break;
        }
        best = candidate;
        best_result = r;
    }
    (best, best_result)
}
