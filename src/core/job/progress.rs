//! Progress a running job's handler reports (issue 27 §3).
//!
//! # The rule
//! A handler reports how far it got ([`Progress`]: a fraction and a short
//! message). The report is written with the job only under the claim that
//! made it: [`record_progress`] checks the holder and the token as a
//! heartbeat does, so a stale claim's report (its lease ran out and
//! another worker took the job) is refused and changes nothing. Clients
//! send reports with the transactions they make anyway (a renewal round,
//! the attempt's settle), never in one of their own. A new claim starts
//! without progress; the last report stays with the job once it ends.

use super::{JobId, JobRecord};
use crate::core::{check_text, HolderId, JobTxn};
use crate::error::{Error, Field, Result};
use std::fmt;
use std::sync::Arc;

/// The longest progress message, in bytes.
pub const MAX_PROGRESS_MESSAGE: usize = 1024;

/// How far a running job got: a fraction in steps of 1/10,000 and a short
/// message ("tiles 400/1000").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Progress {
    /// Done, in ten-thousandths (0 to 10,000).
    pub permyriad: u16,
    /// What the handler says (at most [`MAX_PROGRESS_MESSAGE`] bytes, no
    /// control characters but tab).
    pub message: Arc<str>,
}

impl Progress {
    /// `fraction` (0.0 to 1.0) done, saying `message`; anything else is
    /// [`Error::Invalid`] naming the progress.
    pub fn new(fraction: f64, message: &str) -> Result<Progress> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::invalid(
                Field::Progress,
                format!("{fraction} is not a fraction from 0 to 1"),
            ));
        }
        // In range, so the cast is exact to the step.
        let permyriad = (fraction * 10_000.0).round() as u16;
        Progress::of_permyriad(permyriad, message)
    }

    /// `permyriad` ten-thousandths done (at most 10,000), saying `message`.
    pub fn of_permyriad(permyriad: u16, message: &str) -> Result<Progress> {
        if permyriad > 10_000 {
            return Err(Error::invalid(
                Field::Progress,
                format!("{permyriad} ten-thousandths is more than all"),
            ));
        }
        check_text(Field::Progress, message)?;
        if message.len() > MAX_PROGRESS_MESSAGE {
            return Err(Error::invalid(
                Field::Progress,
                format!(
                    "a message of {} bytes is longer than {MAX_PROGRESS_MESSAGE}",
                    message.len()
                ),
            ));
        }
        if message.chars().any(|c| c.is_control() && c != '\t') {
            return Err(Error::invalid(
                Field::Progress,
                "the message contains a control character",
            ));
        }
        Ok(Progress {
            permyriad,
            message: Arc::from(message),
        })
    }

    /// The fraction done (0.0 to 1.0).
    pub fn fraction(&self) -> f64 {
        f64::from(self.permyriad) / 10_000.0
    }
}

impl fmt::Display for Progress {
    /// `40%` or `40.25% tiles 400/1000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, part) = (self.permyriad / 100, self.permyriad % 100);
        match part {
            0 => write!(f, "{whole}%")?,
            _ => write!(f, "{whole}.{part:02}%")?,
        }
        if !self.message.is_empty() {
            write!(f, " {}", self.message)?;
        }
        Ok(())
    }
}

/// Record progress reports of `holder`'s claims (job, token, report), in
/// the caller's transaction. A report is written under its own unexpired
/// claim, or on the job that claim ended (no claim made since: its
/// attempt's last word, sent with a renewal that lost the race to its
/// settle); else it is refused with the loss a heartbeat would answer,
/// and nothing is written. The jobs are read at once.
pub fn record_progress(
    tx: &mut dyn JobTxn,
    holder: HolderId,
    reports: &[(JobId, u64, Progress)],
) -> Result<Vec<Result<()>>> {
    let now_ms = tx.now_ms();
    let ids: Vec<JobId> = reports.iter().map(|r| r.0).collect();
    let mut jobs = tx.jobs_by_id(&ids)?;
    let mut out = Vec::with_capacity(reports.len());
    for (id, token, progress) in reports {
        let Some(job) = jobs.iter_mut().find(|j| j.id == *id) else {
            out.push(Err(Error::NotFound(*id)));
            continue;
        };
        let fenced = match job.check_claim(holder, *token, now_ms) {
            Err(_) if ended_under(job, *token) => Ok(()),
            other => other.map(drop),
        };
        match fenced {
            Ok(()) if job.progress.as_ref() == Some(progress) => out.push(Ok(())),
            Ok(()) => {
                job.progress = Some(progress.clone());
                tx.put_job(job)?;
                out.push(Ok(()));
            }
            Err(e) => out.push(Err(e)),
        }
    }
    Ok(out)
}

/// Whether `job` ended under the claim with `token` (terminal, and no
/// claim made since).
fn ended_under(job: &JobRecord, token: u64) -> bool {
    job.state.is_terminal() && job.last_token == token && token > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_round_to_the_step_and_show_as_percent() {
        let p = Progress::new(0.4, "tiles 400/1000").unwrap();
        assert_eq!(
            (p.permyriad, p.to_string()),
            (4000, "40% tiles 400/1000".into())
        );
        assert_eq!(Progress::new(0.40255, "").unwrap().to_string(), "40.26%");
        assert_eq!(Progress::new(1.0, "").unwrap().permyriad, 10_000);
        assert_eq!(Progress::new(0.0, "x").unwrap().fraction(), 0.0);
        assert_eq!(p.fraction(), 0.4);
        assert_eq!(Progress::of_permyriad(2_500, "").unwrap().fraction(), 0.25);
        for bad in [-0.01, 1.01, f64::NAN, f64::INFINITY] {
            let e = Progress::new(bad, "").unwrap_err();
            assert!(e.to_string().contains("progress"), "{bad}: {e}");
        }
        assert!(Progress::of_permyriad(10_001, "").is_err());
        assert!(Progress::new(0.5, "a\nb").is_err());
        assert!(Progress::new(0.5, "a\tb").is_ok());
        assert!(Progress::new(0.5, &"x".repeat(MAX_PROGRESS_MESSAGE)).is_ok());
        assert!(Progress::new(0.5, &"x".repeat(MAX_PROGRESS_MESSAGE + 1)).is_err());
    }
}
