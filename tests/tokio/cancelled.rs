//! An acquire cancelled while its store call runs leaves nothing behind
//! in its client.

use crate::door::Valve;
use crate::election::runtime;
use leasehold::tokio::Client;
use std::time::Duration;

/// The call extends a grant of the client's holder (one `detach`ed), so
/// the call itself marks the key for it; the acquire is cancelled (a
/// timeout drops its future) while the call is held in the store. The
/// answer nobody reads takes the mark back: the client's next acquire
/// gets the key at once. Before, the mark stayed, and the client refused
/// itself the key until the grant ran out in the store (30 s here).
#[test]
fn an_acquire_cancelled_during_its_store_call_leaves_the_key_unmarked() {
    let valve = Valve::new();
    let client = Client::new(leasehold::Client::builder_shared(valve.clone()).build());
    runtime().block_on(async {
        let ttl = Duration::from_secs(30);
        let (_, token) = client.try_acquire("k", ttl).await.unwrap().detach().await;
        valve.hold_next();
        let cancelled =
            tokio::time::timeout(Duration::from_millis(100), client.try_acquire("k", ttl)).await;
        assert!(cancelled.is_err(), "the held call answered: {cancelled:?}");
        assert!(valve.wait_held());
        valve.open();
        // The held call ends on its blocking thread, its answer dropped.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let guard = client.try_acquire("k", ttl).await.unwrap();
        assert_eq!(guard.token(), token);
        assert!(guard.renewed());
        guard.release().await.unwrap();
    });
}
