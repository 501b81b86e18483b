//! The node affinity of a PV created by a migrated plugin's CSI driver, put
//! back in the Kubernetes zone/region labels the in-tree plugin used (and the
//! matching PV labels), as csi-translation-lib does so that a rollback to the
//! in-tree plugin still schedules the volume's pods.

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume};

use crate::keys::{
    LABEL_REGION as REGION_GA, LABEL_REGION_BETA as REGION_BETA, LABEL_ZONE as ZONE_GA,
    LABEL_ZONE_BETA as ZONE_BETA,
};

/// Several zones in one PV label value.
pub(super) const ZONE_DELIMITER: &str = "__";

/// Derives the one region of a set of zones.
pub type RegionOf = fn(&[String]) -> Result<String, String>;

fn terms(pv: &PersistentVolume) -> &[NodeSelectorTerm] {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default()
}

fn terms_mut(pv: &mut PersistentVolume) -> Option<&mut Vec<NodeSelectorTerm>> {
    pv.spec
        .as_mut()?
        .node_affinity
        .as_mut()?
        .required
        .as_mut()
        .map(|r| &mut r.node_selector_terms)
}

fn expressions(term: &NodeSelectorTerm) -> &[NodeSelectorRequirement] {
    term.match_expressions.as_deref().unwrap_or_default()
}

fn names_key(pv: &PersistentVolume, key: &str) -> bool {
    terms(pv)
        .iter()
        .any(|t| expressions(t).iter().any(|e| e.key == key))
}

/// The zone and region labels the PV speaks of: GA unless its affinity, or
/// failing that its labels, name the beta zone label first.
fn kubernetes_labels(pv: &PersistentVolume) -> (&'static str, &'static str) {
    const GA: (&str, &str) = (ZONE_GA, REGION_GA);
    const BETA: (&str, &str) = (ZONE_BETA, REGION_BETA);
    if names_key(pv, ZONE_GA) {
        return GA;
    }
    if names_key(pv, ZONE_BETA) {
        return BETA;
    }
    let labels = pv.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(ZONE_GA)) {
        return GA;
    }
    if labels.is_some_and(|l| l.contains_key(ZONE_BETA)) {
        return BETA;
    }
    GA
}

/// Every expression on `old` now on `new` (values untouched, no merging).
fn rename(pv: &mut PersistentVolume, old: &str, new: &str) {
    for term in terms_mut(pv).into_iter().flatten() {
        for e in term.match_expressions.iter_mut().flatten() {
            if e.key == old {
                e.key = new.to_string();
            }
        }
    }
}

