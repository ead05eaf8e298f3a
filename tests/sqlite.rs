//! SQLite-specific behaviour: WAL in effect, claim scans served by their
//! index in order (no sort), foreign/newer/corrupt files refused and left
//! untouched, store time continuous across reboots and on the machine's
//! boot clock, a network filesystem refused, a real fork, group commit
//! (atomic per transaction, visible on return), a settle batch's reads
//! in chunks of ids, and what a closing handle leaves in the WAL.

#![allow(clippy::disallowed_methods)] // real threads in the group commit test

use leasehold::core::{self};
use leasehold::store::network_fs;
use leasehold::store::sqlite::{SCAN_SQL, SCHEMA_VERSION};
use leasehold::{
    Client, Error, Holder, HolderId, JobSpec, JobState, ManualClock, QueuePolicy, SqliteOptions,
    SqliteStore, StoreExt,
};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

#[path = "support/dir.rs"]
mod dir;
use dir::Dir;

/// Schema v15 undone: one partial index per state again instead of the
/// bands.
const UNDO_V15: &str = "
DROP INDEX jobs_bands;
ALTER TABLE jobs DROP COLUMN band_k2;
ALTER TABLE jobs DROP COLUMN band_k1;
ALTER TABLE jobs DROP COLUMN band;
CREATE INDEX jobs_ready ON jobs (queue, parked, priority DESC, run_at, id) WHERE state = 0;
CREATE INDEX jobs_scheduled ON jobs (queue, run_at, id) WHERE state = 1;
CREATE INDEX jobs_running ON jobs (queue, lease_until, id) WHERE state = 2;
CREATE INDEX jobs_finished ON jobs (queue, finished_at, id, state) WHERE state >= 3 AND state <= 5;
CREATE INDEX jobs_waiting ON jobs (queue, id) WHERE state = 6;
PRAGMA user_version = 14;
";

/// Schema v14 undone: the lease heads and slots back in their own tables
/// (the tests of older versions start from a v13 database).
const UNDO_V14: &str = "
CREATE TABLE leases (key TEXT PRIMARY KEY, last_token INTEGER NOT NULL,
    lease_limit INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE TABLE lease_slots (key TEXT NOT NULL, token INTEGER NOT NULL, holder BLOB NOT NULL,
    label TEXT, expires_at INTEGER NOT NULL, PRIMARY KEY (key, token)) WITHOUT ROWID;
INSERT INTO leases SELECT key, last_token, lease_limit FROM lease_rows WHERE token = -1;
INSERT INTO lease_slots SELECT key, token, holder, label, expires_at FROM lease_rows WHERE token >= 0;
DROP TABLE lease_rows;
PRAGMA user_version = 13;
";

/// The database at `d` taken back to an older schema ([`UNDO_V15`],
/// [`UNDO_V14`], then
/// `older`, which sets the version it leaves), then opened again: the
/// store, once opening has migrated it to the current version.
fn reopened_from_older(d: &Dir, clock: &ManualClock, older: &str) -> SqliteStore {
    let conn = rusqlite::Connection::open(d.db()).unwrap();
    conn.execute_batch(UNDO_V15).unwrap();
    conn.execute_batch(UNDO_V14).unwrap();
    conn.execute_batch(older).unwrap();
    drop(conn);
    let store = SqliteStore::open_with(d.db(), opts(clock, "b")).unwrap();
    let v: i64 = rusqlite::Connection::open(d.db())
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    store
}

fn opts(clock: &ManualClock, boot: &str) -> SqliteOptions {
    SqliteOptions {
        clock: Some(Arc::new(clock.clone())),
        boot_id: Some(boot.into()),
        ..SqliteOptions::default()
    }
}

fn open_err(path: &Path) -> String {
    match SqliteStore::open(path) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => {
            assert!(matches!(e, Error::Store { .. }), "{e:?}");
            let text = e.to_string();
            assert!(
                text.contains(&path.display().to_string()),
                "names the file: {text}"
            );
            text
        }
    }
}

