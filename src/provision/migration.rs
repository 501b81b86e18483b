//! CSI migration: claims of an in-tree plugin's StorageClass
//! (`kubernetes.io/aws-ebs`, …) served by the CSI driver that plugin was
//! migrated to, as upstream does through csi-translation-lib. The class is
//! translated to the CSI driver's terms before the request is built, the PV
//! is saved in the in-tree form, and such a PV is translated back to its CSI
//! volume handle for `DeleteVolume`.
//!
//! Every plugin csi-translation-lib translates is translated here too: AWS
//! EBS, GCE PD, Azure Disk, Azure File, Cinder, vSphere, Portworx and RBD.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume,
    TopologySelectorLabelRequirement, TopologySelectorTerm,
};
use k8s_openapi::api::storage::v1::StorageClass;

mod topology;

const AWS_EBS: &str = "kubernetes.io/aws-ebs";
const GCE_PD: &str = "kubernetes.io/gce-pd";
const CINDER: &str = "kubernetes.io/cinder";
const PORTWORX: &str = "kubernetes.io/portworx-volume";
const AZURE_DISK: &str = "kubernetes.io/azure-disk";
const AZURE_FILE: &str = "kubernetes.io/azure-file";
const VSPHERE: &str = "kubernetes.io/vsphere-volume";
const RBD: &str = "kubernetes.io/rbd";
/// PV annotation: the RBD CSI driver's handle of a migrated RBD volume.
pub const ANN_RBD_VOLUME_HANDLE: &str = "rbd.csi.ceph.com/volume-handle";
/// PV annotation: the resource group of a migrated Azure File share.
pub const ANN_AZURE_FILE_RESOURCE_GROUP: &str = "kubernetes.io/azure-file-resource-group";

/// In-tree plugin → the CSI driver it was migrated to (csi-translation-lib's table).
const PLUGINS: &[(&str, &str)] = &[
    (AWS_EBS, "ebs.csi.aws.com"),
    (GCE_PD, "pd.csi.storage.gke.io"),
    (AZURE_DISK, "disk.csi.azure.com"),
    (AZURE_FILE, "file.csi.azure.com"),
    (CINDER, "cinder.csi.openstack.org"),
    (VSPHERE, "csi.vsphere.vmware.com"),
    (PORTWORX, "pxd.portworx.com"),
    (RBD, "rbd.csi.ceph.com"),
];

/// The legacy and the GA zone label a class's topology or a PV may name.
const ZONE_LABELS: [&str; 2] = [
    "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/zone",
];
const FSTYPE_KEY: &str = "csi.storage.k8s.io/fstype";

/// The in-tree plugin migrated to the CSI driver `driver`, if any.
pub fn in_tree_plugin(driver: &str) -> Option<&'static str> {
    PLUGINS
        .iter()
        .find(|(_, csi)| *csi == driver)
        .map(|(plugin, _)| *plugin)
}

/// Whether `class` is a class of the in-tree plugin migrated to `driver`.
pub fn is_migrated_class(class: &StorageClass, driver: &str) -> bool {
    in_tree_plugin(driver) == Some(class.provisioner.as_str())
}

const EBS_ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";
const GKE_ZONE_KEY: &str = "topology.gke.io/zone";
const CINDER_ZONE_KEY: &str = "topology.cinder.csi.openstack.org/zone";
const VSPHERE_ZONE_KEY: &str = "topology.csi.vmware.com/zone";
const VSPHERE_REGION_KEY: &str = "topology.csi.vmware.com/region";

/// The zonal topology key of the CSI driver a plugin migrated to.
fn topology_key(plugin: &str) -> Option<&'static str> {
    match plugin {
        AWS_EBS => Some(EBS_ZONE_KEY),
        GCE_PD => Some(GKE_ZONE_KEY),
        CINDER => Some(CINDER_ZONE_KEY),
        AZURE_DISK => Some("topology.disk.csi.azure.com/zone"),
        VSPHERE => Some(VSPHERE_ZONE_KEY),
        _ => None,
    }
}

