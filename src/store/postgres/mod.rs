//! The PostgreSQL store: leases and jobs shared by many machines.
//!
//! # Design
//! - **Time is the database's.** Each transaction reads the server's clock
//!   once, in the same round trip as its `BEGIN` (`now()`, the instant the
//!   transaction began), and the rules compare and
//!   compute every expiry with that instant, so machines whose clocks
//!   disagree still agree on who holds what. A handle never hands out a
//!   time below one it handed out before. (A holder's own validity deadline
//!   still runs on its local monotonic clock, in the client layer.) The
//!   server's clock should be slewed, not stepped: a step forward ends
//!   leases early on the store's clock (holders still stop at their local
//!   deadline and stale tokens are fenced), a step back lengthens them.
//! - **Row locks serialize the rules.** A lease row is read `FOR UPDATE`;
//!   a key nobody has held yet is inserted at commit, and a concurrent
//!   first grant of the same key fails that insert (unique violation,
//!   retried) instead of granting twice. Job scans take their rows
//!   `FOR UPDATE SKIP LOCKED`, so concurrent claimers never wait on each
//!   other and never see the same job; a single job is read `FOR UPDATE`,
//!   and the jobs of a batch (a heartbeat round, a settle) all at once,
//!   `WHERE id = ANY(...) ORDER BY id FOR UPDATE` (locked in id order, so
//!   two batches never deadlock). Transactions run at READ COMMITTED:
//!   every decision is made on rows the transaction has locked, so it
//!   cannot be based on a stale read.
//! - **A fixed number of round trips, whatever the batch.** Reads are
//!   cached in the transaction (a row is read once). A queue's expired,
//!   due and ready scans travel together ([`JobTxn::pending`](crate::core::JobTxn::pending)). Writes wait
//!   for the commit and travel with it: one script ending in `COMMIT`, one
//!   round trip, with one statement per kind of write (a DELETE, an INSERT,
//!   and the updates as one `EXECUTE` of an `UPDATE ... FROM unnest(...)`
//!   each session prepared, its arrays written as literals). So a claim of
//!   64 jobs is three round trips (BEGIN with the clock; the scans; the
//!   writes with COMMIT), and so is a heartbeat round or a settle (BEGIN;
//!   the jobs' rows; the writes with COMMIT); two where the caller says
//!   what it reads first and that is a few rows ([`FirstRead`]: a lease's
//!   acquire, renewal and release, a job's completion or renewal, a claim
//!   of up to four jobs, as the client does them), since the read then
//!   travels with BEGIN (`early.rs`; a claim's scans run at BEGIN's
//!   time). The one exception to one UPDATE: a row that takes a unique
//!   key back (a retried job) while another gives it up (a job becoming
//!   terminal) is written after it, in a second statement, since the
//!   unique index is checked row by row. A pending write is flushed before any query that
//!   could see it. Literals are rendered with `standard_conforming_strings`
//!   on: text quoted with its quotes doubled, bytes in hex, numbers by
//!   Rust.
//! - **Indexes match the scans**: one partial index per job state, ordered
//!   as the scan orders, so claim cost does not grow with finished jobs.
//!   A batch of jobs is looked up by id through the primary key, one by
//!   one, whatever the planner's statistics say: the statements that take
//!   a batch of ids (a settle's or renewal's read, the many-row UPDATE)
//!   run only after settings that leave the planner neither a scan of the
//!   table nor a hash join to choose (`sql.rs`, `BY_ID`), since a plan
//!   made while the table was small scanned all of it for every batch
//!   once it had grown.
//! - **Wake-ups**: a transaction that frees a lease slot or changes a
//!   queue's plan for its idle workers (a job made ready or scheduled:
//!   [`Wake::JobReady`]) sends `pg_notify` on the schema's channel; a
//!   listener thread per store handle (started on the first wait, with its
//!   own connection) wakes blocked acquirers and idle workers. A claim
//!   does not notify (notifying commits take turns on the server): an
//!   empty claim whose ready scan skipped rows another transaction held
//!   says so, and its worker looks again soon
//!   ([`crate::core::JobTxn::skipped_locked`]). Idle workers keep a
//!   backstop claim (`idle_poll`).
//! - **Errors**: serialization failures, deadlocks, lock timeouts, unique
//!   violations (two first grants of one key) and lost connections are
//!   transient; the client retries them with jittered backoff up to its
//!   deadline. If the session is lost while the COMMIT script is in flight,
//!   the error is ambiguous: the caller cannot know whether it happened (a
//!   claim that did is recovered when its lease expires). An error the
//!   server reports on a live session means nothing was committed. A broken
//!   connection is discarded and replaced on next use, and so is one that
//!   lost the statements it prepared (SQLSTATE 26000, after
//!   a `DISCARD ALL` or `DEALLOCATE ALL`: transient, nothing ran).
//! - **Sessions** set `lock_timeout` (a wait on a row lock ends as a
//!   transient error) and `idle_in_transaction_session_timeout` (a process
//!   paused in the middle of a transaction loses its session and its locks).
//! - **Connections**: a small pool per store handle (threads sharing a
//!   handle each get a connection), over TLS when the URL asks
//!   (`sslmode`, `sslrootcert`: see the `tls` module; rustls, no OpenSSL). Used in a forked child the store returns
//!   [`Error::Forked`]; dropped there, it leaks its connections instead of
//!   closing the parent's sockets.
//! - **Versioned migrations** in their own schema (default `leasehold`),
//!   applied under a transaction-scoped advisory lock, so many processes may
//!   start at once. A schema from a newer version, or a schema that holds
//!   other tables and no leasehold marker, is refused and left untouched.

