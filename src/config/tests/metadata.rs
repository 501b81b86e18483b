//! The metadata flags: lists of label and annotation keys, checked as Kubernetes checks keys.

use super::*;

fn metadata(args: &[&str]) -> Result<MetadataConfig, ConfigError> {
    Config::from_args(&parsed(args), &Env::default()).map(|c| c.metadata)
}

#[test]
fn key_lists_are_repeatable_comma_separated_sorted_and_deduplicated() {
    let got = metadata(&[
        "--copy-pvc-labels=team,example.com/cost-center",
        "-copy-pvc-labels",
        "app.kubernetes.io/name,team",
    ])
    .unwrap();
    assert_eq!(
        got.copy_pvc_labels,
        ["app.kubernetes.io/name", "example.com/cost-center", "team"]
    );
    assert_eq!(
        metadata(&["--copy-pvc-labels="]).unwrap(),
        MetadataConfig::default(),
        "an empty value is an empty list, as pflag's"
    );
}

#[test]
fn keys_kubernetes_would_refuse_are_usage_errors() {
    let long_name = "n".repeat(64);
    for key in [
        "has space",
        "a/b/c",
        "-dash",
        "dot.",
        "Example.com/upper-prefix",
        "/no-prefix",
        "example.com/",
        long_name.as_str(),
        "team,,app",
    ] {
        let flag = format!("--copy-pvc-labels={key}");
        let err = parse(&[&flag]).expect_err(key);
        assert!(
            error_line(&err).contains("is not a label or annotation key"),
            "{key}: {}",
            error_line(&err)
        );
    }
    let longest = format!("{}/{}", "p".repeat(63), "n".repeat(63));
    assert!(parse(&[&format!("--copy-pvc-labels={longest}")]).is_ok());
}

#[test]
fn the_scheduling_labels_of_pvs_are_never_copied() {
    for key in [
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
    ] {
        let err = metadata(&[
            "--copy-pvc-labels=team",
            &format!("--copy-pvc-labels={key}"),
        ])
        .unwrap_err();
        assert_eq!(err, ConfigError::SchedulingLabel { key: key.into() });
        assert!(err.to_string().contains("the scheduler reads it"), "{err}");
    }
}

#[test]
fn each_list_goes_to_its_own_parameters_and_the_namespace_is_needed_only_for_its_own() {
    let got = metadata(&[
        "--extra-create-metadata-pvc-labels=team",
        "--extra-create-metadata-pvc-annotations=example.com/owner",
    ])
    .unwrap();
    assert_eq!(got.pvc_labels, ["team"]);
    assert_eq!(got.pvc_annotations, ["example.com/owner"]);
    assert!(!got.needs_namespace());
    for flag in [
        "--extra-create-metadata-namespace-labels=tier",
        "--extra-create-metadata-namespace-annotations=example.com/account",
    ] {
        let got = metadata(&[flag]).unwrap();
        assert!(got.needs_namespace(), "{flag}");
        assert_eq!(
            got.namespace_labels.len() + got.namespace_annotations.len(),
            1
        );
    }
}

#[test]
fn a_key_whose_parameter_no_driver_could_be_sent_is_refused() {
    // csi.storage.k8s.io/namespace/annotations/ is 41 bytes: 87 more fit CSI's 128.
    let fits = format!("{}/{}", "p".repeat(23), "n".repeat(63));
    assert_eq!(fits.len(), 87);
    let flag = |key: &str| format!("--extra-create-metadata-namespace-annotations={key}");
    assert!(metadata(&[&flag(&fits)]).is_ok());
    let too_long = format!("{}/{}", "p".repeat(24), "n".repeat(63));
    let err = metadata(&[&flag(&too_long)]).unwrap_err();
    assert!(
        matches!(&err, ConfigError::ParameterKeyTooLong { flag, .. } if *flag == "--extra-create-metadata-namespace-annotations"),
        "{err}"
    );
    assert!(err.to_string().contains("129 bytes"), "{err}");
}
