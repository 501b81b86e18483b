//! Secret references from StorageClass parameters: which keys name which
//! secret, the deprecated spellings, the default-secret fallback, and the
//! `${...}` templates. Pure: resolving gives names, never secret data.
//! upstream: pkg/controller/controller.go getSecretReference and friends.

use std::collections::BTreeMap;

use super::ProvisionError;

/// One kind of secret a StorageClass can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecretKind {
    Provisioner,
    ControllerPublish,
    NodeStage,
    NodePublish,
    ControllerExpand,
    NodeExpand,
    ControllerModify,
}

struct KindKeys {
    kind: SecretKind,
    label: &'static str,
    name: &'static str,
    namespace: &'static str,
    deprecated: Option<(&'static str, &'static str)>,
}

const KINDS: [KindKeys; 7] = [
    KindKeys {
        kind: SecretKind::Provisioner,
        label: "Provisioner",
        name: "csi.storage.k8s.io/provisioner-secret-name",
        namespace: "csi.storage.k8s.io/provisioner-secret-namespace",
        deprecated: Some(("csiProvisionerSecretName", "csiProvisionerSecretNamespace")),
    },
    KindKeys {
        kind: SecretKind::ControllerPublish,
        label: "ControllerPublish",
        name: "csi.storage.k8s.io/controller-publish-secret-name",
        namespace: "csi.storage.k8s.io/controller-publish-secret-namespace",
        deprecated: Some((
            "csiControllerPublishSecretName",
            "csiControllerPublishSecretNamespace",
        )),
    },
    KindKeys {
        kind: SecretKind::NodeStage,
        label: "NodeStage",
        name: "csi.storage.k8s.io/node-stage-secret-name",
        namespace: "csi.storage.k8s.io/node-stage-secret-namespace",
        deprecated: Some(("csiNodeStageSecretName", "csiNodeStageSecretNamespace")),
    },
    KindKeys {
        kind: SecretKind::NodePublish,
        label: "NodePublish",
        name: "csi.storage.k8s.io/node-publish-secret-name",
        namespace: "csi.storage.k8s.io/node-publish-secret-namespace",
        deprecated: Some(("csiNodePublishSecretName", "csiNodePublishSecretNamespace")),
    },
    KindKeys {
        kind: SecretKind::ControllerExpand,
        label: "ControllerExpand",
        name: "csi.storage.k8s.io/controller-expand-secret-name",
        namespace: "csi.storage.k8s.io/controller-expand-secret-namespace",
        deprecated: None,
    },
    KindKeys {
        kind: SecretKind::NodeExpand,
        label: "NodeExpand",
        name: "csi.storage.k8s.io/node-expand-secret-name",
        namespace: "csi.storage.k8s.io/node-expand-secret-namespace",
        deprecated: None,
    },
    KindKeys {
        kind: SecretKind::ControllerModify,
        label: "ControllerModify",
        name: "csi.storage.k8s.io/controller-modify-secret-name",
        namespace: "csi.storage.k8s.io/controller-modify-secret-namespace",
        deprecated: None,
    },
];

/// The secret used for every kind that has no key of its own.
pub const DEFAULT_SECRET_NAME: &str = "csi.storage.k8s.io/secret-name";
pub const DEFAULT_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/secret-namespace";

/// Every `csi.storage.k8s.io/` key the sidecar understands (and strips).
pub fn is_known_prefixed_key(key: &str) -> bool {
    key == crate::keys::PARAM_FSTYPE
        || key == DEFAULT_SECRET_NAME
        || key == DEFAULT_SECRET_NAMESPACE
        || KINDS.iter().any(|k| k.name == key || k.namespace == key)
}

/// A resolved reference to a Secret object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    pub name: String,
    pub namespace: String,
}

/// What templates may refer to.
pub struct TemplateInputs<'a> {
    pub pv_name: &'a str,
    pub pvc_name: &'a str,
    pub pvc_namespace: &'a str,
    pub pvc_annotations: &'a BTreeMap<String, String>,
}

/// Why the keys of one kind of secret are not usable; upstream wraps it in
/// "failed to get [default ]name and namespace template from params: ".
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretParamsError {
    #[error(
        "{kind} secrets specified in parameters with both \"csi\" and \"{}\" keys",
        crate::keys::CSI_PARAMETER_PREFIX
    )]
    BothForms { kind: &'static str },
    #[error("either name and namespace for {kind} secrets specified, Both must be specified")]
    NameOrNamespaceMissing { kind: &'static str },
    #[error(
        "{kind} secrets specified in parameters but value of either namespace or name is empty"
    )]
    EmptyValue { kind: &'static str },
}

