//! Tracing and metrics: every transition a committed transaction made is
//! counted and traced, with its fields; a transaction that rolls back
//! reports nothing. (The command line's `--log json` and `--metrics` are
//! tested in the CLI package's `cli_usage.rs`.)

use leasehold::core::{self, JobState};
use leasehold::{Client, Error, JobSpec, LeaseOptions, MemStore, StoreExt};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The value of the sample `name{labels}` in Prometheus text (0 if absent).
fn sample(text: &str, name: &str, labels: &str) -> f64 {
    let head = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&head))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// The tests that emit events take turns: tracing caches, per callsite,
/// whether anyone listens, and a callsite first reached on one test's
/// thread while another test's scoped subscriber is being installed can
/// cache "nobody" and drop that subscriber's events (seen as a flaky
/// "no \"lease released\"" in CI, about one run in two under load).
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn committed_transitions_are_counted_and_rolled_back_ones_are_not() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        let client = Client::new(MemStore::new());
        let q = client.queue("mail").unwrap();
        for _ in 0..3 {
            q.push(&JobSpec {
                max_attempts: 1,
                ..JobSpec::new(b"x".to_vec())
            })
            .unwrap();
        }
        let a = q.claim(Duration::from_secs(30)).unwrap().unwrap();
        let b = q.claim(Duration::from_secs(30)).unwrap().unwrap();
        a.complete().unwrap();
        assert_eq!(b.fail("smtp down").unwrap(), JobState::Dead);
        // A transaction that enqueues, then fails: rolled back, not counted.
        let store = client.store();
        let r: leasehold::Result<()> = store.txn(|tx| {
            core::job::enqueue(
                tx,
                "mail",
                &JobSpec::new(b"y".to_vec()),
                &Default::default(),
            )?;
            Err(Error::invalid(leasehold::Field::Reason, "roll back"))
        });
        assert!(r.is_err());
        let guard = client
            .acquire("report", LeaseOptions::new(Duration::from_secs(5)))
            .unwrap();
        guard.release().unwrap();
    });
    let text = handle.render();
    let job = |t: &str| {
        sample(
            &text,
            "leasehold_job_transitions_total",
            &format!("queue=\"mail\",transition=\"{t}\""),
        )
    };
    assert_eq!(job("enqueued"), 3.0, "{text}");
    assert_eq!(job("claimed"), 2.0);
    assert_eq!(job("completed"), 1.0);
    assert_eq!(job("failed"), 1.0);
    assert_eq!(job("dead"), 1.0);
    let lease = |t: &str| {
        sample(
            &text,
            "leasehold_lease_transitions_total",
            &format!("transition=\"{t}\""),
        )
    };
    assert_eq!(lease("granted"), 1.0);
    assert_eq!(lease("released"), 1.0);
    let claims = sample(
        &text,
        "leasehold_transaction_seconds_count",
        "op=\"claim\",outcome=\"ok\"",
    );
    assert_eq!(claims, 2.0, "{text}");
    let failed = sample(
        &text,
        "leasehold_transaction_seconds_count",
        "op=\"txn\",outcome=\"error\"",
    );
    assert_eq!(failed, 1.0, "{text}");
    assert_eq!(
        sample(&text, "leasehold_job_wait_seconds_count", "queue=\"mail\""),
        2.0
    );
}

