//! At start-up: may this sidecar's account do what the configured features need? Upstream's RBAC
//! (which drivers' charts ship) grants what provisioning needs; a few opt-in features of ours
//! need more (namespace metadata flags) or rules upstream ships commented out (cross-namespace
//! data sources). Without this check such a feature would fail every claim with a 403; here it
//! is one line at start-up naming the verb, the resource and the flag. An opt-in feature that
//! cannot work stops the sidecar (exit 1); a rule every claim of a kind needs but that the
//! operator may leave out on purpose (VolumeAttributesClasses, which upstream's file lacks too)
//! is a warning.
//!
//! The answers come from the API server (`SelfSubjectAccessReview`, which every authenticated
//! account may create); where it cannot answer, nothing is said.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tracing::{debug, warn};

use crate::provision::ProvisionOptions;

/// Verbs one feature needs on one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// What needs it, as the operator configured it.
    pub feature: &'static str,
    /// Whether the sidecar stops without it (an opt-in feature that would fail every claim).
    pub fatal: bool,
}

/// What the configured features need beyond what provisioning needs anyway.
pub fn needs(options: &ProvisionOptions) -> Vec<Need> {
    let mut needs = Vec::new();
    if options.metadata.needs_namespace() {
        needs.push(Need {
            group: "",
            resource: "namespaces",
            verbs: &["get", "list", "watch"],
            feature: "--extra-create-metadata-namespace-labels/-annotations",
            fatal: true,
        });
    }
    if options.cross_namespace_data_source {
        needs.push(Need {
            group: "gateway.networking.k8s.io",
            resource: "referencegrants",
            verbs: &["list"],
            feature: "--feature-gates=CrossNamespaceVolumeDataSource=true",
            fatal: true,
        });
    }
    if options.volume_attributes_class {
        needs.push(Need {
            group: "storage.k8s.io",
            resource: "volumeattributesclasses",
            verbs: &["get"],
            feature: "claims that name a VolumeAttributesClass",
            fatal: false,
        });
    }
    needs
}

/// The one line that says what is missing.
pub fn missing_line(need: &Need, verb: &str) -> String {
    let resource = match need.group {
        "" => need.resource.to_string(),
        group => format!("{}.{group}", need.resource),
    };
    let outcome = if need.fatal {
        "grant it (deploy/kubernetes/rbac.yaml has the rule) or leave the feature off"
    } else {
        "they fail until it may (deploy/kubernetes/rbac.yaml has the rule)"
    };
    format!(
        "RBAC: {} needs {verb:?} on {resource}, which this sidecar's account may not do: {outcome}",
        need.feature
    )
}

/// How long a missing verb is asked about again before it counts: RBAC applied together with
/// the sidecar reaches the authorizer a moment later.
const SETTLE: Duration = Duration::from_secs(10);
const ASK_EVERY: Duration = Duration::from_secs(2);

/// Asks the API server about every need; returns the line of the first fatal one missing, after
/// warning about the others.
pub async fn check(client: &kube::Client, needs: &[Need]) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        let mut missing = Vec::new();
        for need in needs {
            for verb in need.verbs {
                match allowed(client, need, verb).await {
                    Ok(true) => {}
                    Ok(false) => missing.push((need, *verb)),
                    Err(e) => {
                        debug!(error = %e, "cannot ask the API server what this account may do: not checking");
                        return Ok(());
                    }
                }
            }
        }
        let fatal = missing.iter().find(|(need, _)| need.fatal);
        if fatal.is_some() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(ASK_EVERY).await;
            continue;
        }
        for (need, verb) in missing.iter().filter(|(need, _)| !need.fatal) {
            warn!("{}", missing_line(need, verb));
        }
        return match fatal {
            Some((need, verb)) => Err(missing_line(need, verb)),
            None => Ok(()),
        };
    }
}

async fn allowed(client: &kube::Client, need: &Need, verb: &str) -> Result<bool, kube::Error> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(need.group.into()),
                resource: Some(need.resource.into()),
                verb: Some(verb.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_configured_features_are_asked_about() {
        let mut options = ProvisionOptions {
            volume_attributes_class: false,
            ..Default::default()
        };
        assert!(
            needs(&options).is_empty(),
            "provisioning alone needs nothing more"
        );
        options.metadata.namespace_labels = vec!["team".into()];
        options.cross_namespace_data_source = true;
        options.volume_attributes_class = true;
        let asked: Vec<_> = needs(&options)
            .iter()
            .map(|n| (n.resource, n.fatal))
            .collect();
        assert_eq!(
            asked,
            [
                ("namespaces", true),
                ("referencegrants", true),
                ("volumeattributesclasses", false)
            ]
        );
    }

    #[test]
    fn the_line_names_the_feature_the_verb_and_the_resource() {
        let options = ProvisionOptions {
            cross_namespace_data_source: true,
            volume_attributes_class: false,
            ..Default::default()
        };
        let need = &needs(&options)[0];
        assert_eq!(
            missing_line(need, "list"),
            "RBAC: --feature-gates=CrossNamespaceVolumeDataSource=true needs \"list\" on \
             referencegrants.gateway.networking.k8s.io, which this sidecar's account may not do: \
             grant it (deploy/kubernetes/rbac.yaml has the rule) or leave the feature off"
        );
    }
}
