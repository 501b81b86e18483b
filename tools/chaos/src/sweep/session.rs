//! The sweep's I/O half: a stage per case, the traces, the crash at a step, the verdict.

use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_test_driver::control::Fault as DriverFault;
use futures::StreamExt;
use kube::api::DeleteParams;
use kube_fault_proxy::{Fault, Rule};
use tokio::sync::Mutex;

use crate::check::{self, DataSource, SourceKind};
use crate::run::{self, Book, faults_off, settle};
use crate::scenarios::{bound, create_from, poll, wait_for_leader};
use crate::world::{Sidecar, StageOptions, Testbed, World};
use csi_test_driver::ledger::now_ms;

use super::cases::{Call, Case, Flow, Outcome, Point, Step, SweepReport, steps};

/// How long one step may take to be reached before the case says it was not.
const REACH: Duration = Duration::from_secs(60);

/// Knobs of a sweep.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    pub sidecar: Sidecar,
    pub flows: Vec<Flow>,
    /// Our sidecar in policy mode.
    pub policies: bool,
    /// Also crash at event writes (every `create events` of a trace).
    pub events: bool,
    pub seed: u64,
    pub keep_dir: bool,
    /// Cases run at once, each on its own stage.
    pub jobs: usize,
    /// Only the cases of this step (its label), crash point and deletion (the trace still
    /// runs whole).
    pub only: Option<(String, Point, bool)>,
}

type Shared = Arc<Mutex<World>>;

