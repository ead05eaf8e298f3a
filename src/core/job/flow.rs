//! Flow control: what a queue's stored settings allow a claim to start.
//!
//! # State
//! Per queue, a [`QueueConfig`] kept by the store beside its jobs (a row
//! in SQL, an entry in memory): absent means the default, which limits
//! nothing. It is read with the claim's other reads ([`super::Pending`]),
//! so honouring it costs a claim no extra round trip. Per job, its
//! concurrency key ([`JobRecord::key`]) and whether it is *parked*
//! ([`JobRecord::parked`]): ready, but set aside because its key was full.
//!
//! # Transitions
//! - **pause** sets `paused`; **resume** clears it and wakes idle workers
//!   ([`Wake::JobReady`]), so they claim at once rather than at their next
//!   poll. Both are idempotent and answer whether they changed anything.
//! - **limit** ([`set_limits`]) replaces the [`Limits`] (concurrency here;
//!   rates, F4, in `rate`, whose claims follow the same path) and unparks every
//!   parked job of the queue (the next claims park again what is still
//!   blocked), so a raised or cleared limit never strands a job.
//! - **claim under limits** ([`claim_limited`]) takes, in claim order, the
//!   ready jobs that fit: no more than the queue's free slots (and its
//!   rate's free starts), and a job whose key is full (or out of
//!   allowance) is parked instead of taken. Parked jobs leave the
//!   ready index, so a later claim never reads them again: one blocked key
//!   with 10,000 ready jobs costs its claims nothing once they are parked.
//!   A claim parks at most [`PARK_MAX`] jobs (its cost stays bounded); one
//!   that stopped there rings a wake-up so the workers claim again.
//! - **a slot frees** ([`slot_freed`]): a job of a limited queue leaves
//!   running (completed, failed, given back, expired), or an unparked
//!   ready keyed job is cancelled. The best parked job of its key is
//!   unparked, and idle workers are woken where a queue-wide limit may have
//!   held them back.
//!
//! # Invariants
//! - **F1** A claim never makes a queue's running jobs exceed its
//!   `concurrency`, nor the running jobs of one key exceed `per_key`, as of
//!   the store's instant: a claim counts what runs (a claim that ran out
//!   was brought up to date first, so a dead holder's slot is free) and
//!   only starts what fits. A lowered limit starts nothing until the
//!   running jobs are under it; nothing running is stopped. Stores whose
//!   transactions run side by side serialize the claims of a limited queue
//!   ([`JobTxn::lock_queue`]).
//! - No job stays parked while its key has room: a job is parked only while
//!   some job of its key runs, and every slot that frees unparks one; so a
//!   key with parked jobs always has a running job or an unparked ready one.
//! - **F3** (run-time limits; the rules live with the claim and the
//!   heartbeat in `rules`) A job with a timeout is claimed with a deadline,
//!   the claim instant plus the timeout ([`super::Claim::deadline_ms`]);
//!   the claim's lease never reaches past it and no renewal extends it,
//!   so a claim past its deadline cannot be renewed and ends there even if
//!   its worker is gone; its expiry says the job timed out. The worker
//!   machine stops the attempt and fails it before then.
//! - **F2** A claim of a paused queue starts nothing: it still brings the
//!   queue up to date (claims that ran out are retried or dead as ever),
//!   running jobs keep their claims, renew and settle, and pushes are
//!   accepted; only `claim` is refused, and it answers no jobs rather
//!   than an error, so a worker on a paused queue idles as on an empty one
//!   ([`super::next_look`] answers "nothing by time alone": the
//!   worker sleeps until a wake-up or its idle poll).

use super::rate::{Bucket, Rate, QUEUE_BUCKET};
use super::rules::{put, start};
use super::JobRecord;
use crate::core::{check_key, HolderId, JobTxn, Txn, Wake};
use crate::error::{Error, Field, Result};
use std::sync::Arc;

/// The most jobs one claim parks before it answers (with what it took) and
/// leaves the rest to the next claim.
pub const PARK_MAX: usize = 1024;

