//! Progress reports on every store: written only under the claim that
//! made them (a stale claim's report changes nothing), kept with the job
//! once it ends, cleared by a new claim, and exact through the store.

use super::*;
use leasehold::core::job::{record_progress, Progress};

fn report(
    w: &World,
    h: u128,
    job: &JobRecord,
    progress: &Progress,
) -> leasehold::Result<Vec<leasehold::Result<()>>> {
    let token = job.claim.unwrap().token;
    w.tx(|tx| {
        record_progress(
            tx.jobs()?,
            HolderId(h),
            &[(job.id, token, progress.clone())],
        )
    })
}

/// A report is fenced by its claim, kept after the end, and a new claim
/// starts without one.
pub fn job_progress_is_fenced_kept_and_cleared_by_a_new_claim(make: &Make) {
    let w = World::new(make);
    let id = w.push("q", JobSpec::new("x"));
    let first = w.claim_one("q", 1, 1_000);
    let p = Progress::new(0.4, "tiles 400/1000 — ünïcode, 'quotes'").unwrap();
    assert!(report(&w, 1, &first, &p).unwrap()[0].is_ok());
    assert_eq!(w.get(id).progress.as_ref(), Some(&p), "read back exactly");
    // Another holder, or the same holder past the claim: refused.
    assert_eq!(
        lost_reason(report(&w, 2, &first, &p).unwrap().remove(0)),
        LostReason::NotHolder
    );
    w.at(T0 + 1_000);
    let later = Progress::new(0.9, "late").unwrap();
    assert_eq!(
        lost_reason(report(&w, 1, &first, &later).unwrap().remove(0)),
        LostReason::Expired
    );
    // The claim ran out: a new attempt (after the retry's backoff) starts
    // without progress, and the old claim's report is refused, changing
    // nothing.
    w.at(T0 + 20_000);
    let second = w.claim_one("q", 2, 10_000);
    assert_eq!(second.progress, None, "a new claim starts without");
    assert_eq!(w.get(id).progress, None);
    assert_eq!(
        lost_reason(report(&w, 1, &first, &later).unwrap().remove(0)),
        LostReason::StaleToken
    );
    assert_eq!(w.get(id).progress, None, "a stale report wrote nothing");
    let done = Progress::new(1.0, "").unwrap();
    assert!(report(&w, 2, &second, &done).unwrap()[0].is_ok());
    w.complete(&second, 2).unwrap();
    let job = w.get(id);
    assert_eq!((job.state, job.progress), (JobState::Done, Some(done)));
    // The claim that completed it may still send its last word (a renewal
    // that lost the race to its settle); a stale claim may not.
    let last = Progress::new(1.0, "the last word").unwrap();
    assert!(report(&w, 2, &second, &last).unwrap()[0].is_ok());
    assert_eq!(w.get(id).progress, Some(last.clone()));
    assert_eq!(
        lost_reason(report(&w, 1, &first, &p).unwrap().remove(0)),
        LostReason::StaleToken
    );
    assert_eq!(
        w.get(id).progress,
        Some(last),
        "a stale report wrote nothing"
    );
    // An unknown job is named.
    let gone = JobRecord {
        id: JobId(9_999_999),
        ..second
    };
    assert!(matches!(
        report(&w, 2, &gone, &p).unwrap().remove(0),
        Err(Error::NotFound(_))
    ));
}
