//! What the sidecar keeps of a PersistentVolume. k8s-openapi's type holds every
//! in-tree volume source inline (3.4 KB per PV before a single string), and a
//! cache of every PV in the cluster pays that per object. The volume path
//! decides on a handful of fields, and the cache is only for finding work
//! (DESIGN §2.2), so the cache — and every read or delete answer the volume
//! path gets back — is deserialized into this slim shape: unknown fields are
//! skipped by the parser, never allocated.
//!
//! Never write a `Pv` back with a full-object verb (PUT): it would drop every
//! field it does not know. Creating PVs uses k8s-openapi's type.
//!
//! Both caches (PVs and claims) also parse object metadata without
//! `managedFields`: k8s-openapi would build each entry's field set as a JSON
//! tree, on every watch event, only for us to drop it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use serde::{Deserialize, Deserializer, Serialize};

use crate::keys;

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct Pv {
    #[serde(default, deserialize_with = "meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PvSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PvStatus>,
    /// The annotations a decision reads, once [`Pv::trim`] has moved them
    /// out of `metadata` (never sent, never parsed). Read a PV's annotations
    /// with [`Pv::annotation`], which looks in both places.
    #[serde(skip)]
    pub kept: Kept,
}

/// A cached PV's kept annotations, by their key in [`READ_ANNOTATIONS`]: one
/// allocation of 40 bytes per annotation a PV has (usually one, its
/// provisioner), where the map in `metadata` costs a tree node of ~0.5 KiB
/// even for one entry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Kept(Box<[(&'static str, String)]>);

impl Kept {
    pub fn get(&self, key: &str) -> Option<&str> {
        Kept::find(&self.0, key)
    }

    /// The value of `key` among kept `entries`.
    pub fn find<'a>(entries: &'a [(&'static str, String)], key: &str) -> Option<&'a str> {
        let entry = entries.iter().find(|(k, _)| *k == key);
        entry.map(|(_, v)| v.as_str())
    }

    pub fn entries(&self) -> &[(&'static str, String)] {
        &self.0
    }
}

/// What a cached PV keeps of its spec. A cluster holds many PVs: the fields
/// most PVs lack (the in-tree sources of migrated plugins, the node affinity)
/// are boxed, so that a PV without them costs a pointer each, not their size.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PvSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csi: Option<PvCsi>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_ref: Option<PvClaimRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_reclaim_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Where the volume is accessible: `--node-deployment` deletes only
    /// this node's PVs. Absent for drivers without topology.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<Box<k8s_openapi::api::core::v1::VolumeNodeAffinity>>,
    /// In-tree sources of migrated plugins whose PVs we delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_elastic_block_store: Option<Box<PvAwsEbs>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gce_persistent_disk: Option<Box<PvGcePd>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cinder: Option<Box<PvVolumeId>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub portworx_volume: Option<Box<PvVolumeId>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure_disk: Option<Box<PvAzureDisk>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure_file: Option<Box<PvAzureFile>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsphere_volume: Option<Box<PvVsphere>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbd: Option<Box<PvRbd>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PvRbd {
    #[serde(default)]
    pub monitors: Vec<String>,
    #[serde(default)]
    pub pool: Option<String>,
    #[serde(default)]
    pub image: String,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PvVsphere {
    #[serde(default)]
    pub volume_path: String,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PvAzureFile {
    #[serde(default)]
    pub share_name: String,
    #[serde(default)]
    pub secret_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_namespace: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PvAzureDisk {
    #[serde(rename = "diskURI", default)]
    pub disk_uri: String,
}

/// An in-tree source that names its volume by `volumeID` (Cinder, Portworx).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PvVolumeId {
    #[serde(rename = "volumeID", default)]
    pub volume_id: String,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PvAwsEbs {
    #[serde(rename = "volumeID", default)]
    pub volume_id: String,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PvGcePd {
    #[serde(default)]
    pub pd_name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PvCsi {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub volume_handle: String,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PvClaimRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PvStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

/// Object metadata as the API server sends it, minus `managedFields` (and
/// `selfLink`, gone since Kubernetes 1.24), which the parser skips unbuilt.
fn meta_without_managed_fields<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        #[serde(default)]
        annotations: Option<BTreeMap<String, String>>,
        #[serde(default)]
        creation_timestamp: Option<Time>,
        #[serde(default)]
        deletion_grace_period_seconds: Option<i64>,
        #[serde(default)]
        deletion_timestamp: Option<Time>,
        #[serde(default)]
        finalizers: Option<Vec<String>>,
        #[serde(default)]
        generate_name: Option<String>,
        #[serde(default)]
        generation: Option<i64>,
        #[serde(default)]
        labels: Option<BTreeMap<String, String>>,
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        namespace: Option<String>,
        #[serde(default)]
        owner_references: Option<Vec<OwnerReference>>,
        #[serde(default)]
        resource_version: Option<String>,
        #[serde(default)]
        uid: Option<String>,
    }
    let m = Meta::deserialize(d)?;
    Ok(ObjectMeta {
        annotations: m.annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        generate_name: m.generate_name,
        generation: m.generation,
        labels: m.labels,
        managed_fields: None,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        self_link: None,
        uid: m.uid,
    })
}

/// A claim as the claim cache holds it: k8s-openapi's type, parsed without
/// `managedFields`. Only ever read (claims are written with patches).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Claim(pub PersistentVolumeClaim);

impl<'de> Deserialize<'de> for Claim {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Claim, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default, deserialize_with = "meta_without_managed_fields")]
            metadata: ObjectMeta,
            #[serde(default)]
            spec: Option<PersistentVolumeClaimSpec>,
            #[serde(default)]
            status: Option<PersistentVolumeClaimStatus>,
        }
        let w = Wire::deserialize(d)?;
        Ok(Claim(PersistentVolumeClaim {
            metadata: w.metadata,
            spec: w.spec,
            status: w.status,
        }))
    }
}

/// `kube::Resource` for a cache type that stands in for a k8s-openapi type:
/// the same kind, group, version and plural, its metadata at `$($meta).+`.
macro_rules! resource_as {
    ($ty:ty, $of:ty, $scope:ty, $($meta:tt).+) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(dt: &()) -> Cow<'_, str> {
                <$of>::kind(dt)
            }
            fn group(dt: &()) -> Cow<'_, str> {
                <$of>::group(dt)
            }
            fn version(dt: &()) -> Cow<'_, str> {
                <$of>::version(dt)
            }
            fn api_version(dt: &()) -> Cow<'_, str> {
                <$of>::api_version(dt)
            }
            fn plural(dt: &()) -> Cow<'_, str> {
                <$of>::plural(dt)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.$($meta).+
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.$($meta).+
            }
        }
    };
}

