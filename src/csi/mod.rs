//! Talking to the CSI driver: the generated protocol (crate `csi-proto`, from
//! `proto/csi.proto`), a client with per-call timeout, metrics and secret-free
//! logging, and the error classification.

mod client;
mod errors;
pub mod socket_access;

pub use client::{
    ConnectError, CsiClient, DriverCapabilities, IdentifyError, code_name, with_sources,
};
pub use csi_proto::v1 as pb;
pub use errors::{CsiErrorClass, classify};
