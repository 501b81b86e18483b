//! Bad input, generated: every input a user or a driver controls — StorageClass
//! parameters and secret templates, claim specs (sizes, modes, data sources,
//! selectors, annotations), the command line in Go's syntax, and every field
//! of the driver's `CreateVolume` answer — gives a clear error or a sound
//! result, never a panic. A bounded run is part of `make test`
//! (`PROPTEST_CASES`, 256 by default); a longer one:
//! `PROPTEST_CASES=100000 cargo test --test properties`.
//! What bad input does end to end (a `ProvisioningFailed` event, no volume)
//! is checked on the real control plane by tests/error_handling.rs and
//! tests/provision_basic.rs; here the pure parts are driven far wider.

use std::collections::{BTreeMap, HashMap};

use csi_provisioner::config::{Config, Env, error_line, parse_from};
use csi_provisioner::csi::{DriverCapabilities, pb};
use csi_provisioner::provision::{DriverInfo, Gathered, ProvisionOptions, build_pv, plan};
use csi_provisioner::{duration, keys, quantity};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, TypedLocalObjectReference,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use proptest::prelude::*;

/// Strings a user might type, and some no one should: empty, long, Unicode,
/// control characters, template syntax gone wrong.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9.-]{1,20}",
        "\\PC{0,40}",
        "[\\x00-\\x1f]{1,5}",
        "\\$\\{[a-z.'\\[\\]]{0,20}\\}?",
        Just("${pvc.name}".to_string()),
        Just("${pvc.namespace}".to_string()),
        Just("${pv.name}".to_string()),
        Just("${pvc.annotations['team']}".to_string()),
        Just("${pvc.annotations['".to_string()),
        "[a-z]{300,400}",
    ]
}

/// StorageClass parameter keys: the reserved ones (known and not), the
/// deprecated secret keys, fstype in every spelling, anything.
fn parameter_key() -> impl Strategy<Value = String> {
    let known = [
        "csi.storage.k8s.io/fstype",
        "fstype",
        "FsType",
        "csi.storage.k8s.io/provisioner-secret-name",
        "csi.storage.k8s.io/provisioner-secret-namespace",
        "csi.storage.k8s.io/controller-publish-secret-name",
        "csi.storage.k8s.io/controller-publish-secret-namespace",
        "csi.storage.k8s.io/node-stage-secret-name",
        "csi.storage.k8s.io/node-stage-secret-namespace",
        "csi.storage.k8s.io/secret-name",
        "csi.storage.k8s.io/secret-namespace",
        "csiProvisionerSecretName",
        "csiProvisionerSecretNamespace",
    ];
    prop_oneof![
        proptest::sample::select(known.to_vec()).prop_map(String::from),
        "csi\\.storage\\.k8s\\.io/[a-z-]{0,12}",
        "[a-zA-Z0-9./-]{1,20}",
    ]
}

fn storage_request() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        "[0-9]{1,25}(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|)".prop_map(Some),
        "-[0-9]{1,5}Gi".prop_map(Some),
        "[0-9]{1,3}\\.[0-9]{1,4}(e[0-9]{1,3}|Gi)?".prop_map(Some),
        text().prop_map(Some),
    ]
}