/// A transaction takes job ids from the counter in blocks that double
/// (1, 2, 4, ... up to 1,024) and gives back what it did not use when it
/// ends: 1,000 jobs in one push leave the counter at their last id, so ids
/// stay dense (as the simulator's reference model has them), and a single
/// push takes one.
#[test]
fn a_batch_push_takes_its_ids_in_blocks_and_gives_back_the_rest() {
    let d = Dir::new("idblocks");
    let q = Client::new(SqliteStore::open(d.db()).unwrap())
        .queue("q")
        .unwrap();
    let counter = || -> u64 {
        let conn = rusqlite::Connection::open(d.db()).unwrap();
        let v: String = conn
            .query_row(
                "SELECT value FROM leasehold_meta WHERE name = 'last_job_id'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        v.parse().unwrap()
    };
    let first = q.push(&JobSpec::new("one")).unwrap().id.0;
    assert_eq!(counter(), first, "a push takes one id");
    let specs: Vec<JobSpec> = (0..1_000).map(|i| JobSpec::new(i.to_string())).collect();
    let ids: Vec<u64> = q
        .push_many(&specs)
        .unwrap()
        .iter()
        .map(|o| o.id.0)
        .collect();
    let expected: Vec<u64> = (first + 1..=first + 1_000).collect();
    assert_eq!(ids, expected);
    assert_eq!(counter(), first + 1_000, "the 23 ids not used went back");
    let next = q.push(&JobSpec::new("after")).unwrap().id.0;
    assert_eq!(next, first + 1_001);
}

#[test]
fn wal_is_on_and_scans_use_their_index_in_order() {
    let d = Dir::new("plan");
    let store = SqliteStore::open(d.db()).unwrap();
    let p = QueuePolicy::default();
    store
        .txn(|tx| core::job::enqueue(tx, "q", &JobSpec::new("x"), &p))
        .unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(d.db()).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let expected = [
        "jobs_bands",
        "jobs_bands",
        "jobs_bands",
        "jobs_bands",
        "jobs_retrying",
        "jobs_parked",
        "jobs_parked",
    ];
    assert_eq!(SCAN_SQL.len(), expected.len());
    for (sql, index) in SCAN_SQL.iter().zip(expected) {
        let sql = sql
            .replace("{queue}", "'q'")
            .replace("{limit}", "10")
            .replace("{cols}", "*")
            .replace("?1", "'k'");
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let plan: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let plan = plan.join(" | ");
        assert!(plan.contains(index), "{sql}: {plan}");
        assert!(!plan.contains("TEMP B-TREE"), "{sql} sorts: {plan}");
    }
}

#[test]
fn foreign_newer_and_broken_files_are_refused_and_untouched() {
    let d = Dir::new("refuse");
    // Not a database at all.
    let junk = d.0.join("junk.db");
    std::fs::write(
        &junk,
        b"this is not a database, just some text that is long enough to matter".repeat(100),
    )
    .unwrap();
    let before = std::fs::read(&junk).unwrap();
    assert!(open_err(&junk).contains("not a SQLite database"));
    assert_eq!(std::fs::read(&junk).unwrap(), before);
    // Someone else's SQLite database.
    let foreign = d.0.join("foreign.db");
    rusqlite::Connection::open(&foreign)
        .unwrap()
        .execute_batch("CREATE TABLE accounts (id INTEGER PRIMARY KEY)")
        .unwrap();
    let before = std::fs::read(&foreign).unwrap();
    assert!(open_err(&foreign).contains("not a leasehold database"));
    assert_eq!(std::fs::read(&foreign).unwrap(), before);
    // Written by a newer leasehold.
    let newer = d.db();
    drop(SqliteStore::open(&newer).unwrap());
    rusqlite::Connection::open(&newer)
        .unwrap()
        .execute_batch(&format!("PRAGMA user_version = {}", SCHEMA_VERSION + 1))
        .unwrap();
    let before = std::fs::read(&newer).unwrap();
    let text = open_err(&newer);
    assert!(text.contains("newer leasehold"), "{text}");
    assert_eq!(std::fs::read(&newer).unwrap(), before);
    // Truncated in the middle of its pages.
    let broken = d.0.join("broken.db");
    {
        let store = SqliteStore::open(&broken).unwrap();
        let p = QueuePolicy::default();
        for i in 0..200 {
            store
                .txn(|tx| core::job::enqueue(tx, "q", &JobSpec::new(vec![i as u8; 300]), &p))
                .unwrap();
        }
    }
    let bytes = std::fs::read(&broken).unwrap();
    std::fs::write(&broken, &bytes[..bytes.len() / 2]).unwrap();
    let result = SqliteStore::open(&broken).and_then(|s| {
        let p = QueuePolicy::default();
        s.txn(|tx| core::job::list(tx, "q", None, leasehold::JobId(0), 1000, &p))
            .map(|_| ())
    });
    let e = result.expect_err("a truncated database must not read back as fine");
    assert!(
        e.to_string().contains("corrupt") || e.to_string().contains("malformed"),
        "{e}"
    );
    // A directory that does not exist.
    let missing = d.0.join("no/such/dir/q.db");
    assert!(open_err(&missing).contains("does not exist"));
}

/// Processes started in a burst on a new file: one creates the schema and
/// no other may see it half made (a version, an application id and the
/// tables read apart once let a racer call the new file foreign).
#[test]
fn a_burst_of_opens_on_a_new_file_all_succeed() {
    for round in 0..60 {
        let d = Dir::new("burst");
        let (path, start) = (d.db(), std::sync::Barrier::new(6));
        let failed: Vec<String> = std::thread::scope(|s| {
            let opens: Vec<_> = (0..6)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        SqliteStore::open(&path).err().map(|e| e.to_string())
                    })
                })
                .collect();
            opens
                .into_iter()
                .filter_map(|h| h.join().unwrap())
                .collect()
        });
        assert!(failed.is_empty(), "round {round}: {failed:?}");
    }
}

