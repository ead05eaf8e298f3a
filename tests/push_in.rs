//! Enqueue in the caller's own PostgreSQL transaction (issue 27 §1), against
//! the server in `LEASEHOLD_TEST_PG` (each test skips with a notice when it
//! is unset): a commit makes the job claimable and wakes idle workers, a
//! rollback or a rolled back savepoint leaves nothing, an open caller
//! transaction blocks no worker, the SQL function `push` follows the
//! enqueue rule (the same specs through both, rows compared), plain SQL
//! with named arguments, bad input refused by name, and the tokio twin.

#![allow(clippy::disallowed_methods)] // real time, real threads

#[path = "support/pg.rs"]
mod pg;

use leasehold::{
    Client, Error, JobId, JobRecord, JobSpec, JobState, MemStore, PostgresOptions, Queue, StateSet,
    Store, Wake,
};
use pg::Schema;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// A connection of the application's own (the test server, no schema).
fn app_db() -> postgres::Client {
    postgres::Client::connect(&pg::url().unwrap(), postgres::NoTls).unwrap()
}

fn setup(tag: &str) -> (Schema, Arc<dyn Store>, Client) {
    let schema = Schema::new(tag);
    let store: Arc<dyn Store> = Arc::new(schema.open(PostgresOptions::default()));
    let client = Client::new(store.clone());
    (schema, store, client)
}

/// Push `spec` into `queue` in a transaction of its own on `db`.
fn push_committed(db: &mut postgres::Client, queue: &Queue, spec: &JobSpec) -> (JobId, bool) {
    let mut tx = db.transaction().unwrap();
    let out = queue.push_in(&mut tx, spec).unwrap();
    tx.commit().unwrap();
    (out.id, out.created)
}

fn total(queue: &Queue) -> u64 {
    queue.stats().unwrap().0.iter().sum()
}

/// Wait until `store`'s listener runs and no wake-up is in flight.
fn settle(store: &Arc<dyn Store>) {
    let start = Instant::now();
    loop {
        let e = store.epoch(Wake::JobReady);
        if !store.wait_epoch(Wake::JobReady, e, Duration::from_millis(300)) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never settled");
    }
}

/// A delayed job pushed in a transaction wakes idle workers too: they
/// sleep until the queue's next change by time, and learn it from the
/// note (before schema version 16, only a ready job sent one).
#[test]
fn a_delayed_job_pushed_in_a_transaction_wakes_workers_at_the_commit() {
    if !pg::enabled() {
        return;
    }
    let (_schema, store, client) = setup("push_in_delayed");
    let queue = client.queue("mail").unwrap();
    settle(&store);
    let epoch = store.epoch(Wake::JobReady);
    let mut db = app_db();
    let later = JobSpec {
        delay_ms: 60_000,
        ..JobSpec::new("later")
    };
    push_committed(&mut db, &queue, &later);
    assert!(
        store.wait_epoch(Wake::JobReady, epoch, Duration::from_secs(10)),
        "the delayed push woke nobody"
    );
}

