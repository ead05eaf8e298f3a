//! Jobs: the worker loop (concurrency, cancellation, loss, shutdown and
//! its races, panics, results) and jobs claimed by hand.

use super::*;

fn push_n(f: &Fresh, queue: &str, n: usize, spec: JobSpec) -> Vec<JobId> {
    let sync = leasehold::Client::builder_shared(f.store.clone()).build();
    let q = sync.queue(queue).unwrap();
    (0..n).map(|_| q.push(&spec).unwrap().id).collect()
}

pub fn worker_runs_handlers_concurrently_and_completes_every_job(make: &Make) {
    let f = make();
    push_n(&f, "many", 100, JobSpec::new(b"x".to_vec()));
    runtime(8).block_on(async {
        let q = client(&f).queue("many").unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let opts = WorkOptions {
            concurrency: 8,
            drain: true,
            ..WorkOptions::default()
        };
        let (r, m) = (running.clone(), most.clone());
        let report = within(
            Duration::from_secs(60),
            "draining 100 jobs",
            q.work(&opts, std::future::pending(), move |job| {
                let (r, m) = (r.clone(), m.clone());
                async move {
                    assert_eq!(job.payload(), b"x");
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(ms(10)).await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                }
            }),
        )
        .await
        .unwrap();
        assert_eq!(report.completed, 100, "{report:?}");
        let most = most.load(Ordering::SeqCst);
        assert!((2..=8).contains(&most), "{most} handlers at once");
        assert_eq!(q.stats().await.unwrap().get(JobState::Done), 100);
    });
}

/// A batch pushed through the tokio client wakes an idle worker, whose
/// one handler runs the jobs in push order.
pub fn a_batch_push_wakes_an_idle_worker_and_keeps_its_order(make: &Make) {
    let f = make();
    runtime(4).block_on(async {
        let c = client(&f);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let opts = WorkOptions {
            concurrency: 1,
            ..WorkOptions::default()
        };
        let (stop, worker) = spawn_worker(&c, "batch", opts, move |job| {
            s.lock().unwrap().push(job.payload().to_vec());
            async { Ok(()) }
        });
        tokio::time::sleep(ms(50)).await;
        let q = c.queue("batch").unwrap();
        assert!(q.push_many(&[]).await.unwrap().is_empty());
        let specs: Vec<JobSpec> = (0..5u8).map(|i| JobSpec::new(vec![i])).collect();
        let out = q.push_many(&specs).await.unwrap();
        assert!(out.iter().all(|o| o.created));
        assert!(out.windows(2).all(|w| w[0].id < w[1].id), "{out:?}");
        within(Duration::from_secs(10), "the batch is run", async {
            while seen.lock().unwrap().len() < 5 {
                tokio::time::sleep(ms(5)).await;
            }
        })
        .await;
        let _ = stop.send(());
        let report = worker.await.unwrap().unwrap();
        assert_eq!(report.completed, 5, "{report:?}");
        let order: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i]).collect();
        assert_eq!(*seen.lock().unwrap(), order);
    });
}

/// Run a worker on `queue` with `handler` until `stop` fires.
fn spawn_worker<F, Fut>(
    c: &Client,
    queue: &str,
    opts: WorkOptions,
    handler: F,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<leasehold::Result<leasehold::WorkReport>>,
)
where
    F: Fn(ClaimedJob) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
{
    let (stop, stopped) = oneshot::channel::<()>();
    let q = c.queue(queue).unwrap();
    let worker = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        q.work(&opts, shutdown, handler).await
    });
    (stop, worker)
}

/// A handler that says it started and then waits forever, marking when
/// its future is dropped.
fn hanging(
    started: Arc<Mutex<Vec<(JobId, u64)>>>,
    dropped: Arc<AtomicBool>,
) -> impl Fn(
    ClaimedJob,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>
       + Send
       + Sync
       + 'static {
    move |job| {
        let flag = DropFlag(dropped.clone());
        started.lock().unwrap().push((job.id(), job.token()));
        Box::pin(async move {
            let _flag = flag;
            std::future::pending::<()>().await;
            Ok(())
        })
    }
}

