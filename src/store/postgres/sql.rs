//! Literal SQL: the writes of a transaction rendered as text, so that all
//! of them and the COMMIT travel in one simple-query round trip.

use crate::core::{JobRecord, LeaseRecord};
use crate::error::{Error, Result};
use crate::store::{holder_bytes, i64_of};

/// SQL text with literal values, for the writes of a flush: all of them,
/// and the COMMIT, travel in one simple-query round trip. Sessions run with
/// `standard_conforming_strings = on`, so inside `'...'` only the quote is
/// special (and doubled); bytes are hex; numbers are formatted by Rust. A
/// NUL (which the core never lets through, and PostgreSQL text cannot hold)
/// is refused rather than sent.
pub(super) struct Sql(pub String);

impl Sql {
    pub(super) fn raw(&mut self, text: &str) -> &mut Self {
        self.0.push_str(text);
        self
    }

    pub(super) fn text(&mut self, field: &'static str, text: &str) -> Result<&mut Self> {
        if text.contains('\0') {
            return Err(Error::invalid(field, "contains a NUL byte"));
        }
        self.0.reserve(text.len() + 2);
        self.0.push('\'');
        for c in text.chars() {
            if c == '\'' {
                self.0.push('\'');
            }
            self.0.push(c);
        }
        self.0.push('\'');
        Ok(self)
    }

    pub(super) fn opt_text(
        &mut self,
        field: &'static str,
        text: Option<&str>,
    ) -> Result<&mut Self> {
        match text {
            Some(t) => self.text(field, t),
            None => Ok(self.raw("NULL")),
        }
    }

    pub(super) fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        use std::fmt::Write;
        self.0.reserve(bytes.len() * 2 + 12);
        self.0.push_str("'\\x");
        for b in bytes {
            let _ = write!(self.0, "{b:02x}");
        }
        self.raw("'::bytea")
    }

    pub(super) fn int(&mut self, field: &'static str, v: u64) -> Result<&mut Self> {
        use std::fmt::Write;
        let _ = write!(self.0, "{}", i64_of(field, v)?);
        Ok(self)
    }

    pub(super) fn opt_int(&mut self, field: &'static str, v: Option<u64>) -> Result<&mut Self> {
        match v {
            Some(v) => self.int(field, v),
            None => Ok(self.raw("NULL")),
        }
    }

    /// The fields of `job` that can change after it is created, in the
    /// order of [`UPDATE_FIELDS`], typed (the first row of a VALUES list
    /// sets the column types).
    pub(super) fn job_changes(&mut self, job: &JobRecord) -> Result<&mut Self> {
        let claim = job.claim;
        self.raw("(")
            .int("id", job.id.0)?
            .raw("::int8, ")
            // Parenthesized: `::` binds tighter than unary minus.
            .raw(&format!("({})::int4, ", job.priority))
            .int("run_at", job.run_at_ms)?
            .raw("::int8, ")
            .int("max_attempts", job.max_attempts.into())?
            .raw("::int8, ")
            .int("attempts", job.attempts.into())?
            .raw("::int8, ")
            .int("expiries", job.expiries.into())?
            .raw("::int8, ")
            .int("token", job.last_token)?
            .raw("::int8, ")
            .raw(&job.state.code().to_string())
            .raw("::int2, ");
        match claim {
            Some(c) => self.bytes(&holder_bytes(c.holder)),
            None => self.raw("NULL::bytea"),
        };
        self.raw(", ")
            .opt_int("token", claim.map(|c| c.token))?
            .raw("::int8, ")
            .opt_int("lease_until", claim.map(|c| c.lease_until_ms))?
            .raw("::int8, ")
            .raw(if job.cancel_requested {
                "true"
            } else {
                "false"
            })
            .raw(", ")
            .opt_text("last_error", job.last_error.as_deref())?
            .raw("::text, ")
            .opt_int("finished_at", job.finished_at_ms)?
            .raw("::int8)");
        Ok(self)
    }

    /// A whole new job row, in the order of [`COLUMNS`].
    pub(super) fn job_row(&mut self, job: &JobRecord) -> Result<&mut Self> {
        let claim = job.claim;
        self.raw("(")
            .int("id", job.id.0)?
            .raw(", ")
            .text("queue", &job.queue)?
            .raw(", ")
            .bytes(&job.payload)
            .raw(&format!(", {}, ", job.priority))
            .int("run_at", job.run_at_ms)?
            .raw(", ")
            .int("created_at", job.created_at_ms)?
            .raw(&format!(
                ", {}, {}, {}, ",
                job.max_attempts, job.attempts, job.expiries
            ))
            .int("token", job.last_token)?
            .raw(&format!(", {}, ", job.state.code()));
        match claim {
            Some(c) => self.bytes(&holder_bytes(c.holder)),
            None => self.raw("NULL"),
        };
        self.raw(", ")
            .opt_int("token", claim.map(|c| c.token))?
            .raw(", ")
            .opt_int("lease_until", claim.map(|c| c.lease_until_ms))?
            .raw(if job.cancel_requested {
                ", true, "
            } else {
                ", false, "
            })
            .opt_text("last_error", job.last_error.as_deref())?
            .raw(", ")
            .opt_text("unique_key", job.unique_key.as_deref())?
            .raw(", ")
            .opt_int("finished_at", job.finished_at_ms)?
            .raw(")");
        Ok(self)
    }

    /// A lease record's columns after its key: last token and slot arrays.
    pub(super) fn lease(&mut self, r: &LeaseRecord) -> Result<&mut Self> {
        self.int("token", r.last_token)?.raw(", ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .int("token", slot.token)?;
        }
        self.raw("]::int8[], ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .bytes(&holder_bytes(slot.holder.id));
        }
        self.raw("]::bytea[], ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .opt_text("holder label", slot.holder.label.as_deref())?;
        }
        self.raw("]::text[], ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .int("expires_at", slot.expires_at_ms)?;
        }
        Ok(self.raw(&format!("]::int8[], {}", r.limit)))
    }
}

