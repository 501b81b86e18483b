//! csi-provisioner: a drop-in Rust replacement for the Kubernetes CSI
//! external-provisioner sidecar. `main.rs` only wires these modules together.

pub mod controller;
pub mod csi;
pub mod keys;
pub mod kube;
pub mod provision;
pub mod http;
pub mod metrics;
pub mod run;
pub mod config;
pub mod duration;
pub mod logging;
