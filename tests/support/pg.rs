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
