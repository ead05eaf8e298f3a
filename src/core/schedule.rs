//! Schedules (periodic jobs): a queue's schedules and the rule that turns
//! their ticks into jobs, each tick once, however many workers fire them.
//!
//! # State
//! Per queue and name, a [`ScheduleRecord`]: the [`Rule`] (every `period`,
//! aligned to the Unix epoch, or a cron expression in a time zone), the job
//! template (payload, priority, attempts), what to do with ticks missed
//! while no worker fired ([`Missed`]), and the cursor `next_ms`: the
//! earliest tick not yet handled. Ticks are wall-clock instants (Unix ms,
//! UTC): the caller passes its wall clock in (`wall_ms`); nothing here
//! reads one.
//!
//! # Transitions
//! - **put** (add, or replace by name): a new rule starts its cursor at the
//!   first tick after `wall_ms`; the same rule keeps its cursor (so every
//!   process may register its schedules at startup without resetting them).
//! - **remove**.
//! - **fire** (a worker, at `wall_ms`): every tick in `[next_ms, wall_ms]`
//!   is handled. A tick at most [`ON_TIME_MS`] old is on time: one job
//!   each. Older ticks were missed (no worker fired them in time): with
//!   [`Missed::Skip`] they are dropped; with [`Missed::CatchUp`] they
//!   become one job, keyed by the first tick missed. The cursor moves to
//!   the first tick after `wall_ms`.
//!
//! # Invariants
//! The cursor only moves forward, and in the same transaction as the jobs
//! of the ticks it passes, so each tick is handled once whichever worker
//! fires it and whatever its clock says (a clock that runs ahead fires
//! early, never twice; one that runs behind fires nothing until it passes
//! the cursor). A tick's job carries the unique key `NAME@TICK` (RFC 3339),
//! so a second enqueue of a tick whose job still lives is refused by the
//! queue's own rule too. One fire enqueues at most [`TICKS_MAX`] jobs per
//! schedule (periods are at least a second, so an on-time window holds at
//! most 61 ticks); what is left waits for the next fire.

use super::{check_key, job, Event, JobId, JobSpec, QueuePolicy, Txn, MAX_TTL_MS};
use crate::error::Field;
use crate::error::{Error, Result};
use crate::time::WallMs;
use std::sync::Arc;

/// How late a tick may fire and still count as on time (a minute).
pub const ON_TIME_MS: u64 = 60_000;
/// Shortest period of an `every` schedule (cron's unit, a second, too).
pub const PERIOD_MIN_MS: u64 = 1_000;
/// Most jobs one fire enqueues for one schedule.
pub const TICKS_MAX: usize = 64;
/// The cursor of a schedule that never ticks again (a cron expression
/// whose last occurrence passed): what every store can keep.
pub const NEVER_MS: u64 = i64::MAX as u64;
/// Most schedules a queue may have.
pub const SCHEDULES_MAX: usize = 1_000;

/// When a schedule ticks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Every `period_ms`, at the multiples of it since the Unix epoch
    /// (`every 5m` ticks at :00, :05, ... UTC).
    Every {
        /// The period (at least [`PERIOD_MIN_MS`]).
        period_ms: u64,
    },
    /// A cron expression (5 fields, or 6 with seconds first; croner's
    /// grammar: `0 3 * * *`, `*/15 * * * * *`, `@daily`) in a time zone.
    Cron {
        /// The expression.
        expr: Arc<str>,
        /// An IANA time zone name (`UTC`, `Europe/Paris`).
        tz: Arc<str>,
    },
}

/// What a fire does with ticks that were missed (more than
/// [`ON_TIME_MS`] old when a worker first saw them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Missed {
    /// Drop them: the next job is the next on-time tick's.
    Skip,
    /// One job for all of them, keyed by the first tick missed.
    CatchUp,
}

impl Missed {
    /// Every variant.
    pub const ALL: [Missed; 2] = [Missed::Skip, Missed::CatchUp];

    /// Its name in stores and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Missed::Skip => "skip",
            Missed::CatchUp => "catch-up",
        }
    }

    /// Parse [`Missed::as_str`].
    pub fn parse(text: &str) -> Result<Missed> {
        match text {
            "skip" => Ok(Missed::Skip),
            "catch-up" => Ok(Missed::CatchUp),
            _ => Err(Error::invalid(
                Field::Missed,
                format!("{text:?} is not skip or catch-up"),
            )),
        }
    }
}

