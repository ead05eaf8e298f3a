//! A store call that panics (a bug in a store) ends the async drivers that
//! made it, and the panic reaches whoever awaits them; before, the drivers
//! waited forever for an answer that never came.

use crate::election::runtime;
use crate::flaky::{ends_within, Panicky};
use leasehold::tokio::Client;
use leasehold::{ElectOptions, JobSpec, JobState, LeaderEvent, MemStore, WorkOptions};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

fn client(store: &Arc<Panicky>) -> Client {
    Client::new(leasehold::Client::builder_shared(store.clone()).build())
}

/// How `ended` should read: the store's panic, resumed.
fn resumed_the_stores_panic<R: std::fmt::Debug>(ended: Option<Result<R, String>>) {
    match ended {
        Some(Err(message)) => assert!(message.contains("the store panicked"), "{message}"),
        other => panic!("the driver should resume the store's panic, got {other:?}"),
    }
}

#[test]
fn a_store_call_that_panics_ends_the_election() {
    let store = Arc::new(Panicky::new(MemStore::new()));
    let ended = ends_within(Duration::from_secs(10), move || {
        runtime().block_on(async move {
            let opts = ElectOptions::new(Duration::from_secs(3));
            let mut election = client(&store).campaign("k", opts).unwrap();
            let leader = loop {
                match election.next_event().await {
                    Some(LeaderEvent::Elected(leader)) => break leader,
                    Some(_) => continue,
                    None => panic!("the election ended before it was elected"),
                }
            };
            // The next renewal (about a second from now) panics. The term
            // ends with the election, well before its local deadline (about
            // 3 s after the grant), and the application is told.
            store.arm();
            let told = election.next_event().await;
            assert!(matches!(told, Some(LeaderEvent::Deposed(_))), "{told:?}");
            assert!(leader.cancellation().is_cancelled());
            assert!(!leader.is_valid(), "the term outlived its election");
            election.join().await
        })
    });
    resumed_the_stores_panic(ended);
}

#[test]
fn a_store_call_that_panics_ends_the_work_loop() {
    let store = Arc::new(Panicky::new(MemStore::new()));
    let ended = ends_within(Duration::from_secs(10), move || {
        runtime().block_on(async move {
            let q = client(&store).queue("q").unwrap();
            q.push(&JobSpec::new("x")).await.unwrap();
            // Never shut down: only the panic can end it. The handler arms
            // the store, so the settle of its outcome panics.
            q.work(&WorkOptions::default(), std::future::pending(), move |_| {
                let store = store.clone();
                async move {
                    store.arm();
                    Ok(())
                }
            })
            .await
        })
    });
    resumed_the_stores_panic(ended);
}

/// Once a store call's panic has ended the loop, the requests waiting for
/// their turn behind it (a settle, or an idle poll's claim, queued while
/// the call is held) are not sent: a claim sent then would take jobs
/// nobody runs.
#[test]
fn a_loop_ended_by_a_store_panic_claims_nothing_more() {
    let store = Arc::new(Panicky::new(MemStore::new()));
    let q = client(&store).queue("q").unwrap();
    let armer = store.clone();
    let worker = q.clone();
    let ended = std::thread::spawn(move || {
        ends_within(Duration::from_secs(20), move || {
            runtime().block_on(async move {
                worker.push(&JobSpec::new("first")).await.unwrap();
                let opts = WorkOptions {
                    idle_poll: Duration::from_millis(20),
                    ..WorkOptions::default()
                };
                worker
                    .work(&opts, std::future::pending(), move |_| {
                        // The loop's next store call waits at the gate,
                        // then panics.
                        armer.arm_once_gated();
                        async { Ok(()) }
                    })
                    .await
            })
        })
    });
    store.wait_at_gate();
    let second = runtime()
        .block_on(q.push(&JobSpec::new("second")))
        .unwrap()
        .id;
    std::thread::sleep(Duration::from_millis(300));
    store.open_gate();
    resumed_the_stores_panic(ended.join().unwrap());
    // (Read before this test's own reads, which count too.)
    let sent_after = store.after_panic.load(Ordering::SeqCst);
    assert_eq!(sent_after, 0, "store calls made after the loop ended");
    let state = runtime().block_on(q.get(second)).unwrap().state;
    assert_eq!(state, JobState::Ready, "claimed after the loop ended");
}
