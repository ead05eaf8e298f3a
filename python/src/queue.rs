//! `Queue`: a queue of a store: pushes, claims, its counts, pause and
//! limits, a job by id and its cancel; and `Queue.work`, the crate's
//! worker loop on a thread of its own, calling the Python handler (which
//! takes the GIL for each call) while the caller's thread waits without
//! it, looking for signals.

use super::*;

/// A queue of a store (`Store.queue`).
#[pyclass(module = "leasehold._native", frozen)]
pub(crate) struct Queue {
    pub(crate) queue: leasehold::Queue,
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
        let mut spec = spec_of(
            py,
            priority,
            delay,
            max_attempts,
            key,
            timeout,
            after,
            after_any,
        )?;
        spec.payload = payload;
        spec.unique_key = unique;
        if let Some(p) = unique_for {
            spec.unique_for = Some(seconds(py, "unique_for", p)?);
        }
        if let Some(text) = unique_states {
            let states = leasehold::StateSet::parse(leasehold::Field::UniqueStates, text);
            spec.unique_states = Some(states.map_err(|e| py_err(py, e))?);
        }
        let q = self.queue.clone();
        py.detach(move || q.push(&spec))
            .map(|o| (o.id.0, o.created))
            .map_err(|e| py_err(py, e))
    }

    /// Enqueue one job per payload, in order, in one transaction (all or,
    /// if one is refused, none), each with the same options but `keys`
    /// and `uniques` (one per payload when given: each job's concurrency
    /// and unique keys); returns each job's `(id, created)` (a job whose
    /// unique key blocked it answers the id of the job that did, and
    /// `created` false).
    #[pyo3(signature = (payloads, priority=0, delay=None, max_attempts=None, keys=None, timeout=None, after=None, after_any=false, uniques=None))]
    #[allow(clippy::too_many_arguments)]
    fn push_many(
        &self,
        py: Python<'_>,
        payloads: Vec<Vec<u8>>,
        priority: i32,
        delay: Option<f64>,
        max_attempts: Option<u32>,
        keys: Option<Vec<Option<String>>>,
        timeout: Option<f64>,
        after: Option<Vec<u64>>,
        after_any: bool,
        uniques: Option<Vec<Option<String>>>,
    ) -> PyResult<Vec<(u64, bool)>> {
        let n = payloads.len();
        let per_job = |name: &str, list: Option<Vec<Option<String>>>| match list {
            None => Ok(vec![None; n]),
            Some(list) if list.len() == n => Ok(list),
            Some(list) => Err(py_err(
                py,
                leasehold::Error::invalid(
                    leasehold::Field::Batch,
                    format!(
                        "{} {name} for {n} payloads: give one per payload",
                        list.len()
                    ),
                ),
            )),
        };
        let (keys, uniques) = (per_job("keys", keys)?, per_job("unique keys", uniques)?);
        let spec = spec_of(
            py,
            priority,
            delay,
            max_attempts,
            None,
            timeout,
            after,
            after_any,
        )?;
        let specs: Vec<JobSpec> = payloads
            .into_iter()
            .zip(keys.into_iter().zip(uniques))
            .map(|(payload, (key, unique_key))| JobSpec {
                payload,
                key,
                unique_key,
                ..spec.clone()
            })
            .collect();
        let q = self.queue.clone();
        py.detach(move || q.push_many(&specs))
            .map(|out| out.iter().map(|o| (o.id.0, o.created)).collect())
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
    let stop = Arc::new(leasehold::StopSignal::new());
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
                        stop.set();
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

/// A spec with an empty payload and the options `push` and `push_many`
/// share.
#[allow(clippy::too_many_arguments)]
fn spec_of(
    py: Python<'_>,
    priority: i32,
    delay: Option<f64>,
    max_attempts: Option<u32>,
    key: Option<String>,
    timeout: Option<f64>,
    after: Option<Vec<u64>>,
    after_any: bool,
) -> PyResult<JobSpec> {
    let mut spec = JobSpec::new(Vec::new());
    spec.priority = priority;
    if let Some(d) = delay {
        spec.delay_ms = u64::try_from(seconds(py, "delay", d)?.as_millis()).unwrap_or(u64::MAX);
    }
    if let Some(n) = max_attempts {
        spec.max_attempts = n;
    }
    spec.key = key;
    if let Some(t) = timeout {
        spec.timeout = Some(seconds(py, "timeout", t)?);
    }
    spec.after = after.unwrap_or_default().into_iter().map(JobId).collect();
    spec.after_any = after_any;
    Ok(spec)
}
