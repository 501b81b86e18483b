//! kube-fault-proxy: a test-only HTTP proxy between a Kubernetes client (our sidecar, the
//! upstream one) and the real kube-apiserver, which injects API faults on command: error
//! statuses, lost responses and slow answers per verb and resource; delayed, duplicated,
//! dropped and hidden watch events; cut watch streams; a request held before or after the
//! API server acted on it (and a journal of the writes). See docs/reliability.md.
//!
//! The client side is plain HTTP on loopback (give the client [`kubeconfig_for`] the proxy's
//! URL); the upstream side is the API server of a kubeconfig, with its CA and credentials.

pub mod control;
pub mod hold;
pub mod rules;
mod server;
mod watch;

pub use hold::{HeldRequest, WriteRecord};
pub use rules::{Fault, HoldAt, RequestInfo, Rule, Stats};
pub use server::{Proxy, kubeconfig_for};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type ProxyBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, BoxError>;
