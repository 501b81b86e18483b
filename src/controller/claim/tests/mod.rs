//! The claim path's sequences, in-process and in seconds: the API server is
//! a script (each expected request and its answer: 200, 404, 409, 422, 500,
//! or a response that never arrives), the CSI driver is the real test driver
//! on a unix socket. Each row says, for one answer at one step, which
//! requests follow and what the backend holds in the end. The end-to-end
//! invariant tests (tests/invariants.rs) prove the same on a real control
//! plane; these prove every branch of the sequences.
//!
//! | file | the rows of |
//! |---|---|
//! | `rig.rs` | (the rig: the claim path's context on the bench, a reconcile as the controller runs it, the shared answers) |
//! | `intent.rs` | the fenced intent: what a claim costs, every answer to the write |
//! | `save.rs` | the PV save, and the leader gate before it |
//! | `driver.rs` | the driver's answers to `CreateVolume`, and the backoff |
//! | `topology.rs` | topology from the caches, no room, a vanished node |
//! | `refused.rs` | refusals shown before anything is written |
//! | `abandon.rs` | the cleanup of a claim deleted mid-flight |
//! | `sources.rs` | snapshots and clone sources: protected, kept, let go, swept |
//! | `admission.rs` | the intent made by the control plane (`--admission-intent`) |

mod abandon;
mod admission;
mod driver;
mod intent;
mod refused;
mod rig;
mod save;
mod sources;
mod topology;
