//! Cross-namespace data sources (`CrossNamespaceVolumeDataSource`, alpha,
//! off by default): a claim's `dataSourceRef` may name an object in another
//! namespace, which the owners of that namespace allow with a ReferenceGrant
//! there. Upstream checks this before anything else about the source; so do
//! we (`controller::claim::create::prepare` reads the grants live).

use super::{ClaimView, DataSource, ProvisionError, ProvisionOptions};
use crate::keys;
use crate::kube::reference_grant::ReferenceGrant;

/// The claim's data source when it lives in another namespace and the gate
/// lets the claim name one: what a grant in that namespace must allow.
pub fn foreign_source<'a>(view: ClaimView<'a>, opts: &ProvisionOptions) -> Option<DataSource<'a>> {
    let source = view.data_source()?;
    let namespace = view.data_source_namespace(opts.cross_namespace_data_source)?;
    (namespace != view.namespace()).then_some(source)
}

/// Whether one of `grants` lets `view` (a claim) use `source`, an object in
/// the grants' namespace: a grant of that namespace whose `from` names claims
/// of the claim's namespace and whose `to` names the source's group and kind,
/// and its name or no name at all.
pub fn check(
    grants: &[ReferenceGrant],
    view: ClaimView,
    source: &DataSource,
) -> Result<(), ProvisionError> {
    let namespace = source.namespace.unwrap_or_default();
    let allows = |grant: &ReferenceGrant| {
        let from_claims = grant.spec.from.iter().any(|f| {
            f.group.is_empty() && f.kind == keys::CLAIM_KIND && f.namespace == view.namespace()
        });
        let to_source = grant.spec.to.iter().any(|t| {
            t.group == source.api_group
                && t.kind == source.kind
                && t.name
                    .as_deref()
                    .is_none_or(|n| n.is_empty() || n == source.name)
        });
        grant.metadata.namespace.as_deref() == Some(namespace) && from_claims && to_source
    };
    if grants.iter().any(allows) {
        Ok(())
    } else {
        Err(ProvisionError::NotGranted {
            object: format!("{namespace}/{}", source.name),
            kind: source.kind.to_string(),
            claim: view.key(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::reference_grant::{GrantFrom, GrantTo, ReferenceGrantSpec};
    use crate::provision::request::tests::claim;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, TypedObjectReference};

    /// The claim `team-a/data` restoring (or cloning) `name` in namespace `b`.
    fn claim_from(kind: &str, group: Option<&str>, name: &str) -> PersistentVolumeClaim {
        let mut c = claim();
        c.spec.as_mut().unwrap().data_source_ref = Some(TypedObjectReference {
            api_group: group.map(String::from),
            kind: kind.into(),
            name: name.into(),
            namespace: Some("b".into()),
        });
        c
    }

    fn grant(
        namespace: &str,
        from: (&str, &str, &str),
        to: (&str, &str, Option<&str>),
    ) -> ReferenceGrant {
        let mut g = ReferenceGrant::default();
        g.metadata.namespace = Some(namespace.into());
        g.spec = ReferenceGrantSpec {
            from: vec![GrantFrom {
                group: from.0.into(),
                kind: from.1.into(),
                namespace: from.2.into(),
            }],
            to: vec![GrantTo {
                group: to.0.into(),
                kind: to.1.into(),
                name: to.2.map(String::from),
            }],
        };
        g
    }

    const PVC: &str = keys::CLAIM_KIND;
    const SNAP: &str = keys::SNAPSHOT_KIND;
    const SG: &str = keys::SNAPSHOT_API_GROUP;

    #[test]
    fn a_source_in_another_namespace_needs_the_gate() {
        let c = claim_from(PVC, None, "src");
        let mut opts = ProvisionOptions::default();
        assert_eq!(foreign_source(ClaimView(&c), &opts), None, "gate off");
        opts.cross_namespace_data_source = true;
        let source = foreign_source(ClaimView(&c), &opts).unwrap();
        assert_eq!(
            (source.kind, source.name, source.namespace),
            (PVC, "src", Some("b"))
        );

        let mut local = c.clone();
        local
            .spec
            .as_mut()
            .unwrap()
            .data_source_ref
            .as_mut()
            .unwrap()
            .namespace = Some("team-a".into());
        assert_eq!(
            foreign_source(ClaimView(&local), &opts),
            None,
            "its own namespace"
        );
        assert_eq!(
            foreign_source(ClaimView(&claim()), &opts),
            None,
            "no source"
        );
    }

    #[test]
    fn grants_are_read_as_upstream_reads_them() {
        let snap = claim_from(SNAP, Some(SG), "s1");
        let pvc = claim_from(PVC, None, "src");
        let from = ("", PVC, "team-a");
        // (claim, grants, allowed)
        let rows: Vec<(&PersistentVolumeClaim, Vec<ReferenceGrant>, bool)> = vec![
            (&snap, vec![grant("b", from, (SG, SNAP, None))], true),
            (&snap, vec![grant("b", from, (SG, SNAP, Some("")))], true),
            (&snap, vec![grant("b", from, (SG, SNAP, Some("s1")))], true),
            (&snap, vec![grant("b", from, (SG, SNAP, Some("s2")))], false),
            (&snap, vec![grant("b", from, ("", SNAP, None))], false),
            (&snap, vec![grant("b", from, (SG, PVC, None))], false),
            (&pvc, vec![grant("b", from, ("", PVC, None))], true),
            (&pvc, vec![grant("b", from, ("", PVC, Some("src")))], true),
            (&pvc, vec![grant("b", from, (SG, PVC, None))], false),
            // `from` must name claims of the claim's namespace, core group
            (
                &pvc,
                vec![grant("b", ("", PVC, "team-c"), ("", PVC, None))],
                false,
            ),
            (
                &pvc,
                vec![grant("b", ("", "Pod", "team-a"), ("", PVC, None))],
                false,
            ),
            (
                &pvc,
                vec![grant("b", ("x.io", PVC, "team-a"), ("", PVC, None))],
                false,
            ),
            // a grant of another namespace allows nothing here
            (&pvc, vec![grant("c", from, ("", PVC, None))], false),
            (&pvc, vec![], false),
            // one grant that allows is enough
            (
                &pvc,
                vec![
                    grant("b", from, (SG, SNAP, None)),
                    grant("b", from, ("", PVC, None)),
                ],
                true,
            ),
        ];
        for (c, grants, allowed) in rows {
            let view = ClaimView(c);
            let source = view.data_source().unwrap();
            assert_eq!(
                check(&grants, view, &source).is_ok(),
                allowed,
                "{source:?} {grants:?}"
            );
        }
        let source = ClaimView(&pvc).data_source().unwrap();
        assert_eq!(
            check(&[], ClaimView(&pvc), &source)
                .unwrap_err()
                .to_string(),
            "accessing b/src of PersistentVolumeClaim dataSource from team-a/data isn't allowed"
        );
    }
}
