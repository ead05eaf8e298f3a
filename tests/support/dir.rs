//! A fresh, empty temporary directory per test, removed when dropped.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Dir(pub PathBuf);

impl Dir {
    /// `leasehold-test-{tag}-{pid}-{n}` in the system's temporary
    /// directory, emptied if a crashed run left it behind.
    pub fn new(tag: &str) -> Dir {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "leasehold-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    /// A SQLite database file in it.
    pub fn db(&self) -> PathBuf {
        self.0.join("q.db")
    }

    /// A file store's directory in it.
    pub fn leases(&self) -> PathBuf {
        self.0.join("leases")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
