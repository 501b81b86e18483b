//! Named scenarios: the upstream failures from the field, replayed step by step against a
//! sidecar, then judged by the same checker as the random runs.
//!
//! - `issue-486` (kubernetes-csi/external-provisioner#486): the sidecar dies while its
//!   `CreateVolume` is in flight, the claim is deleted meanwhile, the backend finishes the
//!   call. Nothing durable says a volume may exist: upstream leaks it.
//! - `issue-1469` (kubernetes-csi/external-provisioner#1469): a second sync of a claim (the
//!   claim was updated during the first) runs while the sidecar's cache misses the
//!   just-created PV; by the time its `CreateVolume`
//!   reaches the backend, the claim was deleted and its volume too, so the backend creates a
//!   new one; saving the PV answers `AlreadyExists` (the old PV is still Terminating), which
//!   upstream takes for success: the new volume leaks.
//! - `issue-1469-pv-gone`: the same late sync, but the deleted PV's last finalizer goes at
//!   once, so by the time the late sync acts the PV is gone too (a read of the PV answers
//!   404): nothing says "already provisioned" but the claim itself. Saving the new volume's
//!   PV then succeeds; upstream's late `CreateVolume` gives the claim a second volume. No
//!   volume may be created.
//! - `restart-during-cleanup` (found by our soak): a claim deleted during provisioning is
//!   being cleaned up; the sidecar dies while its `DeleteVolume` is in flight, the backend
//!   finishes it. The restarted sidecar must not create the volume again to learn a handle.
//! - `time-travel` (the stale-state bugs of other controllers, after Sieve): a second
//!   kube-apiserver on the same etcd is cut off from etcd (its watch cache frozen) while a
//!   claim is provisioned, bound and deleted through the first one; the sidecar restarts
//!   onto the second, whose cache still shows the claim as it was before it was bound and
//!   knows nothing of its PV since deleted. No volume may be created, nothing deleted; then
//!   the partition heals. Needs the test bed's directory (a second server is started from
//!   its command line); no Lease (a consistent read cannot be answered there meanwhile).
//!
//! Each runs in policy mode too (`policies`): the claim's intent then comes from admission,
//! and our sidecar checks its copy of the claim in a freshness round instead of writing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_test_driver::control::Fault as DriverFault;
use kube::Api;
use kube_fault_proxy::{Fault, Rule};
use tokio_util::sync::CancellationToken;

use crate::check::{CLAIM_KIND, DataSource, SNAPSHOT_KIND, SourceKind};
use crate::intent::IntentTally;
use crate::report::{Mode, Report};
use crate::run::{
    Book, Fate, Record, claim_body_from, create_claim, delete_later, faults_off, settle,
};
use crate::world::{Sidecar, StageOptions, Testbed, World};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Issue486,
    Issue1469,
    Issue1469PvGone,
    RestartDuringCleanup,
    TimeTravel,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Issue486 => "issue-486",
            Scenario::Issue1469 => "issue-1469",
            Scenario::Issue1469PvGone => "issue-1469-pv-gone",
            Scenario::RestartDuringCleanup => "restart-during-cleanup",
            Scenario::TimeTravel => "time-travel",
        }
    }
}

impl std::str::FromStr for Scenario {
    type Err = String;
    fn from_str(s: &str) -> Result<Scenario, String> {
        match s {
            "issue-486" => Ok(Scenario::Issue486),
            "issue-1469" => Ok(Scenario::Issue1469),
            "issue-1469-pv-gone" => Ok(Scenario::Issue1469PvGone),
            "restart-during-cleanup" => Ok(Scenario::RestartDuringCleanup),
            "time-travel" => Ok(Scenario::TimeTravel),
            other => Err(format!(
                "unknown scenario {other:?} (issue-486, issue-1469, issue-1469-pv-gone, \
                 restart-during-cleanup, time-travel)"
            )),
        }
    }
}

