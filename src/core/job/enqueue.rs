//! Enqueue: one job ([`enqueue`]) or a batch in one transaction
//! ([`enqueue_many`]), and the checks a spec passes by itself
//! ([`check_spec`]). A batch's error names the job at fault by its place
//! ([`batch_place`] reads it back).

use super::rules::{check_queue, note, put};
use super::{deps, unique, EnqueueOutcome, JobRecord, JobSpec, JobState, QueuePolicy};
use crate::core::{
    check_key, check_text, expiry_ms, JobChange, Txn, MAX_ATTEMPTS, MAX_BATCH,
    MAX_BATCH_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES, MAX_TTL_MS,
};
use crate::error::{Error, Field, Result};
use crate::time::StoreMs;
use std::sync::Arc;

/// Add a job to `queue`, or return the live job with the same unique key.
pub fn enqueue(
    tx: &mut dyn Txn,
    queue: &str,
    spec: &JobSpec,
    policy: &QueuePolicy,
) -> Result<EnqueueOutcome> {
    let tx = tx.jobs()?;
    check_queue(queue)?;
    check_spec(spec)?;
    let now_ms = tx.now_ms();
    let run_at_ms = match spec.run_at.map(StoreMs::ms) {
        Some(at) => {
            let latest = now_ms.saturating_add(MAX_TTL_MS);
            if at > latest {
                return Err(Error::invalid(
                    Field::RunAt,
                    format!("{at} ms is more than a year after now ({now_ms} ms)"),
                ));
            }
            at.max(now_ms)
        }
        None if spec.delay_ms == 0 => now_ms,
        None => expiry_ms(Field::Delay, now_ms, spec.delay_ms)?,
    };
    if let Some(existing) = unique::blocking(tx, queue, spec, policy)? {
        return Ok(existing);
    }
    let id = tx.next_job_id()?;
    let mut job = JobRecord {
        id,
        queue: Arc::from(queue),
        payload: Arc::from(spec.payload.as_slice()),
        priority: spec.priority,
        run_at_ms,
        created_at_ms: now_ms,
        max_attempts: spec.max_attempts,
        attempts: 0,
        expiries: 0,
        last_token: 0,
        state: JobState::Ready,
        claim: None,
        cancel_requested: false,
        last_error: None,
        unique_key: spec.unique_key.as_deref().map(Arc::from),
        finished_at_ms: None,
        result: None,
        key: spec.key.as_deref().map(Arc::from),
        timeout_ms: timeout_ms(spec),
        parked: false,
        progress: None,
        after: None,
        after_any: false,
        waiting_on: 0,
        has_children: false,
    };
    job.reschedule(run_at_ms, now_ms);
    let after = deps::After {
        ids: &spec.after,
        any: spec.after_any,
        gone_ended: false,
    };
    deps::link(tx, &mut job, after, policy)?;
    put(tx, &job)?;
    note(tx, &job, JobChange::Enqueued);
    if job.state == JobState::Cancelled {
        note(tx, &job, JobChange::Cancelled);
    }
    Ok(EnqueueOutcome { id, created: true })
}

/// Enqueue `specs` in order in this one transaction, as many
/// [`enqueue`]s one after the other would (so a spec's unique key is
/// judged against the jobs pushed before it in the batch too): their
/// outcomes, in order. At most [`MAX_BATCH`] specs
/// and [`MAX_BATCH_PAYLOAD_BYTES`]
/// of payloads. What [`check_spec`] checks is checked for every spec before
/// any job is written; what needs the store (a run time against its clock,
/// the jobs named in `after`) when its turn comes. An error names the spec
/// at fault by its place in the batch (from 0), and the caller's
/// transaction then rolls back: all the jobs or none.
pub fn enqueue_many(
    tx: &mut dyn Txn,
    queue: &str,
    specs: &[JobSpec],
    policy: &QueuePolicy,
) -> Result<Vec<EnqueueOutcome>> {
    check_queue(queue)?;
    if specs.len() > MAX_BATCH {
        return Err(Error::invalid(
            Field::Batch,
            format!(
                "{} jobs is more than {} in one push",
                specs.len(),
                MAX_BATCH
            ),
        ));
    }
    let bytes: usize = specs.iter().map(|s| s.payload.len()).sum();
    if bytes > MAX_BATCH_PAYLOAD_BYTES {
        return Err(Error::invalid(
            Field::Batch,
            format!(
                "{bytes} bytes of payloads is more than {} in one push (push fewer jobs at a time)",
                MAX_BATCH_PAYLOAD_BYTES
            ),
        ));
    }
    let at = |i: usize| {
        move |e| match e {
            Error::Invalid { field, reason } => Error::Invalid {
                field,
                reason: format!("{BATCH_JOB}{i}{OF_THE_BATCH}{reason}"),
            },
            e => e,
        }
    };
    for (i, spec) in specs.iter().enumerate() {
        check_spec(spec).map_err(at(i))?;
    }
    // The batch's unique keys locked in one order (a store that locks a
    // key until the commit waits on it, as each push then does), so two
    // batches sharing keys wait for each other instead of deadlocking.
    let mut keys: Vec<&str> = specs
        .iter()
        .filter_map(|s| s.unique_key.as_deref())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let jobs = tx.jobs()?;
    for key in keys {
        jobs.lock_unique(queue, key)?;
    }
    let mut outcomes = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        outcomes.push(enqueue(tx, queue, spec, policy).map_err(at(i))?);
    }
    Ok(outcomes)
}

