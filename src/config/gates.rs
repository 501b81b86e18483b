//! Feature gates (`--feature-gates`): the gates this program knows with
//! upstream's stages and defaults, the flag's syntax, and component-base's
//! resolution of `AllAlpha` / `AllBeta` and repeated values.

use std::collections::HashMap;

use super::values::parse_go_bool;

/// A feature gate this program knows (upstream's own, plus component-base's
/// logging gates that upstream registers too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FeatureGate {
    Topology,
    CrossNamespaceVolumeDataSource,
    VolumeAttributesClass,
    ReleaseLeaderElectionOnExit,
    ContextualLogging,
    LoggingAlphaOptions,
    LoggingBetaOptions,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Alpha,
    Beta,
    Ga,
}

impl FeatureGate {
    pub const ALL: [FeatureGate; 7] = [
        FeatureGate::Topology,
        FeatureGate::CrossNamespaceVolumeDataSource,
        FeatureGate::VolumeAttributesClass,
        FeatureGate::ReleaseLeaderElectionOnExit,
        FeatureGate::ContextualLogging,
        FeatureGate::LoggingAlphaOptions,
        FeatureGate::LoggingBetaOptions,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FeatureGate::Topology => "Topology",
            FeatureGate::CrossNamespaceVolumeDataSource => "CrossNamespaceVolumeDataSource",
            FeatureGate::VolumeAttributesClass => "VolumeAttributesClass",
            FeatureGate::ReleaseLeaderElectionOnExit => "ReleaseLeaderElectionOnExit",
            FeatureGate::ContextualLogging => "ContextualLogging",
            FeatureGate::LoggingAlphaOptions => "LoggingAlphaOptions",
            FeatureGate::LoggingBetaOptions => "LoggingBetaOptions",
        }
    }

    /// Upstream's stage and default (`pkg/features/features.go`,
    /// component-base `logs/api/v1/kube_features.go`).
    fn spec(self) -> (Stage, bool) {
        match self {
            FeatureGate::Topology => (Stage::Ga, true),
            FeatureGate::CrossNamespaceVolumeDataSource => (Stage::Alpha, false),
            FeatureGate::VolumeAttributesClass => (Stage::Ga, true),
            FeatureGate::ReleaseLeaderElectionOnExit => (Stage::Alpha, false),
            FeatureGate::ContextualLogging => (Stage::Beta, true),
            FeatureGate::LoggingAlphaOptions => (Stage::Alpha, false),
            FeatureGate::LoggingBetaOptions => (Stage::Beta, true),
        }
    }
}

/// A key of `--feature-gates`: a gate, or component-base's `AllAlpha` /
/// `AllBeta`, which set every alpha (beta) gate not named explicitly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateKey {
    Gate(FeatureGate),
    AllAlpha,
    AllBeta,
}

/// One `--feature-gates` value, in the order written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateSettings(pub Vec<(GateKey, bool)>);

pub(super) fn parse_feature_gates(s: &str) -> Result<GateSettings, String> {
    let mut settings = Vec::new();
    for item in s.split(',').filter(|item| !item.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!("missing bool value for {}", item.trim()));
        };
        let (key, value) = (key.trim(), value.trim());
        let value = parse_go_bool(value)
            .map_err(|_| format!("invalid value of {key}={value}, want a bool"))?;
        let key = match key {
            "AllAlpha" => GateKey::AllAlpha,
            "AllBeta" => GateKey::AllBeta,
            _ => FeatureGate::ALL
                .into_iter()
                .find(|g| g.name() == key)
                .map(GateKey::Gate)
                .ok_or_else(|| format!("unrecognized feature gate: {key}"))?,
        };
        settings.push((key, value));
    }
    Ok(GateSettings(settings))
}

/// The resolved feature gates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    pub topology: bool,
    pub cross_namespace_volume_data_source: bool,
    /// `None` when not set on the command line: upstream then defaults to on
    /// but turns it off when the API server does not serve
    /// `storage.k8s.io/v1` VolumeAttributesClass.
    pub volume_attributes_class: Option<bool>,
    pub release_leader_election_on_exit: bool,
    pub contextual_logging: bool,
    pub logging_alpha_options: bool,
    pub logging_beta_options: bool,
}

impl FeatureGates {
    /// Applies the `--feature-gates` values in order: a later value for the
    /// same gate wins; `AllAlpha`/`AllBeta` change the default of the gates
    /// of that stage that are not named explicitly.
    pub fn resolve(settings: &[GateSettings]) -> FeatureGates {
        let mut explicit = HashMap::new();
        let (mut all_alpha, mut all_beta) = (None, None);
        for (key, value) in settings.iter().flat_map(|s| &s.0) {
            match key {
                GateKey::Gate(gate) => {
                    explicit.insert(*gate, *value);
                }
                GateKey::AllAlpha => all_alpha = Some(*value),
                GateKey::AllBeta => all_beta = Some(*value),
            }
        }
        let enabled = |gate: FeatureGate| {
            let (stage, default) = gate.spec();
            let stage_default = match stage {
                Stage::Alpha => all_alpha,
                Stage::Beta => all_beta,
                Stage::Ga => None,
            };
            explicit
                .get(&gate)
                .copied()
                .or(stage_default)
                .unwrap_or(default)
        };
        FeatureGates {
            topology: enabled(FeatureGate::Topology),
            cross_namespace_volume_data_source: enabled(
                FeatureGate::CrossNamespaceVolumeDataSource,
            ),
            volume_attributes_class: explicit.get(&FeatureGate::VolumeAttributesClass).copied(),
            release_leader_election_on_exit: enabled(FeatureGate::ReleaseLeaderElectionOnExit),
            contextual_logging: enabled(FeatureGate::ContextualLogging),
            logging_alpha_options: enabled(FeatureGate::LoggingAlphaOptions),
            logging_beta_options: enabled(FeatureGate::LoggingBetaOptions),
        }
    }
}
