//! `leasehold migrate`: move a store's whole contents to another store
//! (SQLite → PostgreSQL, and back), live, resumable, and without ever
//! handing out a token twice.
//!
//! # Design
//! The source is frozen at one instant (the cut-over) and copied after it,
//! so what is copied is final; the target refuses work until the copy is
//! complete, so nothing on it runs from a half-copied state. Both are done
//! with the migration marks (`store::marks`):
//!
//! 1. The target is marked `moving_from` (its ordinary transactions fail,
//!    transiently: its workers wait).
//! 2. The cut-over: the source is marked `moved_to`. Every later
//!    transaction on it, and every open, fails with [`Error::Moved`]
//!    naming the target. A transaction that began before the mark ends
//!    before the copy begins (SQLite: the write lock; PostgreSQL: the
//!    mark's writer waits for every transaction of the database that began
//!    before its commit, at no cost to the transactions themselves).
//! 3. The copy, in chunks, each an upsert: every lease record (held or
//!    not), queue setting, schedule with its cursor, rate bucket, job in
//!    every state (attempts, errors, results, unique keys, progress) and
//!    dependency link; then the target's job ids move above the last one.
//! 4. The target's mark is removed: it is the store from now on.
//!
//! Interrupted anywhere, a second run finds the marks and goes on (a
//! chunk copied twice is the same upsert); a run after the end says so
//! and changes nothing.
//!
//! # What it keeps
//! - **Tokens continue.** Lease records are never deleted (L2), so every
//!   key ever granted has its record, copied with its `last_token`; every
//!   job keeps its own. The next grant of a key, or claim of a job, on the
//!   target is above every token the source granted it: a holder still
//!   writing with a source token is fenced off by the first target grant.
//! - **Claims and leases are handed over.** A job running at the cut-over
//!   is copied running, under the same holder, token and deadline; so is
//!   a held lease. Its holder cannot renew (the source refuses it), so it
//!   stops by its local deadline (L3), before the claim runs out on the
//!   target; then the target's workers retry the job (a new token) and the
//!   key can be acquired again (a new token). No job runs twice at once
//!   and none is lost; an attempt cut short is retried, as after a crash.
//! - **Time.** Store clocks differ between stores (SQLite counts from the
//!   machine's boot, PostgreSQL reads the server's wall clock), so every
//!   store instant (run at, created, finished, lease ends, rate windows)
//!   moves by the difference of the two clocks read after the cut-over:
//!   what had 10 s left on the source has 10 s left on the target, a
//!   little more rather than less. Schedule cursors are wall-clock time
//!   already and stay. An instant that would fall before the target's
//!   clock began (old history moved to a young SQLite store) becomes its
//!   first instant.
//! - **A source's token floor** (a PostgreSQL store fenced after a
//!   failover) is kept: every copied `last_token` is raised to it, so the
//!   target grants above it too. Job ids continue above every id the
//!   source handed out.

use crate::core::{Exported, JobId, JobRecord, LeaseRecord, QueueConfig, RateLog};
use crate::error::{Error, Field, Result};
use crate::store::{open_url_as, Marks, Store, StoreExt};

/// How [`migrate`] runs.
#[derive(Debug, Clone)]
pub struct MigrateOptions {
    /// Count what would move and change nothing.
    pub dry_run: bool,
    /// Records copied per transaction.
    pub chunk: usize,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            dry_run: false,
            chunk: 500,
        }
    }
}

/// What a migration moved (or, dry, would move).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrateReport {
    /// The source, as named in the target's mark.
    pub from: String,
    /// The target, as named in the source's mark (what its users are told).
    pub to: String,
    /// Lease records (keys ever granted).
    pub leases: u64,
    /// Of them, those with a live holder at the cut-over (handed over).
    pub held_leases: u64,
    /// Queues with jobs, settings, schedules or rate buckets.
    pub queues: u64,
    /// Jobs, in every state.
    pub jobs: u64,
    /// Of them, those running at the cut-over (claims handed over).
    pub running_jobs: u64,
    /// Dependency links of waiting jobs.
    pub links: u64,
    /// Schedules, with their cursors.
    pub schedules: u64,
    /// Queue settings that differ from the defaults.
    pub settings: u64,
    /// Rate buckets.
    pub rate_buckets: u64,
    /// The highest job id the source handed out (copied, or purged
    /// since): the target hands out ids above it.
    pub last_job_id: u64,
    /// The highest token the source had granted (a key's or a job's).
    pub max_token: u64,
    /// Target clock minus source clock, added to every instant (ms).
    pub shift_ms: i64,
    /// An earlier, interrupted run was carried on.
    pub resumed: bool,
    /// The migration had already completed: nothing was done.
    pub already_done: bool,
    /// Nothing was changed (`dry_run`).
    pub dry_run: bool,
}