/// `class` (of the in-tree plugin migrated to our driver) in the CSI
/// driver's terms: `fsType` becomes the CSI fstype key, `zone`/`zones`
/// become allowed topologies of the driver's zone key (not both with
/// allowed topologies), zone labels in allowed topologies become that key.
/// The provisioner stays the in-tree name (the PV's `provisioned-by`).
pub fn translate_class(class: &StorageClass) -> Result<StorageClass, String> {
    let plugin = class.provisioner.as_str();
    if plugin == PORTWORX || plugin == AZURE_FILE {
        // These drivers take the in-tree parameters as they are.
        return Ok(class.clone());
    }
    if plugin == RBD {
        return rbd_class(class);
    }
    let key = topology_key(plugin).ok_or_else(|| {
        format!("translating a StorageClass of in-tree plugin {plugin} is not supported yet")
    })?;
    if plugin == VSPHERE {
        return vsphere_class(class, key);
    }
    // Cinder's driver understands `availability` itself: not a topology.
    let zones_are_topology = plugin != CINDER;
    // Azure Disk's driver takes `fsType` under its own name.
    let fstype_is_csi = plugin != AZURE_DISK;
    let mut parameters = BTreeMap::new();
    let mut generated: Option<Vec<String>> = None;
    for (k, v) in class.parameters.iter().flatten() {
        match k.to_lowercase().as_str() {
            "fstype" if fstype_is_csi => {
                parameters.insert(FSTYPE_KEY.to_string(), v.clone());
            }
            "zone" if zones_are_topology => generated = Some(vec![v.clone()]),
            "zones" if zones_are_topology => {
                generated = Some(v.split(',').map(str::to_string).collect())
            }
            _ => {
                parameters.insert(k.clone(), v.clone());
            }
        }
    }
    let allowed = class.allowed_topologies.as_deref().unwrap_or_default();
    let mut translated = class.clone();
    translated.parameters = Some(parameters);
    translated.allowed_topologies = match (generated, allowed.is_empty()) {
        (Some(_), false) => {
            return Err(
                "cannot simultaneously set allowed topologies and zone/zones parameters".into(),
            );
        }
        (Some(zones), true) => Some(vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: key.to_string(),
                values: zones,
            }]),
        }]),
        (None, true) => class.allowed_topologies.clone(),
        (None, false) => Some(
            allowed
                .iter()
                .map(|term| TopologySelectorTerm {
                    match_label_expressions: term.match_label_expressions.as_ref().map(|exprs| {
                        exprs
                            .iter()
                            .map(|e| TopologySelectorLabelRequirement {
                                key: if ZONE_LABELS.contains(&e.key.as_str()) {
                                    key.to_string()
                                } else {
                                    e.key.clone()
                                },
                                values: e.values.clone(),
                            })
                            .collect()
                    }),
                })
                .collect(),
        ),
    };
    Ok(translated)
}

