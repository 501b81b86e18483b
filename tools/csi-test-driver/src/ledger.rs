//! The ledger: every volume the driver holds, how often each RPC was called, and every
//! `CreateVolume`/`DeleteVolume` outcome. It is the ground truth the chaos tests compare with the
//! Kubernetes API (no leaked volume, no duplicate per claim, no deleted volume still in use).
//!
//! It lives in `<state-dir>` as two files: `ledger.json`, a snapshot replaced atomically (temp
//! file + rename) when a driver starts, and `ledger.log`, a journal the running driver appends one
//! line to per change ([`Delta`]), so a call costs O(1) however many came before it (rewriting
//! the whole ledger per call made a run of N calls O(N²) and bounded every benchmark contender).
//! [`Ledger::load`] reads the snapshot and replays the journal; a line cut short by a `kill -9`
//! (no newline yet) is ignored, as that change was never acknowledged to a caller. Secret values
//! are never stored, only their keys.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::code::GrpcCode;

/// File name of the ledger snapshot inside the state directory.
pub const LEDGER_FILE: &str = "ledger.json";

/// File name of the journal of changes made since the snapshot, one JSON [`Delta`] a line.
pub const JOURNAL_FILE: &str = "ledger.log";

/// Where the ledger snapshot of a driver started with `--state-dir dir` lives.
pub fn ledger_path(state_dir: &Path) -> PathBuf {
    state_dir.join(LEDGER_FILE)
}

/// Where the journal of a driver started with `--state-dir dir` lives.
pub fn journal_path(state_dir: &Path) -> PathBuf {
    state_dir.join(JOURNAL_FILE)
}

/// Everything the driver remembers across restarts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// Volumes that currently exist, by volume id.
    pub volumes: BTreeMap<String, VolumeRecord>,
    /// Calls received per RPC method name (`CreateVolume`, `Probe`, ...), faulted ones included.
    pub calls: BTreeMap<String, u64>,
    /// Every `CreateVolume` and `DeleteVolume` call, in the order they finished.
    pub operations: Vec<OperationRecord>,
    /// Sequence number of the next volume id; never reused, so ids stay unique across restarts.
    pub next_volume_seq: u64,
    /// How many times a driver process has started on this ledger.
    pub starts: u64,
    /// Snapshots that currently exist, by snapshot id.
    #[serde(default)]
    pub snapshots: BTreeMap<String, SnapshotRecord>,
    /// Sequence number of the next snapshot id; never reused, like `next_volume_seq`.
    #[serde(default)]
    pub next_snapshot_seq: u64,
}

/// A volume held by the driver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub volume_id: String,
    /// The `CreateVolume` name (the caller's idempotency key; the PV name for the provisioner).
    pub name: String,
    pub capacity_bytes: i64,
    pub parameters: BTreeMap<String, String>,
    #[serde(default)]
    pub mutable_parameters: BTreeMap<String, String>,
    /// Keys of the secrets sent with the creating call; the values are never recorded.
    pub secret_keys: Vec<String>,
    pub volume_context: BTreeMap<String, String>,
    #[serde(default)]
    pub content_source: Option<ContentSource>,
    /// Topology segments the volume is accessible from (empty without `--topology-key`).
    #[serde(default)]
    pub accessible_topology: Vec<BTreeMap<String, String>>,
    /// Nodes the volume is ControllerPublished to, with the readonly flag used.
    #[serde(default)]
    pub published_nodes: BTreeMap<String, bool>,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: u64,
}

/// A snapshot held by the driver: a point-in-time copy of a volume, which outlives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub snapshot_id: String,
    /// The `CreateSnapshot` name (the caller's idempotency key).
    pub name: String,
    pub source_volume_id: String,
    /// The source volume's size when the snapshot was taken; a restore is at least this big.
    pub size_bytes: i64,
    pub parameters: BTreeMap<String, String>,
    /// Keys of the secrets sent with the creating call; the values are never recorded.
    pub secret_keys: Vec<String>,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: u64,
}

/// What a volume was pre-populated from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ContentSource {
    Snapshot { snapshot_id: String },
    Volume { volume_id: String },
}

/// One finished `CreateVolume`, `DeleteVolume`, `CreateSnapshot` or `DeleteSnapshot` call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationRecord {
    /// `CreateVolume`, `DeleteVolume`, `CreateSnapshot` or `DeleteSnapshot`.
    pub method: String,
    /// The requested name (the create calls only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The volume (or, for the snapshot calls, snapshot) created or found, or the id asked
    /// to delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    /// The code the caller received.
    pub code: GrpcCode,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// True when an injected fault shaped the answer: its `code`, or (`CreateReportsCapacity`)
    /// the capacity it reported.
    #[serde(default)]
    pub injected: bool,
    /// True when this call created a new volume (as opposed to finding an existing one or
    /// failing). A `create_then_deadline_exceeded` fault shows `created: true` with
    /// `code: DEADLINE_EXCEEDED`.
    #[serde(default)]
    pub created: bool,
    /// True when this call removed a volume (or snapshot) that existed.
    #[serde(default)]
    pub deleted: bool,
    /// Keys of the secrets the call carried (DeleteVolume; a created volume
    /// records its creating call's keys itself). Values are never recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_keys: Vec<String>,
    /// `CreateVolume` only: the content source the call asked for (a restore or a clone),
    /// whatever its outcome, so a checker can tell when a source was used even after the
    /// volume made from it is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_source: Option<ContentSource>,
    /// `CreateVolume` only: the request's accessibility requirements, each
    /// topology as its segments (empty when the request had none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requisite: Vec<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred: Vec<BTreeMap<String, String>>,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
}

