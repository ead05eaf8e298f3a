//! The stores a run can use (the real adapters, on the run's true clock),
//! and the canaries' broken store.

use leasehold::core::{JobQuery, JobTxn, Pending, QueueConfig, RateLog, ScheduleRecord, Txn};
use leasehold::{HolderId, JobId, JobRecord, JobState, ManualClock, MemStore, StateCounts, Store};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Builds the store a run uses, on the run's true clock.
pub type StoreFactory = dyn Fn(&ManualClock) -> Arc<dyn Store> + Sync;

/// The default store: in memory.
pub fn mem_store(clock: &ManualClock) -> Arc<dyn Store> {
    Arc::new(MemStore::with_clock(Arc::new(clock.clone())))
}

/// A real store in a fresh temporary directory, removed with the store.
struct TempStore<S> {
    store: S,
    dir: std::path::PathBuf,
}

impl<S> Drop for TempStore<S> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl<S: Store> Store for TempStore<S> {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        self.store.transact(f)
    }
    fn describe(&self) -> String {
        self.store.describe()
    }
    fn epoch(&self, wake: leasehold::Wake) -> u64 {
        self.store.epoch(wake)
    }
    fn wait_epoch(&self, wake: leasehold::Wake, epoch: u64, timeout: std::time::Duration) -> bool {
        self.store.wait_epoch(wake, epoch, timeout)
    }
    fn announces_changes(&self) -> bool {
        self.store.announces_changes()
    }
    fn interrupt_waits(&self, wake: leasehold::Wake) {
        self.store.interrupt_waits(wake)
    }
}

/// Open a store of kind `tag` in a fresh temporary directory.
fn temp_store<S: Store + 'static>(
    tag: &str,
    open: impl FnOnce(&std::path::Path) -> leasehold::Result<S>,
) -> Arc<dyn Store> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "leasehold-sim-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let opened = std::fs::create_dir_all(&dir)
        .map_err(|e| leasehold::Error::store("creating a temp dir", e.to_string()))
        .and_then(|()| open(&dir));
    match opened {
        Ok(store) => Arc::new(TempStore { store, dir }),
        Err(e) => panic!("the simulator could not open its {tag} store: {e}"),
    }
}

/// A SQLite store on the run's clock: the simulator drives the real adapter.
pub fn sqlite_store(clock: &ManualClock) -> Arc<dyn Store> {
    let opts = leasehold::SqliteOptions {
        clock: Some(Arc::new(clock.clone())),
        boot_id: Some("sim".into()),
        ..leasehold::SqliteOptions::default()
    };
    temp_store("sqlite", |dir| {
        leasehold::SqliteStore::open_with(dir.join("sim.db"), opts)
    })
}

/// A file store (durable writes off) on the run's clock. Leases only: use it
/// with lease scenarios.
pub fn file_store(clock: &ManualClock) -> Arc<dyn Store> {
    let opts = leasehold::FileOptions {
        clock: Some(Arc::new(clock.clone())),
        boot_id: Some("sim".into()),
        durable: false,
        ..leasehold::FileOptions::default()
    };
    temp_store("file", |dir| {
        leasehold::FileStore::open_with(dir.join("leases"), opts)
    })
}

/// What a canary breaks in the store a worker's session sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Breakage {
    /// "Ready" also yields running jobs whose lease has not expired.
    pub(crate) blind_claims: bool,
    /// A schedule's cursor is never stored.
    pub(crate) forget_schedules: bool,
    /// A claim's read never sees the queue paused.
    pub(crate) deaf_to_pause: bool,
    /// A claim counts no running job of any key (the per-key limit is
    /// never reached).
    pub(crate) blind_to_keys: bool,
    /// A job is written without its claim's deadline (renewals pass it).
    pub(crate) forget_deadlines: bool,
    /// A rate bucket's starts are never stored (every window looks empty).
    pub(crate) forget_starts: bool,
    /// A unique key's lookup sees only live jobs, whatever the period and
    /// states asked (the behaviour before U1's periods).
    pub(crate) unique_live_only: bool,
    /// The jobs waiting for a job are never found when it ends (D2).
    pub(crate) forget_children: bool,
    /// Every job reads as done (what a push's dependencies see: D1).
    pub(crate) parents_look_done: bool,
    /// Every claim read looks like this holder's (fencing by holder is
    /// ignored; the world swaps in the current tokens).
    pub(crate) careless: Option<HolderId>,
}

impl Breakage {
    pub(crate) fn any(&self) -> bool {
        *self != Breakage::default()
    }
}

/// A store whose transactions are [`Broken`] as `breakage` says: what a
/// canary's worker session runs its `Exec` on.
pub(crate) struct BrokenStore {
    pub(crate) inner: Arc<dyn Store>,
    pub(crate) breakage: Breakage,
}

