//! The async API on every store: acquire and wait, the loss future, the
//! worker with concurrency, cancellation, shutdown, and the races between
//! shutdown and claims and between a loss and a completion (`cases.rs`).

#![cfg(not(loom))]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests read real time and sleep

#[path = "../support/dir.rs"]
mod dir;
#[path = "../support/door.rs"]
mod door;
#[path = "../support/flaky.rs"]
mod flaky;
#[path = "../support/pg.rs"]
mod pg;

use dir::Dir;

mod cancelled;
mod cases;
mod election;
mod panics;

use leasehold::Store;
use std::sync::Arc;

/// A fresh store and whatever it lives in (dropped after it).
pub struct Fresh {
    pub store: Arc<dyn Store>,
    _keep: Box<dyn std::any::Any + Send>,
}

/// A fresh directory for the async tests, removed when dropped.
fn temp_dir(tag: &str) -> Dir {
    Dir::new(&format!("tokio-{tag}"))
}

/// Generates one `#[test]` per case for a store factory; `$guard` says
/// whether the store is there (PostgreSQL prints why it skips).
macro_rules! tokio_cases {
    ($guard:expr, $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let run: fn() -> bool = $guard;
                if run() {
                    $crate::cases::$case(&$make);
                }
            }
        )*
    };
    ($guard:expr, $make:expr) => {
        tokio_cases!($guard, $make;
            acquire_waits_without_a_thread_per_waiter,
            tasks_of_one_client_take_turns,
            a_release_cut_short_still_ends_the_hold,
            a_waiting_acquire_is_woken_by_a_release,
            the_loss_is_a_future_and_a_cancelled_token,
            release_awaits_the_keep_alive,
            a_dropped_guard_is_released_in_the_background,
            worker_runs_handlers_concurrently_and_completes_every_job,
            a_cancelled_job_drops_its_handler_future,
            a_lost_claim_drops_its_handler_future,
            shutdown_lets_handlers_finish_then_gives_jobs_back,
            shutdown_racing_claims_loses_no_job,
            a_loss_racing_a_completion_is_reported_as_what_the_store_kept,
            a_panicking_handler_fails_its_job,
            claimed_by_hand_with_a_keep_alive_task,
            elections_hand_over_on_resign,
            async_workers_fire_each_tick_once,
            a_handlers_result_is_kept_with_its_job,
            a_batch_push_wakes_an_idle_worker_and_keeps_its_order,
        );
    };
}

mod mem {
    use super::Fresh;
    tokio_cases!(|| true, || Fresh {
        store: std::sync::Arc::new(leasehold::MemStore::new()),
        _keep: Box::new(()),
    });
}

mod sqlite {
    use super::{temp_dir, Fresh};
    tokio_cases!(|| true, || {
        let dir = temp_dir("sqlite");
        let store = leasehold::SqliteStore::open(dir.0.join("lh.db")).unwrap();
        Fresh {
            store: std::sync::Arc::new(store),
            _keep: Box::new(dir),
        }
    });
}

mod postgres {
    use super::{pg, Fresh};
    tokio_cases!(pg::enabled, || {
        let schema = pg::Schema::new("tokio");
        let store = schema.open(leasehold::PostgresOptions::default());
        Fresh {
            store: std::sync::Arc::new(store),
            _keep: Box::new(schema),
        }
    });
}

#[test]
fn a_late_answer_of_a_lost_term_does_not_end_the_next() {
    election::a_late_answer_of_a_lost_term_does_not_end_the_next();
}

#[test]
fn a_hung_store_call_does_not_delay_the_end_of_a_term() {
    let dir = temp_dir("hung");
    election::a_hung_store_call_does_not_delay_the_end_of_a_term(&dir.0.join("lh.db"));
}

/// A PostgreSQL store dropped inside async code (the end of a
/// `#[tokio::main]`): its sessions are closed without blocking a runtime
/// thread (the driver's own close would panic there).
#[test]
fn a_postgres_store_dropped_inside_a_runtime_closes_quietly() {
    if !pg::enabled() {
        return;
    }
    let schema = pg::Schema::new("tokiodrop");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = schema.open(leasehold::PostgresOptions::default());
        let client = leasehold::tokio::Client::new(leasehold::Client::new(store));
        let guard = client
            .acquire(
                "k",
                leasehold::LeaseOptions::new(std::time::Duration::from_secs(5)),
            )
            .await
            .unwrap();
        guard.release().await.unwrap();
        drop(client);
    });
}

