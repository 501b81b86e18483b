//! Claim + StorageClass + driver facts → the `CreateVolume` request.
//! upstream: pkg/controller/controller.go prepareProvision.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::clone::CloneSource;
use super::metadata;
use super::secrets::{self, SecretKind, SecretRef, TemplateInputs};
use super::snapshot::SnapshotSource;
use super::{ClaimView, DriverInfo, ProvisionError, ProvisionOptions, quantity, volume_name};
use crate::config::MetadataConfig;
use crate::csi::pb;
use crate::keys;
use crate::names::{AccessMode, VolumeMode};

/// What the claim and its class alone decide about a volume: its name, what
/// the request says of them, which secrets and which source it needs. The
/// controller gathers the rest ([`Gathered`]) and the request is then built
/// once, complete ([`Plan::request`]); the plan is kept to build the PV.
#[derive(Clone, Debug)]
pub struct Plan {
    pub pv_name: String,
    /// The parts of the request the claim and class decide (name, capacity,
    /// capabilities, parameters); never sent as it is.
    base: pb::CreateVolumeRequest,
    pub secret_refs: BTreeMap<SecretKind, SecretRef>,
    /// fsType for the PV (empty for block volumes).
    pub fs_type: String,
    pub requested_bytes: i64,
    pub block: bool,
    /// The snapshot to restore, read by the controller (live) to fill the
    /// request's content source.
    pub snapshot: Option<SnapshotSource>,
    /// The claim to clone, read by the controller (live) likewise.
    pub clone: Option<CloneSource>,
}

/// What a request needs besides the claim and its class, read by the
/// controller from the API server: the source's handle, the
/// VolumeAttributesClass's parameters, the topology, the secret's data.
#[derive(Clone, Debug, Default)]
pub struct Gathered {
    pub content_source: Option<pb::VolumeContentSource>,
    pub mutable_parameters: std::collections::HashMap<String, String>,
    pub accessibility_requirements: Option<pb::TopologyRequirement>,
    pub secrets: std::collections::HashMap<String, String>,
    /// The claim's and its namespace's metadata as parameters
    /// ([`Plan::metadata_parameters`]).
    pub metadata_parameters: BTreeMap<String, String>,
}

impl Plan {
    pub fn provisioner_secret(&self) -> Option<&SecretRef> {
        self.secret_refs.get(&SecretKind::Provisioner)
    }

    /// The parameters the listed labels and annotations of the claim and of
    /// its namespace (`None` when none of its keys is listed) add to the
    /// request, each value checked, and the whole parameters with them.
    pub fn metadata_parameters(
        &self,
        claim: &PersistentVolumeClaim,
        namespace: Option<&ObjectMeta>,
        keys: &MetadataConfig,
    ) -> Result<BTreeMap<String, String>, ProvisionError> {
        let added = metadata::parameters(&claim.metadata, namespace, keys)?;
        metadata::check_total(&self.base.parameters, &added)?;
        Ok(added)
    }

    /// The `CreateVolume` request, complete: the plan and what was gathered.
    pub fn request(&self, gathered: Gathered) -> pb::CreateVolumeRequest {
        let Gathered {
            content_source,
            mutable_parameters,
            accessibility_requirements,
            secrets,
            metadata_parameters,
        } = gathered;
        let mut base = self.base.clone();
        base.parameters.extend(metadata_parameters);
        pb::CreateVolumeRequest {
            volume_content_source: content_source,
            mutable_parameters,
            accessibility_requirements,
            secrets,
            ..base
        }
    }
}

/// The checks of a data source that come first, before anything else about
/// the claim (upstream: `dataSource` and the kind switch of
/// `prepareProvision`): a populator's kind is not ours to provision.
/// A data source the provisioner fills itself.
enum Source {
    Snapshot(SnapshotSource),
    Clone(CloneSource),
}