mod early;
mod error;
mod job_writes;
mod jobs;
mod listen;
mod listing;
mod meta;
mod migrate;
mod options;
mod pool;
mod push_in;
mod rows;
mod sql;
mod statements;
mod tls;
mod txn;

pub use migrate::SCHEMA_VERSION;
pub use options::PostgresOptions;
pub(crate) use push_in::push_in;
#[cfg(feature = "tokio")]
pub(crate) use push_in::push_in_async;

use crate::core::Txn;
use crate::error::Field;
use crate::error::{Error, Result};
use crate::fork::ForkGuard;
use crate::store::{FirstRead, Store, Wake};
use crate::sync::{AtomicU64, Ordering};
use error::{pg_err, Stage};
use listen::Listener;
use options::{check_schema_name, describe_config, ms_setting, split_url};
use pool::{Checkout, Conn, Connector, Pool, PoolConfig};
use postgres::Config;
use std::sync::Arc;
use std::time::Duration;
use txn::{EarlyClaim, PgTxn};

/// The PostgreSQL [`Store`].
pub struct PostgresStore {
    /// The connections (and how to open one).
    pool: Pool,
    /// The notification channel of the schema.
    channel: String,
    /// The call reading the marks and the fence at BEGIN.
    meta_read: String,
    /// BEGIN's statements (`meta::begin_sql`; the pool prepares them).
    begin_sql: Arc<meta::BeginSql>,
    opts: PostgresOptions,
    fork: ForkGuard,
    /// Highest store time this handle handed out.
    high_water_ms: AtomicU64,
    /// This process's monotonic clock: how old a session's reading of the
    /// marks is, judged before BEGIN (`meta.rs`).
    local: crate::clock::MonotonicClock,
    /// Transactions whose BEGIN carried their first read (`early.rs`).
    early_reads: AtomicU64,
    listener: Arc<Listener>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.pool.cfg.shown)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connect to `url` (`postgres://user@host:port/db?schema=NAME&pool_size=N`,
    /// `sslmode=disable|prefer|require|verify-ca|verify-full` and
    /// `sslrootcert=PATH` for TLS, plus any parameter the driver knows) with
    /// default options, creating or migrating the schema.
    pub fn open(url: &str) -> Result<Self> {
        Self::open_with(url, PostgresOptions::default())
    }

    /// [`PostgresStore::open`] with options.
    ///
    /// The driver blocks on a runtime of its own, which panics on a thread
    /// that drives a tokio runtime: opened inside async code, the store
    /// connects on a thread of its own (and is then used through
    /// [`crate::tokio`], which keeps its calls off the async threads).
    pub fn open_with(url: &str, opts: PostgresOptions) -> Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Self::open_here(url, opts);
        }
        std::thread::scope(|s| match s.spawn(|| Self::open_here(url, opts)).join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    }

    fn open_here(url: &str, mut opts: PostgresOptions) -> Result<Self> {
        let (driver_url, tls_params) = split_url(url, &mut opts)?;
        check_schema_name(&opts.schema)?;
        if opts.max_connections == 0 {
            return Err(Error::invalid(Field::MaxConnections, "must be at least 1"));
        }
        let mut config: Config = driver_url.parse().map_err(|e: postgres::Error| {
            Error::invalid(Field::Store, format!("not a PostgreSQL URL: {e}"))
        })?;
        if config.get_application_name().is_none() {
            config.application_name("leasehold");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        let tls = tls::configure(&tls_params, &mut config)?;
        let schema = format!("\"{}\"", opts.schema);
        let begin_sql = Arc::new(meta::begin_sql(&opts, &format!("{schema}.txn_meta()")));
        let pool = Pool::new(PoolConfig {
            begin_sql: begin_sql.clone(),
            shown: describe_config(&config, &opts.schema, &tls_params),
            connector: Connector { config, tls },
            session_setup: format!(
                "SET lock_timeout = '{}'; SET idle_in_transaction_session_timeout = '{}';
                 SET standard_conforming_strings = on",
                ms_setting(opts.lock_timeout),
                ms_setting(opts.idle_in_transaction_timeout)
            ),
            schema,
            max_connections: opts.max_connections,
            wait: opts.pool_wait,
        });
        let store = PostgresStore {
            channel: migrate::channel(&opts.schema),
            begin_sql,
            meta_read: format!("{}.txn_meta()", pool.cfg.schema),
            pool,
            opts,
            fork: ForkGuard::new(),
            high_water_ms: AtomicU64::new(0),
            local: crate::clock::MonotonicClock::new(),
            early_reads: AtomicU64::new(0),
            listener: Arc::new(Listener::default()),
        };
        let mut client = store.pool.connect_raw()?;
        let target = migrate::Target {
            name: &store.opts.schema,
            quoted: &store.pool.cfg.schema,
            shown: &store.pool.cfg.shown,
        };
        migrate::migrate(&mut client, &target)?;
        if !store.opts.ignore_marks {
            if let Some(to) = meta::read_marks(&mut client, &target)?.moved_to {
                return Err(Error::Moved { to });
            }
        }
        listing::ensure_indexes(&mut client, target.quoted, target.shown)?;
        store.pool.adopt(store.pool.prepare(client)?);
        Ok(store)
    }

    /// The schema, as migrations name it.
    fn target(&self) -> migrate::Target<'_> {
        migrate::Target {
            name: &self.opts.schema,
            quoted: &self.pool.cfg.schema,
            shown: &self.pool.cfg.shown,
        }
    }

    /// The schema's name (unquoted).
    pub fn schema(&self) -> &str {
        &self.opts.schema
    }

    /// How many transactions of this handle sent their first read with
    /// their BEGIN ([`FirstRead`]), a round trip saved when the hint was
    /// right. For tests and benchmarks.
    #[doc(hidden)]
    pub fn early_reads(&self) -> u64 {
        self.early_reads.load(Ordering::Relaxed)
    }

    fn run(
        &self,
        conn: &mut Conn,
        first: Option<&FirstRead<'_>>,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>,
    ) -> Result<()> {
        let begun = self.begin(conn, first).inspect_err(|_| {
            // Never hand a session with an open (aborted) transaction back
            // to the pool.
            let _ = conn.client.batch_execute("ROLLBACK");
        })?;
        let mut tx = PgTxn::new(&mut *conn, &self.pool.cfg.schema, begun.now_ms);
        tx.token_floor = begun.floor;
        tx.by_id = begun.by_id;
        let server_ms = begun.server_ms;
        let early = match (first, begun.early) {
            (Some(FirstRead::Lease(key)), Some(rows)) => {
                let loaded = rows.first().map(|row| rows::lease_from_row(row, 0));
                loaded.transpose().map(|loaded| {
                    tx.early_lease = Some(((*key).to_owned(), loaded));
                })
            }
            (Some(FirstRead::Jobs(_)), Some(rows)) => {
                tx.early_used = true;
                tx.absorb_with(&rows, &mut Vec::new(), true)
            }
            (Some(&FirstRead::Claim { queue, ready }), Some(rows)) => {
                tx.early_claim = server_ms.map(|at_ms| EarlyClaim {
                    queue: queue.to_owned(),
                    ready,
                    at_ms,
                    rows,
                });
                Ok(())
            }
            _ => Ok(()),
        };
        let script = early
            .and_then(|()| f(&mut tx))
            .and_then(|()| tx.commit_script(&self.channel));
        if tx.early_used {
            self.early_reads.fetch_add(1, Ordering::Relaxed);
        }
        match script {
            // The writes and COMMIT in one round trip.
            Ok(script) => conn.client.batch_execute(&script).map_err(|e| {
                let e = pg_err(
                    format!("committing to {}", self.pool.cfg.shown),
                    e,
                    Stage::Commit,
                );
                if !e.is_ambiguous() {
                    let _ = conn.client.batch_execute("ROLLBACK");
                }
                e
            }),
            Err(e) => {
                let _ = conn.client.batch_execute("ROLLBACK");
                Err(e)
            }
        }
    }

    /// Check out a session and run `f` on it, sending `first` with BEGIN.
    fn transact_first(
        &self,
        first: Option<&FirstRead<'_>>,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>,
    ) -> Result<()> {
        self.fork.check()?;
        let mut out = Checkout {
            pool: &self.pool,
            conn: Some(self.pool.checkout()?),
        };
        let result = match out.conn.as_mut() {
            Some(conn) => self.run(conn, first, f),
            None => Err(Error::store("running a transaction", "no connection")),
        };
        if let Some(mut conn) = out.conn.take() {
            // After a store error, keep the connection only if it still
            // works, with the statements it prepared.
            let broken = match &result {
                Err(e @ Error::Store { .. }) => {
                    error::statements_lost(e)
                        || conn.client.is_valid(Duration::from_secs(1)).is_err()
                }
                _ => false,
            };
            self.pool.checkin(conn, broken);
        }
        result
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        let listening = self.listener.stop();
        let mut idle = self.pool.take_idle();
        if self.fork.is_origin_strict() {
            // A note that wakes the listener to see its stop now rather
            // than at the end of its wait (other processes' listeners
            // ignore it); without an idle session to send it on, the wait
            // ends it.
            let note = listening.then(|| format!("NOTIFY \"{}\", 'stop'", self.channel));
            // Closing a session blocks on the driver's own runtime, which
            // panics on a thread that drives a tokio runtime (a store
            // dropped inside async code): close them on a thread of their
            // own.
            if !idle.is_empty() {
                let closing = std::thread::Builder::new()
                    .name("leasehold-pg-close".to_owned())
                    .spawn(move || {
                        if let (Some(note), Some(conn)) = (note, idle.first_mut()) {
                            let _ = conn.client.batch_execute(&note);
                        }
                        drop(idle)
                    });
                drop(closing);
            }
        } else {
            // A forked child must not close (or talk on) its parent's sockets.
            std::mem::forget(idle);
        }
    }
}

