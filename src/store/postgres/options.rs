//! How a [`PostgresStore`](super::PostgresStore) is opened: its options,
//! what its URL may carry beyond the driver's own parameters (`schema`,
//! `pool_size`, `sslmode`, `sslrootcert`), the schema name's rules, and
//! how the connection is shown in messages (never its password).

use super::tls::{SslMode, TlsParams};
use crate::clock::Clock;
use crate::error::{Error, Field, Result};
use postgres::Config;
use std::sync::Arc;
use std::time::Duration;

/// The longest schema name: the notification channel
/// (`leasehold_<schema>`) must fit PostgreSQL's 63-byte identifiers.
const MAX_SCHEMA_BYTES: usize = 48;

/// Options of [`PostgresStore::open_with`](super::PostgresStore::open_with). The URL's `schema=` and
/// `pool_size=` parameters, when present, override `schema` and
/// `max_connections`.
#[derive(Clone)]
pub struct PostgresOptions {
    /// The schema holding leasehold's tables (created if missing).
    pub schema: String,
    /// Connections this handle opens at most (threads sharing the handle
    /// each take one for the length of a transaction).
    pub max_connections: usize,
    /// How long a thread waits for a free connection before a transient error.
    pub pool_wait: Duration,
    /// `lock_timeout` of every session: a row-lock wait longer than this
    /// ends as a transient error.
    pub lock_timeout: Duration,
    /// `idle_in_transaction_session_timeout`: a client that stalls inside a
    /// transaction (a paused process) loses its session and its locks.
    pub idle_in_transaction_timeout: Duration,
    /// Replaces the database clock (tests use a manual clock for exact
    /// boundaries). `None`: the server's clock (`now()`).
    pub clock: Option<Arc<dyn Clock>>,
    /// Work on the schema whatever its migration marks say (the handles
    /// of `leasehold migrate`).
    #[doc(hidden)]
    pub ignore_marks: bool,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            schema: "leasehold".to_owned(),
            max_connections: 16,
            pool_wait: Duration::from_secs(5),
            lock_timeout: Duration::from_secs(2),
            idle_in_transaction_timeout: Duration::from_secs(10),
            clock: None,
            ignore_marks: false,
        }
    }
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("clock", &self.clock.as_ref().map(|_| "injected"))
            .finish_non_exhaustive()
    }
}

/// Split leasehold's own parameters (`schema`, `pool_size`) and the TLS
/// ones (`sslmode`, `sslrootcert`) off a `postgres://` URL; the rest goes
/// to the driver.
pub(super) fn split_url(url: &str, opts: &mut PostgresOptions) -> Result<(String, TlsParams)> {
    let mut tls = TlsParams::default();
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), tls));
    };
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "schema" => opts.schema = value.to_owned(),
            "pool_size" => {
                opts.max_connections = value
                    .parse()
                    .ok()
                    .filter(|&n| (1..=1024).contains(&n))
                    .ok_or_else(|| {
                        Error::invalid(
                            Field::Store,
                            format!("pool_size={value:?}: expected 1..=1024"),
                        )
                    })?;
            }
            "sslmode" => tls.mode = Some(SslMode::parse(value)?),
            "sslrootcert" => {
                tls.root_cert = Some(percent_decode(Field::Sslrootcert, value)?.into())
            }
            // libpq's `host=a,b` (the driver takes a comma as part of one
            // host name here): one host parameter each.
            "host" if value.contains(',') => {
                rest.extend(value.split(',').map(|h| format!("host={h}")));
            }
            _ => rest.push(pair.to_owned()),
        }
    }
    let driver_url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((driver_url, tls))
}

/// A URL parameter's value with its `%XX` escapes decoded.
fn percent_decode(field: Field, value: &str) -> Result<String> {
    let bad = || Error::invalid(field, format!("{value:?}: a bad %-escape or not UTF-8"));
    let mut bytes = Vec::with_capacity(value.len());
    let mut rest = value.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        if b != b'%' {
            bytes.push(b);
            continue;
        }
        let hex = rest.get(..2).ok_or_else(bad)?;
        let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
        bytes.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
        rest = &rest[2..];
    }
    String::from_utf8(bytes).map_err(|_| bad())
}

/// Check a schema name: lowercase letters, digits and `_`, not starting
/// with a digit, at most [`MAX_SCHEMA_BYTES`].
pub(super) fn check_schema_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SCHEMA_BYTES
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            Field::Schema,
            format!("{name:?}: use 1 to {MAX_SCHEMA_BYTES} lowercase letters, digits or _, not starting with a digit"),
        ))
    }
}

/// The connection settings without the password, for messages.
pub(super) fn describe_config(config: &Config, schema: &str, tls: &TlsParams) -> String {
    use postgres::config::Host;
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432u16)))
        .map(|(h, p)| match h {
            Host::Tcp(name) => format!("{name}:{p}"),
            Host::Unix(path) => format!("{}:{p}", path.display()),
        })
        .collect();
    let sslmode = tls
        .mode
        .map(|m| format!(", sslmode={}", m.as_str()))
        .unwrap_or_default();
    format!(
        "postgres://{}@{}/{} (schema {schema}{sslmode})",
        config.get_user().unwrap_or(""),
        hosts.join(","),
        config.get_dbname().unwrap_or("")
    )
}

/// A duration as a session setting's value (at least 1 ms: 0 turns a
/// timeout off).
pub(super) fn ms_setting(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}
