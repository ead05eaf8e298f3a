//! Schedules: put, list and remove; each tick fired once whatever the
//! firing worker's clock says; missed ticks skipped or caught up; cron in
//! a time zone; bad input refused with nothing changed; rollback.

use super::*;
use leasehold::core::schedule::{self, Fired, PutOutcome, ON_TIME_MS};
use leasehold::core::{Missed, Rule, ScheduleRecord, ScheduleSpec};

/// 2026-01-15T12:00:00Z, a multiple of every period used here.
const WALL: u64 = 1_768_478_400_000;

fn spec(name: &str, rule: Rule, missed: Missed) -> ScheduleSpec {
    ScheduleSpec {
        name: name.to_owned(),
        rule,
        job: JobSpec::new(format!("tick of {name}")),
        missed,
    }
}

impl World {
    pub fn put_schedule(
        &self,
        queue: &str,
        s: &ScheduleSpec,
        wall: u64,
    ) -> Result<PutOutcome, Error> {
        self.tx(|tx| schedule::put(tx, queue, s, leasehold::WallMs(wall)))
    }

    pub fn schedules(&self, queue: &str) -> Vec<ScheduleRecord> {
        self.tx(|tx| schedule::list(tx, queue)).unwrap()
    }

    pub fn fire(&self, queue: &str, wall: u64) -> Fired {
        let policy = self.policy;
        self.tx(|tx| schedule::fire(tx, queue, leasehold::WallMs(wall), &policy))
            .unwrap()
    }

    fn unique_keys(&self, queue: &str) -> Vec<String> {
        self.list(queue, None)
            .iter()
            .filter_map(|j| j.unique_key.as_deref().map(str::to_owned))
            .collect()
    }
}

pub fn schedule_put_list_remove(make: &Make) {
    let w = World::new(make);
    let every = spec("tidy", Rule::every(10_000), Missed::Skip);
    assert_eq!(
        w.put_schedule("q", &every, WALL + 1).unwrap(),
        PutOutcome::Created
    );
    let s = &w.schedules("q")[0];
    assert_eq!(
        (&*s.name, s.next_ms, &*s.payload),
        ("tidy", WALL + 10_000, &b"tick of tidy"[..])
    );
    // The same rule again (a process registering its schedules at
    // startup) keeps the cursor; the template follows.
    let mut again = every.clone();
    again.job.payload = b"new".to_vec();
    again.job.priority = 7;
    assert_eq!(
        w.put_schedule("q", &again, WALL + 25_000).unwrap(),
        PutOutcome::Kept
    );
    let s = &w.schedules("q")[0];
    assert_eq!(
        (s.next_ms, &*s.payload, s.priority),
        (WALL + 10_000, &b"new"[..], 7)
    );
    // A new rule starts after now.
    let hourly = spec("tidy", Rule::every(3_600_000), Missed::CatchUp);
    assert_eq!(
        w.put_schedule("q", &hourly, WALL + 25_000).unwrap(),
        PutOutcome::Replaced
    );
    let s = &w.schedules("q")[0];
    assert_eq!((s.next_ms, s.missed), (WALL + 3_600_000, Missed::CatchUp));
    // Schedules are per queue, listed by name.
    w.put_schedule(
        "q",
        &spec("a-first", Rule::every(1_000), Missed::Skip),
        WALL,
    )
    .unwrap();
    w.put_schedule("other", &every, WALL).unwrap();
    let names: Vec<String> = w
        .schedules("q")
        .iter()
        .map(|s| s.name.to_string())
        .collect();
    assert_eq!(names, ["a-first", "tidy"]);
    w.tx(|tx| schedule::remove(tx, "q", "tidy")).unwrap();
    assert_eq!(w.schedules("q").len(), 1);
    assert_eq!(w.schedules("other").len(), 1);
    match w.tx(|tx| schedule::remove(tx, "q", "tidy")) {
        Err(Error::Invalid {
            field: leasehold::Field::Schedule,
            reason,
        }) => assert!(reason.contains("tidy"), "{reason}"),
        other => panic!("removing a missing schedule: {other:?}"),
    }
}

