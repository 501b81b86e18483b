//! An explicit-state model of the provisioning protocol (issue 39), checked
//! exhaustively with stateright: the API server (resourceVersions, fenced
//! writes, finalizers, deletion with grace), caches that lag and replay in
//! order, the admission policies' intent or the sidecar's own, two replicas
//! contending for a Lease on a clock the model advances, a CSI driver that
//! creates by name and may lose its answer, the user and the binder. Each
//! replica decides with the product's own claim and volume decisions
//! (`product`); the acts in between are the model's steps (`sidecar`). docs/reliability.md has the
//! configurations, their sizes and the wrong variants' counterexamples.

pub mod config;
pub mod model;
pub mod product;
pub mod properties;
pub mod run;
pub mod sidecar;
pub mod state;
pub mod trace;
pub mod world;

pub use config::{Check, Config, MODES, Mode, Variant, wrong_variants};
pub use model::{Action, Protocol};
pub use run::{Outcome, check, check_until};