/// Move everything in the store at `from` to the store at `to` (see the
/// [module docs](self)); `to` must be empty, or the target of this same
/// migration interrupted earlier.
pub fn migrate(from: &str, to: &str, opts: &MigrateOptions) -> Result<MigrateReport> {
    if opts.chunk == 0 {
        return Err(Error::invalid(
            Field::Limit,
            "the chunk size must be at least 1",
        ));
    }
    let src = open_url_as(from, true)?;
    let dst = open_url_as(to, true)?;
    let mut report = MigrateReport {
        from: public_name(from)?,
        to: public_name(to)?,
        dry_run: opts.dry_run,
        ..MigrateReport::default()
    };
    if report.from == report.to || src.describe() == dst.describe() {
        return Err(Error::invalid(
            Field::Store,
            format!("{} is both the source and the target", report.from),
        ));
    }
    let (src_marks, dst_marks) = (src.marks()?, dst.marks()?);
    if let Some(found) = &src_marks.moving_from {
        return Err(refused(format!(
            "the source is itself the target of an unfinished migration from {found}: rerun that one first"
        )));
    }
    if let Some(found) = &dst_marks.moved_to {
        return Err(refused(format!(
            "the target was moved to {found}: it is not used any more"
        )));
    }
    match (&src_marks.moved_to, &dst_marks.moving_from) {
        (Some(moved), _) if *moved != report.to => {
            return Err(refused(format!(
                "the source was already moved to {moved}, not to {}",
                report.to
            )))
        }
        (_, Some(filling)) if *filling != report.from => {
            return Err(refused(format!(
                "the target is being filled from {filling}, not from {}",
                report.from
            )))
        }
        (Some(_), None) => {
            report.already_done = true;
            return Ok(report);
        }
        (_, Some(_)) => report.resumed = true,
        (None, None) => {}
    }
    let not_empty = || {
        refused(format!(
            "the target {} already holds leases or jobs: migrate into an empty store",
            dst.describe()
        ))
    };
    // Nothing is copied before the source is marked: until then the
    // target must be empty, resumed or not.
    let fresh = src_marks.moved_to.is_none();
    if opts.dry_run {
        if fresh && !is_empty(&*dst)? {
            return Err(not_empty());
        }
        copy(&*src, None, opts.chunk, &mut report)?;
        return Ok(report);
    }
    // Marked first (a transaction on it that began before has ended when
    // this returns), then found empty: nothing lands on it meanwhile.
    dst.set_marks(&Marks {
        moving_from: Some(report.from.clone()),
        ..Marks::default()
    })?;
    if fresh && !is_empty(&*dst)? {
        dst.set_marks(&Marks::default())?;
        return Err(not_empty());
    }
    src.set_marks(&Marks {
        moved_to: Some(report.to.clone()),
        ..Marks::default()
    })?;
    // Both clocks read after the cut-over, the target's last: instants
    // move by at least the time that really passed.
    let src_now = src.txn(|tx| Ok(tx.now_ms()))?;
    let dst_now = dst.txn(|tx| Ok(tx.now_ms()))?;
    report.shift_ms = clamp_i64(i128::from(dst_now) - i128::from(src_now));
    copy(&*src, Some(&*dst), opts.chunk, &mut report)?;
    // Above every id the source handed out, purged jobs' included.
    report.last_job_id = report.last_job_id.max(last_job_id(&*src)?);
    let last = JobId(report.last_job_id);
    dst.txn(|tx| tx.jobs()?.reserve_job_ids(last))?;
    dst.set_marks(&Marks::default())?;
    Ok(report)
}

fn refused(reason: String) -> Error {
    Error::invalid(Field::Store, reason)
}

fn clamp_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// How a store is named in the other's mark: its URL without a password
/// (`PGPASSWORD` or `~/.pgpass` supply it to whoever follows the name), a
/// SQLite path made absolute.
fn public_name(url: &str) -> Result<String> {
    if let Some(rest) = url.strip_prefix("sqlite:") {
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let path = path.strip_prefix("//").unwrap_or(path);
        let abs = std::path::absolute(path)
            .map_err(|e| Error::invalid(Field::Store, format!("{path:?}: {e}")))?;
        let query = query.map(|q| format!("?{q}")).unwrap_or_default();
        return Ok(format!("sqlite:{}{query}", abs.display()));
    }
    Ok(without_password(url))
}