#[test]
fn store_time_continues_across_a_reboot() {
    let d = Dir::new("reboot");
    let clock = ManualClock::new(50_000_000);
    let store = SqliteStore::open_with(d.db(), opts(&clock, "boot-a")).unwrap();
    let h = Holder::new(HolderId(1));
    let g = store
        .txn(|tx| core::lease::acquire(tx, "k", &h, 10_000, 1))
        .unwrap();
    let before = store.txn(|tx| Ok(tx.now_ms())).unwrap();
    drop(store);
    // The machine reboots: its boot clock starts again near zero.
    let clock = ManualClock::new(5);
    let store = SqliteStore::open_with(d.db(), opts(&clock, "boot-b")).unwrap();
    let after = store.txn(|tx| Ok(tx.now_ms())).unwrap();
    assert!(
        after > before,
        "store time went back across the reboot: {before} -> {after}"
    );
    // The old holder died with the old boot; its lease runs out in store time.
    let h2 = Holder::new(HolderId(2));
    assert!(matches!(
        store.txn(|tx| core::lease::acquire(tx, "k", &h2, 1000, 1)),
        Err(Error::Held { .. })
    ));
    clock.advance(10_000);
    let g2 = store
        .txn(|tx| core::lease::acquire(tx, "k", &h2, 1000, 1))
        .unwrap();
    assert!(g2.token > g.token);
    // Same boot, a second process: same timeline (no jump).
    let again = SqliteStore::open_with(d.db(), opts(&clock, "boot-b")).unwrap();
    let t = again.txn(|tx| Ok(tx.now_ms())).unwrap();
    assert!(t >= after && t < after + 20_000, "{after} vs {t}");
}

#[test]
fn the_local_disk_is_not_a_network_filesystem() {
    assert_eq!(network_fs(&std::env::temp_dir()), None);
}

#[test]
fn forked_child_gets_forked_and_leaves_the_parents_connection_alone() {
    let d = Dir::new("fork");
    let client = Client::new(SqliteStore::open(d.db()).unwrap());
    let q = client.queue("q").unwrap();
    q.push(&JobSpec::new("x")).unwrap();
    let job = q.claim(Duration::from_secs(30)).unwrap().unwrap();
    let store = client.store().clone();
    // SAFETY: the child only calls leasehold on inherited memory and leaves
    // with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let forked = |r: leasehold::Result<()>| matches!(r, Err(Error::Forked { .. }));
        let mut code = 0;
        if !forked(store.txn(|tx| Ok(tx.now_ms())).map(|_| ())) {
            code = 10;
        }
        if code == 0 && !forked(job.complete()) {
            code = 11;
        }
        if code == 0 && !forked(q.push(&JobSpec::new("y")).map(|_| ())) {
            code = 12;
        }
        // Dropping everything in the child must not close the parent's
        // connection or release its locks.
        drop(job);
        drop(q);
        drop(store);
        drop(client);
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status));
    assert_eq!(libc::WEXITSTATUS(status), 0, "child check failed");
    job.complete().unwrap();
    assert_eq!(q.stats().unwrap().get(JobState::Done), 1);
    q.push(&JobSpec::new("after")).unwrap();
    assert_eq!(q.stats().unwrap().get(JobState::Ready), 1);
}

#[test]
fn a_panicking_transaction_is_rolled_back() {
    let d = Dir::new("panic");
    let store = SqliteStore::open(d.db()).unwrap();
    let h = Holder::new(HolderId(1));
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = store.txn(|tx| {
            core::lease::acquire(tx, "k", &h, 1000, 1)?;
            let p = QueuePolicy::default();
            core::job::enqueue(tx, "q", &JobSpec::new("x"), &p)?;
            panic!("the closure panics after writing");
            #[allow(unreachable_code)]
            Ok(())
        });
    }));
    assert!(caught.is_err());
    // The next transaction starts cleanly and sees nothing of the first.
    let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
    assert_eq!((info.last_token, info.holders.len()), (0, 0));
    let p = QueuePolicy::default();
    assert_eq!(
        store
            .txn(|tx| core::job::stats(tx, "q", &p))
            .unwrap()
            .total(),
        0
    );
}

