//! PostgreSQL-specific behaviour, against the server in `LEASEHOLD_TEST_PG`
//! (each test skips with a notice when it is unset): the database clock,
//! migrations raced by many openers and refused when foreign or newer,
//! first grants and claims raced by many threads and handles, a backend
//! terminated under a worker holding a claim, a connection lost inside a
//! transaction (nothing applied, transient) and during COMMIT (ambiguous),
//! LISTEN/NOTIFY wake-ups, a real fork, and the round trips of a batch
//! (counted by a proxy: the same for 1 job as for 64).

#![allow(clippy::disallowed_methods)] // real time, real threads

#[path = "support/pg.rs"]
mod pg;

use leasehold::core::{self, job::Settle};
use leasehold::store::postgres::SCHEMA_VERSION;
use leasehold::{
    Client, Error, Holder, HolderId, JobSpec, JobState, LostReason, ManualClock, PostgresOptions,
    PostgresStore, QueuePolicy, Store, StoreExt, Wake, WorkOptions,
};
use pg::{admin, admin_batch, Schema};
use std::collections::BTreeMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

fn holder(n: u128) -> Holder {
    Holder::new(HolderId(n))
}

fn db_now_ms() -> u64 {
    let rows = admin("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8");
    u64::try_from(rows[0].get::<_, i64>(0)).unwrap()
}

/// Terminate every backend whose application_name is `name`; returns how many.
fn terminate(name: &str) -> i64 {
    let rows = admin(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '{name}'"
    ));
    rows[0].get(0)
}

/// The schema's URL with an application_name to find its backends by.
fn named_url(schema: &Schema, name: &str) -> String {
    format!("{}&application_name={name}", schema.url())
}

#[test]
fn expiry_runs_on_the_database_clock_whatever_the_clients_clocks_say() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("clock");
    let store: Arc<dyn Store> = Arc::new(schema.open(PostgresOptions::default()));
    // Two holders whose own clocks are a day apart.
    let a = Client::builder_shared(store.clone())
        .clock(Arc::new(ManualClock::new(1_000)))
        .build();
    let b = Client::builder_shared(store.clone())
        .clock(Arc::new(ManualClock::new(86_400_000)))
        .build();
    let before = db_now_ms();
    let guard = a.try_acquire("k", Duration::from_millis(400)).unwrap();
    let info = b.inspect("k").unwrap();
    let after = db_now_ms();
    assert!(
        (before..=after).contains(&info.now_ms),
        "store time {} is the database's ({before}..={after})",
        info.now_ms
    );
    let expires = info.holders[0].expires_at_ms;
    assert!(
        (before + 400..=after + 400).contains(&expires),
        "expiry {expires} = database time + ttl"
    );
    assert!(matches!(
        b.try_acquire("k", Duration::from_secs(1)),
        Err(Error::Held { .. })
    ));
    std::thread::sleep(Duration::from_millis(500));
    let taken = b.try_acquire("k", Duration::from_secs(1)).unwrap();
    assert_eq!(
        taken.token(),
        guard.token() + 1,
        "L2: the next grant's token is greater"
    );
    assert!(matches!(
        a.renew("k", guard.token(), Duration::from_secs(1)),
        Err(Error::Lost { .. })
    ));
}

#[test]
fn migrations_raced_by_many_openers_run_once() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("mig");
    let url = schema.url();
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (url, barrier) = (url.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                PostgresStore::open(&url).map(|s| s.describe())
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    let version: String = admin(&format!(
        "SELECT value FROM \"{}\".leasehold_meta WHERE name = 'schema_version'",
        schema.0
    ))[0]
        .get(0);
    assert_eq!(version, SCHEMA_VERSION.to_string());
}

/// A schema at version 1 (before a lease's limit was recorded) is migrated
/// in place, keeping its leases.
#[test]
fn a_version_1_schema_is_migrated_in_place() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("v1");
    let store = PostgresStore::open(&schema.url()).unwrap();
    let h = holder(1);
    store
        .txn(|tx| core::lease::acquire(tx, "k", &h, 60_000, 2))
        .unwrap();
    drop(store);
    admin_batch(&format!(
        "ALTER TABLE \"{s}\".jobs DROP COLUMN conc_key, DROP COLUMN parked, DROP COLUMN timeout_ms, DROP COLUMN claim_deadline, DROP COLUMN progress, DROP COLUMN progress_msg, DROP COLUMN after_ids, DROP COLUMN after_any, DROP COLUMN waiting_on, DROP COLUMN has_children; DROP TABLE \"{s}\".job_deps; DROP INDEX \"{s}\".jobs_waiting;
         CREATE INDEX jobs_ready ON \"{s}\".jobs (queue, priority DESC, run_at, id) WHERE state = 0; DROP INDEX \"{s}\".jobs_retrying; ALTER TABLE \"{s}\".leases DROP COLUMN lease_limit;
         ALTER TABLE \"{s}\".jobs DROP COLUMN result; DROP TABLE \"{s}\".rates; DROP INDEX \"{s}\".jobs_unique_all; DROP TABLE \"{s}\".schedules; DROP TABLE \"{s}\".queues;
         UPDATE \"{s}\".leasehold_meta SET value = '1' WHERE name = 'schema_version'",
        s = schema.0
    ));
    let store = PostgresStore::open(&schema.url()).unwrap();
    let version: String = admin(&format!(
        "SELECT value FROM \"{}\".leasehold_meta WHERE name = 'schema_version'",
        schema.0
    ))[0]
        .get(0);
    assert_eq!(version, SCHEMA_VERSION.to_string());
    let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
    assert_eq!((info.last_token, info.limit, info.holders.len()), (1, 0, 1));
}

