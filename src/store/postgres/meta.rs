//! What every transaction of a PostgreSQL store reads with its BEGIN, and
//! what writes it: the migration marks ([`crate::store::Marks`]), the
//! failover fence (the token floor and the server timeline it was set
//! for), and the waits of a migration's cut-over. The schema's versions
//! are `migrate.rs`'s.

use super::early;
use super::error::{pg_err, Stage};
use super::migrate::{Target, ADVISORY_CLASS};
use super::pool::{Conn, MetaRead};
use super::PostgresStore;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::store::marks::MARKS_FRESH_MS;
use crate::store::FirstRead;
use crate::sync::Ordering;
use postgres::{Client, SimpleQueryMessage, SimpleQueryRow};

/// `txn_meta()`: [`meta_read`]'s lines. A function, so that its plan is
/// kept by the session: the same read inline in BEGIN's statement is
/// planned again by every transaction (measured: 0.16 ms against 0.08 ms
/// a statement, and 0.05 ms for the clock alone).
pub(super) fn meta_function(quoted: &str) -> String {
    format!(
        "CREATE OR REPLACE FUNCTION {quoted}.txn_meta() RETURNS text LANGUAGE plpgsql VOLATILE AS $meta$
DECLARE
    lines text;
BEGIN
    SELECT {read} INTO lines;
    RETURN lines;
END
$meta$;
-- The fence starts on the timeline the schema is made (or upgraded) on:
-- a schema found later without one is of unknown history (`fence`).
INSERT INTO {quoted}.leasehold_meta (name, value)
    SELECT '{TIMELINE}', {TIMELINE_READ} WHERE NOT pg_is_in_recovery()
    ON CONFLICT (name) DO NOTHING;",
        read = meta_read(quoted)
    )
}

/// What every transaction reads from `leasehold_meta` at BEGIN: the
/// migration marks ([`crate::store::marks`]) and the token floor (see
/// `failover`), as `name=value` lines.
#[derive(Debug, Default)]
pub(super) struct Meta {
    pub marks: crate::store::Marks,
    /// Every token granted is above it (the failover fence).
    pub token_floor: u64,
    /// The server timeline the floor was last set for.
    pub timeline: Option<String>,
}

/// The meta names of the failover fence.
pub(super) const TOKEN_FLOOR: &str = "token_floor";
pub(super) const TIMELINE: &str = "timeline";

impl Meta {
    /// The lines of [`meta_read`]'s column (none: no marks, no floor).
    pub fn parse(column: Option<&str>) -> Meta {
        let mut meta = Meta::default();
        for line in column.unwrap_or("").lines() {
            if let Some((name, value)) = line.split_once('=') {
                match name {
                    // Never written unparsable: the highest floor if so.
                    TOKEN_FLOOR => meta.token_floor = value.parse().unwrap_or(u64::MAX),
                    TIMELINE => meta.timeline = Some(value.to_owned()),
                    _ => meta.marks.set(name, value.to_owned()),
                }
            }
        }
        meta
    }
}

/// The subquery [`Meta::parse`] reads (one index probe per name).
pub(super) fn meta_read(quoted: &str) -> String {
    use crate::store::marks::{MOVED_TO, MOVING_FROM};
    format!(
        "(SELECT string_agg(name || '=' || value, chr(10)) FROM {quoted}.leasehold_meta
          WHERE name IN ('{MOVED_TO}', '{MOVING_FROM}', '{TOKEN_FLOOR}', '{TIMELINE}'))"
    )
}

/// The server's timeline (8 hex digits; a promotion starts a new one), or
/// NULL on a standby.
pub(super) const TIMELINE_READ: &str = "CASE WHEN pg_is_in_recovery() THEN NULL
     ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END";

/// The schema's migration marks.
pub(super) fn read_marks(client: &mut Client, to: &Target<'_>) -> Result<crate::store::Marks> {
    let row = client
        .query_one(&format!("SELECT {}", meta_read(to.quoted)), &[])
        .map_err(|e| to.fail(e))?;
    Ok(Meta::parse(row.get::<_, Option<&str>>(0)).marks)
}

