//! Containment: no process started under CMD outlives the lease it runs
//! under (`run`, `queue work`).
//!
//! # Shape
//! leasehold has many threads, so it never forks without exec. It spawns a
//! *supervisor*, itself re-executed as `leasehold __contain` (one thread, a
//! fresh image), and talks to it over two pipes. The supervisor contains
//! CMD in one of two ways:
//!
//! - **namespace** (the strongest, used whenever the kernel allows it: as
//!   root, or through an unprivileged user namespace): the supervisor
//!   unshares a PID namespace and forks its init (PID 1 there), which forks
//!   CMD. When the init exits, the kernel SIGKILLs everything left in the
//!   namespace, so nothing started under CMD survives it, whatever it does:
//!   `setsid`, double forks, `nohup`. The init has `PR_SET_PDEATHSIG`
//!   SIGKILL towards the supervisor, so killing the supervisor kills the
//!   namespace too.
//! - **subreaper** (the fallback): the supervisor marks itself a child
//!   subreaper (`PR_SET_CHILD_SUBREAPER`) and forks CMD; orphaned
//!   descendants (a shell's background jobs, daemons that `setsid` and
//!   double-fork) are re-parented to it instead of to the system's init, and
//!   it finds the whole tree by walking `/proc`. What escapes: everything, if
//!   the supervisor itself is SIGKILLed (nothing is left to walk the tree;
//!   CMD itself still dies of `PR_SET_PDEATHSIG`), and a process that is
//!   re-parented between a walk and the next one can be missed by that
//!   walk (the walk repeats while anything is left).
//!
//! # Protocol
//! - control pipe, leasehold → supervisor: `stop SIG MS` sends SIG (then
//!   SIGCONT, so stopped processes see it) to the whole tree and SIGKILLs
//!   whatever is left MS later; `kill` SIGKILLs the tree now. **End of file**
//!   (leasehold is gone, even by SIGKILL: the kernel closes its end) kills
//!   the tree at once: nobody renews the lease any more.
//! - report pipe, supervisor → leasehold: `ok MODE` once contained (or
//!   `err MESSAGE`), then `exec ERRNO` if CMD could not be executed. The
//!   pipe is close-on-exec, so its end of file means CMD is running.
//!
//! # Invariants
//! The supervisor exits only once no process of the tree is left (its
//! `waitpid` says it has no children), with CMD's status (128 + N when a
//! signal N killed it). When CMD exits by itself, whatever it left behind
//! gets SIGTERM and, after the grace period, SIGKILL, before the
//! supervisor exits (and so before leasehold releases the lease).

mod supervisor;
pub use supervisor::{supervisor_args, supervisor_main};

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How CMD's process tree is contained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// A PID namespace when the kernel allows it, else a subreaper.
    Auto,
    /// CMD under the init of its own PID namespace; an error if the kernel
    /// refuses.
    Namespace,
    /// A child subreaper that walks its process tree (the fallback).
    Subreaper,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Namespace => "namespace",
            Mode::Subreaper => "subreaper",
        }
    }

    fn parse(text: &str) -> Option<Mode> {
        [Mode::Auto, Mode::Namespace, Mode::Subreaper]
            .into_iter()
            .find(|m| m.name() == text)
    }

    /// How the mode reads in messages.
    pub fn describe(self) -> &'static str {
        match self {
            Mode::Namespace => "in its own PID namespace",
            Mode::Subreaper => "under a subreaper supervisor",
            Mode::Auto => "contained",
        }
    }
}

/// What to run and how.
pub struct Spec<'a> {
    /// CMD and its arguments.
    pub cmd: &'a [String],
    /// Extra environment for CMD.
    pub env: Vec<(&'static str, String)>,
    /// CMD's stdin and stdout (stderr is inherited).
    pub stdin: Stdio,
    pub stdout: Stdio,
    /// More descriptors CMD inherits: (ours, its number in CMD), the
    /// number below [`FIRST_PRIVATE_FD`] (e.g. 3, which any shell can
    /// write to).
    pub inherit: Vec<(RawFd, RawFd)>,
    /// How long leftovers get between SIGTERM and SIGKILL after CMD exits.
    pub grace: Duration,
    pub mode: Mode,
}