/// The hex MD5 of the monitors: the cluster id the RBD driver knows them by.
fn cluster_id(monitors: &str) -> String {
    use md5::{Digest, Md5};
    Md5::digest(monitors.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// RBD: defaults first (migration, pool `rbd`, secret namespaces `default`),
/// then the in-tree parameters under the RBD driver's names; the admin
/// secret becomes the provisioner, node-stage and controller-expand secret;
/// the monitors name the cluster.
fn rbd_class(class: &StorageClass) -> Result<StorageClass, String> {
    const SECRET_KINDS: [&str; 3] = ["provisioner", "node-stage", "controller-expand"];
    let mut p: BTreeMap<String, String> = BTreeMap::new();
    p.insert("migration".into(), "true".into());
    p.insert("pool".into(), "rbd".into());
    for kind in SECRET_KINDS {
        p.insert(
            format!("csi.storage.k8s.io/{kind}-secret-namespace"),
            "default".into(),
        );
    }
    for (k, v) in class.parameters.iter().flatten() {
        match k.to_lowercase().as_str() {
            "fstype" => {
                p.insert(FSTYPE_KEY.into(), v.clone());
            }
            "imagefeatures" => {
                p.insert("imageFeatures".into(), v.clone());
            }
            "pool" => {
                p.insert("pool".into(), v.clone());
            }
            "imageformat" => {
                p.insert("imageFormat".into(), v.clone());
            }
            "adminid" => {
                p.insert("adminId".into(), v.clone());
            }
            "adminsecretname" => {
                for kind in SECRET_KINDS {
                    p.insert(format!("csi.storage.k8s.io/{kind}-secret-name"), v.clone());
                }
            }
            "adminsecretnamespace" => {
                for kind in SECRET_KINDS {
                    p.insert(
                        format!("csi.storage.k8s.io/{kind}-secret-namespace"),
                        v.clone(),
                    );
                }
            }
            "monitors" => {
                p.insert("monitors".into(), v.clone());
                p.insert("clusterID".into(), cluster_id(v));
            }
            _ => {}
        }
    }
    let present = |k: &str| p.get(k).is_some_and(|v| !v.is_empty());
    if !present("csi.storage.k8s.io/provisioner-secret-name") {
        return Err("missing Ceph admin secret name".into());
    }
    if !present("monitors") {
        return Err("missing Ceph monitors".into());
    }
    let mut translated = class.clone();
    translated.parameters = Some(p);
    Ok(translated)
}

/// vSphere: the parameters the vSphere driver knows under their migration
/// names, the others dropped, `csimigration=true` so that the driver reports
/// the volume's file path, allowed topologies under the driver's zone key.
fn vsphere_class(class: &StorageClass, key: &str) -> Result<StorageClass, String> {
    let mut parameters = BTreeMap::new();
    for (k, v) in class.parameters.iter().flatten() {
        let lower = k.to_lowercase();
        let name = match lower.as_str() {
            "fstype" => FSTYPE_KEY.to_string(),
            "storagepolicyname" => lower.clone(),
            "datastore"
            | "diskformat"
            | "hostfailurestotolerate"
            | "forceprovisioning"
            | "cachereservation"
            | "diskstripes"
            | "objectspacereservation"
            | "iopslimit" => {
                format!("{lower}-migrationparam")
            }
            _ => continue,
        };
        parameters.insert(name, v.clone());
    }
    parameters.insert("csimigration".into(), "true".into());
    let mut translated = class.clone();
    translated.parameters = Some(parameters);
    translated.allowed_topologies = class.allowed_topologies.as_ref().map(|terms| {
        terms
            .iter()
            .map(|term| TopologySelectorTerm {
                match_label_expressions: term.match_label_expressions.as_ref().map(|exprs| {
                    exprs
                        .iter()
                        .map(|e| TopologySelectorLabelRequirement {
                            key: if ZONE_LABELS.contains(&e.key.as_str()) {
                                key.to_string()
                            } else {
                                e.key.clone()
                            },
                            values: e.values.clone(),
                        })
                        .collect()
                }),
            })
            .collect()
    });
    Ok(translated)
}

/// Turns the CSI PV built for a migrated class into the in-tree plugin's
/// PV source, as csi-translation-lib does (the node affinity stays as the
/// driver reported it).
pub fn pv_to_in_tree(plugin: &str, pv: &mut PersistentVolume) -> Result<(), String> {
    let spec = pv.spec.get_or_insert_with(Default::default);
    let csi = spec
        .csi
        .take()
        .ok_or_else(|| "pv is nil or CSI source not defined on pv".to_string())?;
    let partition = |attrs: &Option<BTreeMap<String, String>>| -> Result<Option<i32>, String> {
        match attrs.as_ref().and_then(|a| a.get("partition")) {
            None => Ok(None),
            Some(p) if p.is_empty() => Ok(None),
            Some(p) => p
                .parse::<i32>()
                .map(Some)
                .map_err(|e| format!("failed to convert partition {p} to integer: {e}")),
        }
    };
    match plugin {
        AWS_EBS => {
            spec.aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                volume_id: csi.volume_handle.clone(),
                fs_type: csi.fs_type.clone(),
                read_only: csi.read_only,
                partition: partition(&csi.volume_attributes)?,
            });
        }
        GCE_PD => {
            spec.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                pd_name: pd_name(&csi.volume_handle)?.to_string(),
                fs_type: csi.fs_type.clone(),
                read_only: csi.read_only,
                partition: partition(&csi.volume_attributes)?,
            });
        }
        CINDER => {
            spec.cinder = Some(k8s_openapi::api::core::v1::CinderPersistentVolumeSource {
                volume_id: csi.volume_handle.clone(),
                fs_type: csi.fs_type.clone(),
                read_only: csi.read_only,
                secret_ref: None,
            });
        }
        AZURE_DISK => {
            let attrs = csi.volume_attributes.clone().unwrap_or_default();
            let non_empty = |k: &str| attrs.get(k).filter(|v| !v.is_empty()).cloned();
            spec.azure_disk = Some(k8s_openapi::api::core::v1::AzureDiskVolumeSource {
                disk_name: azure_disk_name(&csi.volume_handle)?.to_string(),
                disk_uri: csi.volume_handle.clone(),
                fs_type: non_empty("fsType")
                    .or_else(|| Some(csi.fs_type.clone().unwrap_or_default())),
                read_only: Some(csi.read_only.unwrap_or_default()),
                kind: non_empty("kind").or_else(|| Some("Managed".into())),
                caching_mode: attrs.get("cachingMode").cloned(),
            });
        }
        AZURE_FILE => {
            let mut share = String::new();
            let mut secret = String::new();
            let mut secret_namespace = None;
            for (k, v) in csi.volume_attributes.iter().flatten() {
                match k.to_lowercase().as_str() {
                    "sharename" => share = v.clone(),
                    "secretname" => secret = v.clone(),
                    "secretnamespace" => secret_namespace = Some(v.clone()),
                    _ => {}
                }
            }
            if let Some(r) = csi
                .node_stage_secret_ref
                .as_ref()
                .filter(|r| r.name.as_deref().is_some_and(|n| !n.is_empty()))
            {
                secret = r.name.clone().unwrap_or_default();
                secret_namespace = Some(r.namespace.clone().unwrap_or_default());
            }
            if share.is_empty() || secret.is_empty() {
                let parts: Vec<&str> = csi.volume_handle.split('#').collect();
                if parts.len() < 3 {
                    spec.csi = Some(csi.clone());
                    return Err(format!(
                        "error parsing volume id: {:?}, should at least contain two #",
                        csi.volume_handle
                    ));
                }
                if share.is_empty() {
                    share = parts[2].to_string();
                }
                if secret.is_empty() {
                    secret = format!("azure-storage-account-{}-secret", parts[1]);
                }
                if !parts[0].is_empty() {
                    pv.metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(ANN_AZURE_FILE_RESOURCE_GROUP.into(), parts[0].into());
                }
            }
            spec.azure_file = Some(
                k8s_openapi::api::core::v1::AzureFilePersistentVolumeSource {
                    read_only: csi.read_only,
                    share_name: share,
                    secret_name: secret,
                    secret_namespace: Some(secret_namespace.unwrap_or_else(|| "default".into())),
                },
            );
        }
        VSPHERE => {
            spec.vsphere_volume =
                Some(k8s_openapi::api::core::v1::VsphereVirtualDiskVolumeSource {
                    volume_path: csi
                        .volume_attributes
                        .as_ref()
                        .and_then(|a| a.get("initialvolumefilepath"))
                        .cloned()
                        .unwrap_or_default(),
                    fs_type: csi.fs_type.clone(),
                    ..Default::default()
                });
        }
        RBD => {
            let attrs = csi.volume_attributes.clone().unwrap_or_default();
            let attr = |k: &str| attrs.get(k).cloned().unwrap_or_default();
            let user = Some(attr("adminId")).filter(|u| !u.is_empty());
            spec.rbd = Some(k8s_openapi::api::core::v1::RBDPersistentVolumeSource {
                monitors: vec![String::new()],
                image: attr("imageName"),
                fs_type: csi.fs_type.clone(),
                pool: Some(attr("pool")),
                user: Some(user.unwrap_or_else(|| "admin".into())),
                read_only: csi.read_only,
                secret_ref: csi.node_stage_secret_ref.as_ref().map(|s| {
                    k8s_openapi::api::core::v1::SecretReference {
                        name: s.name.clone(),
                        namespace: s.namespace.clone(),
                    }
                }),
                ..Default::default()
            });
            let annotations = pv.metadata.annotations.get_or_insert_with(Default::default);
            annotations.insert(ANN_RBD_VOLUME_HANDLE.into(), csi.volume_handle.clone());
            for key in ["clusterID", "journalPool", "imageFeatures", "imageFormat"] {
                annotations.insert(key.into(), attr(key));
            }
        }
        PORTWORX => {
            spec.portworx_volume = Some(k8s_openapi::api::core::v1::PortworxVolumeSource {
                volume_id: csi.volume_handle.clone(),
                fs_type: csi.fs_type.clone(),
                read_only: csi.read_only,
            });
        }
        other => {
            spec.csi = Some(csi);
            return Err(format!(
                "translating a PV to in-tree plugin {other} is not supported yet"
            ));
        }
    }
    // The driver's topology back in the Kubernetes zone/region labels (node
    // affinity and PV labels), for a rollback to the in-tree plugin.
    let translated = match plugin {
        AWS_EBS => topology::to_in_tree(pv, EBS_ZONE_KEY, Some(topology::aws_region)),
        GCE_PD => topology::to_in_tree(pv, GKE_ZONE_KEY, Some(topology::gce_region)),
        CINDER => topology::to_in_tree(pv, CINDER_ZONE_KEY, None),
        VSPHERE => {
            topology::vsphere_to_in_tree(pv, VSPHERE_ZONE_KEY, VSPHERE_REGION_KEY);
            Ok(())
        }
        _ => Ok(()),
    };
    translated.map_err(|e| format!("failed to translate topology: {e}"))
}

