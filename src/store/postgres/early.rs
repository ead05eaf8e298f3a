//! A transaction's first read sent with its `BEGIN` ([`FirstRead`]): one
//! round trip fewer for what starts by locking one known row (a lease's
//! acquire, renewal and release; a job's completion, failure or renewal).
//!
//! The read goes in the same simple query as `BEGIN` and the clock, as an
//! `EXECUTE` of a statement each session prepares at the SQL level (the
//! same text as the binary-protocol statement the transaction would use),
//! so its row comes back as text ([`super::rows::Cells`] decodes both
//! forms). Only single rows go this way: measured on a claim's scans and on
//! batches of 128 jobs (BENCHMARKS.md), the text form and the statement's
//! planning cost the server more than the round trip saves.

use super::sql::Sql;
use super::statements::{job_get_sql, LEASE_GET};
use crate::error::Field;
use crate::store::FirstRead;
use postgres::{SimpleQueryMessage, SimpleQueryRow};

/// The SQL-level names of the two statements.
const EARLY_JOB: &str = "leasehold_early_job";
const EARLY_LEASE: &str = "leasehold_early_lease";

/// `PREPARE` of both, run once per session.
pub(super) fn prepare_early(schema: &str) -> String {
    format!(
        "PREPARE {EARLY_JOB}(int8) AS {};\nPREPARE {EARLY_LEASE}(text) AS {}",
        job_get_sql().replace("{s}", schema),
        LEASE_GET.replace("{s}", schema),
    )
}

/// The statement reading `first`; `None` when it is not read early (more
/// than one job) or a value cannot be sent (the read then happens as it
/// always did, and reports its own error).
pub(super) fn render(first: &FirstRead<'_>) -> Option<String> {
    let mut sql = Sql(String::with_capacity(64));
    match first {
        FirstRead::Jobs([id]) => {
            let id = i64::try_from(id.0).ok()?;
            sql.raw("EXECUTE ").raw(EARLY_JOB).raw(&format!("({id})"));
        }
        FirstRead::Jobs(_) => return None,
        FirstRead::Lease(key) => {
            sql.raw("EXECUTE ").raw(EARLY_LEASE).raw("(");
            sql.text(Field::Key, key).ok()?;
            sql.raw(")");
        }
    }
    Some(sql.0)
}

/// The row of `BEGIN`'s own statement and the rows of the read sent after
/// it: a simple query's messages, each statement's rows ended by its
/// `CommandComplete` (`BEGIN`'s comes first, with no rows).
pub(super) fn split(
    msgs: Vec<SimpleQueryMessage>,
) -> (Option<SimpleQueryRow>, Vec<SimpleQueryRow>) {
    let (mut own, mut first, mut done) = (None, Vec::new(), 0);
    for m in msgs {
        match m {
            SimpleQueryMessage::CommandComplete(_) => done += 1,
            // BEGIN, then the clock's statement, then the read.
            SimpleQueryMessage::Row(r) if done == 1 && own.is_none() => own = Some(r),
            SimpleQueryMessage::Row(r) if done >= 2 => first.push(r),
            _ => {}
        }
    }
    (own, first)
}
