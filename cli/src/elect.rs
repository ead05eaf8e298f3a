//! `leasehold elect KEY --ttl DUR -- CMD`: campaign for leadership of KEY
//! ([`leasehold::Client::campaign`]); while this process leads, CMD runs,
//! contained and stopped exactly as `run` stops it ([`crate::run`]):
//! when leadership is lost its tree gets SIGTERM, SIGKILL after `--grace`.
//! Then it campaigns again, unless `--once` (which exits 76 after a loss,
//! or with CMD's status). SIGTERM or SIGINT go to CMD's tree; once it is
//! gone the key is released (resigned), so the next leader takes over at
//! once instead of after the TTL.

use crate::contain::Mode;
use crate::out::{parse_duration, say, Level};
use crate::run::{install_signal_handlers, poll_of, start, supervise, Ended, SIGNAL};
use crate::{CliResult, Fail, EXIT_ERROR, EXIT_LOST};
use clap::Args;
use leasehold::{Client, ElectOptions, Leader, LeaderEvent};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

#[derive(Args)]
pub struct ElectArgs {
    key: String,
    /// Each term's lease: renewed about every third of it; a dead
    /// leader's successor takes over within about this long.
    #[arg(long, value_parser = parse_duration)]
    ttl: Duration,
    /// Text recorded with this campaigner (default: host and pid), shown
    /// to the others and by `lock status` / `lock watch`.
    #[arg(long)]
    label: Option<String>,
    /// Lead once: exit when CMD exits (with its status) or leadership is
    /// lost (76), instead of campaigning again.
    #[arg(long)]
    once: bool,
    /// Between SIGTERM and SIGKILL when CMD's tree is stopped.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    grace: Duration,
    /// How CMD's process tree is contained.
    #[arg(long, value_enum, env = "LEASEHOLD_CONTAIN", default_value = "auto")]
    contain: Mode,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

impl ElectArgs {
    /// The label to campaign under, if given.
    pub fn label(&self) -> Option<String> {
        self.label.clone()
    }
}

/// Why a leader stopped being one, as the supervisor sees it.
fn lost(leader: &Leader) -> Option<String> {
    (!leader.is_valid()).then(|| {
        leader
            .lost()
            .map_or("local deadline passed".to_owned(), |r| r.to_string())
    })
}

pub fn elect(client: Client, args: ElectArgs) -> CliResult {
    install_signal_handlers();
    let (tx, events) = mpsc::channel();
    let opts = ElectOptions::new(args.ttl).once(args.once);
    let election = client.campaign(&args.key, opts, move |e| {
        let _ = tx.send(e);
    })?;
    loop {
        let leader = match elected(&events, &args.key) {
            Wait::Leader(leader) => leader,
            Wait::Signalled => {
                election.resign()?;
                return Ok(0);
            }
            Wait::Over => {
                election.join()?;
                let why = format!("campaigning for {:?}: the election ended", args.key);
                return Err(Fail::new(EXIT_ERROR, why));
            }
        };
        let who = (client.holder().id, "leads");
        let token = leader.token();
        let started = start(&args.cmd, &args.key, token, args.grace, args.contain, who);
        let mut child = match started {
            Ok(c) => c,
            Err(e) => {
                let _ = election.resign();
                return Err(e);
            }
        };
        let what = format!("leadership of {:?}", args.key);
        let ended = supervise(
            &mut child,
            || lost(&leader),
            args.grace,
            poll_of(args.ttl),
            (&what, &args.key),
            &args.cmd[0],
        );
        match ended {
            Ended::Exited { code, signalled } if signalled || args.once => {
                election.resign()?;
                return Ok(code);
            }
            Ended::Exited { code, .. } => {
                let message = format!(
                    "{:?} exited with status {code}; stepping down and campaigning again",
                    args.cmd[0]
                );
                let fields = [
                    ("key", json!(args.key)),
                    ("cmd", json!(args.cmd[0])),
                    ("status", json!(code)),
                ];
                say(Level::Info, &message, &fields);
                election.step_down();
            }
            Ended::Lost if args.once => {
                let _ = election.resign();
                return Ok(EXIT_LOST);
            }
            Ended::Lost => say(
                Level::Info,
                "campaigning again",
                &[("key", json!(args.key))],
            ),
        }
    }
}

/// What waiting for leadership ended with.
enum Wait {
    /// This process leads.
    Leader(Leader),
    /// SIGTERM or SIGINT arrived first.
    Signalled,
    /// The election is over (a store error: joining it says which).
    Over,
}

/// Wait until this process leads, telling who else does meanwhile.
fn elected(events: &Receiver<LeaderEvent>, key: &str) -> Wait {
    loop {
        if SIGNAL.swap(0, Ordering::SeqCst) != 0 {
            return Wait::Signalled;
        }
        match events.recv_timeout(Duration::from_millis(20)) {
            // A term that already ended (deposed before we looked) is skipped.
            Ok(LeaderEvent::Elected(leader)) if leader.is_valid() => return Wait::Leader(leader),
            Ok(LeaderEvent::NewLeader(h)) => {
                let label = h.holder.label.as_deref();
                let message = format!(
                    "{key:?} is led by {} ({}) with token {}",
                    h.holder.id,
                    label.unwrap_or("no label"),
                    h.token
                );
                let fields = [
                    ("key", json!(key)),
                    ("holder", json!(h.holder.id.to_string())),
                    ("label", json!(label)),
                    ("token", json!(h.token)),
                ];
                say(Level::Info, &message, &fields);
            }
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Wait::Over,
        }
    }
}
