//! The SQLite connection's copy of the running jobs it wrote last: a read
//! it serves is exactly the row another connection reads, a write by any
//! other connection (of this process or another) is seen at once, and a
//! rolled-back write leaves the row as it was, alone or as one member of
//! a group commit.

#![allow(clippy::disallowed_methods)] // real threads in the group commit test

use leasehold::core::job::Progress;
use leasehold::core::{self, JobRecord};
use leasehold::{HolderId, JobId, JobSpec, JobState, QueuePolicy, SqliteStore, StoreExt};
use std::time::Duration;

#[path = "support/dir.rs"]
mod dir;
use dir::Dir;

fn read(store: &SqliteStore, id: JobId) -> JobRecord {
    store
        .txn(|tx| tx.jobs()?.job(id))
        .unwrap()
        .expect("the job exists")
}

/// `id` read through `store`'s copy (the read must be served by it) and
/// through `other`'s connection: the same record.
fn same_from_copy(store: &SqliteStore, other: &SqliteStore, id: JobId, when: &str) -> JobRecord {
    let hits = store.row_copy_hits();
    let copy = read(store, id);
    assert_eq!(
        store.row_copy_hits(),
        hits + 1,
        "{when}: served by the copy"
    );
    assert_eq!(copy, read(other, id), "{when}: the copy is the row");
    copy
}

const HOLDER: HolderId = HolderId(7);

fn claim(store: &SqliteStore, n: usize) -> Vec<JobRecord> {
    let policy = QueuePolicy::default();
    store
        .txn(|tx| core::job::claim(tx, "q", HOLDER, 60_000, n, &policy))
        .unwrap()
}

/// `n` plain jobs pushed to queue `q` in one transaction; their ids.
fn push(store: &SqliteStore, n: usize) -> Vec<JobId> {
    let policy = QueuePolicy::default();
    store
        .txn(|tx| {
            (0..n)
                .map(|_| core::job::enqueue(tx, "q", &JobSpec::new("x"), &policy).map(|p| p.id))
                .collect::<leasehold::Result<Vec<_>>>()
        })
        .unwrap()
}

#[test]
fn a_job_served_from_the_copy_is_the_row_in_every_running_state() {
    let dir = Dir::new("exact");
    let a = SqliteStore::open(dir.db()).unwrap();
    let b = SqliteStore::open(dir.db()).unwrap();
    let policy = QueuePolicy::default();
    // Every column a running row can carry: priority, a run-time limit
    // (the claim's deadline), unique and concurrency keys, attempts.
    let spec = JobSpec {
        priority: 3,
        unique_key: Some("u1".into()),
        key: Some("k1".into()),
        timeout: Some(Duration::from_secs(30)),
        max_attempts: 3,
        ..JobSpec::new(&b"payload \x00\xff"[..])
    };
    let id = a
        .txn(|tx| core::job::enqueue(tx, "q", &spec, &policy))
        .unwrap()
        .id;
    let jobs = claim(&a, 1);
    assert_eq!(jobs.len(), 1);
    let token = jobs[0].last_token;
    let after_claim = same_from_copy(&a, &b, id, "after the claim");
    assert_eq!(after_claim.state, JobState::Running);
    assert!(after_claim.claim.is_some_and(|c| c.deadline_ms.is_some()));

    a.txn(|tx| core::job::heartbeat(tx, id, HOLDER, token, 90_000))
        .unwrap();
    same_from_copy(&a, &b, id, "after a renewal");

    let progress = Progress::new(0.25, "a quarter, ünïcode").unwrap();
    a.txn(|tx| core::job::record_progress(tx.jobs()?, HOLDER, &[(id, token, progress.clone())]))
        .unwrap()
        .into_iter()
        .for_each(|r| r.unwrap());
    let reported = same_from_copy(&a, &b, id, "after a progress report");
    assert_eq!(reported.progress, Some(progress));

    // A failure with attempts left: scheduled, no longer in the copy.
    let state = a
        .txn(|tx| core::job::fail(tx, id, HOLDER, token, "boom", &policy))
        .unwrap();
    assert_eq!(state, JobState::Scheduled);
    let hits = a.row_copy_hits();
    assert_eq!(read(&a, id), read(&b, id));
    assert_eq!(
        a.row_copy_hits(),
        hits,
        "a job no longer running is read from the file"
    );
}

