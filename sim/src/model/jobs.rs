//! The job rules of the reference model: enqueue, claim, heartbeat,
//! settle (complete, fail, abandon), the drain rule, operator actions
//! (cancel, retry, purge) and the counts (claims under a queue's pause,
//! limits and rates: `flow.rs`). One rule per method, each a scan
//! of the plain job vector.

use super::*;

impl Model {
    /// Apply every time-driven change up to `now_ms`, each as of the
    /// instant it happened: expired claims end (an attempt already counted),
    /// then due jobs become ready.
    pub fn settle(&mut self) {
        let now = self.now_ms;
        let policy = self.policy;
        for job in self.jobs.iter_mut().filter(|j| !j.purged) {
            if let (JobState::Running, Some((_, _, until))) = (job.state, job.claim) {
                if until <= now {
                    job.claim = None;
                    let at_deadline = job.deadline_ms.take().is_some_and(|d| until >= d);
                    job.expiries += 1;
                    let quarantined = policy.quarantine_expiries > 0
                        && job.expiries >= policy.quarantine_expiries;
                    job.last_error = Some(
                        if quarantined && job.attempts < job.max_attempts {
                            "lease expired (crash loop: quarantined)"
                        } else if at_deadline {
                            "lease expired at the job's deadline (timed out)"
                        } else {
                            "lease expired"
                        }
                        .to_owned(),
                    );
                    if job.cancel_requested {
                        job.state = JobState::Cancelled;
                        job.finished_at_ms = Some(until);
                    } else if quarantined || job.attempts >= job.max_attempts {
                        job.state = JobState::Dead;
                        job.finished_at_ms = Some(until);
                    } else {
                        job.run_at_ms = until
                            + core::backoff_ms(&policy, leasehold::JobId(job.id), job.attempts);
                        job.state = JobState::Scheduled;
                    }
                }
            }
            if job.state == JobState::Scheduled && job.run_at_ms <= now {
                job.state = JobState::Ready;
            }
        }
        self.decide_waiting();
    }

    /// D1, D2 from their statement: a waiting job one of whose jobs ended
    /// dead or cancelled ends cancelled when that job ended (unless it
    /// runs after any ending); one whose jobs all ended runs (ready, or
    /// scheduled until its own run_at). Repeated until nothing changes, so
    /// that a cancelled job's own waiters follow.
    fn decide_waiting(&mut self) {
        let now = self.now_ms;
        loop {
            let mut changed = false;
            for i in 0..self.jobs.len() {
                let j = &self.jobs[i];
                if j.purged || j.state != JobState::Waiting {
                    continue;
                }
                let parents: Vec<(JobState, Option<u64>)> = j
                    .after
                    .iter()
                    .filter_map(|&p| self.job(p).map(|p| (p.state, p.finished_at_ms)))
                    .collect();
                let failed = parents
                    .iter()
                    .filter(|(s, _)| matches!(s, JobState::Dead | JobState::Cancelled))
                    .filter_map(|(_, at)| *at)
                    .min();
                let job = &mut self.jobs[i];
                match failed {
                    Some(at) if !job.after_any => {
                        job.state = JobState::Cancelled;
                        job.finished_at_ms = Some(at);
                    }
                    _ if parents.iter().all(|(s, _)| s.is_terminal()) => {
                        job.state = match job.run_at_ms <= now {
                            true => JobState::Ready,
                            false => JobState::Scheduled,
                        };
                    }
                    _ => continue,
                }
                self.released.push(job.id);
                changed = true;
            }
            if !changed {
                return;
            }
        }
    }

    fn live_job_mut(&mut self, id: u64) -> Option<&mut Job> {
        let i = usize::try_from(id).ok()?.checked_sub(1)?;
        self.jobs.get_mut(i).filter(|j| !j.purged)
    }

    /// A job by id (not purged).
    pub fn job(&self, id: u64) -> Option<&Job> {
        let i = usize::try_from(id).ok()?.checked_sub(1)?;
        self.jobs.get(i).filter(|j| !j.purged)
    }

    fn unique_holder(&self, queue: &str, key: &str) -> Option<u64> {
        self.blocking(queue, key, leasehold::StateSet::LIVE, None)
    }

    /// U1, from the rule's statement: the newest job of `queue` with
    /// unique key `key` in one of `states` and, with a period, pushed
    /// within it before now.
    fn blocking(
        &self,
        queue: &str,
        key: &str,
        states: leasehold::StateSet,
        period_ms: Option<u64>,
    ) -> Option<u64> {
        let now = self.now_ms;
        self.jobs
            .iter()
            .rev()
            .find(|j| {
                !j.purged
                    && j.queue == queue
                    && states.contains(j.state)
                    && period_ms.is_none_or(|p| j.created_at_ms + p > now)
                    && j.unique_key.as_deref() == Some(key)
            })
            .map(|j| j.id)
    }

