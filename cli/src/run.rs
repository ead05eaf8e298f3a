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
use crate::out::{ms, parse_duration, say, Level};
use crate::{CliResult, Fail, EXIT_ERROR, EXIT_LOST};
use clap::Args;
use leasehold::{Client, HolderId, LeaseOptions};
use serde_json::json;
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
    #[arg(long, value_parser = parse_duration, default_value = crate::defaults::WAIT.as_str())]
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

/// The self-pipe a signal writes a byte to (read end, write end; -1 until
/// installed), so that one thread can sleep in `poll` until a signal comes
/// instead of looking at [`SIGNAL`] on a timer.
static SIGNAL_PIPE: [AtomicI32; 2] = [AtomicI32::new(-1), AtomicI32::new(-1)];

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
    poke_signal_pipe();
}

/// Make the signal pipe readable (a signal came, or the thread sleeping on
/// it must look at something else). Async-signal-safe: one `write`.
pub fn poke_signal_pipe() {
    let fd = SIGNAL_PIPE[1].load(Ordering::SeqCst);
    if fd >= 0 {
        let byte = 1u8;
        // SAFETY: writing one byte from a live local to a descriptor we
        // own; the pipe is non-blocking, so a full pipe just drops it (it
        // is readable already).
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    }
}

/// The signal pipe's read end, once installed.
pub fn signal_fd() -> Option<std::os::fd::RawFd> {
    Some(SIGNAL_PIPE[0].load(Ordering::SeqCst)).filter(|fd| *fd >= 0)
}

/// Empty the signal pipe (after it was seen readable).
pub fn drain_signal_pipe() {
    if let Some(fd) = signal_fd() {
        let mut buf = [0u8; 64];
        // SAFETY: reading into a live local buffer from a non-blocking
        // descriptor we own, until it is empty.
        while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
    }
}

/// Sleep until the signal pipe is readable (then empty it) or `timeout`
/// passes.
pub fn sleep_until_signal(timeout: Duration) {
    let Some(fd) = signal_fd() else {
        return std::thread::sleep(timeout);
    };
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut pfd, 1, ms) } > 0 {
        drain_signal_pipe();
    }
}

/// Record SIGTERM and SIGINT instead of dying of them (and make the
/// signal pipe they write to).
pub fn install_signal_handlers() {
    if SIGNAL_PIPE[0].load(Ordering::SeqCst) < 0 {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is valid for two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } == 0 {
            SIGNAL_PIPE[0].store(fds[0], Ordering::SeqCst);
            SIGNAL_PIPE[1].store(fds[1], Ordering::SeqCst);
        }
    }
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
    let started = start(
        &args.cmd,
        &args.key,
        guard.token(),
        args.grace,
        args.contain,
        (client.holder().id, "holds"),
    );
    let mut child = match started {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release();
            return Err(e);
        }
    };
    let is_lost = || {
        (lost.load(Ordering::SeqCst) || !guard.is_valid()).then(|| {
            guard
                .lost()
                .map_or("local deadline passed".to_owned(), |r| r.to_string())
        })
    };
    let what = format!("lease {:?}", args.key);
    let ended = supervise(
        &mut child,
        is_lost,
        args.grace,
        poll_of(args.ttl),
        (&what, &args.key),
        &args.cmd[0],
    );
    match ended {
        Ended::Exited { code, .. } => {
            if let Err(e) = guard.release() {
                let fields = [("key", json!(args.key)), ("error", json!(e.to_string()))];
                say(
                    Level::Warn,
                    &format!("releasing {:?}: {e}", args.key),
                    &fields,
                );
            }
            Ok(code)
        }
        Ended::Lost => {
            let _ = guard.release();
            Ok(EXIT_LOST)
        }
    }
}

/// How often a supervised CMD is looked at under a lease of `ttl`.
pub fn poll_of(ttl: Duration) -> Duration {
    Duration::from_millis((ms(ttl) / 20).clamp(5, 100))
}

/// Start CMD contained, with the lease's key and token in its environment
/// (`run`, `elect`), and say so (`who`: the holder and "holds" or
/// "leads"); 126/127 when it cannot be executed.
pub fn start(
    cmd: &[String],
    key: &str,
    token: u64,
    grace: Duration,
    mode: Mode,
    who: (HolderId, &str),
) -> Result<Contained, Fail> {
    let spawned = contain::spawn(Spec {
        cmd,
        env: vec![
            ("LEASEHOLD_TOKEN", token.to_string()),
            ("LEASEHOLD_KEY", key.to_owned()),
        ],
        stdin: Stdio::inherit(),
        stdout: Stdio::inherit(),
        inherit: Vec::new(),
        grace,
        mode,
    });
    let child = spawned.map_err(|e| match e {
        StartError::Exec { code, message } => Fail::new(code, message),
        StartError::Other(message) => Fail::new(EXIT_ERROR, message),
    })?;
    let (holder, role) = who;
    let message = format!(
        "{holder} {role} {key:?} with token {token}; running {:?} {} (supervisor pid {})",
        cmd[0],
        child.mode.describe(),
        child.pid()
    );
    let fields = [
        ("key", json!(key)),
        ("holder", json!(holder.to_string())),
        ("token", json!(token)),
        ("cmd", json!(cmd)),
        ("contain", json!(child.mode.name())),
        ("supervisor_pid", json!(child.pid())),
    ];
    say(Level::Info, &message, &fields);
    Ok(child)
}

/// How a supervised CMD ended.
pub enum Ended {
    /// By itself (or of a signal forwarded to its tree: `signalled`).
    Exited { code: u8, signalled: bool },
    /// Its lease was lost: its tree was stopped (SIGTERM, SIGKILL after
    /// the grace period) and is gone.
    Lost,
}

/// Wait for CMD while `lost` says nothing: SIGTERM/SIGINT to leasehold go
/// to CMD's whole tree (SIGKILL after `grace`); once `lost` gives a
/// reason, say so (naming `what`: the lease or the leadership, and its
/// key) and stop the tree.
pub fn supervise(
    child: &mut Contained,
    lost: impl Fn() -> Option<String>,
    grace: Duration,
    poll: Duration,
    what: (&str, &str),
    cmd: &str,
) -> Ended {
    let mut signalled = false;
    loop {
        if let Some(code) = child.try_wait() {
            return Ended::Exited { code, signalled };
        }
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            // Forwarded to the whole tree; SIGKILL after the grace period.
            signalled = true;
            child.stop(sig, grace);
        }
        if let Some(why) = lost() {
            let (what, key) = what;
            let fields = [
                ("key", json!(key)),
                ("reason", json!(why)),
                ("cmd", json!(cmd)),
            ];
            let message = format!("{what} lost ({why}); stopping {cmd:?}");
            say(Level::Warn, &message, &fields);
            child.stop_and_wait(libc::SIGTERM, grace);
            return Ended::Lost;
        }
        // Woken at once by CMD's exit or a signal (not a poll interval
        // later: that was most of what `run -- true` cost).
        child.sleep_until_exit(poll, signal_fd());
    }
}
