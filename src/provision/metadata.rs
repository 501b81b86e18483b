//! Claim and namespace metadata as `CreateVolume` parameters: the values of
//! the listed labels and annotations (opt-in and allow-listed), each checked
//! against what CSI lets a driver be sent.
//! upstream: PR #1531 (the namespace's; the claim's are ours, the same shape).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::ProvisionError;
use crate::config::MetadataConfig;
use crate::keys;

/// Where a parameter's value comes from: the prefix of its key and how an
/// event names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    ClaimLabel,
    ClaimAnnotation,
    NamespaceLabel,
    NamespaceAnnotation,
}

impl Origin {
    fn prefix(self) -> &'static str {
        match self {
            Origin::ClaimLabel => keys::PARAM_PVC_LABELS,
            Origin::ClaimAnnotation => keys::PARAM_PVC_ANNOTATIONS,
            Origin::NamespaceLabel => keys::PARAM_NAMESPACE_LABELS,
            Origin::NamespaceAnnotation => keys::PARAM_NAMESPACE_ANNOTATIONS,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Origin::ClaimLabel => "claim label",
            Origin::ClaimAnnotation => "claim annotation",
            Origin::NamespaceLabel => "namespace label",
            Origin::NamespaceAnnotation => "namespace annotation",
        }
    }
}

/// The parameters the listed labels and annotations of the claim (`claim`)
/// and of its namespace (`namespace`, `None` when none is listed) add: for
/// each listed key the object has, `<prefix><key>` = its value. A value no
/// driver can be expected to take is refused, naming its key.
pub fn parameters(
    claim: &ObjectMeta,
    namespace: Option<&ObjectMeta>,
    keys: &MetadataConfig,
) -> Result<BTreeMap<String, String>, ProvisionError> {
    let none = ObjectMeta::default();
    let namespace = namespace.unwrap_or(&none);
    let lists = [
        (Origin::ClaimLabel, &keys.pvc_labels, claim.labels.as_ref()),
        (
            Origin::ClaimAnnotation,
            &keys.pvc_annotations,
            claim.annotations.as_ref(),
        ),
        (
            Origin::NamespaceLabel,
            &keys.namespace_labels,
            namespace.labels.as_ref(),
        ),
        (
            Origin::NamespaceAnnotation,
            &keys.namespace_annotations,
            namespace.annotations.as_ref(),
        ),
    ];
    let mut out = BTreeMap::new();
    for (from, listed, values) in lists {
        let Some(values) = values else { continue };
        for key in listed {
            if let Some(value) = values.get(key) {
                checked(from, key, value)?;
                out.insert(format!("{}{key}", from.prefix()), value.clone());
            }
        }
    }
    Ok(out)
}

/// A value CSI lets a driver be sent: at most 128 bytes (its limit for a
/// string), and no control characters (a newline or tab in an annotation:
/// drivers pass parameters on as tags, command lines, log lines).
fn checked(from: Origin, key: &str, value: &str) -> Result<(), ProvisionError> {
    let refused = |reason: String| ProvisionError::MetadataValue {
        from: from.name(),
        key: key.to_string(),
        parameter: format!("{}{key}", from.prefix()),
        reason,
    };
    if value.len() > keys::CSI_MAX_STRING_BYTES {
        return Err(refused(format!(
            "its value is {} bytes, more than the {} bytes CSI allows a string",
            value.len(),
            keys::CSI_MAX_STRING_BYTES
        )));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(refused(format!(
            "its value holds the control character U+{:04X}",
            u32::from(c)
        )));
    }
    Ok(())
}