/// A guard lost at its local deadline while the store still counts its
/// grant live is released by token all the same, by `release` or by drop:
/// another holder gets the key at once, and the same client's next grant
/// has a new token (the sync guard's test, `tests/client.rs`).
#[test]
fn a_guard_lost_at_its_local_deadline_is_released_by_token() {
    use leasehold::{Holder, HolderId, LostReason, ManualClock, MemStore};
    use std::time::Duration;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for by_drop in [false, true] {
        let clock = ManualClock::new(1_000_000);
        let flaky = Arc::new(flaky::Flaky::new(
            MemStore::with_clock(Arc::new(clock.clone())),
            0,
        ));
        let client = |n| {
            leasehold::tokio::Client::new(
                leasehold::Client::builder_shared(flaky.clone())
                    .clock(Arc::new(clock.clone()))
                    .holder(Holder::new(HolderId(n)))
                    .build(),
            )
        };
        let (mine, other) = (client(1), client(2));
        rt.block_on(async {
            let ttl = Duration::from_secs(3);
            let guard = mine.try_acquire("k", ttl).await.unwrap();
            let token = guard.token();
            // Past the local deadline (2,970 ms), inside the store's TTL.
            clock.advance(2_980);
            flaky.failing(true);
            assert!(guard.renew().await.is_err());
            assert_eq!(guard.lost_reason(), Some(LostReason::LocalDeadline));
            flaky.failing(false);
            if by_drop {
                drop(guard);
                // The release runs as a task: wait for the key to be free.
                let mut tries = 0;
                let taken = loop {
                    if let Ok(taken) = other.try_acquire("k", ttl).await {
                        break taken;
                    }
                    tries += 1;
                    assert!(tries < 500, "the dropped guard's grant still holds the key");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                };
                assert!(taken.token() > token);
                taken.release().await.unwrap();
            } else {
                let released = guard.release().await;
                assert!(flaky::lost_at_the_deadline(&released), "{released:?}");
                let again = mine.try_acquire("k", ttl).await.unwrap();
                assert!(!again.renewed());
                assert!(again.token() > token, "reused token {token}");
                again.release().await.unwrap();
                let taken = other.try_acquire("k", ttl).await.unwrap();
                assert!(taken.token() > token);
                taken.release().await.unwrap();
            }
        });
    }
}

/// The mem store's calls run on the calling task (`Store::runs_inline`):
/// with the runtime's one blocking thread busy, a lease pair, a push, a
/// claim and its completion still go through at once.
#[test]
fn mem_store_calls_do_not_wait_for_the_blocking_pool() {
    use std::time::{Duration, Instant};
    let rt = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client =
            leasehold::tokio::Client::new(leasehold::Client::new(leasehold::MemStore::new()));
        let busy = tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_secs(3)));
        // Let the blocking thread start its sleep.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        let guard = client
            .try_acquire("k", Duration::from_secs(10))
            .await
            .unwrap();
        guard.release().await.unwrap();
        let queue = client.queue("q").unwrap();
        queue.push(&leasehold::JobSpec::new("x")).await.unwrap();
        let job = queue
            .claim(Duration::from_secs(10))
            .await
            .unwrap()
            .expect("a job");
        job.complete().await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "waited {:?} for the blocking pool",
            started.elapsed()
        );
        busy.await.unwrap();
    });
}

/// Inline calls still yield now and then: on a one-thread runtime, a loop
/// trying a key that a dropped guard is releasing (in a task of its own)
/// gets it, instead of spinning while the release never runs.
#[test]
fn a_loop_of_inline_calls_lets_other_tasks_run() {
    use std::time::Duration;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = leasehold::MemStore::new();
        let client = leasehold::tokio::Client::new(leasehold::Client::new(store));
        let ttl = Duration::from_secs(30);
        drop(client.try_acquire("k", ttl).await.unwrap());
        let mut tries = 0u32;
        while client.try_acquire("k", ttl).await.is_err() {
            tries += 1;
            assert!(tries < 100_000, "the dropped guard's release never ran");
        }
    });
}

/// A mem store's calls run inline, but not those whose cost grows with the
/// queue (`purge`, `list`): they go to the blocking pool, so a purge of a
/// large queue does not hold a runtime thread. (A store that runs inline
/// and says on which thread each transaction ran.)
#[test]
fn calls_that_grow_with_the_queue_leave_the_runtime_thread() {
    use leasehold::core::Txn;
    use std::sync::{Arc, Mutex};
    use std::thread::ThreadId;
    struct Where {
        inner: leasehold::MemStore,
        ran_on: Mutex<Vec<ThreadId>>,
    }
    impl Store for Where {
        fn transact(
            &self,
            f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
        ) -> leasehold::Result<()> {
            self.ran_on
                .lock()
                .unwrap()
                .push(std::thread::current().id());
            self.inner.transact(f)
        }
        fn runs_inline(&self) -> bool {
            true
        }
        fn describe(&self) -> String {
            "where".into()
        }
    }
    let store = Arc::new(Where {
        inner: leasehold::MemStore::new(),
        ran_on: Mutex::new(Vec::new()),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let here = std::thread::current().id();
    // Whether each transaction `call` ran was on the runtime's thread.
    let on_this_thread = |call: &str| {
        let ran = std::mem::take(&mut *store.ran_on.lock().unwrap());
        assert!(!ran.is_empty(), "{call} ran no transaction");
        ran.iter().all(|t| *t == here)
    };
    rt.block_on(async {
        let client =
            leasehold::tokio::Client::new(leasehold::Client::builder_shared(store.clone()).build());
        let queue = client.queue("q").unwrap();
        let pushed = queue.push(&leasehold::JobSpec::new("x")).await.unwrap();
        assert!(on_this_thread("push"));
        queue.get(pushed.id).await.unwrap();
        assert!(on_this_thread("get"));
        queue.purge(std::time::Duration::ZERO).await.unwrap();
        assert!(!on_this_thread("purge"));
        queue
            .list(Some(leasehold::JobState::Done), leasehold::JobId(0), 10)
            .await
            .unwrap();
        assert!(!on_this_thread("list"));
    });
}