/// A schema at version 3 (before schedules) gains the schedules table in
/// place; a schedule then works.
#[test]
fn a_version_3_schema_gains_schedules_in_place() {
    use leasehold::core::{schedule, Missed, Rule, ScheduleSpec};
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("v3");
    drop(PostgresStore::open(&schema.url()).unwrap());
    admin_batch(&format!(
        "ALTER TABLE \"{s}\".jobs DROP COLUMN conc_key, DROP COLUMN parked, DROP COLUMN timeout_ms, DROP COLUMN claim_deadline, DROP COLUMN progress, DROP COLUMN progress_msg, DROP COLUMN after_ids, DROP COLUMN after_any, DROP COLUMN waiting_on, DROP COLUMN has_children; DROP TABLE \"{s}\".job_deps; DROP INDEX \"{s}\".jobs_waiting;
         CREATE INDEX jobs_ready ON \"{s}\".jobs (queue, priority DESC, run_at, id) WHERE state = 0; DROP TABLE \"{s}\".rates; DROP INDEX \"{s}\".jobs_unique_all; DROP TABLE \"{s}\".schedules; DROP TABLE \"{s}\".queues; DROP FUNCTION \"{s}\".push;
         UPDATE \"{s}\".leasehold_meta SET value = '3' WHERE name = 'schema_version'",
        s = schema.0
    ));
    let store = PostgresStore::open(&schema.url()).unwrap();
    let version: String = admin(&format!(
        "SELECT value FROM \"{}\".leasehold_meta WHERE name = 'schema_version'",
        schema.0
    ))[0]
        .get(0);
    assert_eq!((version.as_str(), SCHEMA_VERSION), ("16", 16));
    let spec = ScheduleSpec {
        name: "s".into(),
        rule: Rule::every(60_000),
        job: leasehold::JobSpec::new("x"),
        missed: Missed::Skip,
    };
    store
        .txn(|tx| schedule::put(tx, "q", &spec, leasehold::WallMs(0)))
        .unwrap();
    assert_eq!(store.txn(|tx| schedule::list(tx, "q")).unwrap().len(), 1); // And the queue settings of v5: a pause is kept.
    assert!(store
        .txn(|tx| core::job::set_paused(tx, "q", true))
        .unwrap());
    assert!(
        store
            .txn(|tx| core::job::queue_config(tx, "q"))
            .unwrap()
            .paused
    );
    // And v12's `push` function.
    let rows = admin(&format!("SELECT created FROM \"{}\".push('q')", schema.0));
    assert!(rows[0].get::<_, bool>(0));
}

