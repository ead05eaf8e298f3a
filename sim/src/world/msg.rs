//! What travels between the simulated processes and the store, and what the
//! trace records.

use leasehold::client::machine::{WorkerReply, WorkerRequest};
use leasehold::client::sim::Exec;
use leasehold::core::job::Settle;
use leasehold::core::Grant;
use leasehold::{EnqueueOutcome, JobSpec};
use std::fmt;

/// A request from a process to the store.
#[derive(Debug, Clone)]
pub enum Req {
    /// Acquire a key.
    Acquire {
        /// Key index.
        key: usize,
    },
    /// Renew a held key.
    Renew {
        /// Key index.
        key: usize,
        /// Token.
        token: u64,
    },
    /// Release a held key.
    Release {
        /// Key index.
        key: usize,
        /// Token.
        token: u64,
    },
    /// Push a job.
    Push(Box<JobSpec>),
    /// A worker session's request, with the store side that runs it (the
    /// real `Exec` of the incarnation that sent it).
    Worker {
        /// The sender's store side.
        exec: Exec,
        /// What its machine asked for.
        request: WorkerRequest,
    },
}

impl fmt::Display for Req {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Req::Acquire { key } => write!(f, "acquire key-{key}"),
            Req::Renew { key, token } => write!(f, "renew key-{key} token {token}"),
            Req::Release { key, token } => write!(f, "release key-{key} token {token}"),
            Req::Push(spec) => {
                write!(
                    f,
                    "push prio {} delay {} attempts {} unique {:?}",
                    spec.priority, spec.delay_ms, spec.max_attempts, spec.unique_key
                )?;
                if let Some(key) = &spec.key {
                    write!(f, " key {key:?}")?;
                }
                match spec.timeout {
                    Some(t) => write!(f, " timeout {} ms", t.as_millis()),
                    None => Ok(()),
                }
            }
            Req::Worker { request, .. } => show_request(f, request),
        }
    }
}

fn show_request(f: &mut fmt::Formatter<'_>, request: &WorkerRequest) -> fmt::Result {
    match request {
        WorkerRequest::Claim { max } => write!(f, "claim {max}"),
        WorkerRequest::Heartbeat { claims } => {
            f.write_str("heartbeat")?;
            for (id, token) in claims {
                write!(f, " job {id} token {token};")?;
            }
            Ok(())
        }
        WorkerRequest::Settle { settles } => {
            f.write_str("settle")?;
            for (id, token, s) in settles {
                let what = match s {
                    Settle::Complete => "complete".to_owned(),
                    Settle::CompleteWith(r) => format!("complete with {} bytes", r.len()),
                    Settle::Fail(r) if r.starts_with("timed out") => "fail (timed out)".to_owned(),
                    Settle::Fail(_) => "fail".to_owned(),
                    Settle::Abandon { started } => format!("abandon (started {started})"),
                };
                write!(f, " job {id} token {token} {what};")?;
            }
            Ok(())
        }
        WorkerRequest::DrainCheck => f.write_str("drained?"),
        WorkerRequest::Sample => f.write_str("sample"),
        WorkerRequest::Fire => f.write_str("fire schedules"),
    }
}

/// The store's typed answer (what the real client's drivers receive).
#[derive(Debug, Clone)]
pub enum Answer {
    /// To acquire and renew.
    Grant(leasehold::Result<Grant>),
    /// To release.
    Unit(leasehold::Result<()>),
    /// To push.
    Enqueued(leasehold::Result<EnqueueOutcome>),
    /// To a worker session's request: what its `Exec` answered.
    Worker(WorkerReply),
}

/// What comes back.
#[derive(Debug, Clone)]
pub enum Rep {
    /// The store answered.
    Done(Answer),
    /// A transient store error; nothing was applied.
    Transient,
    /// The connection broke around the commit: the outcome is unknown
    /// (the store committed and the reply was lost, or the commit was
    /// lost too).
    Unknown,
    /// The handle belongs to another process (fork): nothing was sent.
    Forked,
}

impl Rep {
    /// Whether the answer is (possibly) missing: retry or wait.
    pub fn is_retry(&self) -> bool {
        matches!(self, Rep::Transient | Rep::Unknown)
    }
}

/// The error a driver sees for a reply that carries no answer.
pub fn error_of(rep: &Rep) -> leasehold::Error {
    use leasehold::StoreFailure;
    match rep {
        Rep::Unknown => leasehold::Error::transient("committing", "reply lost")
            .with_failure(StoreFailure::Ambiguous),
        Rep::Forked => leasehold::Error::Forked {
            created_pid: 1,
            current_pid: 2,
        },
        _ => leasehold::Error::transient("committing", "injected transient error"),
    }
}

/// A simulated event.
#[derive(Debug, Clone)]
pub enum Ev {
    /// A process's timer.
    Wake {
        /// Process.
        p: usize,
        /// Its incarnation.
        gen: u32,
        /// Which timer (a later one cancels an earlier).
        timer: u64,
    },
    /// A request reaches the store.
    Arrive {
        /// Process.
        p: usize,
        /// Its incarnation.
        gen: u32,
        /// Its holder id.
        holder: leasehold::HolderId,
        /// The request.
        req: Req,
        /// The request's id (0: no reply wanted).
        rid: u64,
    },
    /// A reply reaches a process.
    Reply {
        /// Process.
        p: usize,
        /// Its incarnation.
        gen: u32,
        /// The request's id.
        rid: u64,
        /// The reply.
        rep: Rep,
    },
    /// The plan's fault number `i`.
    Fault(usize),
    /// A killed process comes back.
    Restart {
        /// Process.
        p: usize,
    },
    /// A paused process resumes.
    Resume {
        /// Process.
        p: usize,
        /// Which pause.
        pause: u64,
    },
    /// Faults stop; holders finish; workers drain.
    Heal,
}

/// One line of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A process sent a request.
    Send(usize, u32, String),
    /// The store applied a request.
    Apply(usize, u32, String, String),
    /// A reply reached a process.
    Reply(usize, u32, String),
    /// A write to the protected resource.
    Write {
        /// Process.
        p: usize,
        /// Key index.
        key: usize,
        /// Token.
        token: u64,
        /// Accepted by the fenced resource.
        accepted: bool,
    },
    /// A fault.
    Fault(String),
    /// Anything else.
    Note(String),
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Line::Send(p, g, r) => write!(f, "p{p}.{g} send {r}"),
            Line::Apply(p, g, r, o) => write!(f, "store applies p{p}.{g} {r} -> {o}"),
            Line::Reply(p, g, r) => write!(f, "p{p}.{g} gets {r}"),
            Line::Write {
                p,
                key,
                token,
                accepted,
            } => write!(
                f,
                "p{p} writes resource key-{key} token {token}: {}",
                if *accepted {
                    "accepted"
                } else {
                    "rejected (stale)"
                }
            ),
            Line::Fault(s) => write!(f, "FAULT {s}"),
            Line::Note(s) => f.write_str(s),
        }
    }
}
