//! A transaction's first read sent with its `BEGIN` ([`FirstRead`]): one
//! round trip fewer for what starts by locking one known row (a lease's
//! acquire, renewal and release; a job's completion, failure or renewal)
//! or by a claim's scans (a claim of a few jobs).
//!
//! The read goes in the same simple query as `BEGIN` and the clock, as an
//! `EXECUTE` of a statement each session prepares at the SQL level (the
//! same text as the binary-protocol statement the transaction would use),
//! so its rows come back as text ([`super::rows::Cells`] decodes both
//! forms). A claim's scans take their time from the same clock expression
//! as BEGIN's statement (the transaction's start), so they ran at the
//! transaction's time unless this process had already handed out a later
//! one; `PgTxn::pending` uses them only then, and only for the
//! transaction's first read. Batches (of jobs, or claims of more than
//! [`EARLY_CLAIM_MAX`]) are read apart in binary: measured on batches of
//! 128 (BENCHMARKS.md), the text form of many rows costs the server more
//! than the round trip saves.

use super::job_writes::BY_ID;
use super::sql::Sql;
use super::statements::{job_get_sql, pending_ready_sql, LEASE_GET};
use crate::error::Field;
use crate::store::FirstRead;
use postgres::{SimpleQueryMessage, SimpleQueryRow};

/// The SQL-level names of the statements.
const EARLY_JOB: &str = "leasehold_early_job";
const EARLY_LEASE: &str = "leasehold_early_lease";
const EARLY_CLAIM: &str = "leasehold_early_claim";

/// A claim asking for more jobs than this reads them in binary form, apart
/// (the text form of many rows costs more than the round trip saves).
const EARLY_CLAIM_MAX: usize = 4;

/// `PREPARE` of each, run once per session.
pub(super) fn prepare_early(schema: &str) -> String {
    format!(
        "PREPARE {EARLY_JOB}(int8) AS {};\nPREPARE {EARLY_LEASE}(text) AS {};
         PREPARE {EARLY_CLAIM}(text, int8, int8, int8) AS {}",
        job_get_sql().replace("{s}", schema),
        LEASE_GET.replace("{s}", schema),
        pending_ready_sql().replace("{s}", schema),
    )
}

/// The statement reading `first`; `None` when it is not read early (more
/// than one job, a claim of many, or a claim when the transaction's time
/// is not the server's `clock`) or a value cannot be sent (the read then
/// happens as it always did, and reports its own error). A claim's scans
/// run at `clock`, BEGIN's own reading of the server's clock (the
/// transaction's time unless this process has seen a later one:
/// `PgTxn::pending` then reads again).
pub(super) fn render(first: &FirstRead<'_>, clock: Option<&str>) -> Option<String> {
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
        FirstRead::Claim { queue, ready } => {
            let clock = clock.filter(|_| (1..=EARLY_CLAIM_MAX).contains(ready))?;
            sql.raw("EXECUTE ").raw(EARLY_CLAIM).raw("(");
            sql.text(Field::Queue, queue).ok()?;
            sql.raw(&format!(", {clock}, {}, {ready})", crate::core::job::CHUNK));
        }
    }
    Some(sql.0)
}

/// A setting sent with `BEGIN` for what `first` reads: a batch of jobs is
/// looked up by id, one by one
/// ([`BY_ID`]).
pub(super) fn setting(first: &FirstRead<'_>) -> Option<&'static str> {
    matches!(first, FirstRead::Jobs(ids) if ids.len() > 1).then_some(BY_ID)
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
