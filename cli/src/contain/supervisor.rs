//! The supervisor side of containment: `leasehold __contain`, one thread
//! in a fresh image, that owns CMD's process tree and obeys the control
//! pipe (the protocol is in the parent module's docs).

use super::*;

/// Signals the supervisor and the init read from a signalfd instead of
/// dying of them: they obey leasehold (over the control pipe), not a
/// process-group signal meant for CMD.
const BLOCKED: [libc::c_int; 9] = [
    libc::SIGCHLD,
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGPIPE,
];

fn die(report: RawFd, message: &str) -> ! {
    let line = format!("err {message}\n");
    // SAFETY: writing a buffer we own to a descriptor we own.
    unsafe {
        libc::write(report, line.as_ptr().cast(), line.len());
    }
    std::process::exit(1)
}

fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn write_file(path: &str, text: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(text.as_bytes())
}

/// Enter a new PID namespace (its first child will be PID 1): directly as
/// root, else inside a new user namespace that maps our own ids.
fn enter_namespace() -> std::io::Result<()> {
    // SAFETY: unshare takes flags only; the supervisor is single-threaded.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } == 0 {
        return Ok(());
    }
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // SAFETY: as above.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID) } != 0 {
        return Err(last_error());
    }
    write_file("/proc/self/setgroups", "deny")?;
    write_file("/proc/self/uid_map", &format!("{uid} {uid} 1"))?;
    write_file("/proc/self/gid_map", &format!("{gid} {gid} 1"))?;
    Ok(())
}

fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
    }
}

/// Point stdin at /dev/null, so that the supervisor and the init do not
/// keep CMD's stdin pipe open (a payload writer must see EPIPE once CMD is
/// gone).
fn release_stdin() {
    if let Ok(null) = File::open("/dev/null") {
        // SAFETY: dup2 onto descriptor 0 of our own process.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
        }
    }
}

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset initializes the set; sigaddset adds valid signals.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// `leasehold __contain MODE GRACE_MS CONTROL_FD REPORT_FD -- CMD...`: the
/// supervisor's entry point. Never returns.
pub fn supervisor_main(args: Vec<OsString>) -> ! {
    let text = |i: usize| args.get(i).and_then(|a| a.to_str()).unwrap_or("");
    let control: RawFd = text(2).parse().unwrap_or(-1);
    let report: RawFd = text(3).parse().unwrap_or(-1);
    let (Some(mode), Ok(grace_ms), true, true) = (
        Mode::parse(text(0)),
        text(1).parse::<u64>(),
        control >= 0 && report >= 0,
        text(4) == "--" && args.len() > 5,
    ) else {
        let _ = writeln!(
            std::io::stderr(),
            "leasehold: __contain is internal to leasehold run and queue work"
        );
        std::process::exit(2)
    };
    set_cloexec(control);
    set_cloexec(report);
    let cmd: Vec<CString> = args[5..]
        .iter()
        .map(|a| CString::new(a.clone().into_vec()).unwrap_or_default())
        .collect();
    let grace = Duration::from_millis(grace_ms);
    let mode = enter(mode, report);
    let ok = format!("ok {}\n", mode.name());
    // SAFETY: writing a buffer we own to a descriptor we own.
    unsafe {
        libc::write(report, ok.as_ptr().cast(), ok.len());
    }
    if mode == Mode::Subreaper {
        // SAFETY: prctl with integer arguments.
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
        }
        let code = Supervisor::start(&cmd, control, report, grace, Scope::Tree).run();
        std::process::exit(code);
    }
    // Namespace: the next child is the namespace's PID 1.
    // SAFETY: the supervisor is single-threaded, so the child may run any code.
    match unsafe { libc::fork() } {
        -1 => die(report, &format!("fork: {}", last_error())),
        0 => {
            // SAFETY: prctl with integer arguments.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            }
            let code = Supervisor::start(&cmd, control, report, grace, Scope::Namespace).run();
            std::process::exit(code);
        }
        init => {
            // SAFETY: closing descriptors the init has its own copies of.
            unsafe {
                libc::close(report);
                libc::close(control);
            }
            release_stdin();
            std::process::exit(wait_for(init));
        }
    }
}

