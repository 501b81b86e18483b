//! AWS EBS (`kubernetes.io/aws-ebs` → `ebs.csi.aws.com`): a zonal class, the
//! `awsElasticBlockStore` source, `aws://<zone>/<id>` volume ids, regions from zones.
//! upstream: csi-translation-lib plugins/aws_ebs.go.

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::class::{self, Zonal};
use super::{Plugin, PvSource, Source, partition, spec, topology};
use crate::keys;

const ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";

pub(super) const PLUGIN: Plugin = Plugin {
    in_tree: keys::PLUGIN_AWS_EBS,
    driver: keys::DRIVER_AWS_EBS,
    translate_class,
    to_in_tree,
    topology_to_in_tree,
    volume_handle,
};

fn translate_class(class: &StorageClass) -> Result<StorageClass, String> {
    let rules = Zonal {
        key: ZONE_KEY,
        zones_are_topology: true,
        fstype_is_csi: true,
    };
    class::zonal(class, &rules)
}

fn to_in_tree(csi: CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), String> {
    spec(pv).aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
        partition: partition(&csi)?,
        volume_id: csi.volume_handle,
        fs_type: csi.fs_type,
        read_only: csi.read_only,
    });
    Ok(())
}

fn topology_to_in_tree(pv: &mut PersistentVolume) -> Result<(), String> {
    topology::to_in_tree(pv, ZONE_KEY, Some(region))
}

fn volume_handle(pv: &PvSource) -> Option<Result<String, String>> {
    match pv.source? {
        Source::AwsEbs { volume_id } => Some(volume_id_of(volume_id)),
        _ => None,
    }
}

/// `aws://<zone>/<vol-id>`, `aws:///<vol-id>` or a bare `vol-…` → the EBS volume id.
fn volume_id_of(kubernetes_id: &str) -> Result<String, String> {
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

/// An AWS zone's region: `us-west-2a`, `us-gov-east-1a` and the local
/// zone form `us-west-2-lax-1a` lose their last letter; a local zone
/// `a-b-c-d-e` or a wavelength zone of seven parts keeps its first three.
pub(super) fn region(zones: &[String]) -> Result<String, String> {
    if zones.is_empty() {
        return Err("no zones specified".into());
    }
    let mut regions: Vec<String> = Vec::new();
    for zone in zones {
        let mut parts: Vec<&str> = zone.split('-').collect();
        let last = parts.last().copied().unwrap_or_default();
        let region = if matches!(parts.len(), 3 | 4) && last.len() == 2 {
            let n = parts.len();
            // The last part is a digit and the zone letter.
            parts[n - 1] = &last[..1];
            parts.join("-")
        } else if matches!(parts.len(), 5 | 7) {
            parts[..3].join("-")
        } else {
            return Err(format!(
                "Unexpected zone format: {zone} is not a valid AWS zone"
            ));
        };
        if !regions.contains(&region) {
            regions.push(region);
        }
    }
    topology::one_region(regions)
}