    /// Enqueue.
    pub fn enqueue(&mut self, queue: &str, spec: &leasehold::JobSpec) -> Outcome {
        self.settle();
        let now = self.now_ms;
        self.last = (|| {
            if !key_ok(queue) {
                return Outcome::Invalid(leasehold::Field::Queue);
            }
            if spec.payload.len() > core::MAX_PAYLOAD_BYTES {
                return Outcome::Invalid(leasehold::Field::Payload);
            }
            if spec.max_attempts == 0 || spec.max_attempts > MAX_ATTEMPTS {
                return Outcome::Invalid(leasehold::Field::MaxAttempts);
            }
            if let Some(k) = &spec.unique_key {
                if k.is_empty() || k.contains('\0') || k.len() > core::MAX_TEXT_BYTES {
                    return Outcome::Invalid(leasehold::Field::UniqueKey);
                }
            }
            let period_ms = spec.unique_for.map(|p| p.as_millis() as u64);
            if spec.unique_key.is_none() && (period_ms.is_some() || spec.unique_states.is_some()) {
                return Outcome::Invalid(leasehold::Field::UniqueKey);
            }
            if period_ms.is_some_and(|p| p == 0 || p > MAX_TTL_MS) {
                return Outcome::Invalid(leasehold::Field::UniqueFor);
            }
            if spec.unique_states.is_some_and(|s| s.is_empty()) {
                return Outcome::Invalid(leasehold::Field::UniqueStates);
            }
            if spec.after.len() > leasehold::core::job::MAX_AFTER
                || (spec.after_any && spec.after.is_empty())
            {
                return Outcome::Invalid(leasehold::Field::After);
            }
            if spec.key.as_deref().is_some_and(|k| !key_ok(k)) {
                return Outcome::Invalid(leasehold::Field::ConcurrencyKey);
            }
            let timeout_ms = spec.timeout.map(|t| t.as_millis() as u64);
            if timeout_ms.is_some_and(|t| t == 0 || t > MAX_TTL_MS) {
                return Outcome::Invalid(leasehold::Field::Timeout);
            }
            let run_at = match spec.run_at.map(leasehold::StoreMs::ms) {
                Some(at) if at > now.saturating_add(MAX_TTL_MS) => {
                    return Outcome::Invalid(leasehold::Field::RunAt)
                }
                Some(at) => at.max(now),
                None if spec.delay_ms == 0 => now,
                None => match ttl_check(leasehold::Field::Delay, now, spec.delay_ms) {
                    Ok(t) => t,
                    Err(o) => return o,
                },
            };
            if let Some(k) = &spec.unique_key {
                let states = spec.unique_states.unwrap_or(match period_ms {
                    Some(_) => leasehold::StateSet::ALL,
                    None => leasehold::StateSet::LIVE,
                });
                if let Some(id) = self.blocking(queue, k, states, period_ms) {
                    return Outcome::Enqueued { id, created: false };
                }
            }
            let mut after: Vec<u64> = spec.after.iter().map(|a| a.0).collect();
            after.sort_unstable();
            after.dedup();
            let mut state = if run_at <= now {
                JobState::Ready
            } else {
                JobState::Scheduled
            };
            let mut finished_at_ms = None;
            for &p in &after {
                match self.job(p).map(|p| p.state) {
                    None => return Outcome::Invalid(leasehold::Field::After),
                    Some(JobState::Done) => {}
                    Some(JobState::Dead | JobState::Cancelled) if !spec.after_any => {
                        finished_at_ms = Some(now);
                    }
                    Some(s) if s.is_terminal() => {}
                    Some(_) => state = JobState::Waiting,
                }
            }
            if finished_at_ms.is_some() {
                state = JobState::Cancelled;
            }
            let id = self.jobs.len() as u64 + 1;
            self.jobs.push(Job {
                id,
                queue: queue.to_owned(),
                payload: spec.payload.clone(),
                priority: spec.priority,
                run_at_ms: run_at,
                created_at_ms: now,
                max_attempts: spec.max_attempts,
                attempts: 0,
                expiries: 0,
                last_token: 0,
                state,
                claim: None,
                cancel_requested: false,
                last_error: None,
                unique_key: spec.unique_key.clone(),
                finished_at_ms,
                result: None,
                purged: false,
                key: spec.key.clone(),
                timeout_ms,
                deadline_ms: None,
                after,
                after_any: spec.after_any,
            });
            Outcome::Enqueued { id, created: true }
        })();
        self.last.clone()
    }