/// A schema at version 5 (before concurrency limits) gains the key and
/// parked columns and the queues' limits in place: its job stays
/// claimable, its pause is kept, and a per-key limit then holds.
#[test]
fn a_version_5_schema_gains_limits_in_place() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("v5");
    let policy = leasehold::QueuePolicy::default();
    {
        let store = PostgresStore::open(&schema.url()).unwrap();
        store
            .txn(|tx| core::job::enqueue(tx, "q", &leasehold::JobSpec::new("old"), &policy))
            .unwrap();
        store
            .txn(|tx| core::job::set_paused(tx, "q", true))
            .unwrap();
    }
    admin_batch(&format!(
        "ALTER TABLE \"{s}\".jobs DROP COLUMN conc_key, DROP COLUMN parked, DROP COLUMN timeout_ms, DROP COLUMN claim_deadline, DROP COLUMN progress, DROP COLUMN progress_msg, DROP COLUMN after_ids, DROP COLUMN after_any, DROP COLUMN waiting_on, DROP COLUMN has_children; DROP TABLE \"{s}\".job_deps; DROP INDEX \"{s}\".jobs_waiting;
         CREATE INDEX jobs_ready ON \"{s}\".jobs (queue, priority DESC, run_at, id) WHERE state = 0;
         ALTER TABLE \"{s}\".queues DROP COLUMN concurrency, DROP COLUMN per_key, DROP COLUMN rate_count,
           DROP COLUMN rate_ms, DROP COLUMN key_rate_count, DROP COLUMN key_rate_ms;
         DROP TABLE \"{s}\".rates; DROP INDEX \"{s}\".jobs_unique_all;
         UPDATE \"{s}\".leasehold_meta SET value = '5' WHERE name = 'schema_version'",
        s = schema.0
    ));
    let store = PostgresStore::open(&schema.url()).unwrap();
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
        let spec = leasehold::JobSpec {
            key: Some("k".into()),
            ..leasehold::JobSpec::new("new")
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

fn open_err(url: &str) -> String {
    match PostgresStore::open(url) {
        Ok(_) => panic!("{url} opened"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn newer_foreign_and_misnamed_schemas_are_refused_and_left_untouched() {
    if !pg::enabled() {
        return;
    }
    let newer = Schema::new("newer");
    drop(newer.open(PostgresOptions::default()));
    admin(&format!(
        "UPDATE \"{}\".leasehold_meta SET value = '99' WHERE name = 'schema_version'",
        newer.0
    ));
    let text = open_err(&newer.url());
    assert!(text.contains("newer") && text.contains("99"), "{text}");
    let still: String = admin(&format!(
        "SELECT value FROM \"{}\".leasehold_meta WHERE name = 'schema_version'",
        newer.0
    ))[0]
        .get(0);
    assert_eq!(still, "99", "left untouched");

    let foreign = Schema::new("foreign");
    admin_batch(&format!(
        "CREATE SCHEMA \"{0}\"; CREATE TABLE \"{0}\".orders (id int)",
        foreign.0
    ));
    let text = open_err(&foreign.url());
    assert!(text.contains("not a leasehold schema"), "{text}");
    let tables: i64 = admin(&format!(
        "SELECT count(*) FROM pg_tables WHERE schemaname = '{}'",
        foreign.0
    ))[0]
        .get(0);
    assert_eq!(tables, 1, "nothing created beside the foreign table");

    let base = pg::url().unwrap();
    for bad in ["Upper", "1st", "a-b", "x\"; DROP TABLE y; --", ""] {
        let sep = if base.contains('?') { '&' } else { '?' };
        match PostgresStore::open(&format!("{base}{sep}schema={bad}")) {
            Err(Error::Invalid {
                field: leasehold::Field::Schema,
                ..
            }) => {}
            other => panic!("schema {bad:?}: {other:?}"),
        }
    }
    assert!(matches!(
        PostgresStore::open(&format!(
            "{base}{}pool_size=0",
            if base.contains('?') { '&' } else { '?' }
        )),
        Err(Error::Invalid { .. })
    ));
}

/// A store whose round trips `proxy` counts: one connection, on `clock`
/// (an injected clock makes every BEGIN read the marks itself, so counts
/// do not depend on when a session's reading of them runs out).
fn counted_store(
    schema: &Schema,
    proxy: &pg::RoundTrips,
    clock: &Arc<ManualClock>,
) -> PostgresStore {
    let opts = PostgresOptions {
        max_connections: 1,
        clock: Some(clock.clone()),
        ..PostgresOptions::default()
    };
    PostgresStore::open_with(&proxy.url(schema), opts).unwrap()
}

/// A batch push takes its jobs' ids in blocks that double with each round
/// trip: 1,000 jobs cost about log2(1,000) round trips for their ids, not
/// one each, and a one-job push costs what a push does (BEGIN, one id, the
/// writes with COMMIT; an injected clock, as below, keeps the marks' reads
/// out of the count).
#[test]
fn a_batch_push_takes_its_ids_in_doubling_blocks() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("idblocks");
    let proxy = pg::RoundTrips::start();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = counted_store(&schema, &proxy, &clock);
    let q = Client::builder(store)
        .clock(clock)
        .build()
        .queue("q")
        .unwrap();
    let trips = |n: usize| {
        let specs: Vec<JobSpec> = (0..n).map(|i| JobSpec::new(i.to_string())).collect();
        let before = proxy.count();
        let out = q.push_many(&specs).unwrap();
        assert_eq!(out.len(), n);
        proxy.count() - before
    };
    // A session prepares a statement on its first use of it (a round trip,
    // once): the counts are of later uses.
    q.push(&JobSpec::new("warm-up")).unwrap();
    let before = proxy.count();
    q.push(&JobSpec::new("one")).unwrap();
    let push = proxy.count() - before;
    assert_eq!(push, 3, "BEGIN, the id, the writes with COMMIT");
    assert_eq!(trips(1), push);
    // Blocks of 1, 2, 4, ..., 512: ten round trips for 1,000 ids.
    assert_eq!(trips(1_000), push - 1 + 10);
}

/// A batch push locks its unique keys in one order (sorted) before it
/// pushes any, so two batches sharing keys in other orders wait for each
/// other instead of deadlocking: while another session holds key "m", a
/// batch of keys ["z", "m"] waits on "m" holding no lock on "z" (in the
/// batch's own order it would hold "z" while it waits).
#[test]
fn a_batch_push_locks_its_unique_keys_in_one_order() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("keyorder");
    let store = schema.open(PostgresOptions::default());
    let q = Client::new(store).queue("q").unwrap();
    q.push(&JobSpec::new("migrate first")).unwrap();
    let lock_of = |key: &str| {
        format!(
            "pg_advisory_xact_lock(hashtext('\"{}\".' || 'q'), hashtext('{key}'))",
            schema.0
        )
    };
    let mut holder = postgres::Client::connect(&pg::url().unwrap(), postgres::NoTls).unwrap();
    let mut held = holder.transaction().unwrap();
    held.execute(&format!("SELECT {}", lock_of("m")), &[])
        .unwrap();
    let spec = |key: &str| JobSpec {
        unique_key: Some(key.into()),
        ..JobSpec::new(key)
    };
    std::thread::scope(|s| {
        let batch = s.spawn(|| q.push_many(&[spec("z"), spec("m")]));
        // The batch's session waits on "m"...
        let locks = |granted: bool, key: &str| -> i64 {
            admin(&format!(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted = {granted}
                   AND pid <> pg_backend_pid() AND objid::int4 = hashtext('{key}')
                   AND classid::int4 = hashtext('\"{}\".' || 'q')",
                schema.0
            ))[0]
                .get(0)
        };
        let start = Instant::now();
        while locks(false, "m") == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the batch never waited on m"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // ... holding nothing on "z".
        assert_eq!(locks(true, "z"), 0, "the batch locked z before m");
        held.commit().unwrap();
        let out = batch.join().unwrap().unwrap();
        assert!(out.iter().all(|o| o.created));
    });
}

/// A batch costs a fixed number of round trips, whatever its size: BEGIN
/// with the clock, one read (the queue's scans, or every job of the batch
/// at once), the writes with COMMIT. (On the server's clock, a session
/// rereads the migration marks in a fourth round trip once its reading is
/// a few seconds old, whenever that falls: with an injected clock every
/// BEGIN reads them itself, so the count does not depend on timing.)
#[test]
fn a_batch_costs_three_round_trips_whatever_its_size() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("trips");
    let proxy = pg::RoundTrips::start();
    let store = counted_store(&schema, &proxy, &Arc::new(ManualClock::new(1_000_000)));
    let (policy, holder) = (QueuePolicy::default(), HolderId(7));
    let trips = |f: &mut dyn FnMut()| {
        let before = proxy.count();
        f();
        proxy.count() - before
    };
    // A session prepares a statement on its first use of it (a round trip,
    // once): each size runs once before it is counted.
    for (n, counted) in [(1usize, false), (64, false), (1, true), (64, true)] {
        store
            .txn(|tx| {
                for i in 0..n {
                    core::job::enqueue(tx, "q", &JobSpec::new(vec![i as u8]), &policy)?;
                }
                Ok(())
            })
            .unwrap();
        let mut jobs = Vec::new();
        let claim = trips(&mut || {
            jobs = store
                .txn(|tx| core::job::claim(tx, "q", holder, 60_000, n, &policy))
                .unwrap();
        });
        assert_eq!(jobs.len(), n);
        let claims: Vec<_> = jobs.iter().map(|j| (j.id, j.last_token)).collect();
        let beat = trips(&mut || {
            let replies = store
                .txn(|tx| core::job::heartbeat_many(tx, holder, &claims, 60_000))
                .unwrap();
            assert!(replies.iter().all(Result::is_ok));
        });
        let settles: Vec<_> = claims
            .iter()
            .map(|&(id, token)| (id, token, Settle::Complete))
            .collect();
        let settle = trips(&mut || {
            let states = store
                .txn(|tx| core::job::settle_many(tx, holder, &settles, &policy))
                .unwrap();
            assert!(states.iter().all(|s| matches!(s, Ok(JobState::Done))));
        });
        if counted {
            assert_eq!(
                (claim, beat, settle),
                (3, 3, 3),
                "round trips of a claim, a heartbeat round and a settle of {n} jobs"
            );
        }
    }
}

/// Run once, on queue and key `name`, what
/// `the_api_sends_a_one_row_read_with_its_begin` counts: a claim of one, its
/// renewal and completion, claims of 4, 5 and 64 and their settle, and a
/// lease's acquire, renewal and release (a session prepares a statement
/// on its first use of it).
fn warm_up(client: &Client, name: &str) {
    let q = client.queue(name).unwrap();
    for i in 0..75u8 {
        q.push(&JobSpec::new(vec![i])).unwrap();
    }
    let ttl = Duration::from_secs(60);
    let one = q.claim(ttl).unwrap().expect("a job");
    one.heartbeat().unwrap();
    one.complete().unwrap();
    for n in [4, 5, 64] {
        let batch = q.claim_batch(n, ttl).unwrap();
        assert_eq!(batch.len(), n);
        assert!(q.complete_many(&batch).unwrap().iter().all(Result::is_ok));
    }
    for _ in 0..2 {
        let guard = client.try_acquire(name, ttl).unwrap();
        guard.renew().unwrap();
        guard.release().unwrap();
    }
}

/// What users call sends a transaction's first read with its BEGIN when
/// it is one row or a claim of a few ([`FirstRead`]): a job's renewal and
/// completion, and a lease's acquire (of a key with no row yet, and of one
/// with a row), renewal and release, are two round trips each (BEGIN with
/// the clock and the row; the writes with COMMIT), not three; so is a
/// claim of up to four jobs on the server's clock, whose scans run at
/// BEGIN's time (an injected clock's time is not the server's: three). A
/// claim of 64 and a batch settle keep their three (measured slower sent
/// early: BENCHMARKS.md). A hint of a job that is not the one the
/// transaction reads costs the third round trip and changes nothing.
#[test]
fn the_api_sends_a_one_row_read_with_its_begin() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("early");
    let proxy = pg::RoundTrips::start();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = Arc::new(counted_store(&schema, &proxy, &clock));
    let client = Client::builder_shared(store.clone())
        .clock(clock.clone())
        .build();
    let q = client.queue("q").unwrap();
    let trips = |f: &mut dyn FnMut()| {
        let (before, early) = (proxy.count(), store.early_reads());
        f();
        (proxy.count() - before, store.early_reads() - early)
    };
    for i in 0..70u8 {
        q.push(&JobSpec::new(vec![i])).unwrap();
    }
    // A session prepares a statement on its first use of it (a round trip,
    // once): everything counted below runs once before, on other jobs and
    // another key.
    warm_up(&client, "warm-up");
    let mut one = None;
    let claim = trips(&mut || one = q.claim(Duration::from_secs(60)).unwrap());
    let one = one.expect("a job");
    let beat = trips(&mut || assert!(!one.heartbeat().unwrap(), "no cancel asked"));
    let done = trips(&mut || one.complete().unwrap());
    let mut batch = Vec::new();
    let claim_64 = trips(&mut || batch = q.claim_batch(64, Duration::from_secs(60)).unwrap());
    assert_eq!(batch.len(), 64);
    let settle_64 = trips(&mut || {
        let outcomes = q.complete_many(&batch).unwrap();
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    });
    assert_eq!(
        [claim, beat, done, claim_64, settle_64],
        [(3, 0), (2, 1), (2, 1), (3, 0), (3, 0)],
        "(round trips, early reads used) of a claim, a renewal, a completion, \
         a claim of 64 and their settle"
    );

    let mut tokens = Vec::new();
    for key in ["lease-new", "lease-new"] {
        let mut guard = None;
        let acquire =
            trips(&mut || guard = Some(client.try_acquire(key, Duration::from_secs(60)).unwrap()));
        let renew = trips(&mut || guard.as_ref().unwrap().renew().unwrap());
        tokens.push(guard.as_ref().unwrap().token());
        let release = trips(&mut || guard.take().unwrap().release().unwrap());
        assert_eq!(
            [acquire, renew, release],
            [(2, 1); 3],
            "{key}: acquire, renew, release"
        );
    }
    assert!(tokens[1] > tokens[0], "tokens grow: {tokens:?}");

    // A hint that misses: job `one` read early, `two` completed (once
    // before on another job, for the statement the miss reads with).
    let policy = QueuePolicy::default();
    let holder = client.holder().id;
    let ids = [one.id()];
    let mut missed = (0, 0);
    for _ in 0..2 {
        let two = q.claim(Duration::from_secs(60)).unwrap().expect("a job");
        let token = two.token();
        missed = trips(&mut || {
            store
                .txn_reading("complete", Some(leasehold::FirstRead::Jobs(&ids)), |tx| {
                    core::job::settle_many(
                        tx,
                        holder,
                        &[(two.id(), token, Settle::Complete)],
                        &policy,
                    )
                })
                .unwrap()
                .into_iter()
                .for_each(|s| assert_eq!(s.unwrap(), JobState::Done));
        });
    }
    assert_eq!(missed, (3, 1));
    assert_eq!(client.job(one.id()).unwrap().state, JobState::Done);

    // On the server's clock, claims go early too.
    let served = Arc::new(PostgresStore::open(&proxy.url(&schema)).unwrap());
    let trips = |f: &mut dyn FnMut()| {
        let (before, early) = (proxy.count(), served.early_reads());
        f();
        (proxy.count() - before, served.early_reads() - early)
    };
    let policy = QueuePolicy {
        backoff_base_ms: 30,
        backoff_max_ms: 30,
        ..QueuePolicy::default()
    };
    let client = Client::builder_shared(served.clone())
        .policy(policy)
        .build();
    let q = client.queue("server-clock").unwrap();
    for i in 0..10u8 {
        q.push(&JobSpec::new(vec![i])).unwrap();
    }
    warm_up(&client, "server-clock-warm-up");
    let mut job = None;
    let claim = trips(&mut || job = q.claim(Duration::from_secs(60)).unwrap());
    let job = job.expect("a ready job");
    let done = trips(&mut || job.complete().unwrap());
    let mut four = Vec::new();
    let claim_4 = trips(&mut || four = q.claim_batch(4, Duration::from_secs(60)).unwrap());
    let mut five = Vec::new();
    let claim_5 = trips(&mut || five = q.claim_batch(5, Duration::from_secs(60)).unwrap());
    assert_eq!((four.len(), five.len()), (4, 5));
    assert_eq!(
        [claim, done, claim_4, claim_5],
        [(2, 1), (2, 1), (2, 1), (3, 0)],
        "(round trips, early reads used) of a claim, its completion, a claim of 4 and one of 5"
    );

    // What an early claim reads is what the scans read: a job whose claim
    // expired comes back to the next claim (its attempt counted), a
    // failed one once its backoff is due, each with its next token.
    let q = client.queue("early-scans").unwrap();
    q.push(&JobSpec::new("expires")).unwrap();
    let first = q.claim(Duration::from_millis(50)).unwrap().expect("a job");
    std::thread::sleep(Duration::from_millis(120));
    let mut again = None;
    let reclaim = trips(&mut || again = q.claim(Duration::from_secs(60)).unwrap());
    let again = again.expect("the expired job");
    // (An expiry reads more after the scans: the early read saves one.)
    assert_eq!(reclaim.1, 1, "the scans read with BEGIN: {reclaim:?}");
    assert_eq!((again.id(), again.attempt()), (first.id(), 2));
    assert!(again.token() > first.token());
    assert_eq!(again.fail("once more").unwrap(), JobState::Scheduled);
    std::thread::sleep(Duration::from_millis(100));
    let mut due = None;
    let due_claim = trips(&mut || due = q.claim(Duration::from_secs(60)).unwrap());
    let due = due.expect("the retried job, due");
    assert_eq!(due_claim.1, 1, "the scans read with BEGIN: {due_claim:?}");
    assert_eq!((due.id(), due.attempt()), (first.id(), 3));
    assert!(due.token() > again.token());
    due.complete().unwrap();
    assert!(q.claim(Duration::from_secs(60)).unwrap().is_none());
    assert_eq!(client.job(first.id()).unwrap().state, JobState::Done);
}

