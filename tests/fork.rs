//! L5 with a real fork: a child that inherits a client, a lease guard and a
//! claimed job gets `Forked` from each, and dropping them in the child
//! leaves the parent's lease and claim untouched.

#[path = "support/fork.rs"]
mod fork_support;

use fork_support::{child_passed, child_refuses};
use leasehold::{Client, JobSpec, JobState, MemStore};
use std::time::Duration;

fn child_checks(client: &Client, guard: leasehold::LeaseGuard, job: leasehold::ClaimedJob) -> i32 {
    let refused = child_refuses(client, &guard, &job);
    if refused != 0 {
        return refused;
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
    child_passed(pid);

    // The parent still holds its lease and completes its job.
    assert!(guard.is_valid());
    guard.renew().unwrap();
    assert_eq!(client.inspect("k").unwrap().holders[0].token, token);
    job.complete().unwrap();
    assert_eq!(q.stats().unwrap().get(JobState::Done), 1);
    guard.release().unwrap();
}
