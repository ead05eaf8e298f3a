//! [`HotConn`]: the store's connection with the statements every lease
//! transaction runs (and those that open, join and end a transaction)
//! prepared once and kept, each in a slot of its own.
//!
//! rusqlite's statement cache finds a statement by its text: each use
//! hashes the SQL, takes the statement out of an LRU list, and puts it
//! back (hashing again, allocating a node) when it is dropped. Measured
//! on this machine (a scratch program, one row upsert, 1,000,000 runs):
//! 125 ns a statement for the cache alone, about 15 % of the statement. A
//! lease pair runs nine (BEGIN, the read, the head and the slot, COMMIT;
//! BEGIN, the read, the DELETE, COMMIT), so the cache was a tenth of
//! what the `Client` pair costs on SQLite. A [`Hot`] statement is found
//! by its index instead, and stays bound to the connection until it
//! closes.
//!
//! State: the connection, and one slot per [`Hot`] statement, empty until
//! its first use. A slot is borrowed for one statement's run; a use of a
//! statement whose slot is borrowed already (a caller running it while it
//! runs) takes the cache's copy instead, so nothing waits or fails for
//! it. Every statement is reset when its run ends (rusqlite resets on
//! `execute` and when a query's rows are dropped), so a kept statement
//! holds no read open between transactions.

use rusqlite::{Connection, PrepFlags, Statement};
use std::cell::RefCell;

/// The statements kept in a [`HotConn`], by slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hot {
    Begin,
    Commit,
    Rollback,
    /// A member joining an open group commit.
    Savepoint,
    /// A member leaving it, its writes kept.
    Release,
    /// A failed member's writes undone (then [`Hot::Release`]).
    RollbackTo,
    /// A key's rows (`lease_rows::load`).
    LeaseLoad,
    /// A key's head row, written with every grant.
    LeaseHead,
    /// A slot given up (a release, an expiry swept).
    LeaseDelete,
    /// A slot renewed by its holder.
    LeaseRenew,
    /// A new slot.
    LeaseInsert,
    /// A slot taken over (a new holder in an expired slot's place).
    LeaseReplace,
}

impl Hot {
    /// Every statement, in slot order.
    const ALL: [Hot; 12] = [
        Hot::Begin,
        Hot::Commit,
        Hot::Rollback,
        Hot::Savepoint,
        Hot::Release,
        Hot::RollbackTo,
        Hot::LeaseLoad,
        Hot::LeaseHead,
        Hot::LeaseDelete,
        Hot::LeaseRenew,
        Hot::LeaseInsert,
        Hot::LeaseReplace,
    ];
    const COUNT: usize = Hot::ALL.len();

    fn sql(self) -> &'static str {
        match self {
            Hot::Begin => "BEGIN IMMEDIATE",
            Hot::Commit => "COMMIT",
            Hot::Rollback => "ROLLBACK",
            Hot::Savepoint => "SAVEPOINT member",
            Hot::Release => "RELEASE member",
            Hot::RollbackTo => "ROLLBACK TO member",
            Hot::LeaseLoad => {
                "SELECT token, last_token, lease_limit, holder, label, expires_at
                 FROM lease_rows WHERE key = ?1 ORDER BY token"
            }
            Hot::LeaseHead => {
                "INSERT INTO lease_rows (key, token, last_token, lease_limit)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(key, token) DO UPDATE SET last_token = excluded.last_token,
                                                       lease_limit = excluded.lease_limit"
            }
            Hot::LeaseDelete => "DELETE FROM lease_rows WHERE key = ?1 AND token = ?2",
            Hot::LeaseRenew => {
                "UPDATE lease_rows SET expires_at = ?3 WHERE key = ?1 AND token = ?2"
            }
            Hot::LeaseInsert => {
                "INSERT INTO lease_rows (key, token, holder, label, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)"
            }
            Hot::LeaseReplace => {
                "INSERT OR REPLACE INTO lease_rows (key, token, holder, label, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)"
            }
        }
    }
}

/// The kept statements of one connection, by [`Hot`] slot.
struct Slots<'c>([RefCell<Option<Statement<'c>>>; Hot::COUNT]);

self_cell::self_cell!(
    /// A connection and the statements prepared on it: the statements
    /// are dropped (finalized) before the connection closes.
    struct Cell {
        owner: Connection,
        #[not_covariant]
        dependent: Slots,
    }
);

/// A connection whose [`Hot`] statements are prepared once and kept; it
/// derefs to the [`Connection`] for everything else.
pub(super) struct HotConn(Cell);

// SAFETY: a `Statement` is not `Send` only because it borrows its
// `Connection` (which is not `Sync`). Here the connection and every
// statement borrowing it move between threads together, as one value;
// `HotConn` is not `Sync` (the slots are `RefCell`s), so no two threads
// reach the connection or a statement at once, and no statement or
// connection reference outlives a borrow of the `HotConn` it came from.
// rusqlite makes the same argument for its own cache of raw statements.
unsafe impl Send for HotConn {}