/// A batch's writes carry text and bytes inside array literals: hostile
/// reasons come back exactly as given.
#[test]
fn a_settled_batch_keeps_hostile_reasons_exactly() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("reasons");
    let store = schema.open(PostgresOptions::default());
    let (policy, holder) = (QueuePolicy::default(), HolderId(3));
    let reasons = [
        r#"it's "quoted", with {braces} and a \ backslash"#,
        "NULL",
        "",
        " spaced ",
        r"ünïcødé ✓ \x00ff",
        "line\nbreak\ttab",
    ];
    store
        .txn(|tx| {
            for _ in reasons {
                core::job::enqueue(tx, "q", &JobSpec::new("p"), &policy)?;
            }
            Ok(())
        })
        .unwrap();
    let jobs = store
        .txn(|tx| core::job::claim(tx, "q", holder, 60_000, reasons.len(), &policy))
        .unwrap();
    let settles: Vec<_> = jobs
        .iter()
        .zip(reasons)
        .map(|(j, r)| (j.id, j.last_token, Settle::Fail(r.to_owned())))
        .collect();
    let states = store
        .txn(|tx| core::job::settle_many(tx, holder, &settles, &policy))
        .unwrap();
    assert!(
        states.iter().all(|s| matches!(s, Ok(JobState::Scheduled))),
        "{states:?}"
    );
    for (job, reason) in jobs.iter().zip(reasons) {
        let got = store.txn(|tx| core::job::get(tx, job.id, &policy)).unwrap();
        assert_eq!(got.last_error.as_deref(), Some(reason));
        assert_eq!(got.claim, None);
    }
}