/// Group commit: threads sharing a handle have their transactions carried
/// by fewer COMMITs, yet each stays all-or-nothing (S1), including one
/// that panics, and each caller returns only once its writes are visible
/// to another connection.
#[test]
fn group_commit_keeps_every_transaction_atomic_and_visible_on_return() {
    let dir = Dir::new("group");
    let store = Arc::new(SqliteStore::open(dir.db()).unwrap());
    const THREADS: usize = 8;
    const TXNS: usize = 120;
    let fate = |i: usize| match i % 10 {
        3 | 6 => "fail",
        7 => "panic",
        _ => "commit",
    };
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (store, path) = (store.clone(), dir.db());
            std::thread::spawn(move || {
                let observer = SqliteStore::open(&path).unwrap();
                for i in 0..TXNS {
                    let key = format!("k{t}-{i}");
                    let holder = Holder::new(HolderId(t as u128 + 1));
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        store.txn(|tx| {
                            core::lease::acquire(tx, &key, &holder, 60_000, 1)?;
                            match fate(i) {
                                "fail" => Err(Error::invalid(
                                    leasehold::Field::Reason,
                                    "fails on purpose",
                                )),
                                "panic" => panic!("panics on purpose"),
                                _ => Ok(()),
                            }
                        })
                    }));
                    match (fate(i), run) {
                        ("commit", Ok(Ok(()))) => {
                            let seen = observer.txn(|tx| core::lease::inspect(tx, &key)).unwrap();
                            assert_eq!(seen.last_token, 1, "{key} not visible on return");
                        }
                        ("fail", Ok(Err(Error::Invalid { .. }))) | ("panic", Err(_)) => {}
                        (f, other) => panic!("{key} ({f}): {:?}", other.map(|r| r.err())),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for t in 0..THREADS {
        for i in 0..TXNS {
            let key = format!("k{t}-{i}");
            let info = store.txn(|tx| core::lease::inspect(tx, &key)).unwrap();
            let want = u64::from(fate(i) == "commit");
            assert_eq!(info.last_token, want, "{key} ({})", fate(i));
        }
    }
    let (txns, commits) = store.group_stats();
    assert!(
        commits < txns,
        "no transactions were grouped: {txns} transactions, {commits} commits"
    );
}

/// Every job of a queue as the listings show it: the counts, then each
/// state's page of ids in its listing order.
fn jobs_by_state(store: &SqliteStore, queue: &str) -> Vec<(JobState, u64, Vec<u64>)> {
    let p = QueuePolicy::default();
    let counts = store.txn(|tx| core::job::stats(tx, queue, &p)).unwrap();
    JobState::ALL
        .iter()
        .map(|&state| {
            let page = store
                .txn(|tx| core::job::page(tx, queue, state, None, 50, 0, &p))
                .unwrap();
            (
                state,
                counts.get(state),
                page.iter().map(|j| j.job.id.0).collect(),
            )
        })
        .collect()
}

/// A database of schema version 14 (one partial index per state) gains
/// the bands in place: every job keeps its state and its place in its
/// state's order, counts and listings read the same, and claims go on in
/// claim order (priority first) from the new index.
#[test]
fn a_version_14_database_moves_its_jobs_into_the_bands() {
    let d = Dir::new("v14");
    let clock = ManualClock::new(1_000);
    let p = QueuePolicy::default();
    let holder = HolderId(7);
    let before = {
        let store = SqliteStore::open_with(d.db(), opts(&clock, "b")).unwrap();
        let push = |spec: JobSpec| {
            store
                .txn(|tx| core::job::enqueue(tx, "q", &spec, &p))
                .unwrap()
                .id
        };
        for max_attempts in [3, 1, 3] {
            push(JobSpec {
                max_attempts,
                ..JobSpec::new("x")
            });
        }
        let claimed = store
            .txn(|tx| core::job::claim(tx, "q", holder, 30_000, 3, &p))
            .unwrap();
        let token = |i: usize| claimed[i].claim.unwrap().token;
        store
            .txn(|tx| core::job::complete(tx, claimed[2].id, holder, token(2)))
            .unwrap();
        clock.advance(5);
        let last_try = store
            .txn(|tx| core::job::fail(tx, claimed[1].id, holder, token(1), "boom", &p))
            .unwrap();
        assert_eq!(last_try, JobState::Dead);
        let cancelled = push(JobSpec::new("x"));
        store
            .txn(|tx| core::job::cancel(tx, cancelled, &p))
            .unwrap();
        let later = push(JobSpec {
            delay_ms: 60_000,
            ..JobSpec::new("x")
        });
        push(JobSpec {
            after: vec![later],
            ..JobSpec::new("x")
        });
        for priority in [1, 5, 5] {
            push(JobSpec {
                priority,
                ..JobSpec::new("x")
            });
        }
        jobs_by_state(&store, "q")
    };
    assert!(
        before
            .iter()
            .all(|(_, n, ids)| *n > 0 && ids.len() as u64 == *n),
        "{before:?}"
    );
    let conn = rusqlite::Connection::open(d.db()).unwrap();
    conn.execute_batch(UNDO_V15).unwrap();
    drop(conn);
    let store = SqliteStore::open_with(d.db(), opts(&clock, "b")).unwrap();
    let conn = rusqlite::Connection::open(d.db()).unwrap();
    let (version, bands): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT user_version FROM pragma_user_version),
                    (SELECT count(*) FROM sqlite_master WHERE name = 'jobs_bands')",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((version, bands), (SCHEMA_VERSION, 1));
    assert_eq!(jobs_by_state(&store, "q"), before);
    let ready = &before.iter().find(|b| b.0 == JobState::Ready).unwrap().2;
    let claimed: Vec<u64> = store
        .txn(|tx| core::job::claim(tx, "q", holder, 30_000, 5, &p))
        .unwrap()
        .iter()
        .map(|j| j.id.0)
        .collect();
    assert_eq!(&claimed, ready);
    assert_eq!(claimed.len(), 3);
    let names = store.txn(|tx| core::job::queues(tx, "", 10)).unwrap();
    assert_eq!(names, ["q"]);
}

/// A database of schema version 13 (a lease's head and its slots in two
/// tables) moves them into one in place: held slots, their holders and
/// expiries, a released key's token floor and a counting lease's limit
/// all survive, grants go on above the floor, and the listing and the
/// migration's export see the same keys as before.
#[test]
fn a_version_13_database_keeps_its_leases_in_one_table() {
    let d = Dir::new("v13");
    let clock = ManualClock::new(1_000);
    let (h1, h2) = (Holder::new(HolderId(1)), Holder::new(HolderId(2)));
    {
        let store = SqliteStore::open_with(d.db(), opts(&clock, "b")).unwrap();
        for h in [&h1, &h2] {
            store
                .txn(|tx| core::lease::acquire(tx, "counted", h, 10_000, 2))
                .unwrap();
        }
        for _ in 0..3 {
            let grant = store
                .txn(|tx| core::lease::acquire(tx, "released", &h1, 10_000, 1))
                .unwrap();
            store
                .txn(|tx| core::lease::release(tx, "released", h1.id, grant.token))
                .unwrap();
        }
    }
    let store = reopened_from_older(&d, &clock, "");
    let counted = store.txn(|tx| core::lease::inspect(tx, "counted")).unwrap();
    let holders: Vec<(HolderId, u64, u64)> = counted
        .holders
        .iter()
        .map(|h| (h.holder.id, h.token, h.expires_at_ms))
        .collect();
    assert_eq!(
        (counted.last_token, counted.limit, holders),
        (2, 2, vec![(h1.id, 1, 11_000), (h2.id, 2, 11_000)])
    );
    let released = store
        .txn(|tx| core::lease::inspect(tx, "released"))
        .unwrap();
    assert_eq!((released.last_token, released.holders.len()), (3, 0));
    let again = store
        .txn(|tx| core::lease::acquire(tx, "released", &h2, 10_000, 1))
        .unwrap();
    assert_eq!(again.token, 4);
    let page = store.txn(|tx| core::lease::list(tx, "", 10)).unwrap();
    let keys: Vec<&str> = page.leases.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!((keys, page.next), (vec!["counted", "released"], None));
    let mut names = Vec::new();
    store
        .txn(|tx| tx.export_names(core::Exported::LeaseKeys, "", 10, &mut names))
        .unwrap();
    assert_eq!(names, ["counted", "released"]);
}

