//! Dependencies (issue 27 §2): a job pushed after others waits until they
//! end (design: `docs/dependencies.md`).
//!
//! # State and transitions
//! - A push naming jobs in [`JobSpec::after`](super::JobSpec::after) reads each: a done one
//!   counts nothing; a dead or cancelled one cancels the new job at once
//!   (unless [`JobSpec::after_any`]); a live one (ready, scheduled,
//!   running, waiting) gets an edge to the new job in the store
//!   ([`JobTxn::link`]), is marked [`JobRecord::has_children`], and counts
//!   one in the new job's [`JobRecord::waiting_on`]. With none counted the
//!   job starts as any push does; else it is [`JobState::Waiting`].
//! - When a job with children ends (every rule writes an ending through
//!   `rules::put`), each waiting child is decided in the same
//!   transaction: a done parent (or any ending, with `after_any`) counts
//!   down, and at zero the child becomes ready (or scheduled, if its own
//!   delay has not passed) and wakes idle workers; a dead or cancelled
//!   parent cancels the child, naming the parent. A cancelled child is an
//!   ending too: its own children follow, through a work list (no
//!   recursion on the stack). The parent's edges are then deleted.
//!
//! # Invariants
//! - **D1** No job starts before every job it names has ended (and ended
//!   done, without `after_any`): it is not claimable while waiting.
//! - **D2** No job stays waiting once every job it names has ended: the
//!   last ending decides it, in its own transaction (no poller).
//! - Only existing jobs can be named, so no cycle can be made.

use super::rules::{load, load_fresh_as, note};
use super::{JobId, JobRecord, JobState, QueuePolicy};
use crate::core::{JobChange, JobTxn, Wake};
use crate::error::{Error, Field, Result};
use std::sync::Arc;

/// The most jobs one job may name in [`JobSpec::after`](super::JobSpec::after).
pub const MAX_AFTER: usize = 1_000;

/// Check a spec's dependencies (how many; no id twice is fine, they are
/// deduplicated).
pub(super) fn check(spec: &super::JobSpec) -> Result<()> {
    if spec.after.len() > MAX_AFTER {
        return Err(Error::invalid(
            Field::After,
            format!("{} jobs is more than {MAX_AFTER}", spec.after.len()),
        ));
    }
    if spec.after_any && spec.after.is_empty() {
        return Err(Error::invalid(
            Field::After,
            "after_any needs jobs to run after (--after ID,...)",
        ));
    }
    Ok(())
}

/// What a job names: the jobs it runs after, and whether any ending will
/// do.
pub(super) struct After<'a> {
    pub ids: &'a [JobId],
    pub any: bool,
    /// A named job that no longer exists counts as ended (a retry, whose
    /// jobs may have been purged since), instead of refusing the push.
    pub gone_ended: bool,
}

/// Link `job` (not yet written: a push, or a retry) to the jobs `after`
/// names: it waits for the live ones, or ends cancelled at once if one
/// ended dead or cancelled (without `any`). An unknown job is an error
/// naming it, before anything is written.
pub(super) fn link(
    tx: &mut dyn JobTxn,
    job: &mut JobRecord,
    after: After<'_>,
    policy: &QueuePolicy,
) -> Result<()> {
    if after.ids.is_empty() {
        return Ok(());
    }
    let mut ids = after.ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut live = Vec::new();
    let mut failed = None;
    for &id in &ids {
        let parent = match load_fresh_as(tx, id, policy, false) {
            Err(Error::NotFound(_)) if after.gone_ended => continue,
            Err(Error::NotFound(_)) => {
                return Err(Error::invalid(
                    Field::After,
                    format!("job {id} does not exist"),
                ))
            }
            other => other?,
        };
        match parent.state {
            JobState::Done => {}
            JobState::Dead | JobState::Cancelled => {
                if !after.any && failed.is_none() {
                    failed = Some(ended(parent.id, parent.state));
                }
            }
            _ => live.push(parent.id),
        }
    }
    job.after = Some(Arc::from(ids));
    job.after_any = after.any;
    job.waiting_on = 0;
    let now_ms = tx.now_ms();
    if let Some(reason) = failed {
        job.last_error = Some(Arc::from(reason.as_str()));
        job.finish(JobState::Cancelled, now_ms);
        return Ok(());
    }
    if live.is_empty() {
        return Ok(());
    }
    job.waiting_on = u32::try_from(live.len()).unwrap_or(u32::MAX);
    job.state = JobState::Waiting;
    for id in live {
        tx.link(id, job.id)?;
        // Read again: bringing a later parent's queue up to date may have
        // changed this one (a slot it waited for freed).
        let mut parent = load(tx, id)?;
        if !parent.has_children {
            parent.has_children = true;
            tx.put_job(&parent)?;
        }
    }
    Ok(())
}