#[test]
fn first_grants_of_a_new_key_raced_by_16_threads_grant_once() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("race");
    let store: Arc<dyn Store> = Arc::new(schema.open(PostgresOptions::default()));
    for round in 0..10 {
        let key = format!("key-{round}");
        let barrier = Arc::new(Barrier::new(16));
        let handles: Vec<_> = (0..16u128)
            .map(|n| {
                let (store, barrier, key) = (store.clone(), barrier.clone(), key.clone());
                std::thread::spawn(move || {
                    let client = Client::builder_shared(store).holder(holder(n + 1)).build();
                    barrier.wait();
                    client
                        .try_acquire(&key, Duration::from_secs(30))
                        .map(|g| g.detach().1)
                })
            })
            .collect();
        let mut granted = Vec::new();
        for h in handles {
            match h.join().unwrap() {
                Ok(token) => granted.push(token),
                Err(Error::Held { .. }) => {}
                Err(e) => panic!("{key}: {e}"),
            }
        }
        assert_eq!(granted, vec![1], "{key}: exactly one first grant (L1)");
    }
}

#[test]
fn claims_raced_by_threads_and_handles_never_take_a_job_twice() {
    if !pg::enabled() {
        return;
    }
    const JOBS: usize = 300;
    let schema = Schema::new("claims");
    let shared: Arc<dyn Store> = Arc::new(schema.open(PostgresOptions::default()));
    let q = Client::new(shared.clone()).queue("q").unwrap();
    for i in 0..JOBS {
        q.push(&JobSpec::new(i.to_string())).unwrap();
    }
    let seen = Arc::new(Mutex::new(BTreeMap::<u64, usize>::new()));
    let barrier = Arc::new(Barrier::new(8));
    // Four threads share one handle (its pool); four have their own.
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let store: Arc<dyn Store> = if i < 4 {
                shared.clone()
            } else {
                Arc::new(schema.open(PostgresOptions::default()))
            };
            let (seen, barrier) = (seen.clone(), barrier.clone());
            std::thread::spawn(move || {
                let q = Client::new(store).queue("q").unwrap();
                barrier.wait();
                loop {
                    let jobs = q.claim_batch(1 + i % 3, Duration::from_secs(30)).unwrap();
                    if jobs.is_empty() {
                        break;
                    }
                    for job in &jobs {
                        *seen.lock().unwrap().entry(job.id().0).or_default() += 1;
                    }
                    for r in q.complete_many(&jobs).unwrap() {
                        r.unwrap();
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), JOBS, "every job claimed");
    assert!(seen.values().all(|&n| n == 1), "Q1: a job claimed twice");
    let s = q.stats().unwrap();
    assert_eq!(
        (s.get(JobState::Done), s.total()),
        (JOBS as u64, JOBS as u64)
    );
}

#[test]
fn a_terminated_backend_leaves_the_claim_to_expire_then_the_job_is_reclaimed() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("term");
    let name = format!("lh_victim_{}", std::process::id());
    let victim_store = PostgresStore::open(&named_url(&schema, &name)).unwrap();
    // Retry an expired job at once (no backoff), to keep the test short.
    let policy = QueuePolicy {
        backoff_base_ms: 30,
        backoff_max_ms: 30,
        ..QueuePolicy::default()
    };
    let victim = Client::builder(victim_store)
        .policy(policy)
        .build()
        .queue("q")
        .unwrap();
    let other = Client::builder(schema.open(PostgresOptions::default()))
        .policy(policy)
        .build()
        .queue("q")
        .unwrap();
    let id = other.push(&JobSpec::new("payload")).unwrap().id;
    let claimed = victim.claim(Duration::from_secs(1)).unwrap().unwrap();
    assert_eq!((claimed.id(), claimed.token()), (id, 1));
    assert!(terminate(&name) >= 1, "the worker's backend was found");
    // The claim was committed: nobody else gets the job while it lasts.
    assert!(other.claim(Duration::from_secs(5)).unwrap().is_none());
    std::thread::sleep(Duration::from_millis(1200));
    let again = other.claim(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!((again.id(), again.token(), again.attempt()), (id, 2, 2));
    // The victim reconnects, and its stale token is fenced (Q2).
    match claimed.complete() {
        Err(Error::Lost {
            reason: LostReason::StaleToken | LostReason::Expired | LostReason::LocalDeadline,
            ..
        }) => {}
        other => panic!("stale complete: {other:?}"),
    }
    again.complete().unwrap();
    let job = other.get(id).unwrap();
    assert_eq!(
        (job.state, job.attempts, job.expiries),
        (JobState::Done, 2, 1)
    );
}

#[test]
fn a_connection_lost_inside_a_transaction_applies_nothing_and_is_transient() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("lost");
    let name = format!("lh_lost_{}", std::process::id());
    let store = PostgresStore::open(&named_url(&schema, &name)).unwrap();
    let r = store.txn(|tx| {
        let grant = core::lease::acquire(tx, "k", &holder(1), 60_000, 1)?;
        assert!(terminate(&name) >= 1);
        // The next read inside the transaction meets the dead session.
        core::lease::inspect(tx, "probe")?;
        Ok(grant)
    });
    let e = r.unwrap_err();
    assert!(e.is_transient() && !e.is_ambiguous(), "{e:?}");
    // The next transaction reconnects; the lease was never granted (S1).
    let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
    assert!(info.holders.is_empty() && info.last_token == 0, "{info:?}");
    let grant = store
        .txn(|tx| core::lease::acquire(tx, "k", &holder(1), 60_000, 1))
        .unwrap();
    assert_eq!(grant.token, 1);
}

#[test]
fn a_connection_lost_during_commit_is_reported_ambiguous() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("ambig");
    let store = schema.open(PostgresOptions::default());
    // A deferred trigger ends the session while COMMIT runs.
    admin_batch(&format!(
        "CREATE FUNCTION \"{s}\".die() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER die AFTER INSERT OR UPDATE ON \"{s}\".leases
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION \"{s}\".die()",
        s = schema.0
    ));
    let e = store
        .txn(|tx| core::lease::acquire(tx, "k", &holder(1), 60_000, 1))
        .unwrap_err();
    assert!(e.is_ambiguous() && !e.is_transient(), "{e:?}");
    assert!(e.to_string().contains("outcome is unknown"), "{e}");
    admin_batch(&format!("DROP TRIGGER die ON \"{}\".leases", schema.0));
    // The store recovers; the caller must inspect to learn the outcome.
    let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
    assert!(info.last_token <= 1);
}

