//! What a claim says, read in one place: its identity, the class and
//! provisioner it asks for, the node the scheduler chose, its data source and
//! size, and the state the claim path keys on (our intent, deletion, binding).
//! Every other module asks a [`ClaimView`] instead of digging in the object.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::ProvisionOptions;
use crate::keys;
use crate::names::ClaimPhase;

/// A borrowed, typed reading of a PersistentVolumeClaim.
#[derive(Clone, Copy)]
pub struct ClaimView<'a>(pub &'a PersistentVolumeClaim);

static NO_ANNOTATIONS: BTreeMap<String, String> = BTreeMap::new();

impl<'a> ClaimView<'a> {
    pub fn new(claim: &'a PersistentVolumeClaim) -> ClaimView<'a> {
        ClaimView(claim)
    }

    pub fn uid(&self) -> &'a str {
        self.0.metadata.uid.as_deref().unwrap_or_default()
    }

    pub fn name(&self) -> &'a str {
        self.0.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &'a str {
        self.0.metadata.namespace.as_deref().unwrap_or_default()
    }

    /// `namespace/name`, as upstream names a claim in events and logs.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace(), self.name())
    }

    pub fn resource_version(&self) -> Option<&'a str> {
        self.0.metadata.resource_version.as_deref()
    }

    pub fn annotations(&self) -> &'a BTreeMap<String, String> {
        self.0
            .metadata
            .annotations
            .as_ref()
            .unwrap_or(&NO_ANNOTATIONS)
    }

    fn annotation(&self, key: &str) -> Option<&'a str> {
        self.annotations().get(key).map(String::as_str)
    }

    /// The StorageClass name: the legacy annotation wins over the spec.
    pub fn class(&self) -> Option<&'a str> {
        self.annotation(keys::ANN_BETA_STORAGE_CLASS)
            .or_else(|| self.0.spec.as_ref()?.storage_class_name.as_deref())
    }

    /// The provisioner the claim asks for (GA annotation, then beta).
    pub fn provisioner(&self) -> Option<&'a str> {
        self.annotation(keys::ANN_STORAGE_PROVISIONER)
            .or_else(|| self.annotation(keys::ANN_BETA_STORAGE_PROVISIONER))
    }

    /// Whether the claim names `driver` as its provisioner, directly or as
    /// the CSI driver an in-tree plugin migrated to. Only that driver's
    /// sidecar may act on it: the intent finalizer has one name for every
    /// driver, and every provisioner in the cluster watches every claim.
    pub fn asks(&self, driver: &str) -> bool {
        self.provisioner() == Some(driver) || self.annotation(keys::ANN_MIGRATED_TO) == Some(driver)
    }

    /// The node the scheduler chose for a WaitForFirstConsumer claim.
    pub fn selected_node(&self) -> Option<&'a str> {
        self.annotation(keys::ANN_SELECTED_NODE)
            .or_else(|| self.annotation(keys::ANN_ALPHA_SELECTED_NODE))
            .filter(|n| !n.is_empty())
    }

    /// The annotation that carries the selected node (GA, else alpha).
    pub fn selected_node_key(&self) -> &'static str {
        if self.annotations().contains_key(keys::ANN_SELECTED_NODE) {
            keys::ANN_SELECTED_NODE
        } else {
            keys::ANN_ALPHA_SELECTED_NODE
        }
    }

    /// The claim's data source as upstream reads it: `dataSource` when set,
    /// else `dataSourceRef` (whose `namespace` only it can carry).
    pub fn data_source(&self) -> Option<DataSource<'a>> {
        let spec = self.0.spec.as_ref()?;
        if let Some(d) = &spec.data_source {
            return Some(DataSource {
                kind: &d.kind,
                name: &d.name,
                api_group: d.api_group.as_deref().unwrap_or_default(),
                namespace: None,
            });
        }
        spec.data_source_ref.as_ref().map(|d| DataSource {
            kind: &d.kind,
            name: &d.name,
            api_group: d.api_group.as_deref().unwrap_or_default(),
            namespace: d.namespace.as_deref().filter(|n| !n.is_empty()),
        })
    }

    /// The namespace the data source is read from: the one `dataSourceRef`
    /// names when `cross_namespace` (the `CrossNamespaceVolumeDataSource`
    /// gate) is on, the claim's own when it names none. `None` without a data
    /// source, or when it names another namespace with the gate off (such a
    /// claim is refused and never uses it).
    pub fn data_source_namespace(&self, cross_namespace: bool) -> Option<&'a str> {
        match self.data_source()?.namespace {
            None => Some(self.namespace()),
            Some(other) if cross_namespace => Some(other),
            Some(_) => None,
        }
    }

    /// Whether this claim is still to be provisioned (see [`Self::is_pending`])
    /// from the object `namespace/name` of `kind` (the snapshot group, or none
    /// as upstream's sweep accepts, for a VolumeSnapshot; the core group for a
    /// claim). What keeps a source's protection on. A source in another
    /// namespace counts whatever this process's `CrossNamespaceVolumeDataSource`
    /// gate: any driver's sidecar may release a protection (as upstream), so
    /// one whose gate is off must not release what another one's pending
    /// claim still needs.
    pub fn waits_for(&self, kind: &str, namespace: &str, name: &str) -> bool {
        let Some(source) = self.data_source() else {
            return false;
        };
        let group_fits = match kind {
            keys::SNAPSHOT_KIND => {
                source.api_group.is_empty() || source.api_group == keys::SNAPSHOT_API_GROUP
            }
            _ => source.api_group.is_empty(),
        };
        self.is_pending()
            && source.kind == kind
            && group_fits
            && source.name == name
            && self.data_source_namespace(true) == Some(namespace)
    }

    /// `spec.resources.requests.storage` as written (a Kubernetes quantity).
    pub fn requested_storage(&self) -> Option<&'a str> {
        self.0
            .spec
            .as_ref()?
            .resources
            .as_ref()?
            .requests
            .as_ref()?
            .get("storage")
            .map(|q| q.0.as_str())
    }

    /// The VolumeAttributesClass the claim asks for, when the gate is on.
    pub fn vac_name(&self, opts: &ProvisionOptions) -> Option<&'a str> {
        if !opts.volume_attributes_class {
            return None;
        }
        self.0
            .spec
            .as_ref()?
            .volume_attributes_class_name
            .as_deref()
            .filter(|n| !n.is_empty())
    }

    /// The access modes the claim asks for.
    pub fn access_modes(&self) -> Vec<String> {
        self.0
            .spec
            .as_ref()
            .and_then(|s| s.access_modes.clone())
            .unwrap_or_default()
    }

    /// The PV the claim is bound to, if any.
    pub fn volume_name(&self) -> Option<&'a str> {
        self.0
            .spec
            .as_ref()?
            .volume_name
            .as_deref()
            .filter(|v| !v.is_empty())
    }

    pub fn is_bound(&self) -> bool {
        self.volume_name().is_some()
    }

    /// Phase Pending, or none yet: the claim still waits for a volume.
    pub fn is_pending(&self) -> bool {
        self.0
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|p| p.is_empty() || ClaimPhase::parse(p) == Some(ClaimPhase::Pending))
    }

    pub fn is_deleting(&self) -> bool {
        self.0.metadata.deletion_timestamp.is_some()
    }

    pub fn has_finalizer(&self, finalizer: &str) -> bool {
        self.0
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == finalizer))
    }

    /// Whether our durable provisioning intent is on the claim.
    pub fn holds_intent(&self) -> bool {
        self.has_finalizer(keys::FINALIZER_PVC_INTENT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::request::tests::claim;

    #[test]
    fn reads_what_a_claim_says() {
        let mut c = claim();
        let view = ClaimView(&c);
        assert_eq!(view.key(), "team-a/data");
        assert_eq!(view.class(), Some("fast"));
        assert_eq!(view.requested_storage(), Some("1Gi"));
        assert_eq!(view.provisioner(), None);
        assert!(!view.is_bound() && !view.holds_intent() && !view.is_deleting());

        let ann = c.metadata.annotations.get_or_insert_default();
        ann.insert(keys::ANN_BETA_STORAGE_CLASS.into(), "legacy".into());
        ann.insert(keys::ANN_BETA_STORAGE_PROVISIONER.into(), "beta".into());
        ann.insert(keys::ANN_ALPHA_SELECTED_NODE.into(), "n1".into());
        let view = ClaimView(&c);
        assert_eq!(view.class(), Some("legacy"), "the legacy annotation wins");
        assert_eq!(view.provisioner(), Some("beta"));
        assert!(view.asks("beta") && !view.asks("other"));
        assert_eq!(view.selected_node(), Some("n1"));
        assert_eq!(view.selected_node_key(), keys::ANN_ALPHA_SELECTED_NODE);

        let ann = c.metadata.annotations.get_or_insert_default();
        ann.insert(keys::ANN_STORAGE_PROVISIONER.into(), "ga".into());
        ann.insert(keys::ANN_SELECTED_NODE.into(), String::new());
        ann.insert(keys::ANN_MIGRATED_TO.into(), "migrated".into());
        let view = ClaimView(&c);
        assert_eq!(view.provisioner(), Some("ga"), "GA before beta");
        assert!(view.asks("migrated"));
        assert_eq!(
            view.selected_node(),
            None,
            "an empty GA value is read, as upstream"
        );
        assert_eq!(view.selected_node_key(), keys::ANN_SELECTED_NODE);
    }

    /// A claim of namespace `a` with a data source: `dataSource` (`ref_ns`
    /// `None`) or a `dataSourceRef` naming namespace `ref_ns`.
    fn from_source(
        kind: &str,
        group: Option<&str>,
        name: &str,
        ref_ns: Option<&str>,
        phase: Option<&str>,
    ) -> PersistentVolumeClaim {
        use k8s_openapi::api::core::v1::{
            PersistentVolumeClaimStatus, TypedLocalObjectReference, TypedObjectReference,
        };
        let mut c = claim();
        c.metadata.namespace = Some("a".into());
        let spec = c.spec.as_mut().unwrap();
        match ref_ns {
            None => {
                spec.data_source = Some(TypedLocalObjectReference {
                    api_group: group.map(String::from),
                    kind: kind.into(),
                    name: name.into(),
                })
            }
            Some(ns) => {
                spec.data_source_ref = Some(TypedObjectReference {
                    api_group: group.map(String::from),
                    kind: kind.into(),
                    name: name.into(),
                    namespace: Some(ns.into()),
                })
            }
        }
        c.status = phase.map(|p| PersistentVolumeClaimStatus {
            phase: Some(p.into()),
            ..Default::default()
        });
        c
    }

    #[test]
    fn only_a_pending_claim_made_from_a_source_keeps_its_protection() {
        const SNAP: &str = keys::SNAPSHOT_KIND;
        const PVC: &str = keys::CLAIM_KIND;
        let g = Some(keys::SNAPSHOT_API_GROUP);
        let p = Some("Pending");
        // (claim, kind asked about, namespace asked about, waits)
        let rows: Vec<(PersistentVolumeClaim, &str, &str, bool)> = vec![
            (from_source(SNAP, g, "src", None, p), SNAP, "a", true),
            (from_source(SNAP, g, "src", None, None), SNAP, "a", true),
            // upstream's sweep also counts a snapshot named without its group
            (from_source(SNAP, None, "src", None, p), SNAP, "a", true),
            (
                from_source(SNAP, Some("example.com"), "src", None, p),
                SNAP,
                "a",
                false,
            ),
            (
                from_source(SNAP, g, "src", None, Some("Bound")),
                SNAP,
                "a",
                false,
            ),
            (
                from_source(SNAP, g, "src", None, Some("Lost")),
                SNAP,
                "a",
                false,
            ),
            (from_source(SNAP, g, "src", None, p), SNAP, "b", false),
            (from_source(SNAP, g, "other", None, p), SNAP, "a", false),
            (from_source(SNAP, g, "src", None, p), PVC, "a", false),
            (from_source(PVC, None, "src", None, p), PVC, "a", true),
            (
                from_source(PVC, None, "src", None, Some("")),
                PVC,
                "a",
                true,
            ),
            (
                from_source(PVC, None, "src", None, Some("Bound")),
                PVC,
                "a",
                false,
            ),
            (from_source(PVC, None, "src", None, p), PVC, "b", false),
            (
                from_source(PVC, Some("example.com"), "src", None, p),
                PVC,
                "a",
                false,
            ),
            (from_source(PVC, None, "src", None, p), SNAP, "a", false),
            // a source in another namespace counts there (whatever the gate)
            (from_source(PVC, None, "src", Some("b"), p), PVC, "b", true),
            (from_source(PVC, None, "src", Some("b"), p), PVC, "a", false),
            (from_source(SNAP, g, "src", Some("b"), p), SNAP, "b", true),
            (from_source(SNAP, g, "src", Some("b"), p), SNAP, "a", false),
            (from_source(PVC, None, "src", Some("a"), p), PVC, "a", true),
            (claim(), PVC, "a", false),
        ];
        for (c, kind, namespace, waits) in rows {
            assert_eq!(
                ClaimView(&c).waits_for(kind, namespace, "src"),
                waits,
                "{kind} {namespace}/src: {:?} {:?}",
                c.spec.as_ref().unwrap(),
                c.status
            );
        }
    }

    #[test]
    fn an_empty_volume_name_is_not_a_binding() {
        let mut c = claim();
        c.spec.as_mut().unwrap().volume_name = Some(String::new());
        assert!(!ClaimView(&c).is_bound());
        c.spec.as_mut().unwrap().volume_name = Some("pv".into());
        assert_eq!(ClaimView(&c).volume_name(), Some("pv"));
    }

    #[test]
    fn the_vac_name_only_counts_with_the_gate_on() {
        let mut c = claim();
        c.spec.as_mut().unwrap().volume_attributes_class_name = Some("gold".into());
        let mut opts = ProvisionOptions::default();
        assert_eq!(ClaimView(&c).vac_name(&opts), Some("gold"));
        opts.volume_attributes_class = false;
        assert_eq!(ClaimView(&c).vac_name(&opts), None);
    }
}

/// Where a claim's content comes from (see [`ClaimView::data_source`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataSource<'a> {
    pub kind: &'a str,
    pub name: &'a str,
    /// Empty for the core group.
    pub api_group: &'a str,
    /// Another namespace, named by `dataSourceRef.namespace`.
    pub namespace: Option<&'a str>,
}
