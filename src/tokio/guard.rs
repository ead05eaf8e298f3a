//! [`LeaseGuard`]: a held lease whose keep-alive is a tokio task, and that
//! task ([`keep_alive`]), shared with claimed jobs.
//!
//! The task follows [`Lifeline::step`], the decision the sync keep-alive
//! thread follows too: sleep until the next renewal or the deadline, renew
//! on the blocking pool, record the answer. At the local deadline it
//! declares the loss even while a renewal is in flight, then waits for
//! that renewal to return before it ends, so that a release that awaited
//! the task never races a renewal.

use super::{joined, nap, CancellationToken, Client};
use crate::client::guard::lease_renewer;
use crate::client::lifeline::{Lifeline, OnLost, Owner, RenewFn, Step};
use crate::client::machine::Lifetime;
use crate::clock::Clock;
use crate::error::{Error, LostReason, Result};
use crate::time::LocalMs;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Start the keep-alive task of `line` (none if one runs or the grant
/// has ended); `on_lost` runs once if the grant is lost.
pub(crate) fn keep_alive(
    line: &Arc<Lifeline>,
    clock: Arc<dyn Clock>,
    renew: RenewFn,
    on_lost: OnLost,
) -> Option<JoinHandle<()>> {
    if !line.arm(on_lost, true) {
        return None;
    }
    Some(tokio::spawn(run_keep_alive(line.clone(), clock, renew)))
}

/// Marks the keep-alive ended however the task ends (returned, aborted,
/// dropped with its runtime).
struct Disarm(Arc<Lifeline>);

impl Drop for Disarm {
    fn drop(&mut self) {
        self.0.disarm();
    }
}

async fn run_keep_alive(line: Arc<Lifeline>, clock: Arc<dyn Clock>, renew: RenewFn) {
    let _disarm = Disarm(line.clone());
    let mut renew = Some(renew);
    loop {
        let now = LocalMs::read(&*clock);
        match line.step(now) {
            Step::Stop => return,
            Step::SleepUntil(until) => {
                tokio::select! {
                    _ = nap(until.saturating_sub(now)) => {}
                    _ = line.notify.notified() => {}
                }
            }
            Step::Renew { sent_at, deadline } => {
                let outcome = match renew.take() {
                    Some(f) => {
                        let (f, outcome) = renew_before(&line, &*clock, f, deadline).await;
                        renew = f;
                        outcome
                    }
                    None => Err(Error::store("renewing", "an earlier renewal panicked")),
                };
                line.record(sent_at, LocalMs::read(&*clock), &outcome);
            }
        }
    }
}

/// One renewal on the blocking pool; at `deadline` the loss is declared
/// (the step function does it) while the renewal is still awaited.
async fn renew_before(
    line: &Lifeline,
    clock: &dyn Clock,
    mut f: RenewFn,
    deadline: LocalMs,
) -> (Option<RenewFn>, Result<bool>) {
    let mut call = tokio::task::spawn_blocking(move || {
        let outcome = f(deadline);
        (f, outcome)
    });
    let joined = tokio::select! {
        joined = &mut call => joined,
        _ = nap(deadline.saturating_sub(LocalMs::read(clock))) => {
            line.step(LocalMs::read(clock));
            call.await
        }
    };
    match joined {
        Ok((f, outcome)) => (Some(f), outcome),
        Err(e) => (None, Err(Error::store("renewing", e.to_string()))),
    }
}

/// A held lease (async). Valid while [`LeaseGuard::is_valid`]; its
/// keep-alive task renews it about every third of the TTL from the
/// acquire on. [`LeaseGuard::release`] it when done; a guard dropped
/// unreleased is released by a task in the background.
pub struct LeaseGuard {
    client: Client,
    key: Arc<str>,
    token: u64,
    ttl_ms: u64,
    renewed: bool,
    life: Arc<Lifeline>,
    lost: CancellationToken,
    task: Option<JoinHandle<()>>,
    /// Released or detached: nothing left for drop.
    done: bool,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("tokio::LeaseGuard")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("ttl_ms", &self.ttl_ms)
            .finish()
    }
}

