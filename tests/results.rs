//! Typed payloads and job results: a result set by a worker loop's
//! handler or given when completing by hand is kept with the job (on
//! every store, through the model-based test; here on SQLite for the
//! client paths); JSON in and out with typed errors; size limits refused
//! before anything changes.

#![cfg(all(feature = "serde", feature = "sqlite"))]

use leasehold::{Client, Error, JobSpec, JobState, SqliteStore, WorkOptions};
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Resize {
    image: String,
    width: u32,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Resized {
    bytes: u64,
}

fn sqlite() -> (Client, std::path::PathBuf) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "leasehold-results-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(dir.join("lh.db")).unwrap();
    (Client::new(store), dir)
}

#[test]
fn a_worker_handler_keeps_a_typed_result_with_its_job() {
    let (client, dir) = sqlite();
    let q = client.queue("images").unwrap();
    let spec = JobSpec::json(&Resize {
        image: "a.png".into(),
        width: 64,
    })
    .unwrap();
    let id = q.push(&spec).unwrap().id;
    let plain = q.push(&JobSpec::new(b"no result".to_vec())).unwrap().id;
    let opts = WorkOptions {
        drain: true,
        concurrency: 2,
        ..WorkOptions::default()
    };
    let report = q
        .work(&opts, &AtomicBool::new(false), |job| {
            if job.id() == plain {
                return Ok(());
            }
            let task: Resize = job.payload_json().map_err(|e| e.to_string())?;
            job.set_result_json(&Resized {
                bytes: u64::from(task.width) * 10,
            })
            .map_err(|e| e.to_string())
        })
        .unwrap();
    assert_eq!(report.completed, 2);
    let job = q.get(id).unwrap();
    assert_eq!(job.state, JobState::Done);
    assert_eq!(
        job.result_json::<Resized>().unwrap(),
        Some(Resized { bytes: 640 })
    );
    assert_eq!(q.get(plain).unwrap().result, None);
    // Read back as the wrong type: a typed error naming the field.
    match job.result_json::<Resize>() {
        Err(Error::Invalid { field, reason }) => {
            assert_eq!(field, leasehold::Field::Result);
            assert!(reason.contains("Resize"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_result_given_by_hand_is_kept_and_an_oversized_one_changes_nothing() {
    let (client, dir) = sqlite();
    let q = client.queue("q").unwrap();
    let id = q.push(&JobSpec::new(b"x".to_vec())).unwrap().id;
    let job = q.claim(Duration::from_secs(30)).unwrap().unwrap();
    let huge = vec![b'x'; leasehold::core::MAX_PAYLOAD_BYTES + 1];
    match job.complete_with(&huge) {
        Err(Error::Invalid { field, .. }) => assert_eq!(field, leasehold::Field::Result),
        other => panic!("{other:?}"),
    }
    assert!(job.is_valid(), "the claim is untouched");
    assert!(job.set_result(huge).is_err());
    job.complete_json(&Resized { bytes: 1 }).unwrap();
    let record = q.get(id).unwrap();
    assert_eq!(record.state, JobState::Done);
    assert_eq!(&*record.result.unwrap(), br#"{"bytes":1}"#);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_payload_that_is_not_json_for_the_type_is_a_typed_error() {
    let (client, dir) = sqlite();
    let q = client.queue("q").unwrap();
    q.push(&JobSpec::new(b"not json".to_vec())).unwrap();
    let job = q.claim(Duration::from_secs(30)).unwrap().unwrap();
    match job.payload_json::<Resize>() {
        Err(Error::Invalid { field, reason }) => {
            assert_eq!(field, leasehold::Field::Payload);
            assert!(reason.contains("not JSON"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(dir);
}
