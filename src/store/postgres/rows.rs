//! Decoding rows: a job, a queue's settings and a lease from either kind
//! of row the driver returns, a prepared statement's (binary values) or a
//! simple query's (text, the form a read sent with `BEGIN` comes back in;
//! see `early.rs`). One decoder serves both through [`Cells`].

use crate::core::{Claim, JobId, JobRecord, JobState, LeaseRecord, LeaseSlot, Limits, QueueConfig};
use crate::error::{Error, Result};
use crate::store::{after_of, holder_from, progress_of, rate_of, u64_of, unhex};
use crate::Holder;
use postgres::types::Type;
use postgres::{Row, SimpleQueryRow};
use std::sync::Arc;

/// The columns of one result row, by position; `None` is SQL NULL. An
/// error says what was wrong with the value (the caller names the row).
pub(super) trait Cells {
    /// An integer column of any width.
    fn int(&self, i: usize) -> std::result::Result<Option<i64>, String>;
    /// A boolean column.
    fn flag(&self, i: usize) -> std::result::Result<Option<bool>, String>;
    /// A text column.
    fn text(&self, i: usize) -> std::result::Result<Option<&str>, String>;
    /// A bytea column.
    fn bytes(&self, i: usize) -> std::result::Result<Option<Vec<u8>>, String>;
    /// An `int8[]` column (NULL: none).
    fn ints(&self, i: usize) -> std::result::Result<Vec<i64>, String>;
    /// A `bytea[]` column without NULL elements.
    fn byteas(&self, i: usize) -> std::result::Result<Vec<Vec<u8>>, String>;
    /// A `text[]` column.
    fn texts(&self, i: usize) -> std::result::Result<Vec<Option<String>>, String>;
}

impl Cells for Row {
    fn int(&self, i: usize) -> std::result::Result<Option<i64>, String> {
        let v = match self.columns().get(i).map(|c| c.type_()) {
            Some(&Type::INT2) => self.try_get::<_, Option<i16>>(i).map(|v| v.map(i64::from)),
            Some(&Type::INT4) => self.try_get::<_, Option<i32>>(i).map(|v| v.map(i64::from)),
            _ => self.try_get::<_, Option<i64>>(i),
        };
        v.map_err(|e| e.to_string())
    }
    fn flag(&self, i: usize) -> std::result::Result<Option<bool>, String> {
        self.try_get(i).map_err(|e| e.to_string())
    }
    fn text(&self, i: usize) -> std::result::Result<Option<&str>, String> {
        self.try_get(i).map_err(|e| e.to_string())
    }
    fn bytes(&self, i: usize) -> std::result::Result<Option<Vec<u8>>, String> {
        self.try_get(i).map_err(|e| e.to_string())
    }
    fn ints(&self, i: usize) -> std::result::Result<Vec<i64>, String> {
        let v: Option<Vec<i64>> = self.try_get(i).map_err(|e| e.to_string())?;
        Ok(v.unwrap_or_default())
    }
    fn byteas(&self, i: usize) -> std::result::Result<Vec<Vec<u8>>, String> {
        let v: Option<Vec<Vec<u8>>> = self.try_get(i).map_err(|e| e.to_string())?;
        Ok(v.unwrap_or_default())
    }
    fn texts(&self, i: usize) -> std::result::Result<Vec<Option<String>>, String> {
        let v: Option<Vec<Option<String>>> = self.try_get(i).map_err(|e| e.to_string())?;
        Ok(v.unwrap_or_default())
    }
}

impl Cells for SimpleQueryRow {
    fn int(&self, i: usize) -> std::result::Result<Option<i64>, String> {
        self.text(i)?
            .map(|t| {
                t.parse()
                    .map_err(|_| format!("column {i}: {t:?} is not an integer"))
            })
            .transpose()
    }
    fn flag(&self, i: usize) -> std::result::Result<Option<bool>, String> {
        self.text(i)?
            .map(|t| match t {
                "t" => Ok(true),
                "f" => Ok(false),
                _ => Err(format!("column {i}: {t:?} is not a boolean")),
            })
            .transpose()
    }
    fn text(&self, i: usize) -> std::result::Result<Option<&str>, String> {
        self.try_get(i).map_err(|e| e.to_string())
    }
    fn bytes(&self, i: usize) -> std::result::Result<Option<Vec<u8>>, String> {
        self.text(i)?.map(|t| bytea_of(i, t)).transpose()
    }
    fn ints(&self, i: usize) -> std::result::Result<Vec<i64>, String> {
        array_items(i, self.text(i)?)?
            .into_iter()
            .map(|item| {
                let item = need(item, i)?;
                item.parse()
                    .map_err(|_| format!("column {i}: {item:?} is not an integer"))
            })
            .collect()
    }
    fn byteas(&self, i: usize) -> std::result::Result<Vec<Vec<u8>>, String> {
        array_items(i, self.text(i)?)?
            .into_iter()
            .map(|item| bytea_of(i, &need(item, i)?))
            .collect()
    }
    fn texts(&self, i: usize) -> std::result::Result<Vec<Option<String>>, String> {
        array_items(i, self.text(i)?)
    }
}