/// An Azure disk URI's disk name: after the last `/providers/Microsoft.Compute/disks/`
/// of a managed disk's resource id, after the last `/vhds/` of an unmanaged
/// disk's blob URL.
fn azure_disk_name(uri: &str) -> Result<&str, String> {
    let unmanaged = uri.len() > 4 && uri[..4].eq_ignore_ascii_case("http");
    let (shape, marker, format) = if unmanaged {
        (
            uri.starts_with("http") && uri.contains("://"),
            "/vhds/",
            "http(?:.*)://(?:.*)/vhds/(.+)",
        )
    } else {
        let subscriptions = uri.find("/subscriptions/");
        let groups = uri.rfind("/resourceGroups/");
        (
            matches!((subscriptions, groups), (Some(s), Some(g)) if s < g),
            "/providers/Microsoft.Compute/disks/",
            ".*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)",
        )
    };
    match uri.rfind(marker) {
        Some(at) if shape && at + marker.len() < uri.len() => Ok(&uri[at + marker.len()..]),
        _ => Err(format!(
            "could not get disk name from {uri}, correct format: {format}"
        )),
    }
}

/// A GCE PD volume handle's disk name (`projects/P/zones/Z/disks/NAME`).
fn pd_name(handle: &str) -> Result<&str, String> {
    let parts: Vec<&str> = handle.split('/').collect();
    if parts.len() < 6 {
        return Err(format!(
            "failed to get id components.Got: {}, wanted 6 components or more. ",
            parts.len()
        ));
    }
    Ok(parts[5])
}

