//! [`PgTxn`]: one transaction on one pooled connection. Rows it reads are
//! locked and cached (read once); its writes wait for the commit (or for a
//! query that could see them) and travel as literal SQL in one round trip.
//! Here the transaction and its lease half ([`Txn`]); its job half
//! ([`JobTxn`]) is in `jobs.rs`.

use super::error::{pg_err, Stage};
use super::job_writes::{render_job_writes, JobWrite};
use super::listing;
use super::pool::Conn;
use super::rows::{job_from_row, lease_from_row, queue_config, Cells};
use super::sql::Sql;
use super::statements::{Lazy, Statements, JOB_COLUMN_COUNT};
use crate::core::{JobId, JobRecord, JobState, JobTxn, Journal, LeaseRecord, QueueConfig, Txn};
use crate::error::Field;
use crate::error::Result;
use crate::store::{LeaseCache, Wake};
use postgres::types::ToSql;
use postgres::{Row, SimpleQueryRow};
use std::collections::{HashMap, HashSet};
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
    /// A lease's row (none: no row), locked, read with BEGIN
    /// ([`crate::FirstRead::Lease`]).
    pub(super) early_lease: Option<(String, Option<LeaseRecord>)>,
    /// A claim's scans, read with BEGIN ([`crate::FirstRead::Claim`]).
    pub(super) early_claim: Option<EarlyClaim>,
    /// A read sent with BEGIN served this transaction.
    pub(super) early_used: bool,
    /// A claim's scans skipped rows others held locked
    /// ([`crate::core::JobTxn::skipped_locked`]).
    pub(super) skipped_locked: bool,
    /// BEGIN set [`BY_ID`](super::job_writes::BY_ID): a batch is read by the
    /// statement kept for it (`jobs_get_by_id`).
    pub(super) by_id: bool,
    /// Job ids taken from the sequence and not used yet, largest first.
    /// Each round trip for ids takes twice as many as the last (up to
    /// [`MAX_ID_BLOCK`]): a transaction pushing one job takes one, one
    /// pushing n jobs makes about log2(n) round trips for them, and at
    /// most as many ids as it used are left unused (a gap in the ids,
    /// which are unique and increasing, not dense).
    pub(super) ids: Vec<u64>,
    /// How many ids the next round trip takes.
    pub(super) id_block: u32,
    /// The (queue, unique key) advisory locks taken, held until the end.
    pub(super) unique_locked: HashSet<(String, String)>,
}

/// Most job ids taken from the sequence in one round trip.
pub(super) const MAX_ID_BLOCK: u32 = 1024;

/// A claim's scans read with BEGIN, at the server's clock then.
pub(super) struct EarlyClaim {
    pub(super) queue: String,
    pub(super) ready: usize,
    /// The time they ran at (BEGIN's reading of the server's clock).
    pub(super) at_ms: u64,
    pub(super) rows: Vec<SimpleQueryRow>,
}

impl EarlyClaim {
    /// These rows are what `JobTxn::pending` would read with these
    /// arguments.
    pub(super) fn serves(&self, queue: &str, now_ms: u64, chunk: usize, ready: usize) -> bool {
        self.queue == queue
            && self.at_ms == now_ms
            && self.ready == ready
            && chunk == crate::core::job::CHUNK
    }
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
            early_lease: None,
            early_claim: None,
            early_used: false,
            skipped_locked: false,
            by_id: false,
            ids: Vec::new(),
            id_block: 1,
            unique_locked: HashSet::new(),
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
        let Conn { client, st, .. } = &mut *self.conn;
        let row = st
            .lease_get
            .get(client)
            .and_then(|stmt| client.query_opt(stmt, &[&key]))
            .map_err(|e| pg_err(ctx_key("reading", key), e, Stage::Work))?;
        let Some(row) = row else { return Ok(None) };
        lease_from_row(&row, 0).map(Some)
    }

    /// Cache rows a locking query returned; their ids are appended to `out`.
    pub(super) fn absorb(&mut self, rows: &[impl Cells], out: &mut Vec<JobId>) -> Result<()> {
        self.absorb_with(rows, out, false)
    }

    /// [`Self::absorb`]; with `configs`, each row also carries its queue's
    /// settings after the job's columns, cached too.
    pub(super) fn absorb_with(
        &mut self,
        rows: &[impl Cells],
        out: &mut Vec<JobId>,
        configs: bool,
    ) -> Result<()> {
        for row in rows {
            let job = job_from_row(row)?;
            if configs && !self.configs.contains_key(&*job.queue) {
                let config = queue_config(row, JOB_COLUMN_COUNT)?;
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
        stmt: fn(&Statements) -> &Lazy,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let Conn { client, st, .. } = &mut *self.conn;
        stmt(st)
            .get(client)
            .and_then(|stmt| client.query(stmt, params))
            .map_err(|e| pg_err(what.to_owned(), e, Stage::Work))
    }

    /// [`PgTxn::query`] for a statement that returns no rows: how many
    /// rows it changed.
    pub(super) fn execute(
        &mut self,
        what: &str,
        stmt: fn(&Statements) -> &Lazy,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64> {
        let Conn { client, st, .. } = &mut *self.conn;
        stmt(st)
            .get(client)
            .and_then(|stmt| client.execute(stmt, params))
            .map_err(|e| pg_err(what.to_owned(), e, Stage::Work))
    }
}

impl Txn for PgTxn<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn lease_mut(&mut self, key: &str, create: bool) -> Result<Option<&mut LeaseRecord>> {
        if !self.leases.contains(key) {
            let loaded = match self.early_lease.take() {
                Some((early, loaded)) if early == key => {
                    self.early_used = true;
                    loaded
                }
                _ => self.load_lease(key)?,
            };
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