/// The distinct values of `key` over all terms, sorted.
fn values(pv: &PersistentVolume, key: &str) -> Vec<String> {
    let mut out: Vec<String> = terms(pv)
        .iter()
        .flat_map(expressions)
        .filter(|e| e.key == key)
        .flat_map(|e| e.values.iter().flatten().cloned())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Sets a PV label unless the PV has it already.
fn label_if_absent(pv: &mut PersistentVolume, key: &str, value: String) {
    pv.metadata
        .labels
        .get_or_insert_with(Default::default)
        .entry(key.to_string())
        .or_insert(value);
}

/// A region expression in each term that has none, derived from that term's
/// zones; the PV's region label when that gives exactly one region.
fn add_regions(pv: &mut PersistentVolume, region_of: RegionOf) -> Result<(), String> {
    let (zone_label, region_label) = kubernetes_labels(pv);
    let Some(terms) = terms_mut(pv).filter(|t| !t.is_empty()) else {
        return Ok(());
    };
    for term in terms.iter_mut() {
        let list = term.match_expressions.get_or_insert_with(Vec::new);
        if list.iter().any(|e| e.key == region_label) {
            continue;
        }
        let zones: Vec<String> = list
            .iter()
            .filter(|e| e.key == zone_label)
            .flat_map(|e| e.values.iter().flatten().cloned())
            .collect();
        let region = region_of(&zones)
            .map_err(|e| format!("Failed to handle region topology. error: {e}"))?;
        list.push(NodeSelectorRequirement {
            key: region_label.to_string(),
            operator: "In".to_string(),
            values: Some(vec![region]),
        });
    }
    if let [region] = values(pv, region_label).as_slice() {
        label_if_absent(pv, region_label, region.clone());
    }
    Ok(())
}

/// A PV of a driver with one zonal key (AWS EBS, GCE PD, Cinder): that key
/// becomes the Kubernetes zone label, the region is added when the plugin
/// has regions (`region_of`), and the PV is labelled with its zones.
pub fn to_in_tree(
    pv: &mut PersistentVolume,
    csi_key: &str,
    region_of: Option<RegionOf>,
) -> Result<(), String> {
    let (zone_label, _) = kubernetes_labels(pv);
    rename(pv, csi_key, zone_label);
    if let Some(region_of) = region_of {
        add_regions(pv, region_of)?;
    }
    let zones = values(pv, zone_label);
    if !zones.is_empty() {
        label_if_absent(pv, zone_label, zones.join(ZONE_DELIMITER));
    }
    Ok(())
}

/// A vSphere PV: the driver's zone and region keys become the Kubernetes
/// ones, and the PV is labelled with the first zone and the first region.
pub fn vsphere_to_in_tree(pv: &mut PersistentVolume, zone_key: &str, region_key: &str) {
    let (zone_label, region_label) = kubernetes_labels(pv);
    rename(pv, zone_key, zone_label);
    rename(pv, region_key, region_label);
    for label in [zone_label, region_label] {
        if let Some(first) = values(pv, label).into_iter().next() {
            label_if_absent(pv, label, first);
        }
    }
}

/// The one region of a list of regions (each once), or why there is none.
pub(super) fn one_region(mut regions: Vec<String>) -> Result<String, String> {
    regions.sort();
    match regions.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "multiple or no regions gotten from zones, got: {regions:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::aws_ebs::region as aws_region;
    use super::super::gce_pd::region as gce_region;
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSelector, PersistentVolumeSpec, VolumeNodeAffinity};
    use std::collections::BTreeMap;

    /// A PV whose affinity has one term per entry, each of `(key, values)`.
    fn pv(terms: &[&[(&str, &[&str])]], labels: &[(&str, &str)]) -> PersistentVolume {
        PersistentVolume {
            metadata: kube::api::ObjectMeta {
                labels: (!labels.is_empty()).then(|| {
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                }),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                node_affinity: (!terms.is_empty()).then(|| VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: terms
                            .iter()
                            .map(|t| NodeSelectorTerm {
                                match_expressions: Some(
                                    t.iter()
                                        .map(|(k, v)| NodeSelectorRequirement {
                                            key: k.to_string(),
                                            operator: "In".into(),
                                            values: Some(v.iter().map(|s| s.to_string()).collect()),
                                        })
                                        .collect(),
                                ),
                                match_fields: None,
                            })
                            .collect(),
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The affinity as `key=v1|v2` per expression, one list per term.
    fn affinity(pv: &PersistentVolume) -> Vec<Vec<String>> {
        terms(pv)
            .iter()
            .map(|t| {
                expressions(t)
                    .iter()
                    .map(|e| {
                        format!(
                            "{}={}",
                            e.key,
                            e.values.clone().unwrap_or_default().join("|")
                        )
                    })
                    .collect()
            })
            .collect()
    }

    fn labels(pv: &PersistentVolume) -> BTreeMap<String, String> {
        pv.metadata.labels.clone().unwrap_or_default()
    }

    const EBS: &str = "topology.ebs.csi.aws.com/zone";
    const GKE: &str = "topology.gke.io/zone";
    const CINDER: &str = "topology.cinder.csi.openstack.org/zone";

    #[test]
    fn a_zonal_csi_key_becomes_the_kubernetes_zone_with_its_region() {
        struct Case {
            name: &'static str,
            pv: PersistentVolume,
            key: &'static str,
            region: Option<RegionOf>,
            affinity: Vec<Vec<&'static str>>,
            labels: Vec<(&'static str, &'static str)>,
        }
        let cases = [
            Case {
                name: "aws: one zone, GA labels and the region",
                pv: pv(&[&[(EBS, &["us-east-1a"])]], &[]),
                key: EBS,
                region: Some(aws_region),
                affinity: vec![vec![
                    "topology.kubernetes.io/zone=us-east-1a",
                    "topology.kubernetes.io/region=us-east-1",
                ]],
                labels: vec![
                    ("topology.kubernetes.io/region", "us-east-1"),
                    ("topology.kubernetes.io/zone", "us-east-1a"),
                ],
            },
            Case {
                name: "gce: two terms, the zone label joins the zones",
                pv: pv(
                    &[&[(GKE, &["europe-west1-b"])], &[(GKE, &["europe-west1-c"])]],
                    &[],
                ),
                key: GKE,
                region: Some(gce_region),
                affinity: vec![
                    vec![
                        "topology.kubernetes.io/zone=europe-west1-b",
                        "topology.kubernetes.io/region=europe-west1",
                    ],
                    vec![
                        "topology.kubernetes.io/zone=europe-west1-c",
                        "topology.kubernetes.io/region=europe-west1",
                    ],
                ],
                labels: vec![
                    ("topology.kubernetes.io/region", "europe-west1"),
                    (
                        "topology.kubernetes.io/zone",
                        "europe-west1-b__europe-west1-c",
                    ),
                ],
            },
            Case {
                name: "a beta zone label on the PV: beta keys",
                pv: pv(
                    &[&[(EBS, &["us-west-2a"])]],
                    &[("failure-domain.beta.kubernetes.io/zone", "kept")],
                ),
                key: EBS,
                region: Some(aws_region),
                affinity: vec![vec![
                    "failure-domain.beta.kubernetes.io/zone=us-west-2a",
                    "failure-domain.beta.kubernetes.io/region=us-west-2",
                ]],
                labels: vec![
                    ("failure-domain.beta.kubernetes.io/region", "us-west-2"),
                    ("failure-domain.beta.kubernetes.io/zone", "kept"),
                ],
            },
            Case {
                name: "a term with its region already: left alone",
                pv: pv(
                    &[&[(EBS, &["us-west-2a"]), (REGION_GA, &["elsewhere"])]],
                    &[],
                ),
                key: EBS,
                region: Some(aws_region),
                affinity: vec![vec![
                    "topology.kubernetes.io/zone=us-west-2a",
                    "topology.kubernetes.io/region=elsewhere",
                ]],
                labels: vec![
                    ("topology.kubernetes.io/region", "elsewhere"),
                    ("topology.kubernetes.io/zone", "us-west-2a"),
                ],
            },
            Case {
                name: "cinder: no region",
                pv: pv(&[&[(CINDER, &["nova"]), ("other", &["x"])]], &[]),
                key: CINDER,
                region: None,
                affinity: vec![vec!["topology.kubernetes.io/zone=nova", "other=x"]],
                labels: vec![("topology.kubernetes.io/zone", "nova")],
            },
            Case {
                name: "no affinity: nothing",
                pv: pv(&[], &[]),
                key: EBS,
                region: Some(aws_region),
                affinity: vec![],
                labels: vec![],
            },
        ];
        for mut case in cases {
            to_in_tree(&mut case.pv, case.key, case.region).unwrap();
            assert_eq!(affinity(&case.pv), case.affinity, "{}", case.name);
            let want: BTreeMap<String, String> = case
                .labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            assert_eq!(labels(&case.pv), want, "{}", case.name);
        }
    }

    #[test]
    fn zones_that_give_no_single_region_fail() {
        let mut two = pv(&[&[(EBS, &["us-east-1a", "us-west-2a"])]], &[]);
        let err = to_in_tree(&mut two, EBS, Some(aws_region)).unwrap_err();
        assert!(err.contains("multiple or no regions"), "{err}");
        // A term without a zone (the driver reported another key only).
        let mut none = pv(&[&[("rack", &["r1"])]], &[]);
        let err = to_in_tree(&mut none, GKE, Some(gce_region)).unwrap_err();
        assert_eq!(
            err,
            "Failed to handle region topology. error: no zones specified"
        );
        let mut bad = pv(&[&[(GKE, &["nozone"])]], &[]);
        assert!(
            to_in_tree(&mut bad, GKE, Some(gce_region))
                .unwrap_err()
                .contains("zone in unexpected format")
        );
    }

    #[test]
    fn aws_zone_forms() {
        for (zone, region) in [
            ("us-west-2a", Ok("us-west-2")),
            ("us-gov-east-1a", Ok("us-gov-east-1")),
            ("us-west-2-lax-1a", Ok("us-west-2")),
            ("us-east-1-wl1-bos-wlz-1", Ok("us-east-1")),
            ("us-west-10a", Err(())),
            ("nova", Err(())),
        ] {
            assert_eq!(
                aws_region(&[zone.to_string()]).map_err(|_| ()),
                region.map(String::from),
                "{zone}"
            );
        }
    }

    #[test]
    fn vsphere_keys_become_zone_and_region_labels() {
        let mut v = pv(
            &[&[
                ("topology.csi.vmware.com/zone", &["z2", "z1"]),
                ("topology.csi.vmware.com/region", &["r1"]),
            ]],
            &[],
        );
        vsphere_to_in_tree(
            &mut v,
            "topology.csi.vmware.com/zone",
            "topology.csi.vmware.com/region",
        );
        assert_eq!(
            affinity(&v),
            vec![vec![
                "topology.kubernetes.io/zone=z2|z1",
                "topology.kubernetes.io/region=r1"
            ]]
        );
        let want: BTreeMap<String, String> = [
            ("topology.kubernetes.io/region", "r1"),
            ("topology.kubernetes.io/zone", "z1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(labels(&v), want);
    }
}