resource_as!(
    Claim,
    PersistentVolumeClaim,
    NamespaceResourceScope,
    0.metadata
);

/// The PV annotations any decision of ours reads; a cached PV keeps only these.
const READ_ANNOTATIONS: [&str; 6] = [
    keys::ANN_RBD_VOLUME_HANDLE,
    keys::ANN_AZURE_FILE_RESOURCE_GROUP,
    keys::ANN_PROVISIONED_BY,
    keys::ANN_MIGRATED_TO,
    keys::ANN_DELETION_SECRET_NAME,
    keys::ANN_DELETION_SECRET_NAMESPACE,
];

impl Pv {
    /// Drops the metadata no decision reads (labels, owners, other
    /// controllers' annotations; managed fields were never parsed), for
    /// objects that are kept in a cache; the annotations read are moved to
    /// [`Pv::kept`].
    pub fn trim(&mut self) {
        let meta = &mut self.metadata;
        // The legacy zone label locates a migrated GCE PD for its deletion.
        if let Some(labels) = meta.labels.as_mut() {
            labels.retain(|k, _| k == keys::LABEL_ZONE_BETA);
        }
        if meta.labels.as_ref().is_some_and(|l| l.is_empty()) {
            meta.labels = None;
        }
        meta.owner_references = None;
        if let Some(ann) = meta.annotations.take() {
            let read = ann.into_iter().filter_map(|(k, v)| {
                let key = READ_ANNOTATIONS.iter().find(|read| **read == k)?;
                Some((*key, v))
            });
            self.kept = Kept(read.collect());
        }
    }

    /// The value of annotation `key`, on a trimmed PV (whose kept
    /// annotations are in [`Pv::kept`]) as on one read whole.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.kept.get(key).or_else(|| {
            let map = self.metadata.annotations.as_ref()?;
            map.get(key).map(String::as_str)
        })
    }

    /// Keeps only the PV's identity and whom it is bound to: what the claim
    /// path reads of a PV that is not our driver's (a PV under a claim's
    /// deterministic name bound to another claim stops that claim before
    /// `CreateVolume`). Without its driver, annotations or source, no
    /// decision takes it for ours.
    pub fn keep_claim_ref_only(&mut self) {
        let meta = std::mem::take(&mut self.metadata);
        self.metadata = ObjectMeta {
            name: meta.name,
            uid: meta.uid,
            resource_version: meta.resource_version,
            ..Default::default()
        };
        self.spec = self.spec.take().map(|s| PvSpec {
            claim_ref: s.claim_ref,
            ..Default::default()
        });
        self.status = None;
        self.kept = Kept::default();
    }
}