#[test]
fn notifications_wake_blocked_acquirers_and_idle_workers() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("notify");
    let store = Arc::new(schema.open(PostgresOptions::default()));
    let other: Arc<dyn Store> = Arc::new(schema.open(PostgresOptions::default()));
    // Wait until the listener runs and nothing is happening.
    let settle = |wake: Wake| {
        let start = Instant::now();
        loop {
            let e = store.epoch(wake);
            if !store.wait_epoch(wake, e, Duration::from_millis(300)) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "listener never settled"
            );
        }
    };
    for wake in [Wake::JobReady, Wake::LeaseFreed] {
        settle(wake);
        let epoch = store.epoch(wake);
        let actor = other.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let c = Client::new(actor);
            match wake {
                Wake::JobReady => {
                    c.queue("q").unwrap().push(&JobSpec::new("x")).unwrap();
                }
                Wake::LeaseFreed => {
                    c.try_acquire("k", Duration::from_secs(30))
                        .unwrap()
                        .release()
                        .unwrap();
                }
            }
        });
        let start = Instant::now();
        assert!(
            store.wait_epoch(wake, epoch, Duration::from_secs(20)),
            "{wake:?}: not woken"
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{wake:?}: woken only by the timeout"
        );
        t.join().unwrap();
    }
    // Neither a claim nor an empty one wakes anybody: notifying commits
    // take turns on the server, and a worker whose look raced a claim
    // learns of it by looking again (the tests below).
    let q = Client::new(other.clone()).queue("q").unwrap();
    settle(Wake::JobReady);
    let epoch = store.epoch(Wake::JobReady);
    q.claim(Duration::from_secs(30)).unwrap().unwrap();
    while q.claim(Duration::from_secs(30)).unwrap().is_some() {}
    assert!(q.claim(Duration::from_secs(30)).unwrap().is_none());
    assert!(!store.wait_epoch(Wake::JobReady, epoch, Duration::from_millis(500)));
}

/// `BEGIN` on a session of its own and lock the jobs `filter` picks in
/// `schema` (what another worker's claim does while it runs); the lock
/// goes with the returned session's transaction.
fn lock_jobs(schema: &Schema, filter: &str) -> postgres::Client {
    let url = pg::url().expect("LEASEHOLD_TEST_PG");
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let sql = format!(
        "BEGIN; SELECT id FROM \"{}\".jobs WHERE {filter} FOR UPDATE",
        schema.0
    );
    c.batch_execute(&sql).unwrap();
    c
}

/// What an idle worker reads: a claim of up to 4 jobs, how many it took,
/// and when its empty answer says to look again (the sooner of the
/// queue's next change by time and the relook), with whether the relook
/// said it. (A retry waits an hour: an expired claim's job does not come
/// back during the test, however slow the machine.)
fn look(store: &PostgresStore, queue: &str) -> (usize, Option<u64>, bool) {
    let p = leasehold::QueuePolicy {
        backoff_base_ms: 3_600_000,
        backoff_max_ms: 3_600_000,
        ..leasehold::QueuePolicy::default()
    };
    store
        .txn(|tx| {
            let jobs = core::job::claim(tx, queue, HolderId(9), 30_000, 4, &p)?;
            let look = core::job::next_look(tx, queue)?;
            let sooner = look.change_in_ms.into_iter().chain(look.relook_in_ms).min();
            Ok((jobs.len(), sooner, look.relook_in_ms.is_some()))
        })
        .unwrap()
}

#[test]
fn an_empty_claim_that_passed_over_locked_rows_looks_again_soon() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("skipped");
    let store = schema.open(PostgresOptions::default());
    let c = Client::new(schema.open(PostgresOptions::default()));
    let soon = Some(core::job::OVERLAP_RELOOK_MS);
    // Nothing locked, nothing there: nothing to look for.
    assert_eq!(look(&store, "ready"), (0, None, false));
    // A ready job, a due one (delayed, now past its time) and an expired
    // claim, each held by another open transaction: the claim passes
    // over them and says to look again soon.
    c.queue("ready").unwrap().push(&JobSpec::new("r")).unwrap();
    let delayed = JobSpec {
        delay_ms: 100,
        ..JobSpec::new("d")
    };
    c.queue("due").unwrap().push(&delayed).unwrap();
    let expiring = c.queue("expired").unwrap();
    expiring.push(&JobSpec::new("e")).unwrap();
    std::mem::forget(expiring.claim(Duration::from_millis(100)).unwrap().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    // (A due job and an expired claim show in the plan as past, a ready
    // one through the skipped rows: each says to look again soon.)
    for queue in ["ready", "due", "expired"] {
        let mut other = lock_jobs(&schema, &format!("queue = '{queue}'"));
        let (n, next, relook) = look(&store, queue);
        assert!(
            n == 0 && next.is_some() && next <= soon,
            "{queue}: locked: {n} {next:?}"
        );
        // Each is a relook: a guess the worker may back off, not a due
        // time.
        assert!(relook, "{queue}");
        other.batch_execute("ROLLBACK").unwrap();
        // Let go: the claim takes it (an expired claim goes to its retry).
        let taken = look(&store, queue).0;
        assert_eq!(taken, usize::from(queue != "expired"), "{queue}: unlocked");
    }
    // A claim that came back full says nothing of rows it did not need;
    // one that came back empty with nothing locked says when its claims
    // run out (30 s), not "soon".
    let q = c.queue("ready").unwrap();
    for _ in 0..5 {
        q.push(&JobSpec::new("r")).unwrap();
    }
    let mut other = lock_jobs(&schema, "queue = 'ready' AND state = 0 LIMIT 1");
    let (n, next, relook) = look(&store, "ready");
    assert!(n == 4 && next > Some(10_000) && !relook, "{n} {next:?}");
    other.batch_execute("ROLLBACK").unwrap();
    assert_eq!(look(&store, "ready").0, 1);
    let (n, next, relook) = look(&store, "ready");
    assert!(n == 0 && next > Some(10_000) && !relook, "{n} {next:?}");
}

