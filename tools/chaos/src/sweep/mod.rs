//! The crash sweep: a crash at every step, deterministically. For every API write and every
//! `CreateVolume`/`DeleteVolume` a flow makes (provisioning, a restore, a clone, the volume
//! path of a deleted claim, the cleanup of a claim deleted while its volume was being made),
//! the sidecar is SIGKILLed (a) while the request is held before it leaves (the proxy or the
//! driver never passes it on: it did not happen) and (b) once the server acted, with its
//! answer held (it happened; the sidecar never learns it); each with and without the claim
//! (on the volume path: the PV) deleted while the sidecar is down. The sidecar then
//! restarts, and the invariant checker of the random runs judges, then deletes everything
//! and checks that nothing is left.
//!
//! The steps are not listed by hand: a clean run of each flow (the *trace*) records them,
//! from the proxy's journal of writes and the driver's ledger, so the sweep follows whatever
//! the sidecar under test does (ours and upstream's make different requests). A step is
//! "the n-th write of this verb and resource (or the n-th call of this method) since the
//! flow's trigger"; the proxy's `hold` rule and the driver's `hold` fault aim at exactly
//! that one. See docs/reliability.md.
//!
//! `cases.rs` is the pure half (flows, steps, cases, the table), `session.rs` the I/O.

mod cases;
mod session;

pub use cases::{Call, Case, Flow, Outcome, Point, Step, SweepReport, steps};
pub use session::{SweepOptions, sweep};