pub fn schedule_fires_each_tick_once(make: &Make) {
    let w = World::new(make);
    w.put_schedule("q", &spec("beat", Rule::every(1_000), Missed::Skip), WALL)
        .unwrap();
    assert!(
        w.fire("q", WALL + 999).enqueued.is_empty(),
        "nothing due yet"
    );
    let f = w.fire("q", WALL + 2_500);
    let ticks: Vec<u64> = f.enqueued.iter().map(|e| e.1).collect();
    assert_eq!(ticks, [WALL + 1_000, WALL + 2_000]);
    assert_eq!(f.next_ms, Some(WALL + 3_000));
    assert_eq!(
        w.unique_keys("q"),
        ["beat@2026-01-15T12:00:01Z", "beat@2026-01-15T12:00:02Z"]
    );
    // Another worker at the same instant, or one whose clock is behind,
    // finds nothing to do: the cursor moved in the same transaction.
    assert!(w.fire("q", WALL + 2_500).enqueued.is_empty());
    assert!(w.fire("q", WALL + 1_000).enqueued.is_empty());
    // A finished tick's job does not free its tick for a second firing.
    for job in w.claim("q", 1, 10_000, 10) {
        w.complete(&job, 1).unwrap();
    }
    assert!(w.fire("q", WALL + 2_999).enqueued.is_empty());
    let f = w.fire("q", WALL + 3_000);
    assert_eq!(f.enqueued.len(), 1);
    assert_eq!(w.stats("q"), counts(1, 0, 0, 2, 0, 0));
    // A queue without schedules: nothing to fire, ever.
    assert_eq!(w.fire("empty", WALL), Fired::default());
}

pub fn schedule_missed_ticks_skipped_or_caught_up(make: &Make) {
    let w = World::new(make);
    w.put_schedule("q", &spec("skip", Rule::every(10_000), Missed::Skip), WALL)
        .unwrap();
    w.put_schedule(
        "q",
        &spec("catch", Rule::every(10_000), Missed::CatchUp),
        WALL,
    )
    .unwrap();
    // Ten minutes with no worker: 60 ticks due, of which the last minute's
    // (7 of them, both ends included) are on time.
    let wall = WALL + 600_000;
    let f = w.fire("q", wall);
    let of = |name: &str| -> Vec<u64> {
        f.enqueued
            .iter()
            .filter(|e| &*e.0 == name)
            .map(|e| e.1)
            .collect()
    };
    let on_time: Vec<u64> = (0..7).map(|i| wall - ON_TIME_MS + i * 10_000).collect();
    assert_eq!(of("skip"), on_time);
    let mut caught = vec![WALL + 10_000];
    caught.extend(&on_time);
    assert_eq!(
        of("catch"),
        caught,
        "one job for the missed ticks, keyed by the first"
    );
    assert_eq!(f.skipped.len(), 1);
    assert_eq!((&*f.skipped[0].0, f.skipped[0].1), ("skip", WALL + 10_000));
    assert!(w
        .unique_keys("q")
        .contains(&"catch@2026-01-15T12:00:10Z".to_owned()));
    assert_eq!(w.stats("q").get(JobState::Ready), 15);
    assert!(w.schedules("q").iter().all(|s| s.next_ms == wall + 10_000));
    // A tick exactly ON_TIME_MS old is still on time: enqueued, not skipped.
    w.put_schedule(
        "edge",
        &spec("skip", Rule::every(10_000), Missed::Skip),
        WALL,
    )
    .unwrap();
    let f = w.fire("edge", WALL + 10_000 + ON_TIME_MS);
    assert_eq!(f.skipped, vec![]);
    assert_eq!(f.enqueued.len(), 7);
    assert_eq!(f.enqueued[0].1, WALL + 10_000);
}

