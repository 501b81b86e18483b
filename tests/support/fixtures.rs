//! Builder fixtures for the objects the tests create: StorageClasses, claims and pre-bound
//! volumes. Each starts from the smallest valid object and says only what a test changes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;

use super::k8s_keys;

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// `StorageClassFixture::new(name, provisioner)`: reclaim policy and binding mode left to the
/// API server's defaults (`Delete`, `Immediate`) unless set.
#[derive(Clone, Debug)]
pub struct StorageClassFixture {
    sc: StorageClass,
}

impl StorageClassFixture {
    pub fn new(name: &str, provisioner: &str) -> Self {
        StorageClassFixture {
            sc: StorageClass {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..ObjectMeta::default()
                },
                provisioner: provisioner.to_string(),
                ..StorageClass::default()
            },
        }
    }

    /// `Immediate` or `WaitForFirstConsumer`.
    pub fn binding_mode(mut self, mode: &str) -> Self {
        self.sc.volume_binding_mode = Some(mode.to_string());
        self
    }

    /// `Delete` or `Retain`.
    pub fn reclaim(mut self, policy: &str) -> Self {
        self.sc.reclaim_policy = Some(policy.to_string());
        self
    }

    pub fn param(mut self, key: &str, value: &str) -> Self {
        self.sc
            .parameters
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    pub fn mount_options(mut self, options: &[&str]) -> Self {
        self.sc.mount_options = Some(strings(options));
        self
    }

    pub fn allow_volume_expansion(mut self) -> Self {
        self.sc.allow_volume_expansion = Some(true);
        self
    }

    /// Adds an `allowedTopologies` term: `key` in `values`.
    pub fn allowed_topology(mut self, key: &str, values: &[&str]) -> Self {
        use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};
        self.sc
            .allowed_topologies
            .get_or_insert_with(Vec::new)
            .push(TopologySelectorTerm {
                match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                    key: key.to_string(),
                    values: strings(values),
                }]),
            });
        self
    }

    pub fn build(self) -> StorageClass {
        self.sc
    }
}

/// `PvcFixture::new(name, namespace)`: a `ReadWriteOnce` filesystem claim of `1Gi` with no
/// StorageClass (set one with [`PvcFixture::class`]).
#[derive(Clone, Debug)]
pub struct PvcFixture {
    pvc: PersistentVolumeClaim,
}

impl PvcFixture {
    pub fn new(name: &str, namespace: &str) -> Self {
        PvcFixture {
            pvc: PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(namespace.to_string()),
                    ..ObjectMeta::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(strings(&["ReadWriteOnce"])),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(
                            [("storage".to_string(), Quantity("1Gi".to_string()))].into(),
                        ),
                        ..VolumeResourceRequirements::default()
                    }),
                    ..PersistentVolumeClaimSpec::default()
                }),
                ..PersistentVolumeClaim::default()
            },
        }
    }

    fn spec(&mut self) -> &mut PersistentVolumeClaimSpec {
        self.pvc.spec.get_or_insert_with(Default::default)
    }

    pub fn class(mut self, storage_class: &str) -> Self {
        self.spec().storage_class_name = Some(storage_class.to_string());
        self
    }

    /// The requested size, as a Kubernetes quantity (`1Gi`, `500Mi`).
    pub fn size(mut self, quantity: &str) -> Self {
        let resources = self.spec().resources.get_or_insert_with(Default::default);
        resources
            .requests
            .get_or_insert_with(BTreeMap::new)
            .insert("storage".to_string(), Quantity(quantity.to_string()));
        self
    }

    /// Also sets a limit, which the provisioner passes as `CapacityRange.limit_bytes`.
    pub fn limit(mut self, quantity: &str) -> Self {
        let resources = self.spec().resources.get_or_insert_with(Default::default);
        resources
            .limits
            .get_or_insert_with(BTreeMap::new)
            .insert("storage".to_string(), Quantity(quantity.to_string()));
        self
    }

    pub fn access_modes(mut self, modes: &[&str]) -> Self {
        self.spec().access_modes = Some(strings(modes));
        self
    }

    /// A raw block claim (`volumeMode: Block`).
    pub fn attributes_class(mut self, vac: &str) -> Self {
        self.spec().volume_attributes_class_name = Some(vac.to_string());
        self
    }

    pub fn block(mut self) -> Self {
        self.spec().volume_mode = Some("Block".to_string());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.pvc
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.pvc
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    /// What the scheduler does for a `WaitForFirstConsumer` claim once it picked a node.
    pub fn selected_node(self, node: &str) -> Self {
        self.annotation(k8s_keys::SELECTED_NODE, node)
    }

    /// Pre-binds the claim to a named PV from the claim's side.
    pub fn volume_name(mut self, pv: &str) -> Self {
        self.spec().volume_name = Some(pv.to_string());
        self
    }

    pub fn build(self) -> PersistentVolumeClaim {
        self.pvc
    }
}

