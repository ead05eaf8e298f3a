//! Instants on the three clocks leasehold deals with, as distinct types, so
//! that one cannot be passed where another is expected:
//!
//! - [`LocalMs`]: a process's own monotonic clock (a [`Client`]'s
//!   [`Clock`], by default the boot clock). Local deadlines (L3), renewal
//!   schedules and every client machine's timers are on it.
//! - [`StoreMs`]: the store's clock, read once per transaction: the time
//!   the rules run on (lease expiries, claims' leases, a job's `run_at`).
//! - [`WallMs`]: wall-clock time, milliseconds since the Unix epoch:
//!   schedules' ticks, and what people read and type (`--at`).
//!
//! The differences between two instants of one clock are plain
//! milliseconds (`u64`); nothing converts one clock's instant into
//! another's except through a reading of both
//! ([`Client::store_time`](crate::Client::store_time)).
//!
//! [`Client`]: crate::Client
//! [`Clock`]: crate::Clock

macro_rules! instant {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub u64);

        impl $name {
            /// The earliest instant.
            pub const ZERO: $name = $name(0);
            /// Never (the latest instant).
            pub const MAX: $name = $name(u64::MAX);

            /// The reading of `clock`, as an instant of this kind.
            pub fn read(clock: &dyn crate::clock::Clock) -> $name {
                $name(clock.now_ms())
            }

            /// Its milliseconds.
            pub const fn ms(self) -> u64 {
                self.0
            }

            /// `ms` later, saturating at [`Self::MAX`].
            #[must_use]
            pub const fn saturating_add(self, ms: u64) -> $name {
                $name(self.0.saturating_add(ms))
            }

            /// `ms` earlier, saturating at [`Self::ZERO`].
            #[must_use]
            pub const fn saturating_sub_ms(self, ms: u64) -> $name {
                $name(self.0.saturating_sub(ms))
            }

            /// Milliseconds from `earlier` to this instant (0 if it is not
            /// earlier).
            pub const fn saturating_sub(self, earlier: $name) -> u64 {
                self.0.saturating_sub(earlier.0)
            }
        }

        /// `ms` later (saturating).
        impl std::ops::Add<u64> for $name {
            type Output = $name;
            fn add(self, ms: u64) -> $name {
                self.saturating_add(ms)
            }
        }

        impl std::ops::AddAssign<u64> for $name {
            fn add_assign(&mut self, ms: u64) {
                *self = self.saturating_add(ms);
            }
        }

        /// `ms` earlier (saturating).
        impl std::ops::Sub<u64> for $name {
            type Output = $name;
            fn sub(self, ms: u64) -> $name {
                self.saturating_sub_ms(ms)
            }
        }

        /// Milliseconds between two instants of this clock (saturating at
        /// 0).
        impl std::ops::Sub for $name {
            type Output = u64;
            fn sub(self, earlier: $name) -> u64 {
                self.saturating_sub(earlier)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

instant!(
    /// An instant on a process's own monotonic clock, in milliseconds.
    LocalMs
);
instant!(
    /// An instant on the store's clock, in milliseconds.
    StoreMs
);
instant!(
    /// A wall-clock instant: milliseconds since the Unix epoch.
    WallMs
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_and_differences_are_plain_milliseconds() {
        assert_eq!(LocalMs(5).saturating_add(3), LocalMs(8));
        assert_eq!(LocalMs(5) + 3, LocalMs(8));
        assert_eq!(StoreMs::MAX + 3, StoreMs::MAX);
        assert_eq!(LocalMs(5) - 9, LocalMs::ZERO);
        assert_eq!(LocalMs(9) - LocalMs(5), 4);
        assert_eq!(LocalMs(5) - LocalMs(9), 0);
        assert_eq!(LocalMs::MAX.saturating_add(1), LocalMs::MAX);
        assert_eq!(LocalMs(5).saturating_sub_ms(9), LocalMs::ZERO);
        assert_eq!(LocalMs(9).saturating_sub(LocalMs(5)), 4);
        assert_eq!(LocalMs(5).saturating_sub(LocalMs(9)), 0);
        assert!(StoreMs(1) < StoreMs(2));
        assert_eq!(WallMs(7).ms(), 7);
        assert_eq!(WallMs(7).to_string(), "7");
    }
}
