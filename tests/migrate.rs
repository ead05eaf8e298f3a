//! `leasehold migrate` in-process (issue 29 §1), SQLite → PostgreSQL and
//! back, against the server in `LEASEHOLD_TEST_PG` (each test skips with a
//! notice when it is unset): every record moves (jobs in every state with
//! their attempts, errors, results, unique keys, progress and links;
//! leases held and free; schedules with their cursors; settings; rate
//! buckets), instants move by the clocks' difference, tokens and job ids
//! continue above the source's, the source refuses every handle naming the
//! target, a target being filled refuses work, and a second run is a no-op.
//! Real processes (live workers, SIGKILL mid-copy) are in
//! `cli/tests/cli_migrate.rs`.

#![allow(clippy::disallowed_methods)] // real time

#[path = "support/dir.rs"]
mod dir;
#[path = "support/pg.rs"]
mod pg;

use dir::Dir;

use leasehold::core::{Exported, LeaseRecord, ScheduleRecord};
use leasehold::migrate::{migrate, MigrateOptions, MigrateReport};
use leasehold::store::{open_url, open_url_as, Marks};
use leasehold::{
    Client, Error, JobId, JobRecord, JobSpec, JobState, Limits, QueueConfig, Rate, Store, StoreExt,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn temp_db(tag: &str) -> (Dir, String) {
    let dir = Dir::new(&format!("migrate-{tag}"));
    let url = format!("sqlite:{}", dir.0.join("store.db").display());
    (dir, url)
}

/// Everything a store holds, as the migration's own listing reads it
/// (through a handle that ignores the marks).
#[derive(Debug, Default, PartialEq)]
struct Contents {
    leases: BTreeMap<String, LeaseRecord>,
    jobs: BTreeMap<u64, JobRecord>,
    links: Vec<(u64, u64)>,
    configs: BTreeMap<String, QueueConfig>,
    schedules: Vec<ScheduleRecord>,
    rates: BTreeMap<(String, String), leasehold::core::RateLog>,
}

fn contents(url: &str) -> Contents {
    let store = open_url_as(url, true).unwrap();
    store
        .txn(|tx| {
            let mut c = Contents::default();
            let mut keys = Vec::new();
            tx.export_names(Exported::LeaseKeys, "", 10_000, &mut keys)?;
            for k in keys {
                let rec = tx.lease_mut(&k, false)?.unwrap().clone();
                c.leases.insert(k, rec);
            }
            let mut queues = Vec::new();
            tx.export_names(Exported::Queues, "", 10_000, &mut queues)?;
            for q in &queues {
                let mut rate_keys = Vec::new();
                tx.export_names(Exported::RateKeys(q), "", 10_000, &mut rate_keys)?;
                let jobs = tx.jobs()?;
                c.configs.insert(q.clone(), jobs.queue_config(q)?);
                c.schedules.extend(jobs.schedules(q)?);
                for k in rate_keys {
                    c.rates
                        .insert((q.clone(), k.clone()), jobs.rate_log(q, &k)?);
                }
                for job in jobs.list(q, None, JobId(0), 10_000)? {
                    let mut children = Vec::new();
                    jobs.children(job.id, &mut children)?;
                    c.links.extend(children.iter().map(|ch| (job.id.0, ch.0)));
                    c.jobs.insert(job.id.0, job);
                }
            }
            Ok(c)
        })
        .unwrap()
}

/// `c` with every store instant moved by `shift` ms, as the migration
/// moves them.
fn shifted(mut c: Contents, shift: i64) -> Contents {
    let at = |ms: u64| -> u64 {
        if ms == 0 || ms == u64::MAX {
            ms
        } else {
            u64::try_from((i128::from(ms) + i128::from(shift)).max(1)).unwrap()
        }
    };
    for rec in c.leases.values_mut() {
        for s in &mut rec.slots {
            s.expires_at_ms = at(s.expires_at_ms);
        }
    }
    for j in c.jobs.values_mut() {
        j.run_at_ms = at(j.run_at_ms);
        j.created_at_ms = at(j.created_at_ms);
        j.finished_at_ms = j.finished_at_ms.map(at);
        if let Some(cl) = &mut j.claim {
            cl.lease_until_ms = at(cl.lease_until_ms);
            cl.deadline_ms = cl.deadline_ms.map(at);
        }
    }
    // (Schedule cursors are wall-clock time: they stay.)
    for r in c.rates.values_mut() {
        r.starts = r.starts.iter().map(|&t| at(t)).collect();
        r.wake_at_ms = r.wake_at_ms.map(at);
    }
    c
}

/// A store with something in every place the migration copies.
fn fill(url: &str) {
    let client = Client::new(open_url(url).unwrap());
    let q = client.queue("mail").unwrap();
    let ready = q
        .push(&JobSpec {
            priority: 5,
            unique_key: Some("order-1".into()),
            key: Some("tenant-a".into()),
            ..JobSpec::new("ready")
        })
        .unwrap()
        .id;
    q.push(&JobSpec {
        delay_ms: 3_600_000,
        ..JobSpec::new("later")
    })
    .unwrap();
    let waiting = q
        .push(&JobSpec {
            after: vec![ready],
            ..JobSpec::new("after-ready")
        })
        .unwrap()
        .id;
    assert_ne!(waiting, ready);
    let other = client.queue("reports").unwrap();
    for p in ["done", "failed", "running", "cancel"] {
        other.push(&JobSpec::new(p)).unwrap();
    }
    let done = other.claim(Duration::from_secs(60)).unwrap().unwrap();
    done.progress(0.4, "almost").unwrap();
    done.set_result(b"result bytes".to_vec()).unwrap();
    done.complete().unwrap();
    let failed = other.claim(Duration::from_secs(60)).unwrap().unwrap();
    failed.fail("it broke").unwrap();
    let running = other.claim(Duration::from_secs(600)).unwrap().unwrap();
    running.progress(0.7, "going").unwrap();
    let cancel = other.list(Some(JobState::Ready), JobId(0), 10).unwrap();
    client.cancel_job(cancel[0].id).unwrap();
    other
        .set_limits(
            Limits::none()
                .with_per_key(Some(2))
                .with_rate(Some(Rate::new(100, 60_000))),
        )
        .unwrap();
    other.pause().unwrap();
    q.set_limits(Limits::none().with_per_key_rate(Some(Rate::new(5, 1_000))))
        .unwrap();
    q.schedule(&leasehold::core::ScheduleSpec {
        name: "hourly".into(),
        rule: leasehold::core::Rule::every(3_600_000),
        job: JobSpec::new("tick"),
        missed: leasehold::core::Missed::parse("skip").unwrap(),
    })
    .unwrap();
    // A started job of the rate-limited queue leaves a rate bucket.
    let started = q.claim(Duration::from_secs(60)).unwrap();
    assert!(started.is_some());
    for (key, ttl) in [("held", 600_000), ("short", 1)] {
        // Held by a holder that goes on (a dropped guard releases).
        std::mem::forget(client.try_acquire(key, Duration::from_millis(ttl)).unwrap());
    }
    // A key granted twice and free now.
    for _ in 0..2 {
        client
            .try_acquire("freed", Duration::from_millis(1))
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn moved(from: &str, to: &str) -> MigrateReport {
    migrate(from, to, &MigrateOptions::default()).unwrap()
}

#[test]
fn everything_moves_to_postgres_and_back_with_instants_shifted_and_tokens_continuing() {
    if !pg::enabled() {
        return;
    }
    let (_dir, sqlite) = temp_db("roundtrip");
    let (_dir2, sqlite2) = temp_db("roundtrip-back");
    let schema = pg::Schema::new("migrate_rt");
    let postgres = schema.url();
    fill(&sqlite);
    let before = contents(&sqlite);
    assert_eq!(
        (before.jobs.len(), before.links.len(), before.rates.len()),
        (7, 1, 1),
        "{before:#?}"
    );
    assert!(before.schedules.len() == 1 && before.leases.len() == 3);
    assert_eq!(before.leases["held"].slots.len(), 1);

    let dry = migrate(
        &sqlite,
        &postgres,
        &MigrateOptions {
            dry_run: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(dry.jobs, before.jobs.len() as u64);
    assert_eq!(
        open_url_as(&sqlite, true).unwrap().marks().unwrap(),
        Marks::default()
    );
    assert!(
        contents(&postgres).jobs.is_empty(),
        "a dry run copied something"
    );

    let report = moved(&sqlite, &postgres);
    assert!(!report.resumed && !report.already_done);
    assert_eq!(report.jobs, before.jobs.len() as u64);
    assert_eq!((report.running_jobs, report.links), (2, 1));
    assert_eq!(report.leases, 3);
    let on_pg = contents(&postgres);
    assert_eq!(on_pg, shifted(before, report.shift_ms));
    assert_eq!(
        open_url_as(&postgres, true).unwrap().marks().unwrap(),
        Marks::default()
    );

    // Ids and tokens continue above the source's.
    let client = Client::new(open_url(&postgres).unwrap());
    let last = *on_pg.jobs.keys().max().unwrap();
    let id = client
        .queue("mail")
        .unwrap()
        .push(&JobSpec::new("new"))
        .unwrap()
        .id;
    assert!(id.0 > last, "id {id} reissued (last copied {last})");
    let freed = client.try_acquire("freed", Duration::from_secs(5)).unwrap();
    assert_eq!(freed.token(), on_pg.leases["freed"].last_token + 1);
    assert!(matches!(
        client.try_acquire("held", Duration::from_secs(5)),
        Err(Error::Held { .. })
    ));
    client.release("freed", freed.token()).unwrap();

    // And back: PostgreSQL → SQLite.
    let early = Client::new(open_url(&postgres).unwrap());
    let before = contents(&postgres);
    let back = moved(&postgres, &sqlite2);
    assert_eq!(contents(&sqlite2), shifted(before, back.shift_ms));
    assert!(matches!(open_url(&postgres), Err(Error::Moved { to }) if to.ends_with("store.db")));
    // An application's own transaction cannot push into the moved schema.
    let mut db = postgres::Client::connect(&pg::url().unwrap(), postgres::NoTls).unwrap();
    let mut tx = db.transaction().unwrap();
    let pushed = early
        .queue("mail")
        .unwrap()
        .push_in(&mut tx, &JobSpec::new("late"));
    assert!(
        matches!(&pushed, Err(Error::Moved { to }) if *to == back.to),
        "{pushed:?}"
    );
}

#[test]
fn a_moved_store_refuses_every_handle_and_a_second_run_changes_nothing() {
    if !pg::enabled() {
        return;
    }
    let (_dir, sqlite) = temp_db("refuses");
    let schema = pg::Schema::new("migrate_refuse");
    let other = pg::Schema::new("migrate_other");
    fill(&sqlite);
    // A handle opened before the move, as a running worker has.
    let early = Client::new(open_url(&sqlite).unwrap());
    let report = moved(&sqlite, &schema.url());
    let named = report.to.clone();
    assert!(!named.contains("password"));
    match early.queue("mail").unwrap().push(&JobSpec::new("late")) {
        Err(Error::Moved { to }) => assert_eq!(to, named),
        other => panic!("a push on the moved store answered {other:?}"),
    }
    match early.try_acquire("k", Duration::from_secs(5)) {
        Err(Error::Moved { to }) => assert_eq!(to, named),
        other => panic!("an acquire on the moved store answered {other:?}"),
    }
    match open_url(&sqlite) {
        Err(Error::Moved { to }) => assert_eq!(to, named),
        Err(e) => panic!("opening the moved store: {e}"),
        Ok(_) => panic!("the moved store opened"),
    }
    let pg_before = contents(&schema.url());
    let again = moved(&sqlite, &schema.url());
    assert!(again.already_done);
    assert_eq!(contents(&schema.url()), pg_before);
    let elsewhere = migrate(&sqlite, &other.url(), &MigrateOptions::default());
    assert!(
        matches!(&elsewhere, Err(Error::Invalid { reason, .. }) if reason.contains(&named)),
        "{elsewhere:?}"
    );
}

#[test]
fn a_target_being_filled_refuses_work_and_a_target_with_data_is_refused() {
    if !pg::enabled() {
        return;
    }
    let (_dir, sqlite) = temp_db("filling");
    fill(&sqlite);
    let schema = pg::Schema::new("migrate_fill");
    let url = schema.url();
    let client = Client::new(open_url(&url).unwrap());
    client
        .queue("x")
        .unwrap()
        .push(&JobSpec::new("mine"))
        .unwrap();
    let refused = migrate(&sqlite, &url, &MigrateOptions::default());
    assert!(
        matches!(&refused, Err(Error::Invalid { reason, .. }) if reason.contains("already holds")),
        "{refused:?}"
    );
    assert_eq!(
        open_url_as(&sqlite, true).unwrap().marks().unwrap(),
        Marks::default()
    );
    // Also when an earlier run marked that target and stopped before the
    // cut-over: nothing was copied yet, so it must still be empty.
    let source_name = format!(
        "sqlite:{}",
        std::path::absolute(sqlite.trim_start_matches("sqlite:"))
            .unwrap()
            .display()
    );
    let marks = Marks {
        moving_from: Some(source_name),
        ..Marks::default()
    };
    open_url_as(&url, true).unwrap().set_marks(&marks).unwrap();
    let refused = migrate(&sqlite, &url, &MigrateOptions::default());
    assert!(
        matches!(&refused, Err(Error::Invalid { reason, .. }) if reason.contains("already holds")),
        "a target marked by an interrupted run was overwritten: {refused:?}"
    );
    open_url_as(&url, true)
        .unwrap()
        .set_marks(&Marks::default())
        .unwrap();

    let empty = pg::Schema::new("migrate_fill2");
    let store: Arc<dyn Store> = open_url(&empty.url()).unwrap();
    let marks = Marks {
        moving_from: Some("sqlite:/somewhere.db".into()),
        ..Marks::default()
    };
    open_url_as(&empty.url(), true)
        .unwrap()
        .set_marks(&marks)
        .unwrap();
    let worker = Client::builder_shared(store)
        .busy_timeout(Duration::from_millis(300))
        .build();
    match worker.queue("x").unwrap().claim(Duration::from_secs(5)) {
        Err(e @ Error::Busy { .. }) => assert!(e.to_string().contains("migrate"), "{e}"),
        Err(e) => panic!("a store being filled answered {e}, not a transient error"),
        Ok(_) => panic!("a store being filled answered a claim"),
    }
    open_url_as(&empty.url(), true)
        .unwrap()
        .set_marks(&Marks::default())
        .unwrap();
    assert!(worker
        .queue("x")
        .unwrap()
        .claim(Duration::from_secs(5))
        .is_ok());
}

#[test]
fn the_migrate_report_counts_what_a_dry_run_would_move() {
    if !pg::enabled() {
        return;
    }
    let (_dir, sqlite) = temp_db("dry");
    fill(&sqlite);
    let schema = pg::Schema::new("migrate_dry");
    let dry = migrate(
        &sqlite,
        &schema.url(),
        &MigrateOptions {
            dry_run: true,
            chunk: 2,
        },
    )
    .unwrap();
    let real = migrate(
        &sqlite,
        &schema.url(),
        &MigrateOptions {
            dry_run: false,
            chunk: 2,
        },
    )
    .unwrap();
    assert!(dry.dry_run && !real.dry_run);
    assert_eq!(
        (
            dry.jobs,
            dry.leases,
            dry.links,
            dry.schedules,
            dry.settings,
            dry.rate_buckets,
            dry.queues
        ),
        (
            real.jobs,
            real.leases,
            real.links,
            real.schedules,
            real.settings,
            real.rate_buckets,
            real.queues
        )
    );
}

#[test]
fn the_cut_over_waits_for_a_transaction_that_began_before_it() {
    if !pg::enabled() {
        return;
    }
    let source = pg::Schema::new("migrate_wait");
    let (_dir, sqlite) = temp_db("wait");
    let client = Client::new(open_url(&source.url()).unwrap());
    let queue = client.queue("orders").unwrap();
    queue.push(&JobSpec::new("before")).unwrap();
    // An application's transaction pushes a job and commits only after
    // the migration has started.
    let mut db = postgres::Client::connect(&pg::url().unwrap(), postgres::NoTls).unwrap();
    let mut tx = db.transaction().unwrap();
    queue.push_in(&mut tx, &JobSpec::new("in flight")).unwrap();
    let (from, to) = (source.url(), sqlite.clone());
    let migration = std::thread::spawn(move || migrate(&from, &to, &MigrateOptions::default()));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !migration.is_finished(),
        "the copy did not wait for the open transaction"
    );
    tx.commit().unwrap();
    let report = migration.join().unwrap().unwrap();
    assert_eq!(
        report.jobs, 2,
        "the job committed during the cut-over was not copied"
    );
    let moved: Vec<String> = contents(&sqlite)
        .jobs
        .values()
        .map(|j| String::from_utf8_lossy(&j.payload).into_owned())
        .collect();
    assert_eq!(moved, ["before", "in flight"]);
}

#[test]
fn a_fenced_source_floor_and_purged_ids_carry_over() {
    if !pg::enabled() {
        return;
    }
    let source = pg::Schema::new("migrate_floor");
    let (_dir, sqlite) = temp_db("floor");
    let client = Client::new(open_url(&source.url()).unwrap());
    let queue = client.queue("q").unwrap();
    let short = Duration::from_millis(1);
    std::mem::forget(client.try_acquire("k", short).unwrap());
    for i in 0..5 {
        queue.push(&JobSpec::new(format!("job {i}"))).unwrap();
    }
    let claimed = queue.claim(short).unwrap().unwrap();
    std::mem::forget(claimed);
    // The two newest jobs are cancelled and purged: their ids are gone
    // from the rows, not from the counter.
    for id in [4, 5] {
        client.cancel_job(JobId(id)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(queue.purge(Duration::ZERO).unwrap(), 2);
    // The source was fenced after a failover: its floor is a generation up.
    let floor = leasehold::core::lease::promoted_floor(0);
    pg::admin(&format!(
        "INSERT INTO \"{}\".leasehold_meta VALUES ('token_floor', '{floor}')
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        source.0
    ));
    let report = moved(&source.url(), &sqlite);
    assert_eq!(report.last_job_id, 5);
    assert!(report.max_token >= floor);
    let target = Client::new(open_url(&sqlite).unwrap());
    std::thread::sleep(Duration::from_millis(5));
    let granted = target.try_acquire("k", Duration::from_secs(5)).unwrap();
    assert!(
        granted.token() > floor,
        "token {} under the floor",
        granted.token()
    );
    let queue = target.queue("q").unwrap();
    let next = queue.push(&JobSpec::new("new")).unwrap().id;
    assert_eq!(next, JobId(6), "a purged job's id was handed out again");
    // The claim that ran out: claimed again above the floor.
    std::thread::sleep(Duration::from_millis(5));
    let again = queue.claim(Duration::from_secs(5)).unwrap().unwrap();
    assert!(
        again.token() > floor,
        "job token {} under the floor",
        again.token()
    );
}
