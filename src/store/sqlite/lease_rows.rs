//! A lease's rows in `lease_rows`: a head row (token -1) carrying the
//! key's last fencing token and its holder limit, written with every
//! grant, and one row per held slot (its token, holder, label and expiry).
//! A key is read in one statement and written back as the difference from
//! what was read, so a release is one `DELETE`, a renewal one `UPDATE`,
//! a grant one `INSERT` and the head.

use super::conn::sql_err;
use super::hot::{Hot, HotConn};
use crate::core::{LeaseRecord, LeaseSlot};
use crate::error::{Field, Result};
use crate::store::{holder_bytes, holder_from, i64_of, u64_of, LeaseCache};
use crate::Holder;
use rusqlite::{params, Row, Statement};
use std::sync::Arc;

/// The token of a key's head row in `lease_rows` (slots' tokens are never
/// negative).
const HEAD_TOKEN: i64 = -1;

fn ctx_key(what: &str, key: &str) -> String {
    format!("{what} lease {key:?}")
}

/// The record of `key` in one statement: its rows of `lease_rows`,
/// the head (token -1) first, then the slots in token order. Slots
/// without a head are no record (a head is written with every grant).
pub(super) fn load(conn: &HotConn, key: &str) -> Result<Option<LeaseRecord>> {
    let fail = |e| sql_err(|| ctx_key("reading", key), e);
    conn.with(Hot::LeaseLoad, |stmt| read_record(stmt, key))
        .map_err(fail)
}

/// The record `stmt` ([`Hot::LeaseLoad`]) reads for `key`.
fn read_record(stmt: &mut Statement<'_>, key: &str) -> rusqlite::Result<Option<LeaseRecord>> {
    let mut rows = stmt.query([key])?;
    let mut record: Option<LeaseRecord> = None;
    let read = |r: &Row<'_>, record: &mut Option<LeaseRecord>| -> rusqlite::Result<()> {
        let token: i64 = r.get(0)?;
        if token == HEAD_TOKEN {
            *record = Some(LeaseRecord {
                last_token: u64_of(r.get(1)?),
                limit: u32::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
                slots: Vec::new(),
            });
        } else if let Some(rec) = record {
            let label: Option<String> = r.get(4)?;
            rec.slots.push(LeaseSlot {
                token: u64_of(token),
                holder: Holder {
                    id: holder_from(&r.get::<_, Vec<u8>>(3)?),
                    label: label.map(|l| Arc::from(l.as_str())),
                },
                expires_at_ms: u64_of(r.get(5)?),
            });
        }
        Ok(())
    };
    while let Some(r) = rows.next()? {
        read(r, &mut record)?;
    }
    Ok(record)
}

/// Write back every lease record of `leases` that changed, as the
/// difference from what it read: the head only if its token or limit
/// moved, and only the slots added, dropped or changed (a release is
/// one DELETE, a renewal one UPDATE, a grant one INSERT and the head).
pub(super) fn write_back(conn: &HotConn, leases: &LeaseCache) -> Result<()> {
    for c in leases.changed() {
        let key = c.key.as_str();
        let fail = |e| sql_err(|| ctx_key("writing", key), e);
        let (before, after) = (c.original.as_ref(), &c.record);
        let head = |r: &LeaseRecord| (r.last_token, r.limit);
        if before.map(head) != Some(head(after)) {
            let last = i64_of(Field::Token, after.last_token)?;
            conn.with(Hot::LeaseHead, |s| {
                s.execute(params![key, HEAD_TOKEN, last, after.limit])
            })
            .map_err(fail)?;
        }
        let old: &[LeaseSlot] = before.map_or(&[], |b| &b.slots);
        for gone in old
            .iter()
            .filter(|o| !after.slots.iter().any(|n| n.token == o.token))
        {
            let token = i64_of(Field::Token, gone.token)?;
            conn.with(Hot::LeaseDelete, |s| s.execute(params![key, token]))
                .map_err(fail)?;
        }
        for slot in &after.slots {
            let token = i64_of(Field::Token, slot.token)?;
            let expires = i64_of(Field::ExpiresAt, slot.expires_at_ms)?;
            match old.iter().find(|o| o.token == slot.token) {
                Some(o) if o == slot => {}
                Some(o) if o.holder == slot.holder => {
                    conn.with(Hot::LeaseRenew, |s| s.execute(params![key, token, expires]))
                        .map_err(fail)?;
                }
                found => {
                    let which = if found.is_some() {
                        Hot::LeaseReplace
                    } else {
                        Hot::LeaseInsert
                    };
                    conn.with(which, |s| {
                        s.execute(params![
                            key,
                            token,
                            &holder_bytes(slot.holder.id)[..],
                            slot.holder.label.as_deref(),
                            expires,
                        ])
                    })
                    .map_err(fail)?;
                }
            }
        }
    }
    Ok(())
}