/// Block the signals the supervisor reads from a signalfd, and enter the
/// containment `mode` asks for (auto: a namespace if the kernel allows).
fn enter(mode: Mode, report: RawFd) -> Mode {
    let blocked = sigset(&BLOCKED);
    // SAFETY: blocking signals of our own (single-threaded) process.
    unsafe {
        libc::sigprocmask(libc::SIG_BLOCK, &blocked, std::ptr::null_mut());
    }
    match mode {
        Mode::Subreaper => Mode::Subreaper,
        Mode::Namespace => match enter_namespace() {
            Ok(()) => Mode::Namespace,
            Err(e) => die(
                report,
                &format!("cannot create a PID namespace ({e}); use --contain subreaper or auto"),
            ),
        },
        Mode::Auto => match enter_namespace() {
            Ok(()) => Mode::Namespace,
            Err(_) => Mode::Subreaper,
        },
    }
}

/// Wait for `pid` and return its status as a shell would.
fn wait_for(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-parameter.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return status_code(status);
        }
        if r < 0 && last_error().raw_os_error() != Some(libc::EINTR) {
            return 1;
        }
    }
}

fn status_code(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    }
}

/// Which processes "the whole tree" means.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Every process of our PID namespace (we are its PID 1).
    Namespace,
    /// Our descendants, found through /proc (we are a subreaper).
    Tree,
}

struct Supervisor {
    scope: Scope,
    cmd_pid: libc::pid_t,
    cmd_code: Option<i32>,
    control: Option<RawFd>,
    signals: RawFd,
    grace: Duration,
    /// SIGKILL the tree at this instant.
    kill_at: Option<Instant>,
    stopping: bool,
    killing: bool,
}

impl Supervisor {
    /// Fork CMD and set up the loop's descriptors.
    fn start(
        cmd: &[CString],
        control: RawFd,
        report: RawFd,
        grace: Duration,
        scope: Scope,
    ) -> Supervisor {
        // SAFETY: the calling process is single-threaded.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            exec_cmd(cmd, report);
        }
        if pid < 0 {
            die(report, &format!("fork: {}", last_error()));
        }
        // SAFETY: closing our copy of the report pipe (CMD has its own).
        unsafe {
            libc::close(report);
        }
        release_stdin();
        let mask = sigset(&BLOCKED);
        // SAFETY: a signalfd over the signals this process blocks.
        let signals = unsafe { libc::signalfd(-1, &mask, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
        Supervisor {
            scope,
            cmd_pid: pid,
            cmd_code: None,
            control: Some(control),
            signals,
            grace,
            kill_at: None,
            stopping: false,
            killing: false,
        }
    }

    /// Until the tree is empty; returns CMD's status.
    fn run(mut self) -> i32 {
        loop {
            let empty = self.reap();
            if let Some(code) = self.cmd_code {
                if empty {
                    return code;
                }
                if !self.stopping {
                    // CMD is done; what it left behind goes too.
                    self.begin_stop(libc::SIGTERM, self.grace);
                }
            } else if empty {
                return 1;
            }
            if self.kill_at.is_some_and(|at| Instant::now() >= at) {
                self.kill_at = None;
                self.killing = true;
            }
            if self.killing {
                // Repeated: a process may fork between two walks.
                self.signal_all(libc::SIGKILL);
            }
            self.wait_for_input();
        }
    }

    fn begin_stop(&mut self, sig: libc::c_int, grace: Duration) {
        self.stopping = true;
        self.signal_all(sig);
        self.signal_all(libc::SIGCONT);
        let at = Instant::now() + grace;
        self.kill_at = Some(self.kill_at.map_or(at, |k| k.min(at)));
    }

    fn poll_timeout_ms(&self) -> libc::c_int {
        if self.killing {
            return 20;
        }
        let mut ms = match self.kill_at {
            Some(at) => at.saturating_duration_since(Instant::now()).as_millis() as i64 + 1,
            None => -1,
        };
        if self.stopping && self.scope == Scope::Tree {
            // New orphans arrive without a signal we could wait for.
            ms = if ms < 0 { 50 } else { ms.min(50) };
        }
        ms.min(i64::from(i32::MAX)) as libc::c_int
    }

    fn wait_for_input(&mut self) {
        let mut fds = [
            libc::pollfd {
                fd: self.control.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.signals,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let timeout = self.poll_timeout_ms();
        // SAFETY: `fds` is valid for two pollfd entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if n <= 0 {
            return;
        }
        if fds[1].revents != 0 {
            let mut buf = [0u8; 128 * 8];
            // SAFETY: draining the non-blocking signalfd into our buffer.
            while unsafe { libc::read(self.signals, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
        }
        if fds[0].revents != 0 {
            self.read_control();
        }
    }

    fn read_control(&mut self) {
        let Some(fd) = self.control else { return };
        let mut buf = [0u8; 256];
        // SAFETY: reading into our buffer from a descriptor we own.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && last_error().raw_os_error() == Some(libc::EINTR) {
            return;
        }
        if n <= 0 {
            // leasehold is gone: nobody renews the lease any more.
            // SAFETY: closing our own descriptor.
            unsafe {
                libc::close(fd);
            }
            self.control = None;
            self.killing = true;
            self.signal_all(libc::SIGKILL);
            return;
        }
        let text = String::from_utf8_lossy(&buf[..n as usize]).into_owned();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("stop"), Some(sig), Some(ms)) => {
                    let sig = sig.parse().unwrap_or(libc::SIGTERM);
                    let ms = ms.parse().unwrap_or(0);
                    self.begin_stop(sig, Duration::from_millis(ms));
                }
                (Some("kill"), _, _) => {
                    self.killing = true;
                    self.signal_all(libc::SIGKILL);
                }
                _ => {}
            }
        }
    }

