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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// A queue of a store (`Store.queue`).
#[pyclass(module = "leasehold._native", frozen)]
struct Queue {
    queue: leasehold::Queue,
}

#[pymethods]
impl Queue {
    /// The queue's name.
    #[getter]
    fn name(&self) -> &str {
        self.queue.name()
    }

    /// Enqueue `payload` (bytes); returns the job's id (or the id of the
    /// live job that already has `unique` as its key). `key` is its
    /// concurrency key (what a per-key limit counts); `timeout` its
    /// run-time limit in seconds.
    #[pyo3(signature = (payload, priority=0, delay=None, max_attempts=None, unique=None, key=None, timeout=None, unique_for=None, unique_states=None, after=None, after_any=false))]
    #[allow(clippy::too_many_arguments)]
    fn push(
        &self,
        py: Python<'_>,
        payload: Vec<u8>,
        priority: i32,
        delay: Option<f64>,
        max_attempts: Option<u32>,
        unique: Option<String>,
        key: Option<String>,
        timeout: Option<f64>,
        unique_for: Option<f64>,
        unique_states: Option<&str>,
        after: Option<Vec<u64>>,
        after_any: bool,
    ) -> PyResult<(u64, bool)> {
        let mut spec = JobSpec::new(payload);
        spec.priority = priority;
        if let Some(d) = delay {
            spec.delay_ms = u64::try_from(seconds(py, "delay", d)?.as_millis()).unwrap_or(u64::MAX);
        }
        if let Some(n) = max_attempts {
            spec.max_attempts = n;
        }
        spec.unique_key = unique;
        spec.key = key;
        if let Some(t) = timeout {
            spec.timeout = Some(seconds(py, "timeout", t)?);
        }
        if let Some(p) = unique_for {
            spec.unique_for = Some(seconds(py, "unique_for", p)?);
        }
        if let Some(text) = unique_states {
            let states = leasehold::StateSet::parse(leasehold::Field::UniqueStates, text);
            spec.unique_states = Some(states.map_err(|e| py_err(py, e))?);
        }
        spec.after = after.unwrap_or_default().into_iter().map(JobId).collect();
        spec.after_any = after_any;
        let q = self.queue.clone();
        py.detach(move || q.push(&spec))
            .map(|o| (o.id.0, o.created))
            .map_err(|e| py_err(py, e))
    }

    /// Claim the next ready job under a lease of `lease` seconds; `None`
    /// when nothing is ready. With `keep_alive` the claim is renewed
    /// about every lease/3 until the job is settled.
    #[pyo3(signature = (lease=30.0, keep_alive=true))]
    fn claim(&self, py: Python<'_>, lease: f64, keep_alive: bool) -> PyResult<Option<Job>> {
        let lease = seconds(py, "lease", lease)?;
        let q = self.queue.clone();
        let claimed = py
            .detach(move || q.claim(lease))
            .map_err(|e| py_err(py, e))?;
        let Some(job) = claimed else {
            return Ok(None);
        };
        if keep_alive {
            job.heartbeat_in_background(|_| {})
                .map_err(|e| py_err(py, e))?;
        }
        Ok(Some(Job::claimed(job)))
    }