/// Why CMD did not start.
pub enum StartError {
    /// CMD could not be executed: exit code 127 (not found) or 126 (found,
    /// not executable), as env(1) and timeout(1).
    Exec { code: u8, message: String },
    /// Containment or the supervisor failed.
    Other(String),
}

/// A running, contained CMD, as leasehold sees it.
pub struct Contained {
    supervisor: Child,
    control: Option<File>,
    /// The mode in force.
    pub mode: Mode,
    stop_sent: Option<(Instant, Duration)>,
    /// The supervisor as a pidfd (readable once it has exited), so a
    /// waiter sleeps until the exit instead of polling; `None` on a kernel
    /// without `pidfd_open` (before Linux 5.3), where waiting polls.
    exited: Option<OwnedFd>,
}

/// The supervisor's own descriptors are moved to this number or above, so
/// that the numbers below it are free for [`Spec::inherit`].
pub const FIRST_PRIVATE_FD: RawFd = 10;

/// `fd` moved to a number at or above [`FIRST_PRIVATE_FD`] (close-on-exec).
fn above_private(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor we then own.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, FIRST_PRIVATE_FD) };
    if moved < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just created and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

/// A pipe (read end, write end), both close-on-exec.
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is valid for two ints; pipe2 fills both on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A pidfd of the child `pid` (close-on-exec), if the kernel has them.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; the pid is our own unreaped child, so it names no other process.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: a descriptor just created and owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An exit status as a shell reports it: the code, or 128 + the signal.
pub fn code_of(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => (c & 0xff) as u8,
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        _ => 1,
    }
}

