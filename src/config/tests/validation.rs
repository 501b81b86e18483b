//! Flags that parse, checked against each other and the environment, into typed values.

use super::*;

#[test]
fn validation_errors() {
    let no_env = Env::default();
    let cases: Vec<(&[&str], Env, ConfigError)> = vec![
        (
            &["--metrics-address=:8080", "--http-endpoint=:8081"],
            no_env.clone(),
            ConfigError::MetricsAddressAndHttpEndpoint,
        ),
        (
            &["--volume-name-prefix="],
            no_env.clone(),
            ConfigError::EmptyVolumeNamePrefix,
        ),
        (
            &["--volume-name-uuid-length=0"],
            no_env.clone(),
            ConfigError::VolumeNameUuidLength(0),
        ),
        (
            &["--volume-name-uuid-length=33"],
            no_env.clone(),
            ConfigError::VolumeNameUuidLength(33),
        ),
        (
            &["--volume-name-uuid-length=-2"],
            no_env.clone(),
            ConfigError::VolumeNameUuidLength(-2),
        ),
        (
            &["--node-deployment"],
            no_env.clone(),
            ConfigError::NodeNameMissing,
        ),
        (
            &["--node-deployment"],
            env(&[("NODE_NAME", "")]),
            ConfigError::NodeNameMissing,
        ),
        (
            &["--enable-capacity"],
            no_env.clone(),
            ConfigError::CapacityNamespaceMissing,
        ),
        (
            &["--enable-capacity"],
            env(&[("NAMESPACE", "kube-system")]),
            ConfigError::CapacityPodNameMissing,
        ),
        (
            &["--enable-capacity", "--capacity-ownerref-level=0"],
            env(&[("NAMESPACE", "ns")]),
            ConfigError::CapacityPodNameMissing,
        ),
        (
            &["--retry-interval-start=10s", "--retry-interval-max=5s"],
            no_env.clone(),
            ConfigError::RetryIntervals {
                start: "10s".into(),
                max: "5s".into(),
            },
        ),
        (
            &["--worker-threads=0"],
            no_env.clone(),
            ConfigError::NoWorkers,
        ),
        (
            &["--admission-intent", "--node-deployment"],
            env(&[("NODE_NAME", "n1")]),
            ConfigError::AdmissionIntentOnNodes,
        ),
        (&["--timeout=0"], no_env.clone(), ConfigError::ZeroTimeout),
        (
            &["--csi-address=csi.sock"],
            no_env.clone(),
            ConfigError::CsiAddress("csi.sock".into()),
        ),
        (
            &["--csi-address=unix://relative"],
            no_env.clone(),
            ConfigError::CsiAddress("unix://relative".into()),
        ),
        (
            &["--csi-address=unix:"],
            no_env.clone(),
            ConfigError::CsiAddress("unix:".into()),
        ),
        (
            &["--csi-address=dns:///driver:10000"],
            no_env.clone(),
            ConfigError::CsiAddress("dns:///driver:10000".into()),
        ),
        (
            &["--csi-address="],
            no_env.clone(),
            ConfigError::CsiAddress("".into()),
        ),
        (
            &["--leader-election", "--leader-election-lease-duration=0"],
            no_env.clone(),
            ConfigError::NotPositive {
                flag: "--leader-election-lease-duration",
            },
        ),
        (
            &["--leader-election", "--leader-election-renew-deadline=0"],
            no_env.clone(),
            ConfigError::NotPositive {
                flag: "--leader-election-renew-deadline",
            },
        ),
        (
            &["--leader-election", "--leader-election-retry-period=0"],
            no_env.clone(),
            ConfigError::NotPositive {
                flag: "--leader-election-retry-period",
            },
        ),
        (
            &["--leader-election", "--leader-election-lease-duration=10s"],
            no_env.clone(),
            ConfigError::LeaseNotLongerThanRenew {
                lease: "10s".into(),
                renew: "10s".into(),
            },
        ),
        (
            &["--leader-election", "--leader-election-renew-deadline=6s"],
            no_env.clone(),
            ConfigError::RenewNotLongerThanRetry {
                renew: "6s".into(),
                retry: "5s".into(),
            },
        ),
        (
            &["--kube-api-burst=0"],
            no_env.clone(),
            ConfigError::Burst {
                qps: "--kube-api-qps",
                burst: "--kube-api-burst",
            },
        ),
        (
            &["--enable-capacity", "--kube-api-capacity-burst=-1"],
            env(&[("NAMESPACE", "ns"), ("POD_NAME", "p")]),
            ConfigError::Burst {
                qps: "--kube-api-capacity-qps",
                burst: "--kube-api-capacity-burst",
            },
        ),
        (
            &["--kube-api-qps=NaN"],
            no_env.clone(),
            ConfigError::QpsNotANumber("--kube-api-qps"),
        ),
        (
            &["--log-flush-frequency=0"],
            no_env.clone(),
            ConfigError::LogFlushFrequency,
        ),
        (
            &["--logging-format=json", "--vmodule=a=1"],
            no_env.clone(),
            ConfigError::VModuleNeedsText,
        ),
        (
            &[
                "--logging-format=json",
                "--feature-gates=LoggingBetaOptions=false",
            ],
            no_env.clone(),
            ConfigError::JsonDisabled,
        ),
        (
            &["--log-text-split-stream"],
            no_env.clone(),
            ConfigError::NeedsLoggingAlphaOptions("--log-text-split-stream"),
        ),
        (
            &["--log-text-info-buffer-size=1"],
            no_env.clone(),
            ConfigError::NeedsLoggingAlphaOptions("--log-text-info-buffer-size"),
        ),
        (
            &["--log-json-split-stream"],
            no_env.clone(),
            ConfigError::NeedsLoggingAlphaOptions("--log-json-split-stream"),
        ),
        (
            &["--log-json-info-buffer-size=1Mi"],
            no_env.clone(),
            ConfigError::NeedsLoggingAlphaOptions("--log-json-info-buffer-size"),
        ),
    ];
    for (args, env, want) in cases {
        let got = config(args, &env);
        assert_eq!(got.as_ref().err(), Some(&want), "{args:?}");
        let message = want.to_string();
        assert!(
            !message.contains('\n') && message.contains("--"),
            "{message:?}"
        );
    }
}