    /// Jobs per state: ready, scheduled, running, done, dead, cancelled.
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let q = self.queue.clone();
        let counts = py.detach(move || q.stats()).map_err(|e| py_err(py, e))?;
        let d = PyDict::new(py);
        for state in leasehold::JobState::ALL {
            d.set_item(state.as_str(), counts.get(state))?;
        }
        Ok(d.into_any().unbind())
    }

    /// Pause the queue, durably and fleet-wide: no worker starts one of
    /// its jobs until `resume()`; running jobs finish and pushes are
    /// accepted. Returns whether it changed anything.
    fn pause(&self, py: Python<'_>) -> PyResult<bool> {
        let q = self.queue.clone();
        py.detach(move || q.pause()).map_err(|e| py_err(py, e))
    }

    /// Resume a paused queue (idle workers claim at once). Returns whether
    /// it changed anything.
    fn resume(&self, py: Python<'_>) -> PyResult<bool> {
        let q = self.queue.clone();
        py.detach(move || q.resume()).map_err(|e| py_err(py, e))
    }

    /// Whether the queue is paused.
    #[getter]
    fn paused(&self, py: Python<'_>) -> PyResult<bool> {
        let q = self.queue.clone();
        py.detach(move || q.config())
            .map(|c| c.paused)
            .map_err(|e| py_err(py, e))
    }

    /// Replace the queue's concurrency and rate limits (`None`: no limit;
    /// a rate as `N/DUR`, as the CLI takes it), durably and fleet-wide.
    /// Returns whether they changed.
    #[pyo3(signature = (concurrency=None, per_key=None, rate=None, per_key_rate=None))]
    fn set_limits(
        &self,
        py: Python<'_>,
        concurrency: Option<u32>,
        per_key: Option<u32>,
        rate: Option<&str>,
        per_key_rate: Option<&str>,
    ) -> PyResult<bool> {
        let parse =
            |field, text: Option<&str>| text.map(|t| leasehold::Rate::parse(field, t)).transpose();
        let limits = parse(leasehold::Field::Rate, rate).and_then(|rate| {
            Ok(leasehold::Limits::none()
                .with_concurrency(concurrency)
                .with_per_key(per_key)
                .with_rate(rate)
                .with_per_key_rate(parse(leasehold::Field::PerKeyRate, per_key_rate)?))
        });
        let limits = limits.map_err(|e| py_err(py, e))?;
        let q = self.queue.clone();
        py.detach(move || q.set_limits(limits))
            .map_err(|e| py_err(py, e))
    }

    /// The queue's limits: `(concurrency, per_key, rate, per_key_rate)`,
    /// `None` where unlimited, rates as `N/DUR`.
    #[getter]
    fn limits(&self, py: Python<'_>) -> PyResult<Limits4> {
        let q = self.queue.clone();
        let text = |r: Option<leasehold::Rate>| r.map(|r| r.to_string());
        py.detach(move || q.config())
            .map(|c| {
                let l = c.limits;
                (l.concurrency, l.per_key, text(l.rate), text(l.per_key_rate))
            })
            .map_err(|e| py_err(py, e))
    }

    /// One job, as `leasehold queue get` prints it (payload and result as
    /// text, or base64; instants as RFC 3339).
    fn get(&self, py: Python<'_>, id: u64) -> PyResult<Py<PyAny>> {
        let q = self.queue.clone();
        let (job, now) = py
            .detach(move || {
                let job = q.get(JobId(id))?;
                let now = q.client().store_now()?;
                Ok::<_, Error>((job, now))
            })
            .map_err(|e| py_err(py, e))?;
        let t = leasehold::render::Times::new(now.ms());
        to_py(py, &leasehold::render::job_json(&job, &t, true))
    }

    /// Cancel a job (a running one is stopped by its worker's next renewal).
    fn cancel(&self, py: Python<'_>, id: u64) -> PyResult<String> {
        let q = self.queue.clone();
        py.detach(move || q.cancel(JobId(id)))
            .map(|s| s.as_str().to_owned())
            .map_err(|e| py_err(py, e))
    }

    /// The crate's worker loop: `concurrency` handlers (threads that take
    /// the GIL to call `handler(job)`), claims and outcomes in batches,
    /// every held job renewed in one transaction per round. A handler that
    /// returns completes its job (a returned `bytes`/`str` is kept as its
    /// result); one that raises fails it with the exception's text (retried
    /// with backoff, dead after its attempts). With `drain` it returns once
    /// nothing is ready, running or due; else it runs until Ctrl-C (or
    /// another signal that raises), which shuts it down gracefully (running
    /// handlers finish within `shutdown_grace` seconds) and is raised
    /// afterwards. Returns counts: completed, failed, abandoned, lost.
    #[pyo3(signature = (handler, concurrency=4, lease=30.0, drain=false, shutdown_grace=30.0))]
    fn work(
        &self,
        py: Python<'_>,
        handler: Py<PyAny>,
        concurrency: usize,
        lease: f64,
        drain: bool,
        shutdown_grace: f64,
    ) -> PyResult<Py<PyAny>> {
        let opts = work_options(py, concurrency, lease, drain, shutdown_grace)?;
        run_loop(py, &self.queue, opts, move |job| run_handler(&handler, job))
    }

    /// The same worker loop with a no-op handler in Rust (no GIL, no
    /// Python call): what `work` costs without Python, for the benchmark
    /// that puts the two side by side (`python/bench/bench.py`).
    #[pyo3(signature = (concurrency=4, lease=30.0, drain=true))]
    fn _work_noop(
        &self,
        py: Python<'_>,
        concurrency: usize,
        lease: f64,
        drain: bool,
    ) -> PyResult<Py<PyAny>> {
        let opts = work_options(py, concurrency, lease, drain, 30.0)?;
        run_loop(py, &self.queue, opts, |_| Ok(()))
    }
}

fn work_options(
    py: Python<'_>,
    concurrency: usize,
    lease: f64,
    drain: bool,
    shutdown_grace: f64,
) -> PyResult<WorkOptions> {
    Ok(WorkOptions {
        concurrency: concurrency.max(1),
        lease: seconds(py, "lease", lease)?,
        drain,
        shutdown_grace: seconds(py, "shutdown_grace", shutdown_grace)?,
        ..WorkOptions::default()
    })
}

