//! PostgreSQL for tests: the server named by `LEASEHOLD_TEST_PG`, one fresh
//! schema per test (dropped afterwards), and a clear skip notice when the
//! variable is unset.

#![allow(dead_code)]

use leasehold::{PostgresOptions, PostgresStore};
use std::sync::atomic::{AtomicU64, Ordering};

/// The test server's URL, or `None` after printing why the test skips.
pub fn url() -> Option<String> {
    match std::env::var("LEASEHOLD_TEST_PG") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            // Once per test binary, and past the test harness's output
            // capture (which only takes the print macros), so it is seen.
            static SHOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SHOWN.swap(true, Ordering::SeqCst) {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: the PostgreSQL tests of this binary: LEASEHOLD_TEST_PG is not set; \
                     set it to a PostgreSQL URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run them"
                );
            }
            None
        }
    }
}

/// Whether the PostgreSQL tests run (prints the skip notice if not).
pub fn enabled() -> bool {
    url().is_some()
}

/// A schema name unique to this process and call.
pub fn fresh_schema(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "lh_{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Run SQL on the test server (for setup, inspection and sabotage).
pub fn admin(sql: &str) -> Vec<postgres::Row> {
    let url = url().expect("LEASEHOLD_TEST_PG");
    let mut c =
        postgres::Client::connect(&url, postgres::NoTls).expect("connect to LEASEHOLD_TEST_PG");
    c.query(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Run statements (separated by `;`) on the test server.
pub fn admin_batch(sql: &str) {
    let url = url().expect("LEASEHOLD_TEST_PG");
    let mut c =
        postgres::Client::connect(&url, postgres::NoTls).expect("connect to LEASEHOLD_TEST_PG");
    c.batch_execute(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Drops its schema when dropped.
pub struct Schema(pub String);

impl Schema {
    pub fn new(tag: &str) -> Schema {
        Schema(fresh_schema(tag))
    }

    /// The test URL with this schema selected.
    pub fn url(&self) -> String {
        let base = url().expect("LEASEHOLD_TEST_PG");
        let sep = if base.contains('?') { '&' } else { '?' };
        format!("{base}{sep}schema={}", self.0)
    }

    pub fn open(&self, opts: PostgresOptions) -> PostgresStore {
        PostgresStore::open_with(&self.url(), opts).unwrap()
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if url().is_some() {
            let _ = std::panic::catch_unwind(|| {
                admin(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.0))
            });
        }
    }
}

/// A loopback proxy in front of the test server that counts round trips:
/// a request that follows a whole reply (or opens a connection) starts
/// one. Plain connections only: a reply is known whole by its last message.
#[allow(clippy::disallowed_types, clippy::disallowed_methods)] // real sockets and threads
pub struct RoundTrips {
    port: u16,
    count: std::sync::Arc<AtomicU64>,
}

#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
impl RoundTrips {
    /// A proxy in front of the `LEASEHOLD_TEST_PG` server.
    pub fn start() -> RoundTrips {
        Self::start_to(&url().expect("LEASEHOLD_TEST_PG"))
    }

    /// A proxy in front of the server `server_url` names.
    pub fn start_to(server_url: &str) -> RoundTrips {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        use std::sync::atomic::AtomicU8;
        use std::sync::Arc;
        let config: postgres::Config = server_url.parse().unwrap();
        let host = match &config.get_hosts()[0] {
            postgres::config::Host::Tcp(h) => h.clone(),
            other => panic!("the round-trip proxy needs a TCP server, not {other:?}"),
        };
        let server = format!("{host}:{}", config.get_ports().first().unwrap_or(&5432));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let count = Arc::new(AtomicU64::new(0));
        let counter = count.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(upstream) = TcpStream::connect(&server) else {
                    continue;
                };
                let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
                // 0: the last bytes went to the server; 1: to the client.
                let last = Arc::new(AtomicU8::new(1));
                let pipe = |mut from: TcpStream, mut to: TcpStream, dir: u8| {
                    let (last, counter) = (last.clone(), counter.clone());
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            // Marked before forwarding, so the next request
                            // (sent only after this reply) sees it. A reply
                            // counts once whole (it ends with ReadyForQuery):
                            // the server also flushes what it has when it
                            // waits for the rest of a request that reached it
                            // in two reads, which is not a round trip.
                            let whole = n >= 6 && buf[n - 6..n - 1] == [b'Z', 0, 0, 0, 5];
                            if dir == 0 {
                                if last.swap(0, Ordering::SeqCst) == 1 {
                                    counter.fetch_add(1, Ordering::SeqCst);
                                }
                            } else if whole {
                                last.store(1, Ordering::SeqCst);
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                };
                pipe(
                    client.try_clone().unwrap(),
                    upstream.try_clone().unwrap(),
                    0,
                );
                pipe(upstream, client, 1);
            }
        });
        RoundTrips { port, count }
    }

    /// Round trips so far (every connection through the proxy).
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// `server_url` (user, password, database) through the proxy.
    pub fn proxied(&self, server_url: &str) -> String {
        let config: postgres::Config = server_url.parse().unwrap();
        let user = config.get_user().unwrap_or("postgres");
        let db = config.get_dbname().unwrap_or("postgres");
        let password = config
            .get_password()
            .map(|p| format!(":{}", String::from_utf8_lossy(p)))
            .unwrap_or_default();
        format!("postgres://{user}{password}@127.0.0.1:{}/{db}", self.port)
    }

    /// `schema`'s URL, through the proxy.
    pub fn url(&self, schema: &Schema) -> String {
        let base = self.proxied(&url().expect("LEASEHOLD_TEST_PG"));
        format!("{base}?schema={}", schema.0)
    }
}

/// The CA that signed the test server's certificate (`.ci/run` makes it and
/// sets `LEASEHOLD_TEST_PG_TLS_CA`), or `None` after printing why the TLS
/// tests skip. A second CA that signed nothing the server presents lies
/// beside it, as `untrusted-ca.pem`.
pub fn tls_ca() -> Option<std::path::PathBuf> {
    url()?;
    match std::env::var("LEASEHOLD_TEST_PG_TLS_CA") {
        Ok(path) if !path.is_empty() => Some(path.into()),
        _ => {
            static SHOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SHOWN.swap(true, Ordering::SeqCst) {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: the PostgreSQL TLS tests of this binary: LEASEHOLD_TEST_PG_TLS_CA is not set; \
                     run the TLS step of .ci/run (it makes a CA and a server certificate, turns ssl on \
                     and prints the variable)"
                );
            }
            None
        }
    }
}

/// A URL for the test server at `host` (its address still the test URL's,
/// by `hostaddr`), with `params`; the schema of `schema`.
pub fn url_as_host(host: &str, schema: &Schema, params: &str) -> String {
    let config: postgres::Config = url().expect("LEASEHOLD_TEST_PG").parse().unwrap();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let addr = match &config.get_hosts()[0] {
        postgres::config::Host::Tcp(h) => {
            use std::net::ToSocketAddrs;
            let mut addrs = (h.as_str(), port)
                .to_socket_addrs()
                .expect("resolve the test host");
            addrs.next().expect("an address of the test host").ip()
        }
        other => panic!("the TLS tests need a TCP server, not {other:?}"),
    };
    let user = config.get_user().unwrap_or("postgres");
    let db = config.get_dbname().unwrap_or("postgres");
    format!(
        "postgres://{user}@{host}:{port}/{db}?hostaddr={addr}&schema={}&{params}",
        schema.0
    )
}
