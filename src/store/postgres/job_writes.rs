//! A flush's job writes as literal SQL ([`render_job_writes`]): the
//! deletes, the updates (an `EXECUTE` of a statement each session
//! prepares, [`prepare_update`]) and the inserts, one statement per kind.

use super::sql::Sql;
use super::statements::COLUMNS;
use crate::core::{JobId, JobRecord, JobState};
use crate::error::Field;
use crate::error::{Error, Result};
use crate::store::{after_text, holder_bytes, i64_of};

impl Sql {
    /// A whole new job row, in the order of [`COLUMNS`].
    pub(super) fn job_row(&mut self, job: &JobRecord) -> Result<&mut Self> {
        let claim = job.claim;
        self.raw("(")
            .int(Field::Id, job.id.0)?
            .raw(", ")
            .text(Field::Queue, &job.queue)?
            .raw(", ")
            .bytes(&job.payload)
            .raw(&format!(", {}, ", job.priority))
            .int(Field::RunAt, job.run_at_ms)?
            .raw(", ")
            .int(Field::CreatedAt, job.created_at_ms)?
            .raw(&format!(
                ", {}, {}, {}, ",
                job.max_attempts, job.attempts, job.expiries
            ))
            .int(Field::Token, job.last_token)?
            .raw(&format!(", {}, ", job.state.code()));
        match claim {
            Some(c) => self.bytes(&holder_bytes(c.holder)),
            None => self.raw("NULL"),
        };
        self.raw(", ")
            .opt_int(Field::Token, claim.map(|c| c.token))?
            .raw(", ")
            .opt_int(Field::LeaseUntil, claim.map(|c| c.lease_until_ms))?
            .raw(if job.cancel_requested {
                ", true, "
            } else {
                ", false, "
            })
            .opt_text(Field::LastError, job.last_error.as_deref())?
            .raw(", ")
            .opt_text(Field::UniqueKey, job.unique_key.as_deref())?
            .raw(", ")
            .opt_int(Field::FinishedAt, job.finished_at_ms)?
            .raw(", ");
        match &job.result {
            Some(result) => self.bytes(result),
            None => self.raw("NULL"),
        };
        self.raw(", ")
            .opt_text(Field::ConcurrencyKey, job.key.as_deref())?
            .raw(if job.parked { ", true, " } else { ", false, " })
            .opt_int(Field::Timeout, job.timeout_ms)?
            .raw(", ")
            .opt_int(Field::Timeout, claim.and_then(|c| c.deadline_ms))?
            .raw(", ");
        let progress = job.progress.as_ref();
        self.opt_int(Field::Progress, progress.map(|p| u64::from(p.permyriad)))?
            .raw(", ")
            .opt_text(Field::Progress, progress.map(|p| &*p.message))?
            .raw(", ")
            .opt_text(
                Field::After,
                job.after.as_deref().map(after_text).as_deref(),
            )?
            .raw(&format!(
                ", {}, {}, {}",
                job.after_any, job.waiting_on, job.has_children
            ));
        Ok(self.raw(")"))
    }

    /// An array literal (`'{a,b}'`) of `items`, each written by `each`.
    fn array<T>(
        &mut self,
        items: &[T],
        mut each: impl FnMut(&mut String, &T) -> Result<()>,
    ) -> Result<&mut Self> {
        self.0.push_str("'{");
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.0.push(',');
            }
            each(&mut self.0, item)?;
        }
        self.0.push_str("}'");
        Ok(self)
    }

    /// The fields of `jobs` that can change, as one array literal per
    /// column of [`UPDATE_FIELDS`] (typed by the prepared statement).
    fn job_arrays(&mut self, jobs: &[&JobRecord]) -> Result<&mut Self> {
        let rows = jobs
            .iter()
            .map(|j| update_values(j))
            .collect::<Result<Vec<_>>>()?;
        for column in 0..UPDATE_TYPES.len() {
            self.raw(if column == 0 { "" } else { ", " })
                .array(&rows, |out, row| row[column].array_element(out))?;
        }
        Ok(self)
    }

    /// The fields of `job` that can change, as one literal per column of
    /// [`UPDATE_FIELDS`] (typed by the prepared statement).
    fn job_scalars(&mut self, job: &JobRecord) -> Result<&mut Self> {
        use std::fmt::Write;
        for (i, value) in update_values(job)?.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " });
            match value {
                Value::Int(Some(v)) => write!(self.0, "{v}").map_err(fmt_err)?,
                Value::Bool(b) => self.0.push_str(if *b { "true" } else { "false" }),
                Value::Text(field, Some(t)) => {
                    self.text(*field, t)?;
                }
                Value::Bytes(Some(b)) => {
                    self.bytes(b);
                }
                Value::Int(None) | Value::Text(_, None) | Value::Bytes(None) => {
                    self.0.push_str("NULL")
                }
            }
        }
        Ok(self)
    }
}

