//! The lease record as text: the version line, the key, the token
//! counter, the limit and one line per holder slot, with a checksum; and
//! the file name a key is kept under.

use crate::core::{mix64, HolderId, LeaseRecord, LeaseSlot};
use crate::store::unhex;
use crate::Holder;
use std::sync::Arc;

/// The record version this build writes. v2 added the `limit` line; v1
/// records (no limit recorded) are still read.
const VERSION_LINE: &str = "leasehold-lease v2";
const VERSION_LINE_V1: &str = "leasehold-lease v1";
/// Longest encoded file name stem; longer keys are shortened and hashed.
const MAX_STEM: usize = 160;

/// `%XX`, so `..`, `/`, NUL-free unicode and absolute paths all stay inside
/// the directory; a stem longer than 160 bytes keeps its first 120 and
/// appends a 128-bit hash of the whole key (the record stores the full key
/// and is checked on every read, so a hash collision is an error, never a
/// shared lease).
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for &b in key.as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() <= MAX_STEM {
        return out;
    }
    let (mut h1, mut h2) = (0x5EED_u64, 0x00C0_FFEE_u64);
    for &b in key.as_bytes() {
        h1 = mix64(h1 ^ u64::from(b));
        h2 = mix64(h2.rotate_left(7) ^ u64::from(b));
    }
    let mut cut = 120;
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{h1:016x}{h2:016x}", &out[..cut])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn checksum(body: &str) -> u64 {
    body.bytes().fold(0xCBF2_9CE4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    })
}

/// Serialize a record (see the module docs).
pub(super) fn render(key: &str, rec: &LeaseRecord) -> String {
    let mut body = format!(
        "{VERSION_LINE}\nkey {}\nlast_token {}\nlimit {}\n",
        hex(key.as_bytes()),
        rec.last_token,
        rec.limit
    );
    for s in &rec.slots {
        let label = s
            .holder
            .label
            .as_deref()
            .map_or("-".to_owned(), |l| hex(l.as_bytes()));
        body += &format!(
            "slot {} {} {} {label}\n",
            s.token,
            uuid::Uuid::from_u128(s.holder.id.0).hyphenated(),
            s.expires_at_ms
        );
    }
    let sum = checksum(&body);
    body + &format!("checksum {sum:016x}\n")
}

/// Parse a record; `None` if it is torn, corrupt or not ours.
pub(super) fn parse(text: &str, key: &str) -> std::result::Result<LeaseRecord, String> {
    let (body, last) = text
        .trim_end_matches('\n')
        .rsplit_once('\n')
        .ok_or("truncated record")?;
    let body = format!("{body}\n");
    let sum = last
        .strip_prefix("checksum ")
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .ok_or("missing checksum (truncated record?)")?;
    if sum != checksum(&body) {
        return Err("checksum mismatch (corrupt record)".into());
    }
    let mut lines = body.lines();
    let v1 = match lines.next() {
        Some(VERSION_LINE) => false,
        Some(VERSION_LINE_V1) => true,
        _ => return Err("unknown record version (written by a newer leasehold?)".into()),
    };
    let stored = lines
        .next()
        .and_then(|l| l.strip_prefix("key "))
        .and_then(unhex)
        .ok_or("bad key line")?;
    if stored != key.as_bytes() {
        return Err(format!(
            "record belongs to another key ({:?}); file names collided",
            String::from_utf8_lossy(&stored)
        ));
    }
    let last_token = lines
        .next()
        .and_then(|l| l.strip_prefix("last_token "))
        .and_then(|t| t.parse().ok())
        .ok_or("bad last_token line")?;
    let limit = if v1 {
        0
    } else {
        lines
            .next()
            .and_then(|l| l.strip_prefix("limit "))
            .and_then(|t| t.parse().ok())
            .ok_or("bad limit line")?
    };
    let slots = lines
        .map(parse_slot)
        .collect::<std::result::Result<Vec<_>, String>>()?;
    Ok(LeaseRecord {
        last_token,
        limit,
        slots,
    })
}

/// The key a record names (its second line), if it reads as one.
pub(super) fn record_key(text: &str) -> Option<String> {
    let line = text.lines().nth(1)?.strip_prefix("key ")?;
    String::from_utf8(unhex(line)?).ok()
}

/// One `slot TOKEN HOLDER EXPIRES LABEL` line.
fn parse_slot(line: &str) -> std::result::Result<LeaseSlot, String> {
    let f: Vec<&str> = line.split(' ').collect();
    let [tag, token, holder, expires, label] = f[..] else {
        return Err(format!("bad line {line:?}"));
    };
    if tag != "slot" {
        return Err(format!("bad line {line:?}"));
    }
    let label = match label {
        "-" => None,
        h => Some(Arc::from(
            String::from_utf8(unhex(h).ok_or("bad label")?)
                .map_err(|_| "bad label")?
                .as_str(),
        )),
    };
    Ok(LeaseSlot {
        token: token.parse().map_err(|_| "bad token")?,
        holder: Holder {
            id: HolderId::parse(holder).map_err(|_| "bad holder")?,
            label,
        },
        expires_at_ms: expires.parse().map_err(|_| "bad expiry")?,
    })
}
