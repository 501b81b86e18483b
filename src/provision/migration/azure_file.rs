//! Azure File (`kubernetes.io/azure-file` → `file.csi.azure.com`): the class as it is, the
//! `azureFile` source with its secret, `<group>#<account>#<share>#<pv>#<namespace>` handles.
//! upstream: csi-translation-lib plugins/azure_file.go.

use k8s_openapi::api::core::v1::{
    AzureFilePersistentVolumeSource, CSIPersistentVolumeSource, PersistentVolume,
};

use super::{Plugin, PvSource, Source, class, no_topology, spec};
use crate::keys;

pub(super) const PLUGIN: Plugin = Plugin {
    in_tree: keys::PLUGIN_AZURE_FILE,
    driver: keys::DRIVER_AZURE_FILE,
    translate_class: class::unchanged,
    to_in_tree,
    topology_to_in_tree: no_topology,
    volume_handle,
};

/// The share and secret from the volume attributes (the node-stage secret
/// first), else from the handle, whose resource group becomes an annotation.
fn to_in_tree(csi: CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), String> {
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
            let err = format!(
                "error parsing volume id: {:?}, should at least contain two #",
                csi.volume_handle
            );
            spec(pv).csi = Some(csi);
            return Err(err);
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
                .insert(keys::ANN_AZURE_FILE_RESOURCE_GROUP.into(), parts[0].into());
        }
    }
    spec(pv).azure_file = Some(AzureFilePersistentVolumeSource {
        read_only: csi.read_only,
        share_name: share,
        secret_name: secret,
        secret_namespace: Some(secret_namespace.unwrap_or_else(|| "default".into())),
    });
    Ok(())
}

fn volume_handle(pv: &PvSource) -> Option<Result<String, String>> {
    let Source::AzureFile {
        share_name,
        secret_name,
        secret_namespace,
    } = pv.source?
    else {
        return None;
    };
    Some(handle(&AzureFileSource {
        pv_name: pv.name,
        share_name,
        secret_name,
        secret_namespace,
        claim_namespace: pv.claim_namespace,
        resource_group: pv.annotation(keys::ANN_AZURE_FILE_RESOURCE_GROUP),
    }))
}

/// What an in-tree Azure File PV says, for its CSI handle.
pub(super) struct AzureFileSource<'a> {
    pub pv_name: &'a str,
    pub share_name: &'a str,
    pub secret_name: &'a str,
    pub secret_namespace: Option<&'a str>,
    pub claim_namespace: Option<&'a str>,
    pub resource_group: Option<&'a str>,
}

/// The Azure File driver's volume handle of an in-tree PV:
/// `<resource group>#<account>#<share>#<pv name>#<secret namespace>`.
pub(super) fn handle(s: &AzureFileSource) -> Result<String, String> {
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
