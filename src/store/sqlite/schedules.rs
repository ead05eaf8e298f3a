//! A queue's own rows: its schedules, read in name order, written whole;
//! its settings ([`QueueConfig`], one row, absent until first set); and
//! its rate buckets ([`RateLog`], one row each, removed when empty).

use super::conn::sql_err;
use crate::core::{Limits, QueueConfig, RateLog, ScheduleRecord};
use crate::error::Field;
use crate::error::Result;
use crate::store::{i64_of, rate_columns, rate_of, schedule_of_row, u64_of, SCHEDULE_COLUMNS};
use rusqlite::{params, Connection, OptionalExtension};
use std::sync::Arc;

/// The schedules of `queue`, by name.
pub(super) fn read(conn: &Connection, queue: &str) -> Result<Vec<ScheduleRecord>> {
    let fail = |e| sql_err(|| format!("reading the schedules of queue {queue:?}"), e);
    let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE queue = ?1 ORDER BY name");
    let mut stmt = conn.prepare_cached(&sql).map_err(fail)?;
    let rows = stmt
        .query_map([queue], |r| {
            Ok((
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Vec<u8>>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, i64>(5)?,
                r.get::<_, String>(6)?,
                r.get::<_, i64>(7)?,
            ))
        })
        .map_err(fail)?;
    let mut out = Vec::new();
    for row in rows {
        let (name, rule, payload, priority, attempts, missed, next) = row.map_err(fail)?;
        out.push(schedule_of_row(
            queue, &name, &rule, payload, priority, attempts, &missed, next,
        )?);
    }
    Ok(out)
}

/// Insert or replace one schedule.
pub(super) fn write(conn: &Connection, s: &ScheduleRecord) -> Result<()> {
    let next_at = i64_of(Field::NextAt, s.next_ms)?;
    let sql = format!(
        "INSERT OR REPLACE INTO schedules ({SCHEDULE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
    );
    conn.prepare_cached(&sql)
        .and_then(|mut st| {
            st.execute(params![
                &*s.queue,
                &*s.name,
                s.rule.encode(),
                &*s.payload,
                s.priority,
                s.max_attempts,
                s.missed.as_str(),
                next_at,
            ])
        })
        .map(|_| ())
        .map_err(|e| {
            sql_err(
                || format!("writing schedule {:?} of queue {:?}", s.name, s.queue),
                e,
            )
        })
}

/// Delete one schedule; whether it existed.
pub(super) fn delete(conn: &Connection, queue: &str, name: &str) -> Result<bool> {
    conn.prepare_cached("DELETE FROM schedules WHERE queue = ?1 AND name = ?2")
        .and_then(|mut st| st.execute(params![queue, name]))
        .map(|n| n > 0)
        .map_err(|e| {
            sql_err(
                || format!("deleting schedule {name:?} of queue {queue:?}"),
                e,
            )
        })
}

/// The settings of `queue` (the default if it has no row).
pub(super) fn config(conn: &Connection, queue: &str) -> Result<QueueConfig> {
    let limit = |v: Option<i64>| v.and_then(|v| u32::try_from(v).ok());
    conn.prepare_cached(
        "SELECT paused, concurrency, per_key, rate_count, rate_ms, key_rate_count, key_rate_ms
         FROM queues WHERE queue = ?1",
    )
    .and_then(|mut s| {
        s.query_row([queue], |r| {
            Ok(QueueConfig {
                paused: r.get(0)?,
                limits: Limits::none()
                    .with_concurrency(limit(r.get(1)?))
                    .with_per_key(limit(r.get(2)?))
                    .with_rate(rate_of(r.get(3)?, r.get(4)?))
                    .with_per_key_rate(rate_of(r.get(5)?, r.get(6)?)),
            })
        })
        .optional()
    })
    .map(Option::unwrap_or_default)
    .map_err(|e| sql_err(|| format!("reading the settings of queue {queue:?}"), e))
}

