//! The flow-control checks: limits (F1), pause (F2), run-time limits
//! (F3) and rates (F4), as the store applied each change of settings.

use super::{violation, Check, Oracle, Owner};

/// F3: a claim made at `start` of a job with run-time limit `timeout`
/// (if any) runs until `until` at the latest: no later than its deadline.
pub(super) fn within_deadline(
    t: u64,
    id: u64,
    start: u64,
    timeout: Option<u64>,
    until: u64,
    what: &str,
) -> Check {
    match timeout {
        Some(limit) if until > start + limit => violation(
            "F3",
            t,
            format!(
                "job {id} {what} until {until}, past its deadline {} (claimed at {start}, limit {limit} ms)",
                start + limit
            ),
        ),
        _ => Ok(()),
    }
}

impl Oracle {
    /// The store applied a pause (`true`) or a resume of the queue.
    pub fn queue_paused(&mut self, paused: bool) {
        self.paused = paused;
    }

    /// The store applied new limits to the queue.
    pub fn queue_limited(&mut self, limits: leasehold::Limits) {
        let old = self.queue_limits;
        if (old.rate, old.per_key_rate) != (limits.rate, limits.per_key_rate) {
            // F4 counts the windows of the rates in force.
            self.starts.clear();
        }
        self.queue_limits = limits;
    }

    /// F4, after the claims at `t` of `jobs`: the window ending at `t`
    /// holds no more starts than the queue's rate allows, in all and per
    /// concurrency key.
    pub(super) fn within_rates(&mut self, t: u64, owner: Owner, jobs: &[(u64, u64, u64)]) -> Check {
        let limits = self.queue_limits;
        if limits.rate.is_none() && limits.per_key_rate.is_none() {
            return Ok(());
        }
        for &(id, ..) in jobs {
            let key = self.model.job(id).and_then(|j| j.key.clone());
            self.starts.push((t, key));
        }
        let in_window = |rate: leasehold::Rate, key: Option<&str>| {
            (self.starts.iter())
                .filter(|(s, k)| s + rate.window_ms > t && (key.is_none() || k.as_deref() == key))
                .count() as u64
        };
        let ids: Vec<u64> = jobs.iter().map(|j| j.0).collect();
        if let Some(rate) = limits.rate {
            let n = in_window(rate, None);
            if n > u64::from(rate.count) {
                return violation(
                    "F4",
                    t,
                    format!(
                        "p{}.{} claimed jobs {ids:?}: {n} started within {} ms, over the queue's rate of {rate}",
                        owner.0, owner.1, rate.window_ms
                    ),
                );
            }
        }
        let Some(rate) = limits.per_key_rate else {
            return Ok(());
        };
        for &(id, ..) in jobs {
            let Some(key) = self.model.job(id).and_then(|j| j.key.clone()) else {
                continue;
            };
            let n = in_window(rate, Some(&key));
            if n > u64::from(rate.count) {
                return violation(
                    "F4",
                    t,
                    format!(
                        "p{}.{} claimed job {id} of key {key:?}: {n} of that key started within {} ms, over the per-key rate of {rate}",
                        owner.0, owner.1, rate.window_ms
                    ),
                );
            }
        }
        Ok(())
    }

    /// F1, after the claims at `t` of `jobs`: the claims live at `t`, in
    /// all and per concurrency key, are within the limits.
    pub(super) fn within_limits(&self, t: u64, owner: Owner, jobs: &[(u64, u64, u64)]) -> Check {
        let limits = self.queue_limits;
        if jobs.is_empty() || !limits.any() {
            return Ok(());
        }
        let key_of = |id: u64| self.model.job(id).and_then(|j| j.key.clone());
        let live: Vec<u64> = self
            .claims
            .iter()
            .filter(|(_, h)| h.last().is_some_and(|(_, c)| c.live_at(t)))
            .map(|(&id, _)| id)
            .collect();
        let ids: Vec<u64> = jobs.iter().map(|j| j.0).collect();
        if let Some(n) = limits.concurrency {
            if live.len() as u64 > u64::from(n) {
                return violation(
                    "F1",
                    t,
                    format!(
                        "p{}.{} claimed jobs {ids:?}: {} claims live, over the queue's limit of {n}",
                        owner.0, owner.1, live.len()
                    ),
                );
            }
        }
        let Some(m) = limits.per_key else {
            return Ok(());
        };
        for &(id, _, _) in jobs {
            let Some(key) = key_of(id) else { continue };
            let same: Vec<u64> = live
                .iter()
                .copied()
                .filter(|&j| key_of(j).as_deref() == Some(&*key))
                .collect();
            if same.len() as u64 > u64::from(m) {
                return violation(
                    "F1",
                    t,
                    format!(
                        "p{}.{} claimed job {id} of key {key:?}: jobs {same:?} of that key run at once, over the per-key limit of {m}",
                        owner.0, owner.1
                    ),
                );
            }
        }
        Ok(())
    }
}