pub fn a_cancelled_job_drops_its_handler_future(make: &Make) {
    let f = make();
    let ids = push_n(&f, "cancel", 1, JobSpec::new(b"c".to_vec()));
    runtime(8).block_on(async {
        let c = client(&f);
        let started = Arc::new(Mutex::new(Vec::new()));
        let dropped = Arc::new(AtomicBool::new(false));
        let opts = WorkOptions {
            lease: Duration::from_secs(30),
            ..WorkOptions::default()
        };
        let (stop, worker) = spawn_worker(
            &c,
            "cancel",
            opts,
            hanging(started.clone(), dropped.clone()),
        );
        until(Duration::from_secs(5), "the handler started", || {
            !started.lock().unwrap().is_empty()
        })
        .await;
        assert_eq!(c.cancel_job(ids[0]).await.unwrap(), JobState::Running);
        // Heartbeats come at least every second: the cancel is seen, the
        // future dropped.
        until(
            Duration::from_secs(3),
            "the handler's future dropped",
            || dropped.load(Ordering::SeqCst),
        )
        .await;
        within(Duration::from_secs(3), "the job cancelled", async {
            while c.job(ids[0]).await.unwrap().state != JobState::Cancelled {
                tokio::time::sleep(ms(10)).await;
            }
        })
        .await;
        let _ = stop.send(());
        within(Duration::from_secs(5), "the worker stops", worker)
            .await
            .unwrap()
            .unwrap();
    });
}

pub fn a_lost_claim_drops_its_handler_future(make: &Make) {
    let f = make();
    let ids = push_n(&f, "loss", 1, JobSpec::new(b"l".to_vec()));
    runtime(8).block_on(async {
        let c = client(&f);
        let started = Arc::new(Mutex::new(Vec::new()));
        let dropped = Arc::new(AtomicBool::new(false));
        let opts = WorkOptions {
            lease: Duration::from_secs(30),
            shutdown_grace: ms(300),
            ..WorkOptions::default()
        };
        let (stop, worker) =
            spawn_worker(&c, "loss", opts, hanging(started.clone(), dropped.clone()));
        until(Duration::from_secs(5), "the handler started", || {
            !started.lock().unwrap().is_empty()
        })
        .await;
        let (id, token) = started.lock().unwrap()[0];
        assert_eq!(id, ids[0]);
        // The claim is given back behind the worker's back: its next
        // renewal round finds the token stale.
        let sabotage = twin(&f, &c);
        let holder = c.holder().id;
        tokio::task::spawn_blocking(move || {
            sabotage
                .store()
                .txn(|tx| core::job::abandon(tx, id, holder, token, true))
        })
        .await
        .unwrap()
        .unwrap();
        until(
            Duration::from_secs(3),
            "the handler's future dropped",
            || dropped.load(Ordering::SeqCst),
        )
        .await;
        let _ = stop.send(());
        let report = within(Duration::from_secs(5), "the worker stops", worker)
            .await
            .unwrap()
            .unwrap();
        assert!(report.lost >= 1, "{report:?}");
        assert_eq!(report.completed, 0, "{report:?}");
    });
}

pub fn shutdown_lets_handlers_finish_then_gives_jobs_back(make: &Make) {
    let f = make();
    let ids = push_n(&f, "shut", 3, JobSpec::new(b"s".to_vec()));
    runtime(8).block_on(async {
        let c = client(&f);
        let started = Arc::new(AtomicUsize::new(0));
        let stopping = Arc::new(Notify::new());
        let dropped = Arc::new(AtomicUsize::new(0));
        let quick = ids[0];
        let opts = WorkOptions {
            concurrency: 3,
            prefetch: 0,
            shutdown_grace: ms(600),
            ..WorkOptions::default()
        };
        let (s, n, d) = (started.clone(), stopping.clone(), dropped.clone());
        let (stop, worker) = spawn_worker(&c, "shut", opts, move |job| {
            let (s, n, d) = (s.clone(), n.clone(), d.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                struct Count(Arc<AtomicUsize>);
                impl Drop for Count {
                    fn drop(&mut self) {
                        self.0.fetch_add(1, Ordering::SeqCst);
                    }
                }
                let _count = Count(d);
                if job.id() == quick {
                    // Finishes on its own soon after the shutdown.
                    n.notified().await;
                    tokio::time::sleep(ms(100)).await;
                    return Ok(());
                }
                std::future::pending::<()>().await;
                Ok(())
            }
        });
        until(Duration::from_secs(5), "three handlers started", || {
            started.load(Ordering::SeqCst) == 3
        })
        .await;
        let t0 = Instant::now();
        let _ = stop.send(());
        tokio::time::sleep(ms(20)).await;
        stopping.notify_waiters();
        let report = within(Duration::from_secs(5), "the worker stops", worker)
            .await
            .unwrap()
            .unwrap();
        let took = t0.elapsed();
        assert!(
            took >= ms(550),
            "returned after {took:?}, before the grace ran out"
        );
        assert_eq!((report.completed, report.abandoned), (1, 2), "{report:?}");
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            3,
            "every handler future ended"
        );
        assert_eq!(c.job(quick).await.unwrap().state, JobState::Done);
        for id in &ids[1..] {
            let job = c.job(*id).await.unwrap();
            assert_eq!(
                job.state,
                JobState::Ready,
                "given back to be retried: {job:?}"
            );
            assert!(job.claim.is_none());
        }
    });
}

