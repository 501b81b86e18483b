//! The HTTP endpoint as Prometheus and the kubelet see it: after a claim is
//! provisioned and deleted, `/metrics` shows upstream's metric names and labels
//! with values that moved (cross-checked against the driver's ledger);
//! `--metrics-path` moves the handler; `/healthz/leader-election` answers with
//! `--leader-election`; `--metrics-address` is the deprecated alias. The
//! `workqueue_*` series of the `claims` and `volumes` queues count reconciles,
//! their durations and the retries of failed ones.

mod support;

use std::collections::BTreeMap;

use csi_provisioner::kube::lease::lease_name;
use csi_test_driver::code::GrpcCode;
use csi_test_driver::control::Fault;
use support::{DEADLINE, Rig, free_address, get, wait_for, wait_serving};

const OPENMETRICS_ACCEPT: &str =
    "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// One sample of the text exposition: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn parse(body: &str) -> Vec<Sample> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("`series value`");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once('=').expect("label=value");
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            Sample {
                name: name.to_string(),
                labels,
                value: value.parse().unwrap_or(f64::NAN),
            }
        })
        .collect()
}

/// The value of the one sample named `name` whose labels include `labels`; 0 when absent.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert!(
        found.len() <= 1,
        "{name}{labels:?} matches several series: {found:?}"
    );
    found.first().map_or(0.0, |s| s.value)
}

