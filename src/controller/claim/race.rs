//! `--node-deployment`: the race for an Immediate claim. After a per-claim
//! delay with jitter, the first sidecar whose fenced write of
//! `volume.kubernetes.io/selected-node` succeeds owns the claim; the others
//! see the annotation through their watch and leave it alone.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::PostParams;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{debug, info};

use super::ClaimMemory;
use super::Context;
use super::decide::{Work, work_for};
use crate::controller::node::NodeMode;
use crate::controller::queue::Action;
use crate::keys;
use crate::kube::is_conflict;
use crate::provision::ClaimView;
use crate::quantity;

/// The delay before this node tries to take an Immediate claim: the claim's
/// exponential delay (base to max) minus a random jitter below the base, so
/// that the sidecars of many nodes do not all try at once.
fn race_delay(node: &NodeMode, races: &ClaimMemory, uid: &str) -> Duration {
    let delay =
        crate::controller::retry_delay(node.base_delay, node.max_delay, races.next_race(uid));
    let jitter = node.base_delay.mul_f64(rand::random::<f64>());
    delay.saturating_sub(jitter)
}

/// Races for an Immediate claim: waits this node's delay, giving up as soon
/// as the cache shows that another node took the claim, then writes this
/// node as the selected node in an update of the copy last seen (fenced on
/// its resourceVersion). A
/// conflict means the claim changed (usually: another node won): the claim
/// is looked at again. The winner's claim comes back through the watch with
/// the annotation and is provisioned as [`NodeGate::ThisNode`].
pub async fn race(
    ctx: &Context,
    node: &NodeMode,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<Action, kube::Error> {
    let view = ClaimView(claim);
    let delay = race_delay(node, &ctx.memory, view.uid());
    debug!(claim = %view.key(), ?delay, "racing for an Immediate claim");
    let poll = (node.base_delay / 100).max(Duration::from_millis(10));
    let until = Instant::now() + delay;
    let key = ObjectRef::new(view.name()).within(view.namespace());
    let seen = loop {
        let seen = match ctx.caches.claims.get(&key) {
            Some(cached) if cached.0.uid() == claim.uid() => {
                let now = ClaimView(&cached.0);
                // Taken by another node, or provisioned meanwhile (a bound
                // claim is cached without its annotations, if at all, so its
                // selected node cannot be seen: bound is enough to stop).
                if now.selected_node().is_some()
                    || work_for(now, &ctx.shared.driver.name) != Work::Provision
                {
                    debug!(claim = %view.key(), "another node took it");
                    // Should it come back (rescheduled), the delay starts afresh.
                    ctx.memory.reset_races(view.uid());
                    return Ok(Action::await_change());
                }
                cached
            }
            // Deleted, another claim of that name now, or bound (and so
            // left out of the cache).
            _ => return Ok(Action::await_change()),
        };
        let now = Instant::now();
        if now >= until {
            break seen;
        }
        tokio::time::sleep(poll.min(until - now)).await;
    };
    // As late as possible, as upstream: is there room here now? A failed
    // check does not stop the race (provisioning then tells the user why).
    match has_room(ctx, node, claim, class).await {
        Ok(false) => {
            debug!(claim = %view.key(), "not enough capacity on this node: not taking it");
            return Ok(Action::requeue(race_delay(node, &ctx.memory, view.uid())));
        }
        Ok(true) => {}
        Err(status) => {
            debug!(claim = %view.key(), code = ?status.code(), message = status.message(), "capacity check failed: taking the claim anyway")
        }
    }
    // An update of the copy last seen: fenced on its resourceVersion by itself.
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.shared.client.clone(), view.namespace());
    let mut taken = seen.0.clone();
    taken
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(keys::ANN_SELECTED_NODE.into(), node.name.clone());
    taken.metadata.managed_fields = None;
    match api
        .replace(view.name(), &PostParams::default(), &taken)
        .await
    {
        Ok(_) => {
            info!(claim = %view.key(), node = %node.name, "took the Immediate claim for this node");
            ctx.memory.reset_races(view.uid());
            Ok(Action::await_change())
        }
        Err(e) if is_conflict(&e) => {
            debug!(claim = %view.key(), "changed while racing for it: looking again");
            Ok(Action::requeue(Duration::ZERO))
        }
        Err(e) => Err(e),
    }
}

/// Whether this node's driver reports room for the claim's requested size
/// (`GetCapacity` with the class's parameters, without the sidecar's own
/// prefixed keys, in this node's segment). A claim without a size always fits.
async fn has_room(
    ctx: &Context,
    node: &NodeMode,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<bool, tonic::Status> {
    let wanted = ClaimView(claim)
        .requested_storage()
        .and_then(quantity::parse_bytes)
        .unwrap_or_default();
    if wanted == 0 {
        return Ok(true);
    }
    let parameters = class
        .parameters
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with(keys::CSI_PARAMETER_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let segment = node
        .topology
        .clone()
        .filter(|t| !t.is_empty())
        .map(|t| t.into_iter().collect());
    let answer = ctx.shared.csi.get_capacity(parameters, segment).await?;
    Ok(i128::from(answer.available_capacity) >= i128::from(wanted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeMode {
        NodeMode {
            name: "n1".into(),
            topology: Some([("zone".to_string(), "a".to_string())].into()),
            immediate_binding: true,
            base_delay: Duration::from_secs(20),
            max_delay: Duration::from_secs(60),
        }
    }

    #[test]
    fn the_race_delay_grows_per_claim_and_is_jittered_below_the_base() {
        let n = node();
        let m = ClaimMemory::new(Duration::from_secs(1), Duration::from_secs(5));
        let first = race_delay(&n, &m, "uid-1");
        assert!(first <= Duration::from_secs(20), "{first:?}");
        let _ = race_delay(&n, &m, "uid-1");
        let third = race_delay(&n, &m, "uid-1");
        // 20 s, 40 s, then the 60 s cap, each minus under 20 s of jitter.
        assert!(
            third > Duration::from_secs(40) && third <= Duration::from_secs(60),
            "{third:?}"
        );
        let other = race_delay(&n, &m, "uid-2");
        assert!(
            other <= Duration::from_secs(20),
            "a claim of its own: {other:?}"
        );
    }
}
