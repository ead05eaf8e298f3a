//! Enqueue inside the caller's own transaction (issue 27 §1): the SQL
//! function `push` in leasehold's schema, and [`crate::Queue::push_in`]
//! (and its tokio twin) that call it on a `postgres` or `tokio-postgres`
//! transaction.
//!
//! # Design
//! - **The job is a row written by the caller's transaction**, so it
//!   exists exactly when that transaction commits: a rollback (or a rolled
//!   back savepoint) leaves nothing, and no worker can see it before the
//!   commit (READ COMMITTED scans see committed rows only).
//! - **Woken by the commit**: the function sends `pg_notify` on the
//!   schema's channel (a ready job can start; a delayed one changes when
//!   the queue next changes by time); PostgreSQL delivers a
//!   transaction's notifications when it commits, and drops them when it
//!   rolls back, so idle workers wake at the commit and only then.
//! - **No lock that blocks workers**: the insert locks only its own new
//!   row; candidate jobs of a unique key are read without `FOR UPDATE`;
//!   a unique key takes the advisory lock every push and retry of that key
//!   takes ([`JobTxn::lock_unique`](crate::core::JobTxn::lock_unique)),
//!   which waits only for other pushes of the same key until the caller
//!   commits.
//! - **The rule, in SQL**: the checks and limits are the enqueue rule's
//!   (`core::job::enqueue`), rendered from the same constants; a stale
//!   candidate (a claim that ran out, a due retry) is judged by what the
//!   rule would make of it, without writing it: cancelled when a cancel
//!   was asked, dead when its attempts are spent or the default policy's
//!   crash-loop quarantine takes it, else ready or scheduled (a retry).
//!   `tests/push_in.rs` pushes the same specs through both and compares
//!   the rows.
//! - **Isolation**: a unique push needs READ COMMITTED (the default): each
//!   statement of the function reads a fresh snapshot, so the lookup after
//!   the key's lock sees a push that committed while it waited. Under
//!   REPEATABLE READ or SERIALIZABLE the snapshot predates the lock (and
//!   the library's own pushes run in READ COMMITTED, out of reach of
//!   SERIALIZABLE's checks), so the function refuses a unique key there.
//! - **Time and policy**: the function reads `clock_timestamp()` (a store
//!   opened with a replacement clock is not consulted), and judges stale
//!   candidates with the crash-loop quarantine its caller passes
//!   (`quarantine_expiries`, the client's policy; default the library's).
//!   Its limits are the build's that created it (schema migration 12); a
//!   build that changes them replaces the function in a migration.

use super::error::{pg_err, Stage};
use crate::core::job::{StateSet, UNIQUE_READ};
use crate::core::{
    EnqueueOutcome, JobId, JobSpec, JobState, QueuePolicy, Wake, MAX_ATTEMPTS, MAX_KEY_BYTES,
    MAX_PAYLOAD_BYTES, MAX_TEXT_BYTES, MAX_TTL_MS,
};
use crate::error::{Field, Result};
use crate::store::u64_of;
use postgres::types::{ToSql, Type};

/// The function (`{s}`: the quoted schema, `{channel}`: its notification
/// channel), created by migration 12.
const PUSH_FUNCTION: &str = r"
CREATE OR REPLACE FUNCTION {s}.push(
    queue text,
    payload bytea DEFAULT '\x'::bytea,
    priority int4 DEFAULT 0,
    delay_ms int8 DEFAULT 0,
    max_attempts int4 DEFAULT {default_attempts},
    unique_key text DEFAULT NULL,
    unique_for_ms int8 DEFAULT NULL,
    unique_states text DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    timeout_ms int8 DEFAULT NULL,
    run_at_ms int8 DEFAULT NULL,
    quarantine_expiries int4 DEFAULT {quarantine},
    OUT id int8,
    OUT created bool)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $push$
