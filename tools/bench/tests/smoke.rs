//! The benchmark end to end at its smallest, so that CI notices when it breaks:
//! one burst of 20 claims at raised limits, each contender (upstream, ours,
//! ours with the intent policies, the floor) once, on a control plane the benchmark starts for itself. Not the
//! shared one of `make test`: the benchmark makes the provisioner identity a
//! cluster admin, which would void the RBAC the other tests run under.
//!
//! Needs what `make test` builds first: the test bed (testbed/build.sh) and the
//! workspace's binaries (`cargo build --workspace --bins`), which are taken from
//! the directory of this package's own binary.

mod common;

const CLAIMS: u64 = 20;

#[test]
fn a_small_burst_runs_every_contender_end_to_end() {
    let claims = CLAIMS.to_string();
    let run = common::run(
        "smoke",
        "quick",
        &[
            "--only",
            "burst-raised-0ms",
            "--rounds",
            "1",
            "--claims",
            &claims,
        ],
    );
    let (stdout, results) = (&run.stdout, &run.results);
    assert!(
        stdout.contains("| `burst-raised-0ms` | ours+policies | provisioning: volumes/s"),
        "no targets table in the report:\n{stdout}"
    );

    for r in results {
        let who = r["who"].as_str().unwrap_or("?");
        for field in ["claims", "provisioned", "bound"] {
            assert_eq!(r[field].as_u64(), Some(CLAIMS), "{who}: {field}");
        }
        assert!(
            r["all_gone_secs"].as_f64().is_some(),
            "{who}: not every volume was deleted"
        );
        // Upstream sometimes calls CreateVolume again for a claim it already
        // provisioned (a stale cache, its #1469 family; CreateVolume is
        // idempotent by name): at least once per claim for it, exactly once
        // for ours and the floor.
        let creates = r["csi_calls"]["CreateVolume"].as_f64();
        if who == "upstream" {
            assert!(creates >= Some(CLAIMS as f64), "{who}: {creates:?}");
        } else {
            assert_eq!(creates, Some(CLAIMS as f64), "{who}");
        }
        assert!(
            r["csi_calls"]["DeleteVolume"].as_f64() >= Some(CLAIMS as f64),
            "{who}: {}",
            r["csi_calls"]
        );
        assert_eq!(
            r["api_provision"]["create persistentvolumes"].as_f64(),
            Some(CLAIMS as f64),
            "{who}: the API server's own request count: {}",
            r["api_provision"]
        );
        assert!(
            r["peak_rss_kib"].as_u64() > Some(0),
            "{who}: no RSS read from /proc"
        );
        assert!(
            r["control_plane_cpu_provision_secs"].as_f64() > Some(0.0),
            "{who}: no control-plane CPU read from /proc"
        );
    }
    // With the control plane's intent, the claims get no write of ours.
    let with_policies = results
        .iter()
        .find(|r| r["who"] == "ours+policies")
        .expect("ours+policies ran");
    assert_eq!(
        with_policies["api_provision"]["patch persistentvolumeclaims"].as_f64(),
        None,
        "no write to the claims: {}",
        with_policies["api_provision"]
    );
    // Our sidecar's own metrics, scraped at the end of each phase: one
    // CreateVolume per claim in the provisioning phase's stage histogram.
    for who in ["ours", "ours+policies"] {
        let r = results.iter().find(|r| r["who"] == who).expect("ran");
        let provision = r["sidecar_metrics"]["provision"]
            .as_array()
            .unwrap_or_else(|| panic!("{who}: no provisioning metrics: {r}"));
        let creates = provision.iter().find(|s| {
            s["name"] == "csi_provisioner_provision_stage_seconds_count"
                && s["labels"]["stage"] == "create_volume"
        });
        assert_eq!(
            creates.and_then(|s| s["value"].as_f64()),
            Some(CLAIMS as f64),
            "{who}: {provision:?}"
        );
        assert_eq!(r["worker_threads"].as_u64(), Some(100), "{who}");
    }
    assert!(
        stdout.contains("Sidecar metrics, `burst-raised-0ms`"),
        "no sidecar metrics table in the report:\n{stdout}"
    );
    let ours = results
        .iter()
        .find(|r| r["who"] == "ours")
        .expect("ours ran");
    assert_eq!(
        ours["csi_calls"]["DeleteVolume"].as_f64(),
        Some(CLAIMS as f64),
        "ours deletes each volume once"
    );
}
