//! The command line of `csi-provisioner audit`. Flags the sidecar also has
//! keep the sidecar's names, defaults and value syntax (`--csi-address`,
//! `--kubeconfig`, `--timeout`, `--volume-name-prefix`, ...), so an audit can be
//! run with the sidecar's own arguments; the values go through the sidecar's
//! parsers and checks.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::config::{ConfigError, Env, csi_socket_path, volume_name_uuid_length_of};
use crate::duration::parse_go_duration;

const ABOUT: &str = "Compare a CSI driver's volumes with its PersistentVolumes, and find claims \
                     stuck holding the provisioning intent. Read-only.";

const LONG_ABOUT: &str = "\
Compare a CSI driver's volumes with its PersistentVolumes, and find claims stuck holding the
provisioning intent. Read-only: it calls the driver's Identity service, ControllerGetCapabilities
and ListVolumes, and lists PersistentVolumes and PersistentVolumeClaims; it never creates, changes
or deletes anything.

Findings:
  - a volume the driver lists that no PersistentVolume of the driver points to, with the claim UID
    its ID carries (when the ID embeds the CreateVolume name, <prefix>-<uid>) and that claim's state;
  - a PersistentVolume of the driver whose volume the driver does not list;
  - a claim of the driver holding the provisioning intent (finalizer
    csi-provisioner.rs/provisioning-intent) for longer than --intent-older-than.
Without the LIST_VOLUMES capability only the claims are checked (the report says so).";

const AFTER_LONG_HELP: &str = "\
Environment:
  KUBECONFIG       kubeconfig to use; takes precedence over --kubeconfig

Exit status: 0 no findings; 3 findings (with --output=prometheus, 0: the findings are in the
series, and a CronJob's Job would be retried as failed); 1 the audit could not be made (driver or
API server unreachable, a call refused, the output file not written); 2 a flag is wrong.";

/// How the report is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Sections of aligned columns, for a person.
    Table,
    /// One JSON document, for a program.
    Json,
    /// Prometheus text: a gauge per kind of finding, for node-exporter's
    /// textfile collector or a push (findings exit 0: they are in the series).
    Prometheus,
}

// `//` rather than `///`: clap would print a `///` comment as the description.
// The fields' `///` comments are the flags' help.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "csi-provisioner audit",
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_long_help = AFTER_LONG_HELP,
    args_override_self = true
)]
pub struct AuditArgs {
    /// The driver's unix socket: /path, unix:///path or unix:path.
    #[arg(long, default_value = "/run/csi/socket", value_name = "PATH")]
    pub csi_address: String,

    /// Time limit of each call to the driver, and of connecting to it.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub timeout: Duration,

    /// Kubeconfig file; without one, the pod's service account is used
    /// (in-cluster config). KUBECONFIG, when set, takes precedence.
    #[arg(
        long,
        default_value = "",
        hide_default_value = true,
        value_name = "PATH"
    )]
    pub kubeconfig: String,

    /// API server URL, instead of the kubeconfig's.
    #[arg(
        long,
        default_value = "",
        hide_default_value = true,
        value_name = "URL"
    )]
    pub master: String,

    /// The sidecar's --volume-name-prefix: how volume names carrying a claim UID are recognised.
    #[arg(long, default_value = "pvc", value_name = "PREFIX")]
    pub volume_name_prefix: String,

    /// The sidecar's --volume-name-uuid-length (-1: the whole UID).
    #[arg(long, default_value_t = -1, value_name = "N", allow_hyphen_values = true)]
    pub volume_name_uuid_length: i64,

    /// Report a claim that has held the provisioning intent for longer than this.
    #[arg(long, default_value = "10m", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub intent_older_than: Duration,

    /// When the first look finds a volume or PersistentVolume without its other half, look
    /// again after this long and report only what both looks found (a volume created a moment
    /// ago has no PersistentVolume yet); 0s: one look.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub recheck_after: Duration,

    /// table, json or prometheus.
    #[arg(long, value_enum, default_value = "table", value_name = "FORMAT")]
    pub output: OutputFormat,

    /// Write the report to this file instead of stdout, replacing it in one
    /// rename (a textfile collector never reads half a file); a failed audit
    /// with --output=prometheus writes its failure series there too.
    #[arg(
        long,
        default_value = "",
        hide_default_value = true,
        value_name = "PATH"
    )]
    pub output_file: String,
}

/// The audit's settings, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct AuditConfig {
    pub csi_socket: PathBuf,
    pub timeout: Duration,
    /// `KUBECONFIG`, else `--kubeconfig`; `None`: in-cluster config.
    pub kubeconfig: Option<PathBuf>,
    pub master: Option<String>,
    pub volume_name_prefix: String,
    /// As [`crate::provision::volume_name`] takes it: `None` for the whole UID.
    pub volume_name_uuid_length: Option<usize>,
    pub intent_older_than: Duration,
    pub recheck_after: Duration,
    pub output: OutputFormat,
    /// `None`: stdout.
    pub output_file: Option<PathBuf>,
}

