//! The scale profile (issue 41): how each contender's costs grow with the cluster. The
//! cluster is filled to 1,000, 10,000, 20,000 and 50,000 bound PV/PVC pairs in turn
//! (`fill`, shaped by `layout`); at each size every contender, reaching the API server
//! through the fault proxy, is started, idled, scraped, given a burst, forced to relist
//! and (ours) audited (`run`); `report` turns that into a table and a plot per figure.

pub mod fill;
pub mod layout;
pub mod report;
mod run;

use serde::{Deserialize, Serialize};

pub use fill::Fill;
pub use run::run_size;

/// The scale profile's figures of one contender at one size, beyond those every run has
/// (`RunResult`: start-up, idle RSS, the burst's figures, peak RSS by the burst's end).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Extra {
    /// Bound PV/PVC pairs in the cluster.
    pub pairs: usize,
    /// How long the contender idled before its RSS was read.
    pub idle_secs: u64,
    /// VmHWM at the end of idling: the peak of start-up (every list, the caches filled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_peak_kib: Option<u64>,
    /// One `GET /metrics` after idling: from connecting to the last byte (not the floor's:
    /// it serves none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relist: Option<Relist>,
    /// `csi-provisioner audit` at this size (in ours' turn only: it is one program run,
    /// not a contender's cost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<Audit>,
    /// kube-controller-manager's CPU-seconds per minute while the contender idled: the
    /// binder's periodic sync of every pair (the same for every contender; the machine's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_manager_cpu_per_min: Option<f64>,
    /// What filling the cluster to this size took (the same for every contender of a size).
    #[serde(default)]
    pub fill: Fill,
    /// The control plane at the end of the contender's run.
    #[serde(default)]
    pub control_plane: ControlPlane,
}

/// A forced relist: every watch stream of the contender cut and its resume answered 410
/// Gone (kube-fault-proxy's expiring cut), as after an API server restart that compacted
/// past the contender's resourceVersion; a claim is created right after the cut.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Relist {
    /// From the cut to that claim's PV.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secs: Option<f64>,
    /// Peak RSS from the cut until 5 s after that PV.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_kib: Option<u64>,
    /// `VmHWM` (reset before the cut), or `sampled` (VmRSS every 100 ms, if the reset failed).
    pub peak_from: String,
    /// Bytes the contender read meanwhile.
    pub bytes: u64,
    /// Resumes answered 410 Gone: watches that had to list again (0: no relist happened).
    pub gone: u64,
}

/// One `csi-provisioner audit --output=json --recheck-after=0s` against the profile's driver.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Audit {
    pub secs: f64,
    /// VmHWM, read every 20 ms until it exited.
    pub peak_kib: u64,
    pub exit: Option<i32>,
    /// Findings in its report (0 expected: every volume has its PV).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub findings: Option<usize>,
}

/// kube-apiserver and etcd, read from /proc and the data directory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlPlane {
    pub apiserver_rss_kib: u64,
    /// VmHWM of kube-apiserver since the control plane started.
    pub apiserver_peak_kib: u64,
    pub etcd_rss_kib: u64,
    /// etcd's database file (what `--quota-backend-bytes` bounds; 2 GiB by default).
    pub etcd_db_bytes: u64,
}
