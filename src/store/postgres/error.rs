//! What a driver error means: transient, ambiguous or permanent, and a
//! message that names its cause.

use super::tls::{hint, tls_failure};
use crate::error::{Error, StoreFailure};
use postgres::error::SqlState;

/// What a failed statement means for the connection and the caller.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Before COMMIT was sent: the transaction did not happen.
    Work,
    /// During COMMIT: it may have happened.
    Commit,
}

/// Map a driver error to a typed store error: transient (retrying may
/// help), ambiguous (the session ended while COMMIT was in flight) or
/// permanent.
pub(super) fn pg_err(context: impl Into<String>, e: postgres::Error, stage: Stage) -> Error {
    let code = e.code();
    let transient_code = code.is_some_and(|c| {
        [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::LOCK_NOT_AVAILABLE,
            SqlState::UNIQUE_VIOLATION,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
            SqlState::QUERY_CANCELED,
            // The session lost its prepared statements: the statement did
            // not run, and a new session prepares them again
            // ([`statements_lost`]).
            SqlState::INVALID_SQL_STATEMENT_NAME,
        ]
        .contains(c)
            || c.code().starts_with("08")
            || c.code().starts_with("57P")
    });
    // No code: the connection failed (closed, I/O) or the client refused
    // a value before sending it (not transient).
    // A TLS handshake refused (a certificate not trusted, not for this
    // host) is not a lost connection: retrying cannot help.
    let connection_lost = code.is_none()
        && tls_failure(&e).is_none()
        && (e.is_closed()
            || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>()));
    let transient = transient_code || connection_lost;
    // Whether the session ended (rather than the server refusing the
    // statement and staying connected, which means nothing was committed).
    // (An idle-in-transaction or idle-session timeout ends the session
    // before it reads the COMMIT: certainly not committed.)
    let session_lost = connection_lost
        || code.is_some_and(|c| {
            (c.code().starts_with("57P") && *c != SqlState::IDLE_SESSION_TIMEOUT)
                || c.code().starts_with("08")
        });
    let ambiguous = stage == Stage::Commit && session_lost;
    let failure = if ambiguous {
        StoreFailure::Ambiguous
    } else if transient {
        StoreFailure::Transient
    } else {
        StoreFailure::Permanent
    };
    Error::from_source(context, failure, PgError(e))
}

/// Whether `e` says the session lost the statements it prepared
/// (SQLSTATE 26000: a pooler's `DISCARD ALL`, an operator's
/// `DEALLOCATE ALL`). Such a session is replaced, not kept.
pub(super) fn statements_lost(e: &Error) -> bool {
    let Error::Store { source, .. } = e else {
        return false;
    };
    source
        .downcast_ref::<PgError>()
        .and_then(|pg| pg.0.code())
        .is_some_and(|c| *c == SqlState::INVALID_SQL_STATEMENT_NAME)
}

/// The driver's error, shown with what it hides: the SQLSTATE of a server
/// error, the cause (connection refused, timed out) of a generic "error
/// connecting to server", or what a refused certificate means. It stays
/// the source of the store error.
#[derive(Debug)]
struct PgError(postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(f, "{} (SQLSTATE {})", db.message(), db.code().code()),
            None => match std::error::Error::source(&self.0) {
                Some(cause) => {
                    write!(f, "{}: {cause}", self.0)?;
                    match tls_failure(&self.0).and_then(hint) {
                        Some(hint) => write!(f, " ({hint})"),
                        None => Ok(()),
                    }
                }
                None => write!(f, "{}", self.0),
            },
        }
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}
