//! The driver behaves like a correct CSI backend: idempotent by name, strict about arguments,
//! and its ledger tells the truth.

mod support;

use csi_proto::v1;
use csi_test_driver::GrpcCode;
use csi_test_driver::process::DriverOptions;
use support::{GIB, Harness, create_request, delete_request};
use tonic::Code;

#[tokio::test]
async fn create_with_the_same_name_returns_the_same_volume() {
    let h = Harness::start().await;
    let mut controller = h.controller().await;

    let first = controller
        .create_volume(create_request("pvc-a", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let again = controller
        .create_volume(create_request("pvc-a", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(first.volume_id, again.volume_id);
    assert_eq!(first.capacity_bytes, GIB);
    assert_eq!(
        first.volume_context.get("type").map(String::as_str),
        Some("fast")
    );

    // A smaller request is still satisfied by the existing volume.
    let smaller = controller
        .create_volume(create_request("pvc-a", GIB / 2))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(smaller.volume_id, first.volume_id);

    let ledger = h.control.ledger().await.unwrap();
    assert_eq!(ledger.volumes.len(), 1);
    let record = &ledger.volumes[&first.volume_id];
    assert_eq!(record.name, "pvc-a");
    assert_eq!(record.secret_keys, vec!["password".to_string()]);
    let created: Vec<bool> = ledger
        .operations_of("CreateVolume")
        .map(|op| op.created)
        .collect();
    assert_eq!(created, vec![true, false, false]);

    // Secret values never reach the ledger files (the snapshot or its journal).
    for file in ["ledger.json", "ledger.log"] {
        let on_disk = std::fs::read_to_string(h.driver.state_dir.join(file)).unwrap_or_default();
        assert!(!on_disk.contains("SENTINEL-SECRET-42"), "{file}");
    }
    assert!(h.driver.state_dir.join("ledger.log").exists());
}

#[tokio::test]
async fn same_name_with_incompatible_size_or_parameters_is_already_exists() {
    let h = Harness::start().await;
    let mut controller = h.controller().await;
    let mut exact = create_request("pvc-b", GIB);
    exact.capacity_range = Some(v1::CapacityRange {
        required_bytes: GIB,
        limit_bytes: GIB,
    });
    controller.create_volume(exact).await.unwrap();

    let bigger = controller
        .create_volume(create_request("pvc-b", 2 * GIB))
        .await
        .unwrap_err();
    assert_eq!(bigger.code(), Code::AlreadyExists);

    let mut other_parameters = create_request("pvc-b", GIB);
    other_parameters
        .parameters
        .insert("type".into(), "slow".into());
    let err = controller
        .create_volume(other_parameters)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);

    let ledger = h.control.ledger().await.unwrap();
    assert_eq!(ledger.volumes.len(), 1);
    let codes: Vec<GrpcCode> = ledger
        .operations_of("CreateVolume")
        .map(|op| op.code)
        .collect();
    assert_eq!(
        codes,
        vec![
            GrpcCode::Ok,
            GrpcCode::AlreadyExists,
            GrpcCode::AlreadyExists
        ]
    );
}

#[tokio::test]
async fn delete_is_idempotent_and_rejects_an_empty_id() {
    let h = Harness::start().await;
    let mut controller = h.controller().await;
    let volume = controller
        .create_volume(create_request("pvc-c", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();

    controller
        .delete_volume(delete_request(&volume.volume_id))
        .await
        .unwrap();
    controller
        .delete_volume(delete_request(&volume.volume_id))
        .await
        .unwrap();
    let empty = controller
        .delete_volume(delete_request(""))
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);

    let ledger = h.control.ledger().await.unwrap();
    assert!(ledger.volumes.is_empty());
    let deleted: Vec<bool> = ledger
        .operations_of("DeleteVolume")
        .map(|op| op.deleted)
        .collect();
    assert_eq!(deleted, vec![true, false, false]);
    assert_eq!(ledger.call_count("DeleteVolume"), 3);
}

#[tokio::test]
async fn create_validates_its_arguments_and_capacity() {
    let h = Harness::start_with(DriverOptions {
        capacity_bytes: Some(3 * GIB),
        ..DriverOptions::default()
    })
    .await;
    let mut controller = h.controller().await;

    let cases = [
        (create_request("", GIB), Code::InvalidArgument),
        (
            v1::CreateVolumeRequest {
                volume_capabilities: vec![],
                ..create_request("no-caps", GIB)
            },
            Code::InvalidArgument,
        ),
        (
            v1::CreateVolumeRequest {
                capacity_range: Some(v1::CapacityRange {
                    required_bytes: 2 * GIB,
                    limit_bytes: GIB,
                }),
                ..create_request("inverted", GIB)
            },
            Code::OutOfRange,
        ),
        (create_request("too-big", 4 * GIB), Code::ResourceExhausted),
    ];
    for (request, expected) in cases {
        let name = request.name.clone();
        let err = controller.create_volume(request).await.unwrap_err();
        assert_eq!(err.code(), expected, "request {name:?}: {err}");
    }

    controller
        .create_volume(create_request("fits", 2 * GIB))
        .await
        .unwrap();
    let capacity = controller
        .get_capacity(v1::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(capacity.available_capacity, GIB);
    let err = controller
        .create_volume(create_request("no-room", 2 * GIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn list_volumes_pages_with_tokens_that_survive_deletion() {
    let h = Harness::start().await;
    let mut controller = h.controller().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let volume = controller
            .create_volume(create_request(&format!("pvc-{i}"), GIB))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        ids.push(volume.volume_id);
    }

    let first = controller
        .list_volumes(v1::ListVolumesRequest {
            max_entries: 2,
            starting_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.entries.len(), 2);
    assert!(!first.next_token.is_empty());

    // Deleting the last listed volume must not break the token.
    let last_listed = first.entries[1].volume.as_ref().unwrap().volume_id.clone();
    controller
        .delete_volume(delete_request(&last_listed))
        .await
        .unwrap();

    let rest = controller
        .list_volumes(v1::ListVolumesRequest {
            max_entries: 0,
            starting_token: first.next_token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest.entries.len(), 3);
    assert!(rest.next_token.is_empty());
    let mut seen: Vec<String> = first
        .entries
        .iter()
        .chain(&rest.entries)
        .map(|e| e.volume.as_ref().unwrap().volume_id.clone())
        .collect();
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids);

    let bad = controller
        .list_volumes(v1::ListVolumesRequest {
            max_entries: 0,
            starting_token: "invalid-token".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::Aborted);
}

#[tokio::test]
async fn topology_is_advertised_and_put_on_volumes() {
    let h = Harness::start_with(DriverOptions {
        topology: Some(("topology.test/zone".into(), "z1".into())),
        ..DriverOptions::default()
    })
    .await;
    let caps = h
        .identity()
        .await
        .get_plugin_capabilities(v1::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let services: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(v1::plugin_capability::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    assert!(
        services.contains(
            &(v1::plugin_capability::service::Type::VolumeAccessibilityConstraints as i32)
        )
    );

    let mut controller = h.controller().await;
    let volume = controller
        .create_volume(create_request("pvc-topo", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(volume.accessible_topology.len(), 1);
    assert_eq!(
        volume.accessible_topology[0]
            .segments
            .get("topology.test/zone"),
        Some(&"z1".to_string())
    );

    let mut elsewhere = create_request("pvc-elsewhere", GIB);
    elsewhere.accessibility_requirements = Some(v1::TopologyRequirement {
        requisite: vec![v1::Topology {
            segments: [("topology.test/zone".to_string(), "z2".to_string())].into(),
        }],
        preferred: vec![],
    });
    let err = controller.create_volume(elsewhere).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn a_lost_volume_leaves_without_a_delete_volume_and_ids_can_carry_names() {
    let h = Harness::start_with(DriverOptions {
        volume_id_with_name: true,
        ..DriverOptions::default()
    })
    .await;
    let mut controller = h.controller().await;
    let volume = controller
        .create_volume(create_request("pvc-lost", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(
        volume.volume_id.starts_with("vol-") && volume.volume_id.ends_with("-pvc-lost"),
        "{}",
        volume.volume_id
    );

    h.control.lose_volume(&volume.volume_id).await.unwrap();
    let listed = controller
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty(), "{listed:?}");
    let ledger = h.control.ledger().await.unwrap();
    assert!(ledger.volumes.is_empty());
    assert_eq!(ledger.operations_of("DeleteVolume").count(), 0);
    assert_eq!(ledger.call_count("DeleteVolume"), 0);

    // Losing what is not there is refused, and says which volume.
    let err = h.control.lose_volume(&volume.volume_id).await.unwrap_err();
    assert!(err.to_string().contains(&volume.volume_id), "{err}");
}
