//! [`PgTxn`]: one transaction on one pooled connection. Rows it reads are
//! locked and cached (read once); its writes wait for the commit (or for a
//! query that could see them) and travel as literal SQL in one round trip.
//! Here the transaction and its lease half ([`Txn`]); its job half
//! ([`JobTxn`]) is in `jobs.rs`.

use super::error::{pg_err, Stage};
use super::listing;
use super::pool::Conn;
use super::sql::{render_job_writes, JobWrite, Sql};
use super::statements::{queue_config, Statements, JOB_COLUMN_COUNT};
use crate::core::{
    Claim, JobId, JobRecord, JobState, JobTxn, Journal, LeaseRecord, QueueConfig, Txn,
};
use crate::error::Field;
use crate::error::{Error, Result};
use crate::store::{after_of, holder_from, progress_of, u64_of, LeaseCache, Wake};
use postgres::types::ToSql;
use postgres::{Row, Statement};
use std::collections::HashMap;
use std::sync::Arc;

/// A job row locked (or created) in this transaction.
pub(super) struct CachedJob {
    pub(super) record: JobRecord,
    /// The row exists in the database (else it is inserted at flush).
    pub(super) in_db: bool,
    /// State as last written to the database (or read).
    pub(super) db_state: Option<JobState>,
}

/// One transaction of a [`super::PostgresStore`]: the rows it locked, its
/// pending writes and the wake-ups it causes.
pub(super) struct PgTxn<'c> {
    pub(super) conn: &'c mut Conn,
    /// The quoted schema name.
    pub(super) schema: &'c str,
    pub(super) now_ms: u64,
    /// Every token granted is above it (the failover fence).
    pub(super) token_floor: u64,
    pub(super) leases: LeaseCache,
    pub(super) jobs: HashMap<JobId, CachedJob>,
    /// Jobs written since the last flush, in order.
    pub(super) pending: Vec<JobId>,
    pub(super) deleted: Vec<JobId>,
    /// Queues' settings read in this transaction (with their jobs, or
    /// alone), so the end of an attempt reads them without a round trip.
    pub(super) configs: HashMap<Arc<str>, QueueConfig>,
    /// The wake-ups and events this transaction causes.
    pub(super) journal: Journal,
}

/// A job from a row of [`COLUMNS`](super::statements::COLUMNS); a state code no state has is an error
/// naming the row (never guessed).
pub(super) fn job_from_row(r: &Row) -> Result<JobRecord> {
    let (mut job, code) = decode_job(r).map_err(|e| pg_err("decoding a job", e, Stage::Work))?;
    job.state = JobState::from_code(i64::from(code)).ok_or_else(|| {
        Error::store(
            format!("reading job {}", job.id),
            format!("state code {code} is unknown to this build (written by a newer leasehold?)"),
        )
    })?;
    Ok(job)
}