/// A writer the subscriber shares with the test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn every_transition_is_a_tracing_event_with_its_fields() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let mut holder = String::new();
    tracing::subscriber::with_default(subscriber, || {
        // Callsites the other test reached before this subscriber existed
        // cached "nobody listens": ask again, with it in place.
        tracing::callsite::rebuild_interest_cache();
        let client = Client::new(MemStore::new());
        holder = client.holder().id.to_string();
        let q = client.queue("jobs").unwrap();
        q.push(&JobSpec::new(b"x".to_vec())).unwrap();
        let job = q.claim(Duration::from_secs(30)).unwrap().unwrap();
        job.heartbeat().unwrap();
        job.complete().unwrap();
        let guard = client
            .acquire("k", LeaseOptions::new(Duration::from_secs(5)))
            .unwrap();
        guard.renew().unwrap();
        guard.release().unwrap();
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let find = |message: &str| {
        events
            .iter()
            .find(|e| e["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} in {text}"))
    };
    for message in [
        "job enqueued",
        "job claimed",
        "job heartbeat",
        "job completed",
    ] {
        let e = find(message);
        assert_eq!(e["queue"], "jobs");
        assert_eq!(e["job_id"], 1);
        assert_eq!(e["target"], "leasehold::job");
    }
    let claimed = find("job claimed");
    assert_eq!(
        (claimed["token"].as_u64(), claimed["attempt"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        claimed["span"]["op"], "claim",
        "inside its transaction's span"
    );
    for message in ["lease granted", "lease renewed", "lease released"] {
        let e = find(message);
        assert_eq!(e["key"], "k");
        assert_eq!(e["token"], 1);
        assert_eq!(e["holder"], holder.as_str());
    }
}

/// The README's metric table is the contract dashboards are built on:
/// every transition's label is one it lists, and no two transitions share
/// a label.
#[test]
fn transition_labels_are_the_ones_the_readme_documents() {
    use leasehold::core::schedule::TickChange;
    use leasehold::core::{JobChange, JobId, LeaseChange};
    let readme = include_str!("../README.md");
    let documented = |metric: &str| -> Vec<String> {
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| `{metric}`")))
            .unwrap_or_else(|| panic!("README has no row for {metric}"));
        let labels = row.rsplit('|').nth(1).unwrap();
        let list = labels.split_once(':').expect("a label list").1;
        list.split(',')
            .map(|s| {
                s.trim()
                    .trim_end_matches(|c: char| !c.is_alphanumeric() && c != '_')
            })
            .map(|s| s.split_whitespace().next().unwrap_or("").to_string())
            .collect()
    };
    fn check(names: &[&str], documented: &[String], metric: &str) {
        let mut seen = std::collections::HashSet::new();
        for name in names {
            assert!(
                documented.iter().any(|d| d == name),
                "{metric}: {name:?} is not among {documented:?}"
            );
            assert!(
                seen.insert(*name),
                "{metric}: {name:?} names two transitions"
            );
        }
    }
    let lease = [
        LeaseChange::Granted { ttl_ms: 1 },
        LeaseChange::Renewed { ttl_ms: 1 },
        LeaseChange::Released,
        LeaseChange::Expired,
    ];
    // A new variant fails to compile here: add it to the match and to the
    // list above.
    for c in lease {
        match c {
            LeaseChange::Granted { .. }
            | LeaseChange::Renewed { .. }
            | LeaseChange::Released
            | LeaseChange::Expired => {}
        }
    }
    let lease: Vec<&str> = lease.iter().map(|c| c.name()).collect();
    check(
        &lease,
        &documented("leasehold_lease_transitions_total"),
        "lease",
    );
    let job = [
        JobChange::Enqueued,
        JobChange::Claimed { wait_ms: 1 },
        JobChange::Heartbeat,
        JobChange::Completed,
        JobChange::Failed,
        JobChange::Expired,
        JobChange::Retried { delay_ms: 1 },
        JobChange::Dead,
        JobChange::Quarantined,
        JobChange::Cancelled,
        JobChange::Abandoned,
        JobChange::Released,
    ];
    for c in job {
        match c {
            JobChange::Enqueued
            | JobChange::Claimed { .. }
            | JobChange::Heartbeat
            | JobChange::Completed
            | JobChange::Failed
            | JobChange::Expired
            | JobChange::Retried { .. }
            | JobChange::Dead
            | JobChange::Quarantined
            | JobChange::Cancelled
            | JobChange::Abandoned
            | JobChange::Released => {}
        }
    }
    let job: Vec<&str> = job.iter().map(|c| c.name()).collect();
    let job_documented = documented("leasehold_job_transitions_total");
    check(&job, &job_documented, "job");
    assert_eq!(
        job.len(),
        job_documented.len(),
        "every documented job label is a transition"
    );
    let tick = [
        TickChange::Enqueued {
            id: JobId(1),
            catch_up: false,
        },
        TickChange::Enqueued {
            id: JobId(1),
            catch_up: true,
        },
        TickChange::Skipped,
    ];
    for c in tick {
        match c {
            TickChange::Enqueued { .. } | TickChange::Skipped => {}
        }
    }
    let tick: Vec<&str> = tick.iter().map(|c| c.name()).collect();
    let tick_documented = documented("leasehold_schedule_ticks_total");
    check(&tick, &tick_documented, "tick");
    assert_eq!(tick.len(), tick_documented.len());
}