/// Runs the trace of every flow, then every case of it, each on a stage of its own.
pub async fn sweep(testbed: &Testbed, opts: &SweepOptions) -> Result<SweepReport, String> {
    let started = Instant::now();
    let mut traces = Vec::new();
    let mut outcomes = Vec::new();
    let mut trace_errors = Vec::new();
    for &flow in &opts.flows {
        let trace = match trace(testbed, opts, flow).await {
            Ok(t) => t,
            Err(e) => {
                eprintln!("sweep: {} {}: {e}", opts.sidecar.label(), flow.name());
                trace_errors.push((flow, e));
                continue;
            }
        };
        let steps: Vec<Step> = trace
            .into_iter()
            .filter(|s| opts.events || !matches!(&s.call, Call::Api { resource, .. } if resource.starts_with("events")))
            .collect();
        eprintln!(
            "sweep: {} {}: {} steps: {}",
            opts.sidecar.label(),
            flow.name(),
            steps.len(),
            steps
                .iter()
                .map(|s| format!("{} ({})", s.label(), s.object))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let cases: Vec<Case> = steps
            .iter()
            .flat_map(|step| {
                [Point::Before, Point::After]
                    .into_iter()
                    .flat_map(move |point| {
                        [false, true].map(|delete_while_down| Case {
                            flow,
                            step: step.clone(),
                            point,
                            delete_while_down,
                        })
                    })
            })
            .filter(|c| {
                opts.only.as_ref().is_none_or(|(label, point, deleted)| {
                    c.step.label() == *label && c.point == *point && c.delete_while_down == *deleted
                })
            })
            .collect();
        let mut done = futures::stream::iter(cases)
            .map(|case| run_case(testbed, opts, case))
            .buffered(opts.jobs.max(1));
        while let Some(outcome) = done.next().await {
            eprintln!(
                "sweep: {} {} {} {} deleted={}: {} ({})",
                opts.sidecar.label(),
                flow.name(),
                outcome.case.step.label(),
                outcome.case.point.label(),
                outcome.case.delete_while_down,
                outcome.verdict(),
                outcome.end
            );
            outcomes.push(outcome);
        }
        traces.push((flow, steps));
    }
    Ok(SweepReport {
        sidecar: opts.sidecar,
        policies: opts.policies,
        traces,
        outcomes,
        trace_errors,
        elapsed: started.elapsed(),
    })
}

async fn stage(testbed: &Testbed, opts: &SweepOptions) -> Result<(Shared, Arc<Book>), String> {
    let world = World::setup(
        testbed,
        &StageOptions {
            sidecar: opts.sidecar,
            replicas: 1,
            nodes: 0,
            seed: opts.seed,
            leader_election: true,
            csi_timeout: "30s".into(),
            extra_args: Vec::new(),
            time_travel: false,
            sidecar_env: Vec::new(),
            keep_dir: opts.keep_dir,
            policies: opts.policies,
        },
    )
    .await?;
    let world = Arc::new(Mutex::new(world));
    wait_for_leader(&world).await?;
    Ok((world, Arc::new(Book::default())))
}

async fn end_stage(world: Shared) {
    match Arc::try_unwrap(world) {
        Ok(w) => w.into_inner().teardown().await,
        Err(_) => eprintln!("sweep: stage still shared; not torn down"),
    }
}

/// A clean run of `flow`: the steps it made after its trigger.
async fn trace(testbed: &Testbed, opts: &SweepOptions, flow: Flow) -> Result<Vec<Step>, String> {
    let (world, book) = stage(testbed, opts).await?;
    let result = async {
        let ctx = setup(&world, &book, flow).await?;
        quiet().await;
        let since = now_ms();
        world.lock().await.proxy.record_writes();
        trigger(&world, &book, flow, &ctx).await?;
        finished(&world, flow, &ctx).await?;
        // Late writes of the flow (an event after the last step) are steps too.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let w = world.lock().await;
        let ledger = w
            .driver
            .control()
            .await
            .map_err(|e| e.to_string())?
            .ledger()
            .await;
        let ledger = ledger.map_err(|e| format!("reading the ledger: {e}"))?;
        Ok::<_, String>(steps(&w.proxy.journal(), &ledger.operations, since))
    }
    .await;
    end_stage(world).await;
    let steps = result.map_err(|e| format!("trace of {}: {e}", flow.name()))?;
    if steps.is_empty() {
        return Err(format!("trace of {}: no step recorded", flow.name()));
    }
    Ok(steps)
}

/// Lets the setup's last writes (events) go out before a journal or a count starts.
async fn quiet() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

async fn run_case(testbed: &Testbed, opts: &SweepOptions, case: Case) -> Outcome {
    let mut outcome = Outcome {
        case,
        reached: false,
        end: String::new(),
        violations: Vec::new(),
        error: None,
    };
    let (world, book) = match stage(testbed, opts).await {
        Ok(s) => s,
        Err(e) => {
            outcome.error = Some(e);
            return outcome;
        }
    };
    if let Err(e) = crash_at(&world, &book, &mut outcome).await {
        outcome.error = Some(e);
    }
    faults_off(&world).await;
    let (results, snap) = settle(&world, &book, Duration::from_secs(90)).await;
    outcome.end = end_state(&snap, &book);
    let teardown = run::teardown_check(&world, &book, Duration::from_secs(90)).await;
    outcome.violations = results
        .into_iter()
        .chain(std::iter::once(teardown))
        .filter(|r| !r.violations.is_empty())
        .collect();
    end_stage(world).await;
    outcome
}

/// The claim of the case, and the backend's volumes, once settled.
fn end_state(snap: &check::Snapshot, book: &Book) -> String {
    let claim = book
        .created()
        .into_iter()
        .find(|c| c.name == CLAIM)
        .and_then(|c| snap.claims.iter().find(|s| s.uid == c.uid));
    let claim = match claim {
        Some(c) if c.deleting => format!("claim {} (deleting)", c.phase),
        Some(c) => format!("claim {}", c.phase),
        None => "claim gone".into(),
    };
    let volumes = snap.ledger.volumes.len();
    format!(
        "{claim}, {volumes} volume{}",
        if volumes == 1 { "" } else { "s" }
    )
}

/// The claim every flow is about; a restore's or a clone's source is [`SOURCE`].
const CLAIM: &str = "c";
const SOURCE: &str = "src";
const VOLUME_SNAPSHOT: &str = "vs";

/// What a flow's setup made.
#[derive(Default)]
struct Context {
    /// The data source of the claim to create.
    source: Option<DataSource>,
    /// The claim's UID, when the setup created it.
    uid: Option<String>,
}

async fn driver_control(world: &Shared) -> Result<csi_test_driver::control::Client, String> {
    world
        .lock()
        .await
        .driver
        .control()
        .await
        .map_err(|e| format!("the driver's control socket: {e}"))
}

async fn setup(world: &Shared, book: &Arc<Book>, flow: Flow) -> Result<Context, String> {
    let mut ctx = Context::default();
    match flow {
        Flow::Provision => {}
        Flow::Restore | Flow::Clone => {
            let uid = create_from(world, book, SOURCE, None).await?;
            bound(world, SOURCE).await?;
            ctx.source = Some(if flow == Flow::Restore {
                let (snapshots, class) = {
                    let w = world.lock().await;
                    (w.snapshots(), w.snapshot_class.clone())
                };
                let uid =
                    run::make_snapshot(book, &snapshots, VOLUME_SNAPSHOT, &class, SOURCE).await?;
                poll("the VolumeSnapshot to be ready", REACH, || {
                    let snapshots = snapshots.clone();
                    async move {
                        let s = snapshots.get(VOLUME_SNAPSHOT).await.ok()?;
                        s.data
                            .pointer("/status/readyToUse")
                            .and_then(|v| v.as_bool())
                            .filter(|r| *r)
                            .map(drop)
                    }
                })
                .await?;
                DataSource {
                    kind: SourceKind::Snapshot,
                    name: VOLUME_SNAPSHOT.into(),
                    uid,
                    deleted: false,
                }
            } else {
                DataSource {
                    kind: SourceKind::Claim,
                    name: SOURCE.into(),
                    uid,
                    deleted: false,
                }
            });
        }
        Flow::Delete => {
            ctx.uid = Some(create_from(world, book, CLAIM, None).await?);
            bound(world, CLAIM).await?;
        }
        Flow::Cleanup => {
            let control = driver_control(world).await?;
            // The volume is made, its answer held; the claim is deleted meanwhile.
            control
                .set_fault(
                    "CreateVolume",
                    DriverFault::Hold {
                        nth: 1,
                        after: true,
                    },
                )
                .await
                .map_err(|e| format!("arming the setup's hold: {e}"))?;
            ctx.uid = Some(create_from(world, book, CLAIM, None).await?);
            control
                .wait_for_held("CreateVolume", 1, REACH)
                .await
                .map_err(|e| format!("waiting for the setup's CreateVolume: {e}"))?;
            delete_claim(world, book, CLAIM).await?;
        }
    }
    Ok(ctx)
}

async fn trigger(
    world: &Shared,
    book: &Arc<Book>,
    flow: Flow,
    ctx: &Context,
) -> Result<(), String> {
    match flow {
        Flow::Provision | Flow::Restore | Flow::Clone => {
            create_from(world, book, CLAIM, ctx.source.clone()).await?;
        }
        Flow::Delete => delete_claim(world, book, CLAIM).await?,
        Flow::Cleanup => {
            driver_control(world)
                .await?
                .release("CreateVolume")
                .await
                .map_err(|e| format!("releasing the setup's CreateVolume: {e}"))?;
        }
    }
    Ok(())
}

/// Waits until the trace's flow is over.
async fn finished(world: &Shared, flow: Flow, ctx: &Context) -> Result<(), String> {
    match flow {
        // A clone's source keeps its protection while it lives (it goes when the source is
        // deleted and no clone of it is pending, as upstream's cloning protection does).
        Flow::Provision | Flow::Clone => bound(world, CLAIM).await,
        // A snapshot's protection goes once the restore is Bound: a step of the flow too.
        Flow::Restore => {
            bound(world, CLAIM).await?;
            let snapshots = world.lock().await.snapshots();
            poll("the snapshot's protection to go", REACH, || {
                let snapshots = snapshots.clone();
                async move {
                    let vs = snapshots.get(VOLUME_SNAPSHOT).await.ok()?;
                    let protected = vs
                        .metadata
                        .finalizers
                        .unwrap_or_default()
                        .iter()
                        .any(|f| f == check::SNAPSHOT_SOURCE_FINALIZER);
                    (!protected).then_some(())
                }
            })
            .await
        }
        Flow::Delete | Flow::Cleanup => {
            let (claims, client) = {
                let w = world.lock().await;
                (w.claims(), w.client.clone())
            };
            let control = driver_control(world).await?;
            let pv = format!("pvc-{}", ctx.uid.clone().unwrap_or_default());
            poll("the claim, its PV and its volume to be gone", REACH, || {
                let (claims, control) = (claims.clone(), &control);
                let pvs =
                    kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone());
                let pv = pv.clone();
                async move {
                    let claim = claims.get_opt(CLAIM).await.ok()?;
                    let pv = pvs.get_opt(&pv).await.ok()?;
                    let ledger = control.ledger().await.ok()?;
                    (claim.is_none() && pv.is_none() && ledger.volumes.is_empty()).then_some(())
                }
            })
            .await
        }
    }
}

