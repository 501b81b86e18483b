//! The upstream conformance suite (`csi-sanity`, built by `testbed/build.sh`) passes its
//! Identity and Controller tests against this driver. This is what lets other tests trust the
//! driver as a stand-in for a real CSI backend.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use csi_test_driver::process::DriverOptions;
use support::Harness;

/// Upper bound for one csi-sanity run (it normally takes about a second).
const SANITY_TIMEOUT: Duration = Duration::from_secs(300);

fn csi_sanity_binary() -> PathBuf {
    let Some(dir) = std::env::var_os("CSI_TESTBED_BIN") else {
        panic!(
            "CSI_TESTBED_BIN is not set: run this test through `make test`, which builds the \
             test bed (testbed/build.sh, including csi-sanity) and exports CSI_TESTBED_BIN"
        );
    };
    let binary = PathBuf::from(dir).join("csi-sanity");
    assert!(
        binary.is_file(),
        "{} does not exist: rebuild the test bed with testbed/build.sh",
        binary.display()
    );
    binary
}

/// Runs csi-sanity (Node Service excluded: this driver has no node plugin) and returns its
/// pass and fail counts, failing the test with the full output when it does not succeed.
/// `focus`, when given, runs only the specs whose description matches it.
async fn run_csi_sanity(options: DriverOptions, focus: Option<&str>) -> (u32, u32) {
    let binary = csi_sanity_binary();
    let h = Harness::start_with(options).await;
    // csi-sanity insists on creating these directories itself.
    let mount_dir = h.dir.path().join("mnt");
    let staging_dir = h.dir.path().join("stg");

    let mut command = tokio::process::Command::new(&binary);
    if let Some(focus) = focus {
        command.arg(format!("--ginkgo.focus={focus}"));
    }
    let run = command
        .arg(format!("--csi.endpoint={}", h.driver.endpoint.display()))
        .arg(format!("--csi.mountdir={}", mount_dir.display()))
        .arg(format!("--csi.stagingdir={}", staging_dir.display()))
        .arg("--ginkgo.skip=Node Service")
        .arg("--ginkgo.no-color")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(SANITY_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| panic!("csi-sanity did not finish within {SANITY_TIMEOUT:?}"))
        .expect("csi-sanity runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "csi-sanity failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let counts = summary(&stdout).unwrap_or_else(|| panic!("no csi-sanity summary in:\n{stdout}"));
    eprintln!("csi-sanity: {} passed, {} failed", counts.0, counts.1);
    counts
}

/// Parses ginkgo's `SUCCESS! -- 33 Passed | 0 Failed | 1 Pending | 58 Skipped`.
fn summary(output: &str) -> Option<(u32, u32)> {
    let line = output.lines().find(|l| l.contains(" Passed | "))?;
    let count = |label: &str| -> Option<u32> {
        let before = line.split(label).next()?;
        before.split_whitespace().last()?.parse().ok()
    };
    Some((count(" Passed")?, count(" Failed")?))
}

#[tokio::test]
async fn csi_sanity_passes_with_default_capabilities() {
    let (passed, failed) = run_csi_sanity(DriverOptions::default(), None).await;
    assert_eq!(failed, 0);
    assert!(passed >= 15, "only {passed} csi-sanity specs ran");
}

#[tokio::test]
async fn csi_sanity_passes_with_every_capability_and_topology() {
    let (passed, failed) = run_csi_sanity(
        DriverOptions {
            topology: Some(("topology.test.csi.example.com/zone".into(), "z1".into())),
            capabilities: [
                "+PUBLISH_UNPUBLISH_VOLUME",
                "+CLONE_VOLUME",
                "+PUBLISH_READONLY",
                "+LIST_VOLUMES_PUBLISHED_NODES",
                "+GET_VOLUME",
                "+SINGLE_NODE_MULTI_WRITER",
                "+MODIFY_VOLUME",
                "+CREATE_DELETE_SNAPSHOT",
                "+LIST_SNAPSHOTS",
            ]
            .map(String::from)
            .to_vec(),
            ..DriverOptions::default()
        },
        None,
    )
    .await;
    assert_eq!(failed, 0);
    // Publishing, cloning, snapshot and the lifecycle specs run only with these capabilities.
    assert!(passed >= 55, "only {passed} csi-sanity specs ran");
}

#[tokio::test]
async fn csi_sanity_snapshot_specs_pass() {
    let options = DriverOptions {
        capabilities: ["+CREATE_DELETE_SNAPSHOT", "+LIST_SNAPSHOTS"]
            .map(String::from)
            .to_vec(),
        ..DriverOptions::default()
    };
    let (passed, failed) = run_csi_sanity(options, Some("Snapshot")).await;
    assert_eq!(failed, 0);
    // CreateSnapshot, DeleteSnapshot, ListSnapshots and restore from a snapshot: without the
    // capabilities these specs are skipped and the count drops to zero.
    assert!(passed >= 15, "only {passed} snapshot specs ran");
}

#[test]
fn summary_line_is_parsed() {
    assert_eq!(
        summary("x\nSUCCESS! -- 33 Passed | 0 Failed | 1 Pending | 58 Skipped\n"),
        Some((33, 0))
    );
    assert_eq!(
        summary("FAIL! -- 0 Passed | 68 Failed | 1 Pending | 23 Skipped"),
        Some((0, 68))
    );
}