/// `body` run beside a worker of its own client on queue `q` of `schema`,
/// whose handler records when the last job started; the worker stops
/// however `body` ends, and its report comes back.
fn beside_a_worker(
    schema: &Schema,
    body: impl FnOnce(&Mutex<Option<Instant>>),
) -> leasehold::WorkReport {
    let started = Mutex::new(None);
    let stop = leasehold::StopSignal::new();
    let worker = Client::new(schema.open(PostgresOptions::default()));
    let wq = worker.queue("q").unwrap();
    std::thread::scope(|s| {
        let looping = s.spawn(|| {
            wq.work(&WorkOptions::default(), &stop, |_| {
                *started.lock().unwrap() = Some(Instant::now());
                Ok(())
            })
        });
        struct SetOnDrop<'a>(&'a leasehold::StopSignal);
        impl Drop for SetOnDrop<'_> {
            fn drop(&mut self) {
                self.0.set();
            }
        }
        let stopping = SetOnDrop(&stop);
        body(&started);
        drop(stopping);
        looping.join().unwrap().unwrap()
    })
}

/// When a job started (the worker's record), after waiting up to 10 s.
fn started_by(started: &Mutex<Option<Instant>>, since: Instant) -> Instant {
    while started.lock().unwrap().is_none() && since.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    started.lock().unwrap().expect("never started")
}

#[test]
fn an_idle_worker_starts_a_job_another_transaction_held_when_it_lets_go() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("skipped_worker");
    let c = Client::new(schema.open(PostgresOptions::default()));
    c.queue("q").unwrap().push(&JobSpec::new("held")).unwrap();
    // Held before the worker starts: its push was announced before the
    // worker listened, and its first claims pass over it.
    let mut other = lock_jobs(&schema, "queue = 'q'");
    let report = beside_a_worker(&schema, |started| {
        // Long enough for its first claims however loaded the machine
        // (it would sleep for its backstop after the first if nothing
        // said "look again soon").
        std::thread::sleep(Duration::from_millis(1_500));
        assert!(started.lock().unwrap().is_none(), "ran while held");
        let let_go = Instant::now();
        other.batch_execute("ROLLBACK").unwrap();
        // Far below the 15-30 s backstop it would otherwise sleep for.
        let at = started_by(started, let_go);
        assert!(at - let_go < Duration::from_secs(4), "{:?}", at - let_go);
    });
    assert_eq!(report.completed, 1);
}

#[test]
fn a_delayed_job_starts_on_time_while_another_row_stays_held() {
    // A row held for long makes every empty claim say "look again soon",
    // and the worker backs those looks off to one a second. A delayed job
    // pushed meanwhile still starts when it falls due, not at the next
    // backed-off look (up to a second late before the two hints were
    // told apart).
    if !pg::enabled() {
        return;
    }
    // The row held is a ready job, or one already due (delayed, and past
    // its time: the claim's due scan passes over it).
    for held in ["ready", "due"] {
        held_beside_a_delayed_job(held);
    }
}

fn held_beside_a_delayed_job(held: &str) {
    let schema = Schema::new(&format!("held_{held}_and_delayed"));
    let c = Client::new(schema.open(PostgresOptions::default()));
    let q = c.queue("q").unwrap();
    let delay_ms = if held == "due" { 50 } else { 0 };
    q.push(&JobSpec {
        delay_ms,
        ..JobSpec::new("held")
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(delay_ms * 2));
    let mut other = lock_jobs(&schema, "queue = 'q'");
    let report = beside_a_worker(&schema, |started| {
        // Long enough for the looks to back off to one a second
        // (11 ms four times, then 16 ms doubling: about a second in all).
        std::thread::sleep(Duration::from_millis(2_000));
        let delayed = JobSpec {
            delay_ms: 300,
            ..JobSpec::new("delayed")
        };
        let pushed = Instant::now();
        q.push(&delayed).unwrap();
        // Due 300 ms after the push; the backed-off look came a second
        // after it.
        let at = started_by(started, pushed);
        let late = at - pushed;
        assert!(late < Duration::from_millis(800), "{held}: {late:?}");
    });
    assert_eq!(report.completed, 1);
    other.batch_execute("ROLLBACK").unwrap();
}

#[test]
fn a_forked_child_gets_forked_and_leaves_the_parents_connection_alone() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("fork");
    let store = schema.open(PostgresOptions::default());
    store
        .txn(|tx| core::lease::acquire(tx, "k", &holder(1), 60_000, 1))
        .unwrap();
    // SAFETY: the child only calls async-signal-tolerant code paths of its
    // own (the fork check) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let r = store.txn(|tx| core::lease::release(tx, "k", HolderId(1), 1));
        let ok = matches!(r, Err(Error::Forked { .. }));
        drop(store); // must not close the parent's socket
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child saw no Forked"
    );
    // The parent's pooled connection still works, and the lease is intact.
    let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
    assert_eq!((info.holders.len(), info.last_token), (1, 1));
}

/// A schema at version 2 (before jobs kept results) is migrated in place:
/// its jobs read back without a result, and new ones keep theirs.
#[test]
fn a_version_2_schema_is_migrated_in_place() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("v2");
    let policy = leasehold::QueuePolicy::default();
    let store = PostgresStore::open(&schema.url()).unwrap();
    store
        .txn(|tx| core::job::enqueue(tx, "q", &leasehold::JobSpec::new("p"), &policy))
        .unwrap();
    drop(store);
    admin_batch(&format!(
        "ALTER TABLE \"{s}\".jobs DROP COLUMN conc_key, DROP COLUMN parked, DROP COLUMN timeout_ms, DROP COLUMN claim_deadline, DROP COLUMN progress, DROP COLUMN progress_msg, DROP COLUMN after_ids, DROP COLUMN after_any, DROP COLUMN waiting_on, DROP COLUMN has_children; DROP TABLE \"{s}\".job_deps; DROP INDEX \"{s}\".jobs_waiting;
         CREATE INDEX jobs_ready ON \"{s}\".jobs (queue, priority DESC, run_at, id) WHERE state = 0; ALTER TABLE \"{s}\".jobs DROP COLUMN result; DROP TABLE \"{s}\".rates; DROP INDEX \"{s}\".jobs_unique_all; DROP TABLE \"{s}\".schedules; DROP TABLE \"{s}\".queues;
         UPDATE \"{s}\".leasehold_meta SET value = '2' WHERE name = 'schema_version'",
        s = schema.0
    ));
    let store = PostgresStore::open(&schema.url()).unwrap();
    let version: String = admin(&format!(
        "SELECT value FROM \"{}\".leasehold_meta WHERE name = 'schema_version'",
        schema.0
    ))[0]
        .get(0);
    assert_eq!(version, SCHEMA_VERSION.to_string());
    let h = leasehold::HolderId(9);
    let jobs = store
        .txn(|tx| core::job::claim(tx, "q", h, 10_000, 1, &policy))
        .unwrap();
    assert!(jobs[0].result.is_none());
    let (id, token) = (jobs[0].id, jobs[0].claim.unwrap().token);
    store
        .txn(|tx| core::job::complete_with(tx, id, h, token, b"42"))
        .unwrap();
    let job = store.txn(|tx| core::job::get(tx, id, &policy)).unwrap();
    assert_eq!(job.result.as_deref(), Some(&b"42"[..]));
}