/// The name and namespace templates of one kind of secret, if the class
/// names them (upstream: verifyAndGetSecretNameAndNamespaceTemplate). Each of
/// the two may be given in the prefixed or the deprecated spelling, not both.
fn templates(
    kind: &'static str,
    (name_key, namespace_key): (&str, &str),
    deprecated: Option<(&str, &str)>,
    params: &BTreeMap<String, String>,
) -> Result<Option<(String, String)>, SecretParamsError> {
    let one =
        |key: &str, old: Option<&str>| match (params.get(key), old.and_then(|k| params.get(k))) {
            (Some(_), Some(_)) => Err(SecretParamsError::BothForms { kind }),
            (new, old) => Ok(new.or(old).cloned()),
        };
    let name = one(name_key, deprecated.map(|d| d.0))?;
    let namespace = one(namespace_key, deprecated.map(|d| d.1))?;
    match (name, namespace) {
        (None, None) => Ok(None),
        (Some(n), Some(ns)) if n.is_empty() || ns.is_empty() => {
            Err(SecretParamsError::EmptyValue { kind })
        }
        (Some(n), Some(ns)) => Ok(Some((n, ns))),
        _ => Err(SecretParamsError::NameOrNamespaceMissing { kind }),
    }
}

/// Resolves the reference for `kind` from StorageClass `params`. `Ok(None)`
/// means the class names no such secret (nor a default one).
pub fn resolve(
    kind: SecretKind,
    params: &BTreeMap<String, String>,
    inputs: &TemplateInputs<'_>,
) -> Result<Option<SecretRef>, ProvisionError> {
    let keys = KINDS
        .iter()
        .find(|k| k.kind == kind)
        .expect("every kind has keys");
    let own = templates(
        keys.label,
        (keys.name, keys.namespace),
        keys.deprecated,
        params,
    )
    .map_err(|reason| ProvisionError::SecretParams {
        default: false,
        reason,
    })?;
    let found = match own {
        Some(t) => Some(t),
        None => templates(
            "Default",
            (DEFAULT_SECRET_NAME, DEFAULT_SECRET_NAMESPACE),
            None,
            params,
        )
        .map_err(|reason| ProvisionError::SecretParams {
            default: true,
            reason,
        })?,
    };
    let Some((name_tmpl, ns_tmpl)) = found else {
        return Ok(None);
    };
    let namespace = expand(&ns_tmpl, |token| match token {
        "pv.name" => Some(inputs.pv_name.to_string()),
        "pvc.namespace" => Some(inputs.pvc_namespace.to_string()),
        _ => None,
    })
    .map_err(|tokens| ProvisionError::SecretTemplate {
        template: ns_tmpl.clone(),
        tokens,
    })?;
    if !is_dns1123_label(&namespace) {
        return Err(ProvisionError::SecretInvalidNamespace {
            template: ns_tmpl,
            resolved: namespace,
        });
    }
    let name = expand(&name_tmpl, |token| match token {
        "pv.name" => Some(inputs.pv_name.to_string()),
        "pvc.name" => Some(inputs.pvc_name.to_string()),
        "pvc.namespace" => Some(inputs.pvc_namespace.to_string()),
        // An annotation the claim does not have is an invalid token, as upstream.
        t => annotation_token(t).and_then(|key| inputs.pvc_annotations.get(key).cloned()),
    })
    .map_err(|tokens| ProvisionError::SecretTemplate {
        template: name_tmpl.clone(),
        tokens,
    })?;
    if !is_dns1123_subdomain(&name) {
        return Err(ProvisionError::SecretInvalidName {
            template: name_tmpl,
            resolved: name,
        });
    }
    Ok(Some(SecretRef { name, namespace }))
}

/// `pvc.annotations['key']` → `key`.
fn annotation_token(token: &str) -> Option<&str> {
    token.strip_prefix("pvc.annotations['")?.strip_suffix("']")
}

