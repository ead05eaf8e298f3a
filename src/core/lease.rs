//! Lease rules (L1, L2, L4, L5) and the holder's local deadline (L3).
//!
//! See the [module docs of `core`](super) for the state, transitions and
//! invariants. Each operation validates, decides on a read-only view of the
//! record, and only then mutates it.

use super::{
    check_key, expiry_ms, Event, Holder, HolderId, HolderInfo, LeaseChange, Txn, Wake,
    MAX_LEASE_LIMIT,
};
use crate::error::Field;
use crate::error::{Error, LostReason, Result, Target};
use std::sync::Arc;

/// The stored state of one key. It is created by the first grant and never
/// deleted, so `last_token` outlives every lease on the key (L2).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The highest token ever granted for this key.
    pub last_token: u64,
    /// How many holders the key allows, fixed by the grant that found it
    /// free and kept while it has live holders (0: not recorded yet).
    pub limit: u32,
    /// Holder slots; some may have expired since the last write.
    pub slots: Vec<LeaseSlot>,
}

impl Clone for LeaseRecord {
    fn clone(&self) -> Self {
        LeaseRecord {
            last_token: self.last_token,
            limit: self.limit,
            slots: self.slots.clone(),
        }
    }

    /// Reuses `self`'s slot buffer (the derived version would allocate a
    /// new one): stores keep undo copies of records this way on every
    /// transaction.
    fn clone_from(&mut self, source: &Self) {
        self.last_token = source.last_token;
        self.limit = source.limit;
        self.slots.clone_from(&source.slots);
    }
}

/// One holder's grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSlot {
    /// Who holds it.
    pub holder: Holder,
    /// Its fencing token.
    pub token: u64,
    /// First instant (store clock, ms) at which the slot is expired.
    pub expires_at_ms: u64,
}

impl LeaseSlot {
    /// Whether the slot is live at `now_ms`. Expiry is exclusive: at
    /// `expires_at_ms` the slot is already expired.
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
    }

    fn info(&self) -> HolderInfo {
        HolderInfo {
            holder: self.holder.clone(),
            token: self.token,
            expires_at_ms: self.expires_at_ms,
        }
    }
}

impl LeaseRecord {
    /// Live holders at `now_ms`, in grant order.
    pub fn live(&self, now_ms: u64) -> impl Iterator<Item = &LeaseSlot> + '_ {
        self.slots.iter().filter(move |s| s.is_live(now_ms))
    }

    fn live_infos(&self, now_ms: u64) -> Vec<HolderInfo> {
        self.live(now_ms).map(LeaseSlot::info).collect()
    }

    /// Why `holder`/`token` does not name a live slot (used for every
    /// refused renew and release, after `position` found none): the token's
    /// slot is someone else's, or it is ours and has expired (a live one
    /// would have been found), or it is gone.
    fn lost_reason(&self, holder: HolderId, token: u64) -> LostReason {
        match self.slots.iter().find(|s| s.token == token) {
            Some(s) if s.holder.id != holder => LostReason::NotHolder,
            Some(_) => LostReason::Expired,
            None => LostReason::StaleToken,
        }
    }

    fn position(&self, holder: HolderId, token: u64, now_ms: u64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.holder.id == holder && s.token == token && s.is_live(now_ms))
    }
}

/// A successful acquire or renew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The fencing token (unchanged by renewals).
    pub token: u64,
    /// When the grant expires on the store's clock.
    pub expires_at_ms: u64,
    /// The store's clock when it was granted.
    pub granted_at_ms: u64,
    /// True if the holder already held the key and this call extended it.
    pub renewed: bool,
}

/// Live holders of a key and its token counter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseInfo {
    /// The highest token ever granted for the key (0 if never).
    pub last_token: u64,
    /// How many holders the key allows (0: unknown; see [`LeaseRecord::limit`]).
    pub limit: u32,
    /// Live holders at the store's `now_ms`.
    pub holders: Vec<HolderInfo>,
    /// The store's clock at the time of the inspection.
    pub now_ms: u64,
}

