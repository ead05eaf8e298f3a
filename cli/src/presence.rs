//! Workers announce themselves. A job's claim names only its worker's
//! holder id; so `queue work` holds the lease `leasehold/worker/<holder
//! id>` under its own holder (labelled `host:pid`), renewed while it runs
//! and released when it stops. The dashboard reads a claim's label there
//! ([`label_of`]), and its leases page lists the live workers. A worker
//! that does not announce itself (the library's own loop) shows its
//! holder id alone.

use crate::out::note;
use leasehold::core::Txn;
use leasehold::{Client, HolderId, LeaseGuard, LeaseOptions};
use std::time::Duration;

/// The prefix of the workers' presence keys.
pub const PREFIX: &str = "leasehold/worker/";

/// The presence key of the worker `id`.
pub fn key(id: HolderId) -> String {
    format!("{PREFIX}{id}")
}

/// Hold this client's presence lease for `ttl`, renewed in the
/// background. A failure is noted, not fatal: it only costs the label.
pub fn announce(client: &Client, ttl: Duration) -> Option<LeaseGuard> {
    let key = key(client.holder().id);
    let guard = match client.acquire(&key, LeaseOptions::new(ttl)) {
        Ok(guard) => guard,
        Err(e) => {
            note(&format!("announcing this worker as {key:?}: {e}"));
            return None;
        }
    };
    let shown = key.clone();
    let kept = guard.keep_alive(move |e| note(&format!("presence lease {shown:?} lost: {e}")));
    if let Err(e) = kept {
        note(&format!(
            "renewing this worker's presence lease {key:?}: {e}"
        ));
    }
    Some(guard)
}

/// The label the worker `id` announced itself with, while it is alive.
pub fn label_of(tx: &mut dyn Txn, id: HolderId) -> leasehold::Result<Option<String>> {
    let info = leasehold::core::lease::inspect(tx, &key(id))?;
    Ok(info
        .holders
        .into_iter()
        .find(|h| h.holder.id == id)
        .and_then(|h| h.holder.label.as_deref().map(str::to_owned)))
}
