//! The translation tables of every plugin, one file per plugin (its class, its PV in
//! the in-tree form, its in-tree PV back to its driver's volume handle); here the
//! helpers they share and what holds for every plugin.

mod aws_ebs;
mod azure_disk;
mod azure_file;
mod cinder;
mod gce_pd;
mod portworx;
mod rbd;
mod vsphere;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolumeSpec, TopologySelectorLabelRequirement,
    TopologySelectorTerm,
};

use super::*;
use crate::keys::{
    self, ANN_AZURE_FILE_RESOURCE_GROUP, ANN_RBD_VOLUME_HANDLE, PLUGIN_AWS_EBS as AWS_EBS,
    PLUGIN_GCE_PD as GCE_PD,
};

fn class(provisioner: &str, params: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        provisioner: provisioner.into(),
        parameters: Some(
            params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn topology(class: &StorageClass) -> Vec<(String, Vec<String>)> {
    class
        .allowed_topologies
        .iter()
        .flatten()
        .flat_map(|t| t.match_label_expressions.iter().flatten())
        .map(|e| (e.key.clone(), e.values.clone()))
        .collect()
}

/// A CSI PV of handle `handle`, fsType ext4, with a `partition` attribute if any.
fn csi_pv(handle: &str, partition: Option<&str>) -> PersistentVolume {
    PersistentVolume {
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: "d".into(),
                volume_handle: handle.into(),
                fs_type: Some("ext4".into()),
                volume_attributes: partition
                    .map(|p| [("partition".to_string(), p.to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `csi_pv` with these volume attributes.
fn csi_pv_with(handle: &str, attributes: &[(&str, &str)]) -> PersistentVolume {
    let mut pv = csi_pv(handle, None);
    pv.spec
        .as_mut()
        .unwrap()
        .csi
        .as_mut()
        .unwrap()
        .volume_attributes = Some(
        attributes
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    pv
}

/// The handle of a PV with `source` and, if any, the legacy zone label `zone`.
fn handle_of(source: Source, zone: Option<&str>) -> Option<Result<String, String>> {
    let labels: Option<BTreeMap<String, String>> =
        zone.map(|z| [(keys::LABEL_ZONE_BETA.to_string(), z.to_string())].into());
    volume_handle(PvSource {
        name: "pv",
        source: Some(source),
        annotations: None,
        kept: &[],
        labels: labels.as_ref(),
        claim_namespace: None,
    })
}

#[test]
fn every_plugin_csi_translation_lib_knows_is_recognised() {
    assert_eq!(in_tree_plugin("ebs.csi.aws.com"), Some(AWS_EBS));
    assert_eq!(in_tree_plugin("pd.csi.storage.gke.io"), Some(GCE_PD));
    assert_eq!(
        in_tree_plugin("rbd.csi.ceph.com"),
        Some("kubernetes.io/rbd")
    );
    assert_eq!(in_tree_plugin("hostpath.csi.k8s.io"), None);
    assert!(is_migrated_class(&class(AWS_EBS, &[]), "ebs.csi.aws.com"));
    assert!(!is_migrated_class(&class(GCE_PD, &[]), "ebs.csi.aws.com"));
}

#[test]
fn allowed_topologies_are_translated_and_exclude_zone_parameters() {
    let mut with_topology = class(AWS_EBS, &[]);
    with_topology.allowed_topologies = Some(vec![TopologySelectorTerm {
        match_label_expressions: Some(vec![
            TopologySelectorLabelRequirement {
                key: "topology.kubernetes.io/zone".into(),
                values: vec!["z1".into()],
            },
            TopologySelectorLabelRequirement {
                key: "rack".into(),
                values: vec!["r".into()],
            },
        ]),
    }]);
    assert_eq!(
        topology(&translate_class(&with_topology).unwrap()),
        vec![
            (
                "topology.ebs.csi.aws.com/zone".to_string(),
                vec!["z1".to_string()]
            ),
            ("rack".to_string(), vec!["r".to_string()]),
        ]
    );
    let mut both = with_topology.clone();
    both.parameters = Some([("zone".to_string(), "z2".to_string())].into());
    assert_eq!(
        translate_class(&both).unwrap_err(),
        "cannot simultaneously set allowed topologies and zone/zones parameters"
    );
}

#[test]
fn a_plugin_without_a_translation_is_refused() {
    assert!(
        translate_class(&class("kubernetes.io/flocker", &[]))
            .unwrap_err()
            .contains("not supported yet")
    );
}

#[test]
fn a_pv_without_a_source_names_no_volume() {
    assert!(
        volume_handle(PvSource {
            name: "pv",
            source: None,
            annotations: None,
            kept: &[],
            labels: None,
            claim_namespace: None,
        })
        .is_none()
    );
}

#[test]
fn the_table_has_every_plugin_keys_names_once() {
    let names: Vec<(&str, &str)> = PLUGINS.iter().map(|p| (p.in_tree, p.driver)).collect();
    assert_eq!(names, keys::MIGRATED_PLUGINS);
    for (in_tree, driver) in keys::MIGRATED_PLUGINS {
        assert_eq!(by_in_tree(in_tree).map(|p| p.driver), Some(driver));
        assert_eq!(in_tree_plugin(driver), Some(in_tree));
    }
}

#[test]
fn both_shapes_of_pv_give_the_same_volume() {
    use crate::kube::slim::Pv;
    let cases = [
        (r#""csi": {"driver": "d", "volumeHandle": "h"}"#, ("d", "h")),
        (
            r#""awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-1"}"#,
            (keys::DRIVER_AWS_EBS, "vol-1"),
        ),
        (
            r#""gcePersistentDisk": {"pdName": "disk-1"}"#,
            (
                keys::DRIVER_GCE_PD,
                "projects/UNSPECIFIED/zones/europe-west1-b/disks/disk-1",
            ),
        ),
        (
            r#""azureDisk": {"diskName": "d1", "diskURI": "/subscriptions/s/d1"}"#,
            (keys::DRIVER_AZURE_DISK, "/subscriptions/s/d1"),
        ),
        (
            r#""azureFile": {"shareName": "share", "secretName": "azure-storage-account-acct-secret"}"#,
            (keys::DRIVER_AZURE_FILE, "rg#acct#share#pv-1#ns"),
        ),
        (
            r#""cinder": {"volumeID": "c-1"}"#,
            (keys::DRIVER_CINDER, "c-1"),
        ),
        (
            r#""portworxVolume": {"volumeID": "px-1"}"#,
            (keys::DRIVER_PORTWORX, "px-1"),
        ),
        (
            r#""vsphereVolume": {"volumePath": "[ds1] kubevols/pv-1.vmdk"}"#,
            (keys::DRIVER_VSPHERE, "[ds1] kubevols/pv-1.vmdk"),
        ),
        (
            r#""rbd": {"monitors": ["m1"], "image": "kubernetes-dynamic-pvc-abc"}"#,
            (keys::DRIVER_RBD, "0001-rbd-handle"),
        ),
    ];
    for (source, (driver, handle)) in cases {
        let json = format!(
            r#"{{"metadata": {{"name": "pv-1",
                  "labels": {{"{}": "europe-west1-b", "team": "a"}},
                  "annotations": {{"{}": "rg", "{}": "0001-rbd-handle"}}}},
                "spec": {{{source}, "claimRef": {{"namespace": "ns", "name": "c"}}}}}}"#,
            keys::LABEL_ZONE_BETA,
            ANN_AZURE_FILE_RESOURCE_GROUP,
            ANN_RBD_VOLUME_HANDLE,
        );
        let full: PersistentVolume = serde_json::from_str(&json).unwrap();
        let mut slim: Pv = serde_json::from_str(&json).unwrap();
        // What the cache keeps is enough.
        slim.trim();
        assert_eq!(
            PvSource::from(&slim).source,
            PvSource::from(&full).source,
            "{source}"
        );
        let want = Some((driver, Ok(handle.to_string())));
        assert_eq!(volume_of(&slim), want, "{source}");
        assert_eq!(volume_of(&full), want, "{source}");
    }
}
