//! The table a run prints: workload, faults injected by kind, restarts, leader changes,
//! backend calls, and each invariant with its count of violations, ending with
//! `violations: <total>`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use csi_test_driver::ledger::ContentSource;

use crate::check::{InvariantResult, NodeTally, Snapshot};
use crate::intent::IntentCounts;
use crate::world::{LeaderTrack, Sidecar, World};

/// Violations listed per invariant before "... and N more".
const SHOWN: usize = 8;

/// Which mode a sidecar ran in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No intent policies; the sidecar writes the intent itself.
    Default,
    /// Policy mode: the shipped intent policies installed, our sidecar on `--admission-intent`.
    Policies,
    /// Policy mode was asked for, but this is upstream's sidecar: it runs without them (they
    /// name our finalizer, which it would never remove).
    UpstreamWithoutPolicies,
}

impl Mode {
    /// The mode `sidecar` runs in when policy mode is (or is not) asked for.
    pub fn of(policies: bool, sidecar: Sidecar) -> Mode {
        match (policies, sidecar) {
            (false, _) => Mode::Default,
            (true, Sidecar::Ours) => Mode::Policies,
            (true, Sidecar::Upstream) => Mode::UpstreamWithoutPolicies,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Mode::Default => "default",
            Mode::Policies => "policies (intent policies installed, --admission-intent)",
            Mode::UpstreamWithoutPolicies => "default (policies are never installed for upstream)",
        }
    }
}