/// Bytes from their text form (`bytea_output = hex`, the default since
/// PostgreSQL 9.0): `\x` and two hex digits a byte.
fn bytea_of(i: usize, t: &str) -> std::result::Result<Vec<u8>, String> {
    let bad = || format!("column {i}: not bytea in hex form");
    unhex(t.strip_prefix("\\x").ok_or_else(bad)?).ok_or_else(bad)
}

/// The elements of a one-dimensional array in its text form: `{a,b}`,
/// an element in double quotes when it holds a special character (inside,
/// a backslash escapes the next character), `NULL` unquoted for NULL.
/// A NULL array has no elements.
fn array_items(i: usize, t: Option<&str>) -> std::result::Result<Vec<Option<String>>, String> {
    let bad = || format!("column {i}: not a one-dimensional array");
    let Some(t) = t else { return Ok(Vec::new()) };
    let inner = t
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(bad)?;
    let mut items = Vec::new();
    if inner.is_empty() {
        return Ok(items);
    }
    let mut chars = inner.chars().peekable();
    loop {
        let mut item = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next().ok_or_else(bad)? {
                    '"' => break,
                    '\\' => item.push(chars.next().ok_or_else(bad)?),
                    c => item.push(c),
                }
            }
            items.push(Some(item));
        } else {
            while let Some(c) = chars.next_if(|&c| c != ',') {
                item.push(c);
            }
            items.push((item != "NULL").then_some(item));
        }
        match chars.next() {
            None => return Ok(items),
            Some(',') => {}
            Some(_) => return Err(bad()),
        }
    }
}

fn need<T>(v: Option<T>, i: usize) -> std::result::Result<T, String> {
    v.ok_or_else(|| format!("column {i} is NULL"))
}

/// A job from a row of [`COLUMNS`](super::statements::COLUMNS); a state code no state has is an error
/// naming the row (never guessed).
pub(super) fn job_from_row(r: &impl Cells) -> Result<JobRecord> {
    let decoded = decode_job(r).map_err(|e| Error::store("decoding a job", e))?;
    let (mut job, code) = decoded;
    job.state = JobState::from_code(code).ok_or_else(|| {
        Error::store(
            format!("reading job {}", job.id),
            format!("state code {code} is unknown to this build (written by a newer leasehold?)"),
        )
    })?;
    Ok(job)
}

/// The row's fields, and its state code (the state is set by the caller).
fn decode_job(r: &impl Cells) -> std::result::Result<(JobRecord, i64), String> {
    let int = |i| r.int(i).and_then(|v| need(v, i));
    let flag = |i| r.flag(i).and_then(|v| need(v, i));
    let opt_u64 = |i| r.int(i).map(|v| v.map(u64_of));
    let u32_of = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
    let claim = match (r.bytes(11)?, r.int(12)?, r.int(13)?) {
        (Some(h), Some(t), Some(u)) => Some(Claim {
            holder: holder_from(&h),
            token: u64_of(t),
            lease_until_ms: u64_of(u),
            deadline_ms: opt_u64(22)?,
        }),
        _ => None,
    };
    let job = JobRecord {
        id: JobId(u64_of(int(0)?)),
        queue: Arc::from(need(r.text(1)?, 1)?),
        payload: Arc::from(need(r.bytes(2)?, 2)?),
        priority: i32::try_from(int(3)?).map_err(|_| "column 3: priority out of range")?,
        run_at_ms: u64_of(int(4)?),
        created_at_ms: u64_of(int(5)?),
        max_attempts: u32_of(int(6)?),
        attempts: u32_of(int(7)?),
        expiries: u32_of(int(8)?),
        last_token: u64_of(int(9)?),
        state: JobState::Ready,
        claim,
        cancel_requested: flag(14)?,
        last_error: r.text(15)?.map(Arc::from),
        unique_key: r.text(16)?.map(Arc::from),
        finished_at_ms: opt_u64(17)?,
        result: r.bytes(18)?.map(Arc::from),
        key: r.text(19)?.map(Arc::from),
        parked: flag(20)?,
        timeout_ms: opt_u64(21)?,
        progress: progress_of(r.int(23)?, r.text(24)?.map(str::to_owned)),
        after: after_of(r.text(25)?),
        after_any: flag(26)?,
        waiting_on: u32_of(int(27)?),
        has_children: flag(28)?,
    };
    Ok((job, int(10)?))
}

