//! Every flag's default is upstream's, and the defaults make upstream's config.

use super::*;

#[test]
fn command_is_well_formed() {
    command().debug_assert();
}

#[test]
fn every_default_matches_upstream() {
    // Destructured in full: a new flag fails to compile until its default is checked here.
    let Args {
        version,
        automaxprocs,
        feature_gates,
        csi: CsiArgs {
            csi_address,
            timeout,
        },
        client:
            ClientArgs {
                master,
                kubeconfig,
                kube_api_qps,
                kube_api_burst,
            },
        provisioning:
            ProvisioningArgs {
                volume_name_prefix,
                volume_name_uuid_length,
                retry_interval_start,
                retry_interval_max,
                worker_threads,
                cloning_protection_threads,
                snapshot_orphan_sweep_interval,
                strict_topology,
                immediate_topology,
                extra_create_metadata,
                default_fstype,
                controller_publish_readonly,
                prevent_volume_mode_conversion,
                admission_intent,
                freshness_from_writes,
            },
        metadata:
            MetadataArgs {
                copy_pvc_labels,
                extra_create_metadata_pvc_labels,
                extra_create_metadata_pvc_annotations,
                extra_create_metadata_namespace_labels,
                extra_create_metadata_namespace_annotations,
            },
        leader_election:
            LeaderElectionArgs {
                leader_election,
                leader_election_namespace,
                leader_election_lease_duration,
                leader_election_renew_deadline,
                leader_election_retry_period,
                leader_election_labels,
            },
        http:
            HttpArgs {
                http_endpoint,
                metrics_address,
                metrics_path,
                enable_pprof,
            },
        capacity:
            CapacityArgs {
                enable_capacity,
                capacity_threads,
                kube_api_capacity_qps,
                kube_api_capacity_burst,
                capacity_for_immediate_binding,
                capacity_poll_interval,
                capacity_ownerref_level,
            },
        node_deployment:
            NodeDeploymentArgs {
                node_deployment,
                node_deployment_immediate_binding,
                node_deployment_base_delay,
                node_deployment_max_delay,
            },
        logging:
            LoggingArgs {
                v,
                vmodule,
                logging_format,
                log_flush_frequency,
                log_text_split_stream,
                log_text_info_buffer_size,
                log_json_split_stream,
                log_json_info_buffer_size,
            },
    } = parsed(&[]);

    // 1.1.a
    assert_eq!(master, "");
    assert_eq!(volume_name_prefix, "pvc");
    assert_eq!(volume_name_uuid_length, -1);
    assert_eq!(retry_interval_start, secs(1));
    assert_eq!(retry_interval_max, secs(5 * 60));
    assert_eq!(worker_threads, 100);
    assert_eq!(cloning_protection_threads, 1);
    assert_eq!(snapshot_orphan_sweep_interval, secs(5 * 60));
    assert_eq!(capacity_threads, 1);
    assert_eq!(timeout, secs(10));
    assert!(!strict_topology);
    assert!(immediate_topology);
    assert!(!extra_create_metadata);
    assert!(!enable_pprof);
    assert_eq!(default_fstype, "");
    assert_eq!(kube_api_capacity_qps, 1.0);
    assert_eq!(kube_api_capacity_burst, 5);
    assert!(!enable_capacity);
    assert!(!capacity_for_immediate_binding);
    assert_eq!(capacity_poll_interval, secs(60));
    assert_eq!(capacity_ownerref_level, 1);
    assert!(!node_deployment);
    assert!(node_deployment_immediate_binding);
    assert_eq!(node_deployment_base_delay, secs(20));
    assert_eq!(node_deployment_max_delay, secs(60));
    assert!(!controller_publish_readonly);
    assert!(prevent_volume_mode_conversion);
    assert!(
        !admission_intent,
        "the sidecar writes the intent unless told otherwise"
    );
    assert!(
        freshness_from_writes,
        "with --admission-intent, versions come from our creates unless told otherwise"
    );
    assert!(feature_gates.is_empty());
    // Ours (upstream has no such flag): nothing passed on by default.
    assert!(copy_pvc_labels.is_empty());
    // PR #1531's flags, and ours of the same shape: nothing sent to the driver by default.
    assert!(extra_create_metadata_pvc_labels.is_empty());
    assert!(extra_create_metadata_pvc_annotations.is_empty());
    assert!(extra_create_metadata_namespace_labels.is_empty());
    assert!(extra_create_metadata_namespace_annotations.is_empty());
    // 1.1.b
    assert!(!version);
    assert_eq!(kubeconfig, "");
    assert_eq!(csi_address, "/run/csi/socket");
    assert!(!leader_election);
    assert_eq!(leader_election_namespace, "");
    assert_eq!(leader_election_lease_duration, secs(15));
    assert_eq!(leader_election_renew_deadline, secs(10));
    assert_eq!(leader_election_retry_period, secs(5));
    assert!(leader_election_labels.is_empty());
    assert_eq!(kube_api_qps, 5.0);
    assert_eq!(kube_api_burst, 10);
    assert_eq!(http_endpoint, "");
    assert_eq!(metrics_address, "");
    assert_eq!(metrics_path, "/metrics");
    assert!(!automaxprocs);
    // 1.1.c
    assert_eq!(v, 0);
    assert!(vmodule.is_empty());
    assert_eq!(logging_format, LogFormat::Text);
    assert_eq!(log_flush_frequency, secs(5));
    assert!(!log_text_split_stream);
    assert_eq!(log_text_info_buffer_size, 0);
    assert!(!log_json_split_stream);
    assert_eq!(log_json_info_buffer_size, 0);
}

#[test]
fn default_flags_and_empty_environment_give_upstreams_config() {
    let want = Config {
        csi_socket: PathBuf::from("/run/csi/socket"),
        timeout: secs(10),
        client: ClientConfig {
            master: None,
            kubeconfig: None,
            rate_limit: RateLimit::TokenBucket {
                qps: 5.0,
                burst: 10,
            },
        },
        provisioning: ProvisioningConfig {
            volume_name_prefix: "pvc".into(),
            volume_name_uuid_length: None,
            retry_interval_start: secs(1),
            retry_interval_max: secs(300),
            worker_threads: 100,
            cloning_protection_threads: 1,
            snapshot_orphan_sweep_interval: Some(secs(300)),
            strict_topology: false,
            immediate_topology: true,
            extra_create_metadata: false,
            default_fstype: None,
            controller_publish_readonly: false,
            prevent_volume_mode_conversion: true,
            admission_intent: false,
            freshness_from_writes: true,
        },
        metadata: MetadataConfig::default(),
        leader_election: None,
        http: None,
        capacity: None,
        node_deployment: None,
        feature_gates: FeatureGates {
            topology: true,
            cross_namespace_volume_data_source: false,
            volume_attributes_class: None,
            release_leader_election_on_exit: false,
            contextual_logging: true,
            logging_alpha_options: false,
            logging_beta_options: true,
        },
        logging: LoggingConfig {
            verbosity: 0,
            vmodule: vec![],
            format: LogFormat::Text,
            flush_frequency: secs(5),
            split_stream: false,
            info_buffer_size: 0,
        },
    };
    assert_eq!(config(&[], &Env::default()), Ok(want));
}