/// Insert or replace the settings of `queue`.
pub(super) fn put_config(conn: &Connection, queue: &str, config: &QueueConfig) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO queues (queue, paused, concurrency, per_key, rate_count, rate_ms,
           key_rate_count, key_rate_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT(queue) DO UPDATE SET paused = excluded.paused,
           concurrency = excluded.concurrency, per_key = excluded.per_key,
           rate_count = excluded.rate_count, rate_ms = excluded.rate_ms,
           key_rate_count = excluded.key_rate_count, key_rate_ms = excluded.key_rate_ms",
    )
    .and_then(|mut s| {
        let limits = config.limits;
        let (rate_count, rate_ms) = rate_columns(limits.rate);
        let (key_rate_count, key_rate_ms) = rate_columns(limits.per_key_rate);
        s.execute(params![
            queue,
            config.paused,
            limits.concurrency,
            limits.per_key,
            rate_count,
            rate_ms,
            key_rate_count,
            key_rate_ms
        ])
    })
    .map(drop)
    .map_err(|e| sql_err(|| format!("writing the settings of queue {queue:?}"), e))
}

/// The rate bucket `key` of `queue` (empty if it has no row).
pub(super) fn rate_log(conn: &Connection, queue: &str, key: &str) -> Result<RateLog> {
    conn.prepare_cached("SELECT starts, wake_at FROM rates WHERE queue = ?1 AND key = ?2")
        .and_then(|mut s| {
            s.query_row([queue, key], |r| {
                let starts: Vec<u8> = r.get(0)?;
                let wake: Option<i64> = r.get(1)?;
                Ok(RateLog::decode_starts(&starts, wake.map(u64_of)))
            })
            .optional()
        })
        .map(Option::unwrap_or_default)
        .map_err(|e| sql_err(|| format!("reading a rate of queue {queue:?}"), e))
}

/// Insert, replace or (empty) remove the rate bucket `key` of `queue`.
pub(super) fn put_rate_log(conn: &Connection, queue: &str, key: &str, log: &RateLog) -> Result<()> {
    let fail = |e| sql_err(|| format!("writing a rate of queue {queue:?}"), e);
    if log.is_empty() {
        return conn
            .prepare_cached("DELETE FROM rates WHERE queue = ?1 AND key = ?2")
            .and_then(|mut s| s.execute([queue, key]))
            .map(drop)
            .map_err(fail);
    }
    let wake = log
        .wake_at_ms
        .map(|w| i64_of(Field::RunAt, w))
        .transpose()?;
    let newest = i64_of(Field::RunAt, log.starts.last().copied().unwrap_or(0))?;
    conn.prepare_cached(
        "INSERT INTO rates (queue, key, starts, wake_at, newest) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(queue, key) DO UPDATE SET starts = excluded.starts,
           wake_at = excluded.wake_at, newest = excluded.newest",
    )
    .and_then(|mut s| s.execute(params![queue, key, log.encode_starts(), wake, newest]))
    .map(drop)
    .map_err(fail)
}

/// Remove up to `limit` buckets of `queue` idle since `before_ms`.
pub(super) fn forget_idle_rates(
    conn: &Connection,
    queue: &str,
    before_ms: u64,
    limit: usize,
) -> Result<usize> {
    let before = i64::try_from(before_ms).unwrap_or(i64::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "DELETE FROM rates WHERE queue = ?1 AND key IN (SELECT key FROM rates INDEXED BY rates_idle
           WHERE queue = ?1 AND wake_at IS NULL AND newest <= ?2 LIMIT ?3)",
    )
    .and_then(|mut s| s.execute(params![queue, before, limit]))
    .map_err(|e| sql_err(|| format!("forgetting idle rates of queue {queue:?}"), e))
}

/// Up to `limit` buckets of `queue` waking at or before `until_ms`.
pub(super) fn rate_wakes(
    conn: &Connection,
    queue: &str,
    until_ms: u64,
    limit: usize,
) -> Result<Vec<(Arc<str>, u64)>> {
    let fail = |e| {
        sql_err(
            || format!("reading the rate wake-ups of queue {queue:?}"),
            e,
        )
    };
    let until = i64::try_from(until_ms).unwrap_or(i64::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn
        .prepare_cached(
            "SELECT key, wake_at FROM rates INDEXED BY rates_wake
             WHERE queue = ?1 AND wake_at IS NOT NULL AND wake_at <= ?2
             ORDER BY wake_at, key LIMIT ?3",
        )
        .map_err(fail)?;
    let rows = stmt
        .query_map(params![queue, until, limit], |r| {
            Ok((Arc::from(r.get::<_, String>(0)?), u64_of(r.get(1)?)))
        })
        .map_err(fail)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(fail)
}