/// The stored state of one schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRecord {
    /// The queue its jobs go to.
    pub queue: Arc<str>,
    /// Its name, unique in the queue.
    pub name: Arc<str>,
    /// When it ticks.
    pub rule: Rule,
    /// Each job's payload.
    pub payload: Arc<[u8]>,
    /// Each job's priority.
    pub priority: i32,
    /// Each job's attempts.
    pub max_attempts: u32,
    /// Ticks missed: skipped or caught up.
    pub missed: Missed,
    /// The earliest tick not yet handled (wall clock, Unix ms).
    pub next_ms: u64,
}

/// A schedule to add or replace ([`put`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleSpec {
    /// Its name, unique in the queue.
    pub name: String,
    /// When it ticks.
    pub rule: Rule,
    /// Each job's payload, priority and attempts (delay, `run_at` and
    /// unique key are the schedule's: ignored).
    pub job: JobSpec,
    /// Ticks missed: skipped (the default) or caught up.
    pub missed: Missed,
}

/// What [`put`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// A new schedule.
    Created,
    /// The rule changed: the cursor starts again after now.
    Replaced,
    /// Same rule: the template and policy were updated, the cursor kept.
    Kept,
}

/// What one [`fire`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fired {
    /// Jobs enqueued: (schedule, tick, job, created). `created` is false
    /// when a live job already had the tick's key.
    pub enqueued: Vec<(Arc<str>, u64, JobId, bool)>,
    /// Schedules whose missed ticks were skipped, with the first one.
    pub skipped: Vec<(Arc<str>, u64)>,
    /// The earliest tick of any of the queue's schedules still to come
    /// (wall clock): when to fire next. `None`: the queue has none.
    pub next_ms: Option<u64>,
}

/// What happened to a tick, for traces and metrics ([`Event::Tick`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub enum TickChange {
    /// It became this job.
    Enqueued {
        /// The job.
        id: JobId,
        /// The job carries the missed ticks before it too (catch-up).
        catch_up: bool,
    },
    /// It was missed and skipped (with any missed after it).
    Skipped,
}

impl TickChange {
    /// Its name in traces and metrics.
    pub fn name(self) -> &'static str {
        match self {
            TickChange::Enqueued {
                catch_up: false, ..
            } => "enqueued",
            TickChange::Enqueued { catch_up: true, .. } => "caught_up",
            TickChange::Skipped => "skipped",
        }
    }
}

/// A rule ready to compute ticks (a cron expression parsed, its zone found).
enum Ticker {
    Every(u64),
    Cron(Box<croner::Cron>, jiff::tz::TimeZone),
}

impl Rule {
    /// `every 5m`-style rule of `period_ms`.
    pub fn every(period_ms: u64) -> Rule {
        Rule::Every { period_ms }
    }

    /// A cron rule, checked.
    pub fn cron(expr: &str, tz: &str) -> Result<Rule> {
        let rule = Rule::Cron {
            expr: Arc::from(expr.trim()),
            tz: Arc::from(tz.trim()),
        };
        rule.ticker()?;
        Ok(rule)
    }

    fn ticker(&self) -> Result<Ticker> {
        match self {
            Rule::Every { period_ms } => {
                if *period_ms < PERIOD_MIN_MS || *period_ms > MAX_TTL_MS {
                    return Err(Error::invalid(
                        Field::Every,
                        format!(
                            "{period_ms} ms is outside {PERIOD_MIN_MS}..={MAX_TTL_MS} ms (a second to a year)"
                        ),
                    ));
                }
                Ok(Ticker::Every(*period_ms))
            }
            Rule::Cron { expr, tz } => {
                // croner's default parser takes five fields, six with
                // seconds first, or seven with a year last (the
                // conformance suite's schedule cases pin each).
                let cron = croner::parser::CronParser::default()
                    .parse(expr)
                    .map_err(|e| Error::invalid(Field::Cron, format!("{expr:?}: {e}")))?;
                let zone = jiff::tz::TimeZone::get(tz).map_err(|e| {
                    Error::invalid(Field::Tz, format!("{tz:?} is not a known time zone ({e})"))
                })?;
                Ok(Ticker::Cron(Box::new(cron), zone))
            }
        }
    }

    /// The rule as stores keep it: `every MS` or `cron TZ EXPR`.
    pub fn encode(&self) -> String {
        match self {
            Rule::Every { period_ms } => format!("every {period_ms}"),
            Rule::Cron { expr, tz } => format!("cron {tz} {expr}"),
        }
    }

