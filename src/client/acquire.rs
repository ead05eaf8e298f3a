//! The sync acquire ([`Client::acquire`], and the client's record of the
//! grants its guards and leaders hold), and what it and the tokio one
//! (`leasehold::tokio::Client::acquire`) share: the [`HolderMachine`]
//! acquiring one key, the store side of its requests ([`AcquireExec`]),
//! and what each of its events means for the caller ([`AcquireNext`]). The
//! two are thin executors of this one shape: the sync one runs the acquire
//! on the caller's thread and waits on the store's release announcements,
//! the tokio one runs it on the blocking pool and waits on a timer.

use super::machine::{
    HolderAction, HolderConfig, HolderEvent, HolderMachine, HolderReply, HolderRequest, Lifetime,
};
use super::{ms_of, Client, LeaseGuard, LeaseOptions};
use crate::core::{self, HolderInfo, Wake};
use crate::error::{Error, Field, Result};
use crate::sync::{lock, Ordering};
use hashbrown::hash_map::Entry;
use std::sync::Arc;
use std::time::Duration;

/// The keys a client's guards and leaders hold, and the grants its
/// acquires claimed by extension. (foldhash: hashed three times a pair.)
#[derive(Default)]
pub(crate) struct HeldKeys {
    /// Each key held through a live guard (or leader), with its grant's
    /// token.
    pub(crate) live: hashbrown::HashMap<Arc<str>, u64>,
    /// Each key whose last grant claimed by extension
    /// ([`Client::claim_extended`]) had this token: the acquire whose new
    /// grant it was may get its answer only after that claim, even after
    /// the claimer gave the grant back, and must not build on it
    /// ([`Client::mark_held`]). Forgotten when the claim ends without a
    /// release ([`Client::unmark_unreleased`]: the grant is still live, and
    /// that answer may build on it). One entry per key that met such a
    /// race (rare: two acquires of one key through one client at once, or
    /// a release left unanswered), kept otherwise for the client's life.
    extended: hashbrown::HashMap<Arc<str>, u64>,
}

impl Client {
    /// Try once to acquire `key`; [`Error::Held`] if it is taken.
    pub fn try_acquire(&self, key: &str, ttl: Duration) -> Result<LeaseGuard> {
        self.acquire(key, LeaseOptions::new(ttl))
    }

    /// Acquire `key`, waiting up to `opts.wait` (jittered backoff, woken
    /// early when the store sees a release: the holder machine). While a
    /// guard of this client holds the key, another acquire through this
    /// client waits like any other contender (two guards never share one
    /// grant). Transient store errors are retried until the busy timeout.
    pub fn acquire(&self, key: &str, opts: LeaseOptions) -> Result<LeaseGuard> {
        let mut acquiring = Acquiring::new(self, key, &opts)?;
        let store = &self.inner.store;
        loop {
            // A try-once acquire never waits: no epoch to read.
            let epoch = if acquiring.waits() {
                store.epoch(Wake::LeaseFreed)
            } else {
                0
            };
            while let Some(next) = acquiring.next() {
                match next {
                    AcquireNext::Send => {
                        let reply = acquiring.exec().run().take();
                        acquiring.reply(reply);
                    }
                    AcquireNext::Granted {
                        token,
                        renewed,
                        life,
                    } => {
                        let ttl_ms = acquiring.ttl_ms();
                        let AcquireExec { client, key, .. } = acquiring.into_exec();
                        return Ok(LeaseGuard::new(client, key, token, ttl_ms, renewed, life));
                    }
                    AcquireNext::Failed(e) => return Err(e),
                }
            }
            let wait = Duration::from_millis(acquiring.wait_ms());
            // A try-once acquire waits only out a retry's backoff: with no
            // epoch of its own, any release would look like a wake-up.
            let woke = !wait.is_zero()
                && if acquiring.waits() {
                    store.wait_epoch(Wake::LeaseFreed, epoch, wait)
                } else {
                    crate::sync::sleep(wait);
                    false
                };
            if woke {
                acquiring.wake();
            } else {
                acquiring.timeout();
            }
        }
    }

    /// The holder machine's configuration for acquiring `key` with `opts`
    /// (checked: same process, a valid key).
    pub(crate) fn holder_config(&self, key: &str, opts: &LeaseOptions) -> Result<HolderConfig> {
        self.inner.fork.check()?;
        core::check_key(Field::Key, key)?;
        Ok(HolderConfig {
            ttl_ms: ms_of(opts.ttl),
            limit: opts.limit,
            wait_ms: ms_of(opts.wait),
            drift: self.inner.drift,
            keep_alive: true,
            seed: self.jitter(u64::MAX),
            busy_ms: ms_of(self.inner.busy_timeout),
        })
    }

