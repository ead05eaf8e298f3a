//! The recording clients: one OS process each, running a seeded random
//! workload against the store and appending every operation to its
//! history (`record`). Faults come from outside (the orchestrator signals
//! the process); these loops only do what a user's program would, and say
//! what happened.
//!
//! Leases: acquire a key (waiting a little), maybe renew, write the token
//! to the fenced resource if the lease is still valid (as the README tells
//! users to), release. Queue: push unique payloads, claim, maybe heartbeat,
//! then complete, fail, or cancel a job of its own.

use crate::record::{Event, Recorder};
use crate::resource::Resource;
use leasehold::{Client, Error, JobId, JobSpec, LeaseOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// What a client is told on its command line.
pub struct Params {
    pub store: String,
    pub p: String,
    pub seed: u64,
    pub seconds: f64,
    pub ttl: Duration,
    pub keys: u32,
    /// Prefix of the keys and the queue: runs on a shared server never meet.
    pub ns: String,
}

/// `info` for an error whose outcome may be unknown (a store error: it
/// may have committed), `fail` for one that changed nothing the checker
/// counts on (a rule's answer, bad input, a store that stayed busy; a
/// release answered `Lost` may have freed a grant lost at its local
/// deadline, but the checker ends a hold at its release's invoke anyway).
pub fn completion(e: &Error) -> &'static str {
    match e {
        Error::Store { .. } => "info",
        _ => "fail",
    }
}

/// The client on the store, opened again after a store error (a server
/// restarting or cut off by a partition) until the run's end; an error
/// that retrying cannot fix (a bad URL) ends the process.
fn client(params: &Params) -> Client {
    let end = Instant::now() + Duration::from_secs_f64(params.seconds);
    loop {
        match leasehold::store::open_url(&params.store) {
            Ok(store) => return Client::builder_shared(store).build(),
            Err(e @ Error::Store { .. }) if Instant::now() < end => {
                eprintln!("leasehold-history: {}: {e} (opening again)", params.store);
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => {
                eprintln!("leasehold-history: {}: {e}", params.store);
                std::process::exit(2);
            }
        }
    }
}

pub fn lease_loop(params: &Params, rec: &mut Recorder, resource: &Resource) {
    let client = client(params);
    let mut rng = StdRng::seed_from_u64(params.seed);
    let end = Instant::now() + Duration::from_secs_f64(params.seconds);
    while Instant::now() < end {
        let key = format!("{}-k{}", params.ns, rng.random_range(0..params.keys));
        rec.log(Event::new("", "invoke", "acquire").key(&key));
        let opts = LeaseOptions::new(params.ttl).wait(Duration::from_millis(300));
        let guard = match client.acquire(&key, opts) {
            Ok(g) => {
                rec.log(Event::new("", "ok", "acquire").key(&key).token(g.token()));
                g
            }
            Err(e) => {
                rec.log(
                    Event::new("", completion(&e), "acquire")
                        .key(&key)
                        .value(e.to_string()),
                );
                continue;
            }
        };
        let token = guard.token();
        std::thread::sleep(Duration::from_millis(rng.random_range(1..30)));
        if rng.random_bool(0.5) {
            rec.log(Event::new("", "invoke", "renew").key(&key).token(token));
            match guard.renew() {
                Ok(()) => rec.log(Event::new("", "ok", "renew").key(&key).token(token)),
                Err(e) => rec.log(
                    Event::new("", completion(&e), "renew")
                        .key(&key)
                        .token(token)
                        .value(e.to_string()),
                ),
            };
        }
        // The fenced write: only while the lease is valid, with its token.
        if guard.is_valid() {
            rec.log(Event::new("", "invoke", "write").key(&key).token(token));
            match resource.write(&key, token, rec.p()) {
                Ok(true) => rec.log(Event::new("", "ok", "write").key(&key).token(token)),
                Ok(false) => rec.log(
                    Event::new("", "fail", "write")
                        .key(&key)
                        .token(token)
                        .value("fenced off"),
                ),
                Err(e) => rec.log(
                    Event::new("", "info", "write")
                        .key(&key)
                        .token(token)
                        .value(e.to_string()),
                ),
            };
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(1..20)));
        rec.log(Event::new("", "invoke", "release").key(&key).token(token));
        match guard.release() {
            Ok(()) => rec.log(Event::new("", "ok", "release").key(&key).token(token)),
            Err(e) => rec.log(
                Event::new("", completion(&e), "release")
                    .key(&key)
                    .token(token)
                    .value(e.to_string()),
            ),
        };
        std::thread::sleep(Duration::from_millis(rng.random_range(0..20)));
    }
}

