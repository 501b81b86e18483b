//! Go's flag syntax, the value parsers, and the usage errors of values that do not parse.

use super::*;

#[test]
fn go_flag_syntax_is_accepted() {
    type Get = fn(&Args) -> String;
    let csi: Get = |a| a.csi.csi_address.clone();
    let v: Get = |a| a.logging.v.to_string();
    let le: Get = |a| a.leader_election.leader_election.to_string();
    let imm: Get = |a| a.provisioning.immediate_topology.to_string();
    let uuid: Get = |a| a.provisioning.volume_name_uuid_length.to_string();
    let timeout: Get = |a| format_go_duration(a.csi.timeout);
    let cases: &[(&[&str], Get, &str)] = &[
        (&["-csi-address=/x"], csi, "/x"),
        (&["-csi-address", "/x"], csi, "/x"),
        (&["--csi-address", "/x"], csi, "/x"),
        (&["--csi-address=/x"], csi, "/x"),
        (&["--csi-address=unix:///x"], csi, "unix:///x"),
        (&["-v=5"], v, "5"),
        (&["--v=5"], v, "5"),
        (&["-v", "5"], v, "5"),
        (&["--v", "5"], v, "5"),
        (&["-v5"], v, "5"),
        (&["-v=1", "-v=4"], v, "4"),
        (&["-leader-election"], le, "true"),
        (&["--leader-election"], le, "true"),
        (&["--leader-election=true"], le, "true"),
        (&["--leader-election=false"], le, "false"),
        (&["-leader-election=false"], le, "false"),
        (&["--leader-election=1"], le, "true"),
        (&["--leader-election=T"], le, "true"),
        (&["--leader-election=FALSE"], le, "false"),
        (
            &["--leader-election", "--leader-election=false"],
            le,
            "false",
        ),
        (&["--immediate-topology=false"], imm, "false"),
        (&["-immediate-topology=f"], imm, "false"),
        (&["--immediate-topology"], imm, "true"),
        (&["--volume-name-uuid-length", "-1"], uuid, "-1"),
        (&["--volume-name-uuid-length=-1"], uuid, "-1"),
        (&["-volume-name-uuid-length", "16"], uuid, "16"),
        (
            &["--capacity-ownerref-level", "-1"],
            |a| a.capacity.capacity_ownerref_level.to_string(),
            "-1",
        ),
        (
            &["--kubeconfig", "-odd-name"],
            |a| a.client.kubeconfig.clone(),
            "-odd-name",
        ),
        (
            &["-kubeconfig", "-odd-name"],
            |a| a.client.kubeconfig.clone(),
            "-odd-name",
        ),
        (&["--timeout=1m30s"], timeout, "1m30s"),
        (&["-timeout", "500ms"], timeout, "500ms"),
        (&["--timeout=1s", "--timeout=2s"], timeout, "2s"),
        (
            &["--kube-api-qps=2.5"],
            |a| a.client.kube_api_qps.to_string(),
            "2.5",
        ),
        (
            &["--logging-format=json"],
            |a| format!("{:?}", a.logging.logging_format),
            "Json",
        ),
        (
            &["--log-text-info-buffer-size=2Ki"],
            |a| a.logging.log_text_info_buffer_size.to_string(),
            "2048",
        ),
        (&["--version"], |a| a.version.to_string(), "true"),
        (&["-version"], |a| a.version.to_string(), "true"),
        (&["--automaxprocs"], |a| a.automaxprocs.to_string(), "true"),
        (
            &["--vmodule=a=1", "--vmodule", "b=2,c=3"],
            |a| {
                format!(
                    "{:?}",
                    a.logging
                        .vmodule
                        .iter()
                        .flat_map(|l| &l.0)
                        .map(|m| (&m.pattern, m.verbosity))
                        .collect::<Vec<_>>()
                )
            },
            r#"[("a", 1), ("b", 2), ("c", 3)]"#,
        ),
        (
            &[
                "--leader-election-labels=a:1",
                "-leader-election-labels",
                "b:2,c:3",
            ],
            |a| {
                format!(
                    "{:?}",
                    a.leader_election
                        .leader_election_labels
                        .iter()
                        .flat_map(|l| l.0.clone())
                        .collect::<Vec<_>>()
                )
            },
            r#"[("a", "1"), ("b", "2"), ("c", "3")]"#,
        ),
        (
            &[
                "--feature-gates=Topology=false",
                "--feature-gates",
                "ReleaseLeaderElectionOnExit=true",
            ],
            |a| a.feature_gates.len().to_string(),
            "2",
        ),
    ];
    for (args, get, want) in cases {
        assert_eq!(get(&parsed(args)), *want, "args {args:?}");
    }
}

