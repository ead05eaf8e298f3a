//! Where a store stands in a move between stores (`leasehold migrate`).
//!
//! # State
//! Two names in the store's `leasehold_meta` table, both absent in a store
//! nobody moves:
//! - `moving_from`: on the target while a migration copies into it. Every
//!   transaction of an ordinary handle fails with a transient error (its
//!   workers wait, then carry on once the copy is complete), so nothing is
//!   claimed from a half-copied store and a resumed copy never overwrites
//!   work done on the target.
//! - `moved_to`: on the source from the cut-over on. Every transaction of
//!   an ordinary handle, and every open, fails with [`Error::Moved`] naming
//!   the target: the source is frozen, so what the copy reads is final.
//!
//! # Transitions (the migration's own handles ignore the marks)
//! none → target `moving_from` → source `moved_to` → copy → target none.
//! A migration interrupted anywhere finds the marks it left and goes on
//! from there.

// The mem and file stores keep no marks: only the database stores read these.
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

use crate::error::{Error, Result};
use std::time::Duration;

/// How long a connection trusts that it found no mark: a transaction that
/// begins later than this after the last reading reads the marks again.
/// A cut-over waits twice this after committing its mark, then for every
/// transaction that began before the end of that wait (SQLite: takes the
/// write lock; PostgreSQL: watches `pg_stat_activity`); every transaction
/// after that reads the mark. So reading the marks costs a transaction
/// nothing most of the time (one clock reading), where reading them in
/// every transaction cost 10-20 % of SQLite's two-transaction lease pair
/// and 20-30 % of PostgreSQL's (measured, same run).
pub(crate) const MARKS_FRESH: Duration = Duration::from_millis(MARKS_FRESH_MS);
/// [`MARKS_FRESH`] in ms.
pub(crate) const MARKS_FRESH_MS: u64 = 50;

/// The meta name of the source's mark.
pub(crate) const MOVED_TO: &str = "moved_to";
/// The meta name of the target's mark.
pub(crate) const MOVING_FROM: &str = "moving_from";

/// A store's marks ([module docs](self)).
#[doc(hidden)]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    /// The store its contents went to (the source of a migration).
    pub moved_to: Option<String>,
    /// The store its contents are coming from (the target, during one).
    pub moving_from: Option<String>,
}

impl Marks {
    /// Set the mark `name` (one of the meta names) to `value`.
    pub(crate) fn set(&mut self, name: &str, value: String) {
        match name {
            MOVED_TO => self.moved_to = Some(value),
            MOVING_FROM => self.moving_from = Some(value),
            _ => {}
        }
    }

    /// The marks as `(meta name, value)`: `None` for an absent one.
    pub(crate) fn entries(&self) -> [(&'static str, Option<&str>); 2] {
        [
            (MOVED_TO, self.moved_to.as_deref()),
            (MOVING_FROM, self.moving_from.as_deref()),
        ]
    }

    /// What an ordinary handle's transaction must answer with these marks:
    /// nothing when there are none.
    pub(crate) fn check(&self, store: &str) -> Result<()> {
        if let Some(to) = &self.moved_to {
            return Err(Error::Moved { to: to.clone() });
        }
        if let Some(from) = &self.moving_from {
            return Err(Error::transient(
                format!("using {store}"),
                format!(
                    "`leasehold migrate` is copying {from} into this store; it is used again \
                     once the copy is complete (rerun the migration if it was interrupted)"
                ),
            ));
        }
        Ok(())
    }
}
