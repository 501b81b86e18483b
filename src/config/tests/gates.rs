//! Feature gates as component-base resolves them, and the flags that turn features on.

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
fn enable_pprof_serves_profiles_on_the_http_endpoint_only() {
    for args in [&["--enable-pprof"][..], &["-enable-pprof=true"]] {
        let with_endpoint = [args, &["--http-endpoint=:8080"]].concat();
        let http = config(&with_endpoint, &Env::default()).unwrap().http;
        assert!(http.is_some_and(|h| h.pprof), "{args:?}");
        // As upstream: accepted without an address, and nothing is served.
        let c = config(args, &Env::default()).unwrap();
        assert_eq!(c.http, None, "{args:?}");
    }
    let http = config(
        &["--metrics-address=:8080", "--enable-pprof"],
        &Env::default(),
    );
    assert!(http.unwrap().http.is_some_and(|h| h.pprof));
}

#[test]
fn features_turned_off_or_tuned_alone_are_accepted() {
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
