//! leasehold-sim: the deterministic simulator and the reference model.

pub mod model;
