//! Every upstream csi-provisioner flag (same names, defaults and value syntax,
//! including Go's `-single-dash` long flags and `--bool=false` form) and the
//! environment variables upstream reads, validated into one typed [`Config`].
//!
//! Two kinds of error, as upstream has two: a value that cannot be parsed
//! (`--timeout=10`, an unknown flag or feature gate) is a [`clap::Error`] from
//! [`parse_from`] (usage error, exit code 2); flags that parse but do not fit
//! together, or miss an environment variable, are a [`ConfigError`] from
//! [`Config::from_args`] (exit code 1).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, ValueEnum};

use crate::duration::{format_go_duration, parse_go_duration};

/// Where the pod's namespace is mounted (fallback for the Lease namespace).
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// client-go's leader-election `JitterFactor`: the renew deadline must exceed
/// the retry period by this factor (upstream: client-go `NewLeaderElector`).
const LEADER_ELECTION_JITTER_FACTOR: f64 = 1.2;

/// Longest `--volume-name-uuid-length` that fits a dashless UID (32 hex
/// characters). Upstream slices the UID and panics above this.
const MAX_VOLUME_NAME_UUID_LENGTH: i64 = 32;

/// Flags accepted for compatibility whose feature is not built yet. Turning
/// one on is an error rather than silently running without the behaviour a
/// manifest asked for. Delete a row when its feature lands.
const NOT_SUPPORTED_YET: &[NotSupported] = &[NotSupported {
    flag: "--enable-pprof",
    enabled: |a| a.http.enable_pprof,
}];

struct NotSupported {
    /// How the error names what was asked for.
    flag: &'static str,
    enabled: fn(&Args) -> bool,
}

// ---------------------------------------------------------------------------
// Flags
// ---------------------------------------------------------------------------

/// Help headings, in the order `--help` shows them: flags grouped by what
/// they configure, as upstream's README groups them.
mod heading {
    pub const CSI: &str = "CSI driver connection";
    pub const CLIENT: &str = "Kubernetes API client";
    pub const LEADER_ELECTION: &str = "Leader election";
    pub const PROVISIONING: &str = "Provisioning";
    pub const DATA_SOURCES: &str = "Data sources (clones and snapshots)";
    pub const CAPACITY: &str = "Storage capacity";
    pub const NODE_DEPLOYMENT: &str = "Node deployment";
    pub const HTTP: &str = "Metrics and HTTP";
    pub const LOGGING: &str = "Feature gates and logging";
}

/// The first line of `-h` and `--help`.
const ABOUT: &str = "Kubernetes CSI external-provisioner sidecar: creates and deletes \
                     PersistentVolumes for a CSI driver";

/// What `--help` says before the flags: what the program does and where it runs.
const LONG_ABOUT: &str = "\
Kubernetes CSI external-provisioner sidecar: creates and deletes PersistentVolumes for a CSI driver.

Runs as a container next to a CSI driver's controller. For each PersistentVolumeClaim whose
StorageClass names the driver, it calls the driver's CreateVolume over the driver's unix socket
and creates the PersistentVolume; when a PersistentVolume with reclaim policy Delete is released,
it calls DeleteVolume and removes the PersistentVolume.

A drop-in replacement for the Go sidecar (registry.k8s.io/sig-storage/csi-provisioner): the same
flags and defaults, annotations, events, metrics and Lease. Flags are also accepted as Go writes
them: -csi-address=/csi/csi.sock, --leader-election=false, durations such as 30s or 1m30s.";

/// What `--help` says after the flags.
const AFTER_LONG_HELP: &str = "\
Environment:
  KUBECONFIG       kubeconfig to use; takes precedence over --kubeconfig
  POD_NAMESPACE    namespace of the leader-election Lease when --leader-election-namespace is empty
  NAMESPACE        namespace of the CSIStorageCapacity objects (--enable-capacity)
  POD_NAME         the pod that owns them (--capacity-ownerref-level >= 0)

Commands for the operator (each has its own --help):
  csi-provisioner check --csi-address=...   check a driver against what a provisioner relies on
  csi-provisioner audit --csi-address=...   compare the driver's volumes with the PersistentVolumes
                                            (read-only)

Exit status: 0 after SIGTERM or SIGINT, --help or --version; 1 when the sidecar cannot start or
stops on an error (the reason is the last line on stderr); 2 when a flag cannot be parsed.";

// The command line, as upstream defines it. Build it with [`parse_from`],
// which applies Go's flag syntax; `Args::parse_from` (clap's own) does not.
//
// Boolean fields are declared as plain clap switches; [`command`] gives every
// one of them Go's semantics (`--flag`, `--flag=false`, never `--flag false`).
//
// These are `//` comments on purpose: clap prints a struct's `///` comment as
// the program's description. The `///` comments of the fields are the flags'
// help text, written for the person running the program.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "csi-provisioner",
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_long_help = AFTER_LONG_HELP,
    args_override_self = true
)]
pub struct Args {
    /// Print the version and exit.
    #[arg(long)]
    pub version: bool,

    /// Accepted for compatibility and ignored: it sizes the Go runtime, which
    /// this program does not have.
    #[arg(long)]
    pub automaxprocs: bool,

