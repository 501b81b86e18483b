//! Prometheus metrics with upstream's names and labels, so existing dashboards
//! keep working. One registry is built in `main`; components get an
//! `Arc<Metrics>` and record into typed families.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Buckets of `csi_sidecar_operations_seconds` (upstream csi-lib-utils).
const CSI_OP_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];
/// Prometheus client default buckets, as upstream's controller histograms use.
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CsiOperationLabels {
    pub driver_name: String,
    pub method_name: String,
    pub grpc_status_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabels {
    pub class: String,
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeLabels {
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    pub name: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

pub struct Metrics {
    pub csi_operations: HistogramFamily<CsiOperationLabels>,
    pub provision_total: Family<ClaimLabels, Counter>,
    pub provision_failed_total: Family<ClaimLabels, Counter>,
    pub provision_duration: HistogramFamily<ClaimLabels>,
    pub delete_total: Family<VolumeLabels, Counter>,
    pub delete_failed_total: Family<VolumeLabels, Counter>,
    pub delete_duration: HistogramFamily<VolumeLabels>,
    pub leader_status: Family<LeaseLabels, Gauge>,
}

fn csi_histogram() -> Histogram {
    Histogram::new(CSI_OP_BUCKETS)
}

fn default_histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

impl Metrics {
    /// Creates the metric families and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            csi_operations: Family::new_with_constructor(csi_histogram),
            provision_total: Family::default(),
            provision_failed_total: Family::default(),
            provision_duration: Family::new_with_constructor(default_histogram),
            delete_total: Family::default(),
            delete_failed_total: Family::default(),
            delete_duration: Family::new_with_constructor(default_histogram),
            leader_status: Family::default(),
        };
        registry.register(
            "csi_sidecar_operations_seconds",
            "Duration of CSI calls, by driver, gRPC method and status code",
            m.csi_operations.clone(),
        );
        // prometheus-client appends `_total` to counters itself.
        registry.register(
            "controller_persistentvolumeclaim_provision",
            "Claims provisioned successfully",
            m.provision_total.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_failed",
            "Failed provisioning attempts",
            m.provision_failed_total.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_duration_seconds",
            "Seconds from the first provisioning attempt of a claim to its saved PV",
            m.provision_duration.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete",
            "Volumes deleted successfully",
            m.delete_total.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_failed",
            "Failed volume deletion attempts",
            m.delete_failed_total.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_duration_seconds",
            "Seconds taken to delete a volume and its PV",
            m.delete_duration.clone(),
        );
        registry.register(
            "leader_election_master_status",
            "1 while this replica holds the lease, else 0",
            m.leader_status.clone(),
        );
        m
    }

    /// A registry-less instance for unit tests and tools.
    pub fn unregistered() -> Metrics {
        Metrics::register(&mut Registry::default())
    }
}