#[test]
fn parse_errors_are_usage_errors_that_name_the_problem() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["--no-such-flag"], &["--no-such-flag"]),
        (&["-no-such-flag=1"], &["--no-such-flag"]),
        (&["-x"], &["-x"]),
        // Go bools take `=value` only: `false` is a stray positional.
        (&["--leader-election", "false"], &["'false'"]),
        (&["stray"], &["'stray'"]),
        (
            &["--leader-election=maybe"],
            &["--leader-election", "maybe"],
        ),
        (&["--timeout=10"], &["--timeout", "missing unit"]),
        (&["--timeout=-1s"], &["--timeout", "negative"]),
        (&["--timeout"], &["--timeout"]),
        (
            &["--retry-interval-max=5x"],
            &["--retry-interval-max", "unknown unit"],
        ),
        (&["-v=x"], &["--v"]),
        (&["-v=256"], &["--v", "256"]),
        (&["--worker-threads=-1"], &["--worker-threads"]),
        (&["--kube-api-burst=many"], &["--kube-api-burst"]),
        (
            &["--feature-gates=NoSuchGate=true"],
            &["--feature-gates", "unrecognized feature gate: NoSuchGate"],
        ),
        (
            &["--feature-gates=topology=true"],
            &["unrecognized feature gate: topology"],
        ),
        (
            &["--feature-gates=Topology"],
            &["--feature-gates", "missing bool value for Topology"],
        ),
        (
            &["--feature-gates=Topology=maybe"],
            &["--feature-gates", "Topology=maybe"],
        ),
        (
            &["--leader-election-labels=novalue"],
            &["--leader-election-labels", "malformed"],
        ),
        (
            &["--leader-election-labels=a:b:c"],
            &["--leader-election-labels", "malformed"],
        ),
        (
            &["--leader-election-labels="],
            &["--leader-election-labels", "malformed"],
        ),
        (&["--vmodule=x"], &["--vmodule", "pattern=N"]),
        (&["--vmodule=x=-1"], &["--vmodule", "verbosity"]),
        (&["--logging-format=xml"], &["--logging-format", "xml"]),
        (
            &["--log-json-info-buffer-size=-1"],
            &["--log-json-info-buffer-size", "negative"],
        ),
    ];
    for (args, wants) in cases {
        let err = parse(args).expect_err(&format!("{args:?} should not parse"));
        assert_eq!(err.exit_code(), 2, "{args:?}");
        assert_ne!(err.kind(), clap::error::ErrorKind::DisplayHelp, "{args:?}");
        let line = error_line(&err);
        assert!(!line.contains('\n'));
        for want in *wants {
            assert!(
                line.contains(want),
                "{args:?}: {line:?} should mention {want:?}"
            );
        }
    }
}

#[test]
fn unknown_flag_error_line() {
    let err = parse(&["--no-such-flag"]).unwrap_err();
    assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument);
    assert_eq!(
        error_line(&err),
        "unexpected argument '--no-such-flag' found"
    );
}