/// `PvFixture::new(name)`: a `1Gi` `ReadWriteOnce` CSI volume with reclaim policy `Retain`, for
/// tests that create volumes by hand (pre-bound with [`PvFixture::claim`], or to be deleted).
#[derive(Clone, Debug)]
pub struct PvFixture {
    pv: PersistentVolume,
}

impl PvFixture {
    pub fn new(name: &str) -> Self {
        PvFixture {
            pv: PersistentVolume {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..ObjectMeta::default()
                },
                spec: Some(PersistentVolumeSpec {
                    access_modes: Some(strings(&["ReadWriteOnce"])),
                    capacity: Some([("storage".to_string(), Quantity("1Gi".to_string()))].into()),
                    persistent_volume_reclaim_policy: Some("Retain".to_string()),
                    csi: Some(CSIPersistentVolumeSource {
                        driver: "fixture.csi.invalid".to_string(),
                        volume_handle: name.to_string(),
                        ..CSIPersistentVolumeSource::default()
                    }),
                    ..PersistentVolumeSpec::default()
                }),
                ..PersistentVolume::default()
            },
        }
    }

    fn spec(&mut self) -> &mut PersistentVolumeSpec {
        self.pv.spec.get_or_insert_with(Default::default)
    }

    fn csi(&mut self) -> &mut CSIPersistentVolumeSource {
        self.spec().csi.get_or_insert_with(Default::default)
    }

    pub fn driver(mut self, driver: &str) -> Self {
        self.csi().driver = driver.to_string();
        self
    }

    pub fn handle(mut self, volume_handle: &str) -> Self {
        self.csi().volume_handle = volume_handle.to_string();
        self
    }

    pub fn volume_attribute(mut self, key: &str, value: &str) -> Self {
        self.csi()
            .volume_attributes
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    pub fn capacity(mut self, quantity: &str) -> Self {
        self.spec().capacity =
            Some([("storage".to_string(), Quantity(quantity.to_string()))].into());
        self
    }

    pub fn access_modes(mut self, modes: &[&str]) -> Self {
        self.spec().access_modes = Some(strings(modes));
        self
    }

    pub fn class(mut self, storage_class: &str) -> Self {
        self.spec().storage_class_name = Some(storage_class.to_string());
        self
    }

    /// `Delete` or `Retain`.
    pub fn reclaim(mut self, policy: &str) -> Self {
        self.spec().persistent_volume_reclaim_policy = Some(policy.to_string());
        self
    }

    pub fn block(mut self) -> Self {
        self.spec().volume_mode = Some("Block".to_string());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.pv
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Marks the volume as made by `provisioner`, as a dynamically provisioned one would be.
    pub fn provisioned_by(self, provisioner: &str) -> Self {
        self.annotation(k8s_keys::PROVISIONED_BY, provisioner)
    }

    pub fn finalizer(mut self, finalizer: &str) -> Self {
        self.pv
            .metadata
            .finalizers
            .get_or_insert_with(Vec::new)
            .push(finalizer.to_string());
        self
    }

    /// Pre-binds the volume to `claim` (its name, namespace and, once created, uid): the PV
    /// binder then binds exactly this claim to it.
    pub fn claim(mut self, claim: &PersistentVolumeClaim) -> Self {
        let meta = &claim.metadata;
        self.spec().claim_ref = Some(ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("PersistentVolumeClaim".to_string()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            ..ObjectReference::default()
        });
        self
    }

    pub fn build(self) -> PersistentVolume {
        self.pv
    }
}
