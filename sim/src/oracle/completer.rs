//! The worker loop's completer and reports (B1, B2): every outcome a
//! handler reports reaches the store as reported, unless its process dies
//! first; each claim's outcome is reported once, and nothing is sent for a
//! claim after that.

use super::{violation, Check, Oracle, Owner};

impl Oracle {
    /// A handler reported its job's outcome to its worker loop.
    pub fn handler_reported(&mut self, owner: Owner, job: u64, token: u64, complete: bool) {
        self.reported.insert((owner, job, token), (complete, false));
    }

    /// A settle batch carries `job`'s outcome (`Some(complete)`; `None`
    /// for a job given back): it must be the one its handler reported.
    pub fn settle_sent(
        &mut self,
        t: u64,
        owner: Owner,
        job: u64,
        token: u64,
        complete: Option<bool>,
    ) -> Check {
        let Some(complete) = complete else {
            return Ok(());
        };
        match self.reported.get_mut(&(owner, job, token)) {
            Some((said, sent)) if *said == complete => {
                *sent = true;
                Ok(())
            }
            Some((said, _)) => violation(
                "B1",
                t,
                format!("p{}.{} sent job {job}'s outcome as complete={complete}, its handler said complete={said}", owner.0, owner.1),
            ),
            None => violation(
                "B1",
                t,
                format!("p{}.{} sent an outcome for job {job} (token {token}) that no handler reported", owner.0, owner.1),
            ),
        }
    }

    /// B2: a worker reported the outcome of `job`'s claim `token` (to its
    /// `observe`): once per claim.
    pub fn outcome_reported(&mut self, t: u64, owner: Owner, job: u64, token: u64) -> Check {
        if self.reports.insert((owner, job, token)) {
            return Ok(());
        }
        violation(
            "B2",
            t,
            format!(
                "p{}.{} reported job {job}'s claim {token} a second time",
                owner.0, owner.1
            ),
        )
    }

    /// B2: a worker sends a renewal or an outcome for `job`'s claim
    /// `token`: it must not have reported that claim's outcome already.
    pub fn sent_for_claim(&self, t: u64, owner: Owner, job: u64, token: u64) -> Check {
        if !self.reports.contains(&(owner, job, token)) {
            return Ok(());
        }
        violation(
            "B2",
            t,
            format!(
                "p{}.{} still acts for job {job}'s claim {token} after reporting its outcome",
                owner.0, owner.1
            ),
        )
    }

    /// A process died: what it had not sent is gone with it (what it sent
    /// may still be in the network).
    pub fn forget(&mut self, owner: Owner) {
        self.reported
            .retain(|(o, _, _), (_, sent)| *o != owner || *sent);
    }

    /// B1 at the end of a run: an outcome reported but never sent.
    pub fn unsent(&self, t: u64, alive: impl Fn(Owner) -> bool) -> Check {
        for ((owner, job, token), (_, sent)) in &self.reported {
            if !sent && alive(*owner) {
                return violation(
                    "B1",
                    t,
                    format!(
                        "job {job}'s outcome (token {token}), reported by p{}.{}'s handler, never reached the store",
                        owner.0, owner.1
                    ),
                );
            }
        }
        Ok(())
    }
}