/// Shutdown at random instants while claims are in flight: nothing is
/// left running, nothing is lost, every job done was reported done.
pub fn shutdown_racing_claims_loses_no_job(make: &Make) {
    let f = make();
    runtime(8).block_on(async {
        let c = client(&f);
        for round in 0..25u64 {
            let queue = format!("race{round}");
            let q = c.queue(&queue).unwrap();
            for _ in 0..20 {
                q.push(&JobSpec::new(b"r".to_vec())).await.unwrap();
            }
            let opts = WorkOptions {
                concurrency: 4,
                batch: 3,
                shutdown_grace: Duration::from_secs(5),
                ..WorkOptions::default()
            };
            let handled = Arc::new(AtomicUsize::new(0));
            let h = handled.clone();
            let (stop, worker) = spawn_worker(&c, &queue, opts, move |_job| {
                let h = h.clone();
                async move {
                    tokio::time::sleep(ms(round % 3)).await;
                    h.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            });
            tokio::time::sleep(ms(round * 7 % 19)).await;
            let _ = stop.send(());
            let report = within(Duration::from_secs(10), "the worker stops", worker)
                .await
                .unwrap()
                .unwrap();
            let stats = c.queue(&queue).unwrap().stats().await.unwrap();
            assert_eq!(stats.get(JobState::Running), 0, "round {round}: {stats:?}");
            assert_eq!(
                stats.get(JobState::Done) + stats.get(JobState::Ready),
                20,
                "round {round}: {stats:?}"
            );
            assert_eq!(
                report.completed,
                stats.get(JobState::Done),
                "round {round}: {report:?}"
            );
            assert_eq!(
                report.completed as usize,
                handled.load(Ordering::SeqCst),
                "round {round}"
            );
        }
    });
}

/// The claim given back at the instant its handler returns `Ok`: the
/// outcome the loop reports is what the store kept. Done means done on
/// that attempt; lost means that attempt's completion was refused.
pub fn a_loss_racing_a_completion_is_reported_as_what_the_store_kept(make: &Make) {
    let f = make();
    runtime(8).block_on(async {
        let c = client(&f);
        let mut seen = HashMap::new();
        for round in 0..20u64 {
            let queue = format!("lossrace{round}");
            let q = c.queue(&queue).unwrap();
            let id = q.push(&JobSpec::new(b"r".to_vec())).await.unwrap().id;
            let (claimed_tx, claimed_rx) = std::sync::mpsc::channel::<u64>();
            let go = Arc::new(Notify::new());
            let first: Arc<Mutex<Option<JobOutcome>>> = Arc::new(Mutex::new(None));
            let g = go.clone();
            let claimed_tx = Mutex::new(claimed_tx);
            let (stop, stopped) = oneshot::channel::<()>();
            let seen_first = first.clone();
            let worker = tokio::spawn(async move {
                let handler = move |job: ClaimedJob| {
                    let g = g.clone();
                    let _ = claimed_tx.lock().unwrap().send(job.token());
                    async move {
                        g.notified().await;
                        Ok(())
                    }
                };
                let observe = move |_: &leasehold::JobRecord, outcome: JobOutcome| {
                    seen_first.lock().unwrap().get_or_insert(outcome);
                };
                let shutdown = async move {
                    let _ = stopped.await;
                };
                // A claim taken again after the give-back waits for a "go"
                // that was already given: shutdown abandons it.
                let opts = WorkOptions {
                    shutdown_grace: ms(200),
                    ..WorkOptions::default()
                };
                q.work_with(&opts, shutdown, handler, observe).await
            });
            let token = tokio::task::spawn_blocking(move || claimed_rx.recv().unwrap())
                .await
                .unwrap();
            let sabotage = twin(&f, &c);
            let holder = c.holder().id;
            let give_back = tokio::task::spawn_blocking(move || {
                sabotage
                    .store()
                    .txn(|tx| core::job::abandon(tx, id, holder, token, true))
            });
            tokio::time::sleep(ms(round % 4)).await;
            go.notify_waiters();
            let _ = give_back.await.unwrap();
            until(Duration::from_secs(5), "the first outcome", || first.lock().unwrap().is_some()).await;
            let _ = stop.send(());
            go.notify_waiters();
            within(Duration::from_secs(10), "the worker stops", worker).await.unwrap().unwrap();
            let outcome = first.lock().unwrap().unwrap();
            let job = c.job(id).await.unwrap();
            match outcome {
                JobOutcome::Done => {
                    assert_eq!((job.state, job.attempts), (JobState::Done, 1), "round {round}")
                }
                JobOutcome::Lost => assert!(
                    !(job.state == JobState::Done && job.attempts == 1),
                    "round {round}: reported lost, but the first attempt's completion was kept: {job:?}"
                ),
                other => panic!("round {round}: {other:?}"),
            }
            *seen.entry(format!("{outcome:?}")).or_insert(0) += 1;
        }
        assert!(!seen.is_empty());
    });
}

pub fn a_panicking_handler_fails_its_job(make: &Make) {
    let f = make();
    let spec = JobSpec {
        max_attempts: 1,
        ..JobSpec::new(b"p".to_vec())
    };
    let ids = push_n(&f, "panics", 1, spec);
    runtime(8).block_on(async {
        let q = client(&f).queue("panics").unwrap();
        let opts = WorkOptions {
            drain: true,
            ..WorkOptions::default()
        };
        let report = within(
            Duration::from_secs(10),
            "draining",
            q.work(&opts, std::future::pending(), |_job| async move {
                if true {
                    panic!("boom in the handler");
                }
                Ok(())
            }),
        )
        .await
        .unwrap();
        assert_eq!(report.failed, 1, "{report:?}");
        let job = q.get(ids[0]).await.unwrap();
        assert_eq!(job.state, JobState::Dead);
        let error = job.last_error.unwrap_or_default();
        assert!(
            error.contains("panicked") && error.contains("boom"),
            "{error}"
        );
    });
}

pub fn claimed_by_hand_with_a_keep_alive_task(make: &Make) {
    let f = make();
    let ids = push_n(&f, "byhand", 2, JobSpec::new(b"h".to_vec()));
    runtime(8).block_on(async {
        let c = client(&f);
        let q = c.queue("byhand").unwrap();
        let job = q.claim(ms(300)).await.unwrap().expect("a job");
        assert_eq!(job.id(), ids[0]);
        job.keep_alive().unwrap();
        tokio::time::sleep(ms(900)).await;
        assert!(job.is_valid(), "kept past three leases");
        assert!(
            job.fail(&"x".repeat(5000)).await.is_err(),
            "a reason too long is refused"
        );
        assert!(job.is_valid(), "and the claim is untouched");
        job.complete().await.unwrap();
        assert_eq!(c.job(ids[0]).await.unwrap().state, JobState::Done);
        // Settled: the handle refuses more, and the keep-alive has stopped.
        assert!(job.complete().await.is_err());
        assert!(!job.is_valid());
        let second = q.claim(ms(300)).await.unwrap().expect("a job");
        assert!(!second.heartbeat().await.unwrap(), "no cancel requested");
        assert_eq!(second.abandon().await.unwrap(), JobState::Ready);
    });
}

/// A handler's result, set on its job, is kept with the job once it
/// returns `Ok`; typed JSON in and out.
pub fn a_handlers_result_is_kept_with_its_job(make: &Make) {
    let f = make();
    runtime(8).block_on(async {
        let q = client(&f).queue("results").unwrap();
        let id = q
            .push(&JobSpec::json(&vec![1, 2, 3]).unwrap())
            .await
            .unwrap()
            .id;
        let opts = WorkOptions {
            drain: true,
            ..WorkOptions::default()
        };
        q.work(&opts, std::future::pending(), |job| async move {
            let v: Vec<u32> = job.payload_json().map_err(|e| e.to_string())?;
            job.set_result_json(&v.iter().sum::<u32>())
                .map_err(|e| e.to_string())
        })
        .await
        .unwrap();
        let job = q.get(id).await.unwrap();
        assert_eq!(job.state, JobState::Done);
        assert_eq!(job.result_json::<u32>().unwrap(), Some(6));
    });
}
