//! `leasehold-history`: real processes against one store, faults injected
//! from outside, every operation recorded, the history judged by a checker
//! that knows nothing of leasehold's code (see `check`).
//!
//! ```text
//! leasehold-history run --store URL --dir DIR [--seconds 20] [--seed 1]
//!     [--lease-procs 4] [--queue-procs 4] [--faults kill,stop,pg-restart,clock-step,partition,io-error]
//!     [--max-faults 12] [--ttl-ms 3000] [--keys 2] [--canary split-brain]
//! leasehold-history check --dir DIR        # judge a recorded run again
//! ```
//!
//! `run` starts the clients (this binary, `client lease|queue ...`), injects
//! a fault at random moments from the seed (SIGKILL, then a new process in
//! its place; SIGSTOP for 1.5 TTLs, then SIGCONT; a PostgreSQL restart), lets
//! the clients finish, drains the queue with one process free of faults,
//! reads every job's end state, and judges. It prints a summary (and writes
//! `DIR/summary.json`) and exits 1 if any check failed, naming the seed.
//! `--canary split-brain` puts every other client on a copy of the store
//! (`sqlite:`/`file:` only): a run the checker must fail.

// A harness of real processes: it reads clocks, sleeps and starts threads
// (clippy.toml keeps those out of the core and the client machines).
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod check;
mod client;
mod net;
mod record;
mod resource;
mod run;
mod wgl;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// `--name value` pairs after the subcommand.
pub struct Args(HashMap<String, String>);

impl Args {
    fn parse(args: &[String]) -> Args {
        let mut map = HashMap::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let Some(name) = a.strip_prefix("--") else {
                die(&format!("unexpected argument {a:?}"));
            };
            let value = it
                .next()
                .unwrap_or_else(|| die(&format!("--{name} needs a value")));
            map.insert(name.to_owned(), value.clone());
        }
        Args(map)
    }

    pub fn str(&self, name: &str, default: Option<&str>) -> String {
        match (self.0.get(name), default) {
            (Some(v), _) => v.clone(),
            (None, Some(d)) => d.to_owned(),
            (None, None) => die(&format!("--{name} is required")),
        }
    }

    pub fn num<T: std::str::FromStr>(&self, name: &str, default: &str) -> T {
        let v = self.str(name, Some(default));
        v.parse()
            .unwrap_or_else(|_| die(&format!("--{name}: not a number: {v:?}")))
    }
}

pub fn die(msg: &str) -> ! {
    eprintln!("leasehold-history: {msg}");
    std::process::exit(2);
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match argv.first().map(String::as_str) {
        Some("client") => {
            let kind = argv.get(1).cloned().unwrap_or_default();
            let args = Args::parse(&argv[2..]);
            let params = client::Params {
                store: args.str("store", None),
                p: args.str("p", None),
                seed: args.num("seed", "1"),
                seconds: args.num("seconds", "10"),
                ttl: Duration::from_millis(args.num("ttl-ms", "3000")),
                keys: args.num("keys", "2"),
                ns: args.str("ns", Some("h")),
            };
            let dir = PathBuf::from(args.str("dir", None));
            let mut rec =
                record::Recorder::create(&dir.join(format!("{}.jsonl", params.p)), &params.p)
                    .unwrap_or_else(|e| die(&format!("{}: {e}", dir.display())));
            match kind.as_str() {
                "lease" => {
                    let resource = resource::Resource::open(&dir.join("resource.db"))
                        .unwrap_or_else(|e| die(&format!("the fenced resource: {e}")));
                    client::lease_loop(&params, &mut rec, &resource);
                }
                "queue" => client::queue_loop(&params, &mut rec),
                other => die(&format!("client: unknown kind {other:?} (lease or queue)")),
            }
        }
        Some("run") => std::process::exit(run::run(&Args::parse(&argv[1..]))),
        Some("check") => {
            let args = Args::parse(&argv[1..]);
            std::process::exit(run::judge(&PathBuf::from(args.str("dir", None)), &args));
        }
        _ => die("usage: leasehold-history run --store URL --dir DIR [...] | check --dir DIR"),
    }
}