impl Store for BrokenStore {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        let breakage = self.breakage;
        self.inner.transact(&mut |tx| {
            let mut broken = Broken {
                inner: tx.jobs()?,
                breakage,
                holders: BTreeMap::new(),
            };
            f(&mut broken)
        })
    }
    fn describe(&self) -> String {
        format!("broken {}", self.inner.describe())
    }
    fn epoch(&self, wake: leasehold::Wake) -> u64 {
        self.inner.epoch(wake)
    }
    fn wait_epoch(&self, wake: leasehold::Wake, epoch: u64, timeout: std::time::Duration) -> bool {
        self.inner.wait_epoch(wake, epoch, timeout)
    }
    fn announces_changes(&self) -> bool {
        self.inner.announces_changes()
    }
    fn interrupt_waits(&self, wake: leasehold::Wake) {
        self.inner.interrupt_waits(wake)
    }
}

/// A transaction wrapper for the canaries (see [`Breakage`]).
pub(crate) struct Broken<'a> {
    inner: &'a mut dyn JobTxn,
    breakage: Breakage,
    /// The real holders of claims shown as the careless holder's, put
    /// back when the job is written.
    holders: BTreeMap<JobId, HolderId>,
}

impl Broken<'_> {
    fn show(&mut self, mut job: JobRecord) -> JobRecord {
        if self.breakage.parents_look_done && !job.state.is_terminal() {
            job.state = JobState::Done;
            job.claim = None;
        }
        if let (Some(me), Some(c)) = (self.breakage.careless, job.claim.as_mut()) {
            self.holders.insert(job.id, c.holder);
            c.holder = me;
        }
        job
    }
}

impl Txn for Broken<'_> {
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
    fn lease_mut(
        &mut self,
        _key: &str,
        _create: bool,
    ) -> leasehold::Result<Option<&mut leasehold::core::LeaseRecord>> {
        Ok(None)
    }
    fn journal(&mut self) -> &mut leasehold::core::Journal {
        self.inner.journal()
    }
    fn jobs(&mut self) -> leasehold::Result<&mut dyn JobTxn> {
        Ok(self)
    }
}