/// The columns of a job that can change after it is created (the id first,
/// to find the row), in the order of the prepared UPDATE's parameters.
const UPDATE_FIELDS: &str = "id, priority, run_at, max_attempts, attempts, expiries, last_token, state, claim_holder, claim_token, lease_until, cancel_requested, last_error, finished_at, result, parked, claim_deadline, progress, progress_msg, waiting_on, has_children";

/// The types of [`UPDATE_FIELDS`].
const UPDATE_TYPES: [&str; 21] = [
    "int8", "int4", "int8", "int8", "int8", "int8", "int8", "int2", "bytea", "int8", "int8",
    "bool", "text", "int8", "bytea", "bool", "int8", "int4", "text", "int4", "bool",
];

/// One field of [`UPDATE_FIELDS`], before it is written as an SQL literal
/// or as an element of an array literal.
enum Value<'a> {
    Int(Option<i64>),
    Bool(bool),
    /// Text, and the field a NUL in it is reported against.
    Text(Field, Option<&'a str>),
    Bytes(Option<std::borrow::Cow<'a, [u8]>>),
}

impl Value<'_> {
    /// This value as an element of an array literal.
    fn array_element(&self, out: &mut String) -> Result<()> {
        use std::fmt::Write;
        match self {
            Value::Int(Some(v)) => write!(out, "{v}").map_err(fmt_err)?,
            Value::Bool(b) => out.push(if *b { 't' } else { 'f' }),
            Value::Text(field, text) => array_text(out, *field, *text)?,
            Value::Bytes(Some(b)) => array_bytes(out, b),
            Value::Int(None) | Value::Bytes(None) => out.push_str("NULL"),
        }
        Ok(())
    }
}

/// The fields of `j` that can change, in the order of [`UPDATE_FIELDS`].
fn update_values(j: &JobRecord) -> Result<[Value<'_>; 21]> {
    let int = |field, v: u64| i64_of(field, v).map(|v| Value::Int(Some(v)));
    let opt_int = |field, v: Option<u64>| v.map(|v| i64_of(field, v)).transpose().map(Value::Int);
    let claim = j.claim;
    let progress = j.progress.as_ref();
    Ok([
        int(Field::Id, j.id.0)?,
        Value::Int(Some(i64::from(j.priority))),
        int(Field::RunAt, j.run_at_ms)?,
        Value::Int(Some(i64::from(j.max_attempts))),
        Value::Int(Some(i64::from(j.attempts))),
        Value::Int(Some(i64::from(j.expiries))),
        int(Field::Token, j.last_token)?,
        Value::Int(Some(i64::from(j.state.code()))),
        Value::Bytes(claim.map(|c| holder_bytes(c.holder).to_vec().into())),
        opt_int(Field::Token, claim.map(|c| c.token))?,
        opt_int(Field::LeaseUntil, claim.map(|c| c.lease_until_ms))?,
        Value::Bool(j.cancel_requested),
        Value::Text(Field::LastError, j.last_error.as_deref()),
        opt_int(Field::FinishedAt, j.finished_at_ms)?,
        Value::Bytes(j.result.as_deref().map(Into::into)),
        Value::Bool(j.parked),
        opt_int(Field::Timeout, claim.and_then(|c| c.deadline_ms))?,
        Value::Int(progress.map(|p| i64::from(p.permyriad))),
        Value::Text(Field::Progress, progress.map(|p| &*p.message)),
        Value::Int(Some(i64::from(j.waiting_on))),
        Value::Bool(j.has_children),
    ])
}

