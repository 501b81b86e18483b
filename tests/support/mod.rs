//! Shared helpers for the integration tests: the connection to the local control plane started by
//! `testbed/cluster.sh`, builder fixtures for the storage objects, polling with a deadline, and
//! child processes (drivers, sidecars) that never outlive the test that started them.
//!
//! Every test file includes this with `mod support;`; each uses only part of it.
#![allow(dead_code, unused_imports)]

mod cluster;
mod fixtures;
mod http;
mod names;
mod namespace;
pub mod policies;
mod process;
mod proxy;
mod rbac;
mod rig;
mod snapshots;
mod wait;

pub use cluster::{Cluster, cluster, testbed_bin};
pub use fixtures::{PvFixture, PvcFixture, StorageClassFixture};
pub use http::{Reply, free_address, get, wait_serving};
pub use names::unique_name;
pub use namespace::TestNamespace;
pub use process::{ChildProcess, driver_named, wait_for_socket, workspace_bin};
pub use proxy::{FaultyApi, faulty_api};
pub use rbac::{
    PROVISIONER_USER, Rbac, ShippedRbac, grant_lease_role, grant_lease_role_for,
    grant_provisioner_rbac, grant_rbac,
};
pub use rig::{DEADLINE, Rig, RigBuilder, Sidecar};
pub use snapshots::{Snapshotter, dynamic, snapshot_resource};
pub use wait::{Observation, wait_for, wait_for_deleted};

/// Annotations and finalizers written by Kubernetes components (not by us); the tests check
/// them as facts about the control plane, so they are spelled out here rather than taken
/// from the crate under test.
pub mod k8s_keys {
    /// Set on a claim by the PV binder: which provisioner is expected to provision it.
    pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
    /// The deprecated beta spelling of [`STORAGE_PROVISIONER`], still written by the binder.
    pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
    /// Set by the scheduler on a claim of a `WaitForFirstConsumer` class.
    pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
    /// Set on a PV by the provisioner that created it.
    pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
    /// Set on a PV and its claim by the PV binder once it bound them.
    pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
    /// Added to every PV by the PV protection admission/controller.
    pub const PV_PROTECTION_FINALIZER: &str = "kubernetes.io/pv-protection";
    /// Added to every PVC by the PVC protection admission/controller.
    pub const PVC_PROTECTION_FINALIZER: &str = "kubernetes.io/pvc-protection";
}