/// Check what an enqueue of `spec` checks by itself, without a store: the
/// payload's size, the attempts, the keys and the unique and dependency
/// options (a tool validates a batch with it before pushing any).
pub fn check_spec(spec: &JobSpec) -> Result<()> {
    if spec.payload.len() > MAX_PAYLOAD_BYTES {
        return Err(Error::invalid(
            Field::Payload,
            format!(
                "{} bytes is larger than {MAX_PAYLOAD_BYTES}",
                spec.payload.len()
            ),
        ));
    }
    if spec.max_attempts == 0 || spec.max_attempts > MAX_ATTEMPTS {
        return Err(Error::invalid(
            Field::MaxAttempts,
            format!("{} is outside 1..={MAX_ATTEMPTS}", spec.max_attempts),
        ));
    }
    if let Some(key) = &spec.unique_key {
        check_text(Field::UniqueKey, key)?;
        if key.is_empty() {
            return Err(Error::invalid(Field::UniqueKey, "must not be empty"));
        }
    }
    unique::check(spec)?;
    deps::check(spec)?;
    if let Some(key) = &spec.key {
        check_key(Field::ConcurrencyKey, key)?;
    }
    if let (Some(t), Some(ms)) = (spec.timeout, timeout_ms(spec)) {
        if ms == 0 || ms > MAX_TTL_MS {
            return Err(Error::invalid(
                Field::Timeout,
                format!("{t:?} is outside 1 ms..=one year"),
            ));
        }
    }
    Ok(())
}

/// A spec's run-time limit in whole ms (saturating), as jobs keep it.
fn timeout_ms(spec: &JobSpec) -> Option<u64> {
    spec.timeout
        .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
}

/// How a batch's error names its job: `job {i} of the batch: {reason}`.
const BATCH_JOB: &str = "job ";
const OF_THE_BATCH: &str = " of the batch: ";

/// The place in its batch (from 0) of the job an [`enqueue_many`] error
/// names, and the reason without it; `None` for an error about the batch
/// as a whole (a tool that made the batch from lines names the line).
pub fn batch_place(reason: &str) -> Option<(usize, &str)> {
    let (i, rest) = reason.strip_prefix(BATCH_JOB)?.split_once(OF_THE_BATCH)?;
    Some((i.parse().ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `enqueue_many` writes, `batch_place` reads back; an error
    /// about the whole batch names no job.
    #[test]
    fn a_batch_error_names_its_job_and_batch_place_reads_it() {
        let specs = [
            JobSpec::new("ok"),
            JobSpec::new(vec![0u8; MAX_PAYLOAD_BYTES + 1]),
        ];
        let store = crate::MemStore::new();
        let err = crate::StoreExt::txn(&store, |tx| {
            enqueue_many(tx, "q", &specs, &QueuePolicy::default())
        })
        .unwrap_err();
        let Error::Invalid { reason, .. } = err else {
            panic!("{err:?}")
        };
        let (place, rest) = batch_place(&reason).unwrap();
        assert_eq!(place, 1);
        assert!(
            rest.starts_with(&format!("{} bytes", MAX_PAYLOAD_BYTES + 1)),
            "{rest}"
        );
        assert_eq!(
            batch_place("10001 jobs is more than 10000 in one push"),
            None
        );
        assert_eq!(batch_place("job x of the batch: y"), None);
    }
}