/// The columns [`Sql::job_changes`] writes.
const UPDATE_FIELDS: &str = "id, priority, run_at, max_attempts, attempts, expiries, last_token, state, claim_holder, claim_token, lease_until, cancel_requested, last_error, finished_at";

/// One UPDATE for `jobs` (rows read in this transaction): by key for one
/// row (it plans fastest), else one statement joining a VALUES list.
pub(super) fn render_updates(sql: &mut Sql, schema: &str, jobs: &[&JobRecord]) -> Result<()> {
    match jobs {
        [] => Ok(()),
        [one] => {
            sql.raw("UPDATE ")
                .raw(schema)
                .raw(".jobs SET (")
                .raw(UPDATE_FIELDS)
                .raw(") = ")
                .job_changes(one)?
                .raw(" WHERE id = ")
                .int("id", one.id.0)?
                .raw(";\n");
            Ok(())
        }
        many => {
            sql.raw("UPDATE ").raw(schema).raw(".jobs AS j SET priority = u.priority, run_at = u.run_at, max_attempts = u.max_attempts, attempts = u.attempts, expiries = u.expiries, last_token = u.last_token, state = u.state, claim_holder = u.claim_holder, claim_token = u.claim_token, lease_until = u.lease_until, cancel_requested = u.cancel_requested, last_error = u.last_error, finished_at = u.finished_at FROM (VALUES ");
            for (i, c) in many.iter().enumerate() {
                sql.raw(if i == 0 { "" } else { ",\n" });
                sql.job_changes(c)?;
            }
            sql.raw(") AS u(")
                .raw(UPDATE_FIELDS)
                .raw(") WHERE j.id = u.id;\n");
            Ok(())
        }
    }
}