#variable_conflict use_column
DECLARE
    now_ms int8 := floor(extract(epoch FROM clock_timestamp()) * 1000)::int8;
    at_ms int8;
    states int4 := 0;
    wanted int4;
    since int8 := 0;
    name text;
    cand record;
    fresh int4;
    blocks bool;
    mark text;
BEGIN
    -- The migration marks (`marks`): a moved schema takes no job (a
    -- cut-over waits for the transactions that began before its mark).
    SELECT string_agg(m.name || '=' || m.value, ' ') INTO mark FROM {s}.leasehold_meta m
     WHERE m.name IN ('moved_to', 'moving_from');
    IF mark LIKE 'moved_to=%' THEN
        RAISE EXCEPTION 'this store was moved to % by `leasehold migrate`: use that store instead',
            substr(mark, 10) USING ERRCODE = '55000';
    ELSIF mark IS NOT NULL THEN
        RAISE EXCEPTION '`leasehold migrate` is copying % into this store', substr(mark, 13)
            USING ERRCODE = '55P03';
    END IF;
    IF push.queue IS NULL THEN
        RAISE EXCEPTION 'invalid queue: must not be empty' USING ERRCODE = '22023';
    END IF;
{check_queue}    IF push.payload IS NULL THEN
        push.payload := '\x'::bytea;
    END IF;
    IF octet_length(push.payload) > {max_payload} THEN
        RAISE EXCEPTION 'invalid payload: % bytes is larger than {max_payload}', octet_length(push.payload) USING ERRCODE = '22023';
    END IF;
    IF push.priority IS NULL THEN
        push.priority := 0;
    END IF;
    IF push.max_attempts IS NULL OR push.max_attempts < 1 OR push.max_attempts > {max_attempts} THEN
        RAISE EXCEPTION 'invalid max_attempts: % is outside 1..={max_attempts}', push.max_attempts USING ERRCODE = '22023';
    END IF;
    IF push.unique_key IS NOT NULL AND push.unique_key = '' THEN
        RAISE EXCEPTION 'invalid unique_key: must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(push.unique_key) > {max_text} THEN
        RAISE EXCEPTION 'invalid unique_key: % bytes is longer than {max_text}', octet_length(push.unique_key) USING ERRCODE = '22023';
    END IF;
    IF push.unique_key IS NULL AND (push.unique_for_ms IS NOT NULL OR push.unique_states IS NOT NULL) THEN
        RAISE EXCEPTION 'invalid unique_key: a uniqueness period or states need a unique key' USING ERRCODE = '22023';
    END IF;
    IF push.unique_for_ms IS NOT NULL AND (push.unique_for_ms < 1 OR push.unique_for_ms > {max_ttl}) THEN
        RAISE EXCEPTION 'invalid unique_for_ms: % is outside 1..={max_ttl} (one year)', push.unique_for_ms USING ERRCODE = '22023';
    END IF;
    IF push.unique_states IS NOT NULL THEN
        FOREACH name IN ARRAY string_to_array(push.unique_states, ',') LOOP
            states := states | CASE btrim(name)
                WHEN 'ready' THEN 1 WHEN 'scheduled' THEN 2 WHEN 'running' THEN 4
                WHEN 'done' THEN 8 WHEN 'dead' THEN 16 WHEN 'cancelled' THEN 32
                WHEN 'waiting' THEN 64 ELSE NULL END;
            IF states IS NULL THEN
                RAISE EXCEPTION 'invalid unique_states: % is not a job state (ready, scheduled, running, done, dead, cancelled, waiting)', quote_literal(btrim(name)) USING ERRCODE = '22023';
            END IF;
        END LOOP;
        IF states = 0 THEN
            RAISE EXCEPTION 'invalid unique_states: names no state' USING ERRCODE = '22023';
        END IF;
    ELSIF push.unique_for_ms IS NOT NULL THEN
        states := {all_states};
    ELSE
        states := {live_states};
    END IF;
{check_concurrency_key}    IF push.timeout_ms IS NOT NULL AND (push.timeout_ms < 1 OR push.timeout_ms > {max_ttl}) THEN
        RAISE EXCEPTION 'invalid timeout_ms: % is outside 1..={max_ttl} (one year)', push.timeout_ms USING ERRCODE = '22023';
    END IF;
    IF push.run_at_ms IS NOT NULL THEN
        IF push.run_at_ms > now_ms + {max_ttl} THEN
            RAISE EXCEPTION 'invalid run_at_ms: % is more than a year after now (% ms)', push.run_at_ms, now_ms USING ERRCODE = '22023';
        END IF;
        at_ms := greatest(push.run_at_ms, now_ms);
    ELSIF coalesce(push.delay_ms, 0) = 0 THEN
        at_ms := now_ms;
    ELSIF push.delay_ms < 0 OR push.delay_ms > {max_ttl} THEN
        RAISE EXCEPTION 'invalid delay_ms: % is outside 0..={max_ttl} (one year)', push.delay_ms USING ERRCODE = '22023';
    ELSE
        at_ms := now_ms + push.delay_ms;
    END IF;

    IF push.unique_key IS NOT NULL THEN
        IF current_setting('transaction_isolation') != 'read committed' THEN
            RAISE EXCEPTION 'a unique push needs READ COMMITTED, not %: the snapshot would predate the key''s lock', upper(current_setting('transaction_isolation')) USING ERRCODE = '25001';
        END IF;
        PERFORM pg_advisory_xact_lock(hashtext('{s}.' || push.queue), hashtext(push.unique_key));
        IF push.unique_for_ms IS NOT NULL THEN
            since := greatest(now_ms - push.unique_for_ms, 0) + 1;
        END IF;
        -- Stored states lag time: read running jobs, and scheduled ones
        -- when ready blocks.
        wanted := states | 4 | CASE WHEN states & 1 != 0 THEN 2 ELSE 0 END;
        FOR cand IN
            SELECT j.id, j.state, j.lease_until, j.run_at, j.cancel_requested,
                   j.attempts, j.max_attempts, j.expiries
              FROM {s}.jobs j
             WHERE j.queue = push.queue AND j.unique_key = push.unique_key
               AND j.created_at >= since AND ((1 << j.state) & wanted) != 0
             ORDER BY j.created_at DESC, j.id DESC
             LIMIT {unique_read}
        LOOP
            fresh := cand.state;
            IF cand.state = 2 AND cand.lease_until <= now_ms THEN
                IF cand.cancel_requested THEN
                    fresh := 5;
                ELSIF cand.attempts >= cand.max_attempts
                      OR (push.quarantine_expiries > 0 AND cand.expiries + 1 >= push.quarantine_expiries) THEN
                    fresh := 4;
                ELSE
                    fresh := -1; -- retried: ready or scheduled
                END IF;
            ELSIF cand.state = 1 AND cand.run_at <= now_ms THEN
                fresh := 0;
            END IF;
            blocks := CASE WHEN fresh = -1 THEN states & 3 != 0 ELSE states & (1 << fresh) != 0 END;
            IF blocks THEN
                push.id := cand.id;
                push.created := false;
                RETURN;
            END IF;
        END LOOP;
    END IF;

    push.id := nextval('{s}.job_ids');
    push.created := true;
    INSERT INTO {s}.jobs (id, queue, payload, priority, run_at, created_at, max_attempts,
                          attempts, expiries, last_token, state, cancel_requested,
                          unique_key, conc_key, parked, timeout_ms)
    VALUES (push.id, push.queue, push.payload, push.priority, at_ms, now_ms, push.max_attempts,
            0, 0, 0, CASE WHEN at_ms <= now_ms THEN 0 ELSE 1 END, false,
            push.unique_key, push.concurrency_key, false, push.timeout_ms);
    -- Ready or scheduled, idle workers read the queue again (a delayed
    -- job moves when it next changes by time).
    PERFORM pg_notify('{channel}', '{job_ready}');
