//! The volume path's sequences, in-process and in seconds, on the bench both
//! paths share (`controller::scripted`): the API server is a script that can
//! refuse, fail or lose an answer, the CSI driver is the real test driver.
//! Each row says, for one answer at one step, which requests follow and what
//! the backend holds in the end. The end-to-end deletion tests
//! (tests/provision_basic.rs, tests/detach_wait.rs, tests/deletion_secrets.rs,
//! tests/invariants.rs, tests/migration.rs, tests/node_deployment.rs) prove the
//! same on a real control plane; these prove every branch.
//!
//! | file | the rows of |
//! |---|---|
//! | `rig.rs` | (the rig: the volume path's context on the bench, a reconcile as the controller runs it, the shared PVs) |
//! | `delete.rs` | the deletion of a Released PV, answer by answer, and its secret |
//! | `held.rs` | deletions held back or left alone |
//! | `finalizer.rs` | the finalizer following the reclaim policy |

mod delete;
mod finalizer;
mod held;
mod rig;