    #[command(flatten)]
    pub csi: CsiArgs,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub leader_election: LeaderElectionArgs,
    #[command(flatten)]
    pub provisioning: ProvisioningArgs,
    #[command(flatten)]
    pub capacity: CapacityArgs,
    #[command(flatten)]
    pub node_deployment: NodeDeploymentArgs,
    #[command(flatten)]
    pub http: HttpArgs,

    /// Turn features on or off, KEY=BOOL,... (repeatable). Known: Topology,
    /// CrossNamespaceVolumeDataSource, VolumeAttributesClass,
    /// ReleaseLeaderElectionOnExit, ContextualLogging, LoggingAlphaOptions,
    /// LoggingBetaOptions, and AllAlpha / AllBeta for every alpha / beta gate.
    #[arg(long, action = ArgAction::Append, value_parser = parse_feature_gates,
          value_name = "KEY=BOOL,...", help_heading = heading::LOGGING)]
    pub feature_gates: Vec<GateSettings>,

    #[command(flatten)]
    pub logging: LoggingArgs,
}

/// The CSI driver connection.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::CSI)]
pub struct CsiArgs {
    /// The driver's unix socket: /path, unix:///path or unix:path.
    #[arg(long, default_value = "/run/csi/socket", value_name = "PATH")]
    pub csi_address: String,

    /// Time limit of each call to the driver (CreateVolume, DeleteVolume, Probe, ...).
    #[arg(long, default_value = "10s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub timeout: Duration,
}

/// The Kubernetes API client.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::CLIENT)]
pub struct ClientArgs {
    /// API server URL, instead of the kubeconfig's.
    #[arg(long, default_value = "", value_name = "URL")]
    pub master: String,

    /// Kubeconfig file; without one, the pod's service account is used
    /// (in-cluster config). KUBECONFIG, when set, takes precedence.
    #[arg(long, default_value = "", value_name = "PATH")]
    pub kubeconfig: String,

    /// Requests per second to the API server (client-side limit).
    #[arg(long, default_value_t = 5.0, value_name = "QPS")]
    pub kube_api_qps: f64,

    /// Requests to the API server allowed in a burst above --kube-api-qps.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub kube_api_burst: i64,
}

/// Provisioning and deletion of volumes.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::PROVISIONING)]
pub struct ProvisioningArgs {
    /// Prefix of the PersistentVolume name, which is also the name passed to CreateVolume.
    #[arg(long, default_value = "pvc", value_name = "PREFIX")]
    pub volume_name_prefix: String,

    /// Characters of the claim's UID in the volume name, dashes removed (at most 32);
    /// -1 keeps the whole UID with its dashes.
    #[arg(long, default_value_t = -1, value_name = "N")]
    pub volume_name_uuid_length: i64,

    /// First wait before retrying a failed provisioning or deletion; it doubles
    /// with each failure.
    #[arg(long, default_value = "1s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub retry_interval_start: Duration,

    /// Longest wait between retries of a failed provisioning or deletion.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub retry_interval_max: Duration,

    /// Claims provisioned at once (and volumes deleted at once).
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub worker_threads: u64,

    /// Workers removing the finalizers that protect the source claim of a clone.
    #[arg(long, default_value_t = 1, value_name = "N", help_heading = heading::DATA_SOURCES)]
    pub cloning_protection_threads: u64,

    /// How often to look for snapshot source-protection finalizers left behind; 0 never.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration,
          value_name = "DURATION", help_heading = heading::DATA_SOURCES)]
    pub snapshot_orphan_sweep_interval: Duration,

    /// With WaitForFirstConsumer: give CreateVolume only the selected node's topology.
    #[arg(long)]
    pub strict_topology: bool,

    /// With Immediate binding: give CreateVolume the topology of the whole cluster
    /// (true) or none (false).
    #[arg(long, default_value = "true")]
    pub immediate_topology: bool,

    /// Pass the claim's name and namespace and the PersistentVolume's name to
    /// CreateVolume as parameters.
    #[arg(long)]
    pub extra_create_metadata: bool,

    /// Filesystem type of volumes whose StorageClass sets none.
    #[arg(long, default_value = "", value_name = "FSTYPE")]
    pub default_fstype: String,

    /// Make the PersistentVolume read-only when the claim's only access mode is ReadOnlyMany.
    #[arg(long)]
    pub controller_publish_readonly: bool,

    /// Refuse to restore a snapshot into a volume of another mode (Filesystem, Block)
    /// unless the snapshot allows it.
    #[arg(long, default_value = "true", help_heading = heading::DATA_SOURCES)]
    pub prevent_volume_mode_conversion: bool,
}

/// Lease-based leader election.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::LEADER_ELECTION)]
pub struct LeaderElectionArgs {
    /// Act only while holding a Lease, so that several replicas can run.
    #[arg(long)]
    pub leader_election: bool,

    /// Namespace of the Lease. When empty: POD_NAMESPACE, else the pod's own
    /// namespace, else default.
    #[arg(long, default_value = "", value_name = "NAMESPACE")]
    pub leader_election_namespace: String,

    /// How long a standby replica waits for the leader to renew before taking over.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leading.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub leader_election_renew_deadline: Duration,

    /// Wait between attempts to take or renew the Lease.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub leader_election_retry_period: Duration,