pub fn queue_loop(params: &Params, rec: &mut Recorder) {
    let client = client(params);
    let queue = match client.queue(&format!("{}-queue", params.ns)) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("leasehold-history: {e}");
            std::process::exit(2);
        }
    };
    let mut rng = StdRng::seed_from_u64(params.seed);
    let end = Instant::now() + Duration::from_secs_f64(params.seconds);
    let mut pushed = Vec::new();
    let mut n = 0u64;
    while Instant::now() < end {
        let roll: f64 = rng.random();
        if roll < 0.45 {
            n += 1;
            let value = format!("{}-{n}", rec.p());
            rec.log(Event::new("", "invoke", "push").value(&value));
            match queue.push(&JobSpec::new(value.clone().into_bytes())) {
                Ok(o) => {
                    rec.log(Event::new("", "ok", "push").value(&value).job(o.id.0));
                    pushed.push(o.id);
                }
                Err(e) => {
                    rec.log(Event::new("", completion(&e), "push").value(&value));
                }
            }
        } else if roll < 0.5 && !pushed.is_empty() {
            let id: JobId = pushed[rng.random_range(0..pushed.len())];
            rec.log(Event::new("", "invoke", "cancel").job(id.0));
            match queue.cancel(id) {
                Ok(state) => rec.log(
                    Event::new("", "ok", "cancel")
                        .job(id.0)
                        .value(state.as_str()),
                ),
                Err(e) => rec.log(
                    Event::new("", completion(&e), "cancel")
                        .job(id.0)
                        .value(e.to_string()),
                ),
            };
        } else {
            rec.log(Event::new("", "invoke", "claim"));
            let job = match queue.claim(params.ttl) {
                Ok(Some(job)) => job,
                Ok(None) => {
                    rec.log(Event::new("", "ok", "claim"));
                    std::thread::sleep(Duration::from_millis(rng.random_range(5..30)));
                    continue;
                }
                Err(e) => {
                    rec.log(Event::new("", completion(&e), "claim").value(e.to_string()));
                    continue;
                }
            };
            let (id, token) = (job.id().0, job.token());
            let payload = String::from_utf8_lossy(job.payload()).into_owned();
            rec.log(
                Event::new("", "ok", "claim")
                    .job(id)
                    .token(token)
                    .value(payload),
            );
            std::thread::sleep(Duration::from_millis(rng.random_range(1..30)));
            if rng.random_bool(0.3) {
                rec.log(Event::new("", "invoke", "heartbeat").job(id).token(token));
                match job.heartbeat() {
                    Ok(_) => rec.log(Event::new("", "ok", "heartbeat").job(id).token(token)),
                    Err(e) => rec.log(
                        Event::new("", completion(&e), "heartbeat")
                            .job(id)
                            .token(token)
                            .value(e.to_string()),
                    ),
                };
            }
            // A handler whose claim is no longer valid does nothing (the
            // check users make before a protected action).
            if !job.is_valid() {
                rec.log(Event::new("", "invoke", "drop").job(id).token(token));
                rec.log(Event::new("", "ok", "drop").job(id).token(token));
                continue;
            }
            let f = if rng.random_bool(0.85) {
                "complete"
            } else {
                "fail"
            };
            rec.log(Event::new("", "invoke", f).job(id).token(token));
            let outcome = if f == "complete" {
                job.complete().map(|()| "done".to_owned())
            } else {
                job.fail("history").map(|s| s.as_str().to_owned())
            };
            match outcome {
                Ok(state) => rec.log(Event::new("", "ok", f).job(id).token(token).value(state)),
                Err(e) => rec.log(
                    Event::new("", completion(&e), f)
                        .job(id)
                        .token(token)
                        .value(e.to_string()),
                ),
            };
        }
    }
}