/// Run the crate's worker loop on a thread of its own while this one, the
/// GIL released, waits for it in slices, looking for signals between them:
/// the first signal that raises (Ctrl-C) stops the loop gracefully and is
/// raised once it has returned.
fn run_loop(
    py: Python<'_>,
    queue: &leasehold::Queue,
    opts: WorkOptions,
    handler: impl Fn(&ClaimedJob) -> Result<(), String> + Send + Sync + 'static,
) -> PyResult<Py<PyAny>> {
    let stop = Arc::new(AtomicBool::new(false));
    let (q, stop2) = (queue.clone(), stop.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("leasehold-python-work".to_owned())
        .spawn(move || {
            let report = q.work_with(
                &opts,
                &stop2,
                handler,
                |_: &leasehold::JobRecord, _: JobOutcome| {},
            );
            let _ = tx.send(report);
        })
        .map_err(|e| py_err(py, Error::store("starting the worker loop", e.to_string())))?;
    let mut interrupted = None;
    let mut rx = rx;
    let report = loop {
        // The receiver goes into the slice and comes back (it is not Sync).
        let (got, back) = py.detach(move || (rx.recv_timeout(SIGNAL_SLICE), rx));
        rx = back;
        match got {
            Ok(report) => break Some(report),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break None,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if interrupted.is_none() {
                    if let Err(e) = py.check_signals() {
                        stop.store(true, Ordering::SeqCst);
                        interrupted = Some(e);
                    }
                }
            }
        }
    };
    let joined = py.detach(move || worker.join());
    let report = match (report, joined) {
        (Some(report), Ok(())) => report,
        _ => return Err(py_err(py, Error::store("the worker loop", "it panicked"))),
    };
    if let Some(e) = interrupted {
        return Err(e);
    }
    let report = report.map_err(|e| py_err(py, e))?;
    let d = PyDict::new(py);
    d.set_item("completed", report.completed)?;
    d.set_item("failed", report.failed)?;
    d.set_item("abandoned", report.abandoned)?;
    d.set_item("lost", report.lost)?;
    Ok(d.into_any().unbind())
}

/// Call the Python handler for one job of the worker loop.
fn run_handler(handler: &Py<PyAny>, job: &ClaimedJob) -> Result<(), String> {
    Python::attach(|py| {
        let handle = Job::borrowed(job);
        let obj = Py::new(py, handle).map_err(|e| e.to_string())?;
        let called = handler.call1(py, (obj.clone_ref(py),));
        // The handle must not outlive this call: it borrows the loop's job.
        obj.get().end_borrow();
        match called {
            Ok(value) => {
                let value = value.bind(py);
                if value.is_none() {
                    return Ok(());
                }
                let bytes: Vec<u8> = if let Ok(s) = value.extract::<String>() {
                    s.into_bytes()
                } else if let Ok(b) = value.extract::<Vec<u8>>() {
                    b
                } else {
                    // Anything else is JSON (the package's json.dumps).
                    let dumps = py
                        .import("json")
                        .and_then(|j| j.getattr("dumps"))
                        .and_then(|d| d.call1((value,)))
                        .and_then(|s| s.extract::<String>());
                    match dumps {
                        Ok(s) => s.into_bytes(),
                        Err(e) => {
                            return Err(format!(
                                "the handler's result is not bytes, str or JSON: {e}"
                            ))
                        }
                    }
                };
                job.set_result(bytes).map_err(|e| e.to_string())
            }
            Err(e) => {
                let text = e.value(py).str().map(|s| s.to_string()).unwrap_or_default();
                let name = e
                    .get_type(py)
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "Exception".to_owned());
                Err(if text.is_empty() {
                    name
                } else {
                    format!("{name}: {text}")
                })
            }
        }
    })
}

/// A claimed job: claimed by `Queue.claim` (settled by `complete` or
/// `fail`), or handed to a `Queue.work` handler (settled by the loop when
/// the handler returns; usable only during the call).
#[pyclass(module = "leasehold._native", frozen)]
struct Job {
    id: u64,
    attempt: u32,
    token: u64,
    queue: String,
    payload: Vec<u8>,
    handle: Handle,
}

enum Handle {
    /// From `Queue.claim`: the job's own handle.
    Claimed(Box<ClaimedJob>),
    /// Inside a `Queue.work` handler: the loop's job, by address, while
    /// the handler runs (`None` once it returned).
    Borrowed(Mutex<Option<usize>>),
}

