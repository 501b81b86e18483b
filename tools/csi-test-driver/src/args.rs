//! Command-line flags of the `csi-test-driver` binary.

use std::path::PathBuf;

use clap::Parser;
use csi_proto::v1::controller_service_capability::rpc::Type as ControllerCapability;

/// Controller capabilities advertised when `--capabilities` is not given.
pub const DEFAULT_CAPABILITIES: &[ControllerCapability] = &[
    ControllerCapability::CreateDeleteVolume,
    ControllerCapability::ListVolumes,
    ControllerCapability::GetCapacity,
];

/// Controller capabilities this driver actually implements; advertising anything else would
/// make callers (and csi-sanity) exercise RPCs that answer UNIMPLEMENTED.
pub const SUPPORTED_CAPABILITIES: &[ControllerCapability] = &[
    ControllerCapability::CreateDeleteVolume,
    ControllerCapability::PublishUnpublishVolume,
    ControllerCapability::ListVolumes,
    ControllerCapability::GetCapacity,
    ControllerCapability::CloneVolume,
    ControllerCapability::PublishReadonly,
    ControllerCapability::ListVolumesPublishedNodes,
    ControllerCapability::GetVolume,
    ControllerCapability::SingleNodeMultiWriter,
    ControllerCapability::ModifyVolume,
    ControllerCapability::CreateDeleteSnapshot,
    ControllerCapability::ListSnapshots,
];

/// A fault-injecting CSI driver for tests, with a durable ledger of every volume it holds.
#[derive(Debug, Clone, Parser)]
#[command(name = "csi-test-driver", version)]
pub struct Args {
    /// CSI socket to serve on: `unix:///abs/path`, `unix:/path` or a plain path.
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: String,

    /// Unix socket for the JSON-lines control protocol (faults, ledger, crash).
    #[arg(long)]
    pub control: PathBuf,

    /// Directory holding `ledger.json`; created if missing. Reuse it to keep volumes across a
    /// restart or crash.
    #[arg(long)]
    pub state_dir: PathBuf,

    /// Name returned by GetPluginInfo.
    #[arg(long, default_value = "test.csi.example.com")]
    pub drivername: String,

    /// Node id returned by NodeGetInfo.
    #[arg(long, default_value = "node-1")]
    pub node_id: String,

    /// Total capacity in bytes; GetCapacity reports what existing volumes leave of it and
    /// CreateVolume fails with RESOURCE_EXHAUSTED beyond it.
    #[arg(long, default_value_t = 1 << 50)]
    pub capacity_bytes: i64,

    /// Topology segment key. With --topology-value, the driver advertises
    /// VOLUME_ACCESSIBILITY_CONSTRAINTS and puts this segment on volumes and on NodeGetInfo.
    #[arg(long, requires = "topology_value")]
    pub topology_key: Option<String>,

    /// Topology segment value (see --topology-key).
    #[arg(long, requires = "topology_key")]
    pub topology_value: Option<String>,

    /// Controller capabilities, comma separated (e.g. CREATE_DELETE_VOLUME,LIST_VOLUMES). Names
    /// all prefixed with `+` are added to the defaults instead (e.g. +CLONE_VOLUME).
    /// Default: CREATE_DELETE_VOLUME,LIST_VOLUMES,GET_CAPACITY.
    #[arg(long, value_delimiter = ',')]
    pub capabilities: Vec<String>,

    /// The mutable parameter keys this driver understands (what a VolumeAttributesClass may
    /// set, with MODIFY_VOLUME); any other key in CreateVolume or ControllerModifyVolume is
    /// INVALID_ARGUMENT, as the spec asks.
    #[arg(long, value_delimiter = ',', default_value = "iops,throughput,tier")]
    pub mutable_parameters: Vec<String>,

    /// Vendor version returned by GetPluginInfo.
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    pub vendor_version: String,

    /// Let calls for the same volume (CreateVolume by name, DeleteVolume by id) run
    /// concurrently. By default a second call while one is in progress gets ABORTED, as
    /// production drivers with per-volume locks answer.
    #[arg(long)]
    pub allow_concurrent_calls_per_volume: bool,

