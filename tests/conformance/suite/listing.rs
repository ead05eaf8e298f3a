//! Listing cases: held keys (live holders only, paged), queue names, one
//! state's jobs in its index order a page at a time, capped counts, the
//! oldest ready job and the finished jobs per interval.

use super::*;
use leasehold::core::{JobCursor, JobPeek, LeasePage, QueueSummary, SummaryOptions};

/// Counts up to 2; three intervals of a second.
const SUMMARY: SummaryOptions = SummaryOptions {
    count_cap: 2,
    bucket_ms: 1000,
    buckets: 3,
};

impl World {
    pub fn lease_page(&self, after: &str, limit: usize) -> LeasePage {
        self.tx(|tx| core::lease::list(tx, after, limit)).unwrap()
    }

    /// Every held key, page after page of `limit` records.
    pub fn held(&self, limit: usize) -> Vec<(String, core::lease::LeaseInfo)> {
        let mut all = Vec::new();
        let mut after = String::new();
        for _ in 0..10_000 {
            let page = self.lease_page(&after, limit);
            all.extend(page.leases);
            match page.next {
                Some(next) => after = next,
                None => return all,
            }
        }
        panic!("paging never ended");
    }

    pub fn queues(&self, after: &str, limit: usize) -> Vec<String> {
        self.tx(|tx| core::job::queues(tx, after, limit)).unwrap()
    }

    pub fn page(
        &self,
        queue: &str,
        state: JobState,
        after: Option<JobCursor>,
        limit: usize,
    ) -> Vec<JobPeek> {
        let policy = self.policy;
        self.tx(|tx| core::job::page(tx, queue, state, after, limit, 3, &policy))
            .unwrap()
    }

    pub fn summary(&self, queue: &str, opts: &SummaryOptions) -> QueueSummary {
        let policy = self.policy;
        self.tx(|tx| core::job::summary(tx, queue, &policy, opts))
            .unwrap()
    }

    pub fn cancel(&self, id: JobId) -> JobState {
        let policy = self.policy;
        self.tx(|tx| core::job::cancel(tx, id, &policy)).unwrap()
    }
}

pub fn lease_list_shows_live_holders_only(make: &Make) {
    let w = World::new(make);
    w.acquire("a", 1, 1000, 1).unwrap();
    w.acquire("b", 1, 1000, 3).unwrap();
    w.acquire("b", 2, 500, 3).unwrap();
    let c = w.acquire("c", 3, 1000, 1).unwrap();
    w.release("c", 3, c.token).unwrap();
    w.acquire("d", 4, 100, 1).unwrap();
    let keys: Vec<String> = w.held(10).into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["a", "b", "d"], "c released; d live until T0 + 100");
    // d's slot lingers in the store (expiry is lazy) but is not listed.
    w.at(T0 + 100);
    let held = w.held(10);
    let keys: Vec<&str> = held.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b"]);
    for (key, info) in &held {
        assert_eq!(*info, w.inspect(key), "listed as inspect says: {key}");
    }
    let b = &held[1].1;
    assert_eq!((b.holders.len(), b.limit, b.last_token), (2, 3, 2));
    assert_eq!(b.holders[1].holder.label.as_deref(), Some("h2"));
    assert_eq!(b.holders[1].expires_at_ms, T0 + 500);
    // b's second holder runs out: one of three.
    w.at(T0 + 500);
    let held = w.held(10);
    assert_eq!(held[1].1.holders.len(), 1);
    w.at(T0 + 1000);
    assert!(w.held(10).is_empty(), "nothing is held any more");
    assert_eq!(w.inspect("a").last_token, 1, "listing changed nothing");
}