/// Start CMD contained. Returns once CMD has been executed (or failed to).
pub fn spawn(spec: Spec<'_>) -> Result<Contained, StartError> {
    let other = |what: &str, e: std::io::Error| StartError::Other(format!("{what}: {e}"));
    let (ctl_r, ctl_w) = pipe().map_err(|e| other("creating the control pipe", e))?;
    let (rep_r, rep_w) = pipe().map_err(|e| other("creating the report pipe", e))?;
    let moved = above_private(ctl_r).and_then(|c| Ok((c, above_private(rep_w)?)));
    let (ctl_r, rep_w) = moved.map_err(|e| other("placing the supervisor's pipes", e))?;
    let (ctl_fd, rep_fd) = (ctl_r.as_raw_fd(), rep_w.as_raw_fd());
    let mut c = Command::new("/proc/self/exe");
    c.arg0("leasehold-supervisor")
        .arg("__contain")
        .arg(spec.mode.name())
        .arg(spec.grace.as_millis().to_string())
        .arg(ctl_fd.to_string())
        .arg(rep_fd.to_string())
        .arg("--")
        .args(spec.cmd)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(spec.stdin)
        .stdout(spec.stdout);
    let inherit = spec.inherit.clone();
    // SAFETY: fcntl and dup2 are async-signal-safe; in the child, they
    // clear close-on-exec on the two descriptors the supervisor inherits
    // and give CMD's inherited descriptors their numbers, all below the
    // two pipes' (no clash).
    unsafe {
        c.pre_exec(move || {
            for fd in [ctl_fd, rep_fd] {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for &(ours, theirs) in &inherit {
                let ok = if ours == theirs {
                    libc::fcntl(ours, libc::F_SETFD, 0) == 0
                } else {
                    libc::dup2(ours, theirs) == theirs
                };
                if !ok {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let spawned = c.spawn();
    drop((ctl_r, rep_w));
    let supervisor = spawned.map_err(|e| other("starting the supervisor", e))?;
    let exited = pidfd_open(supervisor.id());
    let mut contained = Contained {
        supervisor,
        control: Some(File::from(ctl_w)),
        mode: Mode::Auto,
        stop_sent: None,
        exited,
    };
    contained.read_report(File::from(rep_r), &spec.cmd[0])?;
    Ok(contained)
}

impl Contained {
    /// Read the supervisor's report until its end of file (CMD executed):
    /// the mode it contains CMD in, or why CMD did not start.
    fn read_report(&mut self, mut pipe: File, cmd: &str) -> Result<(), StartError> {
        let mut report = String::new();
        if let Err(e) = pipe.read_to_string(&mut report) {
            self.kill_now();
            return Err(StartError::Other(format!(
                "reading the supervisor's report: {e}"
            )));
        }
        let mut lines = report.lines();
        match lines.next().and_then(|l| l.split_once(' ')) {
            Some(("ok", mode)) => self.mode = Mode::parse(mode).unwrap_or(Mode::Auto),
            Some(("err", message)) => {
                let _ = self.supervisor.wait();
                return Err(StartError::Other(message.to_owned()));
            }
            _ => {
                let status = self.wait();
                return Err(StartError::Other(format!(
                    "the supervisor exited with status {status} before starting {:?}",
                    cmd
                )));
            }
        }
        if let Some(errno) = lines
            .next()
            .and_then(|l| l.strip_prefix("exec "))
            .and_then(|n| n.parse::<i32>().ok())
        {
            let code = self.wait();
            let e = std::io::Error::from_raw_os_error(errno);
            return Err(StartError::Exec {
                code,
                message: format!("cannot run {:?}: {e}", cmd),
            });
        }
        Ok(())
    }

    fn send(&mut self, line: &str) {
        if let Some(c) = self.control.as_mut() {
            let _ = c.write_all(line.as_bytes());
        }
    }

    /// The supervisor's pid.
    pub fn pid(&self) -> u32 {
        self.supervisor.id()
    }

    /// Send `sig` to the whole tree, SIGKILL after `grace` (a later call
    /// never extends an earlier deadline).
    pub fn stop(&mut self, sig: i32, grace: Duration) {
        self.send(&format!("stop {sig} {}\n", grace.as_millis()));
        let now = Instant::now();
        self.stop_sent = Some(match self.stop_sent {
            Some((at, g)) if at + g <= now + grace => (at, g),
            _ => (now, grace),
        });
    }

    /// SIGKILL the whole tree now.
    pub fn kill_now(&mut self) {
        self.send("kill\n");
        // Closing the pipe means the same, should the write have failed.
        self.control = None;
    }

    /// CMD's status once the whole tree is gone.
    pub fn try_wait(&mut self) -> Option<u8> {
        match self.supervisor.try_wait() {
            Ok(Some(status)) => Some(code_of(status)),
            Ok(None) => {
                // Safety net: a supervisor that outlives its deadline by far
                // is killed (in namespace mode this kills the namespace).
                if let Some((at, grace)) = self.stop_sent {
                    if at.elapsed() > grace + Duration::from_secs(3) {
                        let _ = self.supervisor.kill();
                    }
                }
                None
            }
            Err(_) => Some(1),
        }
    }

    /// Sleep until the supervisor exits (the whole tree is gone), the
    /// signal pipe `signals` turns readable (then empty it), or `timeout`
    /// passes, whichever comes first; then look with
    /// [`Contained::try_wait`]. Without a pidfd it just sleeps.
    pub fn sleep_until_exit(&self, timeout: Duration, signals: Option<RawFd>) {
        let Some(fd) = &self.exited else {
            return std::thread::sleep(timeout);
        };
        let watch = |fd: RawFd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut fds = [watch(fd.as_raw_fd()), watch(signals.unwrap_or(-1))];
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: two valid pollfds (a negative fd is ignored by poll); an
        // interrupted poll returns early, which is what the caller wants.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if fds[1].revents & libc::POLLIN != 0 {
            crate::run::drain_signal_pipe();
        }
    }

    /// Wait until the whole tree is gone; CMD's status.
    pub fn wait(&mut self) -> u8 {
        loop {
            if let Some(code) = self.try_wait() {
                return code;
            }
            self.sleep_until_exit(Duration::from_millis(50), None);
        }
    }

    /// [`Contained::stop`], then wait.
    pub fn stop_and_wait(&mut self, sig: i32, grace: Duration) -> u8 {
        self.stop(sig, grace);
        self.wait()
    }
}

impl Drop for Contained {
    fn drop(&mut self) {
        if matches!(self.supervisor.try_wait(), Ok(None)) {
            self.kill_now();
            let _ = self.supervisor.wait();
        }
    }
}
