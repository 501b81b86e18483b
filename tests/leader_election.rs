//! Leader election: two of our replicas and one upstream replica contend for
//! the same Lease (upstream's name and namespace rules), exactly one acts at a
//! time, and killing the leader hands over with provisioning continuing and
//! no volume created twice.

mod support;

use std::process::Command;

use csi_provisioner::kube::lease::lease_name;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use support::{ChildProcess, DEADLINE, Rig, cluster, wait_for, workspace_bin};

const LEASE_FLAGS: [&str; 4] = [
    "--leader-election",
    "--leader-election-lease-duration=4s",
    "--leader-election-renew-deadline=3s",
    "--leader-election-retry-period=1s",
];

async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .expect("reading the lease")?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// The event source of the claim's `ProvisioningSucceeded`: upstream's and
/// ours are both `<driver>_<host>_<uuid>`, a new UUID per process.
/// The event source a replica of ours records with (logged when it starts).
fn component_in(log: &str) -> Option<String> {
    let line = log.lines().find(|l| l.contains("recording events"))?;
    let value = line.split("component=").nth(1)?.split_whitespace().next()?;
    Some(value.trim_matches('"').to_string())
}

async fn succeeded_by(rig: &Rig, claim: &str) -> String {
    let event = rig
        .wait_claim_event(claim, "ProvisioningSucceeded", "")
        .await;
    event.source.and_then(|s| s.component).unwrap_or_default()
}

#[tokio::test]
async fn one_leader_among_ours_and_upstream_and_handover_without_duplicates() {
    let cluster = cluster().await;
    let mut rig = Rig::builder("le").without_sidecar().start().await;
    let ns_flag = format!("--leader-election-namespace={}", rig.ns.name);
    let lease = lease_name(&rig.driver_name);
    let leases: Api<Lease> = Api::namespaced(rig.client.clone(), &rig.ns.name);

    // Replica A (ours) starts first and must win the empty Lease.
    rig.args.extend(LEASE_FLAGS.iter().map(|s| s.to_string()));
    rig.args.push(ns_flag.clone());
    rig.start_sidecar();
    let first = wait_for("a leader", DEADLINE, || async {
        holder(&leases, &lease).await.ok_or("no holder")
    })
    .await;

    // Replica B (ours) and replica C (upstream Go sidecar) join as standbys.
    let mut ours_b =
        ChildProcess::spawn(Command::new(workspace_bin("csi-provisioner")).args(&rig.args));
    let mut upstream = ChildProcess::spawn(
        Command::new(cluster.bin("csi-provisioner-upstream"))
            .arg(format!("--csi-address={}", rig.driver.csi_address()))
            .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
            .args(LEASE_FLAGS)
            .arg(&ns_flag)
            .args(["--timeout=10s", "-v=4"]),
    );

    for i in 0..3 {
        rig.create_claim(rig.claim(&format!("a{i}"))).await;
    }
    for i in 0..3 {
        rig.wait_bound(&format!("a{i}")).await;
    }
    assert_eq!(
        holder(&leases, &lease).await.as_deref(),
        Some(first.as_str()),
        "leadership is stable while A lives"
    );
    assert!(
        ours_b.is_running() && upstream.is_running(),
        "standbys keep running"
    );
    assert!(
        !ours_b.log_contents().contains("provisioned"),
        "a standby of ours acted:\n{}",
        ours_b.log_contents()
    );
    let leader_component = component_in(&rig.sidecar_log()).expect("A logs its event source");
    assert!(leader_component.starts_with(&format!("{}_", rig.driver_name)));
    for i in 0..3 {
        assert_eq!(
            succeeded_by(&rig, &format!("a{i}")).await,
            leader_component,
            "a{i} provisioned by the leader"
        );
    }

    // Kill the leader: someone else takes the Lease within its duration and
    // provisioning goes on.
    rig.kill_sidecar();
    let second = wait_for("a new leader", DEADLINE, || async {
        match holder(&leases, &lease).await {
            Some(h) if h != first => Ok(h),
            other => Err(other),
        }
    })
    .await;
    for i in 0..3 {
        rig.create_claim(rig.claim(&format!("b{i}"))).await;
    }
    for i in 0..3 {
        rig.wait_bound(&format!("b{i}")).await;
    }

    let ledger = rig.ledger().await;
    assert_eq!(
        ledger.volumes.len(),
        6,
        "one backend volume per claim: {:?}",
        ledger.volumes.keys()
    );
    let mut names: Vec<_> = ledger.volumes.values().map(|v| v.name.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 6, "no claim got two volumes");
    let creates_ok = ledger
        .operations_of("CreateVolume")
        .filter(|op| op.created)
        .count();
    assert_eq!(creates_ok, 6, "each volume created exactly once");

    // The survivor holding the Lease did all the work of phase b; the other
    // one never acted. Our identities are `<host>_<hex>`, upstream's the host name.
    let upstream_leads = !second.contains('_');
    let ours_b_component = component_in(&ours_b.log_contents());
    for i in 0..3 {
        let by = succeeded_by(&rig, &format!("b{i}")).await;
        assert!(by.starts_with(&rig.driver_name), "{by}");
        assert_eq!(
            Some(&by) == ours_b_component.as_ref(),
            !upstream_leads,
            "b{i} provisioned by {by}, leader {second}"
        );
    }
    if upstream_leads {
        assert!(
            !ours_b.log_contents().contains("provisioned"),
            "our standby acted:\n{}",
            ours_b.log_contents()
        );
    }
    ours_b.kill();
    upstream.kill();
    rig.cleanup().await;
}

