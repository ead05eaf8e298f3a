//! What the fork tests share: the checks a forked child makes on the
//! handles it inherited, and the parent's wait for its verdict.

use leasehold::{ClaimedJob, Client, Error, LeaseGuard};
use std::time::Duration;

/// Whether `r` is the refusal a forked child must get.
pub fn forked(r: leasehold::Result<()>) -> bool {
    matches!(r, Err(Error::Forked { .. }))
}

/// In the child: every call on inherited handles that would act for the
/// parent is refused (renew, validity, heartbeat, acquire, keep-alive,
/// complete); 0, or the code of the first that was not. The caller drops
/// or releases the guard itself, as its test requires.
pub fn child_refuses(client: &Client, guard: &LeaseGuard, job: &ClaimedJob) -> i32 {
    if !forked(guard.renew()) {
        return 10;
    }
    if guard.is_valid() {
        return 11;
    }
    if !forked(job.heartbeat().map(|_| ())) {
        return 12;
    }
    if !forked(
        client
            .try_acquire("other", Duration::from_secs(1))
            .map(|_| ()),
    ) {
        return 13;
    }
    if !forked(guard.keep_alive(|_| {})) {
        return 14;
    }
    if !forked(job.complete()) {
        return 15;
    }
    0
}

/// In the parent: wait for child `pid` and require that it exited with 0.
pub fn child_passed(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert!(libc::WIFEXITED(status), "child died: status {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child check failed");
}