pub fn lease_list_pages_through_every_key(make: &Make) {
    let w = World::new(make);
    let mut keys: Vec<String> = (0..23).map(|i| format!("k{i:02}")).collect();
    for (i, key) in keys.iter().enumerate() {
        w.acquire(key, i as u128 + 1, 10_000, 1).unwrap();
    }
    let page = w.lease_page("", 10);
    assert_eq!(page.leases.len(), 10);
    assert_eq!(page.next.as_deref(), Some("k09"));
    let page = w.lease_page("k09", 10);
    assert_eq!(page.leases[0].0, "k10");
    let held: Vec<String> = w.held(10).into_iter().map(|(k, _)| k).collect();
    assert_eq!(held, keys, "every key once, in order");
    // Hostile keys list as themselves, each once.
    let hostile = [
        "../x",
        "<script>alert(1)</script>",
        "it's \"q\"",
        "ключ",
        "a b",
    ];
    for (i, key) in hostile.iter().enumerate() {
        w.acquire(key, 100 + i as u128, 10_000, 1).unwrap();
    }
    keys.extend(hostile.iter().map(|k| k.to_string()));
    keys.sort();
    let mut held: Vec<String> = w.held(3).into_iter().map(|(k, _)| k).collect();
    held.sort();
    assert_eq!(held, keys);
    // Bad paging arguments are refused by name.
    for limit in [0, core::MAX_BATCH + 1] {
        let r = w.tx(|tx| core::lease::list(tx, "", limit));
        assert!(
            matches!(
                r,
                Err(Error::Invalid {
                    field: leasehold::Field::Limit,
                    ..
                })
            ),
            "{limit}: {r:?}"
        );
    }
    // The largest page is allowed.
    assert_eq!(w.lease_page("", core::MAX_BATCH).leases.len(), keys.len());
    let r = w.tx(|tx| core::lease::list(tx, "a\0b", 5));
    assert!(
        matches!(
            r,
            Err(Error::Invalid {
                field: leasehold::Field::After,
                ..
            })
        ),
        "{r:?}"
    );
}

/// Jobs in every state of queue `q`: (ready, scheduled, running, done,
/// dead, cancelled) ids.
fn every_state(w: &World, queue: &str) -> [JobId; 6] {
    let dead = w.push(
        queue,
        JobSpec {
            max_attempts: 1,
            ..JobSpec::new("dead")
        },
    );
    let job = w.claim_one(queue, 9, 1000);
    w.fail(&job, 9, "<b>boom</b>").unwrap();
    let done = w.push(queue, JobSpec::new("done"));
    let job = w.claim_one(queue, 9, 1000);
    w.complete(&job, 9).unwrap();
    let running = w.push(queue, JobSpec::new("running"));
    w.claim_one(queue, 9, 100_000);
    let cancelled = w.push(queue, JobSpec::new("cancelled"));
    w.cancel(cancelled);
    let scheduled = w.push(
        queue,
        JobSpec {
            delay_ms: 5000,
            ..JobSpec::new("later")
        },
    );
    let ready = w.push(queue, JobSpec::new("ready"));
    [ready, scheduled, running, done, dead, cancelled]
}

pub fn job_queues_are_listed(make: &Make) {
    let w = World::new(make);
    every_state(&w, "m");
    w.push("b", JobSpec::new("x"));
    w.push("a<q's>", JobSpec::new("x"));
    every_state(&w, "z/y");
    // Names in the same order bytewise and in any collation (PostgreSQL
    // orders by the database's).
    assert_eq!(w.queues("", 10), ["a<q's>", "b", "m", "z/y"]);
    assert_eq!(w.queues("", 2), ["a<q's>", "b"]);
    assert_eq!(w.queues("b", 2), ["m", "z/y"]);
    assert!(w.queues("z/y", 2).is_empty());
    // A queue with only finished jobs is listed; once purged, it is gone.
    let job = w.claim_one("b", 1, 100);
    w.complete(&job, 1).unwrap();
    assert_eq!(w.queues("a<q's>", 1), ["b"]);
    w.tx(|tx| core::job::purge(tx, "b", 0, 100, &QueuePolicy::default()))
        .unwrap();
    assert_eq!(w.queues("", 10), ["a<q's>", "m", "z/y"]);
    let r = w.tx(|tx| core::job::queues(tx, "", 0));
    assert!(
        matches!(
            r,
            Err(Error::Invalid {
                field: leasehold::Field::Limit,
                ..
            })
        ),
        "{r:?}"
    );
}