END
$push$;
COMMENT ON FUNCTION {s}.push IS 'leasehold: enqueue a job in the calling transaction (see the README, Transactional enqueue)';
";

/// The checks of `check_key` on the argument `{arg}`, named `{field}` (a
/// NULL passes).
const CHECK_KEY: &str = r"
    IF {arg} = '' THEN
        RAISE EXCEPTION 'invalid {field}: must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length({arg}) > {max_key} THEN
        RAISE EXCEPTION 'invalid {field}: % bytes is longer than {max_key}', octet_length({arg}) USING ERRCODE = '22023';
    END IF;
    IF {arg} ~ '[\x01-\x1f\x7f-\x9f]' THEN
        RAISE EXCEPTION 'invalid {field}: % contains a control character', quote_literal({arg}) USING ERRCODE = '22023';
    END IF;
";

/// The function's text for the schema `quoted` whose channel is `channel`.
pub(super) fn push_function(quoted: &str, channel: &str) -> String {
    let state = |s: JobState| 1u32 << s.code();
    debug_assert_eq!(state(JobState::Waiting), 64, "state bits of the function");
    let check_key = |arg: &str| {
        CHECK_KEY
            .replace("{arg}", &format!("push.{arg}"))
            .replace("{field}", arg)
    };
    PUSH_FUNCTION
        .replace("{check_queue}", &check_key("queue"))
        .replace("{check_concurrency_key}", &check_key("concurrency_key"))
        .replace("{s}", quoted)
        .replace("{channel}", channel)
        .replace("{job_ready}", &(Wake::JobReady as u8).to_string())
        .replace(
            "{default_attempts}",
            &JobSpec::default().max_attempts.to_string(),
        )
        .replace("{max_key}", &MAX_KEY_BYTES.to_string())
        .replace("{max_text}", &MAX_TEXT_BYTES.to_string())
        .replace("{max_payload}", &MAX_PAYLOAD_BYTES.to_string())
        .replace("{max_attempts}", &MAX_ATTEMPTS.to_string())
        .replace("{max_ttl}", &MAX_TTL_MS.to_string())
        .replace("{unique_read}", &UNIQUE_READ.to_string())
        .replace("{all_states}", &StateSet::ALL.bits().to_string())
        .replace("{live_states}", &StateSet::LIVE.bits().to_string())
        .replace(
            "{quarantine}",
            &QueuePolicy::default().quarantine_expiries.to_string(),
        )
}

