//! The reference model: an obviously correct, deliberately naive statement
//! of the lease and job rules, with no indexes, no laziness and no storage.
//!
//! Every operation scans plain vectors. Time-driven changes (a claim that
//! ran out, a delay that passed) are applied eagerly by [`Model::settle`]
//! before every operation, as of the instant they happened. The property
//! tests compare `leasehold::core` over a real store with this model after
//! every step; the simulator uses the same [`Outcome`] vocabulary.
//!
//! The model shares only *formulas* with the core (`backoff_ms`, the limits,
//! the local deadline): never a state rule.

mod flow;
mod jobs;

use leasehold::core::{self, MAX_ATTEMPTS, MAX_BATCH, MAX_LEASE_LIMIT, MAX_TTL_MS};
use leasehold::{Error, JobState, LostReason, QueuePolicy};

/// A normalized, comparable result of one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing returned yet.
    None,
    /// Plain success.
    Ok,
    /// A lease grant.
    Grant {
        /// Token.
        token: u64,
        /// Store-clock expiry.
        expires_at_ms: u64,
        /// Whether an existing slot was extended.
        renewed: bool,
    },
    /// The key is held: live holders as (holder, token, expiry), by token.
    Held(Vec<(u128, u64, u64)>),
    /// Lost; `Some` when the model pins the reason, `None` for any reason.
    Lost(Option<LostReason>),
    /// Rejected input naming this field.
    Invalid(leasehold::Field),
    /// No such job.
    NotFound,
    /// The job's state does not allow the operation.
    InvalidState(JobState),
    /// An enqueue.
    Enqueued {
        /// The job id.
        id: u64,
        /// False when a live job with the unique key was returned.
        created: bool,
    },
    /// Claimed jobs as (id, token, attempts, lease_until), in claim order.
    Claimed(Vec<(u64, u64, u32, u64)>),
    /// A heartbeat reply.
    Heartbeat {
        /// The new claim expiry.
        lease_until_ms: u64,
        /// A cancel was requested.
        cancel_requested: bool,
    },
    /// The job's state after the operation.
    State(JobState),
    /// How many jobs were purged.
    Purged(usize),
    /// A yes or no (the drain rule).
    Bool(bool),
    /// One outcome per item of a batch, in order.
    Batch(Vec<Outcome>),
    /// A store error the model does not describe (the run reports it).
    StoreError(String),
}

impl Outcome {
    /// The outcome of a failed operation.
    pub fn of_error(e: &Error) -> Outcome {
        match e {
            Error::Held { holders, .. } => {
                let mut v: Vec<_> = holders
                    .iter()
                    .map(|h| (h.holder.id.0, h.token, h.expires_at_ms))
                    .collect();
                v.sort_by_key(|h| h.1);
                Outcome::Held(v)
            }
            Error::Lost { reason, .. } => Outcome::Lost(Some(*reason)),
            Error::Invalid { field, .. } => Outcome::Invalid(*field),
            Error::NotFound(_) => Outcome::NotFound,
            Error::InvalidState { state, .. } => Outcome::InvalidState(*state),
            other => Outcome::StoreError(other.to_string()),
        }
    }

    /// The outcome of a lease grant.
    pub fn grant(g: &core::Grant) -> Outcome {
        Outcome::Grant {
            token: g.token,
            expires_at_ms: g.expires_at_ms,
            renewed: g.renewed,
        }
    }

    /// The outcome of a claim.
    pub fn claimed(jobs: &[leasehold::JobRecord]) -> Outcome {
        Outcome::Claimed(
            jobs.iter()
                .map(|j| {
                    let (token, until) = j.claim.map_or((0, 0), |c| (c.token, c.lease_until_ms));
                    (j.id.0, token, j.attempts, until)
                })
                .collect(),
        )
    }

    /// The outcome of a heartbeat.
    pub fn heartbeat(r: &core::HeartbeatReply) -> Outcome {
        Outcome::Heartbeat {
            lease_until_ms: r.lease_until_ms,
            cancel_requested: r.cancel_requested,
        }
    }

    /// Map any result through `ok`, errors through [`Outcome::of_error`].
    pub fn of<T>(r: &leasehold::Result<T>, ok: impl FnOnce(&T) -> Outcome) -> Outcome {
        match r {
            Ok(v) => ok(v),
            Err(e) => Outcome::of_error(e),
        }
    }