/// Ready jobs a claim under limits reads at once past its first read: a
/// blocked key's backlog is parked in reads of this many, not one by one.
const PARK_READ: usize = 128;

/// The largest concurrency limit (a queue or a key), far above any fleet.
pub const MAX_LIMIT: u32 = 1_000_000;

/// A queue's concurrency and rate limits ([`set_limits`]); `None` limits
/// nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// At most this many jobs of the queue run at once, fleet-wide.
    pub concurrency: Option<u32>,
    /// At most this many jobs of one concurrency key ([`JobRecord::key`])
    /// run at once; jobs without a key are not limited by it.
    pub per_key: Option<u32>,
    /// At most so many jobs of the queue start per window (F4; see
    /// `rate`).
    pub rate: Option<Rate>,
    /// At most so many jobs of one concurrency key start per window;
    /// jobs without a key are not limited by it.
    pub per_key_rate: Option<Rate>,
}

impl Limits {
    /// No limits.
    pub fn none() -> Limits {
        Limits::default()
    }

    /// These limits with a queue-wide one (`None`: none).
    pub fn with_concurrency(mut self, n: Option<u32>) -> Limits {
        self.concurrency = n;
        self
    }

    /// These limits with a per-key one (`None`: none).
    pub fn with_per_key(mut self, n: Option<u32>) -> Limits {
        self.per_key = n;
        self
    }

    /// These limits with a queue-wide rate (`None`: none).
    pub fn with_rate(mut self, rate: Option<Rate>) -> Limits {
        self.rate = rate;
        self
    }

    /// These limits with a per-key rate (`None`: none).
    pub fn with_per_key_rate(mut self, rate: Option<Rate>) -> Limits {
        self.per_key_rate = rate;
        self
    }

    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.concurrency.is_some()
            || self.per_key.is_some()
            || self.rate.is_some()
            || self.per_key_rate.is_some()
    }

    /// Whether a job's key can hold it back (a per-key limit is set).
    fn keyed(&self) -> bool {
        self.per_key.is_some() || self.per_key_rate.is_some()
    }

    /// Refuse a limit outside 1..=[`MAX_LIMIT`] (0 would be a pause:
    /// [`set_paused`] says so durably and visibly), or a rate outside its
    /// bounds ([`Rate::check`]).
    pub fn check(&self) -> Result<()> {
        for (field, rate) in [
            (Field::Rate, self.rate),
            (Field::PerKeyRate, self.per_key_rate),
        ] {
            rate.map_or(Ok(()), |r| r.check(field))?;
        }
        for (field, n) in [
            (Field::Concurrency, self.concurrency),
            (Field::PerKey, self.per_key),
        ] {
            if let Some(n) = n.filter(|n| *n == 0 || *n > MAX_LIMIT) {
                return Err(Error::invalid(
                    field,
                    format!("{n} is outside 1..={MAX_LIMIT} (to start nothing, pause the queue)"),
                ));
            }
        }
        Ok(())
    }
}

/// A queue's stored flow-control settings ([`set_paused`], [`set_limits`]);
/// the default (what a queue never configured has) limits nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueConfig {
    /// No claim starts a job of this queue (F2) until it is resumed.
    pub paused: bool,
    /// How many of its jobs may run at once (F1).
    pub limits: Limits,
}

/// The stored settings of `queue` (the default if it has none).
pub fn queue_config(tx: &mut dyn Txn, queue: &str) -> Result<QueueConfig> {
    check_key(Field::Queue, queue)?;
    tx.jobs()?.queue_config(queue)
}

/// Pause (`true`) or resume (`false`) `queue`, fleet-wide and durably:
/// while paused, no claim starts one of its jobs (F2); running jobs keep
/// running, and pushes are accepted. Resuming wakes idle workers. Returns
/// whether the queue's state changed (false: it already was so).
pub fn set_paused(tx: &mut dyn Txn, queue: &str, paused: bool) -> Result<bool> {
    check_key(Field::Queue, queue)?;
    let tx = tx.jobs()?;
    let mut config = tx.queue_config(queue)?;
    if config.paused == paused {
        return Ok(false);
    }
    config.paused = paused;
    tx.put_queue_config(queue, &config)?;
    if !paused {
        // Its ready jobs are claimable again: idle workers claim now.
        tx.journal().wake(Wake::JobReady);
    }
    Ok(true)
}