/// Set the failover fence for the server's `timeline`: on a new timeline
/// (a promoted standby), or none recorded, the token floor moves to the
/// next generation
/// ([`crate::core::lease::promoted_floor`]), in one transaction; fences
/// take turns. Returns the floor.
///
/// No transaction grants under a floor set for another timeline: each
/// compares the timeline with the recorded one at BEGIN, and the two
/// change together here. (Fences racing read the same floor and write
/// the same next one; a later one finds the timeline recorded.)
pub(super) fn fence(client: &mut Client, to: &Target<'_>, timeline: &str) -> Result<u64> {
    let mut tx = client.transaction().map_err(|e| to.fail(e))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&(ADVISORY_CLASS + 2), &to.name],
    )
    .map_err(|e| to.fail(e))?;
    let row = tx
        .query_one(&format!("SELECT {}", meta_read(to.quoted)), &[])
        .map_err(|e| to.fail(e))?;
    let meta = Meta::parse(row.get::<_, Option<&str>>(0));
    let floor = match meta.timeline.as_deref() {
        Some(seen) if seen == timeline => return Ok(meta.token_floor),
        // Every schema records its timeline when it is made: one without
        // may have lost that record, and the grants after it, with a
        // primary. Either way, of unknown history: the next generation.
        None | Some(_) => crate::core::lease::promoted_floor(meta.token_floor),
    };
    let put = format!(
        "INSERT INTO {}.leasehold_meta (name, value) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        to.quoted
    );
    for (name, value) in [
        (TOKEN_FLOOR, floor.to_string()),
        (TIMELINE, timeline.to_owned()),
    ] {
        tx.execute(&put, &[&name, &value]).map_err(|e| to.fail(e))?;
    }
    tx.commit().map_err(|e| to.fail(e))?;
    Ok(floor)
}

/// Refuse a cut-over that could not see every transaction it must wait
/// for: sessions of other roles whose activity this role cannot read.
fn check_visible(client: &mut Client, to: &Target<'_>) -> Result<()> {
    // Sessions whose transactions this role cannot see would be waited
    // for by nobody: refuse, naming what would let it see them.
    let hidden: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
               AND backend_type = 'client backend' AND pid <> pg_backend_pid()
               AND query = '<insufficient privilege>'",
            &[],
        )
        .map_err(|e| to.fail(e))?
        .get(0);
    if hidden > 0 {
        return Err(Error::invalid(
            crate::error::Field::Store,
            format!(
                "{hidden} session(s) of other roles use this database and their transactions are \
                 hidden from this role, so the cut-over cannot wait for them: migrate as a \
                 superuser, a member of pg_read_all_stats, or the role they use (nothing \
                 was marked)"
            ),
        ));
    }
    Ok(())
}

/// Replace the schema's migration marks, in one transaction.
pub(super) fn write_marks(
    client: &mut Client,
    to: &Target<'_>,
    marks: &crate::store::Marks,
) -> Result<()> {
    let marking = *marks != crate::store::Marks::default();
    if marking {
        check_visible(client, to)?;
    }
    let mut tx = client.transaction().map_err(|e| to.fail(e))?;
    for (name, value) in marks.entries() {
        match value {
            Some(v) => tx.execute(
                &format!(
                    "INSERT INTO {}.leasehold_meta (name, value) VALUES ($1, $2)
                     ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    to.quoted
                ),
                &[&name, &v],
            ),
            None => tx.execute(
                &format!("DELETE FROM {}.leasehold_meta WHERE name = $1", to.quoted),
                &[&name],
            ),
        }
        .map_err(|e| to.fail(e))?;
    }
    tx.commit().map_err(|e| to.fail(e))?;
    if marking {
        wait_for_older(client, to)?;
    }
    Ok(())
}

/// How long a cut-over waits for the transactions that began before it.
const CUT_OVER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Wait until every transaction of the database that began before now
/// (after twice [`MARKS_FRESH`](crate::store::marks::MARKS_FRESH)) has
/// ended: the cut-over's mark is committed, and a transaction that begins
/// after that reads it at BEGIN, or in `push`, and is refused. Then what
/// the copy reads is final, at no cost to any other transaction. An
/// error names a transaction still open after [`CUT_OVER_WAIT`] (the
/// mark stays: run the migration again once it has ended).
fn wait_for_older(client: &mut Client, to: &Target<'_>) -> Result<()> {
    // Other sessions' transactions show to a superuser, to a member of
    // pg_read_all_stats, and to their own role.
    const OLDER: &str = "SELECT pid, xact_start::text, left(query, 80) FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()
          AND backend_type = 'client backend' AND xact_start IS NOT NULL AND xact_start <= $1
        ORDER BY xact_start LIMIT 1";
    // Every session's trust in its last reading of the marks runs out.
    crate::sync::sleep(crate::store::marks::MARKS_FRESH * 2);
    let since: std::time::SystemTime = client
        .query_one("SELECT clock_timestamp()", &[])
        .map_err(|e| to.fail(e))?
        .get(0);
    const POLL: std::time::Duration = std::time::Duration::from_millis(20);
    let mut waited = std::time::Duration::ZERO;
    loop {
        let older = client.query_opt(OLDER, &[&since]).map_err(|e| to.fail(e))?;
        let Some(row) = older else {
            return Ok(());
        };
        if waited >= CUT_OVER_WAIT {
            let (pid, at, query): (i32, String, String) = (row.get(0), row.get(1), row.get(2));
            return Err(Error::transient(
                to.context(),
                format!(
                    "the cut-over waited {}s for a transaction open since {at} (pid {pid}, {query:?}); \
                     end it and run the migration again",
                    CUT_OVER_WAIT.as_secs()
                ),
            ));
        }
        crate::sync::sleep(POLL);
        waited += POLL;
    }
}