/// The queue settings in `row` from column `at`
/// ([`QUEUE_COLUMNS`](super::statements::QUEUE_COLUMNS); NULL: the
/// default).
pub(super) fn queue_config(row: &impl Cells, at: usize) -> Result<QueueConfig> {
    let decode = || -> std::result::Result<QueueConfig, String> {
        let limit =
            |i: usize| Ok::<_, String>(row.int(at + i)?.and_then(|v| u32::try_from(v).ok()));
        let rate = |i: usize| Ok::<_, String>(rate_of(row.int(at + i)?, row.int(at + i + 1)?));
        Ok(QueueConfig {
            paused: row.flag(at)?.unwrap_or(false),
            limits: Limits::none()
                .with_concurrency(limit(1)?)
                .with_per_key(limit(2)?)
                .with_rate(rate(3)?)
                .with_per_key_rate(rate(5)?),
        })
    };
    decode().map_err(|e| Error::store("decoding a queue's settings", e))
}

/// A lease record from `row`'s columns from `at` on: last_token, tokens,
/// holders, labels, expires, lease_limit.
pub(super) fn lease_from_row(row: &impl Cells, at: usize) -> Result<LeaseRecord> {
    let decode = || -> std::result::Result<LeaseRecord, String> {
        let tokens = row.ints(at + 1)?;
        let holders = row.byteas(at + 2)?;
        let labels = row.texts(at + 3)?;
        let expires = row.ints(at + 4)?;
        let slots = tokens
            .iter()
            .zip(&holders)
            .zip(labels)
            .zip(&expires)
            .map(|(((&t, h), label), &e)| LeaseSlot {
                token: u64_of(t),
                holder: Holder {
                    id: holder_from(h),
                    label: label.map(|l| Arc::from(l.as_str())),
                },
                expires_at_ms: u64_of(e),
            })
            .collect();
        Ok(LeaseRecord {
            last_token: u64_of(need(row.int(at)?, at)?),
            limit: u32::try_from(need(row.int(at + 5)?, at + 5)?).unwrap_or(0),
            slots,
        })
    };
    decode().map_err(|e| Error::store("decoding a lease", e))
}

#[cfg(test)]
mod tests {
    use super::{array_items, bytea_of};

    fn items(t: &str) -> Result<Vec<Option<String>>, String> {
        array_items(3, Some(t))
    }

    #[test]
    fn arrays_in_text_form_are_split_as_the_server_writes_them() {
        let some = |v: &[&str]| v.iter().map(|s| Some((*s).to_owned())).collect::<Vec<_>>();
        assert_eq!(items("{}"), Ok(vec![]));
        assert_eq!(array_items(3, None), Ok(vec![]));
        assert_eq!(items("{1,-2,30}"), Ok(some(&["1", "-2", "30"])));
        // Quoted: commas, braces, quotes, backslashes, spaces, the word
        // NULL and the empty string are text; unquoted NULL is NULL.
        assert_eq!(
            items(r#"{NULL,"a,b","{x}","q\"x","back\\slash"," ","NULL",""}"#),
            Ok(vec![
                None,
                Some("a,b".into()),
                Some("{x}".into()),
                Some("q\"x".into()),
                Some("back\\slash".into()),
                Some(" ".into()),
                Some("NULL".into()),
                Some(String::new()),
            ])
        );
        assert_eq!(items(r#"{"\\x0aff"}"#), Ok(some(&["\\x0aff"])));
        for bad in ["", "1,2", "{1,2", r#"{"open}"#, r#"{"a"b}"#, r#"{"a\"}"#] {
            let err = items(bad).expect_err(bad);
            assert!(err.contains("column 3"), "{bad}: {err}");
        }
    }

    #[test]
    fn bytea_in_hex_form_is_decoded_and_anything_else_refused() {
        assert_eq!(bytea_of(2, "\\x"), Ok(vec![]));
        assert_eq!(bytea_of(2, "\\x00ff10Ab"), Ok(vec![0, 255, 16, 171]));
        for bad in ["00ff", "\\x0", "\\xzz", "\\\\x00"] {
            let err = bytea_of(2, bad).expect_err(bad);
            assert!(err.contains("column 2"), "{bad}: {err}");
        }
    }
}
