//! The flow-control rules of the reference model: pause and resume, a
//! queue's limits (F1) and rates (F4), and the claim that honours them,
//! each from the rule's statement (the best ready jobs that fit), not from
//! the store's parking.

use super::*;

impl Model {
    /// Pause or resume `queue`: whether that changed it.
    pub fn set_paused(&mut self, queue: &str, paused: bool) -> Outcome {
        self.settle();
        let was = self.paused.iter().any(|q| q == queue);
        if paused && !was {
            self.paused.push(queue.to_owned());
        } else if !paused {
            self.paused.retain(|q| q != queue);
        }
        self.last = Outcome::Bool(was != paused);
        self.last.clone()
    }

    /// Replace `queue`'s concurrency limits: whether that changed them.
    pub fn set_limits(&mut self, queue: &str, limits: leasehold::Limits) -> Outcome {
        self.settle();
        self.last = (|| {
            let bad = |n: Option<u32>| n.is_some_and(|n| n == 0 || n > core::job::MAX_LIMIT);
            if bad(limits.concurrency) {
                return Outcome::Invalid(leasehold::Field::Concurrency);
            }
            if bad(limits.per_key) {
                return Outcome::Invalid(leasehold::Field::PerKey);
            }
            let bad_rate = |r: Option<leasehold::Rate>| {
                r.is_some_and(|r| {
                    !(1..=core::job::MAX_RATE).contains(&r.count)
                        || !(1..=core::job::MAX_WINDOW_MS).contains(&r.window_ms)
                })
            };
            if bad_rate(limits.rate) {
                return Outcome::Invalid(leasehold::Field::Rate);
            }
            if bad_rate(limits.per_key_rate) {
                return Outcome::Invalid(leasehold::Field::PerKeyRate);
            }
            let was = self.limits_of(queue);
            self.limits.retain(|(q, _)| q != queue);
            self.limits.push((queue.to_owned(), limits));
            Outcome::Bool(was != limits)
        })();
        self.last.clone()
    }

    /// `queue`'s concurrency limits (none if never set).
    pub fn limits_of(&self, queue: &str) -> leasehold::Limits {
        self.limits
            .iter()
            .find(|(q, _)| q == queue)
            .map_or_else(leasehold::Limits::none, |(_, l)| *l)
    }

    /// Running jobs of `queue` (with concurrency key `key`, when given).
    pub fn running(&self, queue: &str, key: Option<&str>) -> u64 {
        self.jobs
            .iter()
            .filter(|j| !j.purged && j.queue == queue && j.state == JobState::Running)
            .filter(|j| key.is_none() || j.key.as_deref() == key)
            .count() as u64
    }