impl OperationRecord {
    /// A successful call of `method` on `name` / `id`, finishing now; the caller fills in
    /// what happened.
    pub fn new(method: &str, name: Option<String>, id: Option<String>) -> Self {
        OperationRecord {
            method: method.to_string(),
            name,
            volume_id: id,
            code: GrpcCode::Ok,
            message: String::new(),
            injected: false,
            created: false,
            deleted: false,
            secret_keys: Vec::new(),
            content_source: None,
            requisite: Vec::new(),
            preferred: Vec::new(),
            at_ms: now_ms(),
        }
    }
}

impl Ledger {
    /// Reads the ledger in `state_dir` (snapshot plus journal); no files is an empty ledger.
    pub fn load(state_dir: &Path) -> io::Result<Ledger> {
        Ok(load_with_seq(state_dir)?.0)
    }

    /// Writes this ledger as the snapshot of `state_dir` and drops the journal, atomically for
    /// readers: they see the old or the new ledger, never a torn one, even after a `kill -9`.
    pub fn save(&self, state_dir: &Path) -> io::Result<()> {
        let seq = load_with_seq(state_dir).map(|(_, seq)| seq).unwrap_or(0);
        compact(self, seq, state_dir)
    }

    /// Applies one journal line.
    pub fn apply(&mut self, delta: Delta) {
        for id in delta.volumes_gone {
            self.volumes.remove(&id);
        }
        self.volumes.extend(delta.volumes);
        for id in delta.snapshots_gone {
            self.snapshots.remove(&id);
        }
        self.snapshots.extend(delta.snapshots);
        self.operations.extend(delta.operations);
        self.calls.extend(delta.calls);
        if let Some(seq) = delta.next_volume_seq {
            self.next_volume_seq = seq;
        }
        if let Some(seq) = delta.next_snapshot_seq {
            self.next_snapshot_seq = seq;
        }
        if let Some(starts) = delta.starts {
            self.starts = starts;
        }
    }

    /// The volume created under `name`, if it still exists.
    pub fn volume_by_name(&self, name: &str) -> Option<&VolumeRecord> {
        self.volumes.values().find(|v| v.name == name)
    }

    /// The snapshot created under `name`, if it still exists.
    pub fn snapshot_by_name(&self, name: &str) -> Option<&SnapshotRecord> {
        self.snapshots.values().find(|s| s.name == name)
    }

    /// Total bytes held by existing volumes.
    pub fn used_bytes(&self) -> i64 {
        self.volumes.values().map(|v| v.capacity_bytes).sum()
    }

    /// Operations of one method, e.g. every `CreateVolume` outcome.
    pub fn operations_of<'a>(
        &'a self,
        method: &'a str,
    ) -> impl Iterator<Item = &'a OperationRecord> + 'a {
        self.operations.iter().filter(move |op| op.method == method)
    }

    /// Calls received for `method` so far.
    pub fn call_count(&self, method: &str) -> u64 {
        self.calls.get(method).copied().unwrap_or(0)
    }
}

/// One change of the ledger, a line of the journal. Volumes and snapshots are written whole
/// (inserted or replaced), call counters as their new totals; `seq` numbers the lines so a
/// snapshot can say which lines it already holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    pub seq: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub volumes: BTreeMap<String, VolumeRecord>,
    /// Removed before `volumes` are inserted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes_gone: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshots: BTreeMap<String, SnapshotRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots_gone: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operations: Vec<OperationRecord>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub calls: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_volume_seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_snapshot_seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts: Option<u64>,
}

impl Delta {
    /// True when applying it would change nothing.
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
            && self.volumes_gone.is_empty()
            && self.snapshots.is_empty()
            && self.snapshots_gone.is_empty()
            && self.operations.is_empty()
            && self.calls.is_empty()
            && self.next_volume_seq.is_none()
            && self.next_snapshot_seq.is_none()
            && self.starts.is_none()
    }
}

/// The snapshot file: the ledger and the last journal line it holds.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    #[serde(default)]
    journal_seq: u64,
    #[serde(flatten)]
    ledger: Ledger,
}