pub fn schedule_cron_in_a_time_zone(make: &Make) {
    let w = World::new(make);
    let paris = Rule::cron("0 3 * * *", "Europe/Paris").unwrap();
    w.put_schedule("q", &spec("nightly", paris.clone(), Missed::Skip), WALL)
        .unwrap();
    // 03:00 in Paris is 02:00 UTC in January...
    assert_eq!(w.schedules("q")[0].next_ms, 1_768_528_800_000);
    // ...and 01:00 UTC in July (summer time).
    let july = 1_784_116_800_000;
    assert_eq!(
        paris.next_at_or_after(july).unwrap(),
        Some(1_784_163_600_000)
    );
    let f = w.fire("q", 1_768_528_800_000 + 5_000);
    assert_eq!(w.unique_keys("q"), ["nightly@2026-01-16T02:00:00Z"]);
    assert_eq!(f.next_ms, Some(1_768_528_800_000 + 86_400_000));
    // Six fields: seconds first.
    let fast = Rule::cron("*/15 * * * * *", "UTC").unwrap();
    assert_eq!(
        fast.next_at_or_after(WALL + 1).unwrap(),
        Some(WALL + 15_000)
    );
}

pub fn schedule_bad_input_changes_nothing(make: &Make) {
    let w = World::new(make);
    w.put_schedule("q", &spec("keep", Rule::every(60_000), Missed::Skip), WALL)
        .unwrap();
    let before = format!("{:?}", w.schedules("q"));
    let field = |r: Result<PutOutcome, Error>| match r {
        Err(Error::Invalid { field, .. }) => field,
        other => panic!("expected an invalid argument, got {other:?}"),
    };
    let every = |ms| spec("x", Rule::every(ms), Missed::Skip);
    assert_eq!(
        field(w.put_schedule("q", &every(999), WALL)),
        leasehold::Field::Every
    );
    assert_eq!(
        field(w.put_schedule("q", &every(u64::MAX), WALL)),
        leasehold::Field::Every
    );
    let year = core::MAX_TTL_MS;
    assert_eq!(
        field(w.put_schedule("q", &every(year + 1), WALL)),
        leasehold::Field::Every
    );
    // A year is the longest period, and allowed.
    assert!(Rule::every(year).next_at_or_after(WALL).unwrap().is_some());
    // A rule that never ticks is refused, and the error names it.
    let feb_30 = spec(
        "never",
        Rule::cron("0 0 30 2 *", "UTC").unwrap(),
        Missed::Skip,
    );
    match w.put_schedule("q", &feb_30, WALL) {
        Err(Error::Invalid {
            field: leasehold::Field::Cron,
            reason,
        }) => {
            assert!(reason.contains("\"0 0 30 2 *\""), "{reason}")
        }
        other => panic!("expected the rule refused, got {other:?}"),
    }
    // So is a first tick at the end of time (NEVER_MS, "no next tick").
    let period = 7 * 7 * 73 * 127 * 337; // divides i64::MAX
    assert_eq!(schedule::NEVER_MS % period, 0);
    let last = schedule::NEVER_MS - 1;
    assert_eq!(
        field(w.put_schedule("q", &every(period), last)),
        leasehold::Field::Every
    );
    assert!(w.put_schedule("q", &every(period), last - period).is_ok());
    w.tx(|tx| schedule::remove(tx, "q", "x")).unwrap();
    assert_eq!(
        field(w.put_schedule("", &every(1_000), WALL)),
        leasehold::Field::Queue
    );
    for name in ["", "a\0b", "line\nbreak"] {
        let mut s = every(1_000);
        s.name = name.to_owned();
        assert_eq!(
            field(w.put_schedule("q", &s, WALL)),
            leasehold::Field::Schedule,
            "{name:?}"
        );
    }
    let mut s = every(1_000);
    s.job.max_attempts = 0;
    assert_eq!(
        field(w.put_schedule("q", &s, WALL)),
        leasehold::Field::MaxAttempts
    );
    s.job.max_attempts = 1;
    s.job.payload = vec![0; core::MAX_PAYLOAD_BYTES + 1];
    assert_eq!(
        field(w.put_schedule("q", &s, WALL)),
        leasehold::Field::Payload
    );
    let cron = |expr: &str, tz: &str| Rule::cron(expr, tz).map(drop);
    assert!(matches!(
        cron("61 * * * *", "UTC"),
        Err(Error::Invalid {
            field: leasehold::Field::Cron,
            ..
        })
    ));
    assert!(matches!(
        cron("not cron", "UTC"),
        Err(Error::Invalid {
            field: leasehold::Field::Cron,
            ..
        })
    ));
    assert!(matches!(
        cron("0 3 * * *", "Mars/Olympus"),
        Err(Error::Invalid {
            field: leasehold::Field::Tz,
            ..
        })
    ));
    assert!(matches!(
        Rule::decode("every soon"),
        Err(Error::Invalid {
            field: leasehold::Field::Rule,
            ..
        })
    ));
    assert!(matches!(
        Missed::parse("sometimes"),
        Err(Error::Invalid {
            field: leasehold::Field::Missed,
            ..
        })
    ));
    assert_eq!(before, format!("{:?}", w.schedules("q")));
}