/// The parameters of `base` with `added` must fit CSI's limit for a map
/// (keys and values together). Checked only when metadata is added: a class
/// alone is sent as it is, as upstream sends it.
pub fn check_total(
    base: &HashMap<String, String>,
    added: &BTreeMap<String, String>,
) -> Result<(), ProvisionError> {
    if added.is_empty() {
        return Ok(());
    }
    let bytes: usize = base
        .iter()
        .filter(|(k, _)| !added.contains_key(*k))
        .chain(added.iter())
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if bytes > keys::CSI_MAX_MAP_BYTES {
        return Err(ProvisionError::MetadataTooLarge { bytes });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        let map = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        ObjectMeta {
            labels: map(labels),
            annotations: map(annotations),
            ..Default::default()
        }
    }

    fn listed(pvc: &[&str], pvc_ann: &[&str], ns: &[&str], ns_ann: &[&str]) -> MetadataConfig {
        let v = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect();
        MetadataConfig {
            pvc_labels: v(pvc),
            pvc_annotations: v(pvc_ann),
            namespace_labels: v(ns),
            namespace_annotations: v(ns_ann),
            ..Default::default()
        }
    }

    #[test]
    fn only_listed_keys_the_objects_have_become_parameters() {
        let claim = meta(
            &[("team", "a"), ("app", "db")],
            &[("example.com/owner", "jo")],
        );
        let ns = meta(&[("tier", "gold")], &[("example.com/account", "acct-1")]);
        assert!(
            parameters(&claim, Some(&ns), &MetadataConfig::default())
                .unwrap()
                .is_empty(),
            "nothing by default"
        );
        let keys = listed(
            &["team", "absent"],
            &["example.com/owner"],
            &["tier"],
            &["example.com/account", "absent"],
        );
        let got = parameters(&claim, Some(&ns), &keys).unwrap();
        let want: BTreeMap<String, String> = [
            ("csi.storage.k8s.io/pvc/labels/team", "a"),
            ("csi.storage.k8s.io/pvc/annotations/example.com/owner", "jo"),
            ("csi.storage.k8s.io/namespace/labels/tier", "gold"),
            (
                "csi.storage.k8s.io/namespace/annotations/example.com/account",
                "acct-1",
            ),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        assert_eq!(got, want);
        // A claim's label is never taken for its namespace's, nor the other way round.
        let crossed = listed(&["tier"], &[], &["team"], &[]);
        assert!(parameters(&claim, Some(&ns), &crossed).unwrap().is_empty());
    }

    #[test]
    fn a_value_no_driver_can_take_is_refused_naming_its_key() {
        let long = "x".repeat(129);
        let cases = [
            (
                meta(&[], &[("example.com/note", long.as_str())]),
                "129 bytes",
            ),
            (meta(&[], &[("example.com/note", "two\nlines")]), "U+000A"),
        ];
        let keys = listed(&[], &["example.com/note"], &[], &["example.com/note"]);
        for (object, why) in cases {
            for (claim, ns, from) in [
                (&object, None, "claim annotation"),
                (
                    &ObjectMeta::default(),
                    Some(&object),
                    "namespace annotation",
                ),
            ] {
                let err = parameters(claim, ns, &keys).unwrap_err().to_string();
                assert!(
                    err.contains(&format!("{from} \"example.com/note\"")) && err.contains(why),
                    "{err}"
                );
                assert!(
                    !err.contains("two\nlines") && !err.contains(&long),
                    "no value: {err}"
                );
            }
        }
        let fits = "x".repeat(128);
        let ok = meta(&[], &[("example.com/note", fits.as_str())]);
        assert!(parameters(&ok, None, &keys).is_ok());
    }

    #[test]
    fn all_parameters_with_the_metadata_must_fit_cs_is_map_limit() {
        let base: HashMap<String, String> = [("type".to_string(), "x".repeat(3000))].into();
        let small: BTreeMap<String, String> = [("k".to_string(), "v".repeat(90))].into();
        assert!(check_total(&base, &small).is_ok());
        let big: BTreeMap<String, String> = (0..10)
            .map(|i| {
                (
                    format!("csi.storage.k8s.io/pvc/labels/k{i}"),
                    "v".repeat(100),
                )
            })
            .collect();
        let err = check_total(&base, &big).unwrap_err();
        assert!(
            err.to_string().contains("more than the 4096 bytes"),
            "{err}"
        );
        assert!(
            check_total(&base, &BTreeMap::new()).is_ok(),
            "a class alone is sent as it is"
        );
    }
}
