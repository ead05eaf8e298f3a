//! `leasehold queue schedule add|list|remove`: a queue's schedules
//! (periodic jobs), kept in the store; `queue work` fires them, one job
//! per tick however many workers run.

use crate::defaults;
use crate::out::{emit, parse_duration};
use crate::{CliResult, Fail, EXIT_USAGE};
use clap::Subcommand;
use leasehold::core::schedule::{tick_text, PutOutcome, NEVER_MS};
use leasehold::core::{Missed, Rule, ScheduleRecord, ScheduleSpec};
use leasehold::{Client, JobSpec};
use serde_json::{json, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Subcommand)]
pub enum ScheduleCmd {
    /// Add a schedule, or replace the one of the same name (the same rule
    /// keeps its next tick).
    Add {
        queue: String,
        name: String,
        #[arg(long, help = defaults::EVERY_HELP.as_str(), value_parser = parse_duration, required_unless_present = "cron", conflicts_with = "cron")]
        every: Option<Duration>,
        /// Tick on a cron expression: 5 fields, or 6 with seconds first
        /// ("0 3 * * *", "*/15 * * * * *", "@daily").
        #[arg(long)]
        cron: Option<String>,
        /// The cron expression's time zone (IANA name).
        #[arg(long, default_value = "UTC", requires = "cron")]
        tz: String,
        /// Each job's payload.
        #[arg(long, default_value = "")]
        payload: String,
        #[arg(long, default_value_t = defaults::priority(), allow_negative_numbers = true)]
        priority: i32,
        #[arg(long, default_value_t = defaults::max_attempts(), value_parser = clap::value_parser!(u32).range(defaults::attempts_range()))]
        max_attempts: u32,
        #[arg(long, help = defaults::MISSED_HELP.as_str(), default_value = defaults::missed(), value_parser = defaults::missed_choices())]
        missed: String,
    },
    /// The queue's schedules, one JSON line each.
    List { queue: String },
    /// Remove a schedule (the jobs it made stay).
    Remove { queue: String, name: String },
}

fn wall_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, crate::out::ms)
}

fn schedule_json(s: &ScheduleRecord, now_ms: u64) -> Value {
    let (rule, tz) = match &s.rule {
        Rule::Every { period_ms } => (
            format!(
                "every {}",
                humantime::format_duration(Duration::from_millis(*period_ms))
            ),
            None,
        ),
        Rule::Cron { expr, tz } => (format!("cron {expr}"), Some(tz.to_string())),
    };
    let never = s.next_ms >= NEVER_MS;
    json!({
        "queue": &*s.queue,
        "name": &*s.name,
        "rule": rule,
        "tz": tz,
        "missed": s.missed.as_str(),
        "priority": s.priority,
        "max_attempts": s.max_attempts,
        "payload_bytes": s.payload.len(),
        "next_at": (!never).then(|| tick_text(s.next_ms)),
        "next_in_ms": (!never).then(|| s.next_ms.saturating_sub(now_ms)),
    })
}

pub fn schedule(client: &Client, cmd: ScheduleCmd) -> CliResult {
    match cmd {
        ScheduleCmd::Add {
            queue,
            name,
            every,
            cron,
            tz,
            payload,
            priority,
            max_attempts,
            missed,
        } => {
            let rule = match (every, cron) {
                (Some(every), _) => Rule::every(crate::out::ms(every)),
                (None, Some(expr)) => Rule::cron(&expr, &tz)?,
                (None, None) => {
                    return Err(Fail::new(
                        EXIT_USAGE,
                        "give --every DUR or --cron EXPR".into(),
                    ))
                }
            };
            let spec = ScheduleSpec {
                name: name.clone(),
                rule,
                job: JobSpec {
                    priority,
                    max_attempts,
                    ..JobSpec::new(payload)
                },
                missed: Missed::parse(&missed)?,
            };
            let q = client.queue(&queue)?;
            let outcome = q.schedule(&spec)?;
            let now = wall_now_ms();
            let mut line = q
                .schedules()?
                .iter()
                .find(|s| *s.name == *name)
                .map_or_else(
                    || json!({"queue": queue, "name": name}),
                    |s| schedule_json(s, now),
                );
            line["outcome"] = json!(match outcome {
                PutOutcome::Created => "created",
                PutOutcome::Replaced => "replaced",
                PutOutcome::Kept => "kept",
            });
            emit(&line)?;
        }
        ScheduleCmd::List { queue } => {
            let now = wall_now_ms();
            for s in client.queue(&queue)?.schedules()? {
                emit(&schedule_json(&s, now))?;
            }
        }
        ScheduleCmd::Remove { queue, name } => {
            client.queue(&queue)?.unschedule(&name)?;
            emit(&json!({"queue": queue, "name": name, "removed": true}))?;
        }
    }
    Ok(0)
}