/// The ledger in `state_dir` and the sequence number of the last change it holds.
pub fn load_with_seq(state_dir: &Path) -> io::Result<(Ledger, u64)> {
    let path = ledger_path(state_dir);
    let (mut ledger, mut seq) = match std::fs::read(&path) {
        Ok(bytes) => {
            let file: SnapshotFile = serde_json::from_slice(&bytes).map_err(|err| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not a valid ledger: {err}", path.display()),
                )
            })?;
            (file.ledger, file.journal_seq)
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => (Ledger::default(), 0),
        Err(err) => return Err(err),
    };
    let journal = journal_path(state_dir);
    let text = match std::fs::read(&journal) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(err) => return Err(err),
    };
    // Only whole lines: the last one may be a write cut short by a kill.
    let complete = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    for (number, line) in text[..complete].split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let delta: Delta = serde_json::from_slice(line).map_err(|err| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} line {}: {err}", journal.display(), number + 1),
            )
        })?;
        // Lines the snapshot already holds (a start that compacted, then died before it
        // removed the journal) are skipped.
        if delta.seq > seq {
            seq = delta.seq;
            ledger.apply(delta);
        }
    }
    Ok((ledger, seq))
}

/// Writes `ledger` (holding every change up to `seq`) as the snapshot, then removes the journal.
/// A crash between the two leaves lines the snapshot already holds, which a load skips.
pub fn compact(ledger: &Ledger, seq: u64, state_dir: &Path) -> io::Result<()> {
    let path = ledger_path(state_dir);
    let tmp = state_dir.join(format!("{LEDGER_FILE}.tmp"));
    let file = SnapshotFile {
        journal_seq: seq,
        ledger: ledger.clone(),
    };
    let bytes = serde_json::to_vec_pretty(&file).map_err(io::Error::other)?;
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &path)?;
    match std::fs::remove_file(journal_path(state_dir)) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// The append side of the journal, held by the running driver.
#[derive(Debug)]
pub struct Journal {
    file: std::fs::File,
    /// Sequence number of the last line written (or held by the snapshot).
    seq: u64,
}

impl Journal {
    /// Opens (creating) the journal of `state_dir`, continuing after line `seq`.
    pub fn open(state_dir: &Path, seq: u64) -> io::Result<Journal> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(journal_path(state_dir))?;
        Ok(Journal { file, seq })
    }

    /// Appends `delta` as one line, in one write, before the change is acknowledged.
    pub fn append(&mut self, mut delta: Delta) -> io::Result<()> {
        delta.seq = self.seq + 1;
        let mut line = serde_json::to_vec(&delta).map_err(io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.seq = delta.seq;
        Ok(())
    }
}

/// Milliseconds since the Unix epoch, for timestamps in the ledger.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(id: &str, name: &str) -> VolumeRecord {
        VolumeRecord {
            volume_id: id.into(),
            name: name.into(),
            capacity_bytes: 1 << 20,
            parameters: BTreeMap::from([("type".into(), "fast".into())]),
            mutable_parameters: BTreeMap::new(),
            secret_keys: vec!["password".into()],
            volume_context: BTreeMap::new(),
            content_source: Some(ContentSource::Volume {
                volume_id: "vol-src".into(),
            }),
            accessible_topology: vec![BTreeMap::from([("zone".into(), "z1".into())])],
            published_nodes: BTreeMap::new(),
            created_at_ms: 1,
        }
    }

    #[test]
    fn save_then_load_round_trips_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Ledger::load(dir.path()).unwrap(), Ledger::default());

        let mut ledger = Ledger::default();
        ledger
            .volumes
            .insert("vol-1".into(), volume("vol-1", "pvc-a"));
        ledger.calls.insert("CreateVolume".into(), 3);
        ledger.operations.push(OperationRecord {
            method: "CreateVolume".into(),
            name: Some("pvc-a".into()),
            volume_id: Some("vol-1".into()),
            code: GrpcCode::DeadlineExceeded,
            message: String::new(),
            injected: true,
            created: true,
            deleted: false,
            secret_keys: Vec::new(),
            content_source: Some(ContentSource::Snapshot {
                snapshot_id: "snap-1".into(),
            }),
            requisite: vec![[("zone".to_string(), "a".to_string())].into()],
            preferred: Vec::new(),
            at_ms: 2,
        });
        ledger.next_volume_seq = 2;
        ledger.save(dir.path()).unwrap();

        let loaded = Ledger::load(dir.path()).unwrap();
        assert_eq!(loaded, ledger);
        assert_eq!(loaded.volume_by_name("pvc-a").unwrap().volume_id, "vol-1");
        assert_eq!(loaded.used_bytes(), 1 << 20);
        assert_eq!(loaded.call_count("CreateVolume"), 3);
        assert_eq!(loaded.operations_of("CreateVolume").count(), 1);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![LEDGER_FILE.to_string()]);
    }

    #[test]
    fn a_corrupt_ledger_is_an_error_not_an_empty_ledger() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(ledger_path(dir.path()), b"{not json").unwrap();
        let err = Ledger::load(dir.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