    /// Reap every child that has exited; true once there are none left.
    fn reap(&mut self) -> bool {
        loop {
            let mut status = 0;
            // SAFETY: `status` is a valid out-parameter.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid > 0 {
                if pid == self.cmd_pid {
                    self.cmd_code = Some(status_code(status));
                }
                continue;
            }
            if pid == 0 {
                return false;
            }
            return last_error().raw_os_error() == Some(libc::ECHILD);
        }
    }

    fn signal_all(&self, sig: libc::c_int) {
        match self.scope {
            // From a namespace's PID 1, -1 means every other process in it.
            // SAFETY: kill with plain integers.
            Scope::Namespace => unsafe {
                libc::kill(-1, sig);
            },
            Scope::Tree => {
                for pid in descendants(std::process::id() as libc::pid_t) {
                    // SAFETY: as above.
                    unsafe {
                        libc::kill(pid, sig);
                    }
                }
            }
        }
    }
}

/// The descendants of `root`, from each process's parent in /proc.
fn descendants(root: libc::pid_t) -> Vec<libc::pid_t> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read(entry.path().join("stat")) else {
                continue;
            };
            // The command name is in parentheses and may hold anything:
            // the fields we want follow its last ')'.
            let Some(close) = stat.iter().rposition(|&b| b == b')') else {
                continue;
            };
            let rest = String::from_utf8_lossy(&stat[close + 1..]).into_owned();
            if let Some(ppid) = rest
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<libc::pid_t>().ok())
            {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|&&(_, ppid)| ppid == p)
                .map(|&(pid, _)| pid),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// In the forked child: restore what CMD should start with, then exec it.
/// On failure, report the errno and exit 127 (not found) or 126.
fn exec_cmd(cmd: &[CString], report: RawFd) -> ! {
    let empty = sigset(&[]);
    // SAFETY: resetting our own signal mask and dispositions before exec;
    // the supervisor's blocked signals and ignored SIGPIPE are not CMD's.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let mut argv: Vec<*const libc::c_char> = cmd.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: argv is a NULL-terminated array of valid C strings.
    unsafe {
        libc::execvp(argv[0], argv.as_ptr());
    }
    let errno = last_error().raw_os_error().unwrap_or(libc::ENOENT);
    let line = format!("exec {errno}\n");
    // SAFETY: writing our buffer to the report pipe, then exiting at once.
    unsafe {
        libc::write(report, line.as_ptr().cast(), line.len());
        libc::_exit(if errno == libc::ENOENT { 127 } else { 126 });
    }
}

/// Whether this invocation is the supervisor (`argv[1] == "__contain"`);
/// if so, the remaining arguments.
pub fn supervisor_args() -> Option<Vec<OsString>> {
    let mut args = std::env::args_os().skip(1);
    let first = args.next()?;
    (first.as_bytes() == b"__contain").then(|| args.collect())
}
