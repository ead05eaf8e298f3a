//! Workers announce themselves. A job's claim names only its worker's
//! holder id; so `queue work` holds the lease `leasehold/worker/<holder
//! id>` under its own holder (labelled `host:pid`), renewed while it runs
//! and released when it stops. The dashboard reads a claim's label there
//! ([`label_of`]), and its leases page lists the live workers. A worker
//! that does not announce itself (the library's own loop) shows its
//! holder id alone.

use crate::out::{say, Level};
use leasehold::core::Txn;
use leasehold::{Client, HolderId, LeaseGuard, LeaseOptions};
use serde_json::json;
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
            let fields = [("key", json!(key)), ("error", json!(e.to_string()))];
            say(
                Level::Warn,
                &format!("announcing this worker as {key:?}: {e}"),
                &fields,
            );
            return None;
        }
    };
    let shown = key.clone();
    let kept = guard.keep_alive(move |e| {
        let fields = [("key", json!(shown)), ("reason", json!(e.to_string()))];
        let message = format!("presence lease {shown:?} lost: {e}");
        say(Level::Warn, &message, &fields);
    });
    if let Err(e) = kept {
        let fields = [("key", json!(key)), ("error", json!(e.to_string()))];
        let message = format!("renewing this worker's presence lease {key:?}: {e}");
        say(Level::Warn, &message, &fields);
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
