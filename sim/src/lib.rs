//! leasehold-sim: the deterministic simulator, its oracle and the
//! reference model.
//!
//! - [`plan`]: what a run does, as plain data generated from one seed.
//! - [`world`]: the single-threaded simulated world driving the real core
//!   and a real store.
//! - [`oracle`]: the guarantee checks over what happened, in true time.
//! - [`model`]: the naive reference model, shared with the property tests.
//! - [`runner`]: seeds, canaries, shrinking and the summary line.

pub mod model;
pub mod oracle;
pub mod plan;
pub mod runner;
pub mod world;