    /// Labels put on the Lease while this replica leads, KEY:VALUE,... (repeatable).
    #[arg(long, action = ArgAction::Append, value_parser = parse_labels,
          value_name = "KEY:VALUE,...")]
    pub leader_election_labels: Vec<Labels>,
}

/// The HTTP server (metrics, leader-election health check).
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::HTTP)]
pub struct HttpArgs {
    /// Serve metrics and /healthz/leader-election on this address (:8080,
    /// 127.0.0.1:8080). Off when empty.
    #[arg(long, default_value = "", value_name = "ADDRESS")]
    pub http_endpoint: String,

    /// Deprecated: like --http-endpoint, without the leader-election health check.
    #[arg(long, default_value = "", value_name = "ADDRESS")]
    pub metrics_address: String,

    /// Path of the Prometheus metrics.
    #[arg(long, default_value = "/metrics", value_name = "PATH")]
    pub metrics_path: String,

    /// Serve Go's profiling endpoints under /debug/pprof/.
    #[arg(long)]
    pub enable_pprof: bool,
}

/// CSIStorageCapacity publishing.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::CAPACITY)]
pub struct CapacityArgs {
    /// Publish CSIStorageCapacity objects with what the driver's GetCapacity reports.
    #[arg(long)]
    pub enable_capacity: bool,

    /// Workers updating CSIStorageCapacity objects (accepted; here one pass
    /// brings every object up to date).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub capacity_threads: u64,

    /// Requests per second of the client that writes CSIStorageCapacity objects.
    #[arg(long, default_value_t = 1.0, value_name = "QPS")]
    pub kube_api_capacity_qps: f32,

    /// Burst of the client that writes CSIStorageCapacity objects.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub kube_api_capacity_burst: i64,

    /// Publish capacity for StorageClasses with Immediate binding too.
    #[arg(long)]
    pub capacity_for_immediate_binding: bool,

    /// How often to ask the driver for capacity.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub capacity_poll_interval: Duration,

    /// Owner of the CSIStorageCapacity objects: -1 none, 0 this pod, 1 its
    /// controller (a ReplicaSet), 2 that one's controller (a Deployment), ...
    #[arg(long, default_value_t = 1, value_name = "LEVEL")]
    pub capacity_ownerref_level: i64,
}

/// One provisioner per node, for node-local volumes.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::NODE_DEPLOYMENT)]
pub struct NodeDeploymentArgs {
    /// Run on every node next to the driver, provisioning the node's own volumes
    /// (needs NODE_NAME).
    #[arg(long)]
    pub node_deployment: bool,

    /// In a node deployment, also take claims with Immediate binding.
    #[arg(long, default_value = "true")]
    pub node_deployment_immediate_binding: bool,

    /// In a node deployment, first wait before taking an Immediate-binding claim.
    #[arg(long, default_value = "20s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub node_deployment_base_delay: Duration,

    /// In a node deployment, longest wait before taking an Immediate-binding claim.
    #[arg(long, default_value = "60s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub node_deployment_max_delay: Duration,
}

/// Logging (component-base's logging flags).
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::LOGGING)]
pub struct LoggingArgs {
    /// Log verbosity: up to 4, what the sidecar does and why it fails; 5 adds
    /// every call to the driver with its request and response; 8 adds the logs
    /// of the libraries underneath.
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub v: u8,

    /// Verbosity per source file, PATTERN=N,...: a pattern is a file name without
    /// .rs (claim), a path if it has a /, a module path if it has :: (text format
    /// only; repeatable).
    #[arg(long, action = ArgAction::Append, value_parser = parse_vmodule,
          value_name = "PATTERN=N,...")]
    pub vmodule: Vec<VModuleList>,

    /// Log format.
    #[arg(long, value_enum, default_value = "text", value_name = "FORMAT")]
    pub logging_format: LogFormat,

    /// Accepted and checked; lines are written as they are logged, so there is
    /// nothing to flush.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub log_flush_frequency: Duration,

    /// [Alpha] Text format: errors to stderr, the rest to stdout (needs
    /// --feature-gates=LoggingAlphaOptions=true).
    #[arg(long)]
    pub log_text_split_stream: bool,

    /// [Alpha] Text format with split streams: buffer size of stdout (512, 1k, 2Ki,
    /// 5Mi); accepted and checked, lines are not buffered.
    #[arg(long, default_value = "0", value_parser = parse_byte_quantity,
          value_name = "SIZE")]
    pub log_text_info_buffer_size: u64,

    /// [Alpha] JSON format: errors to stderr, the rest to stdout (needs
    /// --feature-gates=LoggingAlphaOptions=true).
    #[arg(long)]
    pub log_json_split_stream: bool,

    /// [Alpha] JSON format with split streams: buffer size of stdout (512, 1k, 2Ki,
    /// 5Mi); accepted and checked, lines are not buffered.
    #[arg(long, default_value = "0", value_parser = parse_byte_quantity,
          value_name = "SIZE")]
    pub log_json_info_buffer_size: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The clap command with Go's flag semantics applied to it:
