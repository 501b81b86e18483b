//! csi-provisioner: a drop-in Rust replacement for the Kubernetes CSI
//! external-provisioner sidecar. `main.rs` only wires these modules together.

pub mod audit;
pub mod capacity;
pub mod check;
pub mod config;
pub mod console;
pub mod controller;
pub mod csi;
pub mod duration;
pub mod entry;
pub mod http;
pub mod keys;
pub mod kube;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod provision;
pub mod quantity;
pub mod run;