impl JobTxn for Broken<'_> {
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
    fn journal(&mut self) -> &mut leasehold::core::Journal {
        self.inner.journal()
    }
    fn next_job_id(&mut self) -> leasehold::Result<JobId> {
        self.inner.next_job_id()
    }
    fn job(&mut self, id: JobId) -> leasehold::Result<Option<JobRecord>> {
        Ok(self.inner.job(id)?.map(|j| self.show(j)))
    }
    fn jobs_by_id(&mut self, ids: &[JobId]) -> leasehold::Result<Vec<JobRecord>> {
        let jobs = self.inner.jobs_by_id(ids)?;
        Ok(jobs.into_iter().map(|j| self.show(j)).collect())
    }
    fn put_job(&mut self, job: &JobRecord) -> leasehold::Result<()> {
        let mut job = job.clone();
        if let (true, Some(c)) = (self.breakage.forget_deadlines, job.claim.as_mut()) {
            // Broken on purpose: the claim's deadline is not stored.
            c.deadline_ms = None;
        }
        if let (Some(real), Some(c)) = (self.holders.get(&job.id), job.claim.as_mut()) {
            if Some(c.holder) == self.breakage.careless {
                c.holder = *real;
            }
        }
        self.inner.put_job(&job)
    }
    fn delete_job(&mut self, id: JobId) -> leasehold::Result<()> {
        self.inner.delete_job(id)
    }
    fn link(&mut self, parent: JobId, child: JobId) -> leasehold::Result<()> {
        self.inner.link(parent, child)
    }
    fn children(&mut self, parent: JobId, out: &mut Vec<JobId>) -> leasehold::Result<()> {
        if self.breakage.forget_children {
            // Broken on purpose: nobody waits for anything.
            return Ok(());
        }
        self.inner.children(parent, out)
    }
    fn unlink(&mut self, parent: JobId) -> leasehold::Result<()> {
        self.inner.unlink(parent)
    }
    fn unique_jobs(
        &mut self,
        queue: &str,
        key: &str,
        states: leasehold::StateSet,
        since_ms: u64,
        limit: usize,
    ) -> leasehold::Result<Vec<JobId>> {
        if self.breakage.unique_live_only {
            // Broken on purpose: done, dead and cancelled jobs never block.
            let live: Vec<JobState> = (JobState::ALL.into_iter())
                .filter(|s| states.contains(*s) && !s.is_terminal())
                .collect();
            let states = leasehold::StateSet::of(&live);
            return self.inner.unique_jobs(queue, key, states, since_ms, limit);
        }
        self.inner.unique_jobs(queue, key, states, since_ms, limit)
    }
    fn lock_unique(&mut self, queue: &str, key: &str) -> leasehold::Result<()> {
        self.inner.lock_unique(queue, key)
    }
    fn pending(
        &mut self,
        queue: &str,
        now_ms: u64,
        chunk: usize,
        ready: usize,
    ) -> leasehold::Result<Pending> {
        let mut read = self.inner.pending(queue, now_ms, chunk, ready)?;
        if ready > 0 && self.breakage.blind_claims {
            // Broken on purpose: every running job looks claimable.
            let running = self.inner.pending(queue, u64::MAX, ready, 0)?.expired;
            let live = running
                .into_iter()
                .filter(|j| j.claim.is_some_and(|c| c.lease_until_ms > now_ms));
            read.ready.splice(0..0, live);
        }
        if self.breakage.deaf_to_pause {
            // Broken on purpose: claims go on while the queue is paused.
            read.config.paused = false;
        }
        Ok(read)
    }
    fn queue_config(&mut self, queue: &str) -> leasehold::Result<QueueConfig> {
        self.inner.queue_config(queue)
    }
    fn put_queue_config(&mut self, queue: &str, config: &QueueConfig) -> leasehold::Result<()> {
        self.inner.put_queue_config(queue, config)
    }
    fn running_count(&mut self, queue: &str, key: Option<&str>) -> leasehold::Result<u64> {
        if key.is_some() && self.breakage.blind_to_keys {
            // Broken on purpose: every key looks idle.
            return Ok(0);
        }
        self.inner.running_count(queue, key)
    }
    fn parked(
        &mut self,
        queue: &str,
        key: Option<&str>,
        limit: usize,
    ) -> leasehold::Result<Vec<JobRecord>> {
        let jobs = self.inner.parked(queue, key, limit)?;
        Ok(jobs.into_iter().map(|j| self.show(j)).collect())
    }
    fn lock_queue(&mut self, queue: &str, exclusive: bool) -> leasehold::Result<()> {
        self.inner.lock_queue(queue, exclusive)
    }
    fn rate_log(&mut self, queue: &str, key: &str) -> leasehold::Result<RateLog> {
        self.inner.rate_log(queue, key)
    }
    fn put_rate_log(&mut self, queue: &str, key: &str, log: &RateLog) -> leasehold::Result<()> {
        let mut log = log.clone();
        if self.breakage.forget_starts {
            // Broken on purpose: no start is remembered.
            log.starts.clear();
        }
        self.inner.put_rate_log(queue, key, &log)
    }
    fn forget_idle_rates(
        &mut self,
        queue: &str,
        before_ms: u64,
        limit: usize,
    ) -> leasehold::Result<usize> {
        self.inner.forget_idle_rates(queue, before_ms, limit)
    }
    fn rate_wakes(
        &mut self,
        queue: &str,
        until_ms: u64,
        limit: usize,
    ) -> leasehold::Result<Vec<(Arc<str>, u64)>> {
        self.inner.rate_wakes(queue, until_ms, limit)
    }
    fn scan(
        &mut self,
        queue: &str,
        query: JobQuery,
        limit: usize,
        out: &mut Vec<JobId>,
    ) -> leasehold::Result<()> {
        self.inner.scan(queue, query, limit, out)
    }
    fn counts(&mut self, queue: &str) -> leasehold::Result<StateCounts> {
        self.inner.counts(queue)
    }
    fn schedules(&mut self, queue: &str) -> leasehold::Result<Vec<ScheduleRecord>> {
        self.inner.schedules(queue)
    }
    fn put_schedule(&mut self, schedule: &ScheduleRecord) -> leasehold::Result<()> {
        if self.breakage.forget_schedules {
            // Broken on purpose: the cursor never moves.
            return Ok(());
        }
        self.inner.put_schedule(schedule)
    }
    fn delete_schedule(&mut self, queue: &str, name: &str) -> leasehold::Result<bool> {
        self.inner.delete_schedule(queue, name)
    }
    fn list(
        &mut self,
        queue: &str,
        state: Option<JobState>,
        after: JobId,
        limit: usize,
    ) -> leasehold::Result<Vec<JobRecord>> {
        self.inner.list(queue, state, after, limit)
    }
    fn page(
        &mut self,
        queue: &str,
        state: JobState,
        after: Option<leasehold::core::JobCursor>,
        limit: usize,
        preview_bytes: usize,
    ) -> leasehold::Result<Vec<leasehold::core::JobPeek>> {
        self.inner.page(queue, state, after, limit, preview_bytes)
    }
}
