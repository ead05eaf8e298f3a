//! Leases: acquire and wait, the loss future, release and drop.

use super::*;

/// 40 tasks take turns on one key, each with its own client, on a
/// runtime with four blocking threads. A waiter that parked a thread
/// would hold all four while the holder's release waits for one.
pub fn acquire_waits_without_a_thread_per_waiter(make: &Make) {
    let f = make();
    take_turns(|| client(&f), 40, 1, 2);
}

/// Eight tasks share one client and take turns on one key. When the key
/// is freed, several of them ask the store at once, and the store extends
/// the first one's grant for the others (one holder): only one guard may
/// come of it, and the others wait on.
pub fn tasks_of_one_client_take_turns(make: &Make) {
    let f = make();
    let c = client(&f);
    take_turns(|| c.clone(), 8, 5, 1);
}

/// `tasks` tasks, each with the client `client` gives it, take `turns`
/// turns each on one key, holding it `hold_ms`; never two at once.
fn take_turns(client: impl Fn() -> Client, tasks: usize, turns: usize, hold_ms: u64) {
    runtime(4).block_on(async {
        let inside = Arc::new(AtomicUsize::new(0));
        let mut set = JoinSet::new();
        for _ in 0..tasks {
            let c = client();
            let inside = inside.clone();
            set.spawn(async move {
                for _ in 0..turns {
                    let opts =
                        LeaseOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(60));
                    let guard = c.acquire("turns", opts).await.unwrap();
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    tokio::time::sleep(ms(hold_ms)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            });
        }
        within(Duration::from_secs(60), "the turns", async {
            while let Some(r) = set.join_next().await {
                r.unwrap();
            }
        })
        .await;
    });
}

/// A release cut short (a timeout around it drops the future at its
/// first wait) still ends the hold: the key is released in the store, and
/// the same client's next acquire asks the store instead of refusing.
pub fn a_release_cut_short_still_ends_the_hold(make: &Make) {
    let f = make();
    runtime(4).block_on(async {
        let c = client(&f);
        let other = client(&f);
        let guard = c.try_acquire("cut", Duration::from_secs(60)).await.unwrap();
        // (Before the fix, the release of a store with real I/O stopped
        // there for good, and the key stayed marked held by `c`.)
        let _ = tokio::time::timeout(Duration::ZERO, guard.release()).await;
        // The ending goes on in the background: the store's release first,
        // then `c`'s record; each client gets the key once it is done.
        for (who, client) in [("another client", &other), ("the same client", &c)] {
            within(Duration::from_secs(10), who, async {
                loop {
                    match client.try_acquire("cut", Duration::from_secs(60)).await {
                        Ok(g) => break g.release().await.unwrap(),
                        Err(leasehold::Error::Held { .. }) => tokio::time::sleep(ms(5)).await,
                        Err(e) => panic!("{e}"),
                    }
                }
            })
            .await;
        }
    });
}

/// The waiter's own clock is frozen, so its retry timer never comes due:
/// only the store's announcement of the release can wake it.
pub fn a_waiting_acquire_is_woken_by_a_release(make: &Make) {
    let f = make();
    runtime(8).block_on(async {
        let a = client(&f);
        let guard = a
            .acquire("woken", LeaseOptions::new(Duration::from_secs(30)))
            .await
            .unwrap();
        let frozen = ManualClock::new(5_000_000);
        let b = Client::new(
            leasehold::Client::builder_shared(f.store.clone())
                .clock(Arc::new(frozen))
                .build(),
        );
        let waiter = tokio::spawn(async move {
            let opts = LeaseOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(30));
            b.acquire("woken", opts).await
        });
        tokio::time::sleep(ms(300)).await;
        assert!(!waiter.is_finished(), "acquired a held key");
        guard.release().await.unwrap();
        let got = within(
            Duration::from_secs(5),
            "the waiter woken by the release",
            waiter,
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(got.token(), 2);
    });
}

/// A renewal refused (the grant released behind the guard's back, and
/// the key taken by someone else) resolves `lost()` and cancels the token.
pub fn the_loss_is_a_future_and_a_cancelled_token(make: &Make) {
    let f = make();
    runtime(8).block_on(async {
        let a = client(&f);
        let guard = a.acquire("lost", LeaseOptions::new(ms(900))).await.unwrap();
        let token = guard.cancellation();
        assert!(guard.is_valid() && !token.is_cancelled());
        let sabotage = twin(&f, &a);
        tokio::task::spawn_blocking(move || sabotage.release("lost", 1))
            .await
            .unwrap()
            .unwrap();
        let c = client(&f);
        let other = c
            .acquire("lost", LeaseOptions::new(Duration::from_secs(30)))
            .await
            .unwrap();
        assert_eq!(other.token(), 2);
        let reason = within(Duration::from_secs(3), "lost()", guard.lost()).await;
        assert!(
            matches!(
                reason,
                leasehold::LostReason::StaleToken | leasehold::LostReason::NotHolder
            ),
            "{reason:?}"
        );
        within(ms(100), "the cancellation token", token.cancelled()).await;
        assert!(!guard.is_valid());
        assert_eq!(guard.lost_reason(), Some(reason));
        // Releasing a lost lease says so, and touches nothing.
        let released = guard.release().await;
        assert!(
            matches!(released, Err(leasehold::Error::Lost { .. })),
            "{released:?}"
        );
        assert_eq!(c.inspect("lost").await.unwrap().holders.len(), 1);
    });
}

/// A guard renewed many times, then released: the key is free at once
/// and stays free (no renewal outlives the release). (A TTL of 300 ms: at
/// 150 ms, a PostgreSQL renewal's commit delayed past 100 ms on a loaded
/// machine once let the lease expire.)
pub fn release_awaits_the_keep_alive(make: &Make) {
    let f = make();
    runtime(8).block_on(async {
        let a = client(&f);
        for round in 0..5 {
            let guard = a.acquire("kept", LeaseOptions::new(ms(300))).await.unwrap();
            tokio::time::sleep(ms(700 + round * 7)).await;
            assert!(guard.is_valid(), "the keep-alive kept it past its TTL");
            guard.release().await.unwrap();
            assert!(a.inspect("kept").await.unwrap().holders.is_empty());
            tokio::time::sleep(ms(60)).await;
            assert!(a.inspect("kept").await.unwrap().holders.is_empty());
        }
    });
}

pub fn a_dropped_guard_is_released_in_the_background(make: &Make) {
    let f = make();
    runtime(8).block_on(async {
        let a = client(&f);
        let guard = a
            .acquire("dropped", LeaseOptions::new(Duration::from_secs(60)))
            .await
            .unwrap();
        drop(guard);
        let b = client(&f);
        let opts = LeaseOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(5));
        let started = Instant::now();
        let got = b.acquire("dropped", opts).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(got.token(), 2);
    });
}