/// Replace `queue`'s concurrency limits (F1), fleet-wide and durably
/// ([`Limits::none`] clears them). Running jobs are never stopped: a
/// lowered limit starts nothing until they are under it. Every parked job
/// of the queue is unparked (the next claims park what is still blocked)
/// and idle workers are woken. Returns whether the limits changed.
pub fn set_limits(tx: &mut dyn Txn, queue: &str, limits: Limits) -> Result<bool> {
    check_key(Field::Queue, queue)?;
    limits.check()?;
    let tx = tx.jobs()?;
    tx.lock_queue(queue, true)?;
    let mut config = tx.queue_config(queue)?;
    if config.limits == limits {
        return Ok(false);
    }
    config.limits = limits;
    tx.put_queue_config(queue, &config)?;
    loop {
        let parked = tx.parked(queue, None, PARK_MAX)?;
        let more = parked.len() >= PARK_MAX;
        for mut job in parked {
            job.parked = false;
            tx.put_job(&job)?;
        }
        if !more {
            break;
        }
    }
    tx.journal().wake(Wake::JobReady);
    Ok(true)
}

/// Claim for `holder` up to `max` of `candidates` (the head of the ready
/// index, in claim order) and of the ready jobs after them, within the
/// queue's `limits` (F1, F4; see the module docs and `rate`), each under a
/// lease until `lease_until_ms`.
pub(super) fn claim_limited(
    tx: &mut dyn JobTxn,
    queue: &str,
    limits: Limits,
    max: usize,
    mut candidates: Vec<JobRecord>,
    holder: HolderId,
    lease_until_ms: u64,
) -> Result<Vec<JobRecord>> {
    tx.lock_queue(queue, true)?;
    let now_ms = tx.now_ms();
    let mut room = max;
    if let Some(n) = limits.concurrency {
        let running = tx.running_count(queue, None)?;
        room = room.min(usize::try_from(u64::from(n).saturating_sub(running)).unwrap_or(0));
    }
    let mut own = None;
    if let Some(rate) = limits.rate {
        let bucket = Bucket::read(tx, queue, Arc::from(QUEUE_BUCKET))?;
        room = room.min(bucket.free(rate, now_ms));
        own = Some(bucket);
    }
    let mut taken = Vec::new();
    // The keys met so far, counting this claim's own starts.
    let mut keys: Vec<KeyRoom> = Vec::new();
    let mut parked = 0;
    while taken.len() < room {
        let mut parked_now = 0;
        for mut job in candidates {
            if taken.len() >= room {
                break;
            }
            if let (true, Some(key)) = (limits.keyed(), job.key.clone()) {
                let at = match keys.iter().position(|k| k.key == key) {
                    Some(at) => at,
                    None => {
                        keys.push(KeyRoom::read(tx, queue, key, &limits)?);
                        keys.len() - 1
                    }
                };
                if !keys[at].admit(&limits, now_ms) {
                    job.parked = true;
                    tx.put_job(&job)?;
                    // Parked until a rate allows it, maybe sooner than
                    // idle workers plan to look (a key that is full
                    // frees by an ending, which wakes them anyway).
                    if limits.per_key_rate.is_some() {
                        tx.journal().wake(Wake::JobReady);
                    }
                    parked_now += 1;
                    continue;
                }
            }
            start(tx, &mut job, holder, lease_until_ms)?;
            taken.push(job);
        }
        parked += parked_now;
        if parked_now == 0 || taken.len() >= room {
            break;
        }
        if parked >= PARK_MAX {
            // Bounded work per claim: the next claim goes on from here,
            // and the workers are told to make it now.
            tx.journal().wake(Wake::JobReady);
            break;
        }
        let want = (room - taken.len()).max(PARK_READ);
        candidates = tx.pending(queue, now_ms, 0, want)?.ready;
        if candidates.is_empty() {
            break;
        }
    }
    if let Some(rate) = limits.per_key_rate {
        for bucket in keys.into_iter().filter_map(|k| k.bucket) {
            bucket.write(tx, queue, rate)?;
        }
    }
    if let (Some(rate), Some(mut bucket)) = (limits.rate, own) {
        bucket.started = taken.len();
        bucket.write(tx, queue, rate)?;
    }
    Ok(taken)
}

