//! The fenced resource: what a lease protects, guarded as the README tells
//! users to guard theirs. It keeps, per key, the highest token it accepted
//! and refuses a write with a lower one, and logs every accepted write, in
//! a SQLite file of its own (not the store's).

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::Path;
use std::time::Duration;

pub struct Resource {
    conn: std::cell::RefCell<Connection>,
}

impl Resource {
    pub fn open(path: &Path) -> rusqlite::Result<Resource> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        conn.pragma_update(None, "journal_mode", "wal")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS fence (key TEXT PRIMARY KEY, token INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS accepted (seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 key TEXT NOT NULL, token INTEGER NOT NULL, p TEXT NOT NULL);",
        )?;
        Ok(Resource {
            conn: std::cell::RefCell::new(conn),
        })
    }

    /// Write `token` to `key`: accepted (true) unless a higher token was
    /// accepted before.
    pub fn write(&self, key: &str, token: u64, p: &str) -> rusqlite::Result<bool> {
        let mut conn = self.conn.borrow_mut();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let token = i64::try_from(token).unwrap_or(i64::MAX);
        let highest: Option<i64> = tx
            .query_row("SELECT token FROM fence WHERE key = ?1", [key], |r| {
                r.get(0)
            })
            .optional()?;
        if highest.is_some_and(|h| h > token) {
            return Ok(false);
        }
        tx.execute(
            "INSERT INTO fence (key, token) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET token = ?2",
            params![key, token],
        )?;
        tx.execute(
            "INSERT INTO accepted (key, token, p) VALUES (?1, ?2, ?3)",
            params![key, token, p],
        )?;
        tx.commit()?;
        Ok(true)
    }

    /// Every accepted write, in the order accepted: (key, token, process).
    pub fn accepted(&self) -> rusqlite::Result<Vec<(String, u64, String)>> {
        let conn = self.conn.borrow();
        let mut stmt = conn.prepare("SELECT key, token, p FROM accepted ORDER BY seq")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                r.get::<_, String>(2)?,
            ))
        })?;
        rows.collect()
    }
}
