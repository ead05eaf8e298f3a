//! `leasehold migrate`: move a store's contents to another store, live
//! (the design: `leasehold::migrate`).

use crate::{CliResult, Fail, EXIT_USAGE};
use clap::Args;
use leasehold::migrate::{migrate, MigrateOptions, MigrateReport};
use serde_json::json;

#[derive(Args)]
pub struct MigrateArgs {
    /// The store to move (default: --store).
    #[arg(long)]
    from: Option<String>,
    /// The empty store to move it to (sqlite:PATH or postgres://...).
    #[arg(long)]
    to: String,
    /// Count what would move; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Records copied per transaction.
    #[arg(long, default_value_t = 500)]
    chunk: usize,
}

/// Run the migration and print what it moved (one JSON object).
pub fn run(store: &str, args: MigrateArgs) -> CliResult {
    let from = args.from.as_deref().unwrap_or(store);
    for url in [from, args.to.as_str()] {
        if url.starts_with("mem:") || url.starts_with("file:") {
            return Err(Fail::new(
                EXIT_USAGE,
                format!("{url}: `leasehold migrate` moves sqlite: and postgres:// stores"),
            ));
        }
    }
    let opts = MigrateOptions {
        dry_run: args.dry_run,
        chunk: args.chunk,
    };
    let report = migrate(from, &args.to, &opts)?;
    crate::out::emit(&report_json(&report))?;
    Ok(0)
}

fn report_json(r: &MigrateReport) -> serde_json::Value {
    let outcome = if r.dry_run {
        "dry-run"
    } else if r.already_done {
        "already-moved"
    } else if r.resumed {
        "resumed"
    } else {
        "moved"
    };
    json!({
        "outcome": outcome,
        "from": r.from,
        "to": r.to,
        "leases": r.leases,
        "held_leases": r.held_leases,
        "queues": r.queues,
        "jobs": r.jobs,
        "running_jobs": r.running_jobs,
        "links": r.links,
        "schedules": r.schedules,
        "settings": r.settings,
        "rate_buckets": r.rate_buckets,
        "last_job_id": r.last_job_id,
        "max_token": r.max_token,
        "shift_ms": r.shift_ms,
    })
}
