//! What the database stores (SQLite, PostgreSQL) share about columns:
//! how a record's values become column values and back (integers that
//! must fit, holder ids as 16 bytes, rates, dependencies, progress, hex),
//! the lease records a transaction has read ([`LeaseCache`]), and the
//! schedule and export SQL both run. (The file store decodes its records'
//! hex with [`unhex`] too.)
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

use crate::core::LeaseRecord;
use crate::error::{Field, Result};

/// A database integer for `v`, or an error naming `field` if it does not fit.
pub(crate) fn i64_of(field: Field, v: u64) -> Result<i64> {
    i64::try_from(v)
        .map_err(|_| crate::error::Error::invalid(field, format!("{v} does not fit the database")))
}

/// The jobs a job runs after, as stores keep them (`12,13`).
pub(crate) fn after_text(after: &[crate::core::JobId]) -> String {
    let ids: Vec<String> = after.iter().map(|id| id.0.to_string()).collect();
    ids.join(",")
}

/// [`after_text`] read back; none when the column is empty (a part that
/// does not parse is skipped: never written so).
pub(crate) fn after_of(text: Option<&str>) -> Option<std::sync::Arc<[crate::core::JobId]>> {
    let text = text.filter(|t| !t.is_empty())?;
    let ids: Vec<crate::core::JobId> = text
        .split(',')
        .filter_map(|p| p.parse().ok().map(crate::core::JobId))
        .collect();
    Some(std::sync::Arc::from(ids))
}

/// A job's progress from its two columns (permyriad, message); none when
/// either is missing or out of range (never written so).
pub(crate) fn progress_of(
    permyriad: Option<i64>,
    message: Option<String>,
) -> Option<crate::core::job::Progress> {
    let permyriad = u16::try_from(permyriad?).ok()?;
    crate::core::job::Progress::of_permyriad(permyriad, &message?).ok()
}

/// A database integer as an unsigned value (negative values, never
/// written, read as 0).
pub(crate) fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A rate from its two database columns (count, window in ms); `None`
/// where unset (or, never written, out of range).
pub(crate) fn rate_of(count: Option<i64>, window_ms: Option<i64>) -> Option<crate::core::Rate> {
    let count = u32::try_from(count?).ok()?;
    Some(crate::core::Rate::new(
        count,
        u64::try_from(window_ms?).ok()?,
    ))
}

/// A rate's two database columns (see [`rate_of`]); the window fits, as
/// [`crate::core::Rate::check`] bounds it.
pub(crate) fn rate_columns(rate: Option<crate::core::Rate>) -> (Option<i64>, Option<i64>) {
    match rate {
        Some(r) => (
            Some(i64::from(r.count)),
            Some(i64::try_from(r.window_ms).unwrap_or(i64::MAX)),
        ),
        None => (None, None),
    }
}

/// A holder id as 16 big-endian bytes (a database blob).
pub(crate) fn holder_bytes(id: crate::core::HolderId) -> [u8; 16] {
    id.0.to_be_bytes()
}

/// Bytes from two hex digits each (either case); `None` for anything
/// else (the file store's records, PostgreSQL's bytea in text form).
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if digits.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    digits
        .chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// The holder id of a database blob (see [`holder_bytes`]).
pub(crate) fn holder_from(bytes: &[u8]) -> crate::core::HolderId {
    let mut b = [0u8; 16];
    let n = bytes.len().min(16);
    b[..n].copy_from_slice(&bytes[..n]);
    crate::core::HolderId(u128::from_be_bytes(b))
}

/// A lease record a database store read in this transaction, with its
/// state when read (so the commit writes back only what changed).
pub(crate) struct CachedLease {
    pub key: String,
    /// The record as read (`None`: the key had no record yet).
    pub original: Option<LeaseRecord>,
    pub record: LeaseRecord,
}

/// The lease records one transaction of a database store has read.
#[derive(Default)]
pub(crate) struct LeaseCache(Vec<CachedLease>);