/// U1 on a store whose transactions run side by side: threads pushing one
/// unique key at the same moment create exactly one job (the key's
/// advisory lock replaced the unique index when several live jobs could
/// share a key), with the default states and with a period; 100 keys,
/// each raced by 4 threads released together.
#[test]
fn concurrent_pushes_of_one_unique_key_create_one_job() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("unique_race");
    let store: Arc<dyn Store> = Arc::new(PostgresStore::open(&schema.url()).unwrap());
    const KEYS: usize = 100;
    let created: Vec<std::sync::atomic::AtomicUsize> =
        (0..KEYS).map(|_| Default::default()).collect();
    let barrier = Barrier::new(4);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for (i, count) in created.iter().enumerate() {
                    let spec = JobSpec {
                        unique_key: Some(format!("k{i}")),
                        unique_for: (i % 2 == 1).then_some(Duration::from_secs(3600)),
                        ..JobSpec::new("x")
                    };
                    barrier.wait();
                    let out = store
                        .txn(|tx| core::job::enqueue(tx, "q", &spec, &QueuePolicy::default()))
                        .unwrap();
                    if out.created {
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            });
        }
    });
    let counts: Vec<usize> = created
        .iter()
        .map(|c| c.load(std::sync::atomic::Ordering::SeqCst))
        .collect();
    assert!(
        counts.iter().all(|&n| n == 1),
        "jobs created per key: {counts:?}"
    );
}

/// A schema upgraded past version 12 gets this build's SQL `push` again
/// (its rules: limits, state codes), not only a schema created new.
#[test]
fn an_upgraded_schema_gets_this_builds_push_function() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("v13");
    drop(PostgresStore::open(&schema.url()).unwrap());
    admin_batch(&format!(
        "DROP FUNCTION \"{s}\".push;
         ALTER TABLE \"{s}\".jobs DROP COLUMN after_ids, DROP COLUMN after_any, DROP COLUMN waiting_on, DROP COLUMN has_children;
         DROP TABLE \"{s}\".job_deps; DROP INDEX \"{s}\".jobs_waiting;
         UPDATE \"{s}\".leasehold_meta SET value = '13' WHERE name = 'schema_version'",
        s = schema.0
    ));
    drop(PostgresStore::open(&schema.url()).unwrap());
    let rows = admin(&format!(
        "SELECT created FROM \"{}\".push('q', unique_key => 'k', unique_states => 'waiting')",
        schema.0
    ));
    assert!(
        rows[0].get::<_, bool>(0),
        "the function knows the waiting state"
    );
}

/// A worker's sessions plan their batch statements (the read of a batch of
/// jobs, the many-row UPDATE) for the batch and the table as they are, not
/// once for the session: a session that settled batches while `jobs` was
/// small (PostgreSQL then caches a plan that scans the whole table, from a
/// prepared statement's sixth run) still reads a batch by its ids after the
/// table has grown. Measured by the table's sequential reads
/// (`seq_tup_read`, flushed when the sessions end): on the cached plan each
/// batch read and UPDATE after the growth read every row.
#[test]
fn batches_after_the_table_grew_still_read_by_id() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("plans");
    let store: Arc<dyn Store> = Arc::new(schema.open(PostgresOptions::default()));
    let q = Client::builder_shared(store).build().queue("q").unwrap();
    let lease = Duration::from_secs(60);
    let specs = |n: usize| -> Vec<JobSpec> { (0..n).map(|_| JobSpec::new(vec![1])).collect() };
    let settle_rounds = |batch: usize, rounds: usize| {
        for _ in 0..rounds {
            let jobs = q.claim_batch(batch, lease).unwrap();
            assert_eq!(jobs.len(), batch);
            for r in q.complete_many(&jobs).unwrap() {
                r.unwrap();
            }
        }
    };
    // Small: ten claim and settle rounds of four jobs on one session.
    q.push_many(&specs(40)).unwrap();
    settle_rounds(4, 10);
    // Grown: 20,000 rows, then four more rounds of 64.
    const GROWN: i64 = 20_000;
    for _ in 0..(GROWN / 1_000) {
        q.push_many(&specs(1_000)).unwrap();
    }
    settle_rounds(64, 4);
    drop(q);
    // Ended sessions flush their counters; wait until every update shows.
    let updates = 2 * (40 + 4 * 64);
    let read_counters = || {
        admin(&format!(
            "SELECT coalesce(n_tup_upd, 0), coalesce(seq_tup_read, 0)
             FROM pg_stat_user_tables WHERE schemaname = '{}' AND relname = 'jobs'",
            schema.0
        ))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (updated, seq_read) = loop {
        let rows = read_counters();
        let (updated, seq_read): (i64, i64) = (rows[0].get(0), rows[0].get(1));
        if updated >= updates || Instant::now() > deadline {
            break (updated, seq_read);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        updated >= updates,
        "counters never showed the updates: {updated}"
    );
    assert!(
        seq_read < GROWN,
        "a batch after the growth scanned the whole table: {seq_read} rows read in sequence"
    );
}

#[test]
fn a_session_that_lost_its_prepared_statements_is_replaced() {
    // Something reset the session (a pooler's `DISCARD ALL`, an operator's
    // `DEALLOCATE ALL`): its prepared statements are gone, and `EXECUTE`
    // of one fails with SQLSTATE 26000. Nothing ran, so the transaction is
    // retried, on a new session that prepares its statements again.
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("dealloc");
    let opts = PostgresOptions {
        max_connections: 1,
        ..PostgresOptions::default()
    };
    let store: Arc<dyn Store> = Arc::new(schema.open(opts));
    let s = &schema.0;
    // The grant of key `reset` forgets the session's statements as it
    // commits (a deferred trigger runs at COMMIT).
    pg::admin_batch(&format!(
        "CREATE FUNCTION \"{s}\".forget() RETURNS trigger LANGUAGE plpgsql AS $f$
           BEGIN EXECUTE 'DEALLOCATE ALL'; RETURN NULL; END $f$;
         CREATE CONSTRAINT TRIGGER forget AFTER INSERT OR UPDATE ON \"{s}\".leases
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.key = 'reset')
           EXECUTE FUNCTION \"{s}\".forget();"
    ));
    let client = Client::builder_shared(store).build();
    let ttl = Duration::from_secs(60);
    client.try_acquire("reset", ttl).unwrap().detach();
    for key in ["after", "again"] {
        let guard = client
            .try_acquire(key, ttl)
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        guard.release().unwrap();
    }
}
