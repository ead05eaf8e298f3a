//! L5 with a real fork: a child that inherits a client, a lease guard and a
//! claimed job gets `Forked` from each, and dropping them in the child
//! leaves the parent's lease and claim untouched.

use leasehold::{Client, Error, JobSpec, JobState, MemStore};
use std::time::Duration;

fn child_checks(client: &Client, guard: leasehold::LeaseGuard, job: leasehold::ClaimedJob) -> i32 {
    let forked = |r: leasehold::Result<()>| matches!(r, Err(Error::Forked { .. }));
    if !forked(guard.renew()) {
        return 10;
    }
    if guard.is_valid() {
        return 11;
    }
    if !forked(job.complete()) {
        return 12;
    }
    if !forked(job.heartbeat().map(|_| ())) {
        return 13;
    }
    if !forked(
        client
            .try_acquire("other", Duration::from_secs(1))
            .map(|_| ()),
    ) {
        return 14;
    }
    if !forked(guard.keep_alive(|_| {})) {
        return 15;
    }
    // Dropping in the child must do nothing to the parent's lease and claim.
    drop(guard);
    drop(job);
    0
}

#[test]
fn forked_child_cannot_touch_parent_handles() {
    let client = Client::new(MemStore::new());
    let guard = client.try_acquire("k", Duration::from_secs(30)).unwrap();
    let token = guard.token();
    let q = client.queue("q").unwrap();
    q.push(&JobSpec::new("x")).unwrap();
    let job = q.claim(Duration::from_secs(30)).unwrap().unwrap();

    // SAFETY: the child only runs leasehold's checks on memory it inherited
    // and leaves with _exit, without returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = child_checks(&client, guard, job);
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert!(libc::WIFEXITED(status), "child died: status {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child check failed");

    // The parent still holds its lease and completes its job.
    assert!(guard.is_valid());
    guard.renew().unwrap();
    assert_eq!(client.inspect("k").unwrap().holders[0].token, token);
    job.complete().unwrap();
    assert_eq!(q.stats().unwrap().get(JobState::Done), 1);
    guard.release().unwrap();
}