    /// Read [`Rule::encode`]'s text back (checked as [`Rule::cron`]).
    pub fn decode(text: &str) -> Result<Rule> {
        let bad = || {
            Error::invalid(
                Field::Rule,
                format!("{text:?} is not `every MS` or `cron TZ EXPR`"),
            )
        };
        match text.split_once(' ') {
            Some(("every", ms)) => ms.parse().map(Rule::every).map_err(|_| bad()),
            Some(("cron", rest)) => {
                let (tz, expr) = rest.split_once(' ').ok_or_else(bad)?;
                Rule::cron(expr, tz)
            }
            _ => Err(bad()),
        }
    }

    /// The first tick at or after `from_ms` (`None`: never again).
    pub fn next_at_or_after(&self, from_ms: u64) -> Result<Option<u64>> {
        Ok(self.ticker()?.next(from_ms))
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Every { period_ms } => write!(f, "every {period_ms} ms"),
            Rule::Cron { expr, tz } => write!(f, "cron {expr:?} in {tz}"),
        }
    }
}

impl Ticker {
    /// The first tick at or after `from_ms`.
    fn next(&self, from_ms: u64) -> Option<u64> {
        match self {
            Ticker::Every(period) => from_ms.div_ceil(*period).checked_mul(*period),
            Ticker::Cron(cron, zone) => {
                // Cron counts whole seconds: start at the first at or after.
                let secs = i64::try_from(from_ms.div_ceil(1_000)).ok()?;
                let at = jiff::Timestamp::from_second(secs).ok()?;
                let next = cron
                    .find_next_occurrence(&at.to_zoned(zone.clone()), true)
                    .ok()?;
                u64::try_from(next.timestamp().as_millisecond()).ok()
            }
        }
    }
}