/// Settings for the rest of the transaction, sent before the statements
/// that take a batch of job ids (the read of a batch, the many-row UPDATE),
/// which run only after them (the batch read is a statement of its own,
/// `jobs_get_by_id`): with neither a scan of the table nor a hash or merge
/// join to choose, every plan the session keeps for them is the lookup by
/// id through the primary key, whatever the table's size when it was made.
/// Left to itself the planner scanned the whole table for 64 ids and more
/// (its cost model prefers that up to tens of thousands of rows) and kept
/// a plan made while the table was small (BENCHMARKS.md, twelfth session).
/// The other statements of such a transaction have an index to go through.
pub(super) const BY_ID: &str =
    "SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off";

/// The name of the many-row UPDATE each session prepares (SQL-level
/// `PREPARE`).
const PREPARED_UPDATE: &str = "leasehold_jobs_update";

/// The name of the one-row UPDATE each session prepares.
const PREPARED_UPDATE_ONE: &str = "leasehold_job_update";

/// The `PREPARE`s, for the quoted `schema`, of [`PREPARED_UPDATE`] (one
/// UPDATE joining the rows of 21 parallel arrays to the jobs by id) and of
/// [`PREPARED_UPDATE_ONE`] (one row by its id, from 21 plain parameters).
///
/// Measured against the literal `UPDATE ... FROM (VALUES ...)` it replaced,
/// literal arrays, and a protocol-level prepared statement with binary
/// arrays (one more round trip): prepared and executed with array literals
/// inside the commit script costs the server the least (no parse per
/// batch; its plan is the lookup by id that [`BY_ID`] leaves) and keeps
/// the writes and the COMMIT in one round trip. For a
/// single row the join of arrays cost the server 0.06 ms more than a plain
/// `UPDATE ... WHERE id =` (BENCHMARKS.md), hence the second statement.
pub(super) fn prepare_update(schema: &str) -> String {
    let params: Vec<String> = (1..=UPDATE_TYPES.len()).map(|i| format!("${i}")).collect();
    let arrays: Vec<String> = UPDATE_TYPES.iter().map(|t| format!("{t}[]")).collect();
    // Every field but the id, assigned from `value(field, its parameter)`.
    let set = |value: &dyn Fn(&str, &str) -> String| {
        let assignments: Vec<String> = UPDATE_FIELDS
            .split(", ")
            .zip(&params)
            .skip(1)
            .map(|(field, param)| format!("{field} = {}", value(field, param)))
            .collect();
        assignments.join(", ")
    };
    format!(
        "PREPARE {PREPARED_UPDATE}({}) AS UPDATE {schema}.jobs AS j SET {} FROM unnest({}) AS u({UPDATE_FIELDS}) WHERE j.id = u.id;
         PREPARE {PREPARED_UPDATE_ONE}({}) AS UPDATE {schema}.jobs SET {} WHERE id = $1",
        arrays.join(", "),
        set(&|field, _| format!("u.{field}")),
        params.join(", "),
        UPDATE_TYPES.join(", "),
        set(&|_, param| param.to_owned()),
    )
}

/// A pending job write of a transaction.
pub(super) struct JobWrite<'a> {
    pub record: &'a JobRecord,
    /// The row exists (an UPDATE), else it is inserted.
    pub in_db: bool,
    /// Its state in the database (as read or last written).
    pub db_state: Option<JobState>,
}

/// The UPDATE groups of `writes`, in the order they must run: one group,
/// unless a row enters the live range of the unique-key index (a retried
/// job taking its key back) while others leave it (jobs becoming terminal);
/// then the leaving rows first, since the order of one multi-row UPDATE is
/// unspecified and the index is checked row by row.
fn update_groups<'a>(writes: &[JobWrite<'a>]) -> Vec<Vec<&'a JobRecord>> {
    let updates = writes.iter().filter(|w| w.in_db);
    let entering = updates.clone().any(|w| {
        w.record.unique_key.is_some()
            && !w.record.state.is_terminal()
            && w.db_state.is_some_and(JobState::is_terminal)
    });
    let rows: Vec<&JobRecord> = updates.map(|w| w.record).collect();
    if !entering {
        return if rows.is_empty() { vec![] } else { vec![rows] };
    }
    let (leaving, staying) = rows.into_iter().partition(|job| job.state.is_terminal());
    vec![leaving, staying]
}

