//! The client machines driven by hand, with scripted time and replies:
//! each timing rule pinned where it can be seen exactly (the simulator
//! checks them at scale, under faults).

use leasehold::client::machine::{
    ClaimId, Deposed, ElectionAction, ElectionConfig, ElectionEvent, ElectionMachine, FireReport,
    HolderAction, HolderConfig, HolderEvent, HolderMachine, HolderReply, HolderRequest, JobOutcome,
    StopWhy, WorkerAction, WorkerConfig, WorkerMachine, WorkerReply, WorkerRequest,
};
use leasehold::core::job::Settle;
use leasehold::core::{Claim, Grant, HeartbeatReply};
use leasehold::{
    DriftBound, Error, HolderId, JobId, JobRecord, JobState, LocalMs, LostReason, Target,
};
use std::sync::Arc;

const DRIFT: DriftBound = DriftBound {
    ppm: 10_000,
    margin_ms: 0,
};

/// A store error a release (or any request) may be answered with.
fn unreachable() -> Error {
    Error::transient("testing", "the store is out of reach")
}

mod election;
mod holder;
mod lifetime;
mod scheduler;
mod worker;