/// A database of schema version 1 (before a lease's limit was recorded) is
/// upgraded in place, keeping its leases and jobs.
#[test]
fn a_version_1_database_is_upgraded_in_place() {
    let d = Dir::new("v1");
    let clock = ManualClock::new(1_000);
    {
        let store = SqliteStore::open_with(d.db(), opts(&clock, "b")).unwrap();
        let h = Holder::new(HolderId(1));
        store
            .txn(|tx| core::lease::acquire(tx, "k", &h, 10_000, 2))
            .unwrap();
        store
            .txn(|tx| core::job::enqueue(tx, "q", &JobSpec::new("p"), &QueuePolicy::default()))
            .unwrap();
    }
    let store = reopened_from_older(&d, &clock, "DROP INDEX jobs_ready; CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE state = 0; DROP INDEX jobs_parked; ALTER TABLE jobs DROP COLUMN conc_key; ALTER TABLE jobs DROP COLUMN parked; ALTER TABLE jobs DROP COLUMN timeout_ms; ALTER TABLE jobs DROP COLUMN claim_deadline; ALTER TABLE jobs DROP COLUMN progress; ALTER TABLE jobs DROP COLUMN progress_msg; ALTER TABLE jobs DROP COLUMN after_ids; ALTER TABLE jobs DROP COLUMN after_any; ALTER TABLE jobs DROP COLUMN waiting_on; ALTER TABLE jobs DROP COLUMN has_children; DROP TABLE job_deps; DROP INDEX jobs_waiting; DROP INDEX jobs_retrying; ALTER TABLE leases DROP COLUMN lease_limit;
         ALTER TABLE jobs DROP COLUMN result; DROP TABLE rates; DROP INDEX jobs_unique_all; DROP TABLE schedules; DROP TABLE queues; PRAGMA user_version = 1;");
    let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
    assert_eq!((info.last_token, info.limit, info.holders.len()), (1, 0, 1));
    let h2 = Holder::new(HolderId(2));
    store
        .txn(|tx| core::lease::acquire(tx, "k", &h2, 10_000, 2))
        .unwrap();
    assert_eq!(
        store.txn(|tx| core::lease::inspect(tx, "k")).unwrap().limit,
        2
    );
    let counts = store
        .txn(|tx| core::job::stats(tx, "q", &QueuePolicy::default()))
        .unwrap();
    assert_eq!(counts.get(JobState::Ready), 1); // And the queue settings of v5: a pause is kept.
    assert!(store
        .txn(|tx| core::job::set_paused(tx, "q", true))
        .unwrap());
    assert!(
        store
            .txn(|tx| core::job::queue_config(tx, "q"))
            .unwrap()
            .paused
    );
}

/// A database of schema version 3 (before schedules) gains the schedules
/// table in place, keeping its jobs; a schedule then works.
#[test]
fn a_version_3_database_gains_schedules_in_place() {
    use leasehold::core::{schedule, Missed, Rule, ScheduleSpec};
    let d = Dir::new("v3");
    let clock = ManualClock::new(1_000);
    {
        let store = SqliteStore::open_with(d.db(), opts(&clock, "b")).unwrap();
        store
            .txn(|tx| core::job::enqueue(tx, "q", &JobSpec::new("p"), &QueuePolicy::default()))
            .unwrap();
    }
    let store = reopened_from_older(&d, &clock, "DROP INDEX jobs_ready; CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE state = 0; DROP INDEX jobs_parked; ALTER TABLE jobs DROP COLUMN conc_key; ALTER TABLE jobs DROP COLUMN parked; ALTER TABLE jobs DROP COLUMN timeout_ms; ALTER TABLE jobs DROP COLUMN claim_deadline; ALTER TABLE jobs DROP COLUMN progress; ALTER TABLE jobs DROP COLUMN progress_msg; ALTER TABLE jobs DROP COLUMN after_ids; ALTER TABLE jobs DROP COLUMN after_any; ALTER TABLE jobs DROP COLUMN waiting_on; ALTER TABLE jobs DROP COLUMN has_children; DROP TABLE job_deps; DROP INDEX jobs_waiting; DROP TABLE rates; DROP INDEX jobs_unique_all; DROP TABLE schedules; DROP TABLE queues; PRAGMA user_version = 3;");
    assert_eq!(SCHEMA_VERSION, 15);
    let spec = ScheduleSpec {
        name: "s".into(),
        rule: Rule::every(60_000),
        job: JobSpec::new("x"),
        missed: Missed::Skip,
    };
    store
        .txn(|tx| schedule::put(tx, "q", &spec, leasehold::WallMs(0)))
        .unwrap();
    assert_eq!(store.txn(|tx| schedule::list(tx, "q")).unwrap().len(), 1);
    let counts = store
        .txn(|tx| core::job::stats(tx, "q", &QueuePolicy::default()))
        .unwrap();
    assert_eq!(counts.get(JobState::Ready), 1);
}

/// A database of schema version 5 (before concurrency limits) gains the
/// key and parked columns and the queues' limits in place: its ready job
/// stays claimable, and a per-key limit then holds.
#[test]
fn a_version_5_database_gains_limits_in_place() {
    let d = Dir::new("v5");
    let clock = ManualClock::new(1_000);
    let policy = QueuePolicy::default();
    {
        let store = SqliteStore::open_with(d.db(), opts(&clock, "b")).unwrap();
        store
            .txn(|tx| core::job::enqueue(tx, "q", &JobSpec::new("old"), &policy))
            .unwrap();
        store
            .txn(|tx| core::job::set_paused(tx, "q", true))
            .unwrap();
    }
    let store = reopened_from_older(&d, &clock, "DROP INDEX jobs_ready; CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE state = 0; DROP INDEX jobs_parked; ALTER TABLE jobs DROP COLUMN conc_key;
         ALTER TABLE jobs DROP COLUMN parked; ALTER TABLE jobs DROP COLUMN timeout_ms; ALTER TABLE jobs DROP COLUMN claim_deadline; ALTER TABLE jobs DROP COLUMN progress; ALTER TABLE jobs DROP COLUMN progress_msg; ALTER TABLE jobs DROP COLUMN after_ids; ALTER TABLE jobs DROP COLUMN after_any; ALTER TABLE jobs DROP COLUMN waiting_on; ALTER TABLE jobs DROP COLUMN has_children; DROP TABLE job_deps; DROP INDEX jobs_waiting; ALTER TABLE queues DROP COLUMN concurrency;
         ALTER TABLE queues DROP COLUMN per_key; DROP TABLE rates; DROP INDEX jobs_unique_all; ALTER TABLE queues DROP COLUMN rate_count;
         ALTER TABLE queues DROP COLUMN rate_ms; ALTER TABLE queues DROP COLUMN key_rate_count;
         ALTER TABLE queues DROP COLUMN key_rate_ms; PRAGMA user_version = 5;");
    let config = store.txn(|tx| core::job::queue_config(tx, "q")).unwrap();
    assert!(config.paused && !config.limits.any(), "{config:?}");
    store
        .txn(|tx| core::job::set_paused(tx, "q", false))
        .unwrap();
    let limits = leasehold::Limits::none().with_per_key(Some(1));
    assert!(store
        .txn(|tx| core::job::set_limits(tx, "q", limits))
        .unwrap());
    for _ in 0..2 {
        let spec = JobSpec {
            key: Some("k".into()),
            ..JobSpec::new("new")
        };
        store
            .txn(|tx| core::job::enqueue(tx, "q", &spec, &policy))
            .unwrap();
    }
    let claimed = store
        .txn(|tx| core::job::claim(tx, "q", HolderId(1), 10_000, 10, &policy))
        .unwrap();
    let payloads: Vec<&[u8]> = claimed.iter().map(|j| &*j.payload).collect();
    assert_eq!(
        payloads,
        [&b"old"[..], b"new"],
        "one job of key k, and the old one"
    );
}

/// The boot-clock rule: an instant handed out less than the persistence
/// interval (1 s) after the last persisted high water is still below store
/// time after a reboot.
#[test]
fn store_time_after_a_reboot_is_above_every_instant_handed_out() {
    let d = Dir::new("reboot-interval");
    let clock = ManualClock::new(50_000_000);
    let store = SqliteStore::open_with(d.db(), opts(&clock, "boot-a")).unwrap();
    // This one persists the high water (50_000_000)...
    assert_eq!(store.txn(|tx| Ok(tx.now_ms())).unwrap(), 50_000_000);
    // ...this one, 999 ms later, does not need to.
    clock.advance(999);
    let h = Holder::new(HolderId(1));
    let g = store
        .txn(|tx| core::lease::acquire(tx, "k", &h, 100, 1))
        .unwrap();
    let last = store.txn(|tx| Ok(tx.now_ms())).unwrap();
    assert_eq!(last, 50_000_999);
    drop(store);
    let clock = ManualClock::new(5);
    let store = SqliteStore::open_with(d.db(), opts(&clock, "boot-b")).unwrap();
    let first = store.txn(|tx| Ok(tx.now_ms())).unwrap();
    assert!(
        first > last,
        "store time went back across the reboot: {last} -> {first}"
    );
    // The grant made just before the reboot survived it.
    let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
    assert_eq!(info.last_token, g.token);
}

fn boot_clock_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) },
        0
    );
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