    /// A settle of claim `token` sent again after its answer was lost:
    /// its own outcome is there when the claim ended without a later one
    /// and the job shows what that settle (`kind`: complete, fail with a
    /// reason, give back) leaves and an expiry does not. Written from the
    /// rule's statement, not from the core's code.
    fn recorded(&self, id: u64, token: u64, kind: Recorded<'_>) -> Option<JobState> {
        let job = self.job(id)?;
        if job.last_token != token || job.claim.is_some_and(|c| c.1 == token) {
            return None;
        }
        // An expiry writes "lease expired ...": never taken for a settle.
        let error = job.last_error.as_deref().unwrap_or("");
        let expired = error.starts_with("lease expired");
        let same = match kind {
            Recorded::Complete => job.state == JobState::Done,
            Recorded::Fail(reason) => job.state != JobState::Done && !expired && error == reason,
            Recorded::Abandon => match job.state {
                JobState::Ready | JobState::Cancelled => !expired,
                JobState::Dead => error == "abandoned by its worker on its last attempt",
                _ => false,
            },
        };
        same.then_some(job.state)
    }

    /// The claim check shared by heartbeat, complete and fail.
    fn claimed(&mut self, id: u64, holder: u128, token: u64) -> Result<&mut Job, Outcome> {
        let job = self.live_job_mut(id).ok_or(Outcome::NotFound)?;
        match job.claim {
            Some((h, t, _)) if job.state == JobState::Running && t == token => {
                if h == holder {
                    Ok(job)
                } else {
                    Err(Outcome::Lost(Some(LostReason::NotHolder)))
                }
            }
            _ => Err(Outcome::Lost(None)),
        }
    }

    /// Extend a claim.
    pub fn heartbeat(&mut self, id: u64, holder: u128, token: u64, lease_ms: u64) -> Outcome {
        self.settle();
        let now = self.now_ms;
        self.last = (|| {
            let until = match ttl_check(leasehold::Field::Lease, now, lease_ms) {
                Ok(t) => t,
                Err(o) => return o,
            };
            match self.claimed(id, holder, token) {
                Ok(job) => {
                    let until = job.deadline_ms.map_or(until, |d| d.min(until));
                    let until = job.claim.map_or(until, |c| c.2.max(until));
                    job.claim = Some((holder, token, until));
                    Outcome::Heartbeat {
                        lease_until_ms: until,
                        cancel_requested: job.cancel_requested,
                    }
                }
                Err(o) => o,
            }
        })();
        self.last.clone()
    }

    /// Complete.
    pub fn complete(
        &mut self,
        id: u64,
        holder: u128,
        token: u64,
        result: Option<&[u8]>,
    ) -> Outcome {
        self.settle();
        let now = self.now_ms;
        if self.recorded(id, token, Recorded::Complete).is_some() {
            self.last = Outcome::Ok;
            return self.last.clone();
        }
        self.last = match self.claimed(id, holder, token) {
            Ok(job) => {
                job.state = JobState::Done;
                job.claim = None;
                job.deadline_ms = None;
                job.finished_at_ms = Some(now);
                job.result = result.map(<[u8]>::to_vec);
                Outcome::Ok
            }
            Err(o) => o,
        };
        self.decide_waiting();
        self.last.clone()
    }

    /// Give a claim back without an outcome: ready at once; the attempt
    /// returned if the handler never started; dead if a started one was
    /// the last; cancelled if a cancel was asked.
    pub fn abandon(&mut self, id: u64, holder: u128, token: u64, started: bool) -> Outcome {
        self.settle();
        let now = self.now_ms;
        if let Some(state) = self.recorded(id, token, Recorded::Abandon) {
            self.last = Outcome::State(state);
            return self.last.clone();
        }
        self.last = match self.claimed(id, holder, token) {
            Ok(job) => {
                job.claim = None;
                job.deadline_ms = None;
                if job.cancel_requested {
                    job.state = JobState::Cancelled;
                    job.finished_at_ms = Some(now);
                } else if !started {
                    job.attempts = job.attempts.saturating_sub(1);
                    job.run_at_ms = now;
                    job.state = JobState::Ready;
                } else if job.attempts >= job.max_attempts {
                    job.last_error = Some("abandoned by its worker on its last attempt".into());
                    job.state = JobState::Dead;
                    job.finished_at_ms = Some(now);
                } else {
                    job.run_at_ms = now;
                    job.state = JobState::Ready;
                }
                Outcome::State(job.state)
            }
            Err(o) => o,
        };
        self.decide_waiting();
        self.last.clone()
    }

    /// The one drain rule: nothing ready, running, or due (a retry in
    /// backoff is due; a first attempt's delay is not).
    pub fn drained(&mut self, queue: &str) -> Outcome {
        self.settle();
        let busy = self.jobs.iter().any(|j| {
            !j.purged
                && j.queue == queue
                && match j.state {
                    JobState::Ready | JobState::Running => true,
                    JobState::Scheduled => j.attempts > 0,
                    _ => false,
                }
        });
        self.last = Outcome::Bool(!busy);
        self.last.clone()
    }

