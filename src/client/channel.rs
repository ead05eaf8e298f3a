//! [`Channel`]: a closable queue between a driver's threads (requests to
//! store threads, jobs to handler threads, replies back).

use crate::sync::{lock, nap, Condvar, Mutex};
use std::collections::VecDeque;
use std::time::Duration;

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