/// - every boolean is `--flag` or `--flag=<bool>` (Go's `strconv.ParseBool`
///   spellings); `--flag false` sets the flag and leaves a stray `false`,
///   which is an error, exactly as with Go's flag packages;
/// - every other flag takes the next argument as its value even when it
///   starts with `-` (`--volume-name-uuid-length -1`), as pflag does.
///
/// Help shows a default only where it says something, as Go's flag package
/// does: not `false`, not an empty string. A flag whose feature is not built
/// yet ([`NOT_SUPPORTED_YET`]) says so in its help.
pub fn command() -> clap::Command {
    Args::command().mut_args(|arg| {
        let arg = if matches!(arg.get_action(), ArgAction::SetTrue) {
            let default_true = arg
                .get_default_values()
                .first()
                .is_some_and(|v| v == "true");
            let default = if default_true { "true" } else { "false" };
            arg.action(ArgAction::Set)
                .num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true")
                .default_value(default)
                .value_parser(parse_go_bool)
                .value_name("BOOL")
        } else if arg.get_action().takes_values() {
            arg.allow_hyphen_values(true)
        } else {
            arg
        };
        let says_nothing = arg
            .get_default_values()
            .iter()
            .all(|v| v.is_empty() || v == "false");
        let arg = arg.hide_default_value(says_nothing);
        if is_not_supported_yet(&arg) {
            let note = "(not built yet: turning it on stops the program with an error)";
            let help = arg.get_help().map(|h| format!("{h} {note}"));
            let long_help = arg.get_long_help().map(|h| format!("{h} {note}"));
            let arg = arg.help(help.unwrap_or_else(|| note.into()));
            match long_help {
                Some(h) => arg.long_help(h),
                None => arg,
            }
        } else {
            arg
        }
    })
}

/// Whether `arg` is a flag of [`NOT_SUPPORTED_YET`] (by its long name).
fn is_not_supported_yet(arg: &clap::Arg) -> bool {
    arg.get_long().is_some_and(|long| {
        NOT_SUPPORTED_YET
            .iter()
            .any(|row| row.flag.strip_prefix("--") == Some(long))
    })
}

/// Parses argv (program name first) the way upstream's flag packages do.
///
/// On error, the caller decides with clap's own classification:
/// `error.kind()` is `DisplayHelp` for `-h`/`--help` (print the whole
/// message, `exit_code()` is 0); anything else is a usage error: print
/// [`error_line`] and exit with `error.exit_code()` (2).
pub fn parse_from(argv: impl IntoIterator<Item = String>) -> Result<Args, clap::Error> {
    let matches = command().try_get_matches_from(normalize_args(argv))?;
    Args::from_arg_matches(&matches)
}

/// One line saying why parsing failed, e.g.
/// `unexpected argument '--no-such-flag' found`.
pub fn error_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first = rendered.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// Rewrites Go's single-dash long flags (`-csi-address=/x`,
/// `-leader-election`, `-timeout 10s`) to `--` form so clap understands them.
/// Left alone: `-v` in all its forms (`-v 5`, `-v=5`, `-v5`), `-h`, values
/// following a flag that takes one (`-kubeconfig -weird-name`), anything that
/// is not a flag (`-1`) and everything after `--`.
pub fn normalize_args(argv: impl IntoIterator<Item = String>) -> Vec<String> {
    let takes_separate_value = separate_value_flags();
    let mut out = Vec::new();
    let mut argv = argv.into_iter();
    // The program name is never a flag.
    out.extend(argv.next());
    let mut value_next = false;
    let mut passthrough = false;
    for arg in argv {
        if passthrough || value_next {
            value_next = false;
            out.push(arg);
            continue;
        }
        if arg == "--" {
            passthrough = true;
            out.push(arg);
            continue;
        }
        let (dashes, body) = if let Some(body) = arg.strip_prefix("--") {
            (2, body)
        } else if let Some(body) = arg.strip_prefix('-') {
            (1, body)
        } else {
            out.push(arg);
            continue;
        };
        let (name, has_value) = match body.split_once('=') {
            Some((name, _)) => (name, true),
            None => (body, false),
        };
        if dashes == 1 && !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
            // `-1`, `-`: a value, not a flag.
            out.push(arg);
            continue;
        }
        // `-v5` carries its value (not in the list); `-v`, `--timeout` take
        // the next argument.
        if !has_value && takes_separate_value.iter().any(|f| f == name) {
            value_next = true;
        }
        let is_short = name == "h" || is_short_verbosity(name);
        if dashes == 1 && !is_short {
            out.push(format!("-{arg}"));
        } else {
            out.push(arg);
        }
    }
    out
}

/// `v`, or `v` followed by its value (`-v5`), as pflag's shorthand allows.
fn is_short_verbosity(name: &str) -> bool {
    name.strip_prefix('v')
        .is_some_and(|rest| rest.bytes().all(|b| b.is_ascii_digit()))
}