/// Sets up the flow, aims the hold at the case's step, triggers, and when the step is held
/// kills the sidecar, deletes what the case deletes, lets the held request go nowhere, and
/// restarts the sidecar.
async fn crash_at(world: &Shared, book: &Arc<Book>, outcome: &mut Outcome) -> Result<(), String> {
    let case = outcome.case.clone();
    let ctx = setup(world, book, case.flow).await?;
    quiet().await;
    let after = case.point == Point::After;
    let control = driver_control(world).await?;
    match &case.step.call {
        Call::Api { verb, resource } => {
            world.lock().await.proxy.add_rule(
                Rule::new(Fault::Hold { after })
                    .verbs(&[verb.as_str()])
                    .resources(&[resource.as_str()])
                    .skip(u64::from(case.step.nth - 1))
                    .count(1),
            );
        }
        Call::Csi { method } => control
            .set_fault(
                method,
                DriverFault::Hold {
                    nth: case.step.nth,
                    after,
                },
            )
            .await
            .map_err(|e| format!("arming the hold: {e}"))?,
    }
    trigger(world, book, case.flow, &ctx).await?;
    let reached = match &case.step.call {
        Call::Api { .. } => {
            let proxy_held = poll("the step", REACH, || async {
                (!world.lock().await.proxy.held().is_empty()).then_some(())
            });
            proxy_held.await.is_ok()
        }
        Call::Csi { method } => control.wait_for_held(method, 1, REACH).await.is_ok(),
    };
    outcome.reached = reached;
    if !reached {
        return Ok(());
    }
    kill(world).await?;
    if case.delete_while_down {
        match case.flow.deleted_while_down() {
            "PV" => {
                let client = world.lock().await.client.clone();
                let pvs = kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client);
                let pv = format!("pvc-{}", ctx.uid.clone().unwrap_or_default());
                // A PV the step already removed (its last finalizer) cannot be deleted.
                match pvs.delete(&pv, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(format!("deleting PV {pv}: {e}")),
                }
            }
            _ => delete_claim(world, book, CLAIM).await?,
        }
        if case.flow.deleted_while_down() == "claim" {
            claim_deletion_done(world).await?;
        }
    }
    // The held request goes nowhere: before, it never reaches the server; after, its
    // answer is lost with the process that waited for it.
    world.lock().await.proxy.drop_held();
    control
        .drop_held(None)
        .await
        .map_err(|e| format!("dropping the held call: {e}"))?;
    // `faults_off` (the caller's next step) clears every rule and restarts the sidecar.
    Ok(())
}

