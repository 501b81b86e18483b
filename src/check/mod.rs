//! `csi-provisioner check`: checks a CSI driver against what a provisioner
//! relies on and reports each rule as passed, failed or skipped. The rules are
//! pure functions (`judge`), the calls and the cleanup of every volume created
//! live in `session`, the text and JSON reports in `report`.

mod args;
pub mod judge;
mod report;
mod session;

use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use crate::console;
use crate::csi::{CsiClient, DriverCapabilities, pb};
use crate::duration::format_go_duration;
use crate::entry::{self, Command, Signals};
use crate::metrics::Metrics;
use args::{CheckArgs, Output, Plan};
use judge::{Answer, CapacitySample, CheckId, DeleteKind, Observed, Outcome};
use report::{DriverInfo, Report};
use session::{CheckName, Interrupted, Session};

pub use report::JSON_VERSION;
pub use session::NAME_PREFIX;

/// `csi-provisioner check ARGS...`, run by [`crate::entry`].
pub struct Check;

impl Command for Check {
    type Config = Plan;

    const GRACE: Duration = Duration::from_secs(1);

    /// `argv` is the whole command line (`csi-provisioner`, `check`, flags).
    fn start(argv: Vec<String>) -> Result<Plan, ExitCode> {
        let flags = argv.into_iter().skip(2);
        let args = entry::flags(CheckArgs::try_parse_from(
            std::iter::once("csi-provisioner check".to_string()).chain(flags),
        ))?;
        args.plan().map_err(|e| entry::fail(&e, 2))
    }

    async fn run(plan: Plan) -> ExitCode {
        let report = match run(&plan).await {
            Ok(report) => report,
            Err(e) => return entry::fail(&e, 1),
        };
        let text = match plan.output {
            Output::Text => report.text(),
            Output::Json => report.json(),
        };
        if report.interrupted {
            console::err(
                "check interrupted; the volumes it created are cleaned up (see the report)\n",
            );
        }
        let code = if report.success() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        };
        entry::print(&text, code)
    }
}

/// Connects, runs the checks, cleans up. `Err` only when the driver cannot
/// be reached at all.
async fn run(plan: &Plan) -> Result<Report, String> {
    // The first SIGINT/SIGTERM stops the checks (the cleanup still runs); a
    // second one stops the cleanup, which then reports what may be left.
    let Signals {
        stop,
        again: abort_cleanup,
    } = Signals::watch();

    let connect = CsiClient::connect(
        &plan.socket,
        plan.timeout,
        plan.timeout,
        Arc::new(Metrics::unregistered()),
    );
    let client = tokio::select! {
        c = connect => c.map_err(|e| e.to_string())?,
        _ = stop.cancelled() => return Err("interrupted before the driver answered".into()),
    };
    let mut session = Session::new(client, stop.clone());
    let mut results = Results::default();
    let interrupted = checks(&mut session, plan, &mut results).await.is_err();
    let cleanup = session.cleanup(plan.cleanup_timeout, &abort_cleanup).await;

    // Judged last, from every call made (also those of an interrupted run).
    results.set(
        CheckId::Timeouts,
        judge::timeouts(&session.calls, plan.timeout),
    );
    let not_run = if interrupted {
        "not run: interrupted"
    } else {
        "not run"
    };
    Ok(Report {
        address: plan.address.clone(),
        timeout: format_go_duration(plan.timeout),
        driver: results.driver.clone(),
        checks: CheckId::ALL
            .iter()
            .map(|id| {
                let outcome = results
                    .outcomes
                    .remove(id)
                    .unwrap_or_else(|| Outcome::skip(not_run));
                (*id, outcome)
            })
            .collect(),
        cleanup,
        interrupted,
    })
}

#[derive(Default)]
struct Results {
    outcomes: BTreeMap<CheckId, Outcome>,
    driver: Option<DriverInfo>,
}

impl Results {
    fn set(&mut self, id: CheckId, outcome: Outcome) {
        self.outcomes.insert(id, outcome);
    }

    fn skip_all(&mut self, ids: &[CheckId], why: &str) {
        for id in ids {
            self.set(*id, Outcome::skip(why));
        }
    }
}

fn create_request(
    name: &CheckName,
    plan: &Plan,
    parameters: &BTreeMap<String, String>,
    required: i64,
    limit: i64,
) -> pb::CreateVolumeRequest {
    use pb::volume_capability::{AccessMode, AccessType, MountVolume};
    pb::CreateVolumeRequest {
        name: name.as_str().to_string(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }),
        volume_capabilities: vec![pb::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode {
                mode: plan.access_mode as i32,
            }),
        }],
        parameters: parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<HashMap<_, _>>(),
        ..Default::default()
    }
}

