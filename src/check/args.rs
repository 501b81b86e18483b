//! The command line of `csi-provisioner check`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::config::parse_byte_quantity;
use crate::csi::pb::volume_capability::access_mode::Mode as AccessMode;
use crate::duration::parse_go_duration;

/// The parameter added to the second `CreateVolume` of the same name when
/// `--other-parameter` is not given.
pub const DEFAULT_OTHER_PARAMETER: (&str, &str) = ("csi-provisioner-check/variant", "other");

const ABOUT: &str = "Checks a CSI driver against what a provisioner relies on.";

const LONG_ABOUT: &str = "Checks a CSI driver against what a provisioner relies on: CreateVolume \
is idempotent by name and answers ALREADY_EXISTS to the same name with other parameters, \
DeleteVolume of an unknown or already deleted volume succeeds, capacities are as the CSI spec \
says, the advertised capabilities agree with the calls that work, and every call is answered \
within --timeout.

It creates only volumes named check-<random> and deletes every one it created before it exits, \
also when interrupted (SIGINT, SIGTERM; a second signal stops the cleanup and lists what may be \
left). Volumes it did not create are never touched.";

const AFTER_LONG_HELP: &str = "\
Exit status: 0 when every check passed (skipped checks allowed); 1 when a check failed, the \
driver could not be reached, the run was interrupted or a volume it created may be left; 2 when \
the command line is wrong.";

#[derive(Clone, Debug, Parser)]
#[command(
    name = "csi-provisioner check",
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_long_help = AFTER_LONG_HELP
)]
pub struct CheckArgs {
    /// The driver's unix socket: /path, unix:///path or unix:path.
    #[arg(long, value_name = "ADDRESS")]
    pub csi_address: String,

    /// Time limit of each call to the driver; a call that takes longer fails the
    /// `timeouts` check.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub timeout: Duration,

    /// Report format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,

    /// A StorageClass parameter sent with every CreateVolume (repeatable), for drivers that
    /// need some.
    #[arg(long = "parameter", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub parameters: Vec<(String, String)>,

    /// The parameters of the second CreateVolume of the same name, which must be answered
    /// ALREADY_EXISTS (repeatable; default: those of --parameter plus
    /// csi-provisioner-check/variant=other).
    #[arg(long = "other-parameter", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub other_parameters: Vec<(String, String)>,

    /// Size asked for each volume (required_bytes; the range check also asks for at most
    /// twice this).
    #[arg(long, default_value = "1Gi", value_parser = parse_byte_quantity,
          value_name = "QUANTITY")]
    pub capacity: u64,

    /// Access mode of the volumes, as the CSI spec names it.
    #[arg(long, default_value = "SINGLE_NODE_WRITER", value_parser = parse_access_mode,
          value_name = "MODE")]
    pub access_mode: AccessMode,

    /// How long to keep trying to delete the volumes this run created, after the checks or
    /// an interruption.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub cleanup_timeout: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// What the checks need, validated.
#[derive(Clone, Debug)]
pub struct Plan {
    pub socket: PathBuf,
    pub address: String,
    pub timeout: Duration,
    pub cleanup_timeout: Duration,
    pub output: Output,
    pub parameters: BTreeMap<String, String>,
    pub other_parameters: BTreeMap<String, String>,
    pub capacity: i64,
    pub access_mode: AccessMode,
}

impl CheckArgs {
    /// Validates the flags into a [`Plan`]; the error is one line.
    pub fn plan(self) -> Result<Plan, String> {
        let socket = csi_proto::parse_csi_address(&self.csi_address)
            .map_err(|e| format!("--csi-address: {e}"))?;
        if self.timeout.is_zero() {
            return Err("--timeout must be more than 0".into());
        }
        let capacity = i64::try_from(self.capacity)
            .ok()
            .filter(|c| *c > 0 && c.checked_mul(2).is_some())
            .ok_or_else(|| {
                format!(
                    "--capacity {} is out of range (more than 0 bytes)",
                    self.capacity
                )
            })?;
        let parameters: BTreeMap<String, String> = self.parameters.into_iter().collect();
        let other_parameters: BTreeMap<String, String> = if self.other_parameters.is_empty() {
            let mut other = parameters.clone();
            let (key, value) = DEFAULT_OTHER_PARAMETER;
            other.insert(key.into(), value.into());
            other
        } else {
            self.other_parameters.into_iter().collect()
        };
        if other_parameters == parameters {
            return Err("--other-parameter must differ from --parameter".into());
        }
        Ok(Plan {
            socket,
            address: self.csi_address,
            timeout: self.timeout,
            cleanup_timeout: self.cleanup_timeout,
            output: self.output,
            parameters,
            other_parameters,
            capacity,
            access_mode: self.access_mode,
        })
    }
}

fn parse_key_value(input: &str) -> Result<(String, String), String> {
    match input.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{input:?} is not KEY=VALUE")),
    }
}

fn parse_access_mode(input: &str) -> Result<AccessMode, String> {
    AccessMode::from_str_name(&input.to_ascii_uppercase())
        .filter(|m| *m != AccessMode::Unknown)
        .ok_or_else(|| {
            format!(
                "unknown access mode {input:?} (e.g. SINGLE_NODE_WRITER, MULTI_NODE_MULTI_WRITER)"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let argv = std::iter::once("check").chain(args.iter().copied());
        CheckArgs::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .plan()
    }

    #[test]
    fn defaults_and_other_parameters() {
        let p = plan(&[
            "--csi-address=unix:///run/csi.sock",
            "--parameter=type=fast",
        ])
        .unwrap();
        assert_eq!(p.socket, PathBuf::from("/run/csi.sock"));
        assert_eq!(p.timeout, Duration::from_secs(10));
        assert_eq!(p.capacity, 1 << 30);
        assert_eq!(p.access_mode, AccessMode::SingleNodeWriter);
        assert_eq!(p.parameters.get("type").map(String::as_str), Some("fast"));
        assert_eq!(p.other_parameters.len(), 2);
        assert_eq!(
            p.other_parameters
                .get(DEFAULT_OTHER_PARAMETER.0)
                .map(String::as_str),
            Some(DEFAULT_OTHER_PARAMETER.1)
        );

        let p = plan(&[
            "--csi-address=/s",
            "--other-parameter=type=slow",
            "--capacity=5Mi",
            "--access-mode=multi_node_multi_writer",
        ])
        .unwrap();
        assert_eq!(
            p.other_parameters.get("type").map(String::as_str),
            Some("slow")
        );
        assert_eq!(p.capacity, 5 << 20);
        assert_eq!(p.access_mode, AccessMode::MultiNodeMultiWriter);
    }

    #[test]
    fn bad_input_is_refused() {
        for args in [
            &["--csi-address=tcp://1.2.3.4:5"][..],
            &["--csi-address=/s", "--timeout=0"],
            &["--csi-address=/s", "--capacity=0"],
            &["--csi-address=/s", "--parameter=novalue"],
            &["--csi-address=/s", "--access-mode=FAST"],
            &[
                "--csi-address=/s",
                "--parameter=a=b",
                "--other-parameter=a=b",
            ],
            &["--csi-address=/s", "--output=yaml"],
            &[],
        ] {
            assert!(plan(args).is_err(), "{args:?}");
        }
    }
}