impl LeaseCache {
    /// Whether `key` was read in this transaction.
    pub fn contains(&self, key: &str) -> bool {
        self.0.iter().any(|c| c.key == key)
    }

    /// Keep the record `loaded` for `key` (an empty one if there was none
    /// and `create`); false if there is none to keep.
    pub fn add(&mut self, key: &str, loaded: Option<LeaseRecord>, create: bool) -> bool {
        if loaded.is_none() && !create {
            return false;
        }
        self.0.push(CachedLease {
            key: key.to_owned(),
            record: loaded.clone().unwrap_or_default(),
            original: loaded,
        });
        true
    }

    /// The record of `key`, if read.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut LeaseRecord> {
        self.0
            .iter_mut()
            .find(|c| c.key == key)
            .map(|c| &mut c.record)
    }

    /// The records this transaction changed.
    pub fn changed(&self) -> impl Iterator<Item = &CachedLease> {
        self.0
            .iter()
            .filter(|c| c.original.as_ref() != Some(&c.record))
    }
}

/// The columns of a schedule row, as every database store keeps them.
pub(crate) const SCHEDULE_COLUMNS: &str =
    "queue, name, rule, payload, priority, max_attempts, missed, next_at";

/// A schedule from its row's values (in [`SCHEDULE_COLUMNS`] order); a
/// rule or policy this build cannot read is an error naming the row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn schedule_of_row(
    queue: &str,
    name: &str,
    rule: &str,
    payload: Vec<u8>,
    priority: i64,
    max_attempts: i64,
    missed: &str,
    next_at: i64,
) -> Result<crate::core::ScheduleRecord> {
    use crate::core::{Missed, Rule, ScheduleRecord};
    let bad = |e: crate::error::Error| {
        crate::error::Error::store(
            format!("reading schedule {name:?} of queue {queue:?}"),
            format!("{e} (written by a newer leasehold, or damaged)"),
        )
    };
    Ok(ScheduleRecord {
        queue: std::sync::Arc::from(queue),
        name: std::sync::Arc::from(name),
        rule: Rule::decode(rule).map_err(bad)?,
        payload: std::sync::Arc::from(payload),
        priority: i32::try_from(priority).unwrap_or(0),
        max_attempts: u32::try_from(max_attempts).unwrap_or(1),
        missed: Missed::parse(missed).map_err(bad)?,
        next_ms: u64_of(next_at),
    })
}

/// The SQL of [`Txn::export_names`](crate::core::Txn::export_names) over a
/// database store's tables, `{s}` their schema prefix (`""` or
/// `"schema".`), for SQLite or PostgreSQL: parameters `$1` the name after which to start, `$2` the
/// limit, `$3` the queue of rate keys.
pub(crate) fn export_sql(what: crate::core::Exported<'_>, s: &str, sqlite: bool) -> String {
    use crate::core::Exported;
    let sql = match what {
        // SQLite keeps a key's head and slots in one table (the head at
        // token -1); PostgreSQL has a table of heads.
        Exported::LeaseKeys if sqlite => {
            "SELECT key FROM lease_rows WHERE token = -1 AND key > $1 ORDER BY key LIMIT $2".into()
        }
        Exported::LeaseKeys => {
            format!("SELECT key FROM {s}leases WHERE key > $1 ORDER BY key LIMIT $2")
        }
        // A migration's read of a frozen store: the scan of every table
        // is paid once.
        Exported::Queues => format!(
            "SELECT queue FROM (SELECT queue FROM {s}jobs UNION SELECT queue FROM {s}queues
               UNION SELECT queue FROM {s}schedules UNION SELECT queue FROM {s}rates) q
             WHERE queue > $1 ORDER BY queue LIMIT $2"
        ),
        Exported::RateKeys(_) => {
            format!("SELECT key FROM {s}rates WHERE queue = $3 AND key > $1 ORDER BY key LIMIT $2")
        }
    };
    // SQLite numbers its parameters `?N`.
    if sqlite {
        sql.replace('$', "?")
    } else {
        sql
    }
}