    /// Make volume IDs embed the CreateVolume name (`vol-000001-<name>`), as the IDs of many
    /// drivers do, instead of `vol-000001-<random>`.
    #[arg(long)]
    pub volume_id_with_name: bool,

    /// Seed of the RNG used by probabilistic faults, so a chaos run can be replayed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl Args {
    /// The controller capabilities to advertise, validated against what the driver implements.
    pub fn controller_capabilities(&self) -> Result<Vec<ControllerCapability>, String> {
        parse_capabilities(&self.capabilities)
    }

    /// The topology segment, when configured.
    pub fn topology(&self) -> Option<(String, String)> {
        self.topology_key.clone().zip(self.topology_value.clone())
    }
}

fn parse_capabilities(items: &[String]) -> Result<Vec<ControllerCapability>, String> {
    let items: Vec<&str> = items
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    let additive = !items.is_empty() && items.iter().all(|s| s.starts_with('+'));
    if !additive && items.iter().any(|s| s.starts_with('+')) {
        return Err("--capabilities: either list every capability or prefix all with '+'".into());
    }
    let mut capabilities = if additive || items.is_empty() {
        DEFAULT_CAPABILITIES.to_vec()
    } else {
        Vec::new()
    };
    for item in items {
        let name = item.trim_start_matches('+').to_ascii_uppercase();
        let capability = ControllerCapability::from_str_name(&name)
            .filter(|c| SUPPORTED_CAPABILITIES.contains(c))
            .ok_or_else(|| {
                format!(
                    "--capabilities: {name:?} is not supported; supported: {}",
                    SUPPORTED_CAPABILITIES
                        .iter()
                        .map(|c| c.as_str_name())
                        .collect::<Vec<_>>()
                        .join(",")
                )
            })?;
        if !capabilities.contains(&capability) {
            capabilities.push(capability);
        }
    }
    Ok(capabilities)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(items: &[&str]) -> Result<Vec<ControllerCapability>, String> {
        parse_capabilities(&items.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn capabilities_default_replace_or_add() {
        assert_eq!(parse(&[]).unwrap(), DEFAULT_CAPABILITIES);
        assert_eq!(
            parse(&["CREATE_DELETE_VOLUME"]).unwrap(),
            vec![ControllerCapability::CreateDeleteVolume]
        );
        let added = parse(&["+CLONE_VOLUME", "+publish_unpublish_volume"]).unwrap();
        assert_eq!(&added[..3], DEFAULT_CAPABILITIES);
        assert_eq!(
            &added[3..],
            &[
                ControllerCapability::CloneVolume,
                ControllerCapability::PublishUnpublishVolume
            ]
        );
        assert_eq!(
            parse(&["+CREATE_DELETE_SNAPSHOT"]).unwrap()[3..],
            [ControllerCapability::CreateDeleteSnapshot]
        );
        assert!(parse(&["EXPAND_VOLUME"]).is_err());
        assert!(parse(&["LIST_VOLUMES", "+CLONE_VOLUME"]).is_err());
        assert!(parse(&["NOPE"]).is_err());
    }

    #[test]
    fn flags_parse() {
        let args = Args::try_parse_from([
            "csi-test-driver",
            "--endpoint",
            "unix:///tmp/csi.sock",
            "--control",
            "/tmp/control.sock",
            "--state-dir",
            "/tmp/state",
            "--topology-key",
            "zone",
            "--topology-value",
            "z1",
            "--capabilities",
            "CREATE_DELETE_VOLUME,GET_CAPACITY",
        ])
        .unwrap();
        assert_eq!(args.topology(), Some(("zone".into(), "z1".into())));
        assert_eq!(args.drivername, "test.csi.example.com");
        assert_eq!(args.controller_capabilities().unwrap().len(), 2);
        assert!(
            Args::try_parse_from([
                "csi-test-driver",
                "--endpoint",
                "/tmp/a",
                "--control",
                "/tmp/b",
                "--state-dir",
                "/tmp/c",
                "--topology-key",
                "zone",
            ])
            .is_err()
        );
    }
}