/// A tick as people read it: RFC 3339, UTC.
#[doc(hidden)]
pub fn tick_text(tick_ms: u64) -> String {
    i64::try_from(tick_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(|| tick_ms.to_string(), |t| t.to_string())
}

/// The unique key of `name`'s job for `tick_ms`.
#[doc(hidden)]
pub fn tick_key(name: &str, tick_ms: u64) -> String {
    format!("{name}@{}", tick_text(tick_ms))
}

fn check_spec(queue: &str, spec: &ScheduleSpec) -> Result<()> {
    check_key(Field::Queue, queue)?;
    check_key(Field::Schedule, &spec.name)?;
    // The template's unique key is not the schedule's (each tick's job is
    // keyed by its tick): it is not checked either. Its delay and run_at
    // are ignored too, and the job check reads neither.
    let probe = JobSpec {
        unique_key: None,
        ..spec.job.clone()
    };
    job::check_spec(&probe)
}

/// Add the schedule `spec` to `queue`, or replace the one of the same name
/// (see the module docs: the same rule keeps its cursor). `wall` is the
/// caller's wall clock.
pub fn put(tx: &mut dyn Txn, queue: &str, spec: &ScheduleSpec, wall: WallMs) -> Result<PutOutcome> {
    let wall_ms = wall.ms();
    check_spec(queue, spec)?;
    let ticker = spec.rule.ticker()?;
    let tx = tx.jobs()?;
    let existing = tx.schedules(queue)?;
    let old = existing.iter().find(|s| *s.name == *spec.name);
    if old.is_none() && existing.len() >= SCHEDULES_MAX {
        return Err(Error::invalid(
            Field::Schedule,
            format!("queue {queue:?} has {SCHEDULES_MAX} schedules already"),
        ));
    }
    let (next_ms, outcome) = match old {
        Some(s) if s.rule == spec.rule => (s.next_ms, PutOutcome::Kept),
        _ => {
            let first = ticker
                .next(wall_ms.saturating_add(1))
                .filter(|t| *t < NEVER_MS);
            let first = first.ok_or_else(|| {
                let field = match spec.rule {
                    Rule::Every { .. } => Field::Every,
                    Rule::Cron { .. } => Field::Cron,
                };
                Error::invalid(field, format!("{} never ticks after now", spec.rule))
            })?;
            let outcome = if old.is_some() {
                PutOutcome::Replaced
            } else {
                PutOutcome::Created
            };
            (first, outcome)
        }
    };
    tx.put_schedule(&ScheduleRecord {
        queue: Arc::from(queue),
        name: Arc::from(spec.name.as_str()),
        rule: spec.rule.clone(),
        payload: Arc::from(spec.job.payload.as_slice()),
        priority: spec.job.priority,
        max_attempts: spec.job.max_attempts,
        missed: spec.missed,
        next_ms,
    })?;
    // Idle workers fire it at its first tick rather than at their next
    // look ([`crate::core::Wake::JobReady`]).
    tx.journal().wake(crate::core::Wake::JobReady);
    Ok(outcome)
}

/// Remove `queue`'s schedule `name`; an error naming it if there is none.
/// Jobs it enqueued stay.
pub fn remove(tx: &mut dyn Txn, queue: &str, name: &str) -> Result<()> {
    check_key(Field::Queue, queue)?;
    check_key(Field::Schedule, name)?;
    if tx.jobs()?.delete_schedule(queue, name)? {
        Ok(())
    } else {
        Err(Error::invalid(
            Field::Schedule,
            format!("queue {queue:?} has no schedule {name:?}"),
        ))
    }
}

/// The schedules of `queue`, by name.
pub fn list(tx: &mut dyn Txn, queue: &str) -> Result<Vec<ScheduleRecord>> {
    check_key(Field::Queue, queue)?;
    tx.jobs()?.schedules(queue)
}

/// Turn every due tick of `queue`'s schedules into jobs, as of the
/// caller's wall clock `wall` (see the module docs).
pub fn fire(tx: &mut dyn Txn, queue: &str, wall: WallMs, policy: &QueuePolicy) -> Result<Fired> {
    let wall_ms = wall.ms();
    check_key(Field::Queue, queue)?;
    let schedules = tx.jobs()?.schedules(queue)?;
    let mut fired = Fired::default();
    for mut s in schedules {
        if s.next_ms <= wall_ms {
            fire_one(tx, &mut s, wall_ms, policy, &mut fired)?;
            tx.jobs()?.put_schedule(&s)?;
        }
        if s.next_ms < NEVER_MS {
            fired.next_ms = Some(fired.next_ms.map_or(s.next_ms, |n| n.min(s.next_ms)));
        }
    }
    Ok(fired)
}

/// Handle `s`'s ticks up to `wall_ms` and move its cursor past them.
fn fire_one(
    tx: &mut dyn Txn,
    s: &mut ScheduleRecord,
    wall_ms: u64,
    policy: &QueuePolicy,
    fired: &mut Fired,
) -> Result<()> {
    let ticker = s.rule.ticker().map_err(|e| {
        Error::store(
            format!("firing schedule {:?} of queue {:?}", s.name, s.queue),
            format!("its stored rule is unusable: {e}"),
        )
    })?;
    let on_time_from = wall_ms.saturating_sub(ON_TIME_MS);
    let mut tick = Some(s.next_ms);
    if s.next_ms < on_time_from {
        match s.missed {
            Missed::CatchUp => enqueue(tx, s, s.next_ms, true, policy, fired)?,
            Missed::Skip => {
                note(tx, s, s.next_ms, TickChange::Skipped);
                fired.skipped.push((s.name.clone(), s.next_ms));
            }
        }
        tick = ticker.next(on_time_from);
    }
    for _ in 0..TICKS_MAX {
        match tick {
            Some(t) if t <= wall_ms => {
                enqueue(tx, s, t, false, policy, fired)?;
                tick = ticker.next(t.saturating_add(1));
            }
            _ => break,
        }
    }
    let next = tick.unwrap_or(NEVER_MS).min(NEVER_MS);
    debug_assert!(next >= s.next_ms, "the cursor only moves forward");
    s.next_ms = next.max(s.next_ms);
    Ok(())
}

fn enqueue(
    tx: &mut dyn Txn,
    s: &ScheduleRecord,
    tick_ms: u64,
    catch_up: bool,
    policy: &QueuePolicy,
    fired: &mut Fired,
) -> Result<()> {
    let spec = JobSpec {
        payload: s.payload.to_vec(),
        priority: s.priority,
        max_attempts: s.max_attempts,
        unique_key: Some(tick_key(&s.name, tick_ms)),
        ..JobSpec::default()
    };
    let out = job::enqueue(tx, &s.queue, &spec, policy)?;
    if out.created {
        note(
            tx,
            s,
            tick_ms,
            TickChange::Enqueued {
                id: out.id,
                catch_up,
            },
        );
    }
    fired
        .enqueued
        .push((s.name.clone(), tick_ms, out.id, out.created));
    Ok(())
}

fn note(tx: &mut dyn Txn, s: &ScheduleRecord, tick_ms: u64, change: TickChange) {
    let journal = tx.journal();
    if journal.is_recording() {
        journal.note(Event::Tick {
            queue: s.queue.clone(),
            schedule: s.name.clone(),
            tick_ms,
            change,
        });
    }
}
