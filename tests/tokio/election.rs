//! Leader election and schedules through the async client, on every
//! store (registered in `main.rs` with the other cases).

use super::Fresh;
use leasehold::core::{Missed, Rule, ScheduleSpec};
use leasehold::tokio::Client;
use leasehold::{ElectOptions, Holder, HolderId, JobSpec, LeaderEvent, ManualClock, WorkOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Three campaigners: one leads, the others are told who; a resignation
/// hands over well under the TTL, to a larger token; the deposed
/// leader's cancellation fires.
pub fn elections_hand_over_on_resign(make: &dyn Fn() -> Fresh) {
    let f = make();
    runtime().block_on(async {
        let mut elections = Vec::new();
        for n in 1..=3u128 {
            let holder = Holder::with_label(HolderId(n), &format!("replica-{n}")).unwrap();
            let sync = leasehold::Client::builder_shared(f.store.clone())
                .holder(holder)
                .build();
            let opts = ElectOptions::new(Duration::from_secs(10));
            elections.push(Client::new(sync).campaign("leader", opts).unwrap());
        }
        let leaders =
            |e: &[leasehold::tokio::Election]| e.iter().filter(|e| e.leader().is_some()).count();
        let deadline = Instant::now() + Duration::from_secs(5);
        while leaders(&elections) != 1 {
            assert!(Instant::now() < deadline, "nobody elected");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let first = elections.iter().position(|e| e.leader().is_some()).unwrap();
        let old = elections[first].leader().unwrap();
        let other = (first + 1) % 3;
        let told = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match elections[other].next_event().await {
                    Some(LeaderEvent::NewLeader(h)) => break h,
                    Some(_) => {}
                    None => panic!("election over"),
                }
            }
        })
        .await
        .expect("the new leader reported");
        assert_eq!(told.token, old.token());
        assert_eq!(
            told.holder.label.as_deref(),
            Some(&*format!("replica-{}", first + 1))
        );
        let started = Instant::now();
        elections.remove(first).resign().await.unwrap();
        assert!(old.cancellation().is_cancelled());
        assert!(!old.is_valid());
        while leaders(&elections) != 1 {
            assert!(started.elapsed() < Duration::from_secs(5), "no handover");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
        let next = elections.iter().find_map(|e| e.leader()).unwrap();
        assert!(next.token() > old.token());
        for e in elections {
            e.resign().await.unwrap();
        }
    });
}

/// Two async workers fire a schedule's due ticks: one job per tick.
pub fn async_workers_fire_each_tick_once(make: &dyn Fn() -> Fresh) {
    const WALL: u64 = 1_768_478_400_000;
    let f = make();
    let wall = ManualClock::new(WALL);
    let client = |n| {
        Client::new(
            leasehold::Client::builder_shared(f.store.clone())
                .holder(Holder::new(HolderId(n)))
                .wall_clock(Arc::new(wall.clone()))
                .build(),
        )
    };
    runtime().block_on(async {
        let queue = client(1).queue("q").unwrap();
        let spec = ScheduleSpec {
            name: "beat".into(),
            rule: Rule::every(1_000),
            job: JobSpec::new("x"),
            missed: Missed::CatchUp,
        };
        queue.schedule(&spec).await.unwrap();
        wall.set(WALL + 2_100);
        let opts = WorkOptions {
            drain: true,
            ..WorkOptions::default()
        };
        let mut runs = Vec::new();
        for n in 1..=2 {
            let q = client(n).queue("q").unwrap();
            runs.push(tokio::spawn(async move {
                q.work(&opts, std::future::pending(), |_| async { Ok(()) })
                    .await
                    .unwrap()
                    .completed
            }));
        }
        let mut done = 0;
        for r in runs {
            done += r.await.unwrap();
        }
        assert_eq!(done, 2);
        assert_eq!(
            queue.stats().await.unwrap().get(leasehold::JobState::Done),
            2
        );
    });
}