/// The row's fields, and its state code (the state is set by the caller).
fn decode_job(r: &Row) -> std::result::Result<(JobRecord, i16), postgres::Error> {
    let state_code: i16 = r.try_get(10)?;
    let state = JobState::Ready;
    let claim = match (
        r.try_get::<_, Option<Vec<u8>>>(11)?,
        r.try_get::<_, Option<i64>>(12)?,
        r.try_get::<_, Option<i64>>(13)?,
    ) {
        (Some(h), Some(t), Some(u)) => Some(Claim {
            holder: holder_from(&h),
            token: u64_of(t),
            lease_until_ms: u64_of(u),
            deadline_ms: r.try_get::<_, Option<i64>>(22)?.map(u64_of),
        }),
        _ => None,
    };
    let u32_of = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
    let payload: Vec<u8> = r.try_get(2)?;
    let job = JobRecord {
        id: JobId(u64_of(r.try_get(0)?)),
        queue: Arc::from(r.try_get::<_, &str>(1)?),
        payload: Arc::from(payload),
        priority: r.try_get(3)?,
        run_at_ms: u64_of(r.try_get(4)?),
        created_at_ms: u64_of(r.try_get(5)?),
        max_attempts: u32_of(r.try_get(6)?),
        attempts: u32_of(r.try_get(7)?),
        expiries: u32_of(r.try_get(8)?),
        last_token: u64_of(r.try_get(9)?),
        state,
        claim,
        cancel_requested: r.try_get(14)?,
        last_error: r.try_get::<_, Option<&str>>(15)?.map(Arc::from),
        unique_key: r.try_get::<_, Option<&str>>(16)?.map(Arc::from),
        finished_at_ms: r.try_get::<_, Option<i64>>(17)?.map(u64_of),
        result: r.try_get::<_, Option<Vec<u8>>>(18)?.map(Arc::from),
        key: r.try_get::<_, Option<&str>>(19)?.map(Arc::from),
        parked: r.try_get(20)?,
        timeout_ms: r.try_get::<_, Option<i64>>(21)?.map(u64_of),
        progress: progress_of(
            r.try_get::<_, Option<i32>>(23)?.map(i64::from),
            r.try_get(24)?,
        ),
        after: after_of(r.try_get::<_, Option<&str>>(25)?),
        after_any: r.try_get(26)?,
        waiting_on: u32_of(r.try_get::<_, i32>(27)?.into()),
        has_children: r.try_get(28)?,
    };
    Ok((job, state_code))
}

fn ctx_key(what: &str, key: &str) -> String {
    format!("{what} lease {key:?}")
}

impl<'c> PgTxn<'c> {
    /// A transaction on `conn`, begun at `now_ms`.
    pub fn new(conn: &'c mut Conn, schema: &'c str, now_ms: u64) -> Self {
        PgTxn {
            conn,
            schema,
            now_ms,
            token_floor: 0,
            leases: LeaseCache::default(),
            jobs: HashMap::new(),
            pending: Vec::new(),
            deleted: Vec::new(),
            configs: HashMap::new(),
            journal: Journal::default(),
        }
    }

    /// Render the pending job writes into `sql`; returns whether there
    /// were any.
    pub(super) fn render_jobs(&mut self, sql: &mut Sql, schema: &str) -> Result<bool> {
        let writes: Vec<JobWrite<'_>> = self
            .pending
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .map(|c| JobWrite {
                record: &c.record,
                in_db: c.in_db,
                db_state: c.db_state,
            })
            .collect();
        render_job_writes(sql, schema, &self.deleted, &writes)
    }

    /// Mark every pending job write as done.
    pub(super) fn jobs_flushed(&mut self) {
        self.deleted.clear();
        for id in std::mem::take(&mut self.pending) {
            if let Some(c) = self.jobs.get_mut(&id) {
                c.in_db = true;
                c.db_state = Some(c.record.state);
            }
        }
    }

    /// Send the pending job writes before a query that could see them.
    pub(super) fn flush_jobs(&mut self) -> Result<()> {
        let mut sql = Sql(String::new());
        let schema = self.schema;
        if !self.render_jobs(&mut sql, schema)? {
            return Ok(());
        }
        self.conn
            .client
            .batch_execute(&sql.0)
            .map_err(|e| pg_err("writing jobs", e, Stage::Work))?;
        self.jobs_flushed();
        Ok(())
    }

    /// Everything this transaction changed, the notifications and COMMIT,
    /// as one script.
    pub fn commit_script(&mut self, channel: &str) -> Result<String> {
        let mut sql = Sql(String::with_capacity(512));
        let schema = self.schema;
        self.render_jobs(&mut sql, schema)?;
        for c in self.leases.changed() {
            if c.original.is_some() {
                sql.raw("UPDATE ")
                    .raw(schema)
                    .raw(".leases SET (last_token, tokens, holders, labels, expires, lease_limit) = (")
                    .lease(&c.record)?
                    .raw(") WHERE key = ")
                    .text(Field::Key, &c.key)?
                    .raw(";\n");
            } else {
                sql.raw("INSERT INTO ")
                    .raw(schema)
                    .raw(".leases (key, last_token, tokens, holders, labels, expires, lease_limit) VALUES (")
                    .text(Field::Key, &c.key)?
                    .raw(", ")
                    .lease(&c.record)?
                    .raw(");\n");
            }
        }
        for wake in [Wake::LeaseFreed, Wake::JobReady] {
            if self.journal.woke()[wake.index()] {
                sql.raw("SELECT pg_notify(")
                    .text(Field::Channel, channel)?
                    .raw(&format!(", '{}');\n", wake as u8));
            }
        }
        sql.raw("COMMIT");
        Ok(sql.0)
    }