/// The call, with every argument bound.
fn call_sql(quoted: &str) -> String {
    format!(
        "SELECT id, created FROM {quoted}.push($1::text, $2::bytea, $3::int4, $4::int8, $5::int4, \
         $6::text, $7::int8, $8::text, $9::text, $10::int8, $11::int8, $12::int4)"
    )
}

/// A spec's arguments to the function (checked by the rule's own checks
/// first, so that bad input is a typed error naming its field).
struct Args<'a> {
    queue: &'a str,
    payload: &'a [u8],
    priority: i32,
    delay_ms: i64,
    max_attempts: i32,
    unique_key: Option<&'a str>,
    unique_for_ms: Option<i64>,
    unique_states: Option<String>,
    key: Option<&'a str>,
    timeout_ms: Option<i64>,
    run_at_ms: Option<i64>,
    quarantine: i32,
}

impl<'a> Args<'a> {
    fn of(queue: &'a str, spec: &'a JobSpec, policy: &QueuePolicy) -> Result<Self> {
        crate::core::check_key(Field::Queue, queue)?;
        crate::core::job::check_spec(spec)?;
        if !spec.after.is_empty() {
            return Err(crate::Error::invalid(
                Field::After,
                "a push in the caller's transaction takes no dependencies (yet): push the job with Queue::push",
            ));
        }
        let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let delay_ms = i64::try_from(spec.delay_ms).map_err(|_| {
            crate::Error::invalid(Field::Delay, format!("{} ms is too long", spec.delay_ms))
        })?;
        Ok(Args {
            queue,
            payload: &spec.payload,
            priority: spec.priority,
            delay_ms,
            max_attempts: i32::try_from(spec.max_attempts).unwrap_or(i32::MAX),
            unique_key: spec.unique_key.as_deref(),
            unique_for_ms: spec.unique_for.map(ms),
            unique_states: spec.unique_states.map(|s| s.to_string()),
            key: spec.key.as_deref(),
            timeout_ms: spec.timeout.map(ms),
            run_at_ms: spec
                .run_at
                .map(|at| i64::try_from(at.ms()).unwrap_or(i64::MAX)),
            quarantine: i32::try_from(policy.quarantine_expiries).unwrap_or(i32::MAX),
        })
    }

