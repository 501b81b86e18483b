//! Feature gates as component-base resolves them, and the flags of features not built yet.

use super::*;

#[test]
fn feature_gates_resolve_like_component_base() {
    let defaults = FeatureGates::resolve(&[]);
    let gates = |values: &[&str]| {
        let args: Vec<String> = values
            .iter()
            .map(|v| format!("--feature-gates={v}"))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        FeatureGates::resolve(&parsed(&args).feature_gates)
    };
    let cases: &[(&[&str], FeatureGates)] = &[
        (&[], defaults.clone()),
        (&[""], defaults.clone()),
        (
            &["Topology=false"],
            FeatureGates {
                topology: false,
                ..defaults.clone()
            },
        ),
        (
            &[" Topology = false ,,"],
            FeatureGates {
                topology: false,
                ..defaults.clone()
            },
        ),
        (&["Topology=false", "Topology=true"], defaults.clone()),
        (
            &["VolumeAttributesClass=false"],
            FeatureGates {
                volume_attributes_class: Some(false),
                ..defaults.clone()
            },
        ),
        (
            &["VolumeAttributesClass=true"],
            FeatureGates {
                volume_attributes_class: Some(true),
                ..defaults.clone()
            },
        ),
        (
            &["ReleaseLeaderElectionOnExit=true"],
            FeatureGates {
                release_leader_election_on_exit: true,
                ..defaults.clone()
            },
        ),
        (
            &["AllAlpha=true"],
            FeatureGates {
                cross_namespace_volume_data_source: true,
                release_leader_election_on_exit: true,
                logging_alpha_options: true,
                ..defaults.clone()
            },
        ),
        // An explicit value wins over AllAlpha, whatever the order.
        (
            &["AllAlpha=true,CrossNamespaceVolumeDataSource=false"],
            FeatureGates {
                release_leader_election_on_exit: true,
                logging_alpha_options: true,
                ..defaults.clone()
            },
        ),
        (
            &["CrossNamespaceVolumeDataSource=false", "AllAlpha=true"],
            FeatureGates {
                release_leader_election_on_exit: true,
                logging_alpha_options: true,
                ..defaults.clone()
            },
        ),
        (
            &["AllBeta=false"],
            FeatureGates {
                contextual_logging: false,
                logging_beta_options: false,
                ..defaults.clone()
            },
        ),
        (
            &["AllBeta=false,LoggingBetaOptions=true"],
            FeatureGates {
                contextual_logging: false,
                ..defaults.clone()
            },
        ),
    ];
    for (values, want) in cases {
        assert_eq!(&gates(values), want, "{values:?}");
    }
    assert!(defaults.topology && !defaults.cross_namespace_volume_data_source);
    assert_eq!(defaults.volume_attributes_class, None);
}

#[test]
fn features_not_built_yet_are_rejected_when_turned_on() {
    let full_env = env(&[("NODE_NAME", "n"), ("NAMESPACE", "ns"), ("POD_NAME", "p")]);
    let cases: &[(&[&str], &str)] = &[
        (&["--enable-pprof"], "--enable-pprof"),
        (&["-enable-pprof=true"], "--enable-pprof"),
    ];
    for (args, flag) in cases {
        // Rejected even when everything the feature needs is present,
        // and before its own checks (here, NODE_NAME/NAMESPACE).
        for e in [&full_env, &Env::default()] {
            let err = config(args, e).unwrap_err();
            assert_eq!(err, ConfigError::NotSupported(flag));
            assert_eq!(
                err.to_string(),
                format!("{flag} is not supported yet by this csi-provisioner")
            );
        }
    }
    // Each row of the table is switched on by the flag it names, and off by default.
    let defaults = parsed(&[]);
    for row in NOT_SUPPORTED_YET {
        assert!((row.enabled)(&parsed(&[row.flag])), "{}", row.flag);
        assert!(!(row.enabled)(&defaults), "{}", row.flag);
    }
    // Accepted: the features' other knobs, and the features turned off.
    for args in [
        &[
            "--cloning-protection-threads=8",
            "--capacity-threads=4",
            "--capacity-poll-interval=5m",
        ][..],
        &["--feature-gates=CrossNamespaceVolumeDataSource=true"],
        &["--feature-gates=AllAlpha=true"],
        &["--automaxprocs=true"],
    ] {
        assert!(config(args, &Env::default()).is_ok(), "{args:?}");
    }
}