/// Long names (and `v`) of the flags whose value may be the next argument.
fn separate_value_flags() -> Vec<String> {
    command()
        .get_arguments()
        .filter(|a| a.get_action().takes_values() && !a.is_require_equals_set())
        .flat_map(|a| {
            let long = a.get_long().map(str::to_string);
            let short = a.get_short().map(String::from);
            long.into_iter().chain(short)
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Flag value syntax
// ---------------------------------------------------------------------------

/// Go's `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("invalid boolean {s:?} (use true or false)")),
    }
}

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

fn parse_feature_gates(s: &str) -> Result<GateSettings, String> {
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

/// One `--leader-election-labels` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labels(pub Vec<(String, String)>);

/// `k1:v1,k2:v2`; every item needs exactly one `:` (upstream: csi-lib-utils
/// `standardflags.stringMap`, which trims nothing).
fn parse_labels(s: &str) -> Result<Labels, String> {
    s.split(',')
        .map(|item| match item.split(':').collect::<Vec<_>>()[..] {
            [key, value] => Ok((key.to_string(), value.to_string())),
            _ => Err(format!(
                "malformed item in list of labels: {item:?} (want key:value)"
            )),
        })
        .collect::<Result<_, _>>()
        .map(Labels)
}

/// One `--vmodule` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VModuleList(pub Vec<VModule>);

/// Verbosity for the files matching `pattern`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VModule {
    pub pattern: String,
    pub verbosity: u32,
}

/// `pattern=N,...` (upstream: component-base `VModuleConfigurationPflag`).
fn parse_vmodule(s: &str) -> Result<VModuleList, String> {
    let mut list = Vec::new();
    for item in s.split(',').filter(|item| !item.is_empty()) {
        let [pattern, level] = item.split('=').collect::<Vec<_>>()[..] else {
            return Err(format!("{item:?} does not have the pattern=N format"));
        };
        if pattern.is_empty() || level.is_empty() {
            return Err(format!("{item:?} does not have the pattern=N format"));
        }
        let verbosity = level
            .parse::<u32>()
            .ok()
            .filter(|v| *v <= i32::MAX as u32)
            .ok_or_else(|| format!("invalid verbosity in {item:?}"))?;
        list.push(VModule {
            pattern: pattern.to_string(),
            verbosity,
        });
    }
    Ok(VModuleList(list))
}

/// A Kubernetes resource quantity as a whole number of bytes, rounded up as
/// `Quantity.Value()` does: `512`, `1k` (1000), `2Ki` (1024), `5M`, `6Gi`,
/// `1.5Mi`, `1e3`. Negative sizes are rejected. (Upstream's help text says
/// `1K`, but a Kubernetes quantity only knows lower-case `k`; so here.)
pub fn parse_byte_quantity(input: &str) -> Result<u64, String> {
    use crate::quantity::{QuantityError, parse};
    parse(input).map_err(|e| match e {
        QuantityError::Malformed => {
            format!("invalid quantity {input:?} (examples: 512, 1k, 2Ki, 5Mi)")
        }
        QuantityError::Negative => format!("quantity {input:?} must not be negative"),
        QuantityError::TooLarge => format!("quantity {input:?} is too large"),
    })
}

// ---------------------------------------------------------------------------
// Environment
// ---------------------------------------------------------------------------

/// The environment upstream reads, captured once so validation stays pure
/// (tests build one instead of touching the process environment). Empty
/// variables count as unset, as Go's `os.Getenv(..) != ""` checks do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Env {
    /// `KUBECONFIG`: overrides `--kubeconfig`.
    pub kubeconfig: Option<String>,
    /// `POD_NAMESPACE`: default Lease namespace.
    pub pod_namespace: Option<String>,
    /// `NODE_NAME`: required by `--node-deployment`.
    pub node_name: Option<String>,
    /// `NAMESPACE`: where CSIStorageCapacity objects go.
    pub namespace: Option<String>,
    /// `POD_NAME`: start of the CSIStorageCapacity owner lookup.
    pub pod_name: Option<String>,
    /// Contents of [`SERVICE_ACCOUNT_NAMESPACE_FILE`]: Lease namespace when
    /// neither the flag nor `POD_NAMESPACE` gives one.
    pub service_account_namespace: Option<String>,
}

impl Env {
    /// Reads the variables through `lookup` (e.g. a map in tests); the
    /// service-account namespace is left unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Env {
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        Env {
            kubeconfig: get("KUBECONFIG"),
            pod_namespace: get("POD_NAMESPACE"),
            node_name: get("NODE_NAME"),
            namespace: get("NAMESPACE"),
            pod_name: get("POD_NAME"),
            service_account_namespace: None,
        }
    }

    /// The process environment and the mounted service-account namespace.
    pub fn from_process() -> Env {
        Env {
            service_account_namespace: std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE)
                .ok()
                .map(|ns| ns.trim().to_string())
                .filter(|ns| !ns.is_empty()),
            ..Env::from_lookup(|name| std::env::var(name).ok())
        }
    }
}

// ---------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------

/// Everything the program needs from flags and environment, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The driver's unix socket (`unix://` stripped).
    pub csi_socket: PathBuf,
    /// Timeout of each CSI call.
    pub timeout: Duration,
    pub client: ClientConfig,
    pub provisioning: ProvisioningConfig,
    /// `None` without `--leader-election`.
    pub leader_election: Option<LeaderElectionConfig>,
    /// `None` when neither `--http-endpoint` nor `--metrics-address` is set.
    pub http: Option<HttpConfig>,
    /// `None` without `--enable-capacity`.
    pub capacity: Option<CapacityConfig>,
    /// `None` without `--node-deployment`.
    pub node_deployment: Option<NodeDeploymentConfig>,
    pub feature_gates: FeatureGates,
    pub logging: LoggingConfig,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClientConfig {
    /// `--master`: API server URL overriding the kubeconfig's.
    pub master: Option<String>,
    /// `KUBECONFIG`, else `--kubeconfig`; `None` means in-cluster config.
    pub kubeconfig: Option<PathBuf>,
    pub rate_limit: RateLimit,
}