#[test]
fn a_write_by_another_connection_is_seen_at_once() {
    let dir = Dir::new("other");
    let a = SqliteStore::open(dir.db()).unwrap();
    let b = SqliteStore::open(dir.db()).unwrap();
    let policy = QueuePolicy::default();
    push(&a, 3);
    let jobs = claim(&a, 3);
    let id = jobs[0].id;
    same_from_copy(&a, &b, id, "after the claim");
    // Another connection asks for a cancel: the job stays running with
    // the request set, and the holder's next read must carry it.
    assert_eq!(
        b.txn(|tx| core::job::cancel(tx, id, &policy)).unwrap(),
        JobState::Running
    );
    let hits = a.row_copy_hits();
    let seen = read(&a, id);
    assert!(seen.cancel_requested, "{seen:?}");
    assert_eq!(a.row_copy_hits(), hits, "the copy was dropped, not served");
    let reply = a
        .txn(|tx| core::job::heartbeat(tx, jobs[1].id, HOLDER, jobs[1].last_token, 60_000))
        .unwrap();
    assert!(!reply.cancel_requested);
    // The holder's renewal of the cancelled job reports the request.
    let reply = a
        .txn(|tx| core::job::heartbeat(tx, id, HOLDER, jobs[0].last_token, 60_000))
        .unwrap();
    assert!(reply.cancel_requested);
    same_from_copy(&a, &b, id, "after the renewal that saw the request");
}

/// A batch read (a settle's or a renewal round's) mixing jobs in the copy,
/// jobs not in it and an id asked for twice answers every one, each the
/// row as another connection reads it; a read takes the job out of the
/// copy, so the next one goes to the file.
#[test]
fn a_batch_read_answers_every_id_asked_for_even_twice() {
    let dir = Dir::new("batch");
    let a = SqliteStore::open(dir.db()).unwrap();
    let b = SqliteStore::open(dir.db()).unwrap();
    let queued = push(&a, 3);
    let jobs = claim(&a, 2);
    let (one, two, three) = (jobs[0].id, jobs[1].id, queued[2]);
    assert!(
        !jobs.iter().any(|j| j.id == three),
        "job three stays queued"
    );
    let ids = [one, three, one, two, JobId(999_999), two];
    let hits = a.row_copy_hits();
    let read_a = a.txn(|tx| tx.jobs()?.jobs_by_id(&ids)).unwrap();
    assert_eq!(
        a.row_copy_hits() - hits,
        2,
        "jobs one and two from the copy"
    );
    let read_b = b.txn(|tx| tx.jobs()?.jobs_by_id(&ids)).unwrap();
    let ids_of = |jobs: &[JobRecord]| jobs.iter().map(|j| j.id).collect::<Vec<_>>();
    assert_eq!(ids_of(&read_a), [one, three, one, two, two]);
    assert_eq!(read_a, read_b);
    let hits = a.row_copy_hits();
    assert_eq!(read(&a, one), read(&b, one));
    assert_eq!(a.row_copy_hits(), hits, "taken by the batch read");
}