    /// The arguments with their types: the call travels unprepared, in
    /// one round trip (a prepared one would take a second, per call, on a
    /// connection that is not ours).
    fn typed(&self) -> [(&(dyn ToSql + Sync), Type); 12] {
        [
            (&self.queue, Type::TEXT),
            (&self.payload, Type::BYTEA),
            (&self.priority, Type::INT4),
            (&self.delay_ms, Type::INT8),
            (&self.max_attempts, Type::INT4),
            (&self.unique_key, Type::TEXT),
            (&self.unique_for_ms, Type::INT8),
            (&self.unique_states, Type::TEXT),
            (&self.key, Type::TEXT),
            (&self.timeout_ms, Type::INT8),
            (&self.run_at_ms, Type::INT8),
            (&self.quarantine, Type::INT4),
        ]
    }
}

fn outcome(row: &postgres::Row) -> EnqueueOutcome {
    EnqueueOutcome {
        id: JobId(u64_of(row.get(0))),
        created: row.get(1),
    }
}

fn what(queue: &str) -> String {
    format!("pushing into queue {queue:?} in the caller's transaction")
}

/// Push `spec` into `queue` of the schema `quoted`, in `tx`; stale
/// candidates of a unique key are judged by `policy`.
pub(crate) fn push_in(
    tx: &mut postgres::Transaction<'_>,
    quoted: &str,
    queue: &str,
    spec: &JobSpec,
    policy: &QueuePolicy,
) -> Result<EnqueueOutcome> {
    let args = Args::of(queue, spec, policy)?;
    let row = tx
        .query_typed_one(&call_sql(quoted), &args.typed())
        .map_err(|e| push_err(queue, e))?;
    Ok(outcome(&row))
}

/// [`push_in`] on a `tokio-postgres` transaction.
#[cfg(feature = "tokio")]
pub(crate) async fn push_in_async(
    tx: &tokio_postgres::Transaction<'_>,
    quoted: &str,
    queue: &str,
    spec: &JobSpec,
    policy: &QueuePolicy,
) -> Result<EnqueueOutcome> {
    let sql = call_sql(quoted);
    let row = {
        let args = Args::of(queue, spec, policy)?;
        tx.query_typed_one(&sql, &args.typed()).await
    }
    .map_err(|e| push_err(queue, e))?;
    Ok(outcome(&row))
}

/// The function's error as the library's: a moved schema is
/// [`crate::Error::Moved`], as for every transaction of the library.
fn push_err(queue: &str, e: postgres::Error) -> crate::Error {
    const MOVED: &str = "this store was moved to ";
    let moved = e
        .as_db_error()
        .and_then(|db| db.message().strip_prefix(MOVED))
        .and_then(|rest| rest.split_once(" by `leasehold migrate`"));
    match moved {
        Some((to, _)) => crate::Error::Moved { to: to.to_owned() },
        None => pg_err(what(queue), e, Stage::Work),
    }
}
