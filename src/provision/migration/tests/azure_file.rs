//! Azure File (`kubernetes.io/azure-file` ↔ `file.csi.azure.com`).

use super::super::azure_file::{AzureFileSource, handle as azure_file_handle};
use super::super::*;
use super::csi_pv;
use crate::keys::{ANN_AZURE_FILE_RESOURCE_GROUP, PLUGIN_AZURE_FILE as AZURE_FILE};

#[test]
fn its_pv_is_saved_in_the_in_tree_form_with_its_resource_group() {
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
}

#[test]
fn its_in_tree_pv_gives_the_csi_handle() {
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
}