    pub(super) fn load_lease(&mut self, key: &str) -> Result<Option<LeaseRecord>> {
        let row = self
            .conn
            .client
            .query_opt(&self.conn.st.lease_get, &[&key])
            .map_err(|e| pg_err(ctx_key("reading", key), e, Stage::Work))?;
        let Some(row) = row else { return Ok(None) };
        listing::lease_from_row(&row, 0)
            .map(Some)
            .map_err(|e| pg_err(ctx_key("decoding", key), e, Stage::Work))
    }

    /// Cache rows a locking query returned; their ids are appended to `out`.
    pub(super) fn absorb(&mut self, rows: &[Row], out: &mut Vec<JobId>) -> Result<()> {
        self.absorb_with(rows, out, false)
    }

    /// [`Self::absorb`]; with `configs`, each row also carries its queue's
    /// settings after the job's columns, cached too.
    pub(super) fn absorb_with(
        &mut self,
        rows: &[Row],
        out: &mut Vec<JobId>,
        configs: bool,
    ) -> Result<()> {
        for row in rows {
            let job = job_from_row(row)?;
            if configs && !self.configs.contains_key(&*job.queue) {
                let config = queue_config(row, JOB_COLUMN_COUNT)
                    .map_err(|e| pg_err("decoding a queue's settings", e, Stage::Work))?;
                self.configs.insert(job.queue.clone(), config);
            }
            out.push(job.id);
            let state = job.state;
            self.jobs.insert(
                job.id,
                CachedJob {
                    record: job,
                    in_db: true,
                    db_state: Some(state),
                },
            );
        }
        Ok(())
    }

    pub(super) fn query(
        &mut self,
        what: &str,
        stmt: fn(&Statements) -> &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let Conn { client, st, .. } = &mut *self.conn;
        client
            .query(stmt(st), params)
            .map_err(|e| pg_err(what.to_owned(), e, Stage::Work))
    }
}

impl Txn for PgTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn lease_mut(&mut self, key: &str, create: bool) -> Result<Option<&mut LeaseRecord>> {
        if !self.leases.contains(key) {
            let loaded = self.load_lease(key)?;
            if !self.leases.add(key, loaded, create) {
                return Ok(None);
            }
        }
        Ok(self.leases.get_mut(key))
    }

    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }

    fn jobs(&mut self) -> Result<&mut dyn JobTxn> {
        Ok(self)
    }

    fn token_floor(&self) -> u64 {
        self.token_floor
    }

    /// Committed rows, unlocked; a record this transaction changed is
    /// shown as changed.
    fn lease_scan(
        &mut self,
        after: &str,
        limit: usize,
        out: &mut Vec<(String, LeaseRecord)>,
    ) -> Result<()> {
        let rows = listing::lease_scan(&mut self.conn.client, self.schema, after, limit)?;
        for (key, record) in rows {
            let record = match self.leases.get_mut(&key) {
                Some(mine) => mine.clone(),
                None => record,
            };
            out.push((key, record));
        }
        Ok(())
    }

    fn export_names(
        &mut self,
        what: crate::core::Exported<'_>,
        after: &str,
        limit: usize,
        out: &mut Vec<String>,
    ) -> Result<()> {
        listing::export_names(&mut self.conn.client, self.schema, what, after, limit, out)
    }
}