    /// Whether `actual` (from the system) satisfies this expectation.
    pub fn accepts(&self, actual: &Outcome) -> bool {
        match (self, actual) {
            (Outcome::Lost(None), Outcome::Lost(_)) => true,
            (Outcome::Batch(a), Outcome::Batch(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.accepts(b))
            }
            (a, b) => a == b,
        }
    }
}

/// One holder slot of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Holder id.
    pub holder: u128,
    /// Token.
    pub token: u64,
    /// Expiry (exclusive).
    pub expires_at_ms: u64,
}

/// One key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Key {
    /// Highest token granted.
    pub last_token: u64,
    /// The limit fixed by the grant that found the key free.
    pub limit: u32,
    /// Slots in grant order; expired ones are filtered by time.
    pub slots: Vec<Slot>,
}

/// One job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Id (1-based, in enqueue order).
    pub id: u64,
    /// Queue name.
    pub queue: String,
    /// Payload.
    pub payload: Vec<u8>,
    /// Priority.
    pub priority: i32,
    /// Not before.
    pub run_at_ms: u64,
    /// Enqueue time.
    pub created_at_ms: u64,
    /// Attempt budget.
    pub max_attempts: u32,
    /// Claims so far.
    pub attempts: u32,
    /// Claims that expired.
    pub expiries: u32,
    /// Last claim token.
    pub last_token: u64,
    /// State.
    pub state: JobState,
    /// (holder, token, lease_until) while running.
    pub claim: Option<(u128, u64, u64)>,
    /// Cancel requested while running.
    pub cancel_requested: bool,
    /// Last failure reason.
    pub last_error: Option<String>,
    /// Dedup key.
    pub unique_key: Option<String>,
    /// When it became terminal.
    pub finished_at_ms: Option<u64>,
    /// What its handler returned when it completed.
    pub result: Option<Vec<u8>>,
    /// Deleted by purge.
    pub purged: bool,
    /// Concurrency key (what a per-key limit counts).
    pub key: Option<String>,
    /// Run-time limit of each attempt (F3).
    pub timeout_ms: Option<u64>,
    /// The running claim's deadline: its claim instant plus the limit.
    pub deadline_ms: Option<u64>,
    /// The jobs it runs after (distinct, as pushed).
    pub after: Vec<u64>,
    /// It runs once they all ended, however.
    pub after_any: bool,
}

/// The whole reference state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    /// The store's clock.
    pub now_ms: u64,
    /// Retry policy.
    pub policy: QueuePolicy,
    /// Keys by name (a `Vec` of pairs: naive on purpose).
    pub keys: Vec<(String, Key)>,
    /// Every job ever enqueued, by id - 1.
    pub jobs: Vec<Job>,
    /// The result of the last operation.
    pub last: Outcome,
    /// The queues paused (F2: their claims start nothing).
    pub paused: Vec<String>,
    /// Queues' concurrency limits, where set (F1).
    pub limits: Vec<(String, leasehold::Limits)>,
    /// Rate buckets (F4): queue, concurrency key (`None`: the queue's
    /// own), and the instants of the starts it remembers.
    pub starts: Vec<(String, Option<String>, Vec<u64>)>,
    /// The waiting jobs decided (run or cancelled) since the world last
    /// looked: the store must not show any of them waiting (D2).
    pub released: Vec<u64>,
}

fn ttl_check(field: leasehold::Field, now_ms: u64, ttl_ms: u64) -> Result<u64, Outcome> {
    if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
        return Err(Outcome::Invalid(field));
    }
    now_ms.checked_add(ttl_ms).ok_or(Outcome::Invalid(field))
}

fn key_ok(key: &str) -> bool {
    !key.is_empty() && key.len() <= core::MAX_KEY_BYTES && !key.chars().any(char::is_control)
}

impl Model {
    /// An empty world at `now_ms`.
    pub fn new(now_ms: u64, policy: QueuePolicy) -> Self {
        Model {
            now_ms,
            policy,
            keys: Vec::new(),
            jobs: Vec::new(),
            last: Outcome::None,
            paused: Vec::new(),
            limits: Vec::new(),
            starts: Vec::new(),
            released: Vec::new(),
        }
    }

    fn key_mut(&mut self, name: &str) -> &mut Key {
        if let Some(i) = self.keys.iter().position(|(k, _)| k == name) {
            return &mut self.keys[i].1;
        }
        self.keys.push((name.to_owned(), Key::default()));
        let last = self.keys.len() - 1;
        &mut self.keys[last].1
    }