#[test]
fn accepted_edge_values() {
    let ok: &[&[&str]] = &[
        &["--volume-name-uuid-length=1"],
        &["--volume-name-uuid-length=32"],
        &["--retry-interval-start=5m", "--retry-interval-max=5m"],
        &["--retry-interval-start=0"],
        &["--snapshot-orphan-sweep-interval=0"],
        &["--cloning-protection-threads=4"],
        &["--worker-threads=1"],
        // Timings are only checked when leader election is on, as client-go does.
        &["--leader-election-lease-duration=0"],
        &[
            "--leader-election",
            "--leader-election-lease-duration=3s",
            "--leader-election-renew-deadline=2s",
            "--leader-election-retry-period=1s",
        ],
        &["--kube-api-qps=-1", "--kube-api-burst=0"],
        &["--kube-api-qps=0", "--kube-api-burst=0"],
        &["--metrics-address=:8080"],
        &["--http-endpoint=:8080", "--metrics-address="],
        &["--csi-address=unix:///run/csi/socket"],
        &["--logging-format=json"],
        &[
            "--feature-gates=LoggingAlphaOptions=true",
            "--log-text-split-stream",
            "--log-text-info-buffer-size=64Ki",
        ],
        &[
            "--enable-capacity=false",
            "--node-deployment=false",
            "--enable-pprof=false",
        ],
        &["--automaxprocs", "--automaxprocs=false"],
    ];
    for args in ok {
        if let Err(e) = config(args, &Env::default()) {
            panic!("{args:?}: {e}");
        }
    }
}