/// The jobs a waiting job's freshness depends on: its named jobs, theirs
/// if they wait too, and so on (each once, at most [`MAX_AFTER`] times
/// ten: a bound on a read), without the waiting ones.
pub(super) fn ancestors(tx: &mut dyn JobTxn, job: &JobRecord) -> Result<Vec<JobRecord>> {
    let mut seen = std::collections::BTreeSet::new();
    let mut todo: Vec<JobId> = job.after.iter().flat_map(|a| a.iter().copied()).collect();
    let mut out = Vec::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) || seen.len() > MAX_AFTER * 10 {
            continue;
        }
        match load(tx, id) {
            Ok(j) if j.state == JobState::Waiting => {
                todo.extend(j.after.iter().flat_map(|a| a.iter().copied()));
            }
            Ok(j) => out.push(j),
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The reason a child of `parent` (which ended `state`) ends cancelled.
fn ended(parent: JobId, state: JobState) -> String {
    format!("job {parent} it ran after ended {state}")
}

/// `parent` ended: decide each of its waiting children (see the module
/// docs), then its children's children that this ended, and so on; the
/// children made ready are appended to `ready`. Returns `parent` as it
/// must be written (no children left).
pub(super) fn release(
    tx: &mut dyn JobTxn,
    parent: &JobRecord,
    ready: &mut Vec<JobRecord>,
) -> Result<JobRecord> {
    let now_ms = tx.now_ms();
    let mut written = parent.clone();
    written.has_children = false;
    // A child a failed parent cancels ends when its parent ended (a
    // function of time alone, as an expiry is).
    let ended_at = parent.finished_at_ms.unwrap_or(now_ms);
    let mut work = vec![(parent.id, parent.state)];
    let mut children = Vec::new();
    while let Some((id, state)) = work.pop() {
        children.clear();
        tx.children(id, &mut children)?;
        for &child_id in &children {
            let mut child = match load(tx, child_id) {
                Ok(child) if child.state == JobState::Waiting => child,
                Ok(_) | Err(Error::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            if state == JobState::Done || child.after_any {
                child.waiting_on = child.waiting_on.saturating_sub(1);
                if child.waiting_on > 0 {
                    tx.put_job(&child)?;
                    continue;
                }
                child.reschedule(child.run_at_ms, now_ms);
                tx.put_job(&child)?;
                note(tx, &child, JobChange::Released);
                if super::rules::wakes_idle(child.state) {
                    tx.journal().wake(Wake::JobReady);
                }
                if child.state == JobState::Ready {
                    ready.push(child);
                }
            } else {
                child.waiting_on = 0;
                child.last_error = Some(Arc::from(ended(id, state).as_str()));
                child.finish(JobState::Cancelled, ended_at);
                let has_children = child.has_children;
                child.has_children = false;
                tx.put_job(&child)?;
                note(tx, &child, JobChange::Cancelled);
                if has_children {
                    work.push((child.id, child.state));
                }
            }
        }
        tx.unlink(id)?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::job::JobSpec;

    #[test]
    fn a_spec_names_at_most_max_after_jobs_and_after_any_needs_some() {
        let spec = |n: u64, any: bool| JobSpec {
            after: (1..=n).map(JobId).collect(),
            after_any: any,
            ..JobSpec::new("x")
        };
        assert!(check(&spec(MAX_AFTER as u64, false)).is_ok());
        assert!(check(&spec(MAX_AFTER as u64 + 1, false)).is_err());
        assert!(check(&spec(1, true)).is_ok());
        let e = check(&spec(0, true)).unwrap_err();
        assert!(e.to_string().contains("after"), "{e}");
        assert!(check(&spec(0, false)).is_ok());
    }
}