    /// The key's state, if it was ever granted.
    pub fn key(&self, name: &str) -> Option<&Key> {
        self.keys.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// Live slots of a key, sorted by token.
    pub fn live(&self, name: &str) -> Vec<Slot> {
        let now = self.now_ms;
        let mut v: Vec<Slot> = self
            .key(name)
            .map(|k| {
                k.slots
                    .iter()
                    .filter(|s| now < s.expires_at_ms)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by_key(|s| s.token);
        v
    }

    /// Move time forward (never back: the store's clock is monotonic).
    pub fn tick(&mut self, to_ms: u64) {
        self.now_ms = self.now_ms.max(to_ms);
        self.settle();
        self.last = Outcome::Ok;
    }

    // ------------------------------------------------------------ leases

    /// Acquire (or extend, for a current holder).
    pub fn acquire(&mut self, key: &str, holder: u128, ttl_ms: u64, limit: u32) -> Outcome {
        let now = self.now_ms;
        self.last = (|| {
            if !key_ok(key) {
                return Outcome::Invalid(leasehold::Field::Key);
            }
            if limit == 0 || limit > MAX_LEASE_LIMIT {
                return Outcome::Invalid(leasehold::Field::Limit);
            }
            let exp = match ttl_check(leasehold::Field::Ttl, now, ttl_ms) {
                Ok(e) => e,
                Err(o) => return o,
            };
            let live = self.live(key);
            let k = self.key_mut(key);
            // The key's limit, not the caller's, while it has holders.
            if !live.is_empty() && k.limit != limit {
                return Outcome::Invalid(leasehold::Field::Limit);
            }
            if let Some(s) = k
                .slots
                .iter_mut()
                .find(|s| s.holder == holder && now < s.expires_at_ms)
            {
                s.expires_at_ms = s.expires_at_ms.max(exp);
                return Outcome::Grant {
                    token: s.token,
                    expires_at_ms: s.expires_at_ms,
                    renewed: true,
                };
            }
            if live.len() >= limit as usize {
                return Outcome::Held(
                    live.iter()
                        .map(|s| (s.holder, s.token, s.expires_at_ms))
                        .collect(),
                );
            }
            k.last_token += 1;
            k.limit = limit;
            let token = k.last_token;
            k.slots.retain(|s| now < s.expires_at_ms);
            k.slots.push(Slot {
                holder,
                token,
                expires_at_ms: exp,
            });
            Outcome::Grant {
                token,
                expires_at_ms: exp,
                renewed: false,
            }
        })();
        self.last.clone()
    }

    fn lease_lost(&self, key: &str, holder: u128, token: u64) -> Outcome {
        let other_live = self
            .live(key)
            .iter()
            .any(|s| s.token == token && s.holder != holder);
        Outcome::Lost(other_live.then_some(LostReason::NotHolder))
    }

    /// Renew a live slot.
    pub fn renew(&mut self, key: &str, holder: u128, token: u64, ttl_ms: u64) -> Outcome {
        let now = self.now_ms;
        self.last = (|| {
            if !key_ok(key) {
                return Outcome::Invalid(leasehold::Field::Key);
            }
            let exp = match ttl_check(leasehold::Field::Ttl, now, ttl_ms) {
                Ok(e) => e,
                Err(o) => return o,
            };
            let lost = self.lease_lost(key, holder, token);
            let Some((_, k)) = self.keys.iter_mut().find(|(k, _)| k == key) else {
                return lost;
            };
            match k
                .slots
                .iter_mut()
                .find(|s| s.holder == holder && s.token == token && now < s.expires_at_ms)
            {
                Some(s) => {
                    s.expires_at_ms = s.expires_at_ms.max(exp);
                    Outcome::Grant {
                        token,
                        expires_at_ms: s.expires_at_ms,
                        renewed: true,
                    }
                }
                None => lost,
            }
        })();
        self.last.clone()
    }

    /// Release a live slot.
    pub fn release(&mut self, key: &str, holder: u128, token: u64) -> Outcome {
        let now = self.now_ms;
        self.last = (|| {
            if !key_ok(key) {
                return Outcome::Invalid(leasehold::Field::Key);
            }
            let lost = self.lease_lost(key, holder, token);
            let Some((_, k)) = self.keys.iter_mut().find(|(k, _)| k == key) else {
                return lost;
            };
            let before = k.slots.len();
            k.slots
                .retain(|s| !(s.holder == holder && s.token == token && now < s.expires_at_ms));
            if k.slots.len() == before {
                return lost;
            }
            k.slots.retain(|s| now < s.expires_at_ms);
            Outcome::Ok
        })();
        self.last.clone()
    }
}