    /// Fail an attempt.
    pub fn fail(&mut self, id: u64, holder: u128, token: u64, reason: &str) -> Outcome {
        self.settle();
        let now = self.now_ms;
        let policy = self.policy;
        self.last = (|| {
            if reason.len() > core::MAX_TEXT_BYTES || reason.contains('\0') {
                return Outcome::Invalid(leasehold::Field::Reason);
            }
            if let Some(state) = self.recorded(id, token, Recorded::Fail(reason)) {
                return Outcome::State(state);
            }
            let job = match self.claimed(id, holder, token) {
                Ok(job) => job,
                Err(o) => return o,
            };
            job.claim = None;
            job.deadline_ms = None;
            job.last_error = Some(reason.to_owned());
            if job.cancel_requested {
                job.state = JobState::Cancelled;
                job.finished_at_ms = Some(now);
            } else if job.attempts >= job.max_attempts {
                job.state = JobState::Dead;
                job.finished_at_ms = Some(now);
            } else {
                job.run_at_ms =
                    now + core::backoff_ms(&policy, leasehold::JobId(job.id), job.attempts);
                job.state = if job.run_at_ms <= now {
                    JobState::Ready
                } else {
                    JobState::Scheduled
                };
            }
            Outcome::State(job.state)
        })();
        self.decide_waiting();
        self.last.clone()
    }

    /// Cancel.
    pub fn cancel(&mut self, id: u64) -> Outcome {
        self.settle();
        let now = self.now_ms;
        self.last = match self.live_job_mut(id) {
            None => Outcome::NotFound,
            Some(job) => match job.state {
                JobState::Ready | JobState::Scheduled | JobState::Waiting => {
                    job.state = JobState::Cancelled;
                    job.finished_at_ms = Some(now);
                    Outcome::State(JobState::Cancelled)
                }
                JobState::Running => {
                    job.cancel_requested = true;
                    Outcome::State(JobState::Running)
                }
                s => Outcome::InvalidState(s),
            },
        };
        self.decide_waiting();
        self.last.clone()
    }

    /// Retry a dead or cancelled job.
    pub fn retry(&mut self, id: u64) -> Outcome {
        self.settle();
        let now = self.now_ms;
        self.last = (|| {
            let Some(job) = self.job(id) else {
                return Outcome::NotFound;
            };
            if !matches!(job.state, JobState::Dead | JobState::Cancelled) {
                return Outcome::InvalidState(job.state);
            }
            if let Some(k) = job.unique_key.clone() {
                if self.unique_holder(&job.queue.clone(), &k).is_some() {
                    return Outcome::Invalid(leasehold::Field::UniqueKey);
                }
            }
            let Some(job) = self.live_job_mut(id) else {
                return Outcome::NotFound;
            };
            job.attempts = 0;
            job.expiries = 0;
            job.cancel_requested = false;
            job.finished_at_ms = None;
            job.run_at_ms = now;
            job.state = JobState::Ready;
            Outcome::Ok
        })();
        self.last.clone()
    }

    /// Purge terminal jobs finished at least `older_than_ms` ago (up to `limit`).
    pub fn purge(&mut self, queue: &str, older_than_ms: u64, limit: usize) -> Outcome {
        self.settle();
        let cutoff = self.now_ms.saturating_sub(older_than_ms);
        self.last = (|| {
            if !key_ok(queue) {
                return Outcome::Invalid(leasehold::Field::Queue);
            }
            if limit == 0 || limit > MAX_BATCH {
                return Outcome::Invalid(leasehold::Field::Batch);
            }
            let mut victims: Vec<&mut Job> = self
                .jobs
                .iter_mut()
                .filter(|j| {
                    !j.purged
                        && j.queue == queue
                        && j.state.is_terminal()
                        && j.finished_at_ms.is_some_and(|f| f <= cutoff)
                })
                .collect();
            victims.sort_by_key(|j| (j.finished_at_ms, j.id));
            let n = victims.len().min(limit);
            for j in victims.into_iter().take(n) {
                j.purged = true;
            }
            Outcome::Purged(n)
        })();
        self.last.clone()
    }

    /// Jobs of a queue per state, in [`JobState::ALL`] order.
    pub fn counts(&self, queue: &str) -> [u64; 7] {
        let mut c = [0u64; 7];
        for j in self.jobs.iter().filter(|j| !j.purged && j.queue == queue) {
            let i = JobState::ALL
                .iter()
                .position(|s| *s == j.state)
                .unwrap_or(0);
            c[i] += 1;
        }
        c
    }
}

/// Which settle [`Model::recorded`] looks for.
#[derive(Clone, Copy)]
enum Recorded<'a> {
    Complete,
    Fail(&'a str),
    Abandon,
}
