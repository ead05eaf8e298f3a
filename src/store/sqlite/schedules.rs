//! A queue's own rows: its schedules, read in name order, written whole;
//! and its settings ([`QueueConfig`], one row, absent until first set).

use super::conn::sql_err;
use crate::core::{Limits, QueueConfig, ScheduleRecord};
use crate::error::Field;
use crate::error::Result;
use crate::store::{i64_of, schedule_of_row, SCHEDULE_COLUMNS};
use rusqlite::{params, Connection, OptionalExtension};

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
    conn.prepare_cached("SELECT paused, concurrency, per_key FROM queues WHERE queue = ?1")
        .and_then(|mut s| {
            s.query_row([queue], |r| {
                Ok(QueueConfig {
                    paused: r.get(0)?,
                    limits: Limits::none()
                        .with_concurrency(limit(r.get(1)?))
                        .with_per_key(limit(r.get(2)?)),
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
        "INSERT INTO queues (queue, paused, concurrency, per_key) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(queue) DO UPDATE SET paused = excluded.paused,
           concurrency = excluded.concurrency, per_key = excluded.per_key",
    )
    .and_then(|mut s| {
        let limits = config.limits;
        s.execute(params![
            queue,
            config.paused,
            limits.concurrency,
            limits.per_key
        ])
    })
    .map(drop)
    .map_err(|e| sql_err(|| format!("writing the settings of queue {queue:?}"), e))
}