fn data_source(view: ClaimView, opts: &ProvisionOptions) -> Result<Option<Source>, ProvisionError> {
    let Some(source) = view.data_source() else {
        return Ok(None);
    };
    let Some(namespace) = view.data_source_namespace(opts.cross_namespace_data_source) else {
        return Err(ProvisionError::CrossNamespaceDataSource);
    };
    if source.name.is_empty() {
        return Err(ProvisionError::DataSourceWithoutName {
            claim: view.name().to_string(),
        });
    }
    match source.kind {
        keys::SNAPSHOT_KIND if source.api_group != keys::SNAPSHOT_API_GROUP => {
            Err(ProvisionError::SnapshotApiGroup {
                got: source.api_group.to_string(),
            })
        }
        keys::SNAPSHOT_KIND => Ok(Some(Source::Snapshot(SnapshotSource {
            namespace: namespace.to_string(),
            name: source.name.to_string(),
        }))),
        keys::CLAIM_KIND => Ok(Some(Source::Clone(CloneSource {
            namespace: namespace.to_string(),
            name: source.name.to_string(),
        }))),
        other => Err(ProvisionError::ExternalPopulator {
            kind: other.to_string(),
        }),
    }
}

const ALL_SECRET_KINDS: [SecretKind; 7] = [
    SecretKind::Provisioner,
    SecretKind::ControllerPublish,
    SecretKind::NodeStage,
    SecretKind::NodePublish,
    SecretKind::ControllerExpand,
    SecretKind::NodeExpand,
    SecretKind::ControllerModify,
];

/// The plan of a claim's volume, or why the claim cannot have one as asked
/// (checked in upstream's order, so the first reason given is upstream's).
pub fn plan(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    driver: &DriverInfo,
    opts: &ProvisionOptions,
) -> Result<Plan, ProvisionError> {
    let view = ClaimView(claim);
    let (snapshot, clone) = source_the_driver_can_use(view, driver, opts)?;
    let pv_name = volume_name(
        &opts.volume_name_prefix,
        view.uid(),
        opts.volume_name_uuid_length,
    )?;
    let spec = claim.spec.clone().unwrap_or_default();
    if spec.selector.is_some() {
        return Err(ProvisionError::SelectorNotSupported);
    }
    // The class's parameters are fetched by the controller (an API read);
    // whether the driver can take them at all is known now.
    if view.vac_name(opts).is_some() && !driver.capabilities.modify_volume {
        return Err(ProvisionError::VolumeAttributesClassNotSupported);
    }
    let params = class.parameters.clone().unwrap_or_default();
    let fs_type_param = checked_fs_type(&params)?;
    let inputs = TemplateInputs {
        pv_name: &pv_name,
        pvc_name: view.name(),
        pvc_namespace: view.namespace(),
        pvc_annotations: view.annotations(),
    };
    let mut secret_refs = BTreeMap::new();
    for kind in ALL_SECRET_KINDS {
        if let Some(r) = secrets::resolve(kind, &params, &inputs)? {
            secret_refs.insert(kind, r);
        }
    }
    let mode = spec.volume_mode.as_deref().map(|m| {
        VolumeMode::parse(m).ok_or_else(|| ProvisionError::UnknownVolumeMode(m.to_string()))
    });
    let block = mode.transpose()? == Some(VolumeMode::Block);
    let fs_type = match (block, fs_type_param) {
        (true, _) => String::new(),
        (false, Some(t)) => t,
        (false, None) => opts.default_fstype.clone().unwrap_or_default(),
    };
    let volume_capabilities = capabilities(
        &spec.access_modes.clone().unwrap_or_default(),
        block,
        &fs_type,
        class,
        driver,
    )?;
    let requested_bytes = match view.requested_storage() {
        Some(q) => {
            quantity::parse_bytes(q).ok_or_else(|| ProvisionError::BadStorageRequest(q.into()))?
        }
        None => return Err(ProvisionError::BadStorageRequest(String::new())),
    };
    let base = pb::CreateVolumeRequest {
        name: pv_name.clone(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: requested_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities,
        parameters: driver_parameters(params, view, &pv_name, opts),
        ..Default::default()
    };
    Ok(Plan {
        pv_name,
        base,
        secret_refs,
        fs_type,
        requested_bytes,
        block,
        snapshot,
        clone,
    })
}

/// The claim's data source, if the provisioner fills it and the driver can:
/// first what the claim asks, then whether the driver provisions at all.
fn source_the_driver_can_use(
    view: ClaimView,
    driver: &DriverInfo,
    opts: &ProvisionOptions,
) -> Result<(Option<SnapshotSource>, Option<CloneSource>), ProvisionError> {
    let (snapshot, clone) = match data_source(view, opts)? {
        None => (None, None),
        Some(Source::Snapshot(s)) => (Some(s), None),
        Some(Source::Clone(c)) => (None, Some(c)),
    };
    let caps = &driver.capabilities;
    if !caps.controller_service {
        return Err(ProvisionError::ProvisioningNotSupported {
            missing: "plugin CONTROLLER_SERVICE",
        });
    }
    if !caps.create_delete_volume {
        return Err(ProvisionError::ProvisioningNotSupported {
            missing: "controller CREATE_DELETE_VOLUME",
        });
    }
    if snapshot.is_some() && !caps.create_delete_snapshot {
        return Err(ProvisionError::SnapshotRestoreNotSupported);
    }
    if clone.is_some() && !caps.clone_volume {
        return Err(ProvisionError::CloneNotSupported);
    }
    Ok((snapshot, clone))
}

/// The class's fsType (the new key or the deprecated one, not both), after
/// refusing reserved keys the sidecar does not know.
fn checked_fs_type(params: &BTreeMap<String, String>) -> Result<Option<String>, ProvisionError> {
    let fs_type_new = params.get(keys::PARAM_FSTYPE);
    let fs_type_legacy = params
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(keys::PARAM_FSTYPE_LEGACY))
        .map(|(_, v)| v);
    if fs_type_new.is_some() && fs_type_legacy.is_some() {
        return Err(ProvisionError::FsTypeTwice);
    }
    if let Some(key) = params
        .keys()
        .find(|k| k.starts_with(keys::CSI_PARAMETER_PREFIX) && !secrets::is_known_prefixed_key(k))
    {
        return Err(ProvisionError::UnknownReservedParameter { key: key.clone() });
    }
    Ok(fs_type_new.or(fs_type_legacy).cloned())
}