    /// Record that a guard (or a leader) of this client holds `key` with
    /// the new grant `token`; if this answer may not build one, `Err` with
    /// the token of the grant this client holds the key with, if any.
    /// Two acquires of one key through one client can both pass the check
    /// before either grant, and the store extends the first grant for the
    /// second (one holder, the same token): the second marks it as it
    /// gets it ([`Client::claim_extended`]), the first here, and only the
    /// first of the two to mark it may build a guard. So `Err` when:
    /// - the key is marked with this grant (another guard holds it);
    /// - the key is marked with a later grant: the store made that one
    ///   for this holder, so this one, answered late, is no longer live;
    /// - this grant was claimed by extension: its claimer may have given
    ///   it back since, unmarking it (two leaders of one client, seconds
    ///   apart, before this rule).
    ///
    /// A mark of an earlier grant is replaced (the store made this one, so
    /// the recorded one is no longer live). The map shares the guard's key
    /// (no copy per grant).
    pub(crate) fn mark_held(&self, key: &Arc<str>, token: u64) -> Result<(), Option<u64>> {
        let mut held = lock(&self.inner.held);
        if !held.extended.is_empty() && held.extended.get(key) == Some(&token) {
            return Err(held.live.get(key).copied());
        }
        // (One lookup: this is on every acquire's way.)
        match held.live.entry(key.clone()) {
            Entry::Occupied(marked) if *marked.get() >= token => return Err(Some(*marked.get())),
            Entry::Occupied(mut marked) => {
                marked.insert(token);
            }
            Entry::Vacant(free) => {
                free.insert(token);
            }
        }
        self.count_held(held.live.len());
        Ok(())
    }

    /// The guard (or leader) of grant `token` of `key` ended: take back
    /// its record, unless a later grant replaced it.
    pub(crate) fn unmark_held(&self, key: &str, token: u64) {
        let mut held = lock(&self.inner.held);
        self.unmark_locked(&mut held, key, token);
    }

    fn unmark_locked(&self, held: &mut HeldKeys, key: &str, token: u64) {
        if let Some((key, later)) = held.live.remove_entry(key) {
            if later != token {
                held.live.insert(key, later);
            }
        }
        self.count_held(held.live.len());
    }

    /// Take back the mark of grant `token` of `key` that no guard (or
    /// leader) came of and that nobody released: the grant is still live
    /// in the store. If it was claimed by extension, forget that too: an
    /// acquire whose new grant it was may still get its answer, and may
    /// build on it (refused, the slot would be left to run out).
    pub(crate) fn unmark_unreleased(&self, key: &str, token: u64) {
        let mut held = lock(&self.inner.held);
        self.unmark_locked(&mut held, key, token);
        if held.extended.get(key) == Some(&token) {
            held.extended.remove(key);
        }
    }

    /// Whether a guard (or leader) of this client holds any key: when
    /// none does, an acquire's check needs no lock. (A mark racing the
    /// check is the race two acquires of one key through one client
    /// always have: [`Client::mark_held`] settles it.)
    pub(crate) fn holds_any(&self) -> bool {
        self.inner.held_count.load(Ordering::Acquire) > 0
    }

    /// Record the held map's size (under its lock).
    /// A grant that extended a slot this holder already had in the store:
    /// held by another guard (or leader) of this client, which the key's
    /// mark says (refused: `Held`, as a contender); or left by one that
    /// ended with its release unanswered (the grant is live: kept,
    /// `renewed`); or left by one whose release committed after this
    /// acquire extended the slot (the slot is gone: `None`, try again).
    /// The last two are told apart by the store, after the key is marked
    /// for this grant: from then on no guard of this client that marks the
    /// key can release the slot between the look and the guard. Without
    /// this, the grant of a slot released meanwhile became a guard of
    /// nothing while the next acquire made a new grant: two guards of one
    /// client at once (tests/tokio, PostgreSQL). A sibling acquire whose
    /// new grant this one extended gets its answer only later: the claim
    /// is remembered, and that answer refused ([`Client::mark_held`]).
    /// Left open: a release by token from outside the guards
    /// (`Client::release`, `leasehold lock release`).
    pub(super) fn claim_extended(
        &self,
        key: &str,
        grant: core::Grant,
    ) -> Result<Option<core::Grant>> {
        let me = self.inner.holder.id;
        let key: Arc<str> = Arc::from(key);
        {
            let mut held = lock(&self.inner.held);
            if let Some(&token) = held.live.get(&key) {
                drop(held);
                return Err(self.held_here(&key, token, grant.expires_at_ms));
            }
            held.live.insert(key.clone(), grant.token);
            held.extended.insert(key.clone(), grant.token);
            self.count_held(held.live.len());
        }
        // Taken back unless the grant is live, a panic in the store
        // included (left, the mark would refuse every later acquire of
        // the key through this client).
        let mark = Marked {
            client: self,
            key: &key,
            token: grant.token,
        };
        let live = self.inspect(&key).map(|info| {
            info.holders
                .iter()
                .any(|h| h.holder.id == me && h.token == grant.token)
        });
        match live {
            Ok(true) => {
                std::mem::forget(mark);
                Ok(Some(grant))
            }
            Ok(false) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The refusal an acquire meets when a guard (or leader) of this
    /// client holds `key` with grant `token`.
    fn held_here(&self, key: &str, token: u64, expires_at_ms: u64) -> Error {
        Error::Held {
            key: key.to_owned(),
            holders: vec![HolderInfo {
                holder: self.holder().clone(),
                token,
                expires_at_ms,
            }],
        }
    }

    fn count_held(&self, len: usize) {
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        self.inner.held_count.store(len, Ordering::Release);
    }
}

/// A mark [`Client::claim_extended`] made, taken back when dropped.
struct Marked<'a> {
    client: &'a Client,
    key: &'a str,
    token: u64,
}

impl Drop for Marked<'_> {
    fn drop(&mut self) {
        self.client.unmark_held(self.key, self.token);
    }
}

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
    pub(crate) fn run(&self) -> Answer {
        let reply = self
            .client
            .try_acquire_once(&self.key, self.ttl_ms, self.limit);
        Answer {
            reply: Some(HolderReply::Acquired(reply)),
            client: self.client.clone(),
            key: self.key.clone(),
        }
    }
}