/// The server's clock as a transaction reads it, in ms: the start of the
/// transaction (`now()`), the same in every statement of it, so a read
/// sent with BEGIN (a claim's scans, `early.rs`) runs at the very time
/// BEGIN's statement returns.
pub(super) const SERVER_CLOCK: &str = "floor(extract(epoch FROM now()) * 1000)::int8";

/// A store's BEGIN statements, rendered once at open for its options.
pub(super) struct BeginSql {
    /// The `PREPARE`s each session runs once (with its other statements):
    /// the clock and the timeline, with or without the marks and the fence.
    pub prepare: String,
    /// `[0]` for a session that keeps its last reading (the clock and the
    /// timeline), `[1]` reading the marks and the fence too.
    pub begin: [String; 2],
}

/// The SQL-level names of BEGIN's prepared statements.
const BEGIN_KEPT: &str = "leasehold_begin";
const BEGIN_META: &str = "leasehold_begin_meta";

/// The BEGIN statements of a store with these options; `meta` is the call
/// that reads the marks and the fence. Each is an `EXECUTE` of a statement
/// the session prepared: BEGIN's statement runs in every transaction, and
/// parsed and planned each time (its six function calls looked up by name)
/// it cost the server about 35 µs more a transaction (`pgbench`, one
/// session: 0.292 against 0.248 ms a transaction for `SELECT 1`; 0.281
/// prepared). `now()` is still read at each run (a stable function is
/// never folded into a plan that is kept).
pub(super) fn begin_sql(opts: &super::PostgresOptions, meta: &str) -> BeginSql {
    let clock = match opts.clock {
        Some(_) => "NULL::int8",
        None => SERVER_CLOCK,
    };
    let timeline = if opts.ignore_marks {
        "NULL"
    } else {
        TIMELINE_READ
    };
    BeginSql {
        prepare: format!(
            "PREPARE {BEGIN_KEPT} AS SELECT {clock}, NULL, {timeline};
             PREPARE {BEGIN_META} AS SELECT {clock}, {meta}, {timeline}"
        ),
        begin: [
            format!("BEGIN; EXECUTE {BEGIN_KEPT}"),
            format!("BEGIN; EXECUTE {BEGIN_META}"),
        ],
    }
}

/// What [`PostgresStore::begin`] found.
pub(super) struct Begun {
    /// The store time of the transaction.
    pub now_ms: u64,
    /// The server's clock as BEGIN read it (none with an injected clock):
    /// `now_ms` unless this process saw a later time.
    pub server_ms: Option<u64>,
    /// Every token granted is above it (the failover fence).
    pub floor: u64,
    /// The rows of the read sent with BEGIN, if one was.
    pub early: Option<Vec<SimpleQueryRow>>,
    /// BEGIN set [`BY_ID`](super::job_writes::BY_ID).
    pub by_id: bool,
}

