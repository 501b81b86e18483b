//! The orphan sweep of snapshot source protection (`--snapshot-orphan-sweep-interval`): a
//! VolumeSnapshot keeps our source-protection finalizer only while a claim still waits to be
//! restored from it. The create path removes it after the PV is saved, and the cleanup of a
//! deleted claim after its volume is gone; a removal that failed, or a process that died
//! before it, leaves it behind, and the snapshot could then never be deleted. Each sweep
//! lists the snapshots (one request) and removes the finalizer where no pending claim of the
//! claims cache names the snapshot. upstream: pkg/controller/snapshot_finalizer_controller.go.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Context;
use crate::keys;
use crate::kube::has_finalizer;
use crate::kube::snapshot::{VolumeSnapshot, unprotect};
use crate::provision::ClaimView;

/// Sweeps every `every` until `stop`.
pub async fn run(ctx: Arc<Context>, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => sweep(&ctx).await,
            _ = stop.cancelled() => return,
        }
    }
}

async fn sweep(ctx: &Context) {
    if !ctx.leader.is_leader() {
        return;
    }
    let snapshots = match Api::<VolumeSnapshot>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            warn!(error = %e, "snapshot sweep: listing VolumeSnapshots failed; next sweep retries");
            return;
        }
    };
    let claims = ctx.caches.claims.state();
    for snapshot in snapshots
        .iter()
        .filter(|s| has_finalizer(*s, keys::FINALIZER_SNAPSHOT_SOURCE))
    {
        let namespace = snapshot.namespace().unwrap_or_default();
        let name = snapshot.name_any();
        if waited_for(&namespace, &name, claims.iter().map(|c| &c.0)) {
            debug!(snapshot = %name, %namespace, "snapshot sweep: a pending claim restores from it");
            continue;
        }
        let api = Api::<VolumeSnapshot>::namespaced(ctx.client.clone(), &namespace);
        match unprotect(&api, &name, keys::FINALIZER_SNAPSHOT_SOURCE).await {
            Ok(()) => {
                info!(snapshot = %name, %namespace, "snapshot sweep: removed the source protection no claim needs")
            }
            Err(e) => {
                warn!(snapshot = %name, %namespace, error = %e, "snapshot sweep: removal failed; next sweep retries")
            }
        }
    }
}

/// Whether a claim still to be provisioned (phase Pending or none yet) restores from the
/// snapshot `namespace/name` (upstream: `dataSource` or `dataSourceRef`, kind VolumeSnapshot,
/// API group unset or the snapshot group).
pub fn waited_for<'a>(
    namespace: &str,
    name: &str,
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
) -> bool {
    claims.into_iter().any(|claim| {
        let view = ClaimView(claim);
        let pending = view.is_pending();
        let spec = claim.spec.as_ref();
        let names = |kind: &str, group: Option<&str>, source: &str| {
            kind == keys::SNAPSHOT_KIND
                && group.is_none_or(|g| g == keys::SNAPSHOT_API_GROUP)
                && source == name
        };
        let by_source = spec
            .and_then(|s| s.data_source.as_ref())
            .is_some_and(|d| names(&d.kind, d.api_group.as_deref(), &d.name));
        let by_ref = spec
            .and_then(|s| s.data_source_ref.as_ref())
            .is_some_and(|d| names(&d.kind, d.api_group.as_deref(), &d.name));
        pending && view.namespace() == namespace && (by_source || by_ref)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimStatus, TypedLocalObjectReference};

    fn restoring(
        namespace: &str,
        snapshot: &str,
        group: Option<&str>,
        phase: Option<&str>,
    ) -> PersistentVolumeClaim {
        let mut claim = crate::provision::fixtures::claim();
        claim.metadata.namespace = Some(namespace.into());
        claim.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
            api_group: group.map(String::from),
            kind: "VolumeSnapshot".into(),
            name: snapshot.into(),
        });
        claim.status = phase.map(|p| PersistentVolumeClaimStatus {
            phase: Some(p.into()),
            ..Default::default()
        });
        claim
    }

    #[test]
    fn only_a_pending_claim_of_the_same_namespace_naming_the_snapshot_keeps_it() {
        let g = Some(keys::SNAPSHOT_API_GROUP);
        let rows: Vec<(PersistentVolumeClaim, bool)> = vec![
            (restoring("a", "snap", g, Some("Pending")), true),
            (restoring("a", "snap", g, None), true),
            (restoring("a", "snap", None, Some("Pending")), true),
            (restoring("a", "snap", g, Some("Bound")), false),
            (restoring("a", "snap", g, Some("Lost")), false),
            (restoring("b", "snap", g, Some("Pending")), false),
            (restoring("a", "other", g, Some("Pending")), false),
            (
                restoring("a", "snap", Some("example.com"), Some("Pending")),
                false,
            ),
            (crate::provision::fixtures::claim(), false),
        ];
        for (claim, keeps) in rows {
            assert_eq!(
                waited_for("a", "snap", [&claim]),
                keeps,
                "{:?} {:?}",
                claim.spec.as_ref().unwrap().data_source,
                claim.status
            );
        }
        assert!(!waited_for("a", "snap", []));
    }
}