#[test]
fn typed_values_in_config() {
    let c = config(
        &[
            "--csi-address=unix:///var/lib/csi/sockets/pluginproxy/csi.sock",
            "--volume-name-uuid-length=16",
            "--snapshot-orphan-sweep-interval=0",
            "--default-fstype=ext4",
            "--master=https://10.0.0.1:6443",
            "--kube-api-qps=-1",
            "--http-endpoint=:8080",
            "--metrics-path=/m",
            "--leader-election",
            "--leader-election-labels=team:storage,tier:infra",
            "--logging-format=json",
            "--feature-gates=LoggingAlphaOptions=true",
            "--log-json-split-stream",
            "--log-json-info-buffer-size=1Mi",
            "--log-text-info-buffer-size=5",
            "-v=4",
        ],
        &Env::default(),
    )
    .unwrap();
    assert_eq!(
        c.csi_socket,
        PathBuf::from("/var/lib/csi/sockets/pluginproxy/csi.sock")
    );
    assert_eq!(c.provisioning.volume_name_uuid_length, Some(16));
    assert_eq!(c.provisioning.snapshot_orphan_sweep_interval, None);
    assert_eq!(c.provisioning.default_fstype.as_deref(), Some("ext4"));
    assert_eq!(c.client.master.as_deref(), Some("https://10.0.0.1:6443"));
    assert_eq!(c.client.rate_limit, RateLimit::Unlimited);
    assert_eq!(
        c.http,
        Some(HttpConfig {
            address: ":8080".into(),
            metrics_path: "/m".into(),
            leader_election_health: true,
            pprof: false,
        })
    );
    let le = c.leader_election.unwrap();
    assert_eq!(le.namespace, "default");
    assert_eq!(
        (le.lease_duration, le.renew_deadline, le.retry_period),
        (secs(15), secs(10), secs(5))
    );
    assert_eq!(
        le.labels,
        BTreeMap::from([
            ("team".to_string(), "storage".to_string()),
            ("tier".to_string(), "infra".to_string())
        ])
    );
    assert_eq!(
        c.logging,
        LoggingConfig {
            verbosity: 4,
            vmodule: vec![],
            format: LogFormat::Json,
            flush_frequency: secs(5),
            // The JSON options, because JSON is the format.
            split_stream: true,
            info_buffer_size: 1 << 20,
        }
    );
}

#[test]
fn health_check_only_with_http_endpoint_and_leader_election() {
    let health = |args: &[&str]| {
        config(args, &Env::default())
            .unwrap()
            .http
            .map(|h| h.leader_election_health)
    };
    assert_eq!(
        health(&["--http-endpoint=:8080", "--leader-election"]),
        Some(true)
    );
    assert_eq!(health(&["--http-endpoint=:8080"]), Some(false));
    assert_eq!(
        health(&["--metrics-address=:8080", "--leader-election"]),
        Some(false)
    );
    assert_eq!(health(&["--leader-election"]), None);
    let addr = config(&["--metrics-address=127.0.0.1:9090"], &Env::default())
        .unwrap()
        .http
        .unwrap()
        .address;
    assert_eq!(addr, "127.0.0.1:9090");
}

#[test]
fn kubeconfig_environment_overrides_the_flag() {
    let kubeconfig = |args: &[&str], env: Env| config(args, &env).unwrap().client.kubeconfig;
    let cases: Vec<(&[&str], Env, Option<&str>)> = vec![
        (
            &["--kubeconfig=/flag"],
            env(&[("KUBECONFIG", "/env")]),
            Some("/env"),
        ),
        (&["--kubeconfig=/flag"], env(&[]), Some("/flag")),
        (
            &["--kubeconfig=/flag"],
            env(&[("KUBECONFIG", "")]),
            Some("/flag"),
        ),
        (&[], env(&[("KUBECONFIG", "/env")]), Some("/env")),
        (&[], env(&[]), None),
    ];
    for (args, e, want) in cases {
        assert_eq!(kubeconfig(args, e), want.map(PathBuf::from), "{args:?}");
    }
}

