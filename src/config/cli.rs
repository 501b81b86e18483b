//! The command line as clap sees it: the top-level `Args` with its flag
//! groups flattened in, the help around them (headings, description,
//! environment, exit status), Go's flag semantics applied to the command,
//! and parsing with the one-line error a usage error prints.

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};

use super::gates::{GateSettings, parse_feature_gates};
use super::go_flags::normalize_args;
use super::values::parse_go_bool;
use super::{
    CapacityArgs, ClientArgs, CsiArgs, HttpArgs, LeaderElectionArgs, LoggingArgs, MetadataArgs,
    NodeDeploymentArgs, ProvisioningArgs,
};

/// Help headings, in the order `--help` shows them: flags grouped by what
/// they configure, as upstream's README groups them.
pub(super) mod heading {
    pub const CSI: &str = "CSI driver connection";
    pub const CLIENT: &str = "Kubernetes API client";
    pub const LEADER_ELECTION: &str = "Leader election";
    pub const PROVISIONING: &str = "Provisioning";
    pub const DATA_SOURCES: &str = "Data sources (clones and snapshots)";
    pub const METADATA: &str = "Claim and namespace metadata";
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
    pub metadata: MetadataArgs,
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

/// The clap command with Go's flag semantics applied to it:
/// - every boolean is `--flag` or `--flag=<bool>` (Go's `strconv.ParseBool`
///   spellings); `--flag false` sets the flag and leaves a stray `false`,
///   which is an error, exactly as with Go's flag packages;
/// - every other flag takes the next argument as its value even when it
///   starts with `-` (`--volume-name-uuid-length -1`), as pflag does.
///
/// Help shows a default only where it says something, as Go's flag package
/// does: not `false`, not an empty string.
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
        arg.hide_default_value(says_nothing)
    })
}

/// Parses argv (program name first) the way upstream's flag packages do.
///
/// On error, the caller decides with clap's own classification:
/// `error.kind()` is `DisplayHelp` for `-h`/`--help` (print the whole
/// message, `exit_code()` is 0); anything else is a usage error: print
/// [`error_line`] and exit with `error.exit_code()` (2).
pub fn parse_from(argv: impl IntoIterator<Item = String>) -> Result<Args, clap::Error> {
    let command = command();
    let argv = normalize_args(&command, argv);
    let matches = command.try_get_matches_from(argv)?;
    Args::from_arg_matches(&matches)
}

/// One line saying why parsing failed, e.g.
/// `unexpected argument '--no-such-flag' found`.
pub fn error_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first = rendered.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}