fn uptime_ms() -> u64 {
    let text = std::fs::read_to_string("/proc/uptime").unwrap();
    let secs: f64 = text.split_whitespace().next().unwrap().parse().unwrap();
    (secs * 1000.0) as u64
}

/// `BootClock` is the machine's boot-time clock: it agrees with
/// `/proc/uptime` (which counts from boot, suspend included).
#[test]
fn boot_clock_agrees_with_proc_uptime() {
    use leasehold::Clock;
    let before = uptime_ms();
    let now = leasehold::BootClock.now_ms();
    let after = uptime_ms();
    // /proc/uptime has 10 ms resolution.
    assert!(
        now + 20 >= before && now <= after + 20,
        "BootClock {now} ms, /proc/uptime {before}..{after} ms"
    );
}

/// A fresh database opened with default options runs on the boot-time
/// clock (not the wall clock, not a per-process monotonic clock).
#[test]
fn default_store_time_is_the_machines_boot_clock() {
    let d = Dir::new("bootclock");
    let store = SqliteStore::open(d.db()).unwrap();
    let before = boot_clock_ms();
    let now = store.txn(|tx| Ok(tx.now_ms())).unwrap();
    let after = boot_clock_ms();
    assert!(
        now + 2_000 >= before && now <= after + 2_000,
        "store time {now} ms, boot clock {before}..{after} ms"
    );
}