/// Expands `${token}` and `$token` like Go's `os.Expand`. Unknown tokens are
/// collected and returned as the error, sorted and without repeats (as
/// upstream's string set lists them).
pub fn expand(
    template: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, Vec<String>> {
    let mut out = String::with_capacity(template.len());
    let mut invalid = Vec::new();
    let mut rest = template;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let (token, consumed) = shell_name(after);
        match token {
            // `$` not followed by a name stays as it is.
            None if consumed == 0 => out.push('$'),
            // Bad syntax (`${}` or an unclosed `${`) is dropped, as Go does.
            None => {}
            Some(t) => match lookup(t) {
                Some(v) => out.push_str(&v),
                None => invalid.push(t.to_string()),
            },
        }
        rest = &after[consumed..];
    }
    out.push_str(rest);
    if invalid.is_empty() {
        Ok(out)
    } else {
        invalid.sort();
        invalid.dedup();
        Err(invalid)
    }
}

/// The token after a `$` and how many bytes it used (Go's getShellName).
fn shell_name(s: &str) -> (Option<&str>, usize) {
    if let Some(inner) = s.strip_prefix('{') {
        return match inner.find('}') {
            Some(0) => (None, 2),
            Some(end) => (Some(&inner[..end]), end + 2),
            None => (None, 1),
        };
    }
    let mut chars = s.char_indices();
    match chars.next() {
        None => (None, 0),
        // Go treats one special character as a whole name.
        Some((_, c)) if "*#$@!?-".contains(c) || c.is_ascii_digit() => (Some(&s[..1]), 1),
        Some((_, c)) if !(c == '_' || c.is_ascii_alphanumeric()) => (None, 0),
        Some(_) => {
            let end = s
                .char_indices()
                .find(|(_, c)| !(*c == '_' || c.is_ascii_alphanumeric()))
                .map(|(i, _)| i)
                .unwrap_or(s.len());
            (Some(&s[..end]), end)
        }
    }
}

pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn inputs(ann: &BTreeMap<String, String>) -> TemplateInputs<'_> {
        TemplateInputs {
            pv_name: "pvc-123",
            pvc_name: "data",
            pvc_namespace: "team-a",
            pvc_annotations: ann,
        }
    }

    /// Parameters, the kind asked for, and the reference or an error fragment.
    type Case = (
        Vec<(&'static str, &'static str)>,
        SecretKind,
        Result<Option<SecretRef>, &'static str>,
    );

    fn sref(name: &str, ns: &str) -> Option<SecretRef> {
        Some(SecretRef {
            name: name.into(),
            namespace: ns.into(),
        })
    }

    #[test]
    fn resolves_each_form() {
        let ann: BTreeMap<String, String> = [("owner".to_string(), "alice".to_string())].into();
        let p = "csi.storage.k8s.io/provisioner-secret-name";
        let pn = "csi.storage.k8s.io/provisioner-secret-namespace";
        let table: Vec<Case> = vec![
            (vec![], SecretKind::Provisioner, Ok(None)),
            (
                vec![(p, "s"), (pn, "ns")],
                SecretKind::Provisioner,
                Ok(sref("s", "ns")),
            ),
            (
                vec![
                    ("csiProvisionerSecretName", "old"),
                    ("csiProvisionerSecretNamespace", "ns"),
                ],
                SecretKind::Provisioner,
                Ok(sref("old", "ns")),
            ),
            (
                vec![(DEFAULT_SECRET_NAME, "d"), (DEFAULT_SECRET_NAMESPACE, "dn")],
                SecretKind::NodeExpand,
                Ok(sref("d", "dn")),
            ),
            (
                vec![
                    (p, "s"),
                    (pn, "ns"),
                    (DEFAULT_SECRET_NAME, "d"),
                    (DEFAULT_SECRET_NAMESPACE, "dn"),
                ],
                SecretKind::Provisioner,
                Ok(sref("s", "ns")),
            ),
            (
                vec![(p, "${pvc.name}-${pv.name}"), (pn, "${pvc.namespace}")],
                SecretKind::Provisioner,
                Ok(sref("data-pvc-123", "team-a")),
            ),
            (
                vec![(p, "${pvc.annotations['owner']}"), (pn, "x")],
                SecretKind::Provisioner,
                Ok(sref("alice", "x")),
            ),
            (
                vec![(p, "s")],
                SecretKind::Provisioner,
                Err("either name and namespace"),
            ),
            (
                vec![(p, ""), (pn, "")],
                SecretKind::Provisioner,
                Err("empty"),
            ),
            (
                vec![(p, "s"), (pn, "ns"), ("csiProvisionerSecretName", "o")],
                SecretKind::Provisioner,
                Err(
                    "failed to get name and namespace template from params: Provisioner secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys",
                ),
            ),
            // One field in each spelling is not "both" (upstream counts per field).
            (
                vec![(p, "s"), ("csiProvisionerSecretNamespace", "ns")],
                SecretKind::Provisioner,
                Ok(sref("s", "ns")),
            ),
            (
                vec![(DEFAULT_SECRET_NAME, "d")],
                SecretKind::ControllerPublish,
                Err(
                    "failed to get default name and namespace template from params: either name and namespace for Default secrets specified, Both must be specified",
                ),
            ),
            (
                vec![("csi.storage.k8s.io/controller-publish-secret-name", "s")],
                SecretKind::ControllerPublish,
                Err(
                    "failed to get name and namespace template from params: either name and namespace for ControllerPublish secrets specified, Both must be specified",
                ),
            ),
            (
                vec![(p, "${pvc.annotations['missing']}"), (pn, "x")],
                SecretKind::Provisioner,
                Err(
                    "error resolving value \"${pvc.annotations['missing']}\": invalid tokens: [\"pvc.annotations['missing']\"]",
                ),
            ),
            (
                vec![(p, "bad name"), (pn, "ns")],
                SecretKind::Provisioner,
                Err("\"bad name\" is not a valid secret name"),
            ),
            (
                vec![(p, "${pvc.name}_x"), (pn, "ns")],
                SecretKind::Provisioner,
                Err("\"${pvc.name}_x\" resolved to \"data_x\" which is not a valid secret name"),
            ),
            (
                vec![(p, "${pvc.uid}"), (pn, "ns")],
                SecretKind::Provisioner,
                Err("invalid tokens"),
            ),
            (
                vec![(p, "s"), (pn, "${pvc.name}")],
                SecretKind::Provisioner,
                Err("invalid tokens"),
            ),
            (
                vec![(p, "Bad_Name"), (pn, "ns")],
                SecretKind::Provisioner,
                Err("not a valid secret name"),
            ),
            (
                vec![(p, "s"), (pn, "a.b")],
                SecretKind::Provisioner,
                Err("not a valid namespace"),
            ),
        ];
        for (pairs, kind, want) in table {
            let ann = ann.clone();
            let got = resolve(kind, &params(&pairs), &inputs(&ann));
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{pairs:?}"),
                (Err(e), Err(fragment)) => {
                    assert!(
                        e.to_string().contains(fragment),
                        "{pairs:?}: {e} lacks {fragment:?}"
                    )
                }
                (g, w) => panic!("{pairs:?}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn expand_matches_go_os_expand() {
        let look = |t: &str| (t == "a").then(|| "A".to_string());
        assert_eq!(expand("x${a}y$a", look).unwrap(), "xAyA");
        assert_eq!(expand("plain", look).unwrap(), "plain");
        assert_eq!(expand("${c}-$b-$c", look).unwrap_err(), vec!["b", "c"]);
        assert_eq!(expand("tail$", look).unwrap(), "tail$");
        assert_eq!(expand("a $ b", look).unwrap(), "a $ b");
        assert_eq!(expand("${unclosed", look).unwrap(), "unclosed");
        assert_eq!(expand("${}x", look).unwrap(), "x");
        assert_eq!(expand("a$-b", look).unwrap_err(), vec!["-"]);
    }

    /// Property: expanding never panics, whatever the bytes (multi-byte UTF-8 included).
    #[test]
    fn expand_never_panics() {
        let alphabet = [
            '$', '{', '}', 'a', '_', '-', '\'', '[', ']', '.', 'é', '😀', '0', ' ',
        ];
        let mut seed: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..20_000 {
            let len = (seed % 12) as usize;
            let mut s = String::new();
            for _ in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                s.push(alphabet[(seed % alphabet.len() as u64) as usize]);
            }
            let _ = expand(&s, |t| (t.len() % 2 == 0).then(|| t.to_uppercase()));
            let ann = BTreeMap::new();
            let p = params(&[(DEFAULT_SECRET_NAME, &s), (DEFAULT_SECRET_NAMESPACE, &s)]);
            let _ = resolve(SecretKind::Provisioner, &p, &inputs(&ann));
        }
    }
}