impl PostgresStore {
    /// BEGIN and read the clock and the server's timeline in one round
    /// trip, with the schema's marks ([`crate::store::marks`]) and token
    /// floor when this session kept no reading of them or its reading is
    /// past half of [`MARKS_FRESH`] by this process's clock; a kept reading
    /// the server's clock finds older than [`MARKS_FRESH`] (or of another
    /// timeline) is read again in a round trip of its own. (store time,
    /// token floor).
    ///
    /// The failover fence: the floor was set for one server timeline. A
    /// session that finds another (a standby promoted since, whose history
    /// may lack the last grants of the old primary) sets the fence first
    /// ([`fence`]: the next generation of tokens), then begins
    /// again; so no grant on a promoted server precedes it. Every
    /// transaction compares the timeline (a proxy that keeps a client's
    /// session across a failover changes server under it); a session on a
    /// standby keeps nothing.
    ///
    /// The marks' freshness is judged by the server's clock, read in the
    /// transaction itself: a cut-over's barrier (`wait_for_older`) counts
    /// on it, whatever delayed the transaction on its way.
    ///
    /// With `first`, that read is sent in the same round trip, after the
    /// clock's statement (`early.rs`); its rows come back in
    /// [`Begun::early`].
    pub(super) fn begin(&self, conn: &mut Conn, first: Option<&FirstRead<'_>>) -> Result<Begun> {
        let shown = &self.pool.cfg.shown;
        let fail = |e: postgres::Error| {
            pg_err(
                format!("beginning a transaction on {shown}"),
                e,
                Stage::Work,
            )
        };
        // (An injected clock is not the server's: nothing is kept.)
        let injected = self.opts.clock.is_some();
        // A reading near the end of its freshness is read again with
        // BEGIN, in the same round trip: the server, judging it by its
        // own clock after the trip, could find it stale and read it alone.
        let local_now = self.local.now_ms();
        let mut kept = conn.meta_read.take().filter(|read| {
            !injected && local_now.saturating_sub(read.local_ms) < MARKS_FRESH_MS / 2
        });
        for fenced in [false, true] {
            let asked = kept.is_none();
            let begin = &self.begin_sql.begin[usize::from(asked)];
            let clock = (!injected).then_some(SERVER_CLOCK);
            let early = first.and_then(|first| early::render(first, clock));
            let setting = first.and_then(early::setting);
            let msgs = match (&early, setting) {
                (Some(read), _) => conn.client.simple_query(&format!("{begin};\n{read}")),
                (None, Some(set)) => conn.client.simple_query(&format!("{begin};\n{set}")),
                (None, None) => conn.client.simple_query(begin),
            }
            .map_err(fail)?;
            let (row, early_rows) = early::split(msgs);
            let row = row.as_ref();
            let server_now = row
                .and_then(|r| r.get(0))
                .and_then(|v| v.parse::<u64>().ok());
            let early = early.map(|_| early_rows);
            let now = match &self.opts.clock {
                Some(clock) => clock.now_ms(),
                None => server_now.ok_or_else(|| {
                    Error::store(
                        format!("reading the clock of {shown}"),
                        "now() returned no usable value",
                    )
                })?,
            };
            let now = now.max(self.high_water_ms.fetch_max(now, Ordering::SeqCst));
            let text = row.and_then(|r| r.get(1)).map(str::to_owned);
            let by_id = early.is_none() && setting.is_some();
            let begun = |floor| Begun {
                now_ms: now,
                server_ms: server_now.filter(|_| !injected),
                floor,
                early,
                by_id,
            };
            if self.opts.ignore_marks {
                return Ok(begun(Meta::parse(text.as_deref()).token_floor));
            }
            let Some(timeline) = row.and_then(|r| r.get(2)).map(str::to_owned) else {
                return Err(Error::transient(
                    format!("beginning a transaction on {shown}"),
                    "the server is a standby (in recovery): no writes until it is promoted \
                     (list every host, with target_session_attrs=read-write)",
                ));
            };
            if let Some(read) = kept.take() {
                let fresh =
                    server_now.is_some_and(|n| n.saturating_sub(read.at_ms) < MARKS_FRESH_MS);
                if fresh && read.timeline == timeline {
                    let floor = read.floor;
                    conn.meta_read = Some(read);
                    return Ok(begun(floor));
                }
            }
            // Read now (a kept reading ran out): in this transaction.
            let text = match asked {
                true => text,
                false => conn
                    .client
                    .simple_query(&format!("SELECT {}", self.meta_read))
                    .map_err(fail)?
                    .iter()
                    .find_map(|m| match m {
                        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                        _ => None,
                    }),
            };
            let meta = Meta::parse(text.as_deref());
            meta.marks.check(shown)?;
            if meta.timeline.as_deref() != Some(timeline.as_str()) {
                if fenced {
                    break;
                }
                let _ = conn.client.batch_execute("ROLLBACK");
                fence(&mut conn.client, &self.target(), &timeline)?;
                continue;
            }
            if let Some(at_ms) = server_now {
                conn.meta_read = Some(MetaRead {
                    at_ms,
                    local_ms: local_now,
                    floor: meta.token_floor,
                    timeline,
                });
            }
            return Ok(begun(meta.token_floor));
        }
        Err(Error::transient(
            format!("beginning a transaction on {shown}"),
            "the server's timeline changed again while its fence was set",
        ))
    }
}