#[test]
fn help_is_not_an_error() {
    for flag in ["--help", "-h"] {
        let err = parse(&[flag]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
        assert_eq!(err.exit_code(), 0);
        assert!(err.to_string().contains("--leader-election-lease-duration"));
    }
}

#[test]
fn normalize_args_rewrites_only_single_dash_long_flags() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["-csi-address=/x"], &["--csi-address=/x"]),
        (&["-csi-address", "/x"], &["--csi-address", "/x"]),
        (&["-leader-election"], &["--leader-election"]),
        (
            &["-leader-election", "-v=2"],
            &["--leader-election", "-v=2"],
        ),
        (&["-v", "5"], &["-v", "5"]),
        (&["-v=5"], &["-v=5"]),
        (&["-v5"], &["-v5"]),
        (&["-vmodule=a=1"], &["--vmodule=a=1"]),
        (&["-version"], &["--version"]),
        (&["-h"], &["-h"]),
        (&["--timeout", "10s"], &["--timeout", "10s"]),
        (
            &["-volume-name-uuid-length", "-1"],
            &["--volume-name-uuid-length", "-1"],
        ),
        // A value that looks like a flag stays a value.
        (
            &["-kubeconfig", "-not-a-flag"],
            &["--kubeconfig", "-not-a-flag"],
        ),
        (&["-v", "-leader-election"], &["-v", "-leader-election"]),
        // Bools never take the next argument.
        (
            &["-leader-election", "-timeout=1s"],
            &["--leader-election", "--timeout=1s"],
        ),
        (&["-", "-1"], &["-", "-1"]),
        (&["--", "-timeout"], &["--", "-timeout"]),
        (&["-unknown-flag"], &["--unknown-flag"]),
    ];
    for (input, want) in cases {
        let got = normalize_args(&command(), argv(input));
        assert_eq!(
            got[1..],
            want.iter().map(|s| s.to_string()).collect::<Vec<_>>()[..],
            "{input:?}"
        );
        assert_eq!(got[0], "csi-provisioner");
    }
    // The program name is never rewritten.
    assert_eq!(
        normalize_args(&command(), ["-weird".to_string()]),
        vec!["-weird"]
    );
}

#[test]
fn byte_quantities() {
    let ok: &[(&str, u64)] = &[
        ("0", 0),
        ("512", 512),
        ("+512", 512),
        ("1k", 1000),
        ("2Ki", 2048),
        ("5M", 5_000_000),
        ("5Mi", 5 << 20),
        ("6Gi", 6 << 30),
        ("1Ei", 1 << 60),
        ("1.5Mi", 3 << 19),
        ("1.5", 2),
        (".5k", 500),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1500m", 2),
        ("1m", 1),
        ("1n", 1),
    ];
    for (input, want) in ok {
        assert_eq!(parse_byte_quantity(input), Ok(*want), "{input}");
    }
    let bad: &[(&str, &str)] = &[
        ("", "invalid"),
        ("K", "invalid"),
        ("1K", "invalid"),
        ("1KB", "invalid"),
        ("1ki", "invalid"),
        ("1.2.3", "invalid"),
        ("1e", "invalid"),
        ("1e99", "invalid"),
        ("-1", "negative"),
        ("16Ei", "too large"),
        ("100000000000000000000000", "invalid"),
    ];
    for (input, want) in bad {
        let err = parse_byte_quantity(input).expect_err(input);
        assert!(err.contains(want), "{input}: {err}");
    }
}

#[test]
fn go_bools() {
    for s in ["1", "t", "T", "true", "TRUE", "True"] {
        assert_eq!(parse_go_bool(s), Ok(true), "{s}");
    }
    for s in ["0", "f", "F", "false", "FALSE", "False"] {
        assert_eq!(parse_go_bool(s), Ok(false), "{s}");
    }
    for s in ["", "yes", "on", "tRUE", " true"] {
        assert!(parse_go_bool(s).is_err(), "{s}");
    }
}