/// Client-side throttling of API requests, as client-go derives it from QPS
/// and burst: QPS 0 means client-go's default 5, burst 0 its default 10, a
/// negative QPS turns throttling off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RateLimit {
    Unlimited,
    TokenBucket { qps: f32, burst: u32 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvisioningConfig {
    pub volume_name_prefix: String,
    /// `None` (`-1`): the whole PVC UID, dashes included. `Some(n)`: the UID
    /// without dashes, cut to `n` characters (1..=32).
    pub volume_name_uuid_length: Option<usize>,
    pub retry_interval_start: Duration,
    pub retry_interval_max: Duration,
    pub worker_threads: usize,
    pub cloning_protection_threads: usize,
    /// `None` (`0`): the orphaned-finalizer sweep is off.
    pub snapshot_orphan_sweep_interval: Option<Duration>,
    pub strict_topology: bool,
    pub immediate_topology: bool,
    pub extra_create_metadata: bool,
    /// `None`: leave fsType unset when the StorageClass has none.
    pub default_fstype: Option<String>,
    pub controller_publish_readonly: bool,
    pub prevent_volume_mode_conversion: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// `--leader-election-namespace`, else `POD_NAMESPACE`, else the
    /// service-account namespace, else `default`.
    pub namespace: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpConfig {
    /// Go-style listen address: `:8080` means every interface.
    pub address: String,
    pub metrics_path: String,
    /// Serve `/healthz/leader-election`: upstream does only with
    /// `--http-endpoint` (not the deprecated `--metrics-address`) and
    /// `--leader-election`.
    pub leader_election_health: bool,
    pub pprof: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CapacityConfig {
    /// `NAMESPACE`: where the CSIStorageCapacity objects live.
    pub namespace: String,
    /// `None` with a negative `--capacity-ownerref-level`: objects have no owner.
    pub owner: Option<CapacityOwner>,
    pub threads: usize,
    pub rate_limit: RateLimit,
    pub for_immediate_binding: bool,
    pub poll_interval: Duration,
}

/// Start and depth of the owner lookup: `levels` controller references up
/// from the pod `pod_name` (0 is the pod itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityOwner {
    pub pod_name: String,
    pub levels: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDeploymentConfig {
    /// `NODE_NAME`: the node this replica provisions for.
    pub node_name: String,
    pub immediate_binding: bool,
    pub base_delay: Duration,
    pub max_delay: Duration,
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggingConfig {
    pub verbosity: u8,
    pub vmodule: Vec<VModule>,
    pub format: LogFormat,
    pub flush_frequency: Duration,
    /// Errors to stderr, everything else to stdout (of the selected format).
    pub split_stream: bool,
    /// Bytes of info output buffered when the stream is split; 0: none.
    pub info_buffer_size: u64,
}

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
    #[error("--timeout must be greater than zero")]
    ZeroTimeout,
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
    #[error("{0} is not supported yet by this csi-provisioner")]
    NotSupported(&'static str),
}

impl Config {
    /// Validates parsed flags against each other and the environment.
    ///
    /// `--version` is not looked at: the caller prints the version before
    /// calling this, so that it works whatever else is on the command line.
    pub fn from_args(args: &Args, env: &Env) -> Result<Config, ConfigError> {
        Config::validate(args, env, NOT_SUPPORTED_YET)
    }

    fn validate(
        args: &Args,
        env: &Env,
        not_supported: &[NotSupported],
    ) -> Result<Config, ConfigError> {
        if let Some(row) = not_supported.iter().find(|row| (row.enabled)(args)) {
            return Err(ConfigError::NotSupported(row.flag));
        }

        // Destructured in full so that a new flag cannot be left unused.
        let Args {
            version: _,
            // A Go runtime knob: nothing to apply here.
            automaxprocs: _,
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
            logging,
        } = args;

        let feature_gates = FeatureGates::resolve(feature_gates);
        let logging = logging_config(logging, &feature_gates)?;

        // Upstream's order: NODE_NAME, then the HTTP flags, then the rest.
        let node_deployment = if *node_deployment {
            Some(NodeDeploymentConfig {
                node_name: env.node_name.clone().ok_or(ConfigError::NodeNameMissing)?,
                immediate_binding: *node_deployment_immediate_binding,
                base_delay: *node_deployment_base_delay,
                max_delay: *node_deployment_max_delay,
            })
        } else {
            None
        };

        if !metrics_address.is_empty() && !http_endpoint.is_empty() {
            return Err(ConfigError::MetricsAddressAndHttpEndpoint);
        }
        let http = [http_endpoint, metrics_address]
            .into_iter()
            .find(|address| !address.is_empty())
            .map(|address| HttpConfig {
                address: address.clone(),
                metrics_path: metrics_path.clone(),
                leader_election_health: *leader_election && !http_endpoint.is_empty(),
                pprof: *enable_pprof,
            });

        let client = ClientConfig {
            master: Some(master.clone()).filter(|m| !m.is_empty()),
            kubeconfig: env
                .kubeconfig
                .clone()
                .or_else(|| Some(kubeconfig.clone()).filter(|k| !k.is_empty()))
                .map(PathBuf::from),
            rate_limit: rate_limit(
                *kube_api_qps,
                *kube_api_burst,
                "--kube-api-qps",
                "--kube-api-burst",
            )?,
        };

        if volume_name_prefix.is_empty() {
            return Err(ConfigError::EmptyVolumeNamePrefix);
        }
        let volume_name_uuid_length = volume_name_uuid_length_of(*volume_name_uuid_length)?;
        if retry_interval_start > retry_interval_max {
            return Err(ConfigError::RetryIntervals {
                start: format_go_duration(*retry_interval_start),
                max: format_go_duration(*retry_interval_max),
            });
        }
        if *worker_threads == 0 {
            return Err(ConfigError::NoWorkers);
        }
        // Upstream does not check this, but a zero timeout fails every call.
        if timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        let provisioning = ProvisioningConfig {
            volume_name_prefix: volume_name_prefix.clone(),
            volume_name_uuid_length,
            retry_interval_start: *retry_interval_start,
            retry_interval_max: *retry_interval_max,
            worker_threads: to_usize(*worker_threads),
            cloning_protection_threads: to_usize(*cloning_protection_threads),
            snapshot_orphan_sweep_interval: Some(*snapshot_orphan_sweep_interval)
                .filter(|d| !d.is_zero()),
            strict_topology: *strict_topology,
            immediate_topology: *immediate_topology,
            extra_create_metadata: *extra_create_metadata,
            default_fstype: Some(default_fstype.clone()).filter(|f| !f.is_empty()),
            controller_publish_readonly: *controller_publish_readonly,
            prevent_volume_mode_conversion: *prevent_volume_mode_conversion,
        };

        let leader_election = if *leader_election {
            check_leader_election_timing(
                *leader_election_lease_duration,
                *leader_election_renew_deadline,
                *leader_election_retry_period,
            )?;
            let namespace = [
                Some(leader_election_namespace.clone()).filter(|ns| !ns.is_empty()),
                env.pod_namespace.clone(),
                env.service_account_namespace.clone(),
            ]
            .into_iter()
            .flatten()
            .next()
            .unwrap_or_else(|| "default".to_string());
            Some(LeaderElectionConfig {
                namespace,
                lease_duration: *leader_election_lease_duration,
                renew_deadline: *leader_election_renew_deadline,
                retry_period: *leader_election_retry_period,
                labels: leader_election_labels
                    .iter()
                    .flat_map(|l| l.0.clone())
                    .collect(),
            })
        } else {
            None
        };

        let capacity = if *enable_capacity {
            let namespace = env
                .namespace
                .clone()
                .ok_or(ConfigError::CapacityNamespaceMissing)?;
            let owner = match u32::try_from(*capacity_ownerref_level) {
                Ok(levels) => Some(CapacityOwner {
                    pod_name: env
                        .pod_name
                        .clone()
                        .ok_or(ConfigError::CapacityPodNameMissing)?,
                    levels,
                }),
                // Negative: no owner. (Above u32::MAX is no real hierarchy.)
                Err(_) => None,
            };
            Some(CapacityConfig {
                namespace,
                owner,
                threads: to_usize(*capacity_threads),
                rate_limit: rate_limit(
                    f64::from(*kube_api_capacity_qps),
                    *kube_api_capacity_burst,
                    "--kube-api-capacity-qps",
                    "--kube-api-capacity-burst",
                )?,
                for_immediate_binding: *capacity_for_immediate_binding,
                poll_interval: *capacity_poll_interval,
            })
        } else {
            None
        };

        Ok(Config {
            csi_socket: csi_socket_path(csi_address)?,
            timeout: *timeout,
            client,
            provisioning,
            leader_election,
            http,
            capacity,
            node_deployment,
            feature_gates,
            logging,
        })
    }
}

/// Upstream: component-base `logsapi.Validate`. Unlike upstream, whose
/// logging validation sees a private gate set that `--feature-gates` never
/// reaches (so the alpha options can never be turned on there), the alpha
/// options here are enabled by `--feature-gates=LoggingAlphaOptions=true`,
/// as their help text says.
fn logging_config(args: &LoggingArgs, gates: &FeatureGates) -> Result<LoggingConfig, ConfigError> {
    let LoggingArgs {
        v,
        vmodule,
        logging_format,
        log_flush_frequency,
        log_text_split_stream,
        log_text_info_buffer_size,
        log_json_split_stream,
        log_json_info_buffer_size,
    } = args;
    if log_flush_frequency.is_zero() {
        return Err(ConfigError::LogFlushFrequency);
    }
    if *logging_format == LogFormat::Json && !gates.logging_beta_options {
        return Err(ConfigError::JsonDisabled);
    }
    let vmodule: Vec<VModule> = vmodule.iter().flat_map(|l| l.0.clone()).collect();
    if !vmodule.is_empty() && *logging_format != LogFormat::Text {
        return Err(ConfigError::VModuleNeedsText);
    }
    if !gates.logging_alpha_options {
        let alpha = [
            ("--log-text-split-stream", *log_text_split_stream),
            (
                "--log-text-info-buffer-size",
                *log_text_info_buffer_size != 0,
            ),
            ("--log-json-split-stream", *log_json_split_stream),
            (
                "--log-json-info-buffer-size",
                *log_json_info_buffer_size != 0,
            ),
        ];
        if let Some((flag, _)) = alpha.into_iter().find(|(_, set)| *set) {
            return Err(ConfigError::NeedsLoggingAlphaOptions(flag));
        }
    }
    let (split_stream, info_buffer_size) = match logging_format {
        LogFormat::Text => (*log_text_split_stream, *log_text_info_buffer_size),
        LogFormat::Json => (*log_json_split_stream, *log_json_info_buffer_size),
    };
    Ok(LoggingConfig {
        verbosity: *v,
        vmodule,
        format: *logging_format,
        flush_frequency: *log_flush_frequency,
        split_stream,
        info_buffer_size,
    })
}

/// client-go's rules (`NewLeaderElector`): all positive, lease > renew
/// deadline > 1.2 × retry period.
fn check_leader_election_timing(
    lease: Duration,
    renew: Duration,
    retry: Duration,
) -> Result<(), ConfigError> {
    for (flag, d) in [
        ("--leader-election-lease-duration", lease),
        ("--leader-election-renew-deadline", renew),
        ("--leader-election-retry-period", retry),
    ] {
        if d.is_zero() {
            return Err(ConfigError::NotPositive { flag });
        }
    }
    if lease <= renew {
        return Err(ConfigError::LeaseNotLongerThanRenew {
            lease: format_go_duration(lease),
            renew: format_go_duration(renew),
        });
    }
    if renew.as_secs_f64() <= LEADER_ELECTION_JITTER_FACTOR * retry.as_secs_f64() {
        return Err(ConfigError::RenewNotLongerThanRetry {
            renew: format_go_duration(renew),
            retry: format_go_duration(retry),
        });
    }
    Ok(())
}

/// QPS/burst as client-go applies them (`rest.RESTClientFor`,
/// `kubernetes.NewForConfig`).
fn rate_limit(
    qps: f64,
    burst: i64,
    qps_flag: &'static str,
    burst_flag: &'static str,
) -> Result<RateLimit, ConfigError> {
    const DEFAULT_QPS: f32 = 5.0;
    const DEFAULT_BURST: u32 = 10;
    if qps.is_nan() {
        return Err(ConfigError::QpsNotANumber(qps_flag));
    }
    if qps < 0.0 {
        return Ok(RateLimit::Unlimited);
    }
    let burst_error = ConfigError::Burst {
        qps: qps_flag,
        burst: burst_flag,
    };
    let (qps, burst) = if qps == 0.0 {
        // client-go substitutes its defaults for zeros.
        let burst = match burst {
            0 => DEFAULT_BURST,
            b => u32::try_from(b).map_err(|_| burst_error)?,
        };
        (DEFAULT_QPS, burst)
    } else {
        let burst = u32::try_from(burst)
            .ok()
            .filter(|b| *b > 0)
            .ok_or(burst_error)?;
        (qps as f32, burst)
    };
    Ok(RateLimit::TokenBucket { qps, burst })
}

/// `--volume-name-uuid-length`: `None` for `-1` (the whole UID), else the
/// number of UID characters, 1 to 32.
pub fn volume_name_uuid_length_of(n: i64) -> Result<Option<usize>, ConfigError> {
    match n {
        -1 => Ok(None),
        1..=MAX_VOLUME_NAME_UUID_LENGTH => Ok(Some(n as usize)),
        n => Err(ConfigError::VolumeNameUuidLength(n)),
    }
}

/// Upstream hands the address to gRPC, which (for the addresses a sidecar
/// uses) means a unix socket: `/path`, `unix:///path` or `unix:path`.
pub fn csi_socket_path(address: &str) -> Result<PathBuf, ConfigError> {
    csi_proto::parse_csi_address(address).map_err(|_| ConfigError::CsiAddress(address.to_string()))
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        std::iter::once("csi-provisioner")
            .chain(args.iter().copied())
            .map(String::from)
            .collect()
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        parse_from(argv(args))
    }

    fn parsed(args: &[&str]) -> Args {
        parse(args).unwrap_or_else(|e| panic!("{args:?}: {}", error_line(&e)))
    }

    fn env(vars: &[(&str, &str)]) -> Env {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_lookup(|name| vars.get(name).cloned())
    }

    /// Validation as it will be once every feature is built, so upstream's
    /// own checks stay testable behind the not-supported-yet table.
    fn config_all_supported(args: &[&str], env: &Env) -> Result<Config, ConfigError> {
        Config::validate(&parsed(args), env, &[])
    }

    fn config(args: &[&str], env: &Env) -> Result<Config, ConfigError> {
        Config::from_args(&parsed(args), env)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

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
        assert!(feature_gates.is_empty());
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
            },
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
            let got = normalize_args(argv(input));
            assert_eq!(
                got[1..],
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>()[..],
                "{input:?}"
            );
            assert_eq!(got[0], "csi-provisioner");
        }
        // The program name is never rewritten.
        assert_eq!(normalize_args(["-weird".to_string()]), vec!["-weird"]);
    }

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
            let got = config_all_supported(args, &env);
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
        let c = config_all_supported(
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
        let c = config_all_supported(
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
        let c = config_all_supported(
            &["--enable-capacity", "--capacity-ownerref-level=-1"],
            &env(&[("NAMESPACE", "ns")]),
        )
        .unwrap();
        assert_eq!(c.capacity.unwrap().owner, None);
    }

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
}