/// statfs magic numbers map to the network filesystems they name; local
/// ones to none.
#[test]
fn statfs_magic_numbers_name_network_filesystems() {
    use leasehold::store::network_fs_name;
    for (magic, name) in [
        (0x6969, "NFS"),
        (0x517B, "SMB"),
        (0xFF53_4D42, "CIFS"),
        (0xFE53_4D42, "SMB2"),
        (0x6573_5546, "FUSE"),
        (0x0102_1997, "9P"),
        // A 32-bit target's f_type, sign-extended.
        (0xFF53_4D42_u32 as i32 as i64, "CIFS"),
    ] {
        assert_eq!(network_fs_name(magic), Some(name), "{magic:#x}");
    }
    // ext4, tmpfs, btrfs, xfs.
    for magic in [0xEF53, 0x0102_1994, 0x9123_683E, 0x5846_5342] {
        assert_eq!(network_fs_name(magic), None, "{magic:#x}");
    }
}

/// A database on NFS is refused, naming the filesystem and the directory,
/// and nothing is created; `allow_network_fs` opens it anyway.
#[test]
fn a_network_filesystem_is_refused_unless_allowed() {
    let d = Dir::new("nfs");
    let nfs = SqliteOptions {
        statfs_magic: Some(0x6969),
        ..SqliteOptions::default()
    };
    let e = SqliteStore::open_with(d.db(), nfs.clone()).unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("NFS"), "names the filesystem: {text}");
    assert!(
        text.contains(&d.0.display().to_string()),
        "names the directory: {text}"
    );
    let created: Vec<_> = std::fs::read_dir(&d.0).unwrap().collect();
    assert!(created.is_empty(), "created {created:?}");
    let allowed = SqliteOptions {
        allow_network_fs: true,
        ..nfs
    };
    let store = SqliteStore::open_with(d.db(), allowed).unwrap();
    assert_eq!(
        store
            .txn(|tx| core::lease::inspect(tx, "k"))
            .unwrap()
            .last_token,
        0
    );
}

/// A database of schema version 2 (before jobs kept results) is upgraded
/// in place: its jobs read back without a result, and new ones keep theirs.
#[test]
fn a_version_2_database_is_upgraded_in_place() {
    let d = Dir::new("v2");
    let clock = ManualClock::new(1_000);
    {
        let store = SqliteStore::open_with(d.db(), opts(&clock, "b")).unwrap();
        for _ in 0..2 {
            store
                .txn(|tx| core::job::enqueue(tx, "q", &JobSpec::new("p"), &QueuePolicy::default()))
                .unwrap();
        }
    }
    let store = reopened_from_older(&d, &clock, "DROP INDEX jobs_ready; CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE state = 0; DROP INDEX jobs_parked; ALTER TABLE jobs DROP COLUMN conc_key; ALTER TABLE jobs DROP COLUMN parked; ALTER TABLE jobs DROP COLUMN timeout_ms; ALTER TABLE jobs DROP COLUMN claim_deadline; ALTER TABLE jobs DROP COLUMN progress; ALTER TABLE jobs DROP COLUMN progress_msg; ALTER TABLE jobs DROP COLUMN after_ids; ALTER TABLE jobs DROP COLUMN after_any; ALTER TABLE jobs DROP COLUMN waiting_on; ALTER TABLE jobs DROP COLUMN has_children; DROP TABLE job_deps; DROP INDEX jobs_waiting; ALTER TABLE jobs DROP COLUMN result; DROP TABLE rates; DROP INDEX jobs_unique_all; DROP TABLE schedules; DROP TABLE queues; PRAGMA user_version = 2;");
    let policy = QueuePolicy::default();
    let jobs = store
        .txn(|tx| core::job::claim(tx, "q", HolderId(9), 10_000, 2, &policy))
        .unwrap();
    assert_eq!(jobs.len(), 2);
    assert!(jobs.iter().all(|j| j.result.is_none()));
    let (id, token) = (jobs[0].id, jobs[0].claim.unwrap().token);
    store
        .txn(|tx| core::job::complete_with(tx, id, HolderId(9), token, b"42"))
        .unwrap();
    let job = store.txn(|tx| core::job::get(tx, id, &policy)).unwrap();
    assert_eq!(job.result.as_deref(), Some(&b"42"[..]));
}