fn err(what: &str) -> impl Fn(csi_test_driver::control::ClientError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Runs `scenario` against `sidecar`; with `policies`, our sidecar in policy mode (upstream's
/// never: it runs as without, and the report says so).
pub async fn run(
    testbed: &Testbed,
    scenario: Scenario,
    sidecar: Sidecar,
    seed: u64,
    keep_dir: bool,
    policies: bool,
) -> Result<Report, String> {
    run_with_env(
        testbed,
        scenario,
        sidecar,
        seed,
        keep_dir,
        policies,
        Vec::new(),
    )
    .await
}

/// [`run`], the sidecar started with this extra environment.
pub async fn run_with_env(
    testbed: &Testbed,
    scenario: Scenario,
    sidecar: Sidecar,
    seed: u64,
    keep_dir: bool,
    policies: bool,
    sidecar_env: Vec<(String, String)>,
) -> Result<Report, String> {
    let started = Instant::now();
    let mode = Mode::of(policies, sidecar);
    let world = World::setup(
        testbed,
        &StageOptions {
            sidecar,
            replicas: 1,
            nodes: 0,
            seed,
            // Long enough that the slow calls of issue-1469 are not cut short.
            leader_election: scenario != Scenario::TimeTravel,
            csi_timeout: "30s".into(),
            extra_args: Vec::new(),
            // The World owns the scenario's second server (started and stopped with the stage).
            time_travel: scenario == Scenario::TimeTravel,
            sidecar_env,
            keep_dir,
            policies: mode == Mode::Policies,
        },
    )
    .await?;
    let background = CancellationToken::new();
    let leader = world.track_leader(background.clone());
    let book = Arc::new(Book::default());
    let intents = watch_intents(&world, background.clone());
    let world = Arc::new(tokio::sync::Mutex::new(world));
    // Time travel: the claim's volume name, and when the claim was gone for good.
    let mut late: Option<(String, u64)> = None;
    let steps = match scenario {
        Scenario::Issue486 => issue_486(&world, &book).await,
        Scenario::Issue1469 => issue_1469(&world, &book, false).await,
        Scenario::Issue1469PvGone => issue_1469(&world, &book, true).await,
        Scenario::RestartDuringCleanup => restart_during_cleanup(&world, &book).await,
        Scenario::TimeTravel => time_travel(&world, &book, &mut late).await,
    };
    faults_off(&world).await;
    let (invariants, snap) = settle(&world, &book, Duration::from_secs(60)).await;
    background.cancel();
    let w = Arc::try_unwrap(world)
        .map_err(|_| "world still shared".to_string())?
        .into_inner();
    let mut report = Report::new(scenario.name(), seed);
    report.sidecar = sidecar;
    report.mode = mode;
    report.replicas = 1;
    report.actions = steps?;
    report.fill_from(&w, &leader, &snap);
    report.workload = vec![
        ("claims created", book.created().len() as u64),
        (
            "claims deleted",
            book.created().iter().filter(|c| c.deleted).count() as u64,
        ),
    ];
    report.add_intents(&intents.counts(&snap));
    report.timing = vec![("total", started.elapsed())];
    report.invariants = invariants;
    if let Some((volume, gone_at)) = &late {
        report
            .invariants
            .push(created_after_gone(&snap.ledger, volume, *gone_at));
    }
    report.dir = keep_dir.then(|| w.dir.clone());
    w.teardown().await;
    Ok(report)
}

/// Tallies where the claims' intent came from, from a watch of the scenario's claims.
fn watch_intents(world: &World, stop: CancellationToken) -> Arc<IntentTally> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let tally = Arc::new(IntentTally::default());
    let stream = watcher(world.claims(), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let t = tally.clone();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        loop {
            tokio::select! {
                next = stream.next() => match next {
                    Some(Ok(claim)) => t.see(&claim),
                    Some(Err(_)) => {}
                    None => return,
                },
                _ = stop.cancelled() => return,
            }
        }
    });
    tally
}