/// Parses `argv` (the first item is the program's name as it should appear
/// in messages), with Go's single-dash long flags accepted as the sidecar
/// accepts them (`-csi-address=/csi/csi.sock`). Errors are clap's:
/// `DisplayHelp` for `--help`, a usage error otherwise.
pub fn parse_from(argv: impl IntoIterator<Item = String>) -> Result<AuditArgs, clap::Error> {
    AuditArgs::try_parse_from(crate::config::normalize_args(
        &<AuditArgs as clap::CommandFactory>::command(),
        argv,
    ))
}

impl AuditConfig {
    pub fn from_args(args: &AuditArgs, env: &Env) -> Result<AuditConfig, ConfigError> {
        let AuditArgs {
            csi_address,
            timeout,
            kubeconfig,
            master,
            volume_name_prefix,
            volume_name_uuid_length,
            intent_older_than,
            recheck_after,
            output,
            output_file,
        } = args;
        if timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        if volume_name_prefix.is_empty() {
            return Err(ConfigError::EmptyVolumeNamePrefix);
        }
        let volume_name_uuid_length = volume_name_uuid_length_of(*volume_name_uuid_length)?;
        Ok(AuditConfig {
            csi_socket: csi_socket_path(csi_address)?,
            timeout: *timeout,
            kubeconfig: env
                .kubeconfig
                .clone()
                .or_else(|| Some(kubeconfig.clone()).filter(|k| !k.is_empty()))
                .map(PathBuf::from),
            master: Some(master.clone()).filter(|m| !m.is_empty()),
            volume_name_prefix: volume_name_prefix.clone(),
            volume_name_uuid_length,
            intent_older_than: *intent_older_than,
            recheck_after: *recheck_after,
            output: *output,
            output_file: Some(output_file)
                .filter(|f| !f.is_empty())
                .map(PathBuf::from),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str], env: &Env) -> Result<AuditConfig, String> {
        let argv = std::iter::once("audit")
            .chain(args.iter().copied())
            .map(String::from);
        let args = parse_from(argv).map_err(|e| crate::config::error_line(&e))?;
        AuditConfig::from_args(&args, env).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_the_sidecars() {
        let c = config(&[], &Env::default()).unwrap();
        assert_eq!(c.csi_socket, PathBuf::from("/run/csi/socket"));
        assert_eq!(c.timeout, Duration::from_secs(10));
        assert_eq!(c.kubeconfig, None);
        assert_eq!(c.volume_name_prefix, "pvc");
        assert_eq!(c.volume_name_uuid_length, None);
        assert_eq!(c.intent_older_than, Duration::from_secs(600));
        assert_eq!(c.recheck_after, Duration::from_secs(5));
        assert_eq!(c.output, OutputFormat::Table);
        assert_eq!(c.output_file, None);
        let c = config(
            &["--output=prometheus", "--output-file=/textfile/audit.prom"],
            &Env::default(),
        )
        .unwrap();
        assert_eq!(c.output, OutputFormat::Prometheus);
        assert_eq!(c.output_file, Some(PathBuf::from("/textfile/audit.prom")));
    }

    #[test]
    fn flags_take_the_sidecars_syntax_and_kubeconfig_the_environment() {
        let env = Env {
            kubeconfig: Some("/env/kubeconfig".into()),
            ..Env::default()
        };
        let c = config(
            &[
                "--csi-address=unix:///csi/csi.sock",
                "--kubeconfig",
                "/flag/kubeconfig",
                "--intent-older-than=1h30m",
                "--volume-name-uuid-length",
                "16",
                "--output=json",
                "--recheck-after=0s",
            ],
            &env,
        )
        .unwrap();
        assert_eq!(c.csi_socket, PathBuf::from("/csi/csi.sock"));
        assert_eq!(c.kubeconfig, Some(PathBuf::from("/env/kubeconfig")));
        assert_eq!(c.intent_older_than, Duration::from_secs(5400));
        assert_eq!(c.volume_name_uuid_length, Some(16));
        assert_eq!(c.output, OutputFormat::Json);
        assert_eq!(c.recheck_after, Duration::ZERO);
        let c = config(&["--kubeconfig=/flag/kubeconfig"], &Env::default()).unwrap();
        assert_eq!(c.kubeconfig, Some(PathBuf::from("/flag/kubeconfig")));
        // Go's spelling, as the sidecar takes it.
        let c = config(
            &[
                "-csi-address=/x.sock",
                "-timeout",
                "3s",
                "-volume-name-uuid-length",
                "-1",
            ],
            &Env::default(),
        )
        .unwrap();
        assert_eq!(c.csi_socket, PathBuf::from("/x.sock"));
        assert_eq!(c.timeout, Duration::from_secs(3));
        assert_eq!(c.volume_name_uuid_length, None);
    }

    #[test]
    fn wrong_values_are_refused_with_the_sidecars_reasons() {
        let table: [(&[&str], &str); 6] = [
            (&["--timeout=10"], "invalid value"),
            (&["--output=yaml"], "invalid value"),
            (&["--timeout=0s"], "--timeout must be greater than zero"),
            (
                &["--volume-name-prefix="],
                "--volume-name-prefix must not be empty",
            ),
            (
                &["--volume-name-uuid-length=40"],
                "--volume-name-uuid-length",
            ),
            (&["--csi-address=tcp://x:1"], "is not a unix socket"),
        ];
        for (args, want) in table {
            let err = config(args, &Env::default()).unwrap_err();
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }
}
