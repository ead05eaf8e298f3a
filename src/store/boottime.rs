//! Store time for the stores that live on one machine (SQLite, files): the
//! machine's boot-time clock plus an offset kept in the store, continuous
//! across reboots. The rule lives here once:
//!
//! - The store keeps the boot id, the offset and a **high water**. A
//!   handle persists the high water whenever it is about to use an instant
//!   more than [`PERSIST_INTERVAL_MS`] above what it last persisted (SQLite
//!   in the same commit as the transaction's writes, the file store before
//!   the transaction runs), so every instant a transaction used is at most
//!   `high water + PERSIST_INTERVAL_MS`; persisting costs a write about once
//!   an interval, not once a transaction.
//! - Opening on the same boot keeps the stored offset: every process of the
//!   machine shares one timeline.
//! - Opening on a new boot (the boot id changed) moves the offset so that
//!   store time starts above `high water + PERSIST_INTERVAL_MS`: above every
//!   instant any transaction used before the reboot, so store time never
//!   goes backwards (leases of the old boot run out; their holders died
//!   with it). A store that was never used (no clock state) starts at the
//!   boot clock itself.

use crate::clock::{boot_id, Clock};
use crate::sync::{AtomicU64, Ordering};
use std::sync::Arc;

/// How far store time may run above the persisted high water before a
/// handle persists it again.
pub(crate) const PERSIST_INTERVAL_MS: u64 = 1000;

/// The clock state a store keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Saved {
    /// The boot that set `offset_ms`.
    pub boot_id: String,
    /// Store time minus boot-clock time on that boot.
    pub offset_ms: i64,
    /// The persisted high water (see the module docs).
    pub high_water_ms: u64,
}

/// The boot id to use: the injected one, else the kernel's.
pub(crate) fn current_boot(injected: Option<String>) -> String {
    injected
        .or_else(boot_id)
        .unwrap_or_else(|| "unknown-boot".to_owned())
}

/// The offset to use on `boot` when the boot clock reads `raw_now_ms`,
/// given the stored state, and whether it must be stored (a new boot or a
/// store never used) rather than kept.
pub(crate) fn rebase(saved: Option<&Saved>, boot: &str, raw_now_ms: u64) -> (i64, bool) {
    match saved {
        Some(s) if s.boot_id == boot => (s.offset_ms, false),
        _ => {
            // Store time must start above every instant used before.
            let floor_ms = saved.map_or(0, |s| s.high_water_ms.saturating_add(PERSIST_INTERVAL_MS));
            let start_ms = i64::try_from(floor_ms.saturating_add(1)).unwrap_or(i64::MAX);
            let now = i64::try_from(raw_now_ms).unwrap_or(i64::MAX);
            let offset_ms = start_ms.saturating_sub(now).max(0);
            debug_assert!(offset_ms >= 0 && now.saturating_add(offset_ms) >= start_ms.min(now));
            (offset_ms, true)
        }
    }
}

/// A handle's store clock: the boot clock plus the offset, never below
/// what this handle handed out, and what it has persisted.
#[derive(Debug)]
pub(crate) struct StoreClock {
    clock: Arc<dyn Clock>,
    offset_ms: i64,
    /// Highest store time handed out by this handle.
    high_water_ms: AtomicU64,
    /// Highest store time known to be persisted in the store.
    persisted_ms: AtomicU64,
}

impl StoreClock {
    /// A clock with `offset_ms`, in a store whose high water is `high_water_ms`.
    pub fn new(clock: Arc<dyn Clock>, offset_ms: i64, high_water_ms: u64) -> Self {
        StoreClock {
            clock,
            offset_ms,
            high_water_ms: AtomicU64::new(high_water_ms),
            persisted_ms: AtomicU64::new(high_water_ms),
        }
    }

    /// Store time now: boot clock plus offset, never below what this
    /// handle already handed out.
    pub fn now_ms(&self) -> u64 {
        let raw = i64::try_from(self.clock.now_ms())
            .unwrap_or(i64::MAX)
            .saturating_add(self.offset_ms);
        let now = u64::try_from(raw).unwrap_or(0);
        let prev = self.high_water_ms.fetch_max(now, Ordering::SeqCst);
        now.max(prev)
    }

    /// Whether the high water must be persisted before `now_ms` is used
    /// (see the module docs).
    pub fn must_persist(&self, now_ms: u64) -> bool {
        now_ms
            > self
                .persisted_ms
                .load(Ordering::Relaxed)
                .saturating_add(PERSIST_INTERVAL_MS)
    }

    /// `high_ms` is now persisted.
    pub fn persisted(&self, high_ms: u64) {
        self.persisted_ms.fetch_max(high_ms, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(boot: &str, offset_ms: i64, high_water_ms: u64) -> Saved {
        Saved {
            boot_id: boot.into(),
            offset_ms,
            high_water_ms,
        }
    }

    #[test]
    fn same_boot_keeps_the_offset() {
        assert_eq!(rebase(Some(&saved("a", 77, 5_000)), "a", 10), (77, false));
    }

    #[test]
    fn a_new_boot_starts_above_the_high_water_plus_the_interval() {
        let (offset, store) = rebase(Some(&saved("a", 0, 50_000)), "b", 5);
        assert!(store);
        assert_eq!(5 + offset, 50_000 + PERSIST_INTERVAL_MS as i64 + 1);
        // A boot clock already past it needs no offset.
        assert_eq!(rebase(Some(&saved("a", 9, 50_000)), "b", 90_000), (0, true));
    }

    #[test]
    fn a_fresh_store_starts_at_the_boot_clock() {
        assert_eq!(rebase(None, "a", 123_456), (0, true));
        assert_eq!(rebase(None, "a", 0), (1, true));
    }

    #[test]
    fn the_high_water_is_persisted_past_the_interval() {
        let clock = StoreClock::new(Arc::new(crate::ManualClock::new(0)), 0, 1_000);
        assert!(!clock.must_persist(1_000 + PERSIST_INTERVAL_MS));
        assert!(clock.must_persist(1_001 + PERSIST_INTERVAL_MS));
        clock.persisted(1_500);
        assert!(!clock.must_persist(1_001 + PERSIST_INTERVAL_MS));
    }
}