/// One volume capability per access mode: block, or mounted with the fsType
/// and the class's mount options.
fn capabilities(
    modes: &[String],
    block: bool,
    fs_type: &str,
    class: &StorageClass,
    driver: &DriverInfo,
) -> Result<Vec<pb::VolumeCapability>, ProvisionError> {
    let access_type = if block {
        pb::volume_capability::AccessType::Block(pb::volume_capability::BlockVolume {})
    } else {
        pb::volume_capability::AccessType::Mount(pb::volume_capability::MountVolume {
            fs_type: fs_type.to_string(),
            mount_flags: class.mount_options.clone().unwrap_or_default(),
            ..Default::default()
        })
    };
    Ok(
        access_modes(modes, driver.capabilities.single_node_multi_writer)?
            .into_iter()
            .map(|mode| pb::VolumeCapability {
                access_type: Some(access_type.clone()),
                access_mode: Some(pb::volume_capability::AccessMode { mode: mode as i32 }),
            })
            .collect(),
    )
}

/// The parameters the driver gets: the class's without the sidecar's own
/// keys (the deprecated fstype and csi* secret keys are passed through, as
/// upstream does), and with `--extra-create-metadata` the claim's and PV's
/// names.
fn driver_parameters(
    params: BTreeMap<String, String>,
    view: ClaimView,
    pv_name: &str,
    opts: &ProvisionOptions,
) -> std::collections::HashMap<String, String> {
    let mut parameters: std::collections::HashMap<String, String> = params
        .into_iter()
        .filter(|(k, _)| !k.starts_with(keys::CSI_PARAMETER_PREFIX))
        .collect();
    if opts.extra_create_metadata {
        parameters.insert(keys::PARAM_PVC_NAME.into(), view.name().into());
        parameters.insert(keys::PARAM_PVC_NAMESPACE.into(), view.namespace().into());
        parameters.insert(keys::PARAM_PV_NAME.into(), pv_name.to_string());
    }
    parameters
}

