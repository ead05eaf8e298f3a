//! [`LeaseGuard`]: a held lease, its local deadline and keep-alive.

use super::lifeline::{Lifeline, Owner, RenewFn};
#[cfg(loom)]
use super::loom_canary;
use super::machine::Lifetime;
use super::Client;
use crate::core;
use crate::error::{Error, LostReason, Result};
use crate::store::FirstRead;
use std::sync::Arc;
use std::time::Duration;

/// A held lease. Valid while [`LeaseGuard::is_valid`]; released on drop
/// (in the creating process only).
pub struct LeaseGuard {
    client: Client,
    token: u64,
    ttl_ms: u64,
    renewed: bool,
    life: Arc<Lifeline>,
    /// Released or detached already: nothing left for `Drop` to do.
    released: bool,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("key", &self.key())
            .field("token", &self.token)
            .field("ttl_ms", &self.ttl_ms)
            .finish()
    }
}

impl LeaseGuard {
    /// A guard over a grant of `key` whose lifetime the acquiring machine
    /// started (the local deadline counts from the acquire's send time).
    /// The acquire marked the key held ([`Acquiring::reply`], or, for a
    /// grant that extended one of this holder's, the acquire's own store
    /// call); the guard unmarks it when it ends.
    ///
    /// [`Acquiring::reply`]: super::acquire::Acquiring::reply
    pub(crate) fn new(
        client: Client,
        key: Arc<str>,
        token: u64,
        ttl_ms: u64,
        renewed: bool,
        life: Lifetime,
    ) -> Self {
        let owner = Owner::Lease { key, token };
        LeaseGuard {
            token,
            ttl_ms,
            renewed,
            life: Lifeline::new(owner, life, client.fork_guard()),
            client,
            released: false,
        }
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.life.key()
    }

    /// The fencing token: pass it to whatever the lease protects, which
    /// should reject tokens lower than the highest it has seen.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Whether the holder already held the key and the acquire extended
    /// that grant (same token) instead of making a new one: a holder id
    /// shared between processes, like `leasehold lock acquire --holder
    /// ID`, or a grant of this client no guard manages any more (one
    /// `detach`ed, or one whose acquire was abandoned before its guard was
    /// built), which this guard now manages.
    pub fn renewed(&self) -> bool {
        self.renewed
    }

    /// The TTL renewals use.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// Whether the holder may act now: same process, not released or lost,
    /// and before the local deadline on the holder's own clock. This is the
    /// check to make before every protected action.
    pub fn is_valid(&self) -> bool {
        self.life.is_valid(self.client.local_now())
    }

    /// Time left before the local deadline (zero if not valid).
    pub fn remaining(&self) -> Duration {
        self.life.remaining(self.client.local_now())
    }

    /// The loss seen by a renewal or keep-alive, if any.
    pub fn lost(&self) -> Option<LostReason> {
        self.life.lost()
    }

    fn renew_fn(&self) -> RenewFn {
        lease_renewer(&self.client, self.key(), self.token, self.ttl_ms)
    }

    /// Renew now, extending the local deadline.
    pub fn renew(&self) -> Result<()> {
        self.life.check_usable(false)?;
        let sent_at = self.client.local_now();
        let outcome = (self.renew_fn())(self.life.deadline());
        self.life.record(sent_at, self.client.local_now(), &outcome);
        outcome.map(drop)
    }

    /// Renew in a background thread about every TTL/3; `on_lost` is called
    /// once if the lease is lost (a refused renewal, or the local deadline
    /// reached while renewals failed). [`LeaseGuard::is_valid`] turns false
    /// at the local deadline whether or not the callback has run.
    pub fn keep_alive(&self, on_lost: impl FnOnce(Error) + Send + 'static) -> Result<()> {
        self.life.check_usable(false)?;
        self.life.spawn_keep_alive(
            self.client.inner.clock.clone(),
            self.renew_fn(),
            Box::new(on_lost),
        )
    }

    /// Release the lease now and stop its keep-alive. [`Error::Lost`] when
    /// it was seen lost before (a refused renewal, the store found another
    /// holder or token, or the keep-alive or a renewal saw the local
    /// deadline pass): the work done under it may not have been protected
    /// to the end. A lease lost only at its local deadline is still
    /// released in the store by its token, in one attempt (the store may
    /// count it live a little longer), so the key is free at once and this
    /// client's next grant of it carries a new token. (If that attempt goes
    /// unanswered and the store still holds the grant, this client's next
    /// acquire of the key extends it, as for any acquire by the grant's
    /// holder: the same token, [`LeaseGuard::renewed`] true.)
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.release_inner()
    }

    /// Stop managing the lease without releasing it: it stays held in the
    /// store until its TTL runs out or someone releases it by token (what
    /// `leasehold lock acquire` does). Returns the key and the token.
    pub fn detach(mut self) -> (String, u64) {
        self.released = true;
        if self.life.fork.is_origin_strict() {
            self.life.finish();
            self.life.join();
            self.client.unmark_held(self.key(), self.token);
        }
        (self.key().to_owned(), self.token)
    }

    fn release_inner(&self) -> Result<()> {
        let ending = self.life.end_strict()?;
        #[cfg(loom)]
        let skip_join = loom_canary::naive() && ending.usable.is_ok();
        #[cfg(not(loom))]
        let skip_join = false;
        if ending.keep_alive && !skip_join {
            // Wait for the keep-alive, so that its loss callback (if it
            // saw one) has returned when release does.
            self.life.join();
        }
        // Live, or lost only at the local deadline while the store may
        // still count it live: release it by token (lost, in one attempt),
        // and tell the caller of the loss whatever the store answers.
        // Refused by the store, or ended already: nothing to release, and
        // the caller is told so. Either way the client's mark on the key
        // goes.
        let lost = ending.usable.is_err();
        let released = (self.client).end_grant(self.key(), self.token, ending.release, lost);
        ending.usable.and(released)
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // In a forked child, do nothing: the lease is the parent's.
        if !self.released && self.life.fork.is_origin_strict() {
            let _ = self.release_inner();
        }
    }
}

/// The renewal of one grant, for a keep-alive (thread or task) or a
/// renewal by hand: retried no later than the deadline it is given.
pub(crate) fn lease_renewer(client: &Client, key: &str, token: u64, ttl_ms: u64) -> RenewFn {
    let client = client.clone();
    let key = key.to_owned();
    #[cfg(loom)]
    let naive = loom_canary::naive();
    Box::new(move |deadline| {
        let id = client.inner.holder.id;
        #[cfg(loom)]
        if naive {
            let holder = client.inner.holder.clone();
            client.run("acquire", |tx| {
                core::lease::acquire(tx, &key, &holder, ttl_ms, 1)
            })?;
            return Ok(false);
        }
        client
            .run_until(
                "renew",
                Some(deadline),
                Some(FirstRead::Lease(&key)),
                |tx| core::lease::renew(tx, &key, id, token, ttl_ms),
            )
            .map(|_| false)
    })
}