/// A settle batch's jobs are read in chunks of ids (8 or 64 to a
/// statement, the rest bound NULL): every width and a remainder, an id
/// given twice and an id that does not exist each get their own answer, in
/// the batch's order.
#[test]
fn a_settle_batch_reads_every_job_across_its_chunks() {
    let dir = Dir::new("settle-chunks");
    let store = SqliteStore::open(dir.db()).unwrap();
    let policy = QueuePolicy::default();
    let holder = HolderId(7);
    for n in [2usize, 5, 8, 9, 64, 65, 130] {
        let queue = format!("q{n}");
        let jobs = store
            .txn(|tx| {
                for _ in 0..n {
                    core::job::enqueue(tx, &queue, &JobSpec::new("x"), &policy)?;
                }
                core::job::claim(tx, &queue, holder, 60_000, n, &policy)
            })
            .unwrap();
        assert_eq!(jobs.len(), n);
        let mut settles: Vec<_> = jobs
            .iter()
            .map(|j| (j.id, j.last_token, core::job::Settle::Complete))
            .collect();
        // The first job again (already recorded: answered Done again), and
        // an id no job has.
        settles.push(settles[0].clone());
        settles.push((leasehold::JobId(1_000_000), 1, core::job::Settle::Complete));
        let states = store
            .txn(|tx| core::job::settle_many(tx, holder, &settles, &policy))
            .unwrap();
        assert_eq!(states.len(), n + 2, "{n} jobs");
        for (i, state) in states[..=n].iter().enumerate() {
            assert_eq!(state.as_ref().ok(), Some(&JobState::Done), "{n} jobs, #{i}");
        }
        assert!(
            matches!(states[n + 1], Err(Error::NotFound(_))),
            "{n} jobs: {:?}",
            states[n + 1]
        );
        let counts = store
            .txn(|tx| core::job::stats(tx, &queue, &policy))
            .unwrap();
        assert_eq!(counts.get(JobState::Done), n as u64, "{n} jobs");
    }
}

/// The size of the database's WAL file (0 if there is none).
fn wal_len(d: &Dir) -> u64 {
    let mut wal = d.db().into_os_string();
    wal.push("-wal");
    std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

/// Jobs in `queue`, read on a connection of its own.
fn job_count(d: &Dir, queue: &str) -> u64 {
    let conn = rusqlite::Connection::open(d.db()).unwrap();
    conn.query_row("SELECT count(*) FROM jobs WHERE queue = ?1", [queue], |r| {
        r.get::<_, i64>(0)
    })
    .unwrap() as u64
}

/// The last handle to close does not checkpoint a small WAL (the
/// checkpoint's fsyncs were most of what a short-lived `leasehold run`
/// waited for), and does checkpoint one past 256 KiB, so a burst of such
/// processes does not leave the next one a long WAL to read. A handle
/// closing while another connection has the database open checkpoints
/// nothing, whatever the WAL's size, and waits for nobody (SQLite's rule:
/// only the last connection does).
#[test]
fn the_last_handle_to_close_checkpoints_only_a_big_wal() {
    let d = Dir::new("walclose");
    {
        let q = Client::new(SqliteStore::open(d.db()).unwrap())
            .queue("small")
            .unwrap();
        q.push(&JobSpec::new("one")).unwrap();
    }
    assert!(wal_len(&d) > 0, "the small WAL was checkpointed at close");
    assert_eq!(job_count(&d, "small"), 1);

    let big: Vec<JobSpec> = (0..100).map(|_| JobSpec::new(vec![7u8; 4096])).collect();
    {
        let q = Client::new(SqliteStore::open(d.db()).unwrap())
            .queue("big")
            .unwrap();
        q.push_many(&big).unwrap();
        assert!(wal_len(&d) > 256 * 1024, "{}", wal_len(&d));
    }
    assert_eq!(wal_len(&d), 0, "the big WAL was left at close");
    assert_eq!(job_count(&d, "big"), 100);

    // Another connection open (a second store handle, idle): closing with
    // a big WAL leaves it to that one.
    let other = SqliteStore::open(d.db()).unwrap();
    {
        let q = Client::new(SqliteStore::open(d.db()).unwrap())
            .queue("beside")
            .unwrap();
        q.push_many(&big).unwrap();
    }
    assert!(
        wal_len(&d) > 256 * 1024,
        "checkpointed beside another handle"
    );
    drop(other);
    assert_eq!(wal_len(&d), 0, "the last handle left a big WAL");
    assert_eq!(job_count(&d, "beside"), 100);

    // A reader holding a snapshot: closing does not wait for it (the busy
    // timeout is a minute).
    let reader = rusqlite::Connection::open(d.db()).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let seen: i64 = reader
        .query_row("SELECT count(*) FROM jobs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seen, 201);
    let opts = SqliteOptions {
        busy_timeout: Duration::from_secs(60),
        ..SqliteOptions::default()
    };
    let closed_in = {
        let q = Client::new(SqliteStore::open_with(d.db(), opts).unwrap())
            .queue("busy")
            .unwrap();
        q.push_many(&big).unwrap();
        let start = std::time::Instant::now();
        drop(q);
        start.elapsed()
    };
    assert!(closed_in < Duration::from_secs(30), "{closed_in:?}");
    assert!(
        wal_len(&d) > 256 * 1024,
        "the WAL was truncated under a reader"
    );
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    assert_eq!(job_count(&d, "busy"), 100);
}