pub struct Report {
    pub title: String,
    pub seed: u64,
    pub sidecar: Sidecar,
    pub mode: Mode,
    pub replicas: usize,
    pub workload: Vec<(&'static str, u64)>,
    pub timing: Vec<(&'static str, Duration)>,
    /// Injector (or scenario) actions by kind.
    pub actions: BTreeMap<&'static str, u64>,
    /// What the proxy actually injected, by counter.
    pub proxy: BTreeMap<String, u64>,
    pub sidecar_kills: u64,
    pub sidecar_exits: u64,
    pub sidecar_starts: u64,
    pub leader_changes: u64,
    pub driver_crashes: u64,
    pub snapshotter_starts: u64,
    pub backend: Vec<(&'static str, u64)>,
    /// A node deployment: what each node's driver did.
    pub nodes: Vec<NodeTally>,
    pub invariants: Vec<InvariantResult>,
    pub dir: Option<PathBuf>,
}

impl Report {
    pub fn new(title: &str, seed: u64) -> Report {
        Report {
            title: title.to_string(),
            seed,
            sidecar: Sidecar::Ours,
            mode: Mode::Default,
            replicas: 0,
            workload: Vec::new(),
            timing: Vec::new(),
            actions: BTreeMap::new(),
            proxy: BTreeMap::new(),
            sidecar_kills: 0,
            sidecar_exits: 0,
            sidecar_starts: 0,
            leader_changes: 0,
            driver_crashes: 0,
            snapshotter_starts: 0,
            backend: Vec::new(),
            nodes: Vec::new(),
            invariants: Vec::new(),
            dir: None,
        }
    }

    /// Counters of the world's processes, the proxy, the Lease and the ledger.
    pub fn fill_from(&mut self, w: &World, leader: &LeaderTrack, snap: &Snapshot) {
        self.proxy = w.proxy.stats().injected;
        for r in &w.replicas {
            self.sidecar_kills += r.stats.kills.load(Ordering::Relaxed);
            self.sidecar_exits += r.stats.exits.load(Ordering::Relaxed);
            self.sidecar_starts += r.stats.starts.load(Ordering::Relaxed);
        }
        self.leader_changes = leader.changes.load(Ordering::Relaxed);
        self.driver_crashes = w.drivers().map(|d| d.crashes).sum();
        self.snapshotter_starts = w.snapshotter.stats.starts.load(Ordering::Relaxed);
        self.nodes = snap.per_node.clone();
        let ledger = &snap.ledger;
        let count =
            |method: &str, f: &dyn Fn(&csi_test_driver::ledger::OperationRecord) -> bool| {
                ledger.operations_of(method).filter(|op| f(op)).count() as u64
            };
        self.backend = vec![
            ("CreateVolume calls", ledger.call_count("CreateVolume")),
            ("volumes created", count("CreateVolume", &|op| op.created)),
            ("DeleteVolume calls", ledger.call_count("DeleteVolume")),
            ("volumes deleted", count("DeleteVolume", &|op| op.deleted)),
            ("volumes held at check time", ledger.volumes.len() as u64),
            (
                "  restored from a snapshot (created)",
                count("CreateVolume", &|op| {
                    op.created && matches!(op.content_source, Some(ContentSource::Snapshot { .. }))
                }),
            ),
            (
                "  cloned from a volume (created)",
                count("CreateVolume", &|op| {
                    op.created && matches!(op.content_source, Some(ContentSource::Volume { .. }))
                }),
            ),
            ("CreateSnapshot calls", ledger.call_count("CreateSnapshot")),
            (
                "snapshots created",
                count("CreateSnapshot", &|op| op.created),
            ),
            ("DeleteSnapshot calls", ledger.call_count("DeleteSnapshot")),
            (
                "snapshots deleted",
                count("DeleteSnapshot", &|op| op.deleted),
            ),
            (
                "snapshots held at check time",
                ledger.snapshots.len() as u64,
            ),
        ];
    }

    /// Where the claims' intent came from (workload rows; all zero with upstream's sidecar,
    /// whose claims never hold our intent).
    pub fn add_intents(&mut self, c: &IntentCounts) {
        self.workload.extend([
            ("claims given the intent by admission (policy)", c.admission),
            ("claims given the intent by the sidecar's write", c.sidecar),
            ("claims given the intent by another writer", c.other),
            (
                "claims seen bound still holding the intent",
                c.bound_holding,
            ),
            (
                "  of them still holding it at check time",
                c.bound_holding_at_check,
            ),
        ]);
    }

    pub fn violations(&self) -> usize {
        self.invariants.iter().map(|r| r.violations.len()).sum()
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let w = 52;
        let _ = writeln!(
            out,
            "chaos run: {} | sidecar={} replicas={} seed={}",
            self.title,
            self.sidecar.label(),
            self.replicas,
            self.seed
        );
        let _ = writeln!(out, "mode: {}", self.mode.label());
        let section = |out: &mut String, title: &str, rows: Vec<(String, String)>| {
            if rows.is_empty() {
                return;
            }
            let _ = writeln!(out, "{title}");
            for (k, v) in rows {
                let _ = writeln!(out, "  {k:<w$} {v:>8}");
            }
        };
        section(
            &mut out,
            "workload",
            self.workload
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        section(
            &mut out,
            "faults injected (runner actions)",
            self.actions
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        section(
            &mut out,
            "faults injected (proxy, per request/event/object)",
            self.proxy
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect(),
        );
        section(
            &mut out,
            "processes",
            vec![
                ("sidecar SIGKILLs".into(), self.sidecar_kills.to_string()),
                (
                    "sidecar exits on its own (restarted)".into(),
                    self.sidecar_exits.to_string(),
                ),
                (
                    "sidecar restarts".into(),
                    self.sidecar_starts
                        .saturating_sub(self.replicas as u64)
                        .to_string(),
                ),
                ("leader changes".into(), self.leader_changes.to_string()),
                ("driver crashes".into(), self.driver_crashes.to_string()),
                (
                    "csi-snapshotter restarts".into(),
                    self.snapshotter_starts.saturating_sub(1).to_string(),
                ),
            ],
        );
        section(
            &mut out,
            "backend (driver ledger)",
            self.backend
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        section(
            &mut out,
            "nodes (volumes created / deleted / CreateVolume answered RESOURCE_EXHAUSTED)",
            self.nodes
                .iter()
                .map(|n| {
                    (
                        n.node.clone(),
                        format!(
                            "{} / {} / {}",
                            n.volumes_created, n.volumes_deleted, n.no_room
                        ),
                    )
                })
                .collect(),
        );
        section(
            &mut out,
            "time",
            self.timing
                .iter()
                .map(|(k, v)| (k.to_string(), format!("{:.0}s", v.as_secs_f64())))
                .collect(),
        );
        let _ = writeln!(out, "invariants{:>w$}", "violations", w = w + 1);
        for r in &self.invariants {
            let _ = writeln!(out, "  {:<w$} {:>8}", r.name, r.violations.len());
            for v in r.violations.iter().take(SHOWN) {
                let _ = writeln!(out, "      - {v}");
            }
            if r.violations.len() > SHOWN {
                let _ = writeln!(out, "      ... and {} more", r.violations.len() - SHOWN);
            }
        }
        if let Some(dir) = &self.dir {
            let _ = writeln!(out, "logs: {}", dir.display());
        }
        let _ = writeln!(out, "violations: {}", self.violations());
        out
    }
}
