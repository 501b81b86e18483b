//! `csi-provisioner check`, run as a process against the fault-injecting test driver (one
//! fault per rule, and each test asserts that exactly that rule's check fails) and against
//! Kubernetes' Go mock driver. After every run the driver's ledger (or `ListVolumes`) shows
//! no `check-` volume left, and volumes not named `check-` are never touched. None of these
//! needs the control plane.

mod support;

use std::collections::BTreeMap;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use csi_proto::v1;
use csi_test_driver::code::GrpcCode;
use csi_test_driver::control::{Client as DriverControl, Fault};
use csi_test_driver::process::{DriverOptions, DriverProcess, binary_path};
use tokio::process::Command;

use support::{ChildProcess, DEADLINE, testbed_bin, unique_name, wait_for, wait_for_socket};

const CHECK_IDS: [&str; 12] = [
    "probe",
    "plugin-capabilities",
    "controller-capabilities",
    "create-volume",
    "create-idempotent",
    "create-other-parameters",
    "capacity",
    "delete-unknown",
    "delete-volume",
    "delete-twice",
    "capabilities-consistent",
    "timeouts",
];

/// `--capacity` of every run: small, so sizes in reports are easy to read.
const CAPACITY: i64 = 1 << 20;

struct Driver {
    process: DriverProcess,
    control: DriverControl,
    _dir: tempfile::TempDir,
}

impl Driver {
    async fn start(adjust: impl FnOnce(&mut DriverOptions)) -> Driver {
        let dir = tempfile::Builder::new()
            .prefix("check-")
            .tempdir()
            .expect("temp dir");
        let mut options = DriverOptions {
            drivername: format!("{}.csi.test", unique_name("check")),
            ..DriverOptions::default()
        };
        adjust(&mut options);
        let binary = binary_path().expect(
            "csi-test-driver binary: run `cargo build --workspace --bins` (make test does)",
        );
        let process = DriverProcess::start(&binary, dir.path(), &options)
            .await
            .expect("starting the test driver");
        let control = process.control().await.expect("driver control socket");
        Driver {
            process,
            control,
            _dir: dir,
        }
    }

    async fn fault(&self, method: &str, fault: Fault) {
        self.control
            .set_fault(method, fault)
            .await
            .unwrap_or_else(|e| panic!("set_fault {method}: {e}"));
    }

    /// Names of the volumes the driver holds now.
    async fn live_names(&self) -> Vec<String> {
        let ledger = self.control.ledger().await.expect("ledger");
        ledger.volumes.values().map(|v| v.name.clone()).collect()
    }

    /// Names of the volumes created by `CreateVolume` calls so far.
    async fn created_names(&self) -> Vec<String> {
        let ledger = self.control.ledger().await.expect("ledger");
        ledger
            .operations
            .iter()
            .filter(|op| op.method == "CreateVolume" && op.created)
            .filter_map(|op| op.name.clone())
            .collect()
    }

    /// The run created `check-` volumes, and none of them is left.
    /// Waits for the create first: a driver finishes a call its caller gave up on.
    async fn assert_cleaned_up(&self) {
        wait_for(
            "the driver to have created a check- volume",
            DEADLINE,
            || async {
                let created = self.created_names().await;
                if created.iter().any(|n| n.starts_with("check-")) {
                    Ok(())
                } else {
                    Err(format!("created: {created:?}"))
                }
            },
        )
        .await;
        let live: Vec<String> = self
            .live_names()
            .await
            .into_iter()
            .filter(|n| n.starts_with("check-"))
            .collect();
        assert!(live.is_empty(), "check- volumes left: {live:?}");
    }
}

struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "report is not JSON ({e}):\n{}\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// Result of each check by id, from the JSON report.
    fn results(&self) -> BTreeMap<String, String> {
        let json = self.json();
        let checks = json["checks"].as_array().expect("checks array");
        let ids: Vec<&str> = checks.iter().map(|c| c["id"].as_str().unwrap()).collect();
        assert_eq!(ids, CHECK_IDS, "every check, in order");
        checks
            .iter()
            .map(|c| {
                (
                    c["id"].as_str().unwrap().to_string(),
                    c["result"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn with(&self, result: &str) -> Vec<String> {
        self.results()
            .into_iter()
            .filter(|(_, r)| r == result)
            .map(|(id, _)| id)
            .collect()
    }

    fn detail(&self, id: &str) -> String {
        let json = self.json();
        json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .and_then(|c| c["detail"].as_str())
            .unwrap_or_default()
            .to_string()
    }

    /// Exactly `ids` failed, and the exit status says so.
    fn assert_failed(&self, ids: &[&str]) {
        assert_eq!(self.with("fail"), ids, "{}\n{}", self.stdout, self.stderr);
        let want = if ids.is_empty() { 0 } else { 1 };
        assert_eq!(self.status.code(), Some(want), "{}", self.stderr);
    }
}

fn check_command(address: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"));
    command
        .arg("check")
        .arg(format!("--csi-address={address}"))
        .arg(format!("--capacity={CAPACITY}"))
        .args(extra)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

async fn check(address: &str, extra: &[&str]) -> Run {
    let out = tokio::time::timeout(DEADLINE, check_command(address, extra).output())
        .await
        .expect("check finished in time")
        .expect("running csi-provisioner check");
    Run {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn check_json(driver: &Driver, extra: &[&str]) -> Run {
    let mut args = vec!["--output=json"];
    args.extend_from_slice(extra);
    check(&driver.process.csi_address(), &args).await
}

fn mount_request(name: &str) -> v1::CreateVolumeRequest {
    v1::CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![v1::VolumeCapability {
            access_type: Some(v1::volume_capability::AccessType::Mount(Default::default())),
            access_mode: Some(v1::volume_capability::AccessMode {
                mode: v1::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn a_healthy_driver_passes_every_check_and_keeps_its_other_volumes() {
    let driver = Driver::start(|_| {}).await;
    // A volume that is not the check's: it must be there, untouched, afterwards.
    let channel = csi_proto::connect_unix(&driver.process.endpoint)
        .await
        .expect("connecting to the driver");
    let mine = v1::controller_client::ControllerClient::new(channel)
        .create_volume(mount_request("pvc-not-the-checks"))
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("volume");

    let run = check(&driver.process.csi_address(), &[]).await;
    assert_eq!(run.status.code(), Some(0), "{}\n{}", run.stdout, run.stderr);
    for id in CHECK_IDS {
        assert!(
            run.stdout
                .lines()
                .any(|l| l.starts_with("PASS") && l.contains(id)),
            "{id} not passed:\n{}",
            run.stdout
        );
    }
    assert!(
        run.stdout
            .contains("Result: 12 checks, 12 passed, 0 failed, 0 skipped."),
        "{}",
        run.stdout
    );
    driver.assert_cleaned_up().await;
    let ledger = driver.control.ledger().await.unwrap();
    assert!(ledger.volumes.contains_key(&mine.volume_id), "{ledger:?}");
    let touched: Vec<_> = ledger
        .operations
        .iter()
        .filter(|op| op.volume_id.as_deref() == Some(mine.volume_id.as_str()))
        .collect();
    assert_eq!(touched.len(), 1, "only our own CreateVolume: {touched:?}");

    // The same run as JSON: every check passed, the volumes it made are listed as deleted.
    let run = check_json(&driver, &[]).await;
    run.assert_failed(&[]);
    assert_eq!(run.with("pass").len(), CHECK_IDS.len());
    let json = run.json();
    assert_eq!(json["version"], 1);
    assert_eq!(json["summary"]["passed"], 12);
    let created = json["volumes"]["created"].as_array().unwrap();
    assert_eq!(created.len(), 2, "{json}");
    for v in created {
        assert!(v["name"].as_str().unwrap().starts_with("check-"), "{v}");
        assert_eq!(v["deleted"], true, "{v}");
    }
    assert_eq!(json["volumes"]["left"].as_array().unwrap().len(), 0);
    assert_eq!(
        run.detail("capacity"),
        format!(
            "{CAPACITY} bytes for at least {CAPACITY} bytes; {CAPACITY} bytes for {CAPACITY}..{} bytes",
            2 * CAPACITY
        )
    );
    driver.assert_cleaned_up().await;
}

#[tokio::test]
async fn a_create_that_is_not_idempotent_fails_create_idempotent() {
    let driver = Driver::start(|_| {}).await;
    driver
        .fault("CreateVolume", Fault::CreateNotIdempotent)
        .await;
    let run = check_json(&driver, &[]).await;
    run.assert_failed(&["create-idempotent"]);
    assert!(
        run.detail("create-idempotent")
            .contains("answered another volume"),
        "{}",
        run.detail("create-idempotent")
    );
    // Both volumes of the same name were deleted.
    driver.assert_cleaned_up().await;
    assert_eq!(
        run.json()["volumes"]["created"].as_array().unwrap().len(),
        3
    );
}

#[tokio::test]
async fn a_create_that_ignores_other_parameters_fails_create_other_parameters() {
    let driver = Driver::start(|_| {}).await;
    driver
        .fault("CreateVolume", Fault::CreateIgnoresParameters)
        .await;
    let run = check_json(&driver, &[]).await;
    run.assert_failed(&["create-other-parameters"]);
    assert!(
        run.detail("create-other-parameters")
            .contains("instead of ALREADY_EXISTS"),
        "{}",
        run.detail("create-other-parameters")
    );
    driver.assert_cleaned_up().await;
}

#[tokio::test]
async fn parameters_given_on_the_command_line_are_sent() {
    let driver = Driver::start(|_| {}).await;
    let run = check_json(
        &driver,
        &["--parameter=type=fast", "--other-parameter=type=slow"],
    )
    .await;
    run.assert_failed(&[]);
    let ledger = driver.control.ledger().await.unwrap();
    let first = ledger
        .operations
        .iter()
        .find(|op| op.method == "CreateVolume" && op.created)
        .expect("a create");
    assert!(first.name.as_deref().unwrap().starts_with("check-"));
    // The ledger keeps only live volumes' parameters: look at the answer instead. The
    // driver compared {type: slow} with {type: fast} and said ALREADY_EXISTS.
    let refused = ledger
        .operations
        .iter()
        .find(|op| op.method == "CreateVolume" && op.code == GrpcCode::AlreadyExists)
        .expect("an ALREADY_EXISTS");
    assert!(
        refused.message.contains("different parameters"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_capacity_outside_the_range_fails_capacity() {
    let driver = Driver::start(|_| {}).await;
    // The first create reports less than asked.
    driver
        .fault(
            "CreateVolume",
            Fault::CreateReportsCapacity {
                bytes: CAPACITY / 2,
                count: 1,
            },
        )
        .await;
    let run = check_json(&driver, &[]).await;
    run.assert_failed(&["capacity"]);
    assert!(
        run.detail("capacity").contains(&format!(
            "{} bytes for at least {CAPACITY} bytes: less than asked",
            CAPACITY / 2
        )),
        "{}",
        run.detail("capacity")
    );
    driver.assert_cleaned_up().await;

    // The third successful create (the one with a limit) reports more than the limit.
    driver
        .fault(
            "CreateVolume",
            Fault::CreateReportsCapacity {
                bytes: 3 * CAPACITY,
                count: 3,
            },
        )
        .await;
    let run = check_json(&driver, &[]).await;
    run.assert_failed(&["capacity"]);
    assert!(
        run.detail("capacity").contains("more than limit_bytes"),
        "{}",
        run.detail("capacity")
    );
    driver.assert_cleaned_up().await;
}

#[tokio::test]
async fn a_capacity_of_zero_is_unknown_and_passes() {
    let driver = Driver::start(|_| {}).await;
    driver
        .fault(
            "CreateVolume",
            Fault::CreateReportsCapacity {
                bytes: 0,
                count: 100,
            },
        )
        .await;
    let run = check_json(&driver, &[]).await;
    run.assert_failed(&[]);
    assert!(
        run.detail("capacity").contains("0 (unknown"),
        "{}",
        run.detail("capacity")
    );
    driver.assert_cleaned_up().await;
}

#[tokio::test]
async fn delete_of_an_unknown_id_answering_not_found_fails_delete_unknown() {
    let driver = Driver::start(|_| {}).await;
    driver
        .fault("DeleteVolume", Fault::DeleteUnknownNotFound)
        .await;
    let run = check_json(&driver, &[]).await;
    run.assert_failed(&["delete-unknown"]);
    assert!(
        run.detail("delete-unknown").contains("answered NOT_FOUND"),
        "{}",
        run.detail("delete-unknown")
    );
    driver.assert_cleaned_up().await;
}

#[tokio::test]
async fn a_second_delete_answering_not_found_fails_delete_twice() {
    let driver = Driver::start(|_| {}).await;
    driver
        .fault("DeleteVolume", Fault::DeleteAgainNotFound)
        .await;
    let run = check_json(&driver, &[]).await;
    run.assert_failed(&["delete-twice"]);
    driver.assert_cleaned_up().await;
}

#[tokio::test]
async fn create_volume_unimplemented_while_advertised_fails_capabilities_consistent() {
    let driver = Driver::start(|_| {}).await;
    driver
        .fault(
            "CreateVolume",
            Fault::Error {
                code: GrpcCode::Unimplemented,
                count: 1,
                message: None,
            },
        )
        .await;
    let run = check_json(&driver, &[]).await;
    run.assert_failed(&["capabilities-consistent"]);
    assert!(
        run.detail("capabilities-consistent")
            .contains("CREATE_DELETE_VOLUME is advertised but CreateVolume answers UNIMPLEMENTED"),
        "{}",
        run.detail("capabilities-consistent")
    );
    let results = run.results();
    assert_eq!(results["create-volume"], "skip");
    assert_eq!(results["create-idempotent"], "skip");
    // Nothing was created, nothing is left.
    assert!(driver.created_names().await.is_empty());
}

#[tokio::test]
async fn a_driver_without_create_delete_volume_fails_controller_capabilities_only() {
    let driver = Driver::start(|o| o.capabilities = vec!["LIST_VOLUMES".into()]).await;
    let run = check_json(&driver, &[]).await;
    run.assert_failed(&["controller-capabilities"]);
    let results = run.results();
    assert_eq!(results["capabilities-consistent"], "pass", "{}", run.stdout);
    assert_eq!(results["create-volume"], "skip");
    assert!(driver.created_names().await.is_empty());
}

#[tokio::test]
async fn get_plugin_capabilities_failing_fails_plugin_capabilities() {
    let driver = Driver::start(|_| {}).await;
    driver
        .fault(
            "GetPluginCapabilities",
            Fault::Error {
                code: GrpcCode::Internal,
                count: 1,
                message: None,
            },
        )
        .await;
    let run = check_json(&driver, &[]).await;
    run.assert_failed(&["plugin-capabilities"]);
    driver.assert_cleaned_up().await;
}

#[tokio::test]
async fn a_create_slower_than_the_timeout_fails_timeouts_and_its_volume_is_still_deleted() {
    let driver = Driver::start(|_| {}).await;
    driver
        .fault("CreateVolume", Fault::Latency { ms: 1500 })
        .await;
    let run = check_json(&driver, &["--timeout=1s"]).await;
    run.assert_failed(&["timeouts"]);
    assert!(
        run.detail("timeouts")
            .contains("not answered within 1s: CreateVolume"),
        "{}",
        run.detail("timeouts")
    );
    assert_eq!(run.results()["create-volume"], "skip");
    // The driver made the volume after the check stopped waiting; the cleanup asked again
    // for that name, learnt its id and deleted it.
    driver.assert_cleaned_up().await;
    let json = run.json();
    assert_eq!(json["volumes"]["created"][0]["deleted"], true, "{json}");
}

#[tokio::test]
async fn interrupted_while_a_create_is_in_flight_it_still_deletes_that_volume() {
    let driver = Driver::start(|_| {}).await;
    driver
        .fault("CreateVolume", Fault::Latency { ms: 3000 })
        .await;
    let child = check_command(&driver.process.csi_address(), &["--output=json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting csi-provisioner check");
    // The CreateVolume has reached the driver (and waits in its latency).
    wait_for("CreateVolume to reach the driver", DEADLINE, || async {
        let stats = driver.control.stats().await.map_err(|e| e.to_string())?;
        match stats.calls.get("CreateVolume") {
            Some(n) if *n >= 1 => Ok(()),
            _ => Err(format!("{:?}", stats.calls)),
        }
    })
    .await;
    let pid = child.id().expect("pid").to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("check exited in time")
        .expect("waiting for check");
    let run = Run {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("interrupted"), "{}", run.stderr);
    let json = run.json();
    assert_eq!(json["interrupted"], true);
    assert_eq!(run.results()["create-volume"], "skip");
    assert_eq!(run.detail("create-volume"), "not run: interrupted");
    driver.assert_cleaned_up().await;
    assert_eq!(json["volumes"]["created"][0]["deleted"], true, "{json}");
}

#[tokio::test]
async fn a_closed_stdout_ends_check_quietly() {
    let driver = Driver::start(|_| {}).await;
    let mut child = check_command(&driver.process.csi_address(), &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting csi-provisioner check");
    // The reader goes away before the report is written (`check ... | head -0`).
    drop(child.stdout.take());
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("check exited in time")
        .expect("waiting for check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    driver.assert_cleaned_up().await;
}

#[tokio::test]
async fn usage_errors_exit_2_with_one_line_and_help_exits_0() {
    for args in [
        vec!["check"],
        vec!["check", "--csi-address=/x.sock", "--output=yaml"],
        vec!["check", "--csi-address=tcp://1.2.3.4:5"],
        vec!["check", "--csi-address=/x.sock", "--parameter=novalue"],
        vec!["check", "--csi-address=/x.sock", "--no-such-flag"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
            .args(&args)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .args(["check", "--help"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--csi-address"), "{help}");
    assert!(help.contains("check-"), "{help}");

    // Nobody listening: exit 1, one line naming the socket.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let run = check(&format!("unix://{}", socket.display()), &["--timeout=1s"]).await;
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert_eq!(run.stderr.trim_end().lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(&socket.display().to_string()),
        "{}",
        run.stderr
    );
}

/// Kubernetes' mock driver (`testbed/cmd/csi-mock-driver`) answers a same-name create with
/// other parameters with the existing volume: it compares only the capacity
/// (k8s.io/kubernetes test/e2e/storage/drivers/csi-test/mock/service/controller.go,
/// CreateVolume). Every other rule holds, and its own volumes are left alone.
#[tokio::test]
async fn the_go_mock_driver_passes_all_but_create_other_parameters() {
    let dir = tempfile::tempdir().expect("socket dir");
    let socket = dir.path().join("csi.sock");
    let mut mock = ChildProcess::spawn(
        std::process::Command::new(testbed_bin("csi-mock-driver"))
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--drivername={}.csi.invalid", unique_name("check"))),
    );
    wait_for_socket(&mut mock, &socket, Duration::from_secs(30)).await;
    let address = format!("unix://{}", socket.display());
    let run = check(&address, &["--output=json"]).await;
    run.assert_failed(&["create-other-parameters"]);
    assert!(
        run.detail("create-other-parameters")
            .contains("answered OK with the existing volume"),
        "{}",
        run.detail("create-other-parameters")
    );
    assert_eq!(run.with("skip"), Vec::<String>::new());

    let channel = csi_proto::connect_unix(&socket).await.expect("connect");
    let listed = v1::controller_client::ControllerClient::new(channel)
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .expect("ListVolumes")
        .into_inner();
    let names: Vec<String> = listed
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref())
        .map(|v| {
            v.volume_context
                .get("name")
                .cloned()
                .unwrap_or_else(|| v.volume_id.clone())
        })
        .collect();
    // The mock's own three volumes, and nothing of the check's.
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().all(|n| !n.contains("check-")), "{names:?}");
    let json = run.json();
    let created = json["volumes"]["created"].as_array().unwrap();
    assert_eq!(created.len(), 2, "{json}");
    assert!(created.iter().all(|v| v["deleted"] == true), "{json}");
    assert!(mock.is_running(), "the mock driver exited");
}
