//! `leasehold run KEY --ttl DUR -- CMD`: CMD under a lease, contained.
//!
//! The lease is renewed in the background about every TTL/3. CMD's whole
//! process tree ([`crate::contain`]) ends before the lease is released: when
//! CMD exits (leftovers get SIGTERM, then SIGKILL after `--grace`), when the
//! lease is lost (the same, then exit 76), when leasehold gets SIGTERM or
//! SIGINT (the signal goes to the whole tree, SIGKILL after `--grace`), and
//! when leasehold itself is SIGKILLed (the supervisor kills the tree at once).

use crate::contain::{self, Contained, Mode, Spec, StartError};
use crate::lock::held_message;
use crate::out::{ms, note, parse_duration};
use crate::{CliResult, Fail, EXIT_ERROR, EXIT_LOST};
use clap::Args;
use leasehold::{Client, LeaseGuard, LeaseOptions};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct RunArgs {
    key: String,
    #[arg(long, value_parser = parse_duration)]
    ttl: Duration,
    /// Wait this long for the key if it is held (else exit 75 at once).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    wait: Duration,
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

/// The last SIGTERM/SIGINT received (0: none).
pub static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// Record SIGTERM and SIGINT instead of dying of them.
pub fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut action.sa_mask);
            action.sa_flags = libc::SA_RESTART;
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

pub fn run(client: Client, args: RunArgs) -> CliResult {
    install_signal_handlers();
    let opts = LeaseOptions::new(args.ttl).wait(args.wait);
    let guard = match client.acquire(&args.key, opts) {
        Ok(g) => g,
        Err(e) => {
            held_message(&client, &args.key, &e)?;
            return Err(e.into());
        }
    };
    let lost = Arc::new(AtomicBool::new(false));
    let flag = lost.clone();
    guard.keep_alive(move |_| flag.store(true, Ordering::SeqCst))?;
    let spawned = contain::spawn(Spec {
        cmd: &args.cmd,
        env: vec![
            ("LEASEHOLD_TOKEN", guard.token().to_string()),
            ("LEASEHOLD_KEY", args.key.clone()),
        ],
        stdin: Stdio::inherit(),
        stdout: Stdio::inherit(),
        grace: args.grace,
        mode: args.contain,
    });
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release();
            return Err(match e {
                StartError::Exec { code, message } => Fail(code, message),
                StartError::Other(message) => Fail(EXIT_ERROR, message),
            });
        }
    };
    note(&format!(
        "{} holds {:?} with token {}; running {:?} {} (supervisor pid {})",
        client.holder().id,
        args.key,
        guard.token(),
        args.cmd[0],
        child.mode.describe(),
        child.pid()
    ));
    supervise(&mut child, guard, &lost, &args)
}

/// Wait for CMD while the lease holds: forward signals to its tree, stop
/// it on a loss (exit 76), release the lease when it ends.
fn supervise(
    child: &mut Contained,
    guard: LeaseGuard,
    lost: &AtomicBool,
    args: &RunArgs,
) -> CliResult {
    let poll = Duration::from_millis((ms(args.ttl) / 20).clamp(5, 100));
    loop {
        if let Some(code) = child.try_wait() {
            if let Err(e) = guard.release() {
                note(&format!("releasing {:?}: {e}", args.key));
            }
            return Ok(code);
        }
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            // Forwarded to the whole tree; SIGKILL after the grace period.
            child.stop(sig, args.grace);
        }
        if lost.load(Ordering::SeqCst) || !guard.is_valid() {
            note(&format!(
                "lease {:?} lost ({}); stopping {:?}",
                args.key,
                guard
                    .lost()
                    .map_or("local deadline passed".to_owned(), |r| r.to_string()),
                args.cmd[0]
            ));
            child.stop_and_wait(libc::SIGTERM, args.grace);
            let _ = guard.release();
            return Ok(EXIT_LOST);
        }
        std::thread::sleep(poll);
    }
}
