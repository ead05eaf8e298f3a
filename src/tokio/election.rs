//! Leader election (async): a task drives the same `ElectionMachine`
//! as the sync [`crate::Client::campaign`] (through the shared
//! `ElectionSession`), its store requests on the blocking pool (their
//! replies come back on a channel, so the machine's deadlines fire while
//! one is in flight), waiting on a timer and the store's release
//! announcements; events arrive on a channel ([`Election::next_event`]).

use super::{nap, Client};
use crate::client::election::{ElectionSession, Next};
use crate::error::Result;
use crate::store::Wake;
use crate::sync::{caught, lock, Mutex, Panic};
use crate::time::LocalMs;
use crate::{ElectOptions, Leader, LeaderEvent};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// What the application asks of the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Commands {
    resign: bool,
    /// Bumped by each step-down.
    step_downs: u64,
}

/// A running election (async). Dropping it resigns in the background.
pub struct Election {
    events: mpsc::UnboundedReceiver<LeaderEvent>,
    commands: watch::Sender<Commands>,
    leader: Arc<Mutex<Option<Leader>>>,
    task: Option<JoinHandle<Result<()>>>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("tokio::Election")
            .field("leader", &self.leader())
            .finish()
    }
}

impl Client {
    /// Campaign for leadership of `key` (see [`crate::Client::campaign`]):
    /// a task campaigns, leads and campaigns again; its events arrive
    /// through [`Election::next_event`], and a leader's
    /// [`Leader::cancellation`] is cancelled when its term ends. A store
    /// call that panics (a bug in a store) ends the task, and
    /// [`Election::join`] or [`Election::resign`] resumes its panic; the
    /// term ends at once, as lost (`Deposed(Lost(LocalDeadline))`), and the
    /// store lets its grant lapse.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> leasehold::Result<()> {
    /// use leasehold::{tokio::Client, ElectOptions, LeaderEvent, MemStore};
    /// use std::time::Duration;
    ///
    /// let client = Client::new(leasehold::Client::new(MemStore::new()));
    /// let mut election = client.campaign("scheduler", ElectOptions::new(Duration::from_secs(10)))?;
    /// while let Some(event) = election.next_event().await {
    ///     if let LeaderEvent::Elected(leader) = event {
    ///         let lost = leader.cancellation();
    ///         tokio::select! {
    ///             _ = lost.cancelled() => {}
    ///             _ = async { /* the leader's work, fenced with leader.token() */ } => {}
    ///         }
    ///         break;
    ///     }
    /// }
    /// election.resign().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn campaign(&self, key: &str, opts: ElectOptions) -> Result<Election> {
        let session = ElectionSession::new(&self.sync, key, &opts)?;
        let (events_tx, events) = mpsc::unbounded_channel();
        let (commands, commands_rx) = watch::channel(Commands::default());
        let leader = Arc::new(Mutex::new(None));
        let task = Task {
            client: self.clone(),
            session,
            events: events_tx,
            commands: commands_rx,
            leader: leader.clone(),
        };
        Ok(Election {
            events,
            commands,
            leader,
            task: Some(tokio::spawn(task.run())),
        })
    }
}

struct Task {
    client: Client,
    session: ElectionSession,
    events: mpsc::UnboundedSender<LeaderEvent>,
    commands: watch::Receiver<Commands>,
    leader: Arc<Mutex<Option<Leader>>>,
}