pub fn job_pages_follow_each_states_index_order(make: &Make) {
    let w = World::new(make);
    // Several jobs per state, at different instants and priorities.
    for round in 0..3u64 {
        w.at(T0 + round * 10);
        for p in [0, 5, -2] {
            let spec = |payload: &str| JobSpec {
                priority: p,
                ..JobSpec::new(format!("{payload}-{round}-{p}"))
            };
            w.push("q", spec("ready"));
            w.push(
                "q",
                JobSpec {
                    delay_ms: 1000 - round * 100,
                    ..spec("sched")
                },
            );
            w.push(
                "q",
                JobSpec {
                    max_attempts: 1,
                    ..spec("dead")
                },
            );
            w.push("q", spec("extra"));
        }
        // Nine claimable: three fail (one dead), two done, one running.
        for job in w.claim("q", 1, 5000 - round * 1000, 3) {
            w.fail(&job, 1, "no").unwrap();
        }
        for job in w.claim("q", 1, 5000 - round * 1000, 2) {
            w.complete(&job, 1).unwrap();
        }
        w.claim("q", 1, 5000 - round * 1000, 1);
        let c = w.push("q", spec_cancel(round));
        w.cancel(c);
    }
    // Waiting jobs, behind a running one (listed by id).
    let running = w.list("q", Some(JobState::Running))[0].id;
    for i in 0..3 {
        w.push(
            "q",
            JobSpec {
                after: vec![running],
                ..JobSpec::new(format!("waiting-{i}"))
            },
        );
    }
    // The claims took the higher priorities: leave ready jobs of several
    // priorities (and ties) too, so the ready order's priority is tested.
    for (i, p) in [3, -1, 7, 3].into_iter().enumerate() {
        w.at(T0 + 40 + i as u64);
        w.push(
            "q",
            JobSpec {
                priority: p,
                ..JobSpec::new(format!("late-{i}"))
            },
        );
    }
    w.at(T0 + 50);
    for state in JobState::ALL {
        let mut expected = w.list("q", Some(state));
        assert!(expected.len() >= 2, "{state}: {} jobs", expected.len());
        expected.sort_by_key(|j| JobCursor::of(j).sort_key(state));
        let mut got = Vec::new();
        let mut after = None;
        for _ in 0..100 {
            let page = w.page("q", state, after, 2);
            let Some(last) = page.last() else { break };
            // As the dashboard pages: the cursor goes out as text and back.
            let text = JobCursor::of(&last.job).to_string();
            after = Some(JobCursor::parse(&text).unwrap());
            got.extend(page);
        }
        let ids = |jobs: &[JobRecord]| jobs.iter().map(|j| j.id).collect::<Vec<_>>();
        let got_jobs: Vec<JobRecord> = got.iter().map(|p| p.job.clone()).collect();
        assert_eq!(ids(&got_jobs), ids(&expected), "{state} in its order");
        for (peek, full) in got.iter().zip(&expected) {
            assert_eq!(peek.payload_bytes, full.payload.len() as u64);
            assert_eq!(&*peek.job.payload, &full.payload[..3], "a 3-byte preview");
            let mut cut = full.clone();
            cut.payload = peek.job.payload.clone();
            assert_eq!(peek.job, cut, "every other field as stored");
        }
    }
    assert!(w.page("none", JobState::Ready, None, 5).is_empty());
    // A preview may be as long as the longest payload, and no longer.
    let policy = w.policy;
    let preview =
        |bytes| w.tx(|tx| core::job::page(tx, "q", JobState::Ready, None, 1, bytes, &policy));
    let whole = preview(core::MAX_PAYLOAD_BYTES).unwrap();
    assert_eq!(whole[0].job.payload.len() as u64, whole[0].payload_bytes);
    let r = preview(core::MAX_PAYLOAD_BYTES + 1);
    assert!(
        matches!(
            r,
            Err(Error::Invalid {
                field: leasehold::Field::PreviewBytes,
                ..
            })
        ),
        "{r:?}"
    );
}

fn spec_cancel(round: u64) -> JobSpec {
    JobSpec::new(format!("cancel-{round}"))
}

