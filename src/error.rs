//! Typed errors. Every error names its cause and the object it concerns
//! (which key, which job, which field), so a caller can act on it and a
//! person can read it.

use crate::core::{HolderInfo, JobId, JobState};
use std::fmt;

/// Result alias used throughout leasehold.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a lease or a job claim is no longer ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LostReason {
    /// The lease or claim expired before the call reached the store.
    Expired,
    /// The token is not the current one: someone else was granted the key or
    /// the job since (or it was released / completed already).
    StaleToken,
    /// The caller is not the holder named on the record.
    NotHolder,
    /// The holder's own clock says its local validity deadline has passed.
    LocalDeadline,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "expired",
            LostReason::StaleToken => "stale token",
            LostReason::NotHolder => "not the holder",
            LostReason::LocalDeadline => "local validity deadline passed",
        })
    }
}

/// What a lost answer refers to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// A lease on a key.
    Lease {
        /// The lease key.
        key: String,
        /// The token the caller presented.
        token: u64,
    },
    /// A claim on a job.
    Job {
        /// The job.
        id: JobId,
        /// The token the caller presented.
        token: u64,
    },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Lease { key, token } => write!(f, "lease {key:?} (token {token})"),
            Target::Job { id, token } => write!(f, "claim on job {id} (token {token})"),
        }
    }
}

/// Every error leasehold returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The lease is held by someone else (all of its holder slots are taken).
    #[error("lease {key:?} is held by {}", fmt_holders(holders))]
    Held {
        /// The key asked for.
        key: String,
        /// Who holds it now, each with its expiry on the store's clock.
        holders: Vec<HolderInfo>,
    },
    /// The lease or claim is no longer ours; nothing was changed.
    #[error("{target} lost: {reason}")]
    Lost {
        /// What was lost.
        target: Target,
        /// Why.
        reason: LostReason,
    },
    /// A handle was used in a process other than the one that created it
    /// (after `fork`). The parent's lease or claim is left untouched.
    #[error("handle created in process {created_pid} used in forked process {current_pid}; a forked child never uses its parent's leases or connections")]
    Forked {
        /// The process that created the handle.
        created_pid: u32,
        /// The process that tried to use it.
        current_pid: u32,
    },
    /// An argument was rejected before anything was changed.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The argument or field at fault.
        field: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// No job has this id.
    #[error("job {0} not found")]
    NotFound(JobId),
    /// The job is in a state where the operation does not apply.
    #[error("job {id} is {state}; cannot {action}")]
    InvalidState {
        /// The job.
        id: JobId,
        /// Its current state.
        state: JobState,
        /// What was attempted.
        action: &'static str,
    },
    /// The store failed. `transient` errors (SQLITE_BUSY, serialization
    /// failures, injected faults) may be retried; others are reported as is.
    #[error("store error while {context}: {message}")]
    Store {
        /// What the store was doing ("opening leasehold.db", "claiming from queue q").
        context: String,
        /// The store's own message.
        message: String,
        /// Whether retrying may succeed.
        transient: bool,
        /// Whether the operation may have been applied although an error came back.
        ambiguous: bool,
    },
    /// Transient store errors persisted past the retry deadline.
    #[error("store still busy after retrying for {waited_ms} ms: {last}")]
    Busy {
        /// How long the caller retried.
        waited_ms: u64,
        /// The last transient error seen.
        last: Box<Error>,
    },
    /// A blocking wait ran out.
    #[error("timed out after {waited_ms} ms waiting for {what}")]
    Timeout {
        /// How long the caller waited.
        waited_ms: u64,
        /// What was waited for.
        what: String,
    },
}

fn fmt_holders(holders: &[HolderInfo]) -> String {
    let parts: Vec<String> = holders.iter().map(ToString::to_string).collect();
    if parts.is_empty() {
        "nobody (limit reached)".to_owned()
    } else {
        parts.join(", ")
    }
}

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::Invalid {
            field,
            reason: reason.into(),
        }
    }

    /// A transient store error (retryable).
    pub fn transient(context: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Store {
            context: context.into(),
            message: message.into(),
            transient: true,
            ambiguous: false,
        }
    }

    /// A permanent store error.
    pub fn store(context: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Store {
            context: context.into(),
            message: message.into(),
            transient: false,
            ambiguous: false,
        }
    }

    /// Whether retrying the same call may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Store {
                transient: true,
                ambiguous: false,
                ..
            }
        )
    }

    /// Whether the operation may have been applied although it reported an
    /// error (the reply was lost). The caller must not assume either outcome.
    pub fn is_ambiguous(&self) -> bool {
        matches!(
            self,
            Error::Store {
                ambiguous: true,
                ..
            }
        )
    }

    /// Whether this error says the lease or claim is gone.
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost { .. })
    }
}