fn check_limit(limit: u32) -> Result<()> {
    if limit == 0 || limit > MAX_LEASE_LIMIT {
        return Err(Error::invalid(
            Field::Limit,
            format!("{limit} is outside 1..={MAX_LEASE_LIMIT}"),
        ));
    }
    Ok(())
}

fn lost(key: &str, token: u64, reason: LostReason) -> Error {
    Error::Lost {
        target: Target::Lease {
            key: key.to_owned(),
            token,
        },
        reason,
    }
}

/// Low bits of a token that count grants within one generation of a
/// store's history; a promotion starts the next generation (see
/// [`promoted_floor`]).
pub const GENERATION_SHIFT: u32 = 44;

/// The token floor ([`Txn::token_floor`]) of a store whose history may
/// have gone back (a standby promoted after asynchronous replication,
/// which can lose the last grants of the old primary): the start of the
/// next generation. Every token the old history granted is below it, as
/// long as no key or job was granted 2^44 (about 1.8e13) tokens in one
/// generation, which at 100,000 grants a second of one key takes 5.5
/// years. Saturates at the last generation.
pub fn promoted_floor(floor: u64) -> u64 {
    let last = u64::MAX >> GENERATION_SHIFT;
    ((floor >> GENERATION_SHIFT) + 1).min(last) << GENERATION_SHIFT
}

/// Try to acquire `key` for `holder` for `ttl_ms`, allowing up to `limit`
/// holders at once. A holder that already holds the key gets its slot
/// extended (never shortened) with the same token (no self-deadlock, and a
/// safe retry after an ambiguous commit).
///
/// The limit is the key's, not the caller's: the grant that finds the key
/// free fixes it, and while the key has live holders a different limit is
/// refused ([`Error::Invalid`] naming both), so "limit 2" never becomes
/// three holders because a third caller asked for 3.
pub fn acquire(
    tx: &mut dyn Txn,
    key: &str,
    holder: &Holder,
    ttl_ms: u64,
    limit: u32,
) -> Result<Grant> {
    check_key(Field::Key, key)?;
    check_limit(limit)?;
    let now_ms = tx.now_ms();
    let floor = tx.token_floor();
    let expires_at_ms = expiry_ms(Field::Ttl, now_ms, ttl_ms)?;
    let rec = tx
        .lease_mut(key, true)?
        .ok_or_else(|| Error::store(format!("acquiring {key:?}"), "record was not created"))?;
    let live = rec.live(now_ms).count();
    if live > 0 && rec.limit != 0 && rec.limit != limit {
        return Err(Error::invalid(
            Field::Limit,
            format!(
                "{key:?} allows {} holder(s) and has {live}; a different limit ({limit}) is refused while it has holders",
                rec.limit
            ),
        ));
    }
    if let Some(grant) = extend_own(rec, holder, now_ms, expires_at_ms) {
        note(
            tx,
            key,
            holder.id,
            grant.token,
            LeaseChange::Renewed { ttl_ms },
        );
        return Ok(grant);
    }
    if live >= limit as usize {
        return Err(Error::Held {
            key: key.to_owned(),
            holders: rec.live_infos(now_ms),
        });
    }
    // Above the key's last token and the store's floor (a store whose
    // history went back may have granted tokens it no longer records).
    let token = rec
        .last_token
        .max(floor)
        .checked_add(1)
        .ok_or_else(|| Error::store(format!("acquiring {key:?}"), "token counter exhausted"))?;
    let expired = prune(rec, now_ms);
    rec.last_token = token;
    rec.limit = limit;
    rec.slots.push(LeaseSlot {
        holder: holder.clone(),
        token,
        expires_at_ms,
    });
    note_expired(tx, key, expired);
    note(tx, key, holder.id, token, LeaseChange::Granted { ttl_ms });
    Ok(Grant {
        token,
        expires_at_ms,
        granted_at_ms: now_ms,
        renewed: false,
    })
}

/// An acquire by a holder that already holds the key extends its own
/// live slot (same token), never shortening it: an earlier grant's holder
/// may rely on its expiry.
fn extend_own(
    rec: &mut LeaseRecord,
    holder: &Holder,
    now_ms: u64,
    expires_at_ms: u64,
) -> Option<Grant> {
    let slot = rec
        .slots
        .iter_mut()
        .find(|s| s.holder.id == holder.id && s.is_live(now_ms))?;
    slot.expires_at_ms = slot.expires_at_ms.max(expires_at_ms);
    slot.holder.label.clone_from(&holder.label);
    Some(Grant {
        token: slot.token,
        expires_at_ms: slot.expires_at_ms,
        granted_at_ms: now_ms,
        renewed: true,
    })
}