#[test]
fn a_rolled_back_write_leaves_the_row_as_it_was() {
    let dir = Dir::new("rollback");
    let a = SqliteStore::open(dir.db()).unwrap();
    let b = SqliteStore::open(dir.db()).unwrap();
    let id = push(&a, 1)[0];
    let token = claim(&a, 1)[0].last_token;
    // Only this connection between the claim and the failed renewal (a
    // commit by `b` would drop the copy and hide a stale read).
    let hits = a.row_copy_hits();
    let before = read(&a, id);
    assert_eq!(a.row_copy_hits(), hits + 1, "served by the copy");
    let failed: leasehold::Result<()> = a.txn(|tx| {
        let reply = core::job::heartbeat(tx, id, HOLDER, token, 600_000)?;
        // Read back in the same transaction: the write, not the copy.
        let job = tx.jobs()?.job(id)?.expect("the job exists");
        assert_eq!(
            job.claim.map(|c| c.lease_until_ms),
            Some(reply.lease_until_ms)
        );
        Err(leasehold::Error::store("testing", "undo this"))
    });
    assert!(failed.is_err());
    assert_eq!(read(&a, id), before, "the renewal was undone");
    assert_eq!(read(&b, id), before);
    // The next committed write is served again.
    a.txn(|tx| core::job::heartbeat(tx, id, HOLDER, token, 120_000))
        .unwrap();
    let renewed = same_from_copy(&a, &b, id, "after a committed renewal");
    assert_ne!(renewed, before);
}

#[test]
fn a_member_undone_inside_a_group_commit_leaves_nothing_in_the_copy() {
    let dir = Dir::new("group");
    let store = std::sync::Arc::new(SqliteStore::open(dir.db()).unwrap());
    let observer = SqliteStore::open(dir.db()).unwrap();
    const THREADS: usize = 8;
    const PER_THREAD: usize = 40;
    push(&store, THREADS * PER_THREAD);
    let jobs = claim(&store, THREADS * PER_THREAD);
    assert_eq!(jobs.len(), THREADS * PER_THREAD);
    // The threads' transactions of one group have different fates.
    let fate = |n: usize| match (n % PER_THREAD + n / PER_THREAD * 3) % 10 {
        3 | 6 => "fail",
        7 => "panic",
        _ => "commit",
    };
    // Each thread renews its own jobs, one transaction each, a longer
    // lease every time; a failing or panicking one is undone inside its
    // group (ROLLBACK TO) while the others commit.
    let handles: Vec<_> = jobs
        .chunks(PER_THREAD)
        .enumerate()
        .map(|(t, mine)| {
            let (store, mine) = (store.clone(), mine.to_vec());
            std::thread::spawn(move || {
                for (i, job) in mine.iter().enumerate() {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        store.txn(|tx| {
                            let lease_ms = 120_000 + 1_000 * i as u64;
                            core::job::heartbeat(tx, job.id, HOLDER, job.last_token, lease_ms)?;
                            match fate(t * PER_THREAD + i) {
                                "fail" => Err(leasehold::Error::store("testing", "undo this")),
                                "panic" => panic!("panics on purpose"),
                                _ => Ok(()),
                            }
                        })
                    }));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let (txns, commits) = store.group_stats();
    assert!(
        commits < txns,
        "nothing grouped: {txns} transactions, {commits} commits"
    );
    // Every job through the store first (its copy serves them while no
    // other connection commits), then through the observer.
    let hits = store.row_copy_hits();
    let seen: Vec<JobRecord> = jobs.iter().map(|job| read(&store, job.id)).collect();
    let served = store.row_copy_hits() - hits;
    for (n, (job, seen)) in jobs.iter().zip(&seen).enumerate() {
        assert_eq!(seen, &read(&observer, job.id), "job #{n} ({})", fate(n));
        let renewed = seen.claim.map(|c| c.lease_until_ms) != job.claim.map(|c| c.lease_until_ms);
        assert_eq!(
            renewed,
            fate(n) == "commit",
            "job #{n} ({}): {seen:?}",
            fate(n)
        );
    }
    let committed = (0..jobs.len()).filter(|&n| fate(n) == "commit").count() as u64;
    assert_eq!(
        served, committed,
        "the copy serves every renewed job, and only those"
    );
}
