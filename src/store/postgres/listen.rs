//! Wake-ups across processes: a transaction that frees a lease slot or
//! changes a queue's plan for its idle workers ([`Wake::JobReady`]) sends
//! `pg_notify` on the schema's channel; one thread per store handle
//! (started on the first wait, with its own connection) listens and bumps
//! the counter of the event each notification names. A connection that
//! died silently (a half-open socket after a failover) would lose every
//! note, so a wait that hears nothing for [`LISTEN_WAIT`] asks the server
//! whether the session is alive, and reconnects (bumping every epoch) if
//! not.

use super::pool::Connector;
use crate::store::Wake;
use crate::sync::{lock, thread, Condvar, Mutex};
use fallible_iterator::FallibleIterator;
use std::sync::Arc;
use std::time::Duration;

/// Longest the listener thread waits for a notification before it looks
/// at its stop flag again: how long it outlives its store handle when no
/// `stop` note reached it (an idle session sends one at the handle's
/// drop). Not a poll: a wait that times out bumps nothing.
const LISTEN_WAIT: Duration = Duration::from_secs(5);

/// Wake-up counters fed by the listener thread.
#[derive(Default)]
pub(super) struct Listener {
    state: Mutex<ListenState>,
    changed: Condvar,
}

#[derive(Default)]
struct ListenState {
    epochs: [u64; 2],
    started: bool,
    stop: bool,
}

impl Listener {
    /// Start the listener thread once.
    pub fn start(self: &Arc<Self>, connector: &Connector, channel: &str) {
        let mut st = lock(&self.state);
        if st.started {
            return;
        }
        st.started = true;
        drop(st);
        let listener = self.clone();
        let connector = connector.clone();
        let channel = channel.to_owned();
        let spawned = thread::Builder::new()
            .name("leasehold-pg-listen".into())
            .spawn(move || listener.listen(&connector, &channel));
        if spawned.is_err() {
            lock(&self.state).started = false;
        }
    }

    /// Ask the thread to end (it notices at a `stop` note on the channel,
    /// or within [`LISTEN_WAIT`]); whether it was started (and so whether
    /// a note is worth sending).
    pub fn stop(&self) -> bool {
        let mut st = lock(&self.state);
        st.stop = true;
        st.started
    }

    /// See [`crate::Store::epoch`].
    pub fn epoch(&self, wake: Wake) -> u64 {
        lock(&self.state).epochs[wake.index()]
    }

    /// See [`crate::Store::wait_epoch`].
    pub fn wait(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        let st = lock(&self.state);
        if st.epochs[wake.index()] != epoch {
            return true;
        }
        let (st, _) = match self.changed.wait_timeout(st, timeout) {
            Ok(pair) => pair,
            Err(poisoned) => poisoned.into_inner(),
        };
        st.epochs[wake.index()] != epoch
    }

    /// See [`crate::Store::interrupt_waits`].
    pub fn interrupt(&self) {
        let _st = lock(&self.state);
        self.changed.notify_all();
    }

    /// Bump the epoch of `which` (every epoch when `None`).
    fn bump(&self, which: Option<usize>) {
        let mut st = lock(&self.state);
        for (i, epoch) in st.epochs.iter_mut().enumerate() {
            if which.is_none_or(|w| w == i) {
                *epoch = epoch.wrapping_add(1);
            }
        }
        drop(st);
        self.changed.notify_all();
    }

    /// The thread: LISTEN on the schema's channel and bump the epoch each
    /// notification names; reconnect after a failure (bumping every epoch,
    /// since notifications may have been missed).
    fn listen(&self, connector: &Connector, channel: &str) {
        let stopped = || lock(&self.state).stop;
        while !stopped() {
            let client = connector.connect().and_then(|mut c| {
                c.batch_execute(&format!("LISTEN \"{channel}\""))?;
                Ok(c)
            });
            let Ok(mut client) = client else {
                crate::sync::sleep(Duration::from_millis(500));
                continue;
            };
            self.bump(None);
            while !stopped() {
                let next = {
                    let mut notes = client.notifications();
                    let next = notes.timeout_iter(LISTEN_WAIT).next();
                    next
                };
                match next {
                    // A handle's stop (its own or another process's): it
                    // announces no event.
                    Ok(Some(n)) if n.payload() == "stop" => {}
                    Ok(Some(n)) => self.bump(n.payload().parse::<usize>().ok().filter(|&w| w < 2)),
                    // Quiet: unless stopping, make sure the session lives.
                    Ok(None) if stopped() => {}
                    Ok(None) if client.is_valid(LISTEN_WAIT).is_ok() => {}
                    _ => break,
                }
            }
        }
    }
}
