//! Connections: opening one and configuring its session, preparing its
//! statements, and the small pool a store handle keeps (threads sharing a
//! handle each take a connection for the length of a transaction).

use super::early::prepare_early;
use super::error::{pg_err, Stage};
use super::job_writes::prepare_update;
use super::meta::BeginSql;
use super::statements::Statements;
use crate::error::{Error, Result};
use crate::sync::{lock, Condvar, Mutex};
use postgres::{Client, Config, NoTls};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres_rustls::MakeRustlsConnect;

/// How to reach the server: the driver's settings, and the TLS connector
/// when the URL asks for TLS.
#[derive(Clone)]
pub(super) struct Connector {
    pub config: Config,
    pub tls: Option<MakeRustlsConnect>,
}

impl Connector {
    /// A new session (no setup).
    pub fn connect(&self) -> std::result::Result<Client, postgres::Error> {
        match &self.tls {
            None => self.config.connect(NoTls),
            Some(tls) => self.config.connect(tls.clone()),
        }
    }
}

/// One pooled connection and its prepared statements.
pub(super) struct Conn {
    pub client: Client,
    pub st: Statements,
    /// This session's last reading of the schema's marks (none found) and
    /// token floor (see `PostgresStore::begin`).
    pub meta_read: Option<MetaRead>,
}

/// A session's reading of the marks and the fence.
pub(super) struct MetaRead {
    /// When, by the server's clock (ms).
    pub at_ms: u64,
    /// When, by this process's monotonic clock (ms): a reading past half
    /// its freshness here is read again with BEGIN, before the server
    /// could find it stale and cost the transaction a round trip.
    pub local_ms: u64,
    /// The token floor then.
    pub floor: u64,
    /// The server's timeline then, the one the floor was set for.
    pub timeline: String,
}

/// What a pool opens its connections with.
pub(super) struct PoolConfig {
    pub connector: Connector,
    /// The server, for messages.
    pub shown: String,
    /// The quoted schema name.
    pub schema: String,
    /// Run on every new session before its statements are prepared.
    pub session_setup: String,
    /// BEGIN's statements, prepared by every session.
    pub begin_sql: Arc<BeginSql>,
    /// Connections open at most.
    pub max_connections: usize,
    /// How long a checkout waits for a free connection.
    pub wait: Duration,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Conn>,
    /// Connections open (idle or in use).
    open: usize,
}

/// The connections of one store handle.
pub(super) struct Pool {
    pub cfg: PoolConfig,
    state: Mutex<PoolState>,
    freed: Condvar,
}

impl Pool {
    pub fn new(cfg: PoolConfig) -> Pool {
        Pool {
            cfg,
            state: Mutex::new(PoolState::default()),
            freed: Condvar::new(),
        }
    }

    /// A new session, configured (`lock_timeout` and the others).
    pub fn connect_raw(&self) -> Result<Client> {
        let mut client = self
            .cfg
            .connector
            .connect()
            .map_err(|e| pg_err(format!("connecting to {}", self.cfg.shown), e, Stage::Work))?;
        client.batch_execute(&self.cfg.session_setup).map_err(|e| {
            pg_err(
                format!("configuring a session on {}", self.cfg.shown),
                e,
                Stage::Work,
            )
        })?;
        Ok(client)
    }

    /// Prepare a configured session (after the schema exists): the
    /// SQL-level statements (the reads sent with BEGIN, `early.rs`, and the
    /// UPDATE of the commit scripts) in one round trip; the reads of
    /// [`Statements`] on their first use.
    pub fn prepare(&self, mut client: Client) -> Result<Conn> {
        let schema = &self.cfg.schema;
        client
            .batch_execute(&format!(
                "{};\n{};\n{}",
                prepare_update(schema),
                prepare_early(schema),
                self.cfg.begin_sql.prepare
            ))
            .map_err(|e| {
                pg_err(
                    format!("preparing statements on {}", self.cfg.shown),
                    e,
                    Stage::Work,
                )
            })?;
        Ok(Conn {
            client,
            st: Statements::new(schema),
            meta_read: None,
        })
    }

    /// Keep a connection opened outside the pool (the first one, which
    /// migrated the schema).
    pub fn adopt(&self, conn: Conn) {
        let mut pool = lock(&self.state);
        pool.idle.push(conn);
        pool.open += 1;
    }

    /// A connection from the pool, a new one, or (all in use) the first
    /// one returned within the pool's wait.
    pub fn checkout(&self) -> Result<Conn> {
        let mut pool = lock(&self.state);
        let mut waited = Duration::ZERO;
        loop {
            if let Some(conn) = pool.idle.pop() {
                return Ok(conn);
            }
            if pool.open < self.cfg.max_connections {
                pool.open += 1;
                drop(pool);
                let conn = self.connect_raw().and_then(|c| self.prepare(c));
                if conn.is_err() {
                    self.forget();
                }
                return conn;
            }
            if waited >= self.cfg.wait {
                return Err(Error::transient(
                    format!("taking a connection to {}", self.cfg.shown),
                    format!(
                        "all {} connections of this handle are in use",
                        self.cfg.max_connections
                    ),
                ));
            }
            let step = Duration::from_millis(50);
            pool = match self.freed.wait_timeout(pool, step) {
                Ok((p, _)) => p,
                Err(poisoned) => poisoned.into_inner().0,
            };
            waited += step;
        }
    }

    /// Return a connection to the pool, or drop it if it broke.
    pub fn checkin(&self, conn: Conn, broken: bool) {
        let mut pool = lock(&self.state);
        if broken || conn.client.is_closed() {
            pool.open -= 1;
            drop(pool);
            drop(conn);
        } else {
            pool.idle.push(conn);
        }
        self.freed.notify_one();
    }

    /// A checked-out connection is gone (dropped, not returned).
    pub fn forget(&self) {
        lock(&self.state).open -= 1;
        self.freed.notify_one();
    }

    /// Every idle connection, taken out (the handle is being dropped).
    pub fn take_idle(&self) -> Vec<Conn> {
        std::mem::take(&mut lock(&self.state).idle)
    }
}

/// A connection taken from the pool. If the transaction panics, the
/// connection (in the middle of a transaction) is closed, not reused.
pub(super) struct Checkout<'p> {
    pub pool: &'p Pool,
    pub conn: Option<Conn>,
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.forget();
            drop(conn);
        }
    }
}