impl LeaseGuard {
    /// The guard of a grant the acquiring machine started `life` for, its
    /// keep-alive running. The acquire marked the key held
    /// (`Acquiring::reply`, or, for a grant that extended one of this
    /// holder's, the acquire's own store call); the guard unmarks it when
    /// it ends.
    pub(crate) fn start(
        client: &Client,
        key: Arc<str>,
        token: u64,
        ttl_ms: u64,
        renewed: bool,
        life: Lifetime,
    ) -> LeaseGuard {
        let owner = Owner::Lease {
            key: key.clone(),
            token,
        };
        let line = Lifeline::new(owner, life, client.sync.fork_guard());
        let lost = CancellationToken::new();
        let on_lost = {
            let lost = lost.clone();
            Box::new(move |_| lost.cancel())
        };
        let renew = lease_renewer(&client.sync, &key, token, ttl_ms);
        let task = keep_alive(&line, client.sync.clock().clone(), renew, on_lost);
        LeaseGuard {
            client: client.clone(),
            key,
            token,
            ttl_ms,
            renewed,
            life: line,
            lost,
            task,
            done: false,
        }
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token: pass it to whatever the lease protects.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Whether the acquire extended this holder's own grant (same token);
    /// see [`crate::LeaseGuard::renewed`].
    pub fn renewed(&self) -> bool {
        self.renewed
    }

    /// The TTL renewals use.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// Whether the holder may act now (same process, not released or lost,
    /// before the local deadline). Check it before every protected action.
    pub fn is_valid(&self) -> bool {
        self.life.is_valid(self.client.local_now())
    }

    /// Time left before the local deadline (zero if not valid).
    pub fn remaining(&self) -> Duration {
        self.life.remaining(self.client.local_now())
    }

    /// The loss seen so far, if any.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.life.lost()
    }

    /// Resolves when the lease is lost (a refused renewal, or the local
    /// deadline reached while renewals failed), with the reason; never
    /// while the lease holds.
    pub async fn lost(&self) -> LostReason {
        self.lost.cancelled().await;
        self.life.lost().unwrap_or(LostReason::LocalDeadline)
    }

    /// A token cancelled when the lease is lost: give it to the work the
    /// lease protects, which `select!`s on `cancelled()`. Cancelling it
    /// yourself touches only your copy.
    pub fn cancellation(&self) -> CancellationToken {
        self.lost.child_token()
    }

    /// Renew now (besides the keep-alive's schedule).
    pub async fn renew(&self) -> Result<()> {
        self.life.check_usable(false)?;
        let sent_at = self.client.local_now();
        let renew = lease_renewer(&self.client.sync, &self.key, self.token, self.ttl_ms);
        let deadline = self.life.deadline();
        let outcome = super::on_store(self.client.inline(), move || {
            let mut renew = renew;
            renew(deadline)
        })
        .await;
        self.life.record(sent_at, self.client.local_now(), &outcome);
        outcome.map(drop)
    }

    /// Stop the keep-alive, wait for it to end, then release the lease.
    /// [`Error::Lost`] when it was seen lost before (a refused renewal, the
    /// store found another holder or token, or the keep-alive or a renewal
    /// saw the local deadline pass): the work done under it may not have
    /// been protected to the end. A lease lost only at its local deadline
    /// is still released in the store by its token, in one attempt, as
    /// [`crate::LeaseGuard::release`] does.
    /// The ending runs as a task of its own: if this future is dropped
    /// half-way (a `timeout` around it), the lease is still released and
    /// this client's next acquire of the key still asks the store.
    pub async fn release(mut self) -> Result<()> {
        let ending = self.life.end_strict()?;
        self.done = true;
        let ending = self.end(
            &tokio::runtime::Handle::current(),
            ending.release,
            ending.usable,
        );
        joined(ending).await
    }

    /// Stop managing the lease without releasing it (it stays held until
    /// its TTL runs out); returns the key and the token.
    pub async fn detach(mut self) -> (String, u64) {
        self.done = true;
        if self.life.fork.is_origin_strict() {
            self.life.finish();
            let ending = self.end(&tokio::runtime::Handle::current(), false, Ok(()));
            let _ = joined(ending).await;
        }
        (self.key.to_string(), self.token)
    }

    /// Wait for the keep-alive, release the grant by token if `release`
    /// says to, then take back this client's mark on the key
    /// (`Client::end_grant`): spawned on
    /// `rt`, so it runs to its end whoever waits for it. `usable`: the
    /// loss already known, reported whatever the release answers (a lost
    /// grant's release is tried once).
    fn end(
        &mut self,
        rt: &tokio::runtime::Handle,
        release: bool,
        usable: Result<()>,
    ) -> JoinHandle<Result<()>> {
        let (client, key, token) = (self.client.clone(), self.key.clone(), self.token);
        let task = self.task.take();
        rt.spawn(async move {
            if let Some(task) = task {
                let _ = task.await;
            }
            // As the sync guard's end (`Client::end_grant`).
            let released = if release {
                let lost = usable.is_err();
                client
                    .call(move |c| c.end_grant(&key, token, true, lost))
                    .await
            } else {
                client.sync.end_grant(&key, token, false, false)
            };
            usable.and(released)
        })
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // In a forked child, do nothing: the lease is the parent's.
        if self.done || !self.life.fork.is_origin_strict() {
            return;
        }
        let Ok(ending) = self.life.end_strict() else {
            return;
        };
        let live = ending.release;
        let token = self.token;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(self.end(&rt, live, ending.usable)),
            // No runtime (dropped outside one): the task is gone with its
            // runtime already; release here.
            Err(_) => {
                let lost = ending.usable.is_err();
                let _ = self.client.sync.end_grant(&self.key, token, live, lost);
            }
        }
    }
}