async fn create(
    world: &Arc<tokio::sync::Mutex<World>>,
    book: &Arc<Book>,
    name: &str,
) -> Result<String, String> {
    create_from(world, book, name, None).await
}

/// Creates a claim of the Immediate class, restored or cloned from `source` if given, and
/// enters it in the book; returns its UID.
pub(crate) async fn create_from(
    world: &Arc<tokio::sync::Mutex<World>>,
    book: &Arc<Book>,
    name: &str,
    source: Option<DataSource>,
) -> Result<String, String> {
    let (api, class) = {
        let w = world.lock().await;
        (w.claims(), w.class_immediate.clone())
    };
    let from = source.as_ref().map(|s| {
        let kind = match s.kind {
            SourceKind::Snapshot => SNAPSHOT_KIND,
            SourceKind::Claim => CLAIM_KIND,
        };
        (kind, s.name.as_str())
    });
    let uid = create_claim(&api, &claim_body_from(name, &class, None, from)).await?;
    book.add(Record {
        name: name.into(),
        uid: uid.clone(),
        fate: Fate::Keep,
        delete_scheduled: false,
        deleted: false,
        source,
    });
    Ok(uid)
}

async fn delete_now(world: &Arc<tokio::sync::Mutex<World>>, book: &Arc<Book>, name: &str) {
    let api = world.lock().await.claims();
    if book.schedule(name) {
        delete_later(api, book.clone(), name.into(), Duration::ZERO);
    }
    while book.pending() > 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until a replica holds the Lease and has had time to fill its caches.
pub(crate) async fn wait_for_leader(world: &Arc<tokio::sync::Mutex<World>>) -> Result<(), String> {
    let (leases, name) = {
        let w = world.lock().await;
        (w.leases(), crate::world::lease_name(&w.driver_name))
    };
    poll("a leader", Duration::from_secs(60), || {
        let leases = leases.clone();
        let name = name.clone();
        async move {
            let lease = leases.get_opt(&name).await.ok()??;
            lease.spec?.holder_identity.filter(|h| !h.is_empty())
        }
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

pub(crate) async fn poll<T, F, Fut>(what: &str, within: Duration, mut f: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() >= until {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn issue_486(
    world: &Arc<tokio::sync::Mutex<World>>,
    book: &Arc<Book>,
) -> Result<BTreeMap<&'static str, u64>, String> {
    let control = world
        .lock()
        .await
        .driver
        .control()
        .await
        .map_err(|e| e.to_string())?;
    control
        .set_fault("CreateVolume", DriverFault::Hang)
        .await
        .map_err(err("arming the hang"))?;
    let uid = create(world, book, "c-486").await?;
    control
        .wait_for_hung("CreateVolume", 1, Duration::from_secs(90))
        .await
        .map_err(err("waiting for CreateVolume to be in flight"))?;
    world.lock().await.replicas[0].kill_and_hold();
    tokio::time::sleep(Duration::from_secs(1)).await;
    delete_now(world, book, "c-486").await;
    // Upstream's claim is gone at once; ours stays Terminating on the intent finalizer.
    tokio::time::sleep(Duration::from_secs(2)).await;
    control
        .release("CreateVolume")
        .await
        .map_err(err("releasing CreateVolume"))?;
    control
        .clear_faults()
        .await
        .map_err(err("clearing faults"))?;
    let pv_name = format!("pvc-{uid}");
    poll(
        "the backend to finish the orphaned CreateVolume",
        Duration::from_secs(30),
        || {
            let control = &control;
            let pv_name = pv_name.clone();
            async move {
                let ledger = control.ledger().await.ok()?;
                ledger
                    .operations_of("CreateVolume")
                    .any(|op| op.created && op.name.as_deref() == Some(pv_name.as_str()))
                    .then_some(())
            }
        },
    )
    .await?;
    world.lock().await.replicas[0].resume();
    Ok(BTreeMap::from([
        ("driver: CreateVolume held in flight", 1),
        ("sidecar: SIGKILL while CreateVolume in flight", 1),
        ("claim deleted while the sidecar was down", 1),
        ("backend finished the orphaned CreateVolume", 1),
        ("sidecar restarted", 1),
    ]))
}

async fn issue_1469(
    world: &Arc<tokio::sync::Mutex<World>>,
    book: &Arc<Book>,
    pv_gone: bool,
) -> Result<BTreeMap<&'static str, u64>, String> {
    let control = {
        let w = world.lock().await;
        // The cache misses the PV the first sync just created...
        w.proxy.add_rule(
            Rule::new(Fault::HideNew { ms: 3000 })
                .verbs(&["watch"])
                .resources(&["persistentvolumes"]),
        );
        // ...and the API server is slow to drop the deleted PV's last finalizer (or, with
        // `pv_gone`, drops it at once: the PV is gone before the late sync acts).
        if !pv_gone {
            w.proxy.add_rule(
                Rule::new(Fault::Delay { ms: 12000 })
                    .verbs(&["patch", "update"])
                    .resources(&["persistentvolumes"]),
            );
        }
        w.driver.control().await.map_err(|e| e.to_string())?
    };
    // A backend slow enough that the claim's deletion overtakes the second sync.
    control
        .set_fault("CreateVolume", DriverFault::Latency { ms: 8000 })
        .await
        .map_err(err("arming the latency"))?;
    wait_for_leader(world).await?;
    create(world, book, "c-1469").await?;
    let api = world.lock().await.claims();
    // While the first sync's CreateVolume is in flight, the claim is updated (a label, as a
    // user or another controller might): that queues a second sync of the same claim.
    poll("the first CreateVolume", Duration::from_secs(90), || {
        let control = &control;
        async move {
            let stats = control.stats().await.ok()?;
            (stats.calls.get("CreateVolume").copied().unwrap_or(0) >= 1).then_some(())
        }
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    api.patch(
        "c-1469",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await
    .map_err(|e| format!("labelling the claim: {e}"))?;
    poll("the claim to be Bound", Duration::from_secs(90), || {
        let api = api.clone();
        async move {
            let c = api.get("c-1469").await.ok()?;
            (c.status.and_then(|s| s.phase).as_deref() == Some("Bound")).then_some(())
        }
    })
    .await?;
    delete_now(world, book, "c-1469").await;
    // Let the late sync play out: its CreateVolume lands ~8 s after the first one returned,
    // the deleted PV's finalizer is released ~12 s after the volume path deleted it.
    tokio::time::sleep(Duration::from_secs(25)).await;
    Ok(BTreeMap::from([
        ("claim labelled during CreateVolume (second sync)", 1),
        ("watch: new PV hidden 3 s", 1),
        ("api: PV patch/update slowed 12 s", u64::from(!pv_gone)),
        ("driver: CreateVolume slowed 8 s", 1),
        ("claim deleted as soon as Bound", 1),
    ]))
}

async fn restart_during_cleanup(
    world: &Arc<tokio::sync::Mutex<World>>,
    book: &Arc<Book>,
) -> Result<BTreeMap<&'static str, u64>, String> {
    let control = world
        .lock()
        .await
        .driver
        .control()
        .await
        .map_err(|e| e.to_string())?;
    // Every create makes the volume but answers DEADLINE_EXCEEDED: the claim never gets
    // a PV, so deleting it goes through the cleanup of a claim deleted mid-provisioning.
    control
        .set_fault(
            "CreateVolume",
            DriverFault::CreateThenDeadlineExceeded { count: 1000 },
        )
        .await
        .map_err(err("arming CreateVolume"))?;
    control
        .set_fault("DeleteVolume", DriverFault::Hang)
        .await
        .map_err(err("arming DeleteVolume"))?;
    wait_for_leader(world).await?;
    create(world, book, "c-cleanup").await?;
    poll("a first CreateVolume", Duration::from_secs(90), || {
        let control = &control;
        async move {
            let stats = control.stats().await.ok()?;
            (stats.calls.get("CreateVolume").copied().unwrap_or(0) >= 1).then_some(())
        }
    })
    .await?;
    delete_now(world, book, "c-cleanup").await;
    // The cleanup's own CreateVolume answers, so it learns the handle.
    control
        .clear_method_faults("CreateVolume")
        .await
        .map_err(err("clearing the CreateVolume fault"))?;
    control
        .wait_for_hung("DeleteVolume", 1, Duration::from_secs(90))
        .await
        .map_err(err("waiting for the cleanup's DeleteVolume"))?;
    world.lock().await.replicas[0].kill_and_hold();
    tokio::time::sleep(Duration::from_secs(1)).await;
    control
        .clear_faults()
        .await
        .map_err(err("clearing faults"))?;
    control
        .release("DeleteVolume")
        .await
        .map_err(err("releasing DeleteVolume"))?;
    poll(
        "the backend to finish the DeleteVolume",
        Duration::from_secs(30),
        || {
            let control = &control;
            async move {
                let ledger = control.ledger().await.ok()?;
                (ledger.operations_of("DeleteVolume").any(|op| op.deleted)).then_some(())
            }
        },
    )
    .await?;
    world.lock().await.replicas[0].resume();
    // The restarted sidecar finds the claim still held by the intent.
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(BTreeMap::from([
        ("driver: CreateVolume done, DEADLINE_EXCEEDED", 1),
        ("claim deleted while provisioning", 1),
        ("driver: cleanup's DeleteVolume held", 1),
        ("sidecar: SIGKILL while DeleteVolume in flight", 1),
        ("backend finished the DeleteVolume", 1),
        ("sidecar restarted", 1),
    ]))
}

/// The time-travel verdict's own row.
pub const NONE_CREATED_AFTER_GONE: &str =
    "no volume created for a claim after it was gone (time travel)";

/// A `CreateVolume` that made `volume` after `gone_at_ms` (its claim was deleted, its PV and
/// volume gone) acted on a stale view.
fn created_after_gone(
    ledger: &csi_test_driver::ledger::Ledger,
    volume: &str,
    gone_at_ms: u64,
) -> crate::check::InvariantResult {
    crate::check::InvariantResult {
        name: NONE_CREATED_AFTER_GONE,
        violations: ledger
            .operations_of("CreateVolume")
            .filter(|op| op.created && op.name.as_deref() == Some(volume) && op.at_ms > gone_at_ms)
            .map(|op| {
                format!(
                    "volume {volume} created again {} ms after its claim, PV and volume were gone",
                    op.at_ms - gone_at_ms
                )
            })
            .collect(),
    }
}

/// How long the sidecar runs against the frozen server before the partition heals: well
/// under the ~40 s after which the etcd client's keepalive gives up on the link.
const STALE_FOR: Duration = Duration::from_secs(12);

async fn time_travel(
    world: &Arc<tokio::sync::Mutex<World>>,
    book: &Arc<Book>,
    late: &mut Option<(String, u64)>,
) -> Result<BTreeMap<&'static str, u64>, String> {
    // The World's second server, borrowed for the scenario and handed back at its end (the
    // World stops it at teardown).
    let (control, ns, second) = {
        let mut w = world.lock().await;
        let control = w.driver.control().await.map_err(|e| e.to_string())?;
        let second = w.second.take().ok_or(
            "time-travel needs CSI_TESTBED_DIR (a test bed started by testbed/cluster.sh)",
        )?;
        (control, w.ns.clone(), second)
    };
    let result = async {
        // A claim that stays Bound throughout: nothing may take its volume.
        create(world, book, "kept").await?;
        bound(world, "kept").await?;
        // The claim to travel with: its CreateVolume held until the second server's cache
        // has it as it is now (Pending, our intent on it), and is then cut off.
        control
            .set_fault(
                "CreateVolume",
                DriverFault::Hold {
                    nth: 1,
                    after: false,
                },
            )
            .await
            .map_err(err("arming the hold"))?;
        let uid = create(world, book, "c-travel").await?;
        control
            .wait_for_held("CreateVolume", 1, Duration::from_secs(60))
            .await
            .map_err(err("waiting for CreateVolume"))?;
        let api = world.lock().await.claims();
        let now = api.get("c-travel").await.map_err(|e| e.to_string())?;
        poll(
            "the second server's cache to catch up",
            Duration::from_secs(30),
            || {
                let (second, ns, now) = (&second, &ns, &now);
                async move {
                    let cached = second.cached_claims(ns).await.ok()?;
                    cached
                        .iter()
                        .any(|c| c.metadata.resource_version == now.metadata.resource_version)
                        .then_some(())
                }
            },
        )
        .await?;
        second.link.freeze(true);
        control
            .release("CreateVolume")
            .await
            .map_err(err("releasing"))?;
        bound(world, "c-travel").await?;
        delete_now(world, book, "c-travel").await;
        let volume = format!("pvc-{uid}");
        let pvs = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(
            world.lock().await.client.clone(),
        );
        poll(
            "the claim, its PV and its volume to be gone",
            Duration::from_secs(60),
            || {
                let (api, pvs, control, volume) = (&api, &pvs, &control, &volume);
                async move {
                    let claim = api.get_opt("c-travel").await.ok()?;
                    let pv = pvs.get_opt(volume).await.ok()?;
                    let ledger = control.ledger().await.ok()?;
                    let held = ledger.volumes.values().any(|v| &v.name == volume);
                    (claim.is_none() && pv.is_none() && !held).then_some(())
                }
            },
        )
        .await?;
        *late = Some((volume, csi_test_driver::ledger::now_ms()));
        // The past, as the second server shows it: the claim alive, not bound.
        let stale = second.shows_live(&ns, &uid).await;
        // The sidecar restarts onto the stale server.
        world.lock().await.replicas[0].kill_and_hold();
        poll("the sidecar to die", Duration::from_secs(30), || async {
            world.lock().await.replicas[0].pid().is_none().then_some(())
        })
        .await?;
        {
            let w = world.lock().await;
            w.proxy
                .set_upstream(second.config.clone())
                .map_err(|e| e.to_string())?;
            w.replicas[0].resume();
        }
        tokio::time::sleep(STALE_FOR).await;
        // The partition heals; the sidecar stays on the second server, now current.
        second.link.freeze(false);
        tokio::time::sleep(Duration::from_secs(8)).await;
        Ok::<_, String>(BTreeMap::from([
            (
                "claim provisioned, bound, deleted while the second server was cut off",
                1,
            ),
            (
                "second server's cache showed the deleted claim alive at the restart",
                u64::from(stale),
            ),
            ("sidecar restarted onto the stale server", 1),
            ("partition healed", 1),
        ]))
    }
    .await;
    // Back to the first server for the settle phase; the second one goes back to the World.
    {
        let mut w = world.lock().await;
        let _ = w.proxy.set_upstream(w.upstream.clone());
        w.second = Some(second);
    }
    result
}

pub(crate) async fn bound(
    world: &Arc<tokio::sync::Mutex<World>>,
    name: &str,
) -> Result<(), String> {
    let api = world.lock().await.claims();
    poll(
        &format!("claim {name} to be Bound"),
        Duration::from_secs(90),
        || {
            let api = api.clone();
            async move {
                let c = api.get(name).await.ok()?;
                (c.status.and_then(|s| s.phase).as_deref() == Some("Bound")).then_some(())
            }
        },
    )
    .await
}