/// An acquire's answer on its way to the machine ([`Answer::take`]). A
/// grant the acquire marked itself (one that extended a slot of this
/// holder: [`Client::claim_extended`]) is unmarked if the answer is
/// dropped unread: a tokio acquire cancelled while its store call ran
/// would otherwise leave the key marked, and this client refused the key
/// until that slot ran out in the store.
pub(crate) struct Answer {
    reply: Option<HolderReply>,
    client: Client,
    key: Arc<str>,
}

impl Answer {
    /// The reply, for [`Acquiring::reply`].
    pub(crate) fn take(mut self) -> HolderReply {
        self.reply.take().unwrap_or_else(|| {
            HolderReply::Acquired(Err(Error::store(
                "acquiring",
                "the answer was already taken",
            )))
        })
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(HolderReply::Acquired(Ok(grant))) = &self.reply {
            if grant.renewed {
                self.client.unmark_unreleased(&self.key, grant.token);
            }
        }
    }
}

/// An acquire's answer, a new grant kept only if no other guard (or
/// leader) of `client` holds that very grant ([`Client::mark_held`]); a
/// grant that extended one of this holder's was marked (or refused) by
/// the acquire itself ([`Client::claim_extended`]). Two acquires of one
/// key through one client can both pass the client's check before either
/// grant; the store then extends the first grant for the second (one
/// holder, the same token). The one that marks it second is told the key
/// is held (by the other), and waits like any other contender. Also
/// returns the token this acquire marked: the mark passes to the guard
/// (or the term) the grant becomes, and the caller takes it back if the
/// machine did not keep the grant.
pub(crate) fn mark_grant(
    client: &Client,
    key: &Arc<str>,
    reply: HolderReply,
) -> (HolderReply, Option<u64>) {
    let HolderReply::Acquired(Ok(grant)) = reply else {
        return (reply, None);
    };
    if grant.renewed {
        // Marked by the acquire itself (`Client::claim_extended`).
        let token = grant.token;
        return (HolderReply::Acquired(Ok(grant)), Some(token));
    }
    match client.mark_held(key, grant.token) {
        Ok(()) => {
            let token = grant.token;
            (HolderReply::Acquired(Ok(grant)), Some(token))
        }
        // Refused, and a sibling holds the key: name the sibling's grant,
        // not this late one, which may never have been live as a guard
        // or a term. (With this answer's expiry, approximate: the
        // sibling's is not kept here.)
        Err(Some(token)) => {
            let held = client.held_here(key, token, grant.expires_at_ms);
            (HolderReply::Acquired(Err(held)), None)
        }
        // Refused, and nobody here holds the key: a sibling claimed this
        // grant and gave it back. Ask the store again (a retry): the key
        // may be free, or held by a new grant.
        Err(None) => {
            let again = Error::transient(
                format!("acquiring {key:?}"),
                format!(
                    "grant {} was given back by another acquire of this client before this one's answer came",
                    grant.token
                ),
            );
            (HolderReply::Acquired(Err(again)), None)
        }
    }
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

    /// The store side, given up once the grant is built (its client and
    /// key move into the guard: no count to raise and drop again).
    pub(crate) fn into_exec(self) -> AcquireExec {
        self.exec
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
                            self.exec.client.unmark_unreleased(&self.exec.key, token);
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
        let (reply, marked) = mark_grant(&self.exec.client, &self.exec.key, reply);
        let client = &self.exec.client;
        self.machine.handle_reply(|| client.local_now(), reply);
        if let Some(token) = marked.filter(|_| self.machine.lifetime().is_none()) {
            // The machine was not waiting for this grant: no guard comes.
            self.exec.client.unmark_unreleased(&self.exec.key, token);
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