/// Whether a sample named `name` with (at least) `labels` is exported.
fn exported(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> bool {
    samples.iter().any(|s| {
        s.name == name
            && labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
    })
}

/// client-go's work-queue histogram buckets: 1 µs to 1000 s, ×10 each.
const WORKQUEUE_BUCKETS: [f64; 11] = [
    1e-6,
    1e-5,
    1e-4,
    1e-3,
    1e-2,
    1e-1,
    1.0,
    10.0,
    100.0,
    1000.0,
    f64::INFINITY,
];

#[tokio::test]
async fn metrics_move_after_a_claim_is_provisioned_and_deleted() {
    let address = free_address();
    let rig = Rig::builder("metrics")
        .sidecar_args(&[&format!("--http-endpoint={address}")])
        .start()
        .await;
    wait_serving(&rig, &address, "/metrics").await;

    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    rig.delete_claim("data").await;
    rig.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;

    let ledger = rig.ledger().await;
    let ok_calls = |method: &str| {
        ledger
            .operations_of(method)
            .filter(|op| op.code == GrpcCode::Ok)
            .count() as f64
    };
    let driver = rig.driver_name.as_str();
    let class = rig.class.as_str();
    // The controller metrics are counted once the PV is saved / deleted; the PV
    // being gone means the delete was counted, but scrape until both settle.
    let reply = wait_for("the counters to move", DEADLINE, || async {
        let r = get(&address, "/metrics", None)
            .await
            .map_err(|e| e.to_string())?;
        let samples = parse(&r.body);
        let moved = value(
            &samples,
            "controller_persistentvolume_delete_total",
            &[("class", class)],
        ) >= 1.0
            && value(
                &samples,
                "controller_persistentvolumeclaim_provision_total",
                &[("class", class)],
            ) >= 1.0;
        if moved { Ok(r) } else { Err(r.body) }
    })
    .await;

    // Upstream's exposition format: Prometheus text 0.0.4, counters typed by their `_total` name.
    assert!(
        reply.content_type.starts_with("text/plain") && reply.content_type.contains("0.0.4"),
        "{}",
        reply.content_type
    );
    assert!(
        reply
            .body
            .contains("# TYPE controller_persistentvolumeclaim_provision_total counter"),
        "{}",
        reply.body
    );
    assert!(
        reply
            .body
            .contains("# TYPE csi_sidecar_operations_seconds histogram"),
        "{}",
        reply.body
    );
    let samples = parse(&reply.body);

    // csi_sidecar_operations_seconds: one observation per call the driver saw answer OK.
    for method in ["CreateVolume", "DeleteVolume"] {
        let labels = [
            ("driver_name", driver),
            ("method_name", &*format!("/csi.v1.Controller/{method}")),
            ("grpc_status_code", "OK"),
        ];
        let count = value(&samples, "csi_sidecar_operations_seconds_count", &labels);
        assert!(count >= 1.0, "{method}: {count}\n{}", reply.body);
        assert_eq!(count, ok_calls(method), "{method}: one sample per OK call");
        assert!(value(&samples, "csi_sidecar_operations_seconds_sum", &labels) > 0.0);
        // Upstream's buckets: 0.1 s to 600 s, then +Inf holding every call.
        let bounds: Vec<f64> = samples
            .iter()
            .filter(|s| {
                s.name == "csi_sidecar_operations_seconds_bucket"
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| {
                let le: f64 = s.labels["le"].parse().expect("numeric le");
                if le.is_infinite() {
                    assert_eq!(
                        s.value, count,
                        "{method}: the +Inf bucket counts every call"
                    );
                }
                le
            })
            .collect();
        let upstream = [
            0.1,
            0.25,
            0.5,
            1.0,
            2.5,
            5.0,
            10.0,
            15.0,
            25.0,
            50.0,
            120.0,
            300.0,
            600.0,
            f64::INFINITY,
        ];
        assert_eq!(bounds, upstream, "{method}: bucket bounds");
    }
    // Start-up calls are measured too. As upstream, the driver's name labels the
    // calls made once it is known; Probe and GetPluginInfo come before that.
    for (method, driver_label) in [
        ("/csi.v1.Identity/GetPluginInfo", ""),
        ("/csi.v1.Identity/GetPluginCapabilities", driver),
        ("/csi.v1.Controller/ControllerGetCapabilities", driver),
    ] {
        let labels = [
            ("driver_name", driver_label),
            ("method_name", method),
            ("grpc_status_code", "OK"),
        ];
        assert_eq!(
            value(&samples, "csi_sidecar_operations_seconds_count", &labels),
            1.0,
            "{method}\n{}",
            reply.body
        );
    }

    // The controller metrics, labelled by class (and data source kind, "" here).
    let claim_labels = [("class", class), ("source", "")];
    assert_eq!(
        value(
            &samples,
            "controller_persistentvolumeclaim_provision_total",
            &claim_labels
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "controller_persistentvolumeclaim_provision_duration_seconds_count",
            &claim_labels
        ),
        1.0
    );
    assert!(
        value(
            &samples,
            "controller_persistentvolumeclaim_provision_duration_seconds_sum",
            &claim_labels
        ) > 0.0
    );
    assert_eq!(
        value(
            &samples,
            "controller_persistentvolumeclaim_provision_failed_total",
            &claim_labels
        ),
        0.0
    );
    assert_eq!(
        value(
            &samples,
            "controller_persistentvolume_delete_total",
            &[("class", class)]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "controller_persistentvolume_delete_duration_seconds_count",
            &[("class", class)]
        ),
        1.0
    );

    // The work queues, under upstream's queue names. The sidecar watches every
    // claim and PV of the shared cluster, so other tests' objects count too:
    // only lower bounds hold.
    for queue in ["claims", "volumes"] {
        let q = [("name", queue)];
        let adds = value(&samples, "workqueue_adds_total", &q);
        let done = value(&samples, "workqueue_work_duration_seconds_count", &q);
        assert!(adds >= 1.0, "{queue}: adds {adds}\n{}", reply.body);
        assert!(
            done >= 1.0 && done <= adds,
            "{queue}: {done} reconciles done of {adds} started"
        );
        assert!(value(&samples, "workqueue_work_duration_seconds_sum", &q) > 0.0);
        let bounds: Vec<f64> = samples
            .iter()
            .filter(|s| {
                s.name == "workqueue_work_duration_seconds_bucket"
                    && s.labels.get("name").map(String::as_str) == Some(queue)
            })
            .map(|s| s.labels["le"].parse().expect("numeric le"))
            .collect();
        assert_eq!(bounds, WORKQUEUE_BUCKETS, "{queue}: bucket bounds");
        for gauge in [
            "workqueue_unfinished_work_seconds",
            "workqueue_longest_running_processor_seconds",
        ] {
            assert!(
                exported(&samples, gauge, &q),
                "{gauge}{q:?}\n{}",
                reply.body
            );
            assert!(value(&samples, gauge, &q) >= 0.0);
        }
        assert!(exported(&samples, "workqueue_retries_total", &q));
    }
    assert!(
        reply.body.contains("# TYPE workqueue_adds_total counter"),
        "{}",
        reply.body
    );
    // Not measurable through kube-runtime's controller (docs/compatibility.md).
    assert!(!reply.body.contains("workqueue_depth"));
    assert!(!reply.body.contains("workqueue_queue_duration_seconds"));

    // Process metrics, as client_golang exports them.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = value(&samples, "process_start_time_seconds", &[]);
    assert!(
        start > now - 3600.0 && start <= now + 1.0,
        "start {start}, now {now}"
    );
    assert!(value(&samples, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(value(&samples, "process_open_fds", &[]) >= 3.0);
    assert!(value(&samples, "process_max_fds", &[]) >= value(&samples, "process_open_fds", &[]));
    assert!(value(&samples, "process_cpu_seconds_total", &[]) > 0.0);

    // promhttp's handler metrics: earlier scrapes counted by status code (each
    // is counted once answered), this one in flight while it is encoded.
    let scraped = value(
        &samples,
        "promhttp_metric_handler_requests_total",
        &[("code", "200")],
    );
    assert!(scraped >= 1.0, "earlier scrapes were counted: {scraped}");
    for code in ["500", "503"] {
        assert_eq!(
            value(
                &samples,
                "promhttp_metric_handler_requests_total",
                &[("code", code)]
            ),
            0.0
        );
    }
    assert_eq!(
        value(&samples, "promhttp_metric_handler_requests_in_flight", &[]),
        1.0
    );
    let again = parse(
        &get(&address, "/metrics", None)
            .await
            .expect("scraping")
            .body,
    );
    assert_eq!(
        value(
            &again,
            "promhttp_metric_handler_requests_total",
            &[("code", "200")]
        ),
        scraped + 1.0,
        "the scrape before this one was counted"
    );

    // Asked for OpenMetrics (as Prometheus does), the same series come in that format.
    let om = get(&address, "/metrics", Some(OPENMETRICS_ACCEPT))
        .await
        .expect("scraping with OpenMetrics");
    assert_eq!(om.status, 200);
    assert!(
        om.content_type.starts_with("application/openmetrics-text"),
        "{}",
        om.content_type
    );
    assert!(om.body.trim_end().ends_with("# EOF"), "{}", om.body);
    assert_eq!(
        value(
            &parse(&om.body),
            "controller_persistentvolumeclaim_provision_total",
            &claim_labels
        ),
        1.0
    );
    rig.cleanup().await;
}

#[tokio::test]
async fn failed_provisioning_attempts_are_work_queue_retries() {
    let address = free_address();
    let rig = Rig::builder("metrics-wq")
        .sidecar_args(&[
            &format!("--http-endpoint={address}"),
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
        ])
        .start()
        .await;
    wait_serving(&rig, &address, "/metrics").await;
    rig.control
        .set_fault(
            "CreateVolume",
            Fault::Error {
                code: GrpcCode::Internal,
                count: 2,
                message: Some("injected for the test".into()),
            },
        )
        .await
        .unwrap();
    rig.create_claim(rig.claim("data")).await;
    rig.wait_bound("data").await;

    let failed = rig
        .ledger()
        .await
        .operations_of("CreateVolume")
        .filter(|op| op.code != GrpcCode::Ok)
        .count() as f64;
    assert_eq!(failed, 2.0);
    let samples = parse(&get(&address, "/metrics", None).await.unwrap().body);
    let claims = [("name", "claims")];
    let retries = value(&samples, "workqueue_retries_total", &claims);
    // Each failed attempt went through the error policy and was retried: a
    // reconcile of its own. (Other tests' claims may add to both.)
    assert!(
        retries >= failed,
        "{retries} retries, {failed} failed calls"
    );
    assert!(value(&samples, "workqueue_adds_total", &claims) >= failed + 1.0);
    assert!(value(&samples, "workqueue_work_duration_seconds_count", &claims) >= failed + 1.0);
    rig.cleanup().await;
}

#[tokio::test]
async fn custom_metrics_path_and_leader_election_health() {
    let address = free_address();
    let mut rig = Rig::builder("metrics-le").without_sidecar().start().await;
    rig.args.extend([
        format!("--http-endpoint={address}"),
        "--metrics-path=/custom".to_string(),
        "--leader-election".to_string(),
        format!("--leader-election-namespace={}", rig.ns.name),
    ]);
    rig.start_sidecar();

    let lease = lease_name(&rig.driver_name);
    let metrics = wait_for("this replica to report leadership", DEADLINE, || async {
        let r = get(&address, "/custom", None)
            .await
            .map_err(|e| format!("{e}\n{}", rig.sidecar_log()))?;
        let led = value(
            &parse(&r.body),
            "leader_election_master_status",
            &[("name", &lease)],
        );
        if r.status == 200 && led == 1.0 {
            Ok(r)
        } else {
            Err(format!("HTTP {}: {}", r.status, r.body))
        }
    })
    .await;
    assert!(metrics.body.contains("csi_sidecar_operations_seconds"));

    let default_path = get(&address, "/metrics", None).await.unwrap();
    assert_eq!(default_path.status, 404, "{}", default_path.body);
    let health = get(&address, "/healthz/leader-election", None)
        .await
        .unwrap();
    assert_eq!(health.status, 200, "{}", health.body);
    assert_eq!(health.body.trim(), "ok");
    rig.cleanup().await;
}

#[tokio::test]
async fn deprecated_metrics_address_serves_metrics_but_no_leader_health() {
    let address = free_address();
    let mut rig = Rig::builder("metrics-addr").without_sidecar().start().await;
    rig.args.extend([
        format!("--metrics-address={address}"),
        "--leader-election".to_string(),
        format!("--leader-election-namespace={}", rig.ns.name),
    ]);
    rig.start_sidecar();
    let metrics = wait_serving(&rig, &address, "/metrics").await;
    assert!(metrics.body.contains("process_start_time_seconds"));
    // Upstream registers the leader-election check only with --http-endpoint.
    let health = get(&address, "/healthz/leader-election", None)
        .await
        .unwrap();
    assert_eq!(health.status, 404, "{}", health.body);
    rig.cleanup().await;
}

/// Our own signals move with a claim: while its `CreateVolume` hangs it holds
/// the intent and waits, and its check is timed; once bound neither gauge
/// counts it, and each step of its provisioning was timed once or more.
#[tokio::test]
async fn our_signals_show_a_claim_holding_the_intent_and_the_steps_it_took() {
    let address = free_address();
    let rig = Rig::builder("metrics-ours")
        .sidecar_args(&[&format!("--http-endpoint={address}")])
        .start()
        .await;
    wait_serving(&rig, &address, "/metrics").await;
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    rig.create_claim(rig.claim("slow")).await;
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .unwrap();
    wait_for("the gauges to show the claim", DEADLINE, || async {
        let samples = parse(&get(&address, "/metrics", None).await.unwrap().body);
        let holding = value(&samples, "csi_provisioner_claims_holding_intent", &[]);
        let waiting = value(&samples, "csi_provisioner_claims_waiting", &[]);
        let oldest = value(
            &samples,
            "csi_provisioner_oldest_waiting_claim_age_seconds",
            &[],
        );
        if holding == 1.0 && waiting == 1.0 && oldest >= 0.0 {
            Ok(())
        } else {
            Err((holding, waiting, oldest))
        }
    })
    .await;
    rig.control.release("CreateVolume").await.unwrap();
    rig.wait_bound("slow").await;
    wait_for("the gauges to let the claim go", DEADLINE, || async {
        let samples = parse(&get(&address, "/metrics", None).await.unwrap().body);
        let waiting = value(&samples, "csi_provisioner_claims_waiting", &[]);
        if waiting == 0.0 { Ok(()) } else { Err(waiting) }
    })
    .await;
    let samples = parse(&get(&address, "/metrics", None).await.unwrap().body);
    for stage in ["check", "create_volume", "save_pv"] {
        assert!(
            value(
                &samples,
                "csi_provisioner_provision_stage_seconds_count",
                &[("stage", stage)]
            ) >= 1.0,
            "{stage} not timed"
        );
    }
    rig.cleanup().await;
}
