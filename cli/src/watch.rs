//! `leasehold lock watch KEY`: one JSON line with the key's holders now,
//! then one per change of holder (compared by holder and token: a renewal
//! is no change; a grant, a release or an expiry is).

use crate::out::{emit, status_json};
use crate::run::{install_signal_handlers, SIGNAL};
use crate::CliResult;
use leasehold::{Client, Wake};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub fn watch(client: &Client, key: &str, interval: Duration, count: u64) -> CliResult {
    install_signal_handlers();
    let store = client.store();
    let mut last: Option<Vec<(leasehold::HolderId, u64)>> = None;
    let mut printed = 0u64;
    while SIGNAL.load(Ordering::SeqCst) == 0 {
        let epoch = store.epoch(Wake::LeaseFreed);
        let info = client.inspect(key)?;
        let now: Vec<_> = info
            .holders
            .iter()
            .map(|h| (h.holder.id, h.token))
            .collect();
        if last.as_ref() != Some(&now) {
            let mut line = status_json(key, &info);
            line["at"] =
                json!(humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string());
            emit(&line)?;
            last = Some(now);
            printed += 1;
            if count > 0 && printed >= count {
                break;
            }
        }
        store.wait_epoch(Wake::LeaseFreed, epoch, interval);
    }
    Ok(0)
}