#[tokio::test]
async fn a_leader_that_loses_the_lease_stops_and_exits() {
    let mut rig = Rig::builder("le-lost").without_sidecar().start().await;
    rig.args.extend(LEASE_FLAGS.iter().map(|s| s.to_string()));
    rig.args
        .push(format!("--leader-election-namespace={}", rig.ns.name));
    rig.start_sidecar();
    let lease = lease_name(&rig.driver_name);
    let leases: Api<Lease> = Api::namespaced(rig.client.clone(), &rig.ns.name);
    wait_for("a leader", DEADLINE, || async {
        holder(&leases, &lease).await.ok_or("no holder")
    })
    .await;

    // Someone else takes the Lease over (as a replica would after a partition).
    let steal = serde_json::json!({"spec": {
        "holderIdentity": "thief",
        "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()),
        "leaseDurationSeconds": 60,
    }});
    leases
        .patch(
            &lease,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&steal),
        )
        .await
        .expect("stealing the lease");
    let sidecar = rig.sidecar.as_mut().expect("sidecar running");
    let status = sidecar.wait_exit(DEADLINE).await;
    assert!(
        !status.success(),
        "a replica that lost the Lease exits non-zero: {status:?}"
    );
    assert!(
        sidecar.log_contents().contains("leader election lost"),
        "{}",
        sidecar.log_contents()
    );

    // And it did not act after losing: a claim created now stays unprovisioned.
    rig.create_claim(rig.claim("late")).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(rig.ledger().await.call_count("CreateVolume"), 0);
    rig.cleanup().await;
}

#[tokio::test]
async fn sigterm_releases_the_lease_for_a_standby() {
    let mut rig = Rig::builder("le-term").without_sidecar().start().await;
    rig.args.extend(LEASE_FLAGS.iter().map(|s| s.to_string()));
    rig.args
        .push(format!("--leader-election-namespace={}", rig.ns.name));
    rig.start_sidecar();
    let lease = lease_name(&rig.driver_name);
    let leases: Api<Lease> = Api::namespaced(rig.client.clone(), &rig.ns.name);
    wait_for("a leader", DEADLINE, || async {
        holder(&leases, &lease).await.ok_or("no holder")
    })
    .await;

    let sidecar = rig.sidecar.as_mut().expect("sidecar running");
    sidecar.terminate();
    let status = sidecar.wait_exit(DEADLINE).await;
    assert!(
        status.success(),
        "a clean stop exits 0: {status:?}\n{}",
        sidecar.log_contents()
    );
    assert_eq!(
        holder(&leases, &lease).await,
        None,
        "the Lease was given up on the way out"
    );
    rig.cleanup().await;
}
