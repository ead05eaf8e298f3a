//! `leasehold lock ...`: acquire, renew, release and inspect a lease from
//! the shell; every command prints one JSON line.

use crate::defaults;
use crate::out::{self, emit, parse_duration, say, Level, Times};
use crate::{caller_label, client_for, CliResult, Fail, PolicyArgs};
use clap::Subcommand;
use leasehold::{Client, Error, LeaseOptions, Store, StoreExt};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

#[derive(Subcommand)]
pub enum LockCmd {
    /// Acquire KEY; prints the holder and token to renew or release it with.
    Acquire {
        key: String,
        #[arg(long, value_parser = parse_duration)]
        ttl: Duration,
        /// Holder id (a UUID); a fresh one is made if absent. The same id
        /// again renews its own grant.
        #[arg(long)]
        holder: Option<String>,
        /// Text recorded with the holder (default: host, parent pid and
        /// name: who called leasehold).
        #[arg(long)]
        label: Option<String>,
        /// Wait this long for the key if it is held.
        #[arg(long, value_parser = parse_duration, default_value = defaults::WAIT.as_str())]
        wait: Duration,
        /// Allow up to N holders at once. The first grant fixes a key's
        /// limit while it has holders.
        #[arg(long, default_value_t = defaults::lease_limit(), value_parser = clap::value_parser!(u32).range(defaults::lease_limit_range()))]
        limit: u32,
    },
    /// Extend a held lease.
    Renew {
        key: String,
        #[arg(long)]
        holder: String,
        #[arg(long)]
        token: u64,
        #[arg(long, value_parser = parse_duration, default_value = "30s")]
        ttl: Duration,
    },
    /// Release a held lease.
    Release {
        key: String,
        #[arg(long)]
        holder: String,
        #[arg(long)]
        token: u64,
    },
    /// Who holds KEY, until when, and its token counter.
    Status { key: String },
    /// Print one JSON line now and one per change of holder (a new token,
    /// a release, an expiry), until interrupted.
    Watch {
        key: String,
        /// Look at least this often (a release in this process or, on
        /// PostgreSQL, anywhere, is seen at once).
        #[arg(long, value_parser = parse_duration, default_value = "100ms")]
        interval: Duration,
        /// Exit after this many lines (0: never).
        #[arg(long, default_value_t = 0)]
        count: u64,
    },
    /// Every held key, one JSON line each: its holders (label, token, time
    /// remaining) and how many of its limit are taken.
    List,
}

/// When a lease is held: who holds it and until when, on stdout.
pub fn held_message(client: &Client, key: &str, e: &Error) -> Result<(), Fail> {
    if let Error::Held { .. } = e {
        if let Ok(info) = client.inspect(key) {
            let mut v = out::status_json(key, &info);
            v["held"] = json!(true);
            emit(&v)?;
        }
    }
    Ok(())
}

pub fn lock(store: Arc<dyn Store>, policy: &PolicyArgs, cmd: LockCmd) -> CliResult {
    match cmd {
        LockCmd::Acquire {
            key,
            ttl,
            holder,
            label,
            wait,
            limit,
        } => {
            let label = label.unwrap_or_else(caller_label);
            let client = client_for(store, policy, holder.as_deref(), Some(label))?;
            acquire(
                &client,
                &key,
                LeaseOptions::new(ttl).limit(limit).wait(wait),
            )
        }
        LockCmd::Renew {
            key,
            holder,
            token,
            ttl,
        } => {
            let client = client_for(store, policy, Some(&holder), None)?;
            let grant = client.renew(&key, token, ttl)?;
            let t = Times::new(grant.granted_at_ms);
            emit(&json!({
                "key": key,
                "holder": holder,
                "token": token,
                "expires_at": t.at(grant.expires_at_ms),
                "expires_in_ms": t.until(grant.expires_at_ms),
            }))?;
            Ok(0)
        }
        LockCmd::Release { key, holder, token } => {
            let client = client_for(store, policy, Some(&holder), None)?;
            client.release(&key, token)?;
            emit(&json!({"key": key, "released": true, "token": token}))?;
            Ok(0)
        }
        LockCmd::Watch {
            key,
            interval,
            count,
        } => {
            let client = client_for(store, policy, None, None)?;
            crate::watch::watch(&client, &key, interval, count)
        }
        LockCmd::Status { key } => {
            let client = client_for(store, policy, None, None)?;
            let info = client.inspect(&key)?;
            emit(&out::status_json(&key, &info))?;
            Ok(0)
        }
        LockCmd::List => list(store.as_ref()),
    }
}

/// Records read per transaction by `lock list`.
const LIST_PAGE: usize = 1000;

/// `lock list`: page after page, each in a transaction of its own.
fn list(store: &dyn Store) -> CliResult {
    let mut after = String::new();
    loop {
        let page = store.txn_as("lock_list", |tx| {
            leasehold::core::lease::list(tx, &after, LIST_PAGE)
        })?;
        for (key, info) in &page.leases {
            emit(&out::status_json(key, info))?;
        }
        match page.next {
            Some(next) => after = next,
            None => return Ok(0),
        }
    }
}

/// `lock acquire`: the grant, detached (it outlives this process until its
/// TTL), with the token to renew or release it with.
fn acquire(client: &Client, key: &str, opts: LeaseOptions) -> CliResult {
    let ttl = opts.ttl;
    let guard = match client.acquire(key, opts) {
        Ok(g) => g,
        Err(e) => {
            held_message(client, key, &e)?;
            return Err(e.into());
        }
    };
    let renewed = guard.renewed();
    let info = client.inspect(key)?;
    let (key, token) = guard.detach();
    let t = Times::new(info.now_ms);
    let mine = info.holders.iter().find(|h| h.token == token);
    if renewed {
        let holder = client.holder().id.to_string();
        let message =
            format!("{holder} already held {key:?} with token {token}: the acquire renewed it");
        let fields = [
            ("key", json!(key)),
            ("holder", json!(holder)),
            ("token", json!(token)),
        ];
        say(Level::Info, &message, &fields);
    }
    emit(&json!({
        "key": key,
        "holder": client.holder().id.to_string(),
        "label": client.holder().label.as_deref(),
        "token": token,
        "renewed": renewed,
        "ttl_ms": out::ms(ttl),
        "expires_at": mine.map(|h| t.at(h.expires_at_ms)),
        "expires_in_ms": mine.map(|h| t.until(h.expires_at_ms)),
    }))?;
    Ok(0)
}