#[test]
fn a_job_pushed_in_a_transaction_appears_and_wakes_workers_at_the_commit() {
    if !pg::enabled() {
        return;
    }
    let (_schema, store, client) = setup("push_in_commit");
    let queue = client.queue("mail").unwrap();
    settle(&store);
    let epoch = store.epoch(Wake::JobReady);
    let mut db = app_db();
    let mut tx = db.transaction().unwrap();
    tx.execute("CREATE TEMP TABLE orders (id int)", &[])
        .unwrap();
    tx.execute("INSERT INTO orders VALUES (42)", &[]).unwrap();
    let out = queue.push_in(&mut tx, &JobSpec::new("order 42")).unwrap();
    assert!(out.created);
    // Not before the commit: not claimable, nobody woken.
    assert!(queue.claim(Duration::from_secs(30)).unwrap().is_none());
    assert!(matches!(queue.get(out.id), Err(Error::NotFound(_))));
    assert!(
        !store.wait_epoch(Wake::JobReady, epoch, Duration::from_millis(500)),
        "woken before the commit"
    );
    tx.commit().unwrap();
    let start = Instant::now();
    assert!(
        store.wait_epoch(Wake::JobReady, epoch, Duration::from_secs(20)),
        "the commit woke nobody"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "woken by a timeout"
    );
    let job = queue.claim(Duration::from_secs(30)).unwrap().unwrap();
    assert_eq!((job.id(), job.payload()), (out.id, &b"order 42"[..]));
    job.complete().unwrap();

    // An idle worker loop with a minute's poll starts a job pushed in a
    // transaction at its commit.
    let (tx_started, started) = std::sync::mpsc::channel();
    let tx_started = std::sync::Mutex::new(tx_started);
    let worker = client.queue("mail").unwrap();
    let opts = leasehold::WorkOptions {
        idle_poll: Duration::from_secs(60),
        ..leasehold::WorkOptions::default()
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopper = stop.clone();
    let handle = std::thread::spawn(move || {
        worker.work(&opts, &stopper, move |job: &leasehold::ClaimedJob| {
            let _ = tx_started.lock().unwrap().send((job.id(), Instant::now()));
            Ok(())
        })
    });
    std::thread::sleep(Duration::from_millis(500));
    let mut tx = db.transaction().unwrap();
    let out = queue.push_in(&mut tx, &JobSpec::new("order 43")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let committed = Instant::now();
    tx.commit().unwrap();
    let (id, at) = started.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(id, out.id);
    assert!(at >= committed, "started before its commit");
    assert!(
        at - committed < Duration::from_secs(10),
        "started {:?} after the commit: by the poll, not the commit",
        at - committed
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    handle.join().unwrap().unwrap();
}

#[test]
fn a_rollback_or_a_rolled_back_savepoint_leaves_nothing() {
    if !pg::enabled() {
        return;
    }
    let (_schema, _store, client) = setup("push_in_rollback");
    let queue = client.queue("mail").unwrap();
    let mut db = app_db();
    let mut tx = db.transaction().unwrap();
    let gone = queue.push_in(&mut tx, &JobSpec::new("x")).unwrap();
    tx.rollback().unwrap();
    assert!(matches!(queue.get(gone.id), Err(Error::NotFound(_))));
    assert_eq!(total(&queue), 0);

    let mut tx = db.transaction().unwrap();
    let kept = queue.push_in(&mut tx, &JobSpec::new("kept")).unwrap();
    let mut sp = tx.transaction().unwrap();
    let dropped = queue
        .push_in(
            &mut sp,
            &JobSpec {
                unique_key: Some("u".into()),
                ..JobSpec::new("in the savepoint")
            },
        )
        .unwrap();
    sp.rollback().unwrap();
    // The key the savepoint pushed is free again in the same transaction.
    let again = queue
        .push_in(
            &mut tx,
            &JobSpec {
                unique_key: Some("u".into()),
                ..JobSpec::new("after the savepoint")
            },
        )
        .unwrap();
    assert!(again.created);
    tx.commit().unwrap();
    assert!(matches!(queue.get(dropped.id), Err(Error::NotFound(_))));
    assert_eq!(&*queue.get(kept.id).unwrap().payload, b"kept");
    assert_eq!(queue.get(again.id).unwrap().state, JobState::Ready);
    assert_eq!(total(&queue), 2);
}

#[test]
fn an_open_caller_transaction_blocks_no_worker_on_other_jobs() {
    if !pg::enabled() {
        return;
    }
    let schema = Schema::new("push_in_locks");
    // Short lock waits: a worker blocked by the caller fails fast.
    let opts = PostgresOptions {
        lock_timeout: Duration::from_millis(500),
        ..PostgresOptions::default()
    };
    let store: Arc<dyn Store> = Arc::new(schema.open(opts));
    let client = Client::builder_shared(store)
        .busy_timeout(Duration::from_secs(2))
        .build();
    let queue = client.queue("mail").unwrap();
    let unique = |k: &str| JobSpec {
        unique_key: Some(k.into()),
        ..JobSpec::new(k)
    };
    let first = queue.push(&unique("u")).unwrap();
    for _ in 0..3 {
        queue.push(&JobSpec::new("before")).unwrap();
    }
    let mut db = app_db();
    let mut tx = db.transaction().unwrap();
    let dup = queue.push_in(&mut tx, &unique("u")).unwrap();
    assert_eq!((dup.id, dup.created), (first.id, false), "duplicate_of");
    let mine = queue.push_in(&mut tx, &unique("v")).unwrap();
    queue.push_in(&mut tx, &JobSpec::new("plain")).unwrap();
    // With the caller's transaction open: claim and settle every committed
    // job (the unique one too), push others, read the queue.
    let start = Instant::now();
    let mut done = 0;
    while let Some(job) = queue.claim(Duration::from_secs(30)).unwrap() {
        assert_ne!(job.id(), mine.id, "claimed before its commit");
        job.complete().unwrap();
        done += 1;
    }
    assert_eq!(done, 4);
    queue.push(&unique("w")).unwrap();
    let job = queue.claim(Duration::from_secs(30)).unwrap().unwrap();
    job.fail("once").unwrap();
    assert!(queue.stats().unwrap().0.iter().sum::<u64>() >= 5);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "workers waited {:?} on the caller's transaction",
        start.elapsed()
    );
    tx.commit().unwrap();
    let mut after = Vec::new();
    while let Some(job) = queue.claim(Duration::from_secs(30)).unwrap() {
        after.push(job.payload().to_vec());
        job.complete().unwrap();
    }
    after.sort();
    assert_eq!(after, [b"plain".to_vec(), b"v".to_vec()]);
}

/// What a push made of a spec, without ids or instants. (A job a push
/// found, not made, waits out a retry's backoff, whose jitter depends on
/// its id: `wait` only for jobs the push made.)
fn shape(job: &JobRecord, made: bool) -> String {
    let wait = match made {
        true => job.run_at_ms - job.created_at_ms,
        false => 0,
    };
    format!(
        "{:?} payload={:?} priority={} max_attempts={} unique={:?} key={:?} timeout={:?} wait={wait}",
        job.state,
        String::from_utf8_lossy(&job.payload),
        job.priority,
        job.max_attempts,
        job.unique_key,
        job.key,
        job.timeout_ms,
    )
}

/// A push, through one path or the other: the job's id and whether the
/// push created it.
type Push<'a> = dyn FnMut(&JobSpec) -> (JobId, bool) + 'a;

/// What a scenario does to a queue before the push it compares.
type Setup<'a> = dyn Fn(&Queue, &mut Push<'_>) + 'a;

/// One scenario, run on a queue through `push` (the rule) and on another
/// through `push_in` (the SQL function): the created flags and the rows.
fn same_through_both(
    client: &Client,
    db: &mut postgres::Client,
    name: &str,
    setup: &Setup<'_>,
    spec: &JobSpec,
) {
    let mut seen = Vec::new();
    for via_sql in [false, true] {
        let queue = client
            .queue(&format!("{name}-{}", if via_sql { "sql" } else { "rule" }))
            .unwrap();
        let mut push = |s: &JobSpec| match via_sql {
            true => push_committed(db, &queue, s),
            false => {
                let out = queue.push(s).unwrap();
                (out.id, out.created)
            }
        };
        setup(&queue, &mut push);
        let ids_before: Vec<JobId> = queue
            .list(None, JobId(0), 100)
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect();
        let (id, created) = push(spec);
        let blocked_by = ids_before.iter().position(|&b| b == id);
        seen.push((created, blocked_by, shape(&queue.get(id).unwrap(), created)));
    }
    assert_eq!(seen[0], seen[1], "{name}: the rule, then the function");
}

#[test]
fn the_sql_function_follows_the_enqueue_rule() {
    if !pg::enabled() {
        return;
    }
    let (_schema, _store, client) = setup("push_in_rule");
    let mut db = app_db();
    let none = |_: &Queue, _: &mut Push<'_>| {};
    let keyed = |k: &str| JobSpec {
        unique_key: Some(k.into()),
        ..JobSpec::new(k)
    };
    same_through_both(&client, &mut db, "plain", &none, &JobSpec::new("x"));
    let full = JobSpec {
        priority: 7,
        max_attempts: 5,
        key: Some("customer-9".into()),
        timeout: Some(Duration::from_secs(30)),
        ..JobSpec::new("full")
    };
    same_through_both(&client, &mut db, "full", &none, &full);
    let delayed = JobSpec {
        delay_ms: 60_000,
        ..JobSpec::new("later")
    };
    same_through_both(&client, &mut db, "delayed", &none, &delayed);
    let past = JobSpec {
        run_at: Some(leasehold::StoreMs(1)),
        ..JobSpec::new("past")
    };
    same_through_both(&client, &mut db, "run-at-past", &none, &past);
    // A live job with the key blocks; a finished one does not.
    let push_one = |_: &Queue, push: &mut Push<'_>| {
        push(&keyed("k"));
    };
    same_through_both(&client, &mut db, "live-dup", &push_one, &keyed("k"));
    // A waiting job with the key is live too.
    let waiting = |q: &Queue, _: &mut Push<'_>| {
        let parent = q.push(&JobSpec::new("parent")).unwrap().id;
        let spec = JobSpec {
            after: vec![parent],
            ..keyed("k")
        };
        assert_eq!(
            q.get(q.push(&spec).unwrap().id).unwrap().state,
            JobState::Waiting
        );
    };
    same_through_both(&client, &mut db, "waiting-dup", &waiting, &keyed("k"));
    let finished = |q: &Queue, push: &mut Push<'_>| {
        push(&keyed("k"));
        q.claim(Duration::from_secs(30))
            .unwrap()
            .unwrap()
            .complete()
            .unwrap();
    };
    same_through_both(&client, &mut db, "finished", &finished, &keyed("k"));
    // With a period, a finished job blocks.
    let hour = JobSpec {
        unique_for: Some(Duration::from_secs(3600)),
        ..keyed("k")
    };
    same_through_both(&client, &mut db, "period", &finished, &hour);
    // States: ready only; a running job does not block.
    let running = |q: &Queue, push: &mut Push<'_>| {
        push(&keyed("k"));
        std::mem::forget(q.claim(Duration::from_secs(30)).unwrap().unwrap());
    };
    let ready_only = JobSpec {
        unique_states: Some(StateSet::of(&[JobState::Ready])),
        ..keyed("k")
    };
    same_through_both(&client, &mut db, "states", &running, &ready_only);
    same_through_both(&client, &mut db, "states-running", &running, &keyed("k"));
    // A claim that ran out: with its attempts spent the job is dead (no
    // block); with attempts left it is a retry (blocks).
    for (attempts, name) in [(1, "stale-dead"), (3, "stale-retry")] {
        let stale = move |q: &Queue, push: &mut Push<'_>| {
            push(&JobSpec {
                max_attempts: attempts,
                ..keyed("k")
            });
            std::mem::forget(q.claim(Duration::from_millis(50)).unwrap().unwrap());
            std::thread::sleep(Duration::from_millis(150));
        };
        same_through_both(&client, &mut db, name, &stale, &keyed("k"));
    }
}