/// Waits until a claim deleted while the sidecar is down has gone as far as the control
/// plane takes it without a provisioner: gone, or held only by a provisioner's finalizer
/// (kube-controller-manager's `kubernetes.io/pvc-protection` removed). Otherwise a sidecar
/// restarted a moment later might still find the deleted claim whole, and the case would
/// depend on how busy kube-controller-manager was.
async fn claim_deletion_done(world: &Shared) -> Result<(), String> {
    let claims = world.lock().await.claims();
    poll("the claim's deletion to take effect", REACH, || {
        let claims = claims.clone();
        async move {
            let protected = claims.get_opt(CLAIM).await.ok()?.is_some_and(|c| {
                c.metadata
                    .finalizers
                    .unwrap_or_default()
                    .iter()
                    .any(|f| f.starts_with("kubernetes.io/"))
            });
            (!protected).then_some(())
        }
    })
    .await
}

/// SIGKILLs the sidecar and waits until it is gone (it stays down until `faults_off`).
async fn kill(world: &Shared) -> Result<(), String> {
    world.lock().await.replicas[0].kill_and_hold();
    poll("the sidecar to die", REACH, || async {
        world.lock().await.replicas[0].pid().is_none().then_some(())
    })
    .await
}

async fn delete_claim(world: &Shared, book: &Arc<Book>, name: &str) -> Result<(), String> {
    let api = world.lock().await.claims();
    if !book.schedule(name) {
        return Ok(());
    }
    let result = match api.delete(name, &DeleteParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        r => r.map(drop),
    };
    book.finish_delete(name, result.is_ok());
    result.map_err(|e| format!("deleting claim {name}: {e}"))
}