/// The CSI volume handle of an in-tree PV source of a migrated plugin, for
/// `DeleteVolume`: `None` when the PV has no such source.
pub fn in_tree_handle(
    aws: Option<&str>,
    gce: Option<(&str, Option<&str>)>,
    plain: Option<&str>,
) -> Option<Result<String, String>> {
    if let Some(volume_id) = aws {
        return Some(ebs_volume_id(volume_id));
    }
    // Cinder and Portworx: the in-tree volume id is the CSI handle.
    if let Some(volume_id) = plain {
        return Some(Ok(volume_id.to_string()));
    }
    gce.map(|(pd_name, zone_label)| {
        // The zone of a zonal disk from the PV's legacy zone label, as
        // csi-translation-lib reads it; several zones are a regional disk.
        let zones: Vec<&str> = zone_label
            .unwrap_or_default()
            .split("__")
            .filter(|z| !z.is_empty())
            .collect();
        let location = match zones.as_slice() {
            [] => "UNSPECIFIED".to_string(),
            [zone] => zone.to_string(),
            many => region_of(many)?,
        };
        Ok(format!(
            "projects/UNSPECIFIED/zones/{location}/disks/{pd_name}"
        ))
    })
}

/// The RBD driver's handle of an in-tree RBD PV: the handle it was created
/// with (annotation), else the migration handle composed from the monitors,
/// the pool and the image.
pub fn rbd_handle(
    annotated: Option<&str>,
    monitors: &[String],
    pool: &str,
    image: &str,
) -> Result<String, String> {
    if let Some(handle) = annotated.filter(|h| !h.is_empty()) {
        return Ok(handle.to_string());
    }
    let image = image
        .split_once("kubernetes-dynamic-pvc-")
        .map(|(_, rest)| rest)
        .ok_or_else(|| format!("RBD image {image:?} was not made by the in-tree provisioner"))?;
    let pool_hex: String = pool.bytes().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "mig_mons-{}_image-{image}_{pool_hex}",
        cluster_id(&monitors.join(","))
    ))
}