impl Store for PostgresStore {
    fn transact(&self, f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>) -> Result<()> {
        self.transact_first(None, f)
    }

    /// The read goes with `BEGIN` (`early.rs`): one round trip fewer.
    fn transact_reading(
        &self,
        first: FirstRead<'_>,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<()>,
    ) -> Result<()> {
        self.transact_first(Some(&first), f)
    }

    fn describe(&self) -> String {
        self.pool.cfg.shown.clone()
    }

    fn epoch(&self, wake: Wake) -> u64 {
        self.listener.epoch(wake)
    }

    /// A claim, a renewal round and a settle, each on a connection of
    /// its own: their round trips overlap.
    fn concurrent_txns(&self) -> usize {
        3
    }

    fn postgres_schema(&self) -> Option<&str> {
        Some(&self.pool.cfg.schema)
    }

    fn marks(&self) -> Result<crate::store::Marks> {
        self.fork.check()?;
        let mut client = self.pool.connect_raw()?;
        meta::read_marks(&mut client, &self.target())
    }

    fn set_marks(&self, marks: &crate::store::Marks) -> Result<()> {
        self.fork.check()?;
        let mut client = self.pool.connect_raw()?;
        meta::write_marks(&mut client, &self.target(), marks)
    }

    /// The listener (and its connection) starts with the first wait, so a
    /// handle that never waits never opens it.
    fn wait_epoch(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        if self.fork.is_origin() {
            self.listener.start(&self.pool.cfg.connector, &self.channel);
        }
        self.listener.wait(wake, epoch, timeout)
    }

    /// `NOTIFY` reaches every listening process; a listener that
    /// (re)connects bumps every epoch, for what it may have missed.
    fn announces_changes(&self) -> bool {
        true
    }

    fn interrupt_waits(&self, _wake: Wake) {
        self.listener.interrupt();
    }
}