impl Job {
    fn fields(job: &ClaimedJob, handle: Handle) -> Job {
        Job {
            id: job.id().0,
            attempt: job.attempt(),
            token: job.token(),
            queue: job.record().queue.to_string(),
            payload: job.payload().to_vec(),
            handle,
        }
    }

    fn claimed(job: ClaimedJob) -> Job {
        let fields = Job::fields(&job, Handle::Borrowed(Mutex::new(None)));
        Job {
            handle: Handle::Claimed(Box::new(job)),
            ..fields
        }
    }

    fn borrowed(job: &ClaimedJob) -> Job {
        let address = job as *const ClaimedJob as usize;
        Job::fields(job, Handle::Borrowed(Mutex::new(Some(address))))
    }

    fn end_borrow(&self) {
        if let Handle::Borrowed(b) = &self.handle {
            *lock(b) = None;
        }
    }

    /// Run `f` on the job's handle; `None` when a work handler's job is
    /// used after its handler returned.
    fn with<R>(&self, f: impl FnOnce(&ClaimedJob) -> R) -> Option<R> {
        match &self.handle {
            Handle::Claimed(job) => Some(f(job)),
            Handle::Borrowed(b) => {
                let guard = lock(b);
                // SAFETY: the address is the loop's `&ClaimedJob` given to
                // `run_handler`, which clears it (under this mutex) before
                // that call returns and the reference ends; while the mutex
                // is held here it cannot be cleared.
                guard.map(|address| f(unsafe { &*(address as *const ClaimedJob) }))
            }
        }
    }

    fn settle<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&ClaimedJob) -> leasehold::Result<R> + Send,
    ) -> PyResult<R>
    where
        R: Send,
    {
        let Handle::Claimed(job) = &self.handle else {
            let e = Error::invalid(
                leasehold::Field::Batch,
                "a Queue.work handler settles its job by returning (complete) or raising (fail)",
            );
            return Err(py_err(py, e));
        };
        py.detach(|| f(job)).map_err(|e| py_err(py, e))
    }
}

#[pymethods]
impl Job {
    /// The job's id.
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// This attempt's number (1 for the first).
    #[getter]
    fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The claim's fencing token.
    #[getter]
    fn token(&self) -> u64 {
        self.token
    }

    /// The job's queue.
    #[getter]
    fn queue(&self) -> &str {
        &self.queue
    }

    /// The payload, as pushed.
    #[getter]
    fn payload<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.payload)
    }

    /// Whether the claim may still be acted on (not lost, cancelled to a
    /// stop, settled, or forked away).
    fn valid(&self) -> bool {
        self.with(ClaimedJob::is_valid).unwrap_or(false)
    }

    /// Whether someone asked to cancel the job (stop and fail it).
    #[getter]
    fn cancel_requested(&self) -> bool {
        self.with(ClaimedJob::cancel_requested).unwrap_or(false)
    }

    /// Report how far this attempt got: `fraction` done (0.0 to 1.0) and
    /// a short message. Sent with the claim's next renewal or its settle
    /// (no transaction of its own); refused once the claim is lost.
    #[pyo3(signature = (fraction, message=""))]
    fn progress(&self, py: Python<'_>, fraction: f64, message: &str) -> PyResult<()> {
        let Some(result) = self.with(|job| job.progress(fraction, message)) else {
            let e = Error::invalid(
                leasehold::Field::Progress,
                "the handler this job was given to has returned",
            );
            return Err(py_err(py, e));
        };
        result.map_err(|e| py_err(py, e))
    }

    /// Mark the job done, keeping `result` (bytes) with it if given.
    #[pyo3(signature = (result=None))]
    fn complete(&self, py: Python<'_>, result: Option<Vec<u8>>) -> PyResult<()> {
        self.settle(py, move |job| match &result {
            Some(r) => job.complete_with(r),
            None => job.complete(),
        })
    }

    /// Report this attempt failed for `reason`: retried after a backoff,
    /// or dead once out of attempts. Returns the job's new state.
    fn fail(&self, py: Python<'_>, reason: String) -> PyResult<String> {
        self.settle(py, move |job| job.fail(&reason))
            .map(|s| s.as_str().to_owned())
    }

    /// Give the job back (ready again at once, this attempt counted).
    fn abandon(&self, py: Python<'_>) -> PyResult<String> {
        self.settle(py, |job| job.abandon())
            .map(|s| s.as_str().to_owned())
    }

    fn __repr__(&self) -> String {
        format!(
            "leasehold.Job(id={}, queue={:?}, attempt={}, token={})",
            self.id, self.queue, self.attempt, self.token
        )
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