/// The checks in order. Each outcome is set from what the driver answered;
/// `Err` when interrupted (the outcomes set so far stay).
async fn checks(s: &mut Session, plan: &Plan, r: &mut Results) -> Result<(), Interrupted> {
    let info = s.plugin_info().await?;
    let probe = s.probe().await?;
    if let Answer::Ok(i) = &info {
        r.driver = Some(DriverInfo {
            name: i.name.clone(),
            vendor_version: i.vendor_version.clone(),
        });
    }
    r.set(CheckId::Probe, judge::probe(&info, &probe));

    let plugin = s.plugin_capabilities().await?;
    r.set(
        CheckId::PluginCapabilities,
        judge::plugin_capabilities(&plugin),
    );
    let controller = s.controller_capabilities().await?;
    r.set(
        CheckId::ControllerCapabilities,
        judge::controller_capabilities(&controller),
    );
    let empty_plugin = pb::GetPluginCapabilitiesResponse::default();
    let caps =
        DriverCapabilities::from_responses(plugin.ok().unwrap_or(&empty_plugin), controller.ok());

    let calls = volume_checks(s, plan, r).await?;
    r.set(
        CheckId::CapabilitiesConsistent,
        judge::capabilities_consistent(&Observed {
            controller_service: plugin.ok().map(|_| caps.controller_service),
            create_delete_volume: controller.ok().map(|_| caps.create_delete_volume),
            controller_answered: controller.ok().is_some(),
            creates: calls.creates.iter().collect(),
            deletes: calls.deletes.iter().collect(),
        }),
    );
    Ok(())
}

/// Every CreateVolume and DeleteVolume answer of the volume checks, which
/// the capabilities must be consistent with.
#[derive(Default)]
struct Calls {
    creates: Vec<Answer<pb::Volume>>,
    deletes: Vec<Answer<()>>,
}

/// CreateVolume of a new name and DeleteVolume of an unknown id; then, if
/// the create made a volume, the checks that need one.
async fn volume_checks(
    s: &mut Session,
    plan: &Plan,
    r: &mut Results,
) -> Result<Calls, Interrupted> {
    let run = session::run_id();
    let name_a = CheckName::new(&run, "a");
    let name_b = CheckName::new(&run, "b");
    let unknown_id = format!("{}{run}-never-created", session::NAME_PREFIX);
    let base = create_request(&name_a, plan, &plan.parameters, plan.capacity, 0);

    let first = s.create(&name_a, base.clone()).await?;
    r.set(
        CheckId::CreateVolume,
        judge::create_volume(name_a.as_str(), &first),
    );
    let mut calls = Calls {
        creates: vec![first.clone()],
        deletes: Vec::new(),
    };

    // DeleteVolume of an unknown id needs no volume of ours.
    let unknown = s.delete(&unknown_id).await?;
    r.set(
        CheckId::DeleteUnknown,
        judge::delete(DeleteKind::Unknown, &unknown_id, &unknown),
    );
    calls.deletes.push(unknown);

    match first.ok().filter(|v| !v.volume_id.is_empty()) {
        Some(volume) => {
            let created = Created {
                name: &name_a,
                other_name: &name_b,
                request: &base,
                first: &first,
                volume,
            };
            creates_again(s, plan, r, &mut calls, &created).await?;
            deletes(s, r, &mut calls, &volume.volume_id).await?;
        }
        None => r.skip_all(
            &[
                CheckId::CreateIdempotent,
                CheckId::CreateOtherParameters,
                CheckId::Capacity,
                CheckId::DeleteVolume,
                CheckId::DeleteTwice,
            ],
            "not run: CreateVolume of a new name did not create a volume",
        ),
    }
    Ok(calls)
}

/// The volume the first CreateVolume made, and how it was asked for.
struct Created<'a> {
    name: &'a CheckName,
    /// The name of the ranged create.
    other_name: &'a CheckName,
    request: &'a pb::CreateVolumeRequest,
    first: &'a Answer<pb::Volume>,
    volume: &'a pb::Volume,
}

/// The same create again, with other parameters, and with a capacity range.
async fn creates_again(
    s: &mut Session,
    plan: &Plan,
    r: &mut Results,
    calls: &mut Calls,
    created: &Created<'_>,
) -> Result<(), Interrupted> {
    let again = s.create(created.name, created.request.clone()).await?;
    r.set(
        CheckId::CreateIdempotent,
        judge::create_idempotent(created.volume, &again),
    );
    calls.creates.push(again);

    let mut other_request = created.request.clone();
    other_request.parameters = plan
        .other_parameters
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let other = s.create(created.name, other_request).await?;
    r.set(
        CheckId::CreateOtherParameters,
        judge::create_other_parameters(created.volume, &other),
    );
    calls.creates.push(other);

    let limit = plan.capacity * 2;
    let ranged_request = create_request(
        created.other_name,
        plan,
        &plan.parameters,
        plan.capacity,
        limit,
    );
    let ranged = s.create(created.other_name, ranged_request).await?;
    r.set(
        CheckId::Capacity,
        judge::capacity(&[
            CapacitySample {
                required: plan.capacity,
                limit: 0,
                answer: created.first,
            },
            CapacitySample {
                required: plan.capacity,
                limit,
                answer: &ranged,
            },
        ]),
    );
    calls.creates.push(ranged);
    Ok(())
}

/// DeleteVolume of the volume, and again once it is gone.
async fn deletes(
    s: &mut Session,
    r: &mut Results,
    calls: &mut Calls,
    volume_id: &str,
) -> Result<(), Interrupted> {
    let deleted = s.delete(volume_id).await?;
    r.set(
        CheckId::DeleteVolume,
        judge::delete(DeleteKind::Created, volume_id, &deleted),
    );
    let deleted_ok = matches!(deleted, Answer::Ok(()));
    calls.deletes.push(deleted);
    if deleted_ok {
        let twice = s.delete(volume_id).await?;
        r.set(
            CheckId::DeleteTwice,
            judge::delete(DeleteKind::Again, volume_id, &twice),
        );
        calls.deletes.push(twice);
    } else {
        r.set(
            CheckId::DeleteTwice,
            Outcome::skip("not run: the first DeleteVolume did not succeed"),
        );
    }
    Ok(())
}