impl Task {
    async fn run(mut self) -> Result<()> {
        let end = self.drive().await;
        *lock(&self.leader) = None;
        // A store call's panic reaches whoever joins the election.
        end.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// The machine's requests go to the blocking pool and their replies
    /// come back on a channel: a store call that hangs never holds up the
    /// machine's deadlines (the term ends, and its cancellation fires, on
    /// time), nor the release and the next campaign after it. Only the
    /// reply to the latest request reaches the machine: the machine sends
    /// a request while another is out only once it is done with the other
    /// (a release after the term's loss), and a reply that came back late
    /// (a renewal of the lost term) must not be taken for an answer to a
    /// later one (the next term's renewal). A store call that panicked
    /// ends it with the panic.
    async fn drive(&mut self) -> std::result::Result<Result<()>, Panic> {
        let mut released = self.client.subscribe(Wake::LeaseFreed);
        let (replies_tx, mut replies) = mpsc::unbounded_channel();
        let mut latest = 0u64;
        let mut seen = Commands::default();
        let mut handle_open = true;
        loop {
            let now = self.session.now();
            let asked = *self.commands.borrow_and_update();
            if asked.resign && !seen.resign {
                self.session.machine.resign(now);
            } else if asked.step_downs != seen.step_downs {
                self.session.machine.step_down(now);
            }
            seen = asked;
            self.session.timeout();
            while let Some(next) = self.session.next() {
                match next {
                    Next::Send(request) => {
                        let exec = self.session.exec().clone();
                        let tx = replies_tx.clone();
                        latest += 1;
                        let sent = latest;
                        drop(tokio::task::spawn_blocking(move || {
                            let _ = tx.send((sent, caught(|| exec.run(request))));
                        }));
                    }
                    Next::Event(event) => {
                        *lock(&self.leader) = self.session.leader();
                        // Nobody listening is fine: the election goes on.
                        let _ = self.events.send(event);
                    }
                    Next::End(end) => return Ok(end),
                }
            }
            let now = self.session.now();
            let until = self.session.machine.poll_timeout().unwrap_or(LocalMs::MAX);
            // At most a minute: nothing is lost by looking again.
            let wait = until.saturating_sub(now).min(60_000);
            tokio::select! {
                _ = nap(wait) => {}
                Some((sent, reply)) = replies.recv() => match reply {
                    Ok(reply) if sent == latest => self.session.reply(reply),
                    Ok(_) => {}
                    // A bug in the store: nothing more can be asked of it.
                    // The term ends here, and the application is told.
                    Err(panic) => {
                        if let Some(event) = self.session.abandon() {
                            *lock(&self.leader) = None;
                            let _ = self.events.send(event);
                        }
                        return Err(panic);
                    }
                },
                changed = released.changed() => {
                    if changed.is_ok() {
                        self.session.machine.handle_wake(self.session.now());
                    } else {
                        released = self.client.subscribe(Wake::LeaseFreed);
                    }
                }
                changed = self.commands.changed(), if handle_open => {
                    if changed.is_err() {
                        // The handle is gone: resign (once).
                        handle_open = false;
                        self.session.machine.resign(self.session.now());
                    }
                }
            }
        }
    }
}

impl Election {
    /// The next event; `None` once the election is over.
    pub async fn next_event(&mut self) -> Option<LeaderEvent> {
        self.events.recv().await
    }

    /// The current term's handle, while this process leads.
    pub fn leader(&self) -> Option<Leader> {
        lock(&self.leader).clone()
    }

    /// End the current term (the key is released) and campaign again.
    pub fn step_down(&self) {
        self.commands.send_modify(|c| c.step_downs += 1);
    }

    /// Stop campaigning; a leader releases the key first, so the next
    /// leader takes over at once. Returns once the task is done.
    pub async fn resign(mut self) -> Result<()> {
        self.commands.send_modify(|c| c.resign = true);
        self.join().await
    }

    /// Wait for the election to end by itself (`once`, or a store error),
    /// or by a store call's panic, which is resumed here.
    pub async fn join(&mut self) -> Result<()> {
        match self.task.take() {
            Some(task) => match task.await {
                Ok(end) => end,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => Err(crate::Error::store("running the election", e.to_string())),
            },
            None => Ok(()),
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        // The task sees the command (or the closed channel) and resigns.
        self.commands.send_modify(|c| c.resign = true);
    }
}
