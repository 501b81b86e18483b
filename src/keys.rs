//! Every annotation, label, finalizer and parameter key the sidecar reads or
//! writes, and the names of the in-tree plugins migrated to CSI drivers, in one
//! place (the bottom layer: every other module may read it, it reads none).
//! Values match upstream external-provisioner exactly so the two can replace
//! each other on a live cluster.

/// PVC annotation naming the provisioner that should provision it (set by kube-controller-manager).
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Deprecated beta spelling, read when the GA one is absent.
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// PVC/PV annotation: the in-tree volume was migrated to this CSI driver.
pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
/// PVC annotation set by the scheduler for WaitForFirstConsumer claims.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Old alpha spelling of the selected node, read as a fallback.
pub const ANN_ALPHA_SELECTED_NODE: &str = "volume.alpha.kubernetes.io/selected-node";
/// Legacy storage class annotation; takes precedence over `spec.storageClassName`.
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// PV annotation: which provisioner created it (ownership for deletion).
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// PV annotations recording the provisioner secret, so deletion works after the StorageClass is gone.
pub const ANN_DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
pub const ANN_DELETION_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";
/// PV annotations for the controller-modify secret (used by external-resizer).
pub const ANN_MODIFY_SECRET_NAME: &str = "volume.kubernetes.io/controller-modify-secret-name";
pub const ANN_MODIFY_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/controller-modify-secret-namespace";

/// Key in `pv.spec.csi.volumeAttributes` identifying the provisioner instance.
pub const ATTR_PROVISIONER_IDENTITY: &str = "storage.kubernetes.io/csiProvisionerIdentity";

/// PV finalizer held until the backend volume is deleted (upstream's HonorPVReclaimPolicy finalizer).
pub const FINALIZER_PV: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// PVC finalizer: the durable intent to provision (DESIGN §2.5). Added before the
/// first `CreateVolume`, removed once the PV is saved or the abandoned backend
/// volume is deleted. Upstream has no equivalent (its issue #486); see
/// docs/compatibility.md.
pub const FINALIZER_PVC_INTENT: &str = "csi-provisioner.rs/provisioning-intent";
/// Claim label, ours: put on with the intent by deploy/kubernetes/provisioning-intent-policy.yaml
/// (the value is the driver's name) and taken off with it by release-intent-policy.yaml, so that
/// one list of the claims pending for our driver answers a freshness round claim by claim,
/// whatever the number of bound claims (docs/compatibility.md). The sidecar only reads it.
pub const LABEL_PROVISIONING: &str = "csi-provisioner.rs/provisioning";
/// Annotation on a claim deleted during provisioning: the handle of its backend volume,
/// written before that volume is deleted, so that a retried cleanup (after a lost
/// response, a restart or a leader change) deletes it again instead of creating a new
/// volume to learn a handle.
pub const ANN_ABANDONED_HANDLE: &str = "csi-provisioner.rs/abandoned-volume-handle";

/// Parameters with this prefix are for the sidecar and are stripped before `CreateVolume`.
pub const CSI_PARAMETER_PREFIX: &str = "csi.storage.k8s.io/";
pub const PARAM_FSTYPE: &str = "csi.storage.k8s.io/fstype";
/// Deprecated fsType key, matched case-insensitively and passed through to the driver.
pub const PARAM_FSTYPE_LEGACY: &str = "fstype";
/// Keys added to `CreateVolume` parameters with `--extra-create-metadata`.
pub const PARAM_PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
pub const PARAM_PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PARAM_PV_NAME: &str = "csi.storage.k8s.io/pv/name";
/// Prefixes of the `CreateVolume` parameters that carry the values of the
/// listed labels and annotations of the claim's namespace (upstream PR #1531:
/// `--extra-create-metadata-namespace-labels`, `-annotations`) and of the
/// claim itself (ours, the same shape: `--extra-create-metadata-pvc-labels`,
/// `-annotations`); the key follows the prefix.
pub const PARAM_NAMESPACE_LABELS: &str = "csi.storage.k8s.io/namespace/labels/";
pub const PARAM_NAMESPACE_ANNOTATIONS: &str = "csi.storage.k8s.io/namespace/annotations/";
pub const PARAM_PVC_LABELS: &str = "csi.storage.k8s.io/pvc/labels/";
pub const PARAM_PVC_ANNOTATIONS: &str = "csi.storage.k8s.io/pvc/annotations/";
/// CSI's size limits (spec "Size Limits"): a string, and a whole
/// `map<string, string>` such as the parameters, keys and values together.
pub const CSI_MAX_STRING_BYTES: usize = 128;
pub const CSI_MAX_MAP_BYTES: usize = 4096;