/// Extend the live slot named by `holder` and `token` to `now + ttl_ms`
/// (never shortening it). An expired slot is not revived: the holder must
/// acquire again and gets a new token.
pub fn renew(
    tx: &mut dyn Txn,
    key: &str,
    holder: HolderId,
    token: u64,
    ttl_ms: u64,
) -> Result<Grant> {
    check_key(Field::Key, key)?;
    let now_ms = tx.now_ms();
    let expires_at_ms = expiry_ms(Field::Ttl, now_ms, ttl_ms)?;
    let Some(rec) = tx.lease_mut(key, false)? else {
        return Err(lost(key, token, LostReason::StaleToken));
    };
    let Some(i) = rec.position(holder, token, now_ms) else {
        return Err(lost(key, token, rec.lost_reason(holder, token)));
    };
    // Never shorten: the holder's earlier local deadline relies on it.
    let slot = &mut rec.slots[i];
    slot.expires_at_ms = slot.expires_at_ms.max(expires_at_ms);
    let grant = Grant {
        token,
        expires_at_ms: slot.expires_at_ms,
        granted_at_ms: now_ms,
        renewed: true,
    };
    note(tx, key, holder, token, LeaseChange::Renewed { ttl_ms });
    Ok(grant)
}

/// Remove the slots expired at `now_ms`; returns them.
fn prune(rec: &mut LeaseRecord, now_ms: u64) -> Vec<LeaseSlot> {
    let mut expired = Vec::new();
    rec.slots.retain(|s| {
        let live = s.is_live(now_ms);
        if !live {
            expired.push(s.clone());
        }
        live
    });
    expired
}

/// Record that `holder`'s slot `token` of `key` made the transition `change`.
fn note(tx: &mut dyn Txn, key: &str, holder: HolderId, token: u64, change: LeaseChange) {
    let journal = tx.journal();
    if !journal.is_recording() {
        return;
    }
    journal.note(Event::Lease {
        key: Arc::from(key),
        holder,
        token,
        change,
    });
}

fn note_expired(tx: &mut dyn Txn, key: &str, expired: Vec<LeaseSlot>) {
    for slot in expired {
        note(tx, key, slot.holder.id, slot.token, LeaseChange::Expired);
    }
}

/// Release the live slot named by `holder` and `token`.
pub fn release(tx: &mut dyn Txn, key: &str, holder: HolderId, token: u64) -> Result<()> {
    check_key(Field::Key, key)?;
    let now_ms = tx.now_ms();
    let Some(rec) = tx.lease_mut(key, false)? else {
        return Err(lost(key, token, LostReason::StaleToken));
    };
    let Some(i) = rec.position(holder, token, now_ms) else {
        return Err(lost(key, token, rec.lost_reason(holder, token)));
    };
    rec.slots.remove(i);
    let expired = prune(rec, now_ms);
    tx.journal().wake(Wake::LeaseFreed);
    note_expired(tx, key, expired);
    note(tx, key, holder, token, LeaseChange::Released);
    Ok(())
}

/// The live holders of `key` and its token counter; changes nothing.
pub fn inspect(tx: &mut dyn Txn, key: &str) -> Result<LeaseInfo> {
    check_key(Field::Key, key)?;
    let now_ms = tx.now_ms();
    Ok(match tx.lease_mut(key, false)? {
        Some(rec) => LeaseInfo {
            last_token: rec.last_token,
            limit: rec.limit,
            holders: rec.live_infos(now_ms),
            now_ms,
        },
        None => LeaseInfo {
            now_ms,
            ..LeaseInfo::default()
        },
    })
}

/// One page of held keys ([`list`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeasePage {
    /// Keys with live holders, in key order, each with what [`inspect`]
    /// would say of it.
    pub leases: Vec<(String, LeaseInfo)>,
    /// Where the next page starts (pass it as `after`); `None` once the
    /// last record was read.
    pub next: Option<String>,
}

