//! The translation tables of every plugin: classes, PVs to their in-tree form, and
//! in-tree PVs (of either shape) back to their driver's volume handle.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolumeSpec, TopologySelectorLabelRequirement,
    TopologySelectorTerm,
};

use super::azure_disk::disk_name as azure_disk_name;
use super::azure_file::{AzureFileSource, handle as azure_file_handle};
use super::rbd::{cluster_id, handle as rbd_handle};
use super::*;
use crate::keys::{
    self, ANN_AZURE_FILE_RESOURCE_GROUP, ANN_RBD_VOLUME_HANDLE, PARAM_FSTYPE as FSTYPE_KEY,
    PLUGIN_AWS_EBS as AWS_EBS, PLUGIN_AZURE_DISK as AZURE_DISK, PLUGIN_AZURE_FILE as AZURE_FILE,
    PLUGIN_CINDER as CINDER, PLUGIN_GCE_PD as GCE_PD, PLUGIN_PORTWORX as PORTWORX,
    PLUGIN_RBD as RBD, PLUGIN_VSPHERE as VSPHERE,
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
fn classes_are_translated_as_csi_translation_lib_does() {
    let c = translate_class(&class(AWS_EBS, &[("type", "gp2"), ("fsType", "xfs")])).unwrap();
    let params = c.parameters.clone().unwrap();
    assert_eq!(params.get("type").map(String::as_str), Some("gp2"));
    assert_eq!(params.get(FSTYPE_KEY).map(String::as_str), Some("xfs"));
    assert!(!params.contains_key("fsType"));
    assert_eq!(
        c.provisioner, AWS_EBS,
        "provisioned-by stays the in-tree name"
    );

    let c = translate_class(&class(GCE_PD, &[("zones", "us-a-1,us-a-2")])).unwrap();
    assert_eq!(
        topology(&c),
        vec![(
            "topology.gke.io/zone".to_string(),
            vec!["us-a-1".into(), "us-a-2".into()]
        )]
    );
    assert!(!c.parameters.unwrap().contains_key("zones"));

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
    assert!(
        translate_class(&class("kubernetes.io/flocker", &[]))
            .unwrap_err()
            .contains("not supported yet")
    );
    let c = translate_class(&class(
        AZURE_DISK,
        &[("fsType", "xfs"), ("zone", "eastus-1")],
    ))
    .unwrap();
    assert_eq!(
        c.parameters
            .clone()
            .unwrap()
            .get("fsType")
            .map(String::as_str),
        Some("xfs"),
        "the Azure Disk driver's own parameter name"
    );
    assert_eq!(
        topology(&c),
        vec![(
            "topology.disk.csi.azure.com/zone".to_string(),
            vec!["eastus-1".into()]
        )]
    );
    // Cinder keeps `availability` and zones for its driver; Portworx takes it all as is.
    let c = translate_class(&class(
        CINDER,
        &[("availability", "nova"), ("fstype", "ext4")],
    ))
    .unwrap();
    let params = c.parameters.unwrap();
    assert_eq!(params.get("availability").map(String::as_str), Some("nova"));
    assert_eq!(params.get(FSTYPE_KEY).map(String::as_str), Some("ext4"));
    let c = translate_class(&class(
        VSPHERE,
        &[
            ("datastore", "ds1"),
            ("StoragePolicyName", "gold"),
            ("unknown", "x"),
        ],
    ))
    .unwrap();
    let want: BTreeMap<String, String> = [
        ("datastore-migrationparam", "ds1"),
        ("storagepolicyname", "gold"),
        ("csimigration", "true"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(c.parameters.unwrap(), want);
    let c = translate_class(&class(
        RBD,
        &[
            ("monitors", "10.0.0.1:6789"),
            ("adminSecretName", "ceph"),
            ("pool", "kube"),
        ],
    ))
    .unwrap();
    let params = c.parameters.unwrap();
    assert_eq!(params["clusterID"], cluster_id("10.0.0.1:6789"));
    assert_eq!(params["pool"], "kube");
    assert_eq!(params["csi.storage.k8s.io/provisioner-secret-name"], "ceph");
    assert_eq!(
        params["csi.storage.k8s.io/node-stage-secret-namespace"],
        "default"
    );
    assert_eq!(params["migration"], "true");
    assert_eq!(
        translate_class(&class(RBD, &[("monitors", "m")])).unwrap_err(),
        "missing Ceph admin secret name"
    );
    let px = class(PORTWORX, &[("repl", "2")]);
    assert_eq!(translate_class(&px).unwrap(), px);
}

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

#[test]
fn pvs_are_saved_in_their_in_tree_form() {
    let mut pv = csi_pv("vol-0abc", Some("1"));
    pv_to_in_tree(AWS_EBS, &mut pv).unwrap();
    let spec = pv.spec.unwrap();
    assert!(spec.csi.is_none());
    let ebs = spec.aws_elastic_block_store.unwrap();
    assert_eq!(
        (
            ebs.volume_id.as_str(),
            ebs.fs_type.as_deref(),
            ebs.partition
        ),
        ("vol-0abc", Some("ext4"), Some(1))
    );

    let mut pv = csi_pv("projects/p/zones/us-a-1/disks/disk-1", Some(""));
    pv_to_in_tree(GCE_PD, &mut pv).unwrap();
    let gce = pv.spec.unwrap().gce_persistent_disk.unwrap();
    assert_eq!((gce.pd_name.as_str(), gce.partition), ("disk-1", None));

    let mut pv = csi_pv("c-1", None);
    pv_to_in_tree(CINDER, &mut pv).unwrap();
    assert_eq!(pv.spec.unwrap().cinder.unwrap().volume_id, "c-1");
    let mut pv = csi_pv("px-1", None);
    pv_to_in_tree(PORTWORX, &mut pv).unwrap();
    assert_eq!(pv.spec.unwrap().portworx_volume.unwrap().volume_id, "px-1");

    // MD5 as everyone computes it (RFC 1321's test vector).
    assert_eq!(cluster_id("abc"), "900150983cd24fb0d6963f7d28e17f72");
    let mut pv = csi_pv("0001-rbd-handle", None);
    pv.spec
        .as_mut()
        .unwrap()
        .csi
        .as_mut()
        .unwrap()
        .volume_attributes = Some(
        [
            ("imageName", "csi-vol-1"),
            ("pool", "kube"),
            ("clusterID", "c1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    pv_to_in_tree(RBD, &mut pv).unwrap();
    assert_eq!(
        pv.metadata.annotations.as_ref().unwrap()[ANN_RBD_VOLUME_HANDLE],
        "0001-rbd-handle"
    );
    let rbd = pv.spec.unwrap().rbd.unwrap();
    assert_eq!(
        (rbd.image.as_str(), rbd.pool.as_deref(), rbd.user.as_deref()),
        ("csi-vol-1", Some("kube"), Some("admin"))
    );
    assert_eq!(
        rbd_handle(Some("0001-rbd-handle"), &[], "", ""),
        Ok("0001-rbd-handle".to_string())
    );
    assert_eq!(
        rbd_handle(None, &["m1".into()], "rbd", "kubernetes-dynamic-pvc-abc"),
        Ok(format!("mig_mons-{}_image-abc_726264", cluster_id("m1")))
    );

    let mut pv = csi_pv("vsphere-id", None);
    pv.spec
        .as_mut()
        .unwrap()
        .csi
        .as_mut()
        .unwrap()
        .volume_attributes = Some(
        [(
            "initialvolumefilepath".to_string(),
            "[ds1] kubevols/pvc-1.vmdk".to_string(),
        )]
        .into(),
    );
    pv_to_in_tree(VSPHERE, &mut pv).unwrap();
    assert_eq!(
        pv.spec.unwrap().vsphere_volume.unwrap().volume_path,
        "[ds1] kubevols/pvc-1.vmdk"
    );

    let uri = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/pvc-1";
    let mut pv = csi_pv(uri, None);
    pv_to_in_tree(AZURE_DISK, &mut pv).unwrap();
    let azure = pv.spec.unwrap().azure_disk.unwrap();
    assert_eq!(
        (
            azure.disk_name.as_str(),
            azure.disk_uri.as_str(),
            azure.kind.as_deref(),
            azure.fs_type.as_deref(),
            azure.read_only
        ),
        ("pvc-1", uri, Some("Managed"), Some("ext4"), Some(false))
    );
    assert_eq!(
        azure_disk_name("https://acct.blob.core.windows.net/vhds/pvc-2.vhd"),
        Ok("pvc-2.vhd")
    );
    assert!(azure_disk_name("vol-1").is_err());

    let mut pv = csi_pv("rg#acct#share-1#pvc-1#", None);
    pv_to_in_tree(AZURE_FILE, &mut pv).unwrap();
    assert_eq!(
        pv.metadata.annotations.as_ref().unwrap()[ANN_AZURE_FILE_RESOURCE_GROUP],
        "rg"
    );
    let file = pv.spec.unwrap().azure_file.unwrap();
    assert_eq!(
        (
            file.share_name.as_str(),
            file.secret_name.as_str(),
            file.secret_namespace.as_deref()
        ),
        (
            "share-1",
            "azure-storage-account-acct-secret",
            Some("default")
        )
    );
    assert_eq!(
        azure_file_handle(&AzureFileSource {
            pv_name: "pvc-1",
            share_name: "share-1",
            secret_name: "azure-storage-account-acct-secret",
            secret_namespace: None,
            claim_namespace: Some("ns"),
            resource_group: Some("rg"),
        }),
        Ok("rg#acct#share-1#pvc-1#ns".to_string())
    );
    assert!(
        azure_file_handle(&AzureFileSource {
            pv_name: "pvc-1",
            share_name: "s",
            secret_name: "custom",
            secret_namespace: None,
            claim_namespace: None,
            resource_group: None,
        })
        .is_err()
    );

    let mut bad = csi_pv("disk-1", None);
    assert!(pv_to_in_tree(GCE_PD, &mut bad).is_err());
    let mut bad = csi_pv("vol-1", Some("x"));
    assert!(pv_to_in_tree(AWS_EBS, &mut bad).is_err());
}

/// The handle of a PV with `source` and, if any, the legacy zone label `zone`.
fn handle_of(source: Source, zone: Option<&str>) -> Option<Result<String, String>> {
    let labels: Option<BTreeMap<String, String>> =
        zone.map(|z| [(keys::LABEL_ZONE_BETA.to_string(), z.to_string())].into());
    volume_handle(PvSource {
        name: "pv",
        source: Some(source),
        annotations: None,
        labels: labels.as_ref(),
        claim_namespace: None,
    })
}

#[test]
fn in_tree_pvs_give_their_csi_handle_for_deletion() {
    let ok = |r: Option<Result<String, String>>| r.unwrap().unwrap();
    let aws = |volume_id| handle_of(Source::AwsEbs { volume_id }, None);
    let gce = |zone| handle_of(Source::GcePd { pd_name: "d" }, zone);
    assert_eq!(ok(aws("vol-1")), "vol-1");
    assert_eq!(ok(aws("aws://us-east-1a/vol-1")), "vol-1");
    assert_eq!(ok(aws("aws:///vol-1")), "vol-1");
    assert!(aws("aws://z/disk-1").unwrap().is_err());
    assert_eq!(
        ok(gce(None)),
        "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d"
    );
    assert_eq!(
        ok(gce(Some("us-central1-a"))),
        "projects/UNSPECIFIED/zones/us-central1-a/disks/d"
    );
    assert_eq!(
        ok(gce(Some("us-central1-a__us-central1-b"))),
        "projects/UNSPECIFIED/zones/us-central1/disks/d"
    );
    let cinder = Source::Cinder {
        volume_id: "cinder-id",
    };
    assert_eq!(ok(handle_of(cinder, None)), "cinder-id");
    assert!(
        volume_handle(PvSource {
            name: "pv",
            source: None,
            annotations: None,
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
            keys::ANN_AZURE_FILE_RESOURCE_GROUP,
            keys::ANN_RBD_VOLUME_HANDLE,
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
