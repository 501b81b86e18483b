//! The driver's answer → the PersistentVolume we save.
//! upstream: pkg/controller/controller.go Provision (PV construction) and the
//! lib's claimRef/finalizer/provisioned-by additions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
    SecretReference, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{ClaimView, DriverInfo, Plan, ProvisionError, ProvisionOptions, SecretKind, quantity};
use crate::csi::pb;
use crate::keys;
use crate::names::{AccessMode, ReclaimPolicy, VolumeMode};

pub fn build_pv(
    plan: &Plan,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    response: &pb::CreateVolumeResponse,
    driver: &DriverInfo,
    opts: &ProvisionOptions,
) -> Result<PersistentVolume, ProvisionError> {
    let volume = response
        .volume
        .as_ref()
        .filter(|v| !v.volume_id.is_empty())
        .ok_or(ProvisionError::EmptyVolumeId)?;
    let bytes = checked_capacity(plan, volume)?;
    let access_modes = ClaimView(claim).access_modes();
    let read_only = opts.controller_publish_readonly
        && access_modes.len() == 1
        && AccessMode::parse(&access_modes[0]) == Some(AccessMode::ReadOnlyMany);
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(plan.pv_name.clone()),
            labels: copied_labels(claim, &opts.metadata.copy_pvc_labels),
            annotations: Some(annotations(plan, class)),
            finalizers: Some(vec![keys::FINALIZER_PV.to_string()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(access_modes),
            capacity: Some(
                [(
                    "storage".to_string(),
                    Quantity(quantity::format_bytes(bytes)),
                )]
                .into(),
            ),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                name: claim.metadata.name.clone(),
                namespace: claim.metadata.namespace.clone(),
                uid: claim.metadata.uid.clone(),
                resource_version: claim.metadata.resource_version.clone(),
                ..Default::default()
            }),
            csi: Some(csi_source(plan, volume, driver, read_only)),
            persistent_volume_reclaim_policy: Some(
                class
                    .reclaim_policy
                    .clone()
                    .unwrap_or_else(|| ReclaimPolicy::Delete.to_string()),
            ),
            storage_class_name: ClaimView(claim).class().map(str::to_string),
            volume_mode: Some(
                if plan.block {
                    VolumeMode::Block
                } else {
                    VolumeMode::Filesystem
                }
                .to_string(),
            ),
            mount_options: class.mount_options.clone().filter(|m| !m.is_empty()),
            node_affinity: node_affinity(&volume.accessible_topology),
            volume_attributes_class_name: ClaimView(claim).vac_name(opts).map(str::to_string),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The size the PV records: what the driver reports (0: what was asked).
/// A volume smaller than asked, or one made from a source without the driver
/// saying so, breaks the driver's contract (upstream refuses both).
fn checked_capacity(plan: &Plan, volume: &pb::Volume) -> Result<i64, ProvisionError> {
    let bytes = if volume.capacity_bytes == 0 {
        plan.requested_bytes
    } else {
        volume.capacity_bytes
    };
    if bytes < plan.requested_bytes {
        return Err(ProvisionError::VolumeTooSmall {
            got: bytes,
            want: plan.requested_bytes,
        });
    }
    let from_source = plan.snapshot.is_some() || plan.clone.is_some();
    if from_source && volume.content_source.is_none() {
        return Err(ProvisionError::ContentSourceMissing);
    }
    Ok(bytes)
}

/// The claim's labels whose keys are listed (`--copy-pvc-labels`), for its
/// PV; none when none is listed or the claim has none of them.
fn copied_labels(
    claim: &PersistentVolumeClaim,
    keys: &[String],
) -> Option<BTreeMap<String, String>> {
    let labels = claim.metadata.labels.as_ref()?;
    let copied: BTreeMap<String, String> = keys
        .iter()
        .filter_map(|k| labels.get_key_value(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!copied.is_empty()).then_some(copied)
}

/// Who provisioned the PV, and the secrets deletion and modification need.
fn annotations(plan: &Plan, class: &StorageClass) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::new();
    annotations.insert(
        keys::ANN_PROVISIONED_BY.to_string(),
        class.provisioner.clone(),
    );
    // Always written (empty when the class names no provisioner secret), so
    // deletion never has to consult a StorageClass that may be gone.
    let (del_name, del_ns) = plan
        .provisioner_secret()
        .map(|r| (r.name.clone(), r.namespace.clone()))
        .unwrap_or_default();
    annotations.insert(keys::ANN_DELETION_SECRET_NAME.into(), del_name);
    annotations.insert(keys::ANN_DELETION_SECRET_NAMESPACE.into(), del_ns);
    if let Some(r) = plan.secret_refs.get(&SecretKind::ControllerModify) {
        annotations.insert(keys::ANN_MODIFY_SECRET_NAME.into(), r.name.clone());
        annotations.insert(
            keys::ANN_MODIFY_SECRET_NAMESPACE.into(),
            r.namespace.clone(),
        );
    }
    annotations
}

/// The PV's CSI source: the driver's volume, its context with our identity,
/// the fsType and the secret references of the other sidecars.
fn csi_source(
    plan: &Plan,
    volume: &pb::Volume,
    driver: &DriverInfo,
    read_only: bool,
) -> CSIPersistentVolumeSource {
    let mut attributes: BTreeMap<String, String> = volume
        .volume_context
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    attributes.insert(
        keys::ATTR_PROVISIONER_IDENTITY.into(),
        driver.identity.clone(),
    );
    let secret = |kind| {
        plan.secret_refs
            .get(&kind)
            .map(|r: &super::SecretRef| SecretReference {
                name: Some(r.name.clone()),
                namespace: Some(r.namespace.clone()),
            })
    };
    CSIPersistentVolumeSource {
        driver: driver.name.clone(),
        volume_handle: volume.volume_id.clone(),
        fs_type: (!plan.fs_type.is_empty()).then(|| plan.fs_type.clone()),
        volume_attributes: Some(attributes),
        read_only: read_only.then_some(true),
        controller_publish_secret_ref: secret(SecretKind::ControllerPublish),
        node_stage_secret_ref: secret(SecretKind::NodeStage),
        node_publish_secret_ref: secret(SecretKind::NodePublish),
        controller_expand_secret_ref: secret(SecretKind::ControllerExpand),
        node_expand_secret_ref: secret(SecretKind::NodeExpand),
    }
}

/// One required node-selector term per accessible topology segment.
fn node_affinity(topologies: &[pb::Topology]) -> Option<VolumeNodeAffinity> {
    let terms: Vec<NodeSelectorTerm> = topologies
        .iter()
        .filter(|t| !t.segments.is_empty())
        .map(|t| {
            let mut segs: Vec<_> = t.segments.iter().collect();
            segs.sort();
            NodeSelectorTerm {
                match_expressions: Some(
                    segs.into_iter()
                        .map(|(k, v)| NodeSelectorRequirement {
                            key: k.clone(),
                            operator: "In".into(),
                            values: Some(vec![v.clone()]),
                        })
                        .collect(),
                ),
                ..Default::default()
            }
        })
        .collect();
    (!terms.is_empty()).then_some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::plan;
    use crate::provision::request::tests::{claim, class, driver};

    fn response(id: &str, bytes: i64) -> pb::CreateVolumeResponse {
        pb::CreateVolumeResponse {
            volume: Some(pb::Volume {
                volume_id: id.into(),
                capacity_bytes: bytes,
                volume_context: [("k".to_string(), "v".to_string())].into(),
                accessible_topology: vec![pb::Topology {
                    segments: [("zone".to_string(), "a".to_string())].into(),
                }],
                ..Default::default()
            }),
        }
    }

    #[test]
    fn pv_carries_everything_upstream_writes() {
        let sc = class(&[
            ("csi.storage.k8s.io/fstype", "ext4"),
            ("csi.storage.k8s.io/provisioner-secret-name", "p"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "ns"),
            ("csi.storage.k8s.io/node-publish-secret-name", "np"),
            ("csi.storage.k8s.io/node-publish-secret-namespace", "ns"),
        ]);
        let c = claim();
        let p = plan(&c, &sc, &driver(), &Default::default()).unwrap();
        let pv = build_pv(
            &p,
            &c,
            &sc,
            &response("vol-1", 2 << 30),
            &driver(),
            &Default::default(),
        )
        .unwrap();
        assert_eq!(pv.metadata.name.as_deref(), Some(p.pv_name.as_str()));
        let ann = pv.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[keys::ANN_PROVISIONED_BY], "test.csi.example.com");
        assert_eq!(ann[keys::ANN_DELETION_SECRET_NAME], "p");
        assert_eq!(ann[keys::ANN_DELETION_SECRET_NAMESPACE], "ns");
        assert_eq!(
            pv.metadata.finalizers.as_deref(),
            Some(&[keys::FINALIZER_PV.to_string()][..])
        );
        let spec = pv.spec.unwrap();
        assert_eq!(spec.capacity.unwrap()["storage"].0, "2Gi");
        let cref = spec.claim_ref.unwrap();
        assert_eq!(cref.uid, c.metadata.uid);
        assert_eq!(cref.name.as_deref(), Some("data"));
        assert_eq!(cref.namespace.as_deref(), Some("team-a"));
        let csi = spec.csi.unwrap();
        assert_eq!(csi.driver, "test.csi.example.com");
        assert_eq!(csi.volume_handle, "vol-1");
        assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
        let attrs = csi.volume_attributes.unwrap();
        assert_eq!(attrs["k"], "v");
        assert_eq!(attrs[keys::ATTR_PROVISIONER_IDENTITY], driver().identity);
        assert_eq!(
            csi.node_publish_secret_ref.unwrap().name.as_deref(),
            Some("np")
        );
        assert!(csi.controller_publish_secret_ref.is_none());
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
        let terms = spec
            .node_affinity
            .unwrap()
            .required
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        assert_eq!(terms[0].match_expressions.as_ref().unwrap()[0].key, "zone");
    }

    #[test]
    fn only_listed_claim_labels_are_copied_onto_the_pv() {
        let mut c = claim();
        c.metadata.labels = Some(
            [("team", "a"), ("cost-center", "42"), ("app", "db")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
        );
        let sc = class(&[]);
        let p = plan(&c, &sc, &driver(), &Default::default()).unwrap();
        let with = |keys: &[&str]| {
            let mut opts = ProvisionOptions::default();
            opts.metadata.copy_pvc_labels = keys.iter().map(|k| k.to_string()).collect();
            build_pv(&p, &c, &sc, &response("vol-1", 1 << 30), &driver(), &opts)
                .unwrap()
                .metadata
                .labels
        };
        assert_eq!(with(&[]), None, "nothing by default");
        assert_eq!(with(&["missing"]), None);
        assert_eq!(
            with(&["cost-center", "team", "missing"]),
            Some(
                [("cost-center", "42"), ("team", "a")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into()
            )
        );
    }

    #[test]
    fn zero_capacity_means_requested_and_smaller_is_an_error() {
        let (c, sc) = (claim(), class(&[]));
        let p = plan(&c, &sc, &driver(), &Default::default()).unwrap();
        let pv = build_pv(
            &p,
            &c,
            &sc,
            &response("v", 0),
            &driver(),
            &Default::default(),
        )
        .unwrap();
        assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "1Gi");
        let err = build_pv(
            &p,
            &c,
            &sc,
            &response("v", 1 << 20),
            &driver(),
            &Default::default(),
        )
        .unwrap_err();
        assert_eq!(
            err,
            ProvisionError::VolumeTooSmall {
                got: 1 << 20,
                want: 1 << 30
            }
        );
        let err = build_pv(
            &p,
            &c,
            &sc,
            &response("", 0),
            &driver(),
            &Default::default(),
        )
        .unwrap_err();
        assert_eq!(err, ProvisionError::EmptyVolumeId);
        let ann = build_pv(
            &p,
            &c,
            &sc,
            &response("v", 0),
            &driver(),
            &Default::default(),
        )
        .unwrap()
        .metadata
        .annotations
        .unwrap();
        assert_eq!(
            ann[keys::ANN_DELETION_SECRET_NAME],
            "",
            "always written, empty without a secret"
        );
    }

    #[test]
    fn a_volume_made_from_a_source_must_say_so() {
        let (c, sc) = (claim(), class(&[]));
        let mut p = plan(&c, &sc, &driver(), &Default::default()).unwrap();
        p.snapshot = Some(crate::provision::snapshot::SnapshotSource {
            namespace: "team-a".into(),
            name: "snap".into(),
        });
        let without = build_pv(
            &p,
            &c,
            &sc,
            &response("v", 0),
            &driver(),
            &Default::default(),
        );
        assert_eq!(without.unwrap_err(), ProvisionError::ContentSourceMissing);
        let mut with = response("v", 0);
        with.volume.as_mut().unwrap().content_source =
            Some(crate::provision::snapshot::from_handle("snap-1".into()));
        assert!(build_pv(&p, &c, &sc, &with, &driver(), &Default::default()).is_ok());
    }

    #[test]
    fn read_only_only_for_a_single_rox_mode() {
        let opts = ProvisionOptions {
            controller_publish_readonly: true,
            ..Default::default()
        };
        let sc = class(&[]);
        let mut c = claim();
        c.spec.as_mut().unwrap().access_modes = Some(vec!["ReadOnlyMany".into()]);
        let p = plan(&c, &sc, &driver(), &opts).unwrap();
        let pv = build_pv(&p, &c, &sc, &response("v", 0), &driver(), &opts).unwrap();
        assert_eq!(pv.spec.unwrap().csi.unwrap().read_only, Some(true));
        let p = plan(&claim(), &sc, &driver(), &opts).unwrap();
        let pv = build_pv(&p, &claim(), &sc, &response("v", 0), &driver(), &opts).unwrap();
        assert_eq!(pv.spec.unwrap().csi.unwrap().read_only, None);
    }

    #[test]
    fn volume_attributes_class_is_copied_when_the_gate_is_on() {
        let sc = class(&[]);
        let mut c = claim();
        c.spec.as_mut().unwrap().volume_attributes_class_name = Some("gold".into());
        let mut d = driver();
        d.capabilities.modify_volume = true;
        let on = ProvisionOptions::default();
        let p = plan(&c, &sc, &d, &on).unwrap();
        let pv = build_pv(&p, &c, &sc, &response("v", 0), &d, &on).unwrap();
        assert_eq!(
            pv.spec.unwrap().volume_attributes_class_name.as_deref(),
            Some("gold")
        );
        let off = ProvisionOptions {
            volume_attributes_class: false,
            ..Default::default()
        };
        let pv = build_pv(&p, &c, &sc, &response("v", 0), &d, &off).unwrap();
        assert_eq!(pv.spec.unwrap().volume_attributes_class_name, None);
        let pv = build_pv(&p, &claim(), &sc, &response("v", 0), &d, &on).unwrap();
        assert_eq!(pv.spec.unwrap().volume_attributes_class_name, None);
    }
}