/// The keys that have live holders at the store's `now_ms`, among up to
/// `limit` records after `after` (`""`: from the first); changes nothing.
///
/// Expiry is lazy: a record may keep slots that expired until its key is
/// used again, so the store hands over records with any slot and this
/// rule keeps the live ones. A page reads at most `limit` records, so it
/// may hold fewer than `limit` keys (even none) and still have a `next`.
pub fn list(tx: &mut dyn Txn, after: &str, limit: usize) -> Result<LeasePage> {
    super::job::check_after_key(after)?;
    super::check_count(Field::Limit, limit)?;
    let now_ms = tx.now_ms();
    let mut records = Vec::new();
    tx.lease_scan(after, limit, &mut records)?;
    debug_assert!(records.len() <= limit);
    let next = (records.len() == limit)
        .then(|| records.last().map(|(key, _)| key.clone()))
        .flatten();
    let leases = records
        .into_iter()
        .filter(|(_, rec)| rec.live(now_ms).next().is_some())
        .map(|(key, rec)| {
            let info = LeaseInfo {
                last_token: rec.last_token,
                limit: rec.limit,
                holders: rec.live_infos(now_ms),
                now_ms,
            };
            (key, info)
        })
        .collect();
    Ok(LeasePage { leases, next })
}

/// How far a holder's clock may drift from the store's, and the extra
/// safety margin it keeps before its lease's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriftBound {
    /// Maximum rate difference between the holder's monotonic clock and the
    /// store's clock, in parts per million.
    pub ppm: u32,
    /// Fixed margin subtracted from every local deadline (for example the
    /// time an action takes to reach the protected resource).
    pub margin_ms: u64,
}

impl Default for DriftBound {
    /// 1 % drift and no fixed margin.
    fn default() -> Self {
        DriftBound {
            ppm: 10_000,
            margin_ms: 0,
        }
    }
}

/// The local instant by which the store has surely let a slot lapse: the
/// mirror of [`local_deadline_ms`] (the earliest the store may end a
/// grant; this, the latest). The slot had `store_left_ms` of store time
/// from a commit that came no later than `replied_at_ms`, the local clock
/// read when the answer arrived; a local clock that runs down to
/// `1 - ppm/1e6` of the store's rate counts that as at most
/// `store_left_ms / (1 - ppm/1e6)`, and the margin comes on top.
pub fn local_lapse_ms(replied_at_ms: u64, store_left_ms: u64, drift: DriftBound) -> u64 {
    let slow = 1_000_000u128.saturating_sub(u128::from(drift.ppm)).max(1);
    let stretched = (u128::from(store_left_ms) * 1_000_000).div_ceil(slow);
    let stretched = u64::try_from(stretched).unwrap_or(u64::MAX);
    replied_at_ms
        .saturating_add(stretched)
        .saturating_add(drift.margin_ms)
        .saturating_add(1)
}

/// The holder's local validity deadline (L3), on its own monotonic clock.
///
/// `sent_at_ms` is the local clock read *before* the request was sent: the
/// store started the TTL no earlier than that. If the local clock runs at a
/// rate within `1 ± ppm/1e6` of the store's, a local elapsed time below
/// `ttl * (1 - ppm/1e6)` is a store elapsed time below `ttl`, so the holder
/// stops acting before the store can grant the key to anyone else.
pub fn local_deadline_ms(sent_at_ms: u64, ttl_ms: u64, drift: DriftBound) -> u64 {
    // In 64 bits whenever the product fits (any TTL under about 58,000
    // years at 1 % drift); 128-bit division is a library call.
    let drift_ms = match ttl_ms.checked_mul(u64::from(drift.ppm)) {
        Some(product) => product.div_ceil(1_000_000),
        None => {
            let wide = (u128::from(ttl_ms) * u128::from(drift.ppm)).div_ceil(1_000_000);
            u64::try_from(wide).unwrap_or(u64::MAX)
        }
    };
    let valid_ms = ttl_ms
        .saturating_sub(drift_ms)
        .saturating_sub(drift.margin_ms);
    sent_at_ms.saturating_add(valid_ms)
}
