//! `leasehold._native`: the leasehold crate for Python. Every rule (the
//! lease and job rules, the holder and worker machines, the keep-alive,
//! the worker loop) is the crate's; this module only converts arguments
//! and errors, releases the GIL around every blocking call, and checks
//! for signals while it waits, so Ctrl-C interrupts a wait within 100 ms.
//! The pure-Python package around it (`python/leasehold/`) adds the exceptions,
//! context managers, payload conversions and the sherlock-compatible
//! module.
//!
//! Fork: every handle remembers its process (the crate's fork guard). In a
//! child made by `os.fork()` a lease, a job or a store of the parent answers
//! `leasehold.Forked` and never renews, releases or settles anything; the
//! keep-alive threads are not in the child, and no lock the child takes
//! was held by them.

#![allow(clippy::disallowed_methods)] // waits with real time (the GIL's slices)

use leasehold::{
    ClaimedJob, Client, Error, Holder, JobId, JobOutcome, JobSpec, LeaseGuard, LeaseOptions,
    Store as _, WorkOptions,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod job;
mod queue;

use job::Job;
use queue::Queue;

/// A queue's limits as Python sees them (`Queue.limits`).
type Limits4 = (Option<u32>, Option<u32>, Option<String>, Option<String>);

/// The longest a blocking call holds on before looking for signals.
const SIGNAL_SLICE: Duration = Duration::from_millis(100);

/// The Python exception for a leasehold error (classes of
/// `leasehold.errors`), with the error's text.
fn py_err(py: Python<'_>, e: Error) -> PyErr {
    let class = match &e {
        Error::Held { .. } => "LeaseHeld",
        Error::Lost { .. } => "LeaseLost",
        Error::Invalid { .. } => "InvalidInput",
        Error::Forked { .. } => "Forked",
        Error::NotFound(_) => "NotFound",
        Error::Busy { .. } | Error::Store { .. } | Error::Moved { .. } => "StoreError",
        _ => "Error",
    };
    raise(py, class, e.to_string())
}

/// An instance of `leasehold.errors.<class>` with `text`.
fn raise(py: Python<'_>, class: &str, text: String) -> PyErr {
    let made = py.import("leasehold.errors").and_then(|m| {
        let class = m.getattr(class)?;
        class.call1((text,))
    });
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(import) => import,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Seconds from Python as a duration; `name` is the argument's, named in
/// the `InvalidInput` a negative, infinite or NaN value raises (the crate
/// then checks the duration itself: a TTL of zero, a lease too long).
fn seconds(py: Python<'_>, name: &str, s: f64) -> PyResult<Duration> {
    if s.is_finite() && (0.0..1e12).contains(&s) {
        return Ok(Duration::from_secs_f64(s));
    }
    let text = format!("invalid {name}: must be a number of seconds, at least 0: got {s}");
    Err(raise(py, "InvalidInput", text))
}

/// A JSON value as Python objects (dicts, lists, str, int, float, None).
fn to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None(),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into_pyobject(py)?.into_any().unbind(),
            (None, Some(i), _) => i.into_pyobject(py)?.into_any().unbind(),
            (None, None, f) => f.unwrap_or(f64::NAN).into_pyobject(py)?.into_any().unbind(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        Value::Array(a) => {
            let items = a
                .iter()
                .map(|x| to_py(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any().unbind()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any().unbind()
        }
    })
}

/// An open store: SQLite, a lease directory or PostgreSQL (`open(url)`).
#[pyclass(module = "leasehold._native", frozen)]
struct Store {
    store: Arc<dyn leasehold::Store>,
    client: Client,
    url: String,
}

/// Open the store at `url`: `sqlite:PATH` (created if needed),
/// `file:DIR` (leases only), `postgres://...`, or `mem:` (this process
/// only); options as URL parameters, as on the command line.
#[pyfunction]
fn open(py: Python<'_>, url: String) -> PyResult<Store> {
    let target = url.clone();
    let store = py
        .detach(move || leasehold::store::open_url(&target))
        .map_err(|e| py_err(py, e))?;
    let client = Client::builder_shared(store.clone()).build();
    Ok(Store { store, client, url })
}

#[pymethods]
impl Store {
    /// The URL it was opened with.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// Acquire `key` for `ttl` seconds, waiting up to `wait` seconds while
    /// someone else holds it (woken at once by a release); raises
    /// `LeaseHeld` when the wait runs out. `label` names the holder in
    /// listings; `limit` holders may share a counting lease. With
    /// `keep_alive` the lease is renewed about every ttl/3 on a thread of
    /// the crate's, until released, lost or collected.
    #[pyo3(signature = (key, ttl=30.0, wait=0.0, label=None, limit=1, keep_alive=true))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn lock(
        &self,
        py: Python<'_>,
        key: String,
        ttl: f64,
        wait: f64,
        label: Option<String>,
        limit: u32,
        keep_alive: bool,
    ) -> PyResult<Lease> {
        let ttl = seconds(py, "ttl", ttl)?;
        let wait = seconds(py, "wait", wait)?;
        let id = leasehold::random_holder_id();
        let holder = match label {
            Some(l) => Holder::with_label(id, &l).map_err(|e| py_err(py, e))?,
            None => Holder::new(id).labelled_default(),
        };
        let client = Client::builder_shared(self.store.clone())
            .holder(holder)
            .build();
        let until = Instant::now() + wait;
        let guard = loop {
            // The wait goes in slices, so that a signal (Ctrl-C) is seen
            // within one; each slice is a whole acquire (woken by releases).
            let slice = until
                .saturating_duration_since(Instant::now())
                .min(SIGNAL_SLICE);
            let (c, k) = (client.clone(), key.clone());
            let opts = LeaseOptions::new(ttl).limit(limit).wait(slice);
            match py.detach(move || c.acquire(&k, opts)) {
                Ok(guard) => break guard,
                Err(Error::Held { .. }) if Instant::now() < until => py.check_signals()?,
                Err(e) => return Err(py_err(py, e)),
            }
        };
        if keep_alive {
            guard.keep_alive(|_| {}).map_err(|e| py_err(py, e))?;
        }
        Ok(Lease {
            key: guard.key().to_owned(),
            token: guard.token(),
            pid: std::process::id(),
            guard: Mutex::new(Some(guard)),
        })
    }

    /// Live holders of `key`: a list of dicts (holder, label, token,
    /// expires_at, expires_in_ms), empty when it is free.
    fn holders(&self, py: Python<'_>, key: String) -> PyResult<Py<PyAny>> {
        let c = self.client.clone();
        let info = py
            .detach(move || c.inspect(&key))
            .map_err(|e| py_err(py, e))?;
        let t = leasehold::render::Times::new(info.now_ms);
        let all: Vec<serde_json::Value> = info
            .holders
            .iter()
            .map(|h| leasehold::render::holder_json(h, &t))
            .collect();
        to_py(py, &serde_json::Value::Array(all))
    }

    /// The queue `name` of this store.
    fn queue(&self, py: Python<'_>, name: String) -> PyResult<Queue> {
        let queue = self.client.queue(&name).map_err(|e| py_err(py, e))?;
        Ok(Queue { queue })
    }

    fn __repr__(&self) -> String {
        format!("leasehold.Store({:?})", self.store.describe())
    }
}

/// A held lease (`Store.lock`). Released by `release()`, by leaving its
/// `with` block, or when collected; never by a forked child.
#[pyclass(module = "leasehold._native", frozen)]
struct Lease {
    key: String,
    token: u64,
    /// The process that acquired it: in any other (a forked child) every
    /// call that would act on it raises `Forked` before touching it.
    pid: u32,
    guard: Mutex<Option<LeaseGuard>>,
}

impl Lease {
    /// `Forked` in a process other than the acquirer's.
    fn origin(&self, py: Python<'_>) -> PyResult<()> {
        let current_pid = std::process::id();
        if current_pid == self.pid {
            return Ok(());
        }
        let e = Error::Forked {
            created_pid: self.pid,
            current_pid,
        };
        Err(py_err(py, e))
    }
}

#[pymethods]
impl Lease {
    /// The key.
    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token: larger than every earlier grant's of the key.
    #[getter]
    fn token(&self) -> u64 {
        self.token
    }

    /// Whether the holder may act now: this process, not released or
    /// lost, before the local deadline.
    fn valid(&self) -> bool {
        lock(&self.guard).as_ref().is_some_and(LeaseGuard::is_valid)
    }

    /// Seconds left before the local deadline (0.0 once not valid).
    fn remaining(&self) -> f64 {
        lock(&self.guard)
            .as_ref()
            .map_or(0.0, |g| g.remaining().as_secs_f64())
    }

    /// Raise `LeaseLost` unless valid (the check before a protected action).
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.origin(py)?;
        let guard = lock(&self.guard);
        match guard.as_ref() {
            Some(g) if g.is_valid() => Ok(()),
            Some(g) => {
                let reason = g.lost().unwrap_or(leasehold::LostReason::LocalDeadline);
                Err(py_err(py, lost(&self.key, self.token, reason)))
            }
            None => Err(py_err(
                py,
                lost(&self.key, self.token, leasehold::LostReason::StaleToken),
            )),
        }
    }

    /// Renew now (the keep-alive does it by itself); raises `LeaseLost`
    /// if the lease is gone.
    fn renew(&self, py: Python<'_>) -> PyResult<()> {
        self.origin(py)?;
        let guard = lock(&self.guard);
        let Some(g) = guard.as_ref() else {
            return Err(py_err(
                py,
                lost(&self.key, self.token, leasehold::LostReason::StaleToken),
            ));
        };
        py.detach(|| g.renew()).map_err(|e| py_err(py, e))
    }

    /// Release the lease now (a second call does nothing); `LeaseLost` when
    /// it was lost before. In a forked child it raises `Forked` and leaves
    /// the parent's lease alone.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        self.origin(py)?;
        let Some(g) = lock(&self.guard).take() else {
            return Ok(());
        };
        py.detach(move || g.release()).map_err(|e| py_err(py, e))
    }

    fn __repr__(&self) -> String {
        format!(
            "leasehold.Lease(key={:?}, token={}, valid={})",
            self.key,
            self.token,
            self.valid()
        )
    }
}

/// The error of a lease that may no longer be acted on, with the reason
/// it was lost (a released one's token is stale).
fn lost(key: &str, token: u64, reason: leasehold::LostReason) -> Error {
    Error::Lost {
        target: leasehold::Target::Lease {
            key: key.to_owned(),
            token,
        },
        reason,
    }
}

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_class::<Store>()?;
    m.add_class::<Lease>()?;
    m.add_class::<Queue>()?;
    m.add_class::<Job>()?;
    Ok(())
}