/// Each tick's job takes the template's payload, priority and attempts;
/// the template's unique key, delay and run_at are not the schedule's
/// (documented on `ScheduleSpec::job`): the job is keyed by its tick and
/// due at once, so a key that would be refused on its own does not refuse
/// the schedule. A rule that ends (a cron with a year) fires its last
/// tick and then has no next.
pub fn schedule_jobs_follow_the_template_but_not_its_key_or_delay(make: &Make) {
    let w = World::new(make);
    let mut s = spec("beat", Rule::every(1_000), Missed::Skip);
    s.job.priority = 5;
    s.job.max_attempts = 7;
    s.job.unique_key = Some(String::new());
    s.job.delay_ms = 3_600_000;
    s.job.run_at = Some(leasehold::StoreMs::MAX);
    assert_eq!(w.put_schedule("q", &s, WALL).unwrap(), PutOutcome::Created);
    w.fire("q", WALL + 1_000);
    assert_eq!(w.unique_keys("q"), ["beat@2026-01-15T12:00:01Z"]);
    let job = &w.list("q", Some(JobState::Ready))[0];
    assert_eq!(
        (&job.payload[..], job.priority, job.max_attempts),
        (&b"tick of beat"[..], 5, 7)
    );
    // Noon on 16 January 2026, that year only: seconds first, year last.
    let once = Rule::cron("0 0 12 16 1 * 2026", "UTC").unwrap();
    w.put_schedule("once", &spec("noon", once, Missed::Skip), WALL)
        .unwrap();
    let noon = WALL + 86_400_000;
    assert_eq!(w.fire("once", noon - 1).next_ms, Some(noon));
    let f = w.fire("once", noon);
    assert_eq!(f.enqueued.len(), 1);
    assert_eq!(f.next_ms, None, "no tick after the last");
    assert_eq!(w.schedules("once")[0].next_ms, schedule::NEVER_MS);
    assert!(w.fire("once", noon + 86_400_000 * 400).enqueued.is_empty());
}

pub fn schedule_txn_rolls_back(make: &Make) {
    let w = World::new(make);
    w.put_schedule("q", &spec("beat", Rule::every(1_000), Missed::Skip), WALL)
        .unwrap();
    let policy = w.policy;
    let r: leasehold::Result<()> = w.tx(|tx| {
        schedule::fire(tx, "q", leasehold::WallMs(WALL + 5_000), &policy)?;
        schedule::put(
            tx,
            "q",
            &spec("new", Rule::every(1_000), Missed::Skip),
            leasehold::WallMs(WALL),
        )?;
        Err(Error::invalid(leasehold::Field::Reason, "abort"))
    });
    assert!(r.is_err());
    assert_eq!(w.schedules("q").len(), 1);
    assert_eq!(w.schedules("q")[0].next_ms, WALL + 1_000);
    assert_eq!(w.stats("q").total(), 0);
    assert_eq!(w.fire("q", WALL + 5_000).enqueued.len(), 5);
}