/// One CSI access mode per Kubernetes access mode.
fn access_modes(
    modes: &[String],
    single_node_multi_writer: bool,
) -> Result<Vec<pb::volume_capability::access_mode::Mode>, ProvisionError> {
    use pb::volume_capability::access_mode::Mode;
    if modes.is_empty() {
        return Err(ProvisionError::NoAccessModes);
    }
    let rwop = |m: &String| AccessMode::parse(m) == Some(AccessMode::ReadWriteOncePod);
    if modes.len() > 1 && modes.iter().any(rwop) {
        return Err(ProvisionError::ReadWriteOncePodCombined);
    }
    modes
        .iter()
        .map(|m| {
            let mode =
                AccessMode::parse(m).ok_or_else(|| ProvisionError::UnknownAccessMode(m.clone()))?;
            Ok(match mode {
                AccessMode::ReadWriteOnce if single_node_multi_writer => {
                    Mode::SingleNodeMultiWriter
                }
                AccessMode::ReadWriteOnce => Mode::SingleNodeWriter,
                AccessMode::ReadWriteOncePod if single_node_multi_writer => {
                    Mode::SingleNodeSingleWriter
                }
                AccessMode::ReadWriteOncePod => Mode::SingleNodeWriter,
                AccessMode::ReadOnlyMany => Mode::MultiNodeReaderOnly,
                AccessMode::ReadWriteMany => Mode::MultiNodeMultiWriter,
            })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::csi::DriverCapabilities;
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, TypedLocalObjectReference, TypedObjectReference,
        VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use pb::volume_capability::access_mode::Mode;

    pub fn driver() -> DriverInfo {
        DriverInfo {
            name: "test.csi.example.com".into(),
            identity: "123-4-test.csi.example.com".into(),
            capabilities: DriverCapabilities {
                controller_service: true,
                create_delete_volume: true,
                ..Default::default()
            },
        }
    }

    pub fn claim() -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("team-a".into()),
                uid: Some("11111111-2222-3333-4444-555555555555".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: Some("fast".into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub fn class(params: &[(&str, &str)]) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("fast".into()),
                uid: Some("sc-uid".into()),
                ..Default::default()
            },
            provisioner: "test.csi.example.com".into(),
            parameters: Some(
                params
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            mount_options: Some(vec!["noatime".into()]),
            reclaim_policy: Some("Delete".into()),
            ..Default::default()
        }
    }

    #[test]
    fn builds_the_request_upstream_builds() {
        let sc = class(&[
            ("csi.storage.k8s.io/fstype", "ext4"),
            ("csi.storage.k8s.io/provisioner-secret-name", "creds"),
            (
                "csi.storage.k8s.io/provisioner-secret-namespace",
                "${pvc.namespace}",
            ),
            ("type", "ssd"),
            ("csiNodeStageSecretName", "stage"),
            ("csiNodeStageSecretNamespace", "kube-system"),
        ]);
        let p = plan(&claim(), &sc, &driver(), &ProvisionOptions::default()).unwrap();
        assert_eq!(p.pv_name, "pvc-11111111-2222-3333-4444-555555555555");
        assert_eq!(p.request(Gathered::default()).name, p.pv_name);
        assert_eq!(
            p.request(Gathered::default())
                .capacity_range
                .unwrap()
                .required_bytes,
            1 << 30
        );
        let keys: Vec<_> = {
            let mut k: Vec<_> = p
                .request(Gathered::default())
                .parameters
                .keys()
                .cloned()
                .collect();
            k.sort();
            k
        };
        assert_eq!(
            keys,
            vec![
                "csiNodeStageSecretName",
                "csiNodeStageSecretNamespace",
                "type"
            ]
        );
        assert_eq!(p.request(Gathered::default()).volume_capabilities.len(), 1);
        let cap = &p.request(Gathered::default()).volume_capabilities[0];
        assert_eq!(cap.access_mode.unwrap().mode, Mode::SingleNodeWriter as i32);
        match &cap.access_type {
            Some(pb::volume_capability::AccessType::Mount(m)) => {
                assert_eq!(m.fs_type, "ext4");
                assert_eq!(m.mount_flags, vec!["noatime"]);
            }
            other => panic!("want mount, got {other:?}"),
        }
        assert_eq!(
            p.provisioner_secret().unwrap(),
            &SecretRef {
                name: "creds".into(),
                namespace: "team-a".into()
            }
        );
        assert_eq!(
            p.secret_refs[&SecretKind::NodeStage].namespace,
            "kube-system"
        );
        assert!(
            p.request(Gathered::default()).secrets.is_empty(),
            "secret data is filled by the controller"
        );
    }

    #[test]
    fn one_capability_per_access_mode_and_block() {
        let mut c = claim();
        let spec = c.spec.as_mut().unwrap();
        spec.access_modes = Some(vec![
            "ReadWriteOnce".into(),
            "ReadOnlyMany".into(),
            "ReadWriteMany".into(),
        ]);
        spec.volume_mode = Some("Block".into());
        let p = plan(
            &c,
            &class(&[("csi.storage.k8s.io/fstype", "xfs")]),
            &driver(),
            &Default::default(),
        )
        .unwrap();
        let modes: Vec<i32> = p
            .request(Gathered::default())
            .volume_capabilities
            .iter()
            .map(|c| c.access_mode.unwrap().mode)
            .collect();
        assert_eq!(
            modes,
            vec![
                Mode::SingleNodeWriter as i32,
                Mode::MultiNodeReaderOnly as i32,
                Mode::MultiNodeMultiWriter as i32
            ]
        );
        assert!(p.block);
        assert_eq!(p.fs_type, "");
        assert!(
            p.request(Gathered::default())
                .volume_capabilities
                .iter()
                .all(|c| matches!(
                    c.access_type,
                    Some(pb::volume_capability::AccessType::Block(_))
                ))
        );
    }

    #[test]
    fn multi_writer_capability_changes_rwo_and_rwop() {
        let mut d = driver();
        d.capabilities.single_node_multi_writer = true;
        let mut c = claim();
        c.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteOncePod".into()]);
        let p = plan(&c, &class(&[]), &d, &Default::default()).unwrap();
        assert_eq!(
            p.request(Gathered::default()).volume_capabilities[0]
                .access_mode
                .unwrap()
                .mode,
            Mode::SingleNodeSingleWriter as i32
        );
        let p = plan(&claim(), &class(&[]), &d, &Default::default()).unwrap();
        assert_eq!(
            p.request(Gathered::default()).volume_capabilities[0]
                .access_mode
                .unwrap()
                .mode,
            Mode::SingleNodeMultiWriter as i32
        );
    }

    #[test]
    fn extra_metadata_and_default_fstype() {
        let opts = ProvisionOptions {
            extra_create_metadata: true,
            default_fstype: Some("ext3".into()),
            ..Default::default()
        };
        let p = plan(&claim(), &class(&[]), &driver(), &opts).unwrap();
        assert_eq!(
            p.request(Gathered::default()).parameters[keys::PARAM_PVC_NAME],
            "data"
        );
        assert_eq!(
            p.request(Gathered::default()).parameters[keys::PARAM_PVC_NAMESPACE],
            "team-a"
        );
        assert_eq!(
            p.request(Gathered::default()).parameters[keys::PARAM_PV_NAME],
            p.pv_name
        );
        assert_eq!(p.fs_type, "ext3");
        let p = plan(&claim(), &class(&[("fsType", "xfs")]), &driver(), &opts).unwrap();
        assert_eq!(p.fs_type, "xfs");
        assert_eq!(
            p.request(Gathered::default()).parameters["fsType"],
            "xfs",
            "legacy key is passed through"
        );
    }

    #[test]
    fn listed_metadata_joins_the_class_parameters_without_extra_create_metadata() {
        let mut c = claim();
        c.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
        let namespace = ObjectMeta {
            annotations: Some([("example.com/account".to_string(), "acct-1".to_string())].into()),
            ..Default::default()
        };
        let mut opts = ProvisionOptions::default();
        opts.metadata.pvc_labels = vec!["team".into()];
        opts.metadata.namespace_annotations = vec!["example.com/account".into()];
        let p = plan(&c, &class(&[("type", "ssd")]), &driver(), &opts).unwrap();
        let metadata_parameters = p
            .metadata_parameters(&c, Some(&namespace), &opts.metadata)
            .unwrap();
        let request = p.request(Gathered {
            metadata_parameters,
            ..Default::default()
        });
        let mut keys: Vec<&str> = request.parameters.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "csi.storage.k8s.io/namespace/annotations/example.com/account",
                "csi.storage.k8s.io/pvc/labels/team",
                "type"
            ],
            "independent of --extra-create-metadata, as upstream PR #1531"
        );
        assert!(
            p.request(Gathered::default()).parameters.len() == 1,
            "the plan alone carries the class's parameters only"
        );
    }

    #[test]
    fn rejects_what_upstream_rejects() {
        let rwop_mixed = {
            let mut c = claim();
            c.spec.as_mut().unwrap().access_modes =
                Some(vec!["ReadWriteOncePod".into(), "ReadOnlyMany".into()]);
            c
        };
        let with_selector = {
            let mut c = claim();
            c.spec.as_mut().unwrap().selector = Some(Default::default());
            c
        };
        let with_source = {
            let mut c = claim();
            c.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
                api_group: None,
                kind: "PersistentVolumeClaim".into(),
                name: "src".into(),
            });
            c
        };
        let no_uid = {
            let mut c = claim();
            c.metadata.uid = None;
            c
        };
        let with_data_source = |group: Option<&str>, kind: &str, name: &str| {
            let mut c = claim();
            c.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
                api_group: group.map(String::from),
                kind: kind.into(),
                name: name.into(),
            });
            c
        };
        let with_source_ref = |namespace: &str| {
            let mut c = claim();
            c.spec.as_mut().unwrap().data_source_ref = Some(TypedObjectReference {
                api_group: None,
                kind: "PersistentVolumeClaim".into(),
                name: "src".into(),
                namespace: Some(namespace.into()),
            });
            c
        };
        let no_caps = {
            let mut d = driver();
            d.capabilities.create_delete_volume = false;
            d
        };
        let with_vac = {
            let mut c = claim();
            c.spec.as_mut().unwrap().volume_attributes_class_name = Some("gold".into());
            c
        };
        let table: Vec<(PersistentVolumeClaim, StorageClass, DriverInfo, &str)> = vec![
            (
                claim(),
                class(&[("fstype", "a"), ("csi.storage.k8s.io/fstype", "b")]),
                driver(),
                "both",
            ),
            (
                claim(),
                class(&[("csi.storage.k8s.io/foo", "x")]),
                driver(),
                "unknown parameter key",
            ),
            (
                claim(),
                class(&[("csi.storage.k8s.io/provisioner-secret-name", "x")]),
                driver(),
                "Both must be specified",
            ),
            (rwop_mixed, class(&[]), driver(), "ReadWriteOncePod"),
            (with_selector, class(&[]), driver(), "Selector"),
            (
                with_source,
                class(&[]),
                driver(),
                "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported",
            ),
            (
                with_data_source(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", "snap"),
                class(&[]),
                driver(),
                "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported",
            ),
            (
                with_source_ref("other"),
                class(&[]),
                driver(),
                "CrossNamespaceVolumeDataSource",
            ),
            (
                with_data_source(None, "VolumeSnapshot", ""),
                class(&[]),
                driver(),
                "the PVC source not found for PVC data",
            ),
            (
                with_data_source(Some("example.com"), "VolumeSnapshot", "snap"),
                class(&[]),
                driver(),
                "Expected snapshot.storage.k8s.io, Got example.com",
            ),
            // A populator's claim is not refused for anything else first.
            (
                with_data_source(Some("example.com"), "Backup", "b"),
                class(&[]),
                no_caps.clone(),
                "assuming an external populator will provision it",
            ),
            (no_uid, class(&[]), driver(), "missing UID"),
            (with_vac, class(&[]), driver(), "MODIFY_VOLUME capability"),
            (
                claim(),
                class(&[]),
                no_caps,
                "does not support dynamic provisioning",
            ),
        ];
        for (c, sc, d, fragment) in table {
            let err = plan(&c, &sc, &d, &Default::default()).unwrap_err();
            assert!(
                err.to_string().contains(fragment),
                "{err} lacks {fragment:?}"
            );
        }
    }

    #[test]
    fn volume_attributes_class_needs_the_gate_and_modify_volume() {
        let mut c = claim();
        c.spec.as_mut().unwrap().volume_attributes_class_name = Some("gold".into());
        let gate_off = ProvisionOptions {
            volume_attributes_class: false,
            ..Default::default()
        };
        // Gate off: the class is not looked at (upstream ignores it too).
        assert!(plan(&c, &class(&[]), &driver(), &gate_off).is_ok());
        let mut d = driver();
        d.capabilities.modify_volume = true;
        let p = plan(&c, &class(&[]), &d, &Default::default()).unwrap();
        assert!(
            p.request(Gathered::default()).mutable_parameters.is_empty(),
            "filled by the controller from the class it reads"
        );
        c.spec.as_mut().unwrap().volume_attributes_class_name = Some(String::new());
        assert!(plan(&c, &class(&[]), &driver(), &Default::default()).is_ok());
    }
}
