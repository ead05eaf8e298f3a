//! `Job`: a claimed job, whether claimed by `Queue.claim` or lent to a
//! `Queue.work` handler for the call: its fields, whether its claim is
//! still valid (and a cancel requested), its progress reports, and the
//! calls that settle it (complete, fail, give back).

use super::*;

/// A claimed job: claimed by `Queue.claim` (settled by `complete` or
/// `fail`), or handed to a `Queue.work` handler (settled by the loop when
/// the handler returns; usable only during the call).
#[pyclass(module = "leasehold._native", frozen)]
pub(crate) struct Job {
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

    pub(crate) fn claimed(job: ClaimedJob) -> Job {
        let fields = Job::fields(&job, Handle::Borrowed(Mutex::new(None)));
        Job {
            handle: Handle::Claimed(Box::new(job)),
            ..fields
        }
    }

    pub(crate) fn borrowed(job: &ClaimedJob) -> Job {
        let address = job as *const ClaimedJob as usize;
        Job::fields(job, Handle::Borrowed(Mutex::new(Some(address))))
    }

    pub(crate) fn end_borrow(&self) {
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