/// `postgres://user:secret@host/db?password=x&a=b` without the secrets.
fn without_password(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let base = match base.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host)) => {
                let user = userinfo.split(':').next().unwrap_or("");
                format!("{scheme}://{user}@{host}")
            }
            None => base.to_owned(),
        },
        None => base.to_owned(),
    };
    let kept: Vec<&str> = query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("password="))
        .collect();
    if kept.is_empty() {
        base
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

/// The last job id `store` handed out: the next one, asked for in a
/// transaction that is then undone (a PostgreSQL sequence keeps its step:
/// harmless on a moved store).
fn last_job_id(store: &dyn Store) -> Result<u64> {
    let mut next = None;
    let undone = store.transact(&mut |tx| {
        next = Some(tx.jobs()?.next_job_id()?);
        Err(Error::invalid(Field::Store, "undone on purpose"))
    });
    match (next, undone) {
        (Some(id), _) => Ok(id.0.saturating_sub(1)),
        (None, Err(e)) => Err(e),
        (None, Ok(())) => Ok(0),
    }
}

/// Whether a store holds no lease record and no queue.
fn is_empty(store: &dyn Store) -> Result<bool> {
    store.txn(|tx| {
        let mut names = Vec::new();
        tx.export_names(Exported::LeaseKeys, "", 1, &mut names)?;
        tx.export_names(Exported::Queues, "", 1, &mut names)?;
        Ok(names.is_empty())
    })
}

/// Every name of `what` in `src`, a page at a time, to `each`.
fn for_names(
    src: &dyn Store,
    what: Exported<'_>,
    chunk: usize,
    mut each: impl FnMut(Vec<String>) -> Result<()>,
) -> Result<()> {
    let mut after = String::new();
    loop {
        let names = src.txn(|tx| {
            let mut out = Vec::new();
            tx.export_names(what, &after, chunk, &mut out)?;
            Ok(out)
        })?;
        let Some(last) = names.last().cloned() else {
            return Ok(());
        };
        let full = names.len() >= chunk;
        each(names)?;
        if !full {
            return Ok(());
        }
        after = last;
    }
}

/// Read everything from `src` and, given a target, write it there
/// (counting it in `report` either way).
fn copy(
    src: &dyn Store,
    dst: Option<&dyn Store>,
    chunk: usize,
    report: &mut MigrateReport,
) -> Result<()> {
    let shift = report.shift_ms;
    // A source whose history went back (a promoted PostgreSQL standby)
    // grants above its floor: the copies keep that promise on a store
    // that has none.
    let (src_now, floor) = src.txn(|tx| Ok((tx.now_ms(), tx.token_floor())))?;
    report.max_token = report.max_token.max(floor);
    for_names(src, Exported::LeaseKeys, chunk, |keys| {
        let records: Vec<(String, LeaseRecord)> = src.txn(|tx| {
            let mut out = Vec::with_capacity(keys.len());
            for key in &keys {
                if let Some(rec) = tx.lease_mut(key, false)? {
                    out.push((key.clone(), rec.clone()));
                }
            }
            Ok(out)
        })?;
        for (_, rec) in &records {
            report.leases += 1;
            report.max_token = report.max_token.max(rec.last_token);
            report.held_leases += u64::from(rec.slots.iter().any(|s| s.is_live(src_now)));
        }
        let Some(dst) = dst else { return Ok(()) };
        dst.txn(|tx| {
            for (key, rec) in &records {
                if let Some(slot) = tx.lease_mut(key, true)? {
                    *slot = shift_lease(rec, shift);
                    slot.last_token = slot.last_token.max(floor);
                }
            }
            Ok(())
        })
    })?;
    for_names(src, Exported::Queues, chunk, |queues| {
        for queue in queues {
            report.queues += 1;
            copy_queue(src, dst, &queue, chunk, floor, report)?;
        }
        Ok(())
    })
}

/// One queue: its settings, schedules, rate buckets, jobs and links.
fn copy_queue(
    src: &dyn Store,
    dst: Option<&dyn Store>,
    queue: &str,
    chunk: usize,
    floor: u64,
    report: &mut MigrateReport,
) -> Result<()> {
    let shift = report.shift_ms;
    let (config, schedules) = src.txn(|tx| {
        let jobs = tx.jobs()?;
        Ok((jobs.queue_config(queue)?, jobs.schedules(queue)?))
    })?;
    let configured = config != QueueConfig::default();
    report.settings += u64::from(configured);
    report.schedules += schedules.len() as u64;
    if let Some(dst) = dst {
        dst.txn(|tx| {
            let jobs = tx.jobs()?;
            if configured {
                jobs.put_queue_config(queue, &config)?;
            }
            // A schedule's cursor is wall-clock time (Unix ms), the same
            // on every store: copied as is.
            for s in &schedules {
                jobs.put_schedule(s)?;
            }
            Ok(())
        })?;
    }
    for_names(src, Exported::RateKeys(queue), chunk, |keys| {
        let logs: Vec<(String, RateLog)> = src.txn(|tx| {
            let jobs = tx.jobs()?;
            keys.iter()
                .map(|k| Ok((k.clone(), jobs.rate_log(queue, k)?)))
                .collect()
        })?;
        report.rate_buckets += logs.len() as u64;
        let Some(dst) = dst else { return Ok(()) };
        dst.txn(|tx| {
            let jobs = tx.jobs()?;
            for (key, log) in &logs {
                jobs.put_rate_log(queue, key, &shift_rate(log, shift))?;
            }
            Ok(())
        })
    })?;
    let mut after = JobId(0);
    loop {
        let (page, links) = src.txn(|tx| {
            let jobs = tx.jobs()?;
            let page = jobs.list(queue, None, after, chunk)?;
            let mut links = Vec::new();
            for job in page.iter().filter(|j| j.has_children) {
                let mut children = Vec::new();
                jobs.children(job.id, &mut children)?;
                links.extend(children.into_iter().map(|c| (job.id, c)));
            }
            Ok((page, links))
        })?;
        let Some(last) = page.last().map(|j| j.id) else {
            return Ok(());
        };
        for job in &page {
            report.jobs += 1;
            report.running_jobs += u64::from(job.claim.is_some());
            report.max_token = report.max_token.max(job.last_token);
            report.last_job_id = report.last_job_id.max(job.id.0);
        }
        report.links += links.len() as u64;
        if let Some(dst) = dst {
            let ids: Vec<JobId> = page.iter().map(|j| j.id).collect();
            dst.txn(|tx| {
                let jobs = tx.jobs()?;
                // Loaded first: a chunk copied again (a resumed run)
                // replaces its rows.
                jobs.jobs_by_id(&ids)?;
                for job in &page {
                    let mut job = shift_job(job, shift);
                    job.last_token = job.last_token.max(floor);
                    jobs.put_job(&job)?;
                }
                for &(parent, child) in &links {
                    jobs.link(parent, child)?;
                }
                Ok(())
            })?;
        }
        if page.len() < chunk {
            return Ok(());
        }
        after = last;
    }
}

/// An instant moved by `shift` ms (0 and `u64::MAX` stay: "always" and
/// "never").
fn at(ms: u64, shift: i64) -> u64 {
    if ms == 0 || ms == u64::MAX {
        return ms;
    }
    let moved = i128::from(ms) + i128::from(shift);
    u64::try_from(moved.max(1)).unwrap_or(u64::MAX)
}

fn shift_lease(rec: &LeaseRecord, shift: i64) -> LeaseRecord {
    let mut rec = rec.clone();
    for slot in &mut rec.slots {
        slot.expires_at_ms = at(slot.expires_at_ms, shift);
    }
    rec
}

fn shift_job(job: &JobRecord, shift: i64) -> JobRecord {
    let mut job = job.clone();
    job.run_at_ms = at(job.run_at_ms, shift);
    job.created_at_ms = at(job.created_at_ms, shift);
    job.finished_at_ms = job.finished_at_ms.map(|t| at(t, shift));
    if let Some(claim) = &mut job.claim {
        claim.lease_until_ms = at(claim.lease_until_ms, shift);
        claim.deadline_ms = claim.deadline_ms.map(|t| at(t, shift));
    }
    job
}

fn shift_rate(log: &RateLog, shift: i64) -> RateLog {
    RateLog {
        starts: log.starts.iter().map(|&t| at(t, shift)).collect(),
        wake_at_ms: log.wake_at_ms.map(|t| at(t, shift)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_named_in_a_mark_carries_no_password() {
        assert_eq!(
            without_password("postgres://app:s3cret@db:5432/x?schema=a&password=p&sslmode=require"),
            "postgres://app@db:5432/x?schema=a&sslmode=require"
        );
        assert_eq!(
            without_password("postgres://app@db/x"),
            "postgres://app@db/x"
        );
    }

    #[test]
    fn instants_move_and_always_and_never_stay() {
        assert_eq!(at(1_000, 500), 1_500);
        assert_eq!(at(1_000, -2_000), 1);
        assert_eq!(at(0, 500), 0);
        assert_eq!(at(u64::MAX, -5), u64::MAX);
    }
}
