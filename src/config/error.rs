//! Why flags that parse cannot run: each [`ConfigError`] is one line naming
//! the flag (or the environment variable) to change.

use crate::keys;

/// Flags that parse but cannot run together, or a missing environment
/// variable. Each message is one line naming the flag.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("only one of --metrics-address and --http-endpoint can be set")]
    MetricsAddressAndHttpEndpoint,
    #[error("--volume-name-prefix must not be empty")]
    EmptyVolumeNamePrefix,
    #[error("--volume-name-uuid-length must be -1 or between 1 and 32, not {0}")]
    VolumeNameUuidLength(i64),
    #[error("--node-deployment requires the NODE_NAME environment variable")]
    NodeNameMissing,
    #[error("--enable-capacity requires the NAMESPACE environment variable")]
    CapacityNamespaceMissing,
    #[error(
        "--enable-capacity with --capacity-ownerref-level >= 0 requires the POD_NAME environment variable"
    )]
    CapacityPodNameMissing,
    #[error(
        "--retry-interval-start ({start}) must not be longer than --retry-interval-max ({max})"
    )]
    RetryIntervals { start: String, max: String },
    #[error("--worker-threads must be at least 1")]
    NoWorkers,
    #[error(
        "--admission-intent cannot be used with --node-deployment: a node gives a claim back to the scheduler without its intent only after the first CreateVolume of its name, which an intent made before any attempt hides"
    )]
    AdmissionIntentOnNodes,
    #[error("--timeout must be greater than zero")]
    ZeroTimeout,
    #[error(
        "--copy-pvc-labels: {key} cannot be copied: the scheduler reads it from PersistentVolumes to place their pods (the PV's node affinity says where its volume is)"
    )]
    SchedulingLabel { key: String },
    #[error(
        "{flag}: the parameter {parameter:?} would be {} bytes, more than the {} bytes CSI allows a string", parameter.len(), keys::CSI_MAX_STRING_BYTES
    )]
    ParameterKeyTooLong {
        flag: &'static str,
        parameter: String,
    },
    #[error("--csi-address {0:?} is not a unix socket (use /path, unix:///path or unix:path)")]
    CsiAddress(String),
    #[error("{flag} must be greater than zero")]
    NotPositive { flag: &'static str },
    #[error(
        "--leader-election-lease-duration ({lease}) must be longer than --leader-election-renew-deadline ({renew})"
    )]
    LeaseNotLongerThanRenew { lease: String, renew: String },
    #[error(
        "--leader-election-renew-deadline ({renew}) must be longer than 1.2 x --leader-election-retry-period ({retry})"
    )]
    RenewNotLongerThanRetry { renew: String, retry: String },
    #[error("{burst} must be greater than 0 when {qps} is greater than 0")]
    Burst {
        qps: &'static str,
        burst: &'static str,
    },
    #[error("{0} must be a number")]
    QpsNotANumber(&'static str),
    #[error("--log-flush-frequency must be greater than zero")]
    LogFlushFrequency,
    #[error("--vmodule is only supported with --logging-format=text")]
    VModuleNeedsText,
    #[error("--logging-format=json is disabled by --feature-gates=LoggingBetaOptions=false")]
    JsonDisabled,
    #[error("{0} needs --feature-gates=LoggingAlphaOptions=true")]
    NeedsLoggingAlphaOptions(&'static str),
}
