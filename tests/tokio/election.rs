//! Leader election and schedules through the async client, on every
//! store (registered in `main.rs` with the other cases).

use super::Fresh;
use leasehold::core::{Missed, Rule, ScheduleSpec};
use leasehold::tokio::Client;
use leasehold::{ElectOptions, Holder, HolderId, JobSpec, LeaderEvent, ManualClock, WorkOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn runtime() -> tokio::runtime::Runtime {
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

/// Found when tried as a new user would: while a store call hangs (another
/// connection holds SQLite's write lock for 3 s), a leader's term must
/// still end at its local deadline: `is_valid()` turns false, and the
/// cancellation and `Deposed` come at about the same time, not when the
/// store answers (they came 2.98 s late when the driver awaited each
/// request inline).
pub fn a_hung_store_call_does_not_delay_the_end_of_a_term(db: &std::path::Path) {
    let store = leasehold::SqliteStore::open(db).unwrap();
    runtime().block_on(async {
        let client = Client::new(leasehold::Client::new(store));
        let ttl = Duration::from_millis(600);
        let mut election = client.campaign("k", ElectOptions::new(ttl)).unwrap();
        let leader = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some(LeaderEvent::Elected(leader)) = election.next_event().await {
                    break leader;
                }
            }
        })
        .await
        .expect("elected");
        // Past its first renewal (about every 200 ms).
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(leader.is_valid());
        let path = db.to_path_buf();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let blocker = std::thread::spawn(move || {
            let c = rusqlite::Connection::open(path).unwrap();
            c.execute_batch("BEGIN IMMEDIATE").unwrap();
            held_tx.send(Instant::now()).unwrap();
            std::thread::sleep(Duration::from_secs(3));
            c.execute_batch("COMMIT").unwrap();
        });
        let locked = held_rx.recv().unwrap();
        let lost = leader.cancellation();
        tokio::time::timeout(Duration::from_millis(2_000), lost.cancelled())
            .await
            .expect("the cancellation fires before the store answers");
        let cancelled_after = locked.elapsed();
        assert!(!leader.is_valid());
        let deposed = tokio::time::timeout(Duration::from_millis(2_000), async {
            loop {
                if let Some(LeaderEvent::Deposed(why)) = election.next_event().await {
                    break why;
                }
            }
        })
        .await
        .expect("Deposed is reported before the store answers");
        let deposed_after = locked.elapsed();
        assert!(
            matches!(deposed, leasehold::Deposed::Lost(_)),
            "{deposed:?}"
        );
        assert!(
            cancelled_after < Duration::from_millis(1_500)
                && deposed_after < Duration::from_millis(1_500),
            "cancelled after {cancelled_after:?}, deposed after {deposed_after:?} (the lock is held 3 s)"
        );
        blocker.join().unwrap();
        election.resign().await.unwrap();
    });
}

/// A store that holds back the transactions the test asks it to, each
/// until the test lets that one go (in the order they arrived).
struct Gate {
    inner: leasehold::MemStore,
    /// (transactions still to hold, arrived so far, let go so far)
    state: std::sync::Mutex<(usize, usize, usize)>,
    changed: std::sync::Condvar,
}

impl Gate {
    fn hold_next(&self) {
        self.state.lock().unwrap().0 += 1;
    }

    /// Wait until `n` held transactions have arrived.
    fn wait_arrived(&self, n: usize) {
        let st = self.state.lock().unwrap();
        let (st, _) = self
            .changed
            .wait_timeout_while(st, Duration::from_secs(5), |s| s.1 < n)
            .unwrap();
        assert!(st.1 >= n, "{} held transactions arrived, not {n}", st.1);
    }

    /// Let the held transactions go, up to the `n`th to arrive.
    fn let_go(&self, n: usize) {
        self.state.lock().unwrap().2 = n;
        self.changed.notify_all();
    }
}

impl leasehold::Store for Gate {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn leasehold::core::Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        let mut st = self.state.lock().unwrap();
        if st.0 > 0 {
            st.0 -= 1;
            st.1 += 1;
            let ticket = st.1;
            self.changed.notify_all();
            drop(self.changed.wait_while(st, |s| s.2 < ticket).unwrap());
        } else {
            drop(st);
        }
        self.inner.transact(f)
    }
    fn describe(&self) -> String {
        "gate".into()
    }
}

async fn next(election: &mut leasehold::tokio::Election) -> LeaderEvent {
    tokio::time::timeout(Duration::from_secs(5), election.next_event())
        .await
        .expect("an event within 5 s")
        .expect("the election goes on")
}

/// A renewal of a lost term that answers late (its store call hung past
/// the term's local deadline, while the release and the next campaign
/// went ahead) is not taken for the answer to the next term's renewal:
/// its refusal (the old token is stale by then) deposed the next term,
/// which the store had just granted.
pub fn a_late_answer_of_a_lost_term_does_not_end_the_next() {
    let gate = Arc::new(Gate {
        inner: leasehold::MemStore::new(),
        state: std::sync::Mutex::new((0, 0, 0)),
        changed: std::sync::Condvar::new(),
    });
    runtime().block_on(async {
        let client = Client::new(leasehold::Client::builder_shared(gate.clone()).build());
        let ttl = Duration::from_millis(2_400);
        let mut election = client.campaign("k", ElectOptions::new(ttl)).unwrap();
        let LeaderEvent::Elected(first) = next(&mut election).await else {
            panic!("expected to be elected")
        };
        // The first term's next renewal hangs: the term is lost at its
        // local deadline, released, and the key won again.
        gate.hold_next();
        gate.wait_arrived(1);
        let deposed = next(&mut election).await;
        assert!(
            matches!(deposed, LeaderEvent::Deposed(leasehold::Deposed::Lost(_))),
            "{deposed:?}"
        );
        let LeaderEvent::Elected(second) = next(&mut election).await else {
            panic!("expected a new term")
        };
        assert!(second.token() > first.token());
        // The second term's first renewal is out when the first term's
        // answers (refused: its token is stale).
        gate.hold_next();
        gate.wait_arrived(2);
        gate.let_go(1);
        tokio::time::sleep(Duration::from_millis(200)).await;
        gate.let_go(2);
        let after = tokio::time::timeout(Duration::from_millis(500), election.next_event()).await;
        assert!(after.is_err(), "the next term ended: {:?}", after.unwrap());
        assert!(second.is_valid());
        election.resign().await.unwrap();
    });
}
