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
    /// The job's run-time limit passed (its worker stopped the attempt and
    /// failed it, saying so).
    TimedOut,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "expired",
            LostReason::StaleToken => "stale token",
            LostReason::NotHolder => "not the holder",
            LostReason::LocalDeadline => "local validity deadline passed",
            LostReason::TimedOut => "the job's run-time limit passed",
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

/// How a store failure bears on the operation that met it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreFailure {
    /// Nothing was applied, and retrying may succeed: SQLITE_BUSY, a
    /// serialization failure, a connection lost before COMMIT.
    Transient,
    /// The operation may or may not have been applied: the connection
    /// broke while COMMIT was in flight. The caller must not assume either
    /// outcome.
    Ambiguous,
    /// Nothing was applied, and retrying alone will not help: a corrupt or
    /// foreign file, a permission, a newer schema.
    Permanent,
}

/// A store failure's cause when there is no driver error to keep (the
/// store's own finding: "not a directory", "a newer schema").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause(pub String);

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Cause {}

/// The driver's error (or a [`Cause`]) behind a store failure, shared so
/// that every member of a group commit can be told.
pub type Source = std::sync::Arc<dyn std::error::Error + Send + Sync>;

fn unknown_outcome(failure: &StoreFailure) -> &'static str {
    match failure {
        StoreFailure::Ambiguous => " (the outcome is unknown: it may have been applied)",
        _ => "",
    }
}

/// The argument or stored field an [`Error::Invalid`] names: match on it
/// (a command line maps it to the flag that set it) rather than on text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// A lease key.
    Key,
    /// A queue name.
    Queue,
    /// A schedule's name.
    Schedule,
    /// A holder id.
    Holder,
    /// A holder's label.
    HolderLabel,
    /// A lease's time to live.
    Ttl,
    /// A job claim's lease.
    Lease,
    /// A job's delay before its first attempt.
    Delay,
    /// How many jobs one call claims or settles.
    Batch,
    /// How many holders a key allows, or how many items a listing returns.
    Limit,
    /// A failure reason.
    Reason,
    /// A job's unique key.
    UniqueKey,
    /// How long a job's unique key blocks a second push.
    UniqueFor,
    /// The states in which a job's unique key blocks a second push.
    UniqueStates,
    /// A job's concurrency key (what a queue's per-key limit counts).
    ConcurrencyKey,
    /// A queue's limit on running jobs.
    Concurrency,
    /// A queue's limit on running jobs per concurrency key.
    PerKey,
    /// A job's run-time limit.
    Timeout,
    /// A running job's progress report.
    Progress,
    /// A queue's limit on jobs started per window.
    Rate,
    /// A queue's limit on jobs of one concurrency key started per window.
    PerKeyRate,
    /// A job's payload.
    Payload,
    /// A job's result.
    Result,
    /// A job's attempts allowed.
    MaxAttempts,
    /// A job's start instant.
    RunAt,
    /// A job state's name.
    State,
    /// A store URL or one of its options.
    Store,
    /// A schedule's rule.
    Rule,
    /// A schedule's period.
    Every,
    /// A schedule's cron expression.
    Cron,
    /// A cron expression's time zone.
    Tz,
    /// What a schedule does with missed ticks.
    Missed,
    /// A listing's cursor (start after this one), or the jobs a job runs
    /// after ([`crate::JobSpec::after`]).
    After,
    /// A summary's bucket width.
    Bucket,
    /// How many buckets a summary has.
    Buckets,
    /// How much of a payload a listing shows.
    PreviewBytes,
    /// Where a listing's counts stop counting.
    CountCap,
    /// A job handle used where it does not belong.
    Job,
    /// A PostgreSQL schema name.
    Schema,
    /// PostgreSQL's `sslmode`.
    Sslmode,
    /// PostgreSQL's `sslrootcert`.
    Sslrootcert,
    /// A store's connection pool size.
    MaxConnections,
    /// A record's creation instant, as stored.
    CreatedAt,
    /// A lease's expiry, as stored.
    ExpiresAt,
    /// A job id, as stored.
    Id,
    /// A fencing token, as stored.
    Token,
    /// A job's end instant, as stored.
    FinishedAt,
    /// A claim's expiry, as stored.
    LeaseUntil,
    /// A job's last failure reason, as stored.
    LastError,
    /// A store's notification channel.
    Channel,
    /// A job's attempts so far, as stored.
    Attempts,
    /// A job's expired claims, as stored.
    Expiries,
    /// A purge's cutoff instant.
    Cutoff,
    /// A schedule's next tick, as stored.
    NextAt,
    /// The store's clock reading.
    Now,
}