#[test]
fn unique_keys_hold_across_push_and_push_in_raced() {
    if !pg::enabled() {
        return;
    }
    let (_schema, _store, client) = setup("push_in_race");
    const KEYS: usize = 40;
    let created: Vec<std::sync::atomic::AtomicUsize> =
        (0..KEYS).map(|_| Default::default()).collect();
    let barrier = Barrier::new(4);
    std::thread::scope(|s| {
        for t in 0..4 {
            let (client, created, barrier) = (&client, &created, &barrier);
            s.spawn(move || {
                let queue = client.queue("q").unwrap();
                let mut db = app_db();
                for (i, count) in created.iter().enumerate() {
                    let spec = JobSpec {
                        unique_key: Some(format!("k{i}")),
                        ..JobSpec::new("x")
                    };
                    barrier.wait();
                    let made = if t % 2 == 0 {
                        queue.push(&spec).unwrap().created
                    } else {
                        push_committed(&mut db, &queue, &spec).1
                    };
                    if made {
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
    assert!(counts.iter().all(|&n| n == 1), "jobs per key: {counts:?}");
}

#[test]
fn plain_sql_pushes_with_named_arguments() {
    if !pg::enabled() {
        return;
    }
    let (schema, _store, client) = setup("push_in_sql");
    let queue = client.queue("mail").unwrap();
    let mut db = app_db();
    let sql = format!(
        "SELECT id, created FROM {}.push('mail', convert_to('hello', 'UTF8'),
                unique_key => 'order-7', priority => 3)",
        schema.0
    );
    let mut tx = db.transaction().unwrap();
    let row = tx.query_one(&sql, &[]).unwrap();
    tx.commit().unwrap();
    let (id, created): (i64, bool) = (row.get(0), row.get(1));
    assert!(created);
    let row = db.query_one(&sql, &[]).unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, bool>(1)), (id, false));
    let job = queue.claim(Duration::from_secs(30)).unwrap().unwrap();
    assert_eq!(job.id(), JobId(u64::try_from(id).unwrap()));
    assert_eq!(job.payload(), b"hello");
    assert_eq!(queue.get(job.id()).unwrap().priority, 3);
}

#[test]
fn bad_input_is_refused_by_name_and_writes_nothing() {
    if !pg::enabled() {
        return;
    }
    let (schema, _store, client) = setup("push_in_bad");
    let queue = client.queue("q").unwrap();
    let mut db = app_db();
    let s = &schema.0;
    for (call, names) in [
        (format!("{s}.push('')"), "invalid queue"),
        (format!("{s}.push(E'a\\x01b')"), "invalid queue"),
        (
            format!("{s}.push('q', max_attempts => 0)"),
            "invalid max_attempts",
        ),
        (
            format!("{s}.push('q', unique_key => 'k', unique_states => 'ready,finished')"),
            "invalid unique_states",
        ),
        (
            format!("{s}.push('q', unique_for_ms => 10)"),
            "invalid unique_key",
        ),
        (format!("{s}.push('q', delay_ms => -1)"), "invalid delay_ms"),
        (
            format!("{s}.push('q', timeout_ms => 0)"),
            "invalid timeout_ms",
        ),
        (
            format!("{s}.push('q', concurrency_key => '')"),
            "invalid concurrency_key",
        ),
    ] {
        let e = db
            .query_one(&format!("SELECT * FROM {call}"), &[])
            .unwrap_err();
        let shown = e.as_db_error().map(|d| d.message().to_owned());
        assert!(
            shown.as_deref().is_some_and(|m| m.starts_with(names)),
            "{call}: {shown:?}"
        );
    }
    // Through the API: a typed error naming the field, before any SQL.
    let mut tx = db.transaction().unwrap();
    let bad = JobSpec {
        max_attempts: 0,
        ..JobSpec::new("x")
    };
    match queue.push_in(&mut tx, &bad) {
        Err(Error::Invalid { field, .. }) => assert_eq!(field.to_string(), "max_attempts"),
        other => panic!("{other:?}"),
    }
    // Dependencies are not taken (yet) in the caller's transaction.
    let after = JobSpec {
        after: vec![JobId(1)],
        ..JobSpec::new("x")
    };
    match queue.push_in(&mut tx, &after) {
        Err(Error::Invalid { field, .. }) => assert_eq!(field.to_string(), "after"),
        other => panic!("{other:?}"),
    }
    // The transaction is still usable: the check ran before any SQL.
    queue.push_in(&mut tx, &JobSpec::new("ok")).unwrap();
    tx.rollback().unwrap();
    assert_eq!(total(&queue), 0);
    // A store that is not PostgreSQL is named.
    let mem = Client::new(MemStore::new()).queue("q").unwrap();
    let mut tx = db.transaction().unwrap();
    match mem.push_in(&mut tx, &JobSpec::new("x")) {
        Err(Error::Invalid { reason, .. }) => assert!(reason.contains("mem"), "{reason}"),
        other => panic!("{other:?}"),
    }
    drop(tx);
    // A unique push outside READ COMMITTED is refused (its snapshot would
    // predate the key's lock); a plain one is fine.
    let unique = JobSpec {
        unique_key: Some("k".into()),
        ..JobSpec::new("x")
    };
    for (level, name) in [
        (postgres::IsolationLevel::RepeatableRead, "REPEATABLE READ"),
        (postgres::IsolationLevel::Serializable, "SERIALIZABLE"),
    ] {
        let mut tx = db
            .build_transaction()
            .isolation_level(level)
            .start()
            .unwrap();
        queue.push_in(&mut tx, &JobSpec::new("plain")).unwrap();
        let e = queue.push_in(&mut tx, &unique).unwrap_err();
        assert!(e.to_string().contains(name), "{e}");
    }
    assert_eq!(total(&queue), 0, "rolled back");
}

#[test]
fn the_tokio_twin_pushes_in_a_tokio_postgres_transaction() {
    if !pg::enabled() {
        return;
    }
    let (_schema, _store, client) = setup("push_in_tokio");
    let sync_queue = client.queue("mail").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (kept, gone) = rt.block_on(async {
        let queue = leasehold::tokio::Client::new(client.clone())
            .queue("mail")
            .unwrap();
        let (mut db, conn) = tokio_postgres::connect(&pg::url().unwrap(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let tx = db.transaction().await.unwrap();
        let gone = queue.push_in(&tx, &JobSpec::new("gone")).await.unwrap();
        tx.rollback().await.unwrap();
        let tx = db.transaction().await.unwrap();
        let kept = queue.push_in(&tx, &JobSpec::new("kept")).await.unwrap();
        tx.commit().await.unwrap();
        (kept.id, gone.id)
    });
    assert!(matches!(sync_queue.get(gone), Err(Error::NotFound(_))));
    let job = sync_queue.claim(Duration::from_secs(30)).unwrap().unwrap();
    assert_eq!((job.id(), job.payload()), (kept, &b"kept"[..]));
}
