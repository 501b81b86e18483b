//! Where each claim's provisioning intent came from, read from the runner's own claim watch.
//! Admission's additions are owned by no manager in managedFields (the policy acts inside
//! kube-controller-manager's hand-over update); the sidecar's own write is owned by its manager.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::check::Snapshot;
use crate::policies::INTENT;

/// The manager our sidecar's writes show (its User-Agent, `csi-provisioner/<version> (...)`).
const OUR_MANAGER: &str = "csi-provisioner";

/// Who put the intent on a claim, as its first version holding it shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// No manager owns the finalizer: an admission policy added it.
    Admission,
    /// Our sidecar's own write.
    Sidecar,
    /// Another manager (nothing in a chaos run should).
    Other,
}

/// Who put the intent on this version of a claim; `None` if it does not hold it.
pub fn origin(claim: &PersistentVolumeClaim) -> Option<Origin> {
    let meta = &claim.metadata;
    if !meta.finalizers.iter().flatten().any(|f| f == INTENT) {
        return None;
    }
    let key = format!("v:{}", serde_json::Value::from(INTENT));
    let owner = meta.managed_fields.iter().flatten().find(|m| {
        m.fields_v1.as_ref().is_some_and(|f| {
            f.0.pointer("/f:metadata/f:finalizers")
                .and_then(|v| v.get(&key))
                .is_some()
        })
    });
    Some(match owner {
        None => Origin::Admission,
        Some(m) if m.manager.as_deref().unwrap_or("").starts_with(OUR_MANAGER) => Origin::Sidecar,
        Some(_) => Origin::Other,
    })
}

/// What the watch saw of the intent, per claim UID.
#[derive(Default)]
pub struct IntentTally {
    inner: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    origin: BTreeMap<String, Origin>,
    bound_holding: BTreeSet<String>,
}

/// The tally's counts, for the report.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct IntentCounts {
    pub admission: u64,
    pub sidecar: u64,
    pub other: u64,
    /// Claims seen bound (`spec.volumeName` set) while still holding the intent.
    pub bound_holding: u64,
    /// Live bound claims holding it when the checker judged the settled state (the
    /// sidecar's background release should have dropped each by then).
    pub bound_holding_at_check: u64,
}

impl IntentTally {
    /// Records one version of a claim.
    pub fn see(&self, claim: &PersistentVolumeClaim) {
        let Some(origin) = origin(claim) else {
            return;
        };
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let bound = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_some_and(|v| !v.is_empty());
        let mut seen = self.inner.lock().expect("poisoned");
        if bound {
            seen.bound_holding.insert(uid.clone());
        }
        seen.origin.entry(uid).or_insert(origin);
    }

    /// The counts, with the settled state `at_check` the checker judged.
    pub fn counts(&self, at_check: &Snapshot) -> IntentCounts {
        let seen = self.inner.lock().expect("poisoned");
        let bound_holding_at_check = at_check
            .claims
            .iter()
            .filter(|c| c.volume_name.is_some() && !c.deleting)
            .filter(|c| c.finalizers.iter().any(|f| f == INTENT))
            .count() as u64;
        let of = |o: Origin| seen.origin.values().filter(|v| **v == o).count() as u64;
        IntentCounts {
            admission: of(Origin::Admission),
            sidecar: of(Origin::Sidecar),
            other: of(Origin::Other),
            bound_holding: seen.bound_holding.len() as u64,
            bound_holding_at_check,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(
        uid: &str,
        finalizers: &[&str],
        owners: &[(&str, bool)],
        bound: bool,
    ) -> PersistentVolumeClaim {
        let managed: Vec<_> = owners
            .iter()
            .map(|(manager, owns_intent)| {
                let mut fields = json!({"f:metadata": {"f:finalizers": {".": {}}}});
                if *owns_intent {
                    fields["f:metadata"]["f:finalizers"][format!("v:\"{INTENT}\"")] = json!({});
                }
                json!({"manager": manager, "operation": "Update", "fieldsType": "FieldsV1",
                       "fieldsV1": fields})
            })
            .collect();
        let mut spec = json!({});
        if bound {
            spec["volumeName"] = json!("pv-1");
        }
        serde_json::from_value(json!({
            "metadata": {"name": "c", "uid": uid, "finalizers": finalizers,
                         "managedFields": managed},
            "spec": spec,
        }))
        .expect("claim")
    }

    #[test]
    fn an_intent_nobody_owns_came_from_admission_and_one_we_own_from_the_sidecar() {
        let from_policy = claim(
            "1",
            &["kubernetes.io/pvc-protection", INTENT],
            &[("kube-controller-manager", false)],
            false,
        );
        assert_eq!(origin(&from_policy), Some(Origin::Admission));
        let ours = claim(
            "2",
            &[INTENT],
            &[("csi-provisioner/v0.1.0 (linux/amd64)", true)],
            false,
        );
        assert_eq!(origin(&ours), Some(Origin::Sidecar));
        let theirs = claim("3", &[INTENT], &[("kubectl", true)], false);
        assert_eq!(origin(&theirs), Some(Origin::Other));
        assert_eq!(
            origin(&claim("4", &["kubernetes.io/pvc-protection"], &[], false)),
            None
        );
    }

    #[test]
    fn the_first_version_holding_the_intent_decides_and_bound_holders_are_counted_once() {
        let tally = IntentTally::default();
        tally.see(&claim("1", &[], &[], false));
        tally.see(&claim("1", &[INTENT], &[], false));
        // A later write of ours does not change where the intent came from.
        tally.see(&claim("1", &[INTENT], &[("csi-provisioner", true)], true));
        tally.see(&claim("1", &[INTENT], &[("csi-provisioner", true)], true));
        tally.see(&claim("2", &[INTENT], &[("csi-provisioner", true)], false));
        tally.see(&claim("2", &[], &[], true));
        let mut settled = Snapshot::default();
        for (uid, finalizers) in [("1", vec![INTENT.to_string()]), ("2", vec![])] {
            settled.claims.push(crate::check::ClaimState {
                uid: uid.into(),
                volume_name: Some(format!("pv-{uid}")),
                finalizers,
                ..Default::default()
            });
        }
        assert_eq!(
            tally.counts(&settled),
            IntentCounts {
                admission: 1,
                sidecar: 1,
                other: 0,
                bound_holding: 1,
                bound_holding_at_check: 1,
            }
        );
    }
}
