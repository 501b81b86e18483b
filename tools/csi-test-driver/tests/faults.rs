//! Faults injected through the control socket do what tests rely on them to do.

mod support;

use std::time::{Duration, Instant};

use csi_proto::v1;
use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;
use support::{GIB, Harness, create_request, delete_request};
use tonic::Code;

#[tokio::test]
async fn error_for_next_n_calls_fails_exactly_n_calls_without_creating() {
    let h = Harness::start().await;
    h.control
        .set_fault(
            "CreateVolume",
            Fault::Error {
                code: GrpcCode::Unavailable,
                count: 2,
                message: None,
            },
        )
        .await
        .unwrap();
    let mut controller = h.controller().await;
    for _ in 0..2 {
        let err = controller
            .create_volume(create_request("pvc-n", GIB))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
    }
    controller
        .create_volume(create_request("pvc-n", GIB))
        .await
        .unwrap();

    let ledger = h.control.ledger().await.unwrap();
    assert_eq!(ledger.volumes.len(), 1);
    let ops: Vec<(GrpcCode, bool)> = ledger
        .operations_of("CreateVolume")
        .map(|op| (op.code, op.injected))
        .collect();
    assert_eq!(
        ops,
        vec![
            (GrpcCode::Unavailable, true),
            (GrpcCode::Unavailable, true),
            (GrpcCode::Ok, false)
        ]
    );
}

#[tokio::test]
async fn create_then_deadline_exceeded_leaves_the_volume_in_the_ledger() {
    let h = Harness::start().await;
    h.control
        .set_fault(
            "CreateVolume",
            Fault::CreateThenDeadlineExceeded { count: 1 },
        )
        .await
        .unwrap();
    let mut controller = h.controller().await;
    let err = controller
        .create_volume(create_request("pvc-late", GIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);

    let ledger = h.driver.ledger_on_disk().unwrap();
    let volume = ledger.volume_by_name("pvc-late").expect("volume exists");
    let op = ledger.operations_of("CreateVolume").next().unwrap();
    assert!(op.created && op.injected);
    assert_eq!(op.code, GrpcCode::DeadlineExceeded);

    // The retry finds the same volume: the caller's idempotent retry converges.
    let retried = controller
        .create_volume(create_request("pvc-late", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(retried.volume_id, volume.volume_id);
}

#[tokio::test]
async fn a_hung_call_completes_after_release_even_if_the_caller_gave_up() {
    let h = Harness::start().await;
    h.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    let mut controller = h.controller().await;

    let mut request = tonic::Request::new(create_request("pvc-hang", GIB));
    request.set_timeout(Duration::from_millis(200));
    let err = controller.create_volume(request).await.unwrap_err();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err}"
    );
    h.control
        .wait_for_hung("CreateVolume", 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(h.control.ledger().await.unwrap().volumes.is_empty());

    h.control.release("CreateVolume").await.unwrap();
    // The backend finishes the work it accepted.
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.control.ledger().await.unwrap().volumes.is_empty() {
        assert!(
            Instant::now() < deadline,
            "released call never created the volume"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(h.control.stats().await.unwrap().hung.is_empty());
    // And new calls no longer hang.
    controller
        .create_volume(create_request("pvc-after", GIB))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_second_call_for_a_volume_in_progress_is_aborted_until_the_first_is_done() {
    let h = Harness::start().await;
    h.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    let mut controller = h.controller().await;
    let mut first = tonic::Request::new(create_request("pvc-busy", GIB));
    first.set_timeout(Duration::from_millis(200));
    controller.create_volume(first).await.unwrap_err();
    h.control
        .wait_for_hung("CreateVolume", 1, Duration::from_secs(5))
        .await
        .unwrap();

    // Same name while the first call is still being worked on: ABORTED, not hung.
    let err = controller
        .create_volume(create_request("pvc-busy", GIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{err}");
    // Another name is not blocked by it (it hangs like any call, so give up quickly).
    let mut other = tonic::Request::new(create_request("pvc-other", GIB));
    other.set_timeout(Duration::from_millis(200));
    assert_ne!(
        controller.create_volume(other).await.unwrap_err().code(),
        Code::Aborted
    );

    h.control.release("CreateVolume").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match controller
            .create_volume(create_request("pvc-busy", GIB))
            .await
        {
            Ok(resp) => {
                let ledger = h.control.ledger().await.unwrap();
                let vol = ledger
                    .volume_by_name("pvc-busy")
                    .expect("created by the first call");
                assert_eq!(
                    resp.into_inner().volume.unwrap().volume_id,
                    vol.volume_id,
                    "the same volume"
                );
                break;
            }
            Err(e) if e.code() == Code::Aborted && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn latency_delays_calls_and_clear_faults_removes_it() {
    let h = Harness::start().await;
    h.control
        .set_fault("DeleteVolume", Fault::Latency { ms: 300 })
        .await
        .unwrap();
    let mut controller = h.controller().await;
    let started = Instant::now();
    controller
        .delete_volume(delete_request("vol-x"))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));

    h.control.clear_faults().await.unwrap();
    let started = Instant::now();
    controller
        .delete_volume(delete_request("vol-x"))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_millis(300));
}

#[tokio::test]
async fn probability_one_always_fails_and_probe_follows_set_ready() {
    let h = Harness::start().await;
    h.control
        .set_fault(
            "GetCapacity",
            Fault::ErrorProbability {
                code: GrpcCode::Aborted,
                probability: 1.0,
            },
        )
        .await
        .unwrap();
    let mut controller = h.controller().await;
    for _ in 0..3 {
        let err = controller
            .get_capacity(v1::GetCapacityRequest::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Aborted);
    }

    let mut identity = h.identity().await;
    let ready = |r: v1::ProbeResponse| r.ready;
    assert_eq!(
        ready(
            identity
                .probe(v1::ProbeRequest {})
                .await
                .unwrap()
                .into_inner()
        ),
        Some(true)
    );
    h.control.set_ready(false).await.unwrap();
    assert_eq!(
        ready(
            identity
                .probe(v1::ProbeRequest {})
                .await
                .unwrap()
                .into_inner()
        ),
        Some(false)
    );

    let refused = h
        .control
        .set_fault("NoSuchMethod", Fault::Hang)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("unknown method"), "{refused}");
}

#[tokio::test]
async fn the_ledger_survives_a_crash_and_restart() {
    let mut h = Harness::start().await;
    let mut controller = h.controller().await;
    let volume = controller
        .create_volume(create_request("pvc-durable", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();

    h.control.crash().await.unwrap();
    let status = h.driver.wait_exit(Duration::from_secs(5)).await.unwrap();
    assert_eq!(status.code(), Some(137));
    // Read straight from the file while the driver is down.
    let on_disk = h.driver.ledger_on_disk().unwrap();
    assert!(on_disk.volumes.contains_key(&volume.volume_id));

    h.driver.restart().await.unwrap();
    let ledger = h.control.ledger().await.unwrap();
    assert_eq!(ledger.starts, 2);
    assert_eq!(ledger.volumes[&volume.volume_id].name, "pvc-durable");

    let mut controller = h.controller().await;
    let again = controller
        .create_volume(create_request("pvc-durable", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, volume.volume_id);
    let other = controller
        .create_volume(create_request("pvc-new", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_ne!(other.volume_id, volume.volume_id, "ids are never reused");
}