resource_as!(Pv, PersistentVolume, ClusterResourceScope, metadata);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    /// A PV as kube-apiserver serves one we provisioned, with the fields the
    /// slim shape skips.
    const PV_JSON: &str = r#"{
      "apiVersion": "v1", "kind": "PersistentVolume",
      "metadata": {
        "name": "pvc-1", "uid": "u-pv", "resourceVersion": "42",
        "labels": {"team": "a"},
        "annotations": {
          "pv.kubernetes.io/provisioned-by": "d",
          "pv.kubernetes.io/bound-by-controller": "yes",
          "volume.kubernetes.io/provisioner-deletion-secret-name": "s",
          "volume.kubernetes.io/provisioner-deletion-secret-namespace": "ns"
        },
        "finalizers": ["kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"],
        "managedFields": [{"manager": "m", "operation": "Update", "apiVersion": "v1"}]
      },
      "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "ns", "name": "c", "uid": "u-c", "apiVersion": "v1", "resourceVersion": "7"},
        "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast",
        "mountOptions": ["ro"],
        "csi": {"driver": "d", "volumeHandle": "h", "fsType": "ext4",
                "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "x"},
                "nodeStageSecretRef": {"name": "n", "namespace": "ns"}},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "z", "operator": "In", "values": ["a"]}]}]}}
      },
      "status": {"phase": "Bound", "lastPhaseTransitionTime": "2026-12-03T00:00:00Z"}
    }"#;

    #[test]
    fn keeps_every_field_a_decision_reads() {
        let pv: Pv = serde_json::from_str(PV_JSON).unwrap();
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-1"));
        assert_eq!(pv.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(pv.metadata.finalizers.as_ref().unwrap().len(), 2);
        let spec = pv.spec.as_ref().unwrap();
        assert_eq!(
            spec.csi,
            Some(PvCsi {
                driver: "d".into(),
                volume_handle: "h".into()
            })
        );
        assert_eq!(
            spec.claim_ref,
            Some(PvClaimRef {
                name: Some("c".into()),
                namespace: Some("ns".into()),
                uid: Some("u-c".into())
            })
        );
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(pv.status.unwrap().phase.as_deref(), Some("Bound"));
        assert_eq!(Pv::kind(&()), "PersistentVolume");
        assert_eq!(Pv::plural(&()), "persistentvolumes");
        assert_eq!(Pv::api_version(&()), "v1");
    }

    #[test]
    fn trim_keeps_only_the_annotations_decisions_read() {
        let mut pv: Pv = serde_json::from_str(PV_JSON).unwrap();
        let whole = pv.clone();
        pv.trim();
        assert!(pv.metadata.annotations.is_none(), "moved out of the map");
        let mut kept: Vec<_> = pv.kept.entries().iter().map(|(k, _)| *k).collect();
        kept.sort();
        assert_eq!(
            kept,
            [
                keys::ANN_PROVISIONED_BY,
                keys::ANN_DELETION_SECRET_NAME,
                keys::ANN_DELETION_SECRET_NAMESPACE
            ]
        );
        for key in kept {
            assert_eq!(pv.annotation(key), whole.annotation(key), "{key}");
            assert!(pv.annotation(key).is_some());
        }
        assert!(pv.metadata.labels.is_none() && pv.metadata.managed_fields.is_none());
        assert_eq!(pv.metadata.finalizers.unwrap().len(), 2, "finalizers stay");
    }

    #[test]
    fn metadata_is_parsed_whole_but_for_managed_fields() {
        let pv: Pv = serde_json::from_str(PV_JSON).unwrap();
        let full: PersistentVolume = serde_json::from_str(PV_JSON).unwrap();
        assert!(
            full.metadata.managed_fields.is_some(),
            "the fixture has some"
        );
        let mut expected = full.metadata;
        expected.managed_fields = None;
        assert_eq!(pv.metadata, expected);
    }

    #[test]
    fn a_claim_is_k8s_openapis_claim_without_managed_fields() {
        let json = r#"{
          "apiVersion": "v1", "kind": "PersistentVolumeClaim",
          "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "9",
            "creationTimestamp": "2026-12-03T00:00:00Z",
            "annotations": {"volume.kubernetes.io/storage-provisioner": "d"},
            "finalizers": ["kubernetes.io/pvc-protection"],
            "managedFields": [{"manager": "m", "operation": "Update", "apiVersion": "v1",
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
          "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                   "resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Filesystem"},
          "status": {"phase": "Pending"}
        }"#;
        let claim: Claim = serde_json::from_str(json).unwrap();
        let mut full: PersistentVolumeClaim = serde_json::from_str(json).unwrap();
        assert!(full.metadata.managed_fields.take().is_some());
        assert_eq!(claim.0, full);
        assert_eq!(Claim::plural(&()), "persistentvolumeclaims");
        assert_eq!(Claim::kind(&()), "PersistentVolumeClaim");
    }

    #[test]
    fn is_much_smaller_than_the_full_type() {
        assert!(
            std::mem::size_of::<Pv>() * 4 < std::mem::size_of::<PersistentVolume>(),
            "{} vs {}",
            std::mem::size_of::<Pv>(),
            std::mem::size_of::<PersistentVolume>()
        );
    }
}