impl Field {
    /// Its name as the error message shows it (snake case).
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Key => "key",
            Field::Queue => "queue",
            Field::Schedule => "schedule",
            Field::Holder => "holder",
            Field::HolderLabel => "holder label",
            Field::Ttl => "ttl",
            Field::Lease => "lease",
            Field::Delay => "delay",
            Field::Batch => "batch",
            Field::Limit => "limit",
            Field::Reason => "reason",
            Field::UniqueKey => "unique_key",
            Field::UniqueFor => "unique_for",
            Field::UniqueStates => "unique_states",
            Field::ConcurrencyKey => "key",
            Field::Concurrency => "concurrency",
            Field::PerKey => "per_key",
            Field::Timeout => "timeout",
            Field::Progress => "progress",
            Field::Rate => "rate",
            Field::PerKeyRate => "per_key_rate",
            Field::Payload => "payload",
            Field::Result => "result",
            Field::MaxAttempts => "max_attempts",
            Field::RunAt => "run_at",
            Field::State => "state",
            Field::Store => "store",
            Field::Rule => "rule",
            Field::Every => "every",
            Field::Cron => "cron",
            Field::Tz => "tz",
            Field::Missed => "missed",
            Field::After => "after",
            Field::Bucket => "bucket",
            Field::Buckets => "buckets",
            Field::PreviewBytes => "preview_bytes",
            Field::CountCap => "count_cap",
            Field::Job => "job",
            Field::Schema => "schema",
            Field::Sslmode => "sslmode",
            Field::Sslrootcert => "sslrootcert",
            Field::MaxConnections => "max_connections",
            Field::CreatedAt => "created_at",
            Field::ExpiresAt => "expires_at",
            Field::Id => "id",
            Field::Token => "token",
            Field::FinishedAt => "finished_at",
            Field::LeaseUntil => "lease_until",
            Field::LastError => "last_error",
            Field::Channel => "channel",
            Field::Attempts => "attempts",
            Field::Expiries => "expiries",
            Field::Cutoff => "cutoff",
            Field::NextAt => "next_at",
            Field::Now => "now",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every error leasehold returns.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
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
        field: Field,
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
    /// The store failed; the driver's error is the [`source`](std::error::Error::source).
    #[error("store error while {context}: {source}{}", unknown_outcome(failure))]
    Store {
        /// What the store was doing ("opening leasehold.db", "claiming from queue q").
        context: String,
        /// Whether anything may have been applied, and whether a retry may help.
        failure: StoreFailure,
        /// The cause: the driver's error, or the store's own [`Cause`].
        source: Source,
    },
    /// The store's contents were moved to another store by `leasehold
    /// migrate`: this one is frozen (every transaction on it fails so),
    /// and `to` names where they went. Permanent: point the store URL at
    /// `to` (the command line exits 78).
    #[error("this store was moved to {to} by `leasehold migrate`: use that store instead")]
    Moved {
        /// The store the contents went to (as it describes itself, without
        /// a password).
        to: String,
    },
    /// Transient store errors persisted past the retry deadline.
    #[error("store still busy after retrying for {waited_ms} ms: {last}")]
    Busy {
        /// How long the caller retried.
        waited_ms: u64,
        /// The last transient error seen.
        #[source]
        last: Box<Error>,
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
    pub fn invalid(field: Field, reason: impl Into<String>) -> Self {
        Error::Invalid {
            field,
            reason: reason.into(),
        }
    }

    /// A store failure caused by `source` (a driver's error).
    pub fn from_source(
        context: impl Into<String>,
        failure: StoreFailure,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Store {
            context: context.into(),
            failure,
            source: std::sync::Arc::new(source),
        }
    }

    /// A transient store error found by the store itself (retryable).
    pub fn transient(context: impl Into<String>, message: impl Into<String>) -> Self {
        Self::from_source(context, StoreFailure::Transient, Cause(message.into()))
    }

    /// A permanent store error found by the store itself.
    pub fn store(context: impl Into<String>, message: impl Into<String>) -> Self {
        Self::from_source(context, StoreFailure::Permanent, Cause(message.into()))
    }

    /// The same store failure, now of another kind (a COMMIT that failed
    /// in flight is ambiguous, whatever its cause).
    pub fn with_failure(self, failure: StoreFailure) -> Self {
        match self {
            Error::Store {
                context, source, ..
            } => Error::Store {
                context,
                failure,
                source,
            },
            other => other,
        }
    }

    /// Whether retrying the same call may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Store {
                failure: StoreFailure::Transient,
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
                failure: StoreFailure::Ambiguous,
                ..
            }
        )
    }

    /// Whether this error says the lease or claim is gone.
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost { .. })
    }
}