impl HotConn {
    pub(super) fn new(conn: Connection) -> HotConn {
        HotConn(Cell::new(conn, |_| {
            Slots(std::array::from_fn(|_| RefCell::new(None)))
        }))
    }

    /// Run `f` on statement `which` (prepared on its first use).
    pub(super) fn with<R>(
        &self,
        which: Hot,
        f: impl FnOnce(&mut Statement<'_>) -> rusqlite::Result<R>,
    ) -> rusqlite::Result<R> {
        self.0.with_dependent(|conn, slots| {
            let slot = slots.0.get(which as usize).map(RefCell::try_borrow_mut);
            let Some(Ok(mut slot)) = slot else {
                // Running further up this thread's stack (or, were a
                // statement ever left out of `Hot::ALL`, without a slot):
                // the cache's copy.
                let mut cached = conn.prepare_cached(which.sql())?;
                return f(&mut cached);
            };
            let stmt = match &mut *slot {
                Some(stmt) => stmt,
                None => slot.insert(
                    conn.prepare_with_flags(which.sql(), PrepFlags::SQLITE_PREPARE_PERSISTENT)?,
                ),
            };
            f(stmt)
        })
    }

    /// Run a statement that takes no parameters and returns no rows.
    pub(super) fn exec(&self, which: Hot) -> rusqlite::Result<()> {
        self.with(which, |stmt| stmt.execute([]).map(|_| ()))
    }
}

impl std::ops::Deref for HotConn {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.0.borrow_owner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> HotConn {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE lease_rows (key TEXT NOT NULL, token INTEGER NOT NULL,
               last_token INTEGER, lease_limit INTEGER, holder BLOB, label TEXT,
               expires_at INTEGER, PRIMARY KEY (key, token)) WITHOUT ROWID",
        )
        .unwrap();
        HotConn::new(conn)
    }

    #[test]
    fn every_statement_prepares_on_the_schema() {
        let c = conn();
        for (slot, which) in Hot::ALL.into_iter().enumerate() {
            assert_eq!(which as usize, slot, "{which:?} is in its slot");
            c.with(which, |s| Ok(s.parameter_count())).unwrap();
        }
    }

    #[test]
    fn a_kept_statement_runs_again_with_new_values() {
        let c = conn();
        for token in 1..=3 {
            c.with(Hot::LeaseInsert, |s| {
                s.execute(rusqlite::params!["k", token, [0u8; 16], None::<String>, 9])
            })
            .unwrap();
        }
        let tokens: Vec<i64> = c
            .with(Hot::LeaseLoad, |s| {
                s.query_map(["k"], |r| r.get(0))?.collect()
            })
            .unwrap();
        assert_eq!(tokens, [1, 2, 3]);
    }

    #[test]
    fn a_statement_used_while_it_runs_takes_the_caches_copy() {
        let c = conn();
        c.with(Hot::LeaseInsert, |s| {
            s.execute(rusqlite::params!["a", 1, [0u8; 16], None::<String>, 9])
        })
        .unwrap();
        let both = c
            .with(Hot::LeaseLoad, |outer| {
                let mut rows = outer.query(["a"])?;
                let first: i64 = rows.next()?.map(|r| r.get(0)).transpose()?.unwrap_or(-1);
                let inner = c.with(Hot::LeaseLoad, |s| {
                    s.query_row(["a"], |r| r.get::<_, i64>(0))
                })?;
                Ok((first, inner))
            })
            .unwrap();
        assert_eq!(both, (1, 1));
    }

    #[test]
    fn a_kept_statement_holds_no_read_between_uses() {
        // A read left open would keep this connection's snapshot: the
        // write from another connection would stay unseen.
        let dir = std::env::temp_dir().join(format!("leasehold-hot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.db");
        let _ = std::fs::remove_file(&path);
        let a = Connection::open(&path).unwrap();
        a.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE lease_rows (key TEXT NOT NULL, token INTEGER NOT NULL,
               last_token INTEGER, lease_limit INTEGER, holder BLOB, label TEXT,
               expires_at INTEGER, PRIMARY KEY (key, token)) WITHOUT ROWID",
        )
        .unwrap();
        let a = HotConn::new(a);
        let b = Connection::open(&path).unwrap();
        let count = |c: &HotConn| {
            c.with(Hot::LeaseLoad, |s| {
                Ok(s.query_map(["k"], |_| Ok(()))?.count())
            })
            .unwrap()
        };
        assert_eq!(count(&a), 0);
        b.execute(
            "INSERT INTO lease_rows (key, token, expires_at) VALUES ('k', 1, 5)",
            [],
        )
        .unwrap();
        assert_eq!(count(&a), 1);
        assert!(a.is_autocommit());
        drop(a);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
