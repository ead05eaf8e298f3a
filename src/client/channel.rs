//! [`Channel`]: a closable queue between a driver's threads (requests to
//! store threads, jobs to handler threads, replies back), and
//! [`spawn_waker`], the thread that turns a store's announcements into
//! deliveries.

use crate::store::{Store, Wake};
use crate::sync::{lock, nap, thread, Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Call `deliver` whenever `store` announces `wake`, on a thread of its
/// own, until `quit` is set. Detached, so that a driver that stops never
/// waits out the thread's current wait (it ends at its next wake-up or
/// within a second, holding its store handle until then): `Queue::work
/// --drain` and `elect --once` return as soon as they are done, and an
/// idle one wakes once a second.
pub(crate) fn spawn_waker(
    store: Arc<dyn Store>,
    wake: Wake,
    quit: Arc<AtomicBool>,
    deliver: impl Fn() + Send + 'static,
) -> crate::error::Result<()> {
    thread::Builder::new()
        .name("leasehold-waker".to_owned())
        .spawn(move || {
            while !quit.load(Ordering::SeqCst) {
                let epoch = store.epoch(wake);
                if store.wait_epoch(wake, epoch, Duration::from_secs(1))
                    && !quit.load(Ordering::SeqCst)
                {
                    deliver();
                }
            }
        })
        .map(drop)
        .map_err(|e| crate::Error::store("starting the waker thread", e.to_string()))
}

/// A closable queue between threads.
pub(crate) struct Channel<T> {
    items: Mutex<(VecDeque<T>, bool)>,
    cv: Condvar,
}

impl<T> Channel<T> {
    pub(crate) fn new() -> Self {
        Channel {
            items: Mutex::new((VecDeque::new(), false)),
            cv: Condvar::new(),
        }
    }

    pub(crate) fn push(&self, item: T) {
        lock(&self.items).0.push_back(item);
        self.cv.notify_one();
    }

    /// The next item, waiting for one; `None` once closed.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut items = lock(&self.items);
        loop {
            if let Some(item) = items.0.pop_front() {
                return Some(item);
            }
            if items.1 {
                return None;
            }
            items = match self.cv.wait(items) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
    }

    pub(crate) fn close(&self) {
        lock(&self.items).1 = true;
        self.cv.notify_all();
    }

    /// Everything queued, waiting up to `timeout` for something when
    /// nothing is (empty once closed, or when the wait runs out).
    pub(crate) fn drain_wait(&self, timeout: Duration) -> Vec<T> {
        let mut items = lock(&self.items);
        if items.0.is_empty() && !items.1 && !timeout.is_zero() {
            items = nap(&self.cv, &self.items, items, timeout);
        }
        items.0.drain(..).collect()
    }
}