fn claim() -> impl Strategy<Value = PersistentVolumeClaim> {
    let modes = prop::collection::vec(
        prop_oneof![
            Just("ReadWriteOnce".to_string()),
            Just("ReadOnlyMany".to_string()),
            Just("ReadWriteMany".to_string()),
            Just("ReadWriteOncePod".to_string()),
            text(),
        ],
        0..4,
    );
    let source = prop::option::of((
        prop::option::of(prop_oneof![
            Just("snapshot.storage.k8s.io".to_string()),
            text()
        ]),
        prop_oneof![
            Just("VolumeSnapshot".to_string()),
            Just("PersistentVolumeClaim".to_string()),
            text()
        ],
        text(),
    ));
    // Names are what the API server accepts (it validates them); the rest
    // is anything, as our code must not rely on validation it cannot see.
    let name = "[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?";
    (
        (
            name,
            name,
            prop::collection::btree_map(text(), text(), 0..4),
        ),
        modes,
        prop::option::of(prop_oneof![
            Just("Filesystem".to_string()),
            Just("Block".to_string()),
            text()
        ]),
        storage_request(),
        source,
        any::<bool>(),
    )
        .prop_map(
            |((name, namespace, annotations), modes, mode, size, source, selector)| {
                PersistentVolumeClaim {
                    metadata: ObjectMeta {
                        name: Some(name),
                        namespace: Some(namespace),
                        uid: Some("11111111-2222-3333-4444-555555555555".into()),
                        annotations: Some(annotations),
                        ..Default::default()
                    },
                    spec: Some(PersistentVolumeClaimSpec {
                        access_modes: Some(modes),
                        volume_mode: mode,
                        storage_class_name: Some("fuzz".into()),
                        resources: Some(VolumeResourceRequirements {
                            requests: size.map(|s| [("storage".to_string(), Quantity(s))].into()),
                            ..Default::default()
                        }),
                        data_source: source.map(|(api_group, kind, name)| {
                            TypedLocalObjectReference {
                                api_group,
                                kind,
                                name,
                            }
                        }),
                        selector: selector.then(LabelSelector::default),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            },
        )
}

fn class() -> impl Strategy<Value = StorageClass> {
    (
        prop::collection::btree_map(parameter_key(), text(), 0..8),
        prop::option::of(prop::collection::vec(text(), 0..3)),
    )
        .prop_map(|(parameters, mount_options)| StorageClass {
            metadata: ObjectMeta {
                name: Some("fuzz".into()),
                ..Default::default()
            },
            provisioner: "fuzz.csi.example.com".into(),
            parameters: Some(parameters),
            mount_options,
            reclaim_policy: Some("Delete".into()),
            ..Default::default()
        })
}

fn driver() -> impl Strategy<Value = DriverInfo> {
    any::<[bool; 6]>().prop_map(|b| DriverInfo {
        name: "fuzz.csi.example.com".into(),
        identity: "1-2-fuzz.csi.example.com".into(),
        capabilities: DriverCapabilities {
            controller_service: b[0] || b[1],
            create_delete_volume: b[0] || b[2],
            clone_volume: b[3],
            create_delete_snapshot: b[4],
            single_node_multi_writer: b[5],
            ..Default::default()
        },
    })
}

fn options() -> impl Strategy<Value = ProvisionOptions> {
    (
        prop_oneof![Just("pvc".to_string()), text()],
        prop::option::of(1usize..=32),
        any::<bool>(),
        prop::option::of(text()),
    )
        .prop_map(|(prefix, uuid_length, extra, fstype)| ProvisionOptions {
            volume_name_prefix: prefix,
            volume_name_uuid_length: uuid_length,
            extra_create_metadata: extra,
            default_fstype: fstype,
            ..Default::default()
        })
}

/// A Kubernetes object name: what the API server would accept for a secret
/// name (DNS subdomain) or namespace (DNS label).
fn is_dns_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256)
    ))]

    /// A claim and a class as users write them: a plan, or one line saying why not.
    #[test]
    fn a_plan_or_one_line_saying_why_not(
        claim in claim(),
        class in class(),
        driver in driver(),
        options in options(),
    ) {
        match plan(&claim, &class, &driver, &options) {
            Err(e) => {
                let text = e.to_string();
                prop_assert!(!text.is_empty());
                prop_assert!(!text.contains('\n'), "{text:?}");
            }
            Ok(p) => {
                let request = p.request(Gathered::default());
                prop_assert_eq!(&request.name, &p.pv_name);
                prop_assert!(p.requested_bytes > 0 || p.requested_bytes == 0 && request.capacity_range.is_some());
                prop_assert!(request.capacity_range.unwrap().required_bytes >= 0);
                // The sidecar's own keys never reach the driver (but the
                // metadata it adds itself).
                for key in request.parameters.keys() {
                    prop_assert!(
                        !key.starts_with(keys::CSI_PARAMETER_PREFIX)
                            || [keys::PARAM_PVC_NAME, keys::PARAM_PVC_NAMESPACE, keys::PARAM_PV_NAME]
                                .contains(&key.as_str()),
                        "{key}"
                    );
                }
                // A secret is only ever named by something the API server
                // could hold.
                for r in p.secret_refs.values() {
                    prop_assert!(is_dns_name(&r.name, 253), "{r:?}");
                    prop_assert!(is_dns_name(&r.namespace, 63), "{r:?}");
                }
                prop_assert!(!request.volume_capabilities.is_empty());
            }
        }
    }

    /// Whatever the driver answers, the PV is sound or the answer is refused
    /// in one line: capacity, ids, topology, context, content source.
    #[test]
    fn any_driver_answer_gives_a_sound_pv_or_a_refusal(
        capacity in prop_oneof![Just(0i64), any::<i64>(), (1i64 << 30)..(1i64 << 40)],
        volume_id in prop_oneof![Just(String::new()), text()],
        context in prop::collection::hash_map(text(), text(), 0..4),
        topology in prop::collection::vec(prop::collection::hash_map(text(), text(), 0..3), 0..4),
        source in 0u8..3,
    ) {
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("team".into()),
                uid: Some("11111111-2222-3333-4444-555555555555".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: Some("fuzz".into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let class = StorageClass {
            provisioner: "fuzz.csi.example.com".into(),
            ..Default::default()
        };
        let driver = DriverInfo {
            name: "fuzz.csi.example.com".into(),
            identity: "id".into(),
            capabilities: DriverCapabilities {
                controller_service: true,
                create_delete_volume: true,
                ..Default::default()
            },
        };
        let options = ProvisionOptions::default();
        let p = plan(&claim, &class, &driver, &options).expect("a valid claim");
        let content_source = match source {
            0 => None,
            1 => Some(pb::VolumeContentSource {
                r#type: Some(pb::volume_content_source::Type::Snapshot(
                    pb::volume_content_source::SnapshotSource { snapshot_id: "s".into() },
                )),
            }),
            _ => Some(pb::VolumeContentSource { r#type: None }),
        };
        let response = pb::CreateVolumeResponse {
            volume: Some(pb::Volume {
                capacity_bytes: capacity,
                volume_id: volume_id.clone(),
                volume_context: context.into_iter().collect::<HashMap<_, _>>(),
                content_source,
                accessible_topology: topology
                    .iter()
                    .map(|s| pb::Topology { segments: s.clone().into_iter().collect() })
                    .collect(),
            }),
        };
        match build_pv(&p, &claim, &class, &response, &driver, &options) {
            Err(e) => prop_assert!(!e.to_string().contains('\n')),
            Ok(pv) => {
                prop_assert!(!volume_id.is_empty(), "a PV without a volume id");
                let spec = pv.spec.unwrap();
                let size = quantity::parse_bytes(&spec.capacity.unwrap()["storage"].0).unwrap();
                prop_assert!(size >= p.requested_bytes, "{size} < {}", p.requested_bytes);
                prop_assert_eq!(spec.csi.unwrap().volume_handle, volume_id);
                let terms = spec
                    .node_affinity
                    .and_then(|a| a.required)
                    .map(|r| r.node_selector_terms.len())
                    .unwrap_or(0);
                prop_assert!(terms <= topology.len());
            }
        }
    }

    /// The command line in Go's syntax: parsed, validated, or refused in one
    /// line — never a panic.
    #[test]
    fn any_command_line_is_parsed_or_refused_in_one_line(
        argv in prop::collection::vec(
            prop_oneof![
                flag_word(),
                (flag_word(), text()).prop_map(|(f, v)| format!("{f}={v}")),
                text(),
            ],
            0..8,
        )
    ) {
        let argv: Vec<String> = std::iter::once("csi-provisioner".to_string()).chain(argv).collect();
        match parse_from(argv) {
            Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp
                || e.kind() == clap::error::ErrorKind::DisplayVersion => {}
            Err(e) => prop_assert!(!error_line(&e).contains('\n')),
            Ok(args) => {
                if let Err(e) = Config::from_args(&args, &Env::default()) {
                    prop_assert!(!e.to_string().contains('\n'), "{e}");
                }
            }
        }
    }

    /// Sizes and durations as users write them.
    #[test]
    fn quantities_and_durations_parse_or_refuse(s in text()) {
        if let Ok(n) = quantity::parse(&s) {
            prop_assert!(quantity::parse(&quantity::format_bytes(n.min(i64::MAX as u64) as i64)).is_ok());
        }
        let _ = quantity::parse_bytes(&s);
        let _ = duration::parse_go_duration(&s);
    }
}

/// A flag of ours, in any of Go's spellings.
fn flag_word() -> impl Strategy<Value = String> {
    let names: Vec<String> = csi_provisioner::config::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(String::from))
        .collect();
    (proptest::sample::select(names), 0usize..3)
        .prop_map(|(name, dashes)| format!("{}{name}", "-".repeat(dashes.max(1))))
}

#[test]
fn the_dns_check_of_this_file_tells_names_apart() {
    assert!(is_dns_name("creds", 253) && is_dns_name("a.b-c", 253));
    assert!(!is_dns_name("", 253) && !is_dns_name("A", 253) && !is_dns_name("-a", 63));
    let _: BTreeMap<String, String> = BTreeMap::new();
}