    /// Claim up to `max` ready jobs in claim order (none of a paused
    /// queue), skipping those that would exceed a limit (F1): no more than
    /// the queue's free slots, and none whose key is full. Written from the
    /// rule's statement (the best ready jobs that fit), not from the
    /// store's parking.
    pub fn claim(&mut self, queue: &str, holder: u128, lease_ms: u64, max: usize) -> Outcome {
        self.settle();
        let now = self.now_ms;
        self.last = (|| {
            if !key_ok(queue) {
                return Outcome::Invalid(leasehold::Field::Queue);
            }
            if max == 0 || max > MAX_BATCH {
                return Outcome::Invalid(leasehold::Field::Batch);
            }
            let until = match ttl_check(leasehold::Field::Lease, now, lease_ms) {
                Ok(t) => t,
                Err(o) => return o,
            };
            if self.paused.iter().any(|q| q == queue) {
                return Outcome::Claimed(Vec::new());
            }
            let limits = self.limits_of(queue);
            let room = limits.concurrency.map_or(max, |n| {
                let free = u64::from(n).saturating_sub(self.running(queue, None));
                max.min(usize::try_from(free).unwrap_or(0))
            });
            let mut keys: Vec<(String, u64)> = Vec::new();
            for j in &self.jobs {
                if let (false, JobState::Running, Some(k)) = (j.purged, j.state, &j.key) {
                    if j.queue != queue {
                        continue;
                    }
                    match keys.iter_mut().find(|(key, _)| key == k) {
                        Some((_, n)) => *n += 1,
                        None => keys.push((k.clone(), 1)),
                    }
                }
            }
            // F4: starts left in the window, the queue's and each key's.
            let room = limits
                .rate
                .map_or(room, |r| room.min(self.rate_room(queue, None, r) as usize));
            let mut key_starts: Vec<(String, u64)> = Vec::new();
            let mut ready: Vec<usize> = (0..self.jobs.len())
                .filter(|&i| {
                    let j = &self.jobs[i];
                    !j.purged && j.queue == queue && j.state == JobState::Ready
                })
                .collect();
            ready.sort_by_key(|&i| {
                let j = &self.jobs[i];
                (std::cmp::Reverse(j.priority), j.run_at_ms, j.id)
            });
            let mut out = Vec::new();
            for i in ready {
                if out.len() >= room {
                    break;
                }
                if let (Some(r), Some(k)) = (limits.per_key_rate, self.jobs[i].key.clone()) {
                    let at = match key_starts.iter().position(|(key, _)| *key == k) {
                        Some(at) => at,
                        None => {
                            let n = self.rate_room(queue, Some(&k), r);
                            key_starts.push((k, n));
                            key_starts.len() - 1
                        }
                    };
                    // Counted below, once the concurrency limit agrees.
                    if key_starts[at].1 == 0 {
                        continue;
                    }
                }
                let job = &mut self.jobs[i];
                if let (Some(m), Some(k)) = (limits.per_key, &job.key) {
                    let at = match keys.iter().position(|(key, _)| key == k) {
                        Some(at) => at,
                        None => {
                            keys.push((k.clone(), 0));
                            keys.len() - 1
                        }
                    };
                    if keys[at].1 >= u64::from(m) {
                        continue;
                    }
                    keys[at].1 += 1;
                }
                if let (Some(_), Some(k)) = (limits.per_key_rate, &job.key) {
                    if let Some((_, n)) = key_starts.iter_mut().find(|(key, _)| key == k) {
                        *n -= 1;
                    }
                }
                job.last_token += 1;
                job.attempts += 1;
                job.state = JobState::Running;
                // The run-time limit counts from the claim; the lease
                // never passes it (F3).
                job.deadline_ms = job.timeout_ms.map(|t| now + t);
                let until = job.deadline_ms.map_or(until, |d| d.min(until));
                job.claim = Some((holder, job.last_token, until));
                out.push((job.id, job.last_token, job.attempts, until));
            }
            self.record_starts(queue, limits, &out, now);
            Outcome::Claimed(out)
        })();
        self.last.clone()
    }

    /// Starts `queue`'s bucket (or key `key`'s) may still make now under
    /// `rate`: its count less the starts it remembers within the window.
    fn rate_room(&self, queue: &str, key: Option<&str>, rate: leasehold::Rate) -> u64 {
        let now = self.now_ms;
        let seen = self
            .starts
            .iter()
            .find(|(q, k, _)| q == queue && k.as_deref() == key)
            .map_or(0, |(_, _, s)| {
                s.iter().filter(|&&t| t + rate.window_ms > now).count()
            });
        u64::from(rate.count).saturating_sub(seen as u64)
    }

    /// Remember the claims `out` made at `now` in the buckets they count
    /// in. A bucket that started something keeps what the rate in force
    /// can count: its starts within the window, the newest `count` of them.
    fn record_starts(
        &mut self,
        queue: &str,
        limits: leasehold::Limits,
        out: &[(u64, u64, u32, u64)],
        now: u64,
    ) {
        let mut buckets: Vec<(Option<String>, leasehold::Rate, usize)> = Vec::new();
        if let (Some(r), false) = (limits.rate, out.is_empty()) {
            buckets.push((None, r, out.len()));
        }
        if let Some(r) = limits.per_key_rate {
            for &(id, ..) in out {
                let Some(k) = self.job(id).and_then(|j| j.key.clone()) else {
                    continue;
                };
                match buckets.iter_mut().find(|(b, ..)| b.as_deref() == Some(&*k)) {
                    Some(b) => b.2 += 1,
                    None => buckets.push((Some(k), r, 1)),
                }
            }
        }
        for (key, rate, n) in buckets {
            let at = match self
                .starts
                .iter()
                .position(|(q, k, _)| q == queue && *k == key)
            {
                Some(at) => at,
                None => {
                    self.starts.push((queue.to_owned(), key, Vec::new()));
                    self.starts.len() - 1
                }
            };
            let log = &mut self.starts[at].2;
            log.extend(std::iter::repeat_n(now, n));
            log.sort_unstable();
            log.retain(|&t| t + rate.window_ms > now);
            let extra = log.len().saturating_sub(rate.count as usize);
            log.drain(..extra);
        }
    }
}