/// Data source kinds the provisioner itself fills (any other kind is left to
/// a volume populator), and the API group a snapshot source must name.
pub const SNAPSHOT_KIND: &str = "VolumeSnapshot";
pub const SNAPSHOT_API_GROUP: &str = "snapshot.storage.k8s.io";
pub const CLAIM_KIND: &str = "PersistentVolumeClaim";

/// The event source of the events upstream's provisioner (not its shared
/// controller library) records, such as the populator note.
pub const EVENT_SOURCE_PROVISIONER: &str = "external-provisioner";

/// Put on a VolumeSnapshot before a volume is restored from it, removed after.
pub const FINALIZER_SNAPSHOT_SOURCE: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// On a VolumeSnapshotContent: restores into another volume mode are allowed
/// (upstream: `annAllowVolumeModeChange`; the `.kubernetes.io` domain, not the
/// API group's `.k8s.io`).
pub const ANN_ALLOW_VOLUME_MODE_CHANGE: &str =
    "snapshot.storage.kubernetes.io/allow-volume-mode-change";
/// Put on a claim before a volume is cloned from it; removed by the claim
/// controller once the claim is deleted and no pending clone names it.
pub const FINALIZER_CLONE_SOURCE: &str = "provisioner.storage.kubernetes.io/cloning-protection";

/// The zone and region labels of nodes and PVs: GA, and the beta spelling the
/// in-tree plugins wrote (a migrated GCE PD's zone is read from the latter).
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
pub const LABEL_ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
pub const LABEL_REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";

/// PV annotation: the RBD CSI driver's handle of a migrated RBD volume.
pub const ANN_RBD_VOLUME_HANDLE: &str = "rbd.csi.ceph.com/volume-handle";
/// PV annotation: the resource group of a migrated Azure File share.
pub const ANN_AZURE_FILE_RESOURCE_GROUP: &str = "kubernetes.io/azure-file-resource-group";

/// In-tree volume plugins (a StorageClass's provisioner, a migrated PV's
/// `provisioned-by`) and the CSI driver each was migrated to, as
/// csi-translation-lib names them (RBD as it did until Kubernetes 1.31).
/// `provision::migration` has one file for each.
pub const PLUGIN_AWS_EBS: &str = "kubernetes.io/aws-ebs";
pub const DRIVER_AWS_EBS: &str = "ebs.csi.aws.com";
pub const PLUGIN_GCE_PD: &str = "kubernetes.io/gce-pd";
pub const DRIVER_GCE_PD: &str = "pd.csi.storage.gke.io";
pub const PLUGIN_AZURE_DISK: &str = "kubernetes.io/azure-disk";
pub const DRIVER_AZURE_DISK: &str = "disk.csi.azure.com";
pub const PLUGIN_AZURE_FILE: &str = "kubernetes.io/azure-file";
pub const DRIVER_AZURE_FILE: &str = "file.csi.azure.com";
pub const PLUGIN_CINDER: &str = "kubernetes.io/cinder";
pub const DRIVER_CINDER: &str = "cinder.csi.openstack.org";
pub const PLUGIN_VSPHERE: &str = "kubernetes.io/vsphere-volume";
pub const DRIVER_VSPHERE: &str = "csi.vsphere.vmware.com";
pub const PLUGIN_PORTWORX: &str = "kubernetes.io/portworx-volume";
pub const DRIVER_PORTWORX: &str = "pxd.portworx.com";
pub const PLUGIN_RBD: &str = "kubernetes.io/rbd";
pub const DRIVER_RBD: &str = "rbd.csi.ceph.com";

/// Every `(in-tree plugin, CSI driver)` pair above, in csi-translation-lib's
/// order: what the CSI client needs to know whether its driver is a migration
/// target (the `migrated` metric label); `provision::migration`'s table of
/// plugins is checked against it.
pub const MIGRATED_PLUGINS: [(&str, &str); 8] = [
    (PLUGIN_AWS_EBS, DRIVER_AWS_EBS),
    (PLUGIN_GCE_PD, DRIVER_GCE_PD),
    (PLUGIN_AZURE_DISK, DRIVER_AZURE_DISK),
    (PLUGIN_AZURE_FILE, DRIVER_AZURE_FILE),
    (PLUGIN_CINDER, DRIVER_CINDER),
    (PLUGIN_VSPHERE, DRIVER_VSPHERE),
    (PLUGIN_PORTWORX, DRIVER_PORTWORX),
    (PLUGIN_RBD, DRIVER_RBD),
];