/// What one key may still start in a claim: its running jobs (under a
/// per-key concurrency limit) and its rate bucket (under a per-key rate),
/// each counting the claim's own starts.
struct KeyRoom {
    key: Arc<str>,
    running: u64,
    bucket: Option<Bucket>,
}

impl KeyRoom {
    fn read(tx: &mut dyn JobTxn, queue: &str, key: Arc<str>, limits: &Limits) -> Result<KeyRoom> {
        let running = match limits.per_key {
            Some(_) => tx.running_count(queue, Some(&key))?,
            None => 0,
        };
        let bucket = match limits.per_key_rate {
            Some(_) => Some(Bucket::read(tx, queue, key.clone())?),
            None => None,
        };
        Ok(KeyRoom {
            key,
            running,
            bucket,
        })
    }

    /// Whether one more job of the key may start now; counts it if so. A
    /// key out of allowance records when its parked jobs wake.
    fn admit(&mut self, limits: &Limits, now_ms: u64) -> bool {
        let full = limits.per_key.is_some_and(|m| self.running >= u64::from(m));
        let mut spent = false;
        if let (Some(rate), Some(bucket)) = (limits.per_key_rate, &mut self.bucket) {
            spent = bucket.free(rate, now_ms) == 0;
            if spent {
                bucket.blocked(rate, now_ms);
            }
        }
        if full || spent {
            return false;
        }
        self.running += 1;
        if let Some(bucket) = &mut self.bucket {
            bucket.started += 1;
        }
        true
    }
}

/// `job` of a queue with `config` left running (or, unparked and ready,
/// was cancelled): unpark the best parked job of its key, and wake idle
/// workers a queue-wide limit may have held back. Returns the job it
/// unparked (claimable now), if any. Nothing for a queue without limits.
/// A claim (`for_claim`) takes the queue's lock as claims do, so that it
/// never holds it shared and then asks for it whole.
pub(super) fn slot_freed(
    tx: &mut dyn JobTxn,
    job: &JobRecord,
    config: &QueueConfig,
    for_claim: bool,
) -> Result<Option<JobRecord>> {
    let limits = config.limits;
    if limits.concurrency.is_none() && limits.per_key.is_none() {
        // Rates free by time alone (`rate::unpark_due`).
        return Ok(None);
    }
    tx.lock_queue(&job.queue, for_claim)?;
    if limits.concurrency.is_some() {
        tx.journal().wake(Wake::JobReady);
    }
    let (Some(_), Some(key)) = (limits.per_key, &job.key) else {
        return Ok(None);
    };
    let Some(mut next) = tx.parked(&job.queue, Some(key), 1)?.pop() else {
        return Ok(None);
    };
    next.parked = false;
    put(tx, &next)?;
    Ok(Some(next))
}

/// The settings of each queue a batch touches, read once per queue.
#[derive(Default)]
pub(super) struct Configs(Vec<(Arc<str>, QueueConfig)>);

impl Configs {
    /// The settings of `queue`.
    pub(super) fn of(&mut self, tx: &mut dyn JobTxn, queue: &Arc<str>) -> Result<QueueConfig> {
        if let Some((_, c)) = self.0.iter().find(|(q, _)| q == queue) {
            return Ok(c.clone());
        }
        let config = tx.queue_config(queue)?;
        self.0.push((queue.clone(), config.clone()));
        Ok(config)
    }
}