pub fn job_summary_counts_oldest_ready_and_finished_per_interval(make: &Make) {
    let w = World::new(make);
    let opts = SUMMARY;
    let summary = |w: &World| w.summary("q", &opts);
    let empty = summary(&w);
    assert_eq!(empty.counts, counts(0, 0, 0, 0, 0, 0));
    assert_eq!(empty.oldest_ready_at_ms, None);
    assert_eq!(empty.finished, vec![counts(0, 0, 0, 0, 0, 0); 3]);
    // The oldest ready job is in a low priority band.
    w.push(
        "q",
        JobSpec {
            priority: -5,
            ..JobSpec::new("old, low")
        },
    );
    w.at(T0 + 700);
    every_state(&w, "q");
    for p in [9, 3] {
        w.push(
            "q",
            JobSpec {
                priority: p,
                ..JobSpec::new("new, high")
            },
        );
    }
    w.at(T0 + 1700);
    let job = w.claim_one("q", 1, 100_000);
    assert_eq!(job.priority, 9);
    w.complete(&job, 1).unwrap();
    w.at(T0 + 2500);
    let s = summary(&w);
    assert_eq!(s.now_ms, T0 + 2500);
    assert_eq!(s.oldest_ready_at_ms, Some(T0));
    assert_eq!(s.oldest_ready_wait_ms(), Some(2500));
    assert_eq!(s.counts, counts(2, 1, 1, 2, 1, 1), "each counted up to 2");
    assert!(s.is_capped(JobState::Ready) && s.is_capped(JobState::Done));
    assert!(!s.is_capped(JobState::Dead));
    // Intervals [T0-499, T0+501), [.., T0+1501), [.., T0+2501): done,
    // dead and cancelled at T0+700, done at T0+1700.
    assert_eq!(s.from_ms, T0 - 499);
    assert_eq!(
        s.finished,
        vec![
            counts(0, 0, 0, 0, 0, 0),
            counts(0, 0, 0, 1, 1, 1),
            counts(0, 0, 0, 1, 0, 0)
        ]
    );
}

pub fn job_summary_settles_expired_claims_and_refuses_bad_options(make: &Make) {
    let w = World::new(make);
    let opts = SUMMARY;
    let summary = |w: &World| w.summary("q", &opts);
    w.push("q", JobSpec::new("x"));
    w.claim_one("q", 1, 100);
    assert_eq!(summary(&w).counts, counts(0, 0, 1, 0, 0, 0));
    // A claim that ran out is settled before it is counted (Q3).
    w.at(T0 + 100);
    let s = summary(&w);
    assert_eq!(s.counts.get(JobState::Running), 0);
    assert_eq!(s.counts, w.stats("q"));
    // Bad options are refused by name.
    let policy = w.policy;
    for (bad, field) in [
        (
            SummaryOptions {
                count_cap: 0,
                ..opts
            },
            "count_cap",
        ),
        (SummaryOptions { buckets: 0, ..opts }, "buckets"),
        (
            SummaryOptions {
                bucket_ms: 0,
                ..opts
            },
            "bucket",
        ),
        (
            SummaryOptions {
                bucket_ms: u64::MAX,
                ..opts
            },
            "bucket",
        ),
        (
            SummaryOptions {
                buckets: core::job::BUCKETS_MAX + 1,
                ..opts
            },
            "buckets",
        ),
        (
            SummaryOptions {
                buckets: 1,
                bucket_ms: core::MAX_TTL_MS + 1,
                ..opts
            },
            "bucket",
        ),
    ] {
        let r = w.tx(|tx| core::job::summary(tx, "q", &policy, &bad));
        assert!(
            matches!(r, Err(Error::Invalid { field: f, .. }) if f.as_str() == field),
            "{r:?}"
        );
    }
    // The limits themselves are allowed: the most intervals, a year's span.
    for good in [
        SummaryOptions {
            buckets: core::job::BUCKETS_MAX,
            bucket_ms: 1_000,
            ..opts
        },
        SummaryOptions {
            buckets: 1,
            bucket_ms: core::MAX_TTL_MS,
            ..opts
        },
    ] {
        let s = w
            .tx(|tx| core::job::summary(tx, "q", &policy, &good))
            .unwrap();
        assert_eq!(s.finished.len(), good.buckets);
    }
}

/// A job with an empty payload is listed like any other (SQLite's
/// `substr` of an empty blob is NULL: the page read once failed on it).
pub fn job_pages_list_empty_payloads(make: &Make) {
    let w = World::new(make);
    let id = w.push("q", JobSpec::new(Vec::<u8>::new()));
    for state in [JobState::Ready, JobState::Running] {
        if state == JobState::Running {
            assert_eq!(w.claim_one("q", 1, 1_000).id, id);
        }
        let page = w
            .tx(|tx| tx.jobs()?.page("q", state, None, 10, 64))
            .unwrap();
        assert_eq!(page.len(), 1, "{state:?}");
        assert_eq!((page[0].job.id, page[0].payload_bytes), (id, 0));
        assert!(page[0].job.payload.is_empty());
    }
    assert_eq!(
        w.tx(|tx| core::job::next_look(tx, "q").map(|l| l.change_in_ms))
            .unwrap(),
        Some(1_000),
        "the claim runs out"
    );
}