/// What an in-tree Azure File PV says, for its CSI handle.
pub struct AzureFileSource<'a> {
    pub pv_name: &'a str,
    pub share_name: &'a str,
    pub secret_name: &'a str,
    pub secret_namespace: Option<&'a str>,
    pub claim_namespace: Option<&'a str>,
    pub resource_group: Option<&'a str>,
}

/// The Azure File driver's volume handle of an in-tree PV:
/// `<resource group>#<account>#<share>#<pv name>#<secret namespace>`.
pub fn azure_file_handle(s: &AzureFileSource) -> Result<String, String> {
    let account = s
        .secret_name
        .strip_prefix("azure-storage-account-")
        .and_then(|rest| rest.strip_suffix("-secret"))
        .filter(|a| !a.is_empty())
        .unwrap_or(s.secret_name);
    let namespace = s
        .secret_namespace
        .or(s.claim_namespace)
        .filter(|n| !n.is_empty())
        .ok_or("could not find a secret namespace in PersistentVolumeSource or ClaimRef")?;
    Ok(format!(
        "{}#{account}#{}#{}#{namespace}",
        s.resource_group.unwrap_or_default(),
        s.share_name,
        s.pv_name
    ))
}

/// `aws://<zone>/<vol-id>`, `aws:///<vol-id>` or a bare `vol-…` → the EBS volume id.
fn ebs_volume_id(kubernetes_id: &str) -> Result<String, String> {
    let Some(rest) = kubernetes_id.strip_prefix("aws://") else {
        return Ok(kubernetes_id.to_string());
    };
    let path = rest.split_once('/').map(|(_, p)| p).unwrap_or_default();
    let id = path.trim_matches('/');
    if id.starts_with("vol-") && !id.contains('/') {
        Ok(id.to_string())
    } else {
        Err(format!("Invalid format for AWS volume ({kubernetes_id})"))
    }
}

/// The one region of zones `locale-region-zone`.
fn region_of(zones: &[&str]) -> Result<String, String> {
    let mut regions: Vec<String> = Vec::new();
    for zone in zones {
        let parts: Vec<&str> = zone.split('-').collect();
        if parts.len() != 3 {
            return Err(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            ));
        }
        let region = parts[..2].join("-");
        if !regions.contains(&region) {
            regions.push(region);
        }
    }
    match regions.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "multiple or no regions gotten from zones, got: {regions:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};

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

    #[test]
    fn in_tree_pvs_give_their_csi_handle_for_deletion() {
        let ok = |r: Option<Result<String, String>>| r.unwrap().unwrap();
        assert_eq!(ok(in_tree_handle(Some("vol-1"), None, None)), "vol-1");
        assert_eq!(
            ok(in_tree_handle(Some("aws://us-east-1a/vol-1"), None, None)),
            "vol-1"
        );
        assert_eq!(
            ok(in_tree_handle(Some("aws:///vol-1"), None, None)),
            "vol-1"
        );
        assert!(
            in_tree_handle(Some("aws://z/disk-1"), None, None)
                .unwrap()
                .is_err()
        );
        assert_eq!(
            ok(in_tree_handle(None, Some(("d", None)), None)),
            "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d"
        );
        assert_eq!(
            ok(in_tree_handle(
                None,
                Some(("d", Some("us-central1-a"))),
                None
            )),
            "projects/UNSPECIFIED/zones/us-central1-a/disks/d"
        );
        assert_eq!(
            ok(in_tree_handle(
                None,
                Some(("d", Some("us-central1-a__us-central1-b"))),
                None
            )),
            "projects/UNSPECIFIED/zones/us-central1/disks/d"
        );
        assert_eq!(
            ok(in_tree_handle(None, None, Some("cinder-id"))),
            "cinder-id"
        );
        assert!(in_tree_handle(None, None, None).is_none());
    }
}
