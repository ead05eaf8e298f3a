//! What the sync acquire ([`Client::acquire`]) and the tokio one
//! (`leasehold::tokio::Client::acquire`) share: the [`HolderMachine`]
//! acquiring one key, the store side of its requests ([`AcquireExec`]),
//! and what each of its events means for the caller ([`AcquireNext`]). The
//! two are thin executors of this one shape: the sync one runs the acquire
//! on the caller's thread and waits on the store's release announcements,
//! the tokio one runs it on the blocking pool and waits on a timer.

use super::machine::{
    HolderAction, HolderEvent, HolderMachine, HolderReply, HolderRequest, Lifetime,
};
use super::{Client, LeaseOptions};
use crate::core::HolderInfo;
use crate::error::{Error, Result};
use std::sync::Arc;

/// The store side of an acquire: one transaction per request (the machine
/// decides what an error means). Cheap to clone and `Send`.
#[derive(Clone)]
pub(crate) struct AcquireExec {
    client: Client,
    pub(crate) key: Arc<str>,
    ttl_ms: u64,
    limit: u32,
}

impl AcquireExec {
    /// The acquire transaction, and its answer.
    pub(crate) fn run(&self) -> HolderReply {
        let reply = self
            .client
            .try_acquire_once(&self.key, self.ttl_ms, self.limit);
        HolderReply::Acquired(reply)
    }
}

/// An acquire's answer, its grant kept only if no other guard (or leader)
/// of `client` holds that very grant ([`Client::mark_held`]). Two
/// acquires of one key through one client can both pass the client's
/// check before either grant; the store then extends the first grant for
/// the second (one holder, the same token). The one that marks it second
/// is told the key is held (by the other), and waits like any other
/// contender. Also returns the token this acquire marked: the mark passes
/// to the guard (or the term) the grant becomes, and the caller takes it
/// back if the machine did not keep the grant.
pub(crate) fn mark_grant(
    client: &Client,
    key: &Arc<str>,
    reply: HolderReply,
) -> (HolderReply, Option<u64>) {
    let HolderReply::Acquired(Ok(grant)) = reply else {
        return (reply, None);
    };
    if client.mark_held(key, grant.token) {
        let token = grant.token;
        return (HolderReply::Acquired(Ok(grant)), Some(token));
    }
    let held = Error::Held {
        key: key.to_string(),
        holders: vec![HolderInfo {
            holder: client.holder().clone(),
            token: grant.token,
            expires_at_ms: grant.expires_at_ms,
        }],
    };
    (HolderReply::Acquired(Err(held)), None)
}

/// What the executor must do next.
pub(crate) enum AcquireNext {
    /// Run [`AcquireExec::run`] and feed its reply to [`Acquiring::reply`].
    Send,
    /// The lease is ours: build the guard.
    Granted {
        token: u64,
        renewed: bool,
        life: Lifetime,
    },
    /// Held for the whole wait, or a store error retrying will not fix.
    Failed(Error),
}

/// One acquire in progress.
pub(crate) struct Acquiring {
    machine: HolderMachine,
    exec: AcquireExec,
    waits: bool,
}

impl Acquiring {
    /// Start acquiring `key` for `client` with `opts` (checked: same
    /// process, a valid key).
    pub(crate) fn new(client: &Client, key: &str, opts: &LeaseOptions) -> Result<Self> {
        let cfg = client.holder_config(key, opts)?;
        let exec = AcquireExec {
            client: client.clone(),
            key: Arc::from(key),
            ttl_ms: cfg.ttl_ms,
            limit: cfg.limit,
        };
        Ok(Acquiring {
            machine: HolderMachine::new(cfg, client.local_now()),
            waits: cfg.wait_ms > 0,
            exec,
        })
    }

    /// The store side, to run requests with.
    pub(crate) fn exec(&self) -> &AcquireExec {
        &self.exec
    }

    /// Whether it may wait for the key (a try-once acquire has nothing to
    /// listen for).
    pub(crate) fn waits(&self) -> bool {
        self.waits
    }

    /// The TTL of each grant.
    pub(crate) fn ttl_ms(&self) -> u64 {
        self.exec.ttl_ms
    }

    /// What to do next; `None` when waiting ([`Acquiring::wait_ms`]).
    pub(crate) fn next(&mut self) -> Option<AcquireNext> {
        while let Some(action) = self.machine.poll_action() {
            match action {
                HolderAction::Send(HolderRequest::Acquire) => return Some(AcquireNext::Send),
                HolderAction::Event(HolderEvent::Granted { token, renewed }) => {
                    return Some(match self.machine.lifetime() {
                        Some(life) => AcquireNext::Granted {
                            token,
                            renewed,
                            life: life.clone(),
                        },
                        None => {
                            self.exec.client.unmark_held(&self.exec.key, token);
                            AcquireNext::Failed(Error::store(
                                "acquiring",
                                "granted without a lifetime",
                            ))
                        }
                    });
                }
                HolderAction::Event(HolderEvent::GaveUp(e) | HolderEvent::Failed(e)) => {
                    return Some(AcquireNext::Failed(e))
                }
                HolderAction::Event(_) | HolderAction::Send(_) => {}
            }
        }
        None
    }

    /// The store answered ([`mark_grant`]: a kept grant's mark passes to
    /// the guard built from the [`AcquireNext::Granted`] it yields).
    pub(crate) fn reply(&mut self, reply: HolderReply) {
        let now = self.exec.client.local_now();
        let (reply, marked) = mark_grant(&self.exec.client, &self.exec.key, reply);
        self.machine.handle_reply(now, reply);
        if let Some(token) = marked.filter(|_| self.machine.lifetime().is_none()) {
            // The machine was not waiting for this grant: no guard comes.
            self.exec.client.unmark_held(&self.exec.key, token);
        }
    }

    /// How long to wait (local ms) before [`Acquiring::timeout`], unless a
    /// release is announced first ([`Acquiring::wake`]).
    pub(crate) fn wait_ms(&self) -> u64 {
        let now = self.exec.client.local_now();
        self.machine
            .poll_timeout()
            .unwrap_or(now)
            .saturating_sub(now)
    }

    /// The wait ran out.
    pub(crate) fn timeout(&mut self) {
        let now = self.exec.client.local_now();
        self.machine.handle_timeout(now);
    }

    /// The store announced a release: try again at once.
    pub(crate) fn wake(&mut self) {
        let now = self.exec.client.local_now();
        self.machine.handle_wake(now);
    }
}