#[test]
fn lease_namespace_flag_then_pod_namespace_then_service_account_then_default() {
    let namespace = |args: &[&str], env: Env| {
        let mut args = args.to_vec();
        args.push("--leader-election");
        config(&args, &env)
            .unwrap()
            .leader_election
            .unwrap()
            .namespace
    };
    let with_sa = |mut e: Env| {
        e.service_account_namespace = Some("from-sa".into());
        e
    };
    assert_eq!(
        namespace(
            &["--leader-election-namespace=flag"],
            with_sa(env(&[("POD_NAMESPACE", "pod")]))
        ),
        "flag"
    );
    assert_eq!(
        namespace(&[], with_sa(env(&[("POD_NAMESPACE", "pod")]))),
        "pod"
    );
    assert_eq!(
        namespace(&[], with_sa(env(&[("POD_NAMESPACE", "")]))),
        "from-sa"
    );
    assert_eq!(namespace(&[], env(&[])), "default");
}

#[test]
fn environment_feeds_node_deployment_and_capacity() {
    let c = config(
        &[
            "--node-deployment",
            "--node-deployment-base-delay=1s",
            "--node-deployment-immediate-binding=false",
        ],
        &env(&[("NODE_NAME", "node-1")]),
    )
    .unwrap();
    assert_eq!(
        c.node_deployment,
        Some(NodeDeploymentConfig {
            node_name: "node-1".into(),
            immediate_binding: false,
            base_delay: secs(1),
            max_delay: secs(60),
        })
    );

    let capacity_env = env(&[("NAMESPACE", "kube-system"), ("POD_NAME", "csi-0")]);
    let c = config(
        &["--enable-capacity", "--capacity-ownerref-level=2"],
        &capacity_env,
    )
    .unwrap();
    assert_eq!(
        c.capacity,
        Some(CapacityConfig {
            namespace: "kube-system".into(),
            owner: Some(CapacityOwner {
                pod_name: "csi-0".into(),
                levels: 2
            }),
            threads: 1,
            rate_limit: RateLimit::TokenBucket { qps: 1.0, burst: 5 },
            for_immediate_binding: false,
            poll_interval: secs(60),
        })
    );
    // No owner: POD_NAME is not needed.
    let c = config(
        &["--enable-capacity", "--capacity-ownerref-level=-1"],
        &env(&[("NAMESPACE", "ns")]),
    )
    .unwrap();
    assert_eq!(c.capacity.unwrap().owner, None);
}

#[test]
fn rate_limit_follows_client_go() {
    let q = "--q";
    let b = "--b";
    let burst_err = ConfigError::Burst { qps: q, burst: b };
    let cases: &[(f64, i64, Result<RateLimit, ConfigError>)] = &[
        (
            5.0,
            10,
            Ok(RateLimit::TokenBucket {
                qps: 5.0,
                burst: 10,
            }),
        ),
        (
            0.0,
            0,
            Ok(RateLimit::TokenBucket {
                qps: 5.0,
                burst: 10,
            }),
        ),
        (0.0, 3, Ok(RateLimit::TokenBucket { qps: 5.0, burst: 3 })),
        (-1.0, 0, Ok(RateLimit::Unlimited)),
        (5.0, 0, Err(burst_err.clone())),
        (5.0, -1, Err(burst_err.clone())),
        (0.0, -1, Err(burst_err)),
        (f64::NAN, 1, Err(ConfigError::QpsNotANumber(q))),
    ];
    for (qps, burst, want) in cases {
        assert_eq!(
            &rate_limit(*qps, *burst, q, b),
            want,
            "qps {qps} burst {burst}"
        );
    }
}

#[test]
fn csi_address_becomes_a_socket_path() {
    let cases = [
        ("/run/csi/socket", "/run/csi/socket"),
        ("unix:///run/csi/socket", "/run/csi/socket"),
        ("unix:/run/csi/socket", "/run/csi/socket"),
        ("unix:csi.sock", "csi.sock"),
    ];
    for (address, want) in cases {
        assert_eq!(
            csi_socket_path(address),
            Ok(PathBuf::from(want)),
            "{address}"
        );
    }
}

#[test]
fn environment_treats_empty_as_unset() {
    let e = env(&[
        ("POD_NAMESPACE", ""),
        ("NODE_NAME", "n"),
        ("KUBECONFIG", "/k"),
    ]);
    assert_eq!(
        e,
        Env {
            kubeconfig: Some("/k".into()),
            node_name: Some("n".into()),
            ..Env::default()
        }
    );
}
