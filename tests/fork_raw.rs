//! L5 with a child made by a raw `clone` system call, which skips libc's
//! `pthread_atfork` handlers (as a runtime that forks on its own does): the
//! child still gets `Forked` from every handle it inherited, including the
//! calls that used to check only the atfork generation (renew, acquire,
//! heartbeat, `is_valid`). Its own binary, so that no other test thread is
//! running when the child is made.

#[path = "support/fork.rs"]
mod fork_support;

use fork_support::{child_passed, child_refuses, forked};
use leasehold::{Client, JobSpec, JobState, MemStore};
use std::time::Duration;

/// What the child checks; 0 when every handle refused it.
fn child_checks(client: &Client, guard: leasehold::LeaseGuard, job: leasehold::ClaimedJob) -> i32 {
    let refused = child_refuses(client, &guard, &job);
    if refused != 0 {
        return refused;
    }
    if !forked(guard.release()) {
        return 16;
    }
    0
}

#[test]
fn a_child_of_a_raw_clone_cannot_touch_parent_handles() {
    let client = Client::new(MemStore::new());
    let guard = client.try_acquire("k", Duration::from_secs(30)).unwrap();
    let token = guard.token();
    let q = client.queue("q").unwrap();
    q.push(&JobSpec::new("x")).unwrap();
    let job = q.claim(Duration::from_secs(30)).unwrap().unwrap();

    // SAFETY: clone with only SIGCHLD is fork without libc's handlers; the
    // child runs leasehold's checks on memory it inherited and leaves with
    // _exit, without returning into the test harness.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::c_long::from(libc::SIGCHLD),
            0,
            0,
            0,
            0,
        )
    };
    assert!(pid >= 0, "clone failed");
    if pid == 0 {
        let code = child_checks(&client, guard, job);
        unsafe { libc::_exit(code) };
    }
    child_passed(libc::pid_t::try_from(pid).unwrap());

    // The parent's handles still work (the child's refusals are the checks:
    // a mem store is the child's own copy after the fork).
    assert_eq!(client.inspect("k").unwrap().holders[0].token, token);
    assert!(guard.is_valid());
    assert_eq!(q.stats().unwrap().get(JobState::Running), 1);
    job.complete().unwrap();
    guard.release().unwrap();
}