/// Render the job writes of a flush, one statement per kind: the deletes,
/// the updates (one `EXECUTE` of the session's prepared UPDATE per group
/// of [`update_groups`]), then the inserts. Returns whether anything was
/// rendered.
pub(super) fn render_job_writes(
    sql: &mut Sql,
    schema: &str,
    deleted: &[JobId],
    writes: &[JobWrite<'_>],
) -> Result<bool> {
    let start = sql.0.len();
    if !deleted.is_empty() {
        sql.raw("DELETE FROM ")
            .raw(schema)
            .raw(".jobs WHERE id IN (");
        for (i, id) in deleted.iter().enumerate() {
            sql.raw(if i == 0 { "" } else { ", " })
                .int(Field::Id, id.0)?;
        }
        sql.raw(");\n");
    }
    for group in update_groups(writes) {
        match group.as_slice() {
            [one] => sql
                .raw("EXECUTE ")
                .raw(PREPARED_UPDATE_ONE)
                .raw("(")
                .job_scalars(one)?,
            _ => sql
                .raw(BY_ID)
                .raw(";\nEXECUTE ")
                .raw(PREPARED_UPDATE)
                .raw("(")
                .job_arrays(&group)?,
        }
        .raw(");\n");
    }
    let mut inserts = writes.iter().filter(|w| !w.in_db).peekable();
    if inserts.peek().is_some() {
        sql.raw("INSERT INTO ")
            .raw(schema)
            .raw(".jobs (")
            .raw(COLUMNS)
            .raw(") VALUES ");
        for (i, w) in inserts.enumerate() {
            sql.raw(if i == 0 { "" } else { ",\n" }).job_row(w.record)?;
        }
        sql.raw(";\n");
    }
    Ok(sql.0.len() > start)
}

fn fmt_err(_: std::fmt::Error) -> Error {
    Error::store("rendering SQL", "formatting failed")
}

/// A bytea element of an array literal: `"\\x..."` (the array parser
/// takes one backslash away; bytea's input reads the hex).
fn array_bytes(out: &mut String, bytes: &[u8]) {
    use std::fmt::Write;
    out.push_str("\"\\\\x");
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out.push('"');
}

/// A text element of an array literal, always quoted (so that `NULL` and
/// blanks stay text): `"` and `\` escaped for the array parser, `'`
/// doubled for the SQL literal around it. A NUL is refused.
fn array_text(out: &mut String, field: Field, text: Option<&str>) -> Result<()> {
    let Some(text) = text else {
        out.push_str("NULL");
        return Ok(());
    };
    if text.contains('\0') {
        return Err(Error::invalid(field, "contains a NUL byte"));
    }
    out.reserve(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => out.push('\\'),
            '\'' => out.push('\''),
            _ => {}
        }
        out.push(c);
    }
    out.push('"');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn job(id: u64, state: JobState, unique_key: Option<&str>) -> JobRecord {
        JobRecord {
            priority: -7,
            run_at_ms: 10,
            created_at_ms: 5,
            state,
            unique_key: unique_key.map(Arc::from),
            ..crate::core::job::sample_job(id)
        }
    }

    fn render(writes: &[JobWrite<'_>], deleted: &[JobId]) -> String {
        let mut sql = Sql(String::new());
        render_job_writes(&mut sql, "\"s\"", deleted, writes).unwrap();
        sql.0
    }

    fn existing(record: &JobRecord, db_state: JobState) -> JobWrite<'_> {
        JobWrite {
            record,
            in_db: true,
            db_state: Some(db_state),
        }
    }

    #[test]
    fn a_batch_is_one_statement_per_kind() {
        let claimed: Vec<JobRecord> = (1..=64).map(|i| job(i, JobState::Running, None)).collect();
        let new = job(100, JobState::Ready, Some("k"));
        let mut writes: Vec<JobWrite<'_>> = claimed
            .iter()
            .map(|j| existing(j, JobState::Ready))
            .collect();
        writes.push(JobWrite {
            record: &new,
            in_db: false,
            db_state: None,
        });
        let sql = render(&writes, &[JobId(7), JobId(8)]);
        let statements: Vec<&str> = sql
            .lines()
            .map(|l| l.split(' ').next().unwrap_or(""))
            .collect();
        assert_eq!(statements, ["DELETE", "SET", "EXECUTE", "INSERT"], "{sql}");
        assert!(sql.contains("'{1,2,3,"), "the ids as one array: {sql}");
    }

    /// A retried job taking its unique key back while another job gives
    /// the same key up: the one giving it up is written first.
    #[test]
    fn rows_leaving_the_unique_range_are_written_before_rows_entering_it() {
        let retried = job(1, JobState::Ready, Some("k"));
        let finished = job(2, JobState::Dead, Some("k"));
        let writes = [
            existing(&retried, JobState::Cancelled),
            existing(&finished, JobState::Running),
        ];
        let sql = render(&writes, &[]);
        let lines: Vec<&str> = sql.lines().collect();
        assert_eq!(lines.len(), 2, "{sql}");
        assert!(
            lines[0].starts_with("EXECUTE leasehold_job_update(2, "),
            "the leaving row first: {sql}"
        );
        assert!(
            lines[1].starts_with("EXECUTE leasehold_job_update(1, "),
            "{sql}"
        );
        // Without a row entering the range, one statement whatever the states.
        let claimed = job(1, JobState::Running, Some("k"));
        let writes = [
            existing(&claimed, JobState::Ready),
            existing(&finished, JobState::Running),
        ];
        assert_eq!(
            render(&writes, &[]).lines().count(),
            2,
            "the plans' settings, the UPDATE"
        );
    }

    /// One row is written by the one-row statement, its fields as plain
    /// literals in the order of the prepared parameters; two or more by
    /// the array statement, planned to look them up by id.
    #[test]
    fn one_row_is_written_with_plain_literals() {
        let mut failed = job(4, JobState::Scheduled, None);
        failed.last_error = Some(Arc::from("it's"));
        failed.result = Some(Arc::from(&b"\x01"[..]));
        let sql = render(&[existing(&failed, JobState::Running)], &[]);
        assert_eq!(
            sql.trim_end(),
            "EXECUTE leasehold_job_update(4, -7, 10, 3, 1, 0, 1, 1, NULL, NULL, NULL, false, 'it''s', NULL, '\\x01'::bytea, false, NULL, NULL, NULL, 0, false);"
        );
        let other = job(5, JobState::Done, None);
        let writes = [
            existing(&failed, JobState::Running),
            existing(&other, JobState::Running),
        ];
        let many = render(&writes, &[]);
        let update = many.find("EXECUTE leasehold_jobs_update('{4,5}'").unwrap();
        assert_eq!(&many[..update], format!("{BY_ID};\n"));
        let prepared = prepare_update("\"s\"");
        assert!(
            prepared.contains("PREPARE leasehold_job_update(int8, int4, int8, int8, int8, int8, int8, int2, bytea, int8, int8, bool, text, int8, bytea, bool, int8, int4, text, int4, bool) AS UPDATE \"s\".jobs SET priority = $2, run_at = $3,"),
            "{prepared}"
        );
        assert!(
            prepared.contains("has_children = $21 WHERE id = $1"),
            "{prepared}"
        );
        assert!(
            prepared.contains(
                "AS UPDATE \"s\".jobs AS j SET priority = u.priority, run_at = u.run_at,"
            ),
            "{prepared}"
        );
        assert!(
            prepared.contains("has_children = u.has_children FROM unnest($1, $2,"),
            "{prepared}"
        );
    }

    #[test]
    fn text_and_bytes_in_array_literals_are_escaped_for_both_parsers() {
        let mut out = String::new();
        array_text(&mut out, Field::Reason, Some(r#"it's "q" \ NULL"#)).unwrap();
        assert_eq!(out, r#""it''s \"q\" \\ NULL""#);
        out.clear();
        array_text(&mut out, Field::Reason, None).unwrap();
        assert_eq!(out, "NULL");
        assert!(matches!(
            array_text(&mut out, Field::Reason, Some("a\0b")),
            Err(Error::Invalid {
                field: Field::Reason,
                ..
            })
        ));
        out.clear();
        array_bytes(&mut out, &[0x00, 0xab]);
        assert_eq!(out, r#""\\x00ab""#);
    }
}
