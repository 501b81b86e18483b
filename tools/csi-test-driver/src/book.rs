//! The driver's live ledger: the [`Ledger`] plus the indexes that make each call O(1) (volumes
//! and snapshots by name, bytes in use, ids a `DeleteVolume` removed) and the change not yet
//! journaled. Every mutation goes through a method here so the indexes and the journal line
//! cannot drift from the ledger; reads go through `Deref` to the plain ledger.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Deref;

use crate::ledger::{Delta, Ledger, OperationRecord, SnapshotRecord, VolumeRecord};

/// Ids held under each name. A name has one id unless a misbehaving driver (the
/// `create_not_idempotent` fault) made two volumes of it; the lowest id answers, as the
/// ledger's id order did before the index.
#[derive(Debug, Default)]
struct NameIndex(HashMap<String, BTreeSet<String>>);

impl NameIndex {
    fn insert(&mut self, name: &str, id: &str) {
        self.0
            .entry(name.to_string())
            .or_default()
            .insert(id.to_string());
    }

    fn remove(&mut self, name: &str, id: &str) {
        if let Some(ids) = self.0.get_mut(name) {
            ids.remove(id);
            if ids.is_empty() {
                self.0.remove(name);
            }
        }
    }

    fn first(&self, name: &str) -> Option<&String> {
        self.0.get(name).and_then(|ids| ids.first())
    }
}

/// The ledger as the running driver holds it.
#[derive(Debug, Default)]
pub struct Book {
    ledger: Ledger,
    volume_names: NameIndex,
    snapshot_names: NameIndex,
    used_bytes: i64,
    /// Volume ids some `DeleteVolume` removed (a second delete may be told NOT_FOUND).
    deleted: HashSet<String>,
    /// Changes since the last [`Book::take_delta`].
    pending: Delta,
    /// Call counters changed since the last `take_delta`.
    calls_dirty: BTreeSet<String>,
}

impl Deref for Book {
    type Target = Ledger;

    fn deref(&self) -> &Ledger {
        &self.ledger
    }
}

impl Book {
    /// Indexes `ledger` (O(N) once, at start).
    pub fn new(ledger: Ledger) -> Book {
        let mut book = Book::default();
        for v in ledger.volumes.values() {
            book.volume_names.insert(&v.name, &v.volume_id);
            book.used_bytes += v.capacity_bytes;
        }
        for s in ledger.snapshots.values() {
            book.snapshot_names.insert(&s.name, &s.snapshot_id);
        }
        for op in &ledger.operations {
            book.note_operation(op);
        }
        book.ledger = ledger;
        book
    }

    /// The volume created under `name`, if it still exists.
    pub fn volume_by_name(&self, name: &str) -> Option<&VolumeRecord> {
        self.volume_names
            .first(name)
            .and_then(|id| self.ledger.volumes.get(id))
    }

    /// The snapshot created under `name`, if it still exists.
    pub fn snapshot_by_name(&self, name: &str) -> Option<&SnapshotRecord> {
        self.snapshot_names
            .first(name)
            .and_then(|id| self.ledger.snapshots.get(id))
    }

    /// Total bytes held by existing volumes.
    pub fn used_bytes(&self) -> i64 {
        self.used_bytes
    }

    /// True when a `DeleteVolume` once removed `volume_id`.
    pub fn was_deleted(&self, volume_id: &str) -> bool {
        self.deleted.contains(volume_id)
    }

    pub fn count_call(&mut self, method: &str) {
        *self.ledger.calls.entry(method.to_string()).or_default() += 1;
        if !self.calls_dirty.contains(method) {
            self.calls_dirty.insert(method.to_string());
        }
    }

    /// True when call counters changed since the last journal line.
    pub fn counts_dirty(&self) -> bool {
        !self.calls_dirty.is_empty()
    }

    pub fn take_volume_seq(&mut self) -> u64 {
        let seq = self.ledger.next_volume_seq;
        self.ledger.next_volume_seq += 1;
        self.pending.next_volume_seq = Some(self.ledger.next_volume_seq);
        seq
    }

    pub fn take_snapshot_seq(&mut self) -> u64 {
        let seq = self.ledger.next_snapshot_seq;
        self.ledger.next_snapshot_seq += 1;
        self.pending.next_snapshot_seq = Some(self.ledger.next_snapshot_seq);
        seq
    }

    pub fn set_starts(&mut self, starts: u64) {
        self.ledger.starts = starts;
        self.pending.starts = Some(starts);
    }

    pub fn insert_volume(&mut self, volume: VolumeRecord) {
        self.remove_volume(&volume.volume_id);
        self.volume_names.insert(&volume.name, &volume.volume_id);
        self.used_bytes += volume.capacity_bytes;
        self.pending
            .volumes_gone
            .retain(|id| *id != volume.volume_id);
        self.pending
            .volumes
            .insert(volume.volume_id.clone(), volume.clone());
        self.ledger.volumes.insert(volume.volume_id.clone(), volume);
    }

    pub fn remove_volume(&mut self, volume_id: &str) -> Option<VolumeRecord> {
        let volume = self.ledger.volumes.remove(volume_id)?;
        self.volume_names.remove(&volume.name, volume_id);
        self.used_bytes -= volume.capacity_bytes;
        self.pending.volumes.remove(volume_id);
        self.pending.volumes_gone.push(volume_id.to_string());
        Some(volume)
    }

    /// Changes a volume in place; `None` when it does not exist.
    pub fn update_volume<T>(
        &mut self,
        volume_id: &str,
        change: impl FnOnce(&mut VolumeRecord) -> T,
    ) -> Option<T> {
        let mut volume = self.ledger.volumes.get(volume_id)?.clone();
        let answer = change(&mut volume);
        self.insert_volume(volume);
        Some(answer)
    }

    pub fn insert_snapshot(&mut self, snapshot: SnapshotRecord) {
        self.remove_snapshot(&snapshot.snapshot_id);
        self.snapshot_names
            .insert(&snapshot.name, &snapshot.snapshot_id);
        self.pending
            .snapshots_gone
            .retain(|id| *id != snapshot.snapshot_id);
        self.pending
            .snapshots
            .insert(snapshot.snapshot_id.clone(), snapshot.clone());
        self.ledger
            .snapshots
            .insert(snapshot.snapshot_id.clone(), snapshot);
    }

    pub fn remove_snapshot(&mut self, snapshot_id: &str) -> Option<SnapshotRecord> {
        let snapshot = self.ledger.snapshots.remove(snapshot_id)?;
        self.snapshot_names.remove(&snapshot.name, snapshot_id);
        self.pending.snapshots.remove(snapshot_id);
        self.pending.snapshots_gone.push(snapshot_id.to_string());
        Some(snapshot)
    }

    pub fn push_operation(&mut self, op: OperationRecord) {
        self.note_operation(&op);
        self.pending.operations.push(op.clone());
        self.ledger.operations.push(op);
    }

    fn note_operation(&mut self, op: &OperationRecord) {
        if op.method == "DeleteVolume"
            && op.deleted
            && let Some(id) = &op.volume_id
        {
            self.deleted.insert(id.clone());
        }
    }

    /// The change since the last call (empty when nothing changed), to journal.
    pub fn take_delta(&mut self) -> Delta {
        let mut delta = std::mem::take(&mut self.pending);
        delta.calls = std::mem::take(&mut self.calls_dirty)
            .into_iter()
            .map(|m| {
                let n = self.ledger.calls.get(&m).copied().unwrap_or(0);
                (m, n)
            })
            .collect::<BTreeMap<_, _>>();
        delta
    }

    /// Puts back a change whose journal line could not be written, so the next line carries it.
    pub fn restore_delta(&mut self, delta: Delta) {
        let newer = std::mem::replace(&mut self.pending, delta);
        self.calls_dirty.extend(self.pending.calls.keys().cloned());
        self.pending.calls.clear();
        self.pending.apply_later(newer);
    }
}

impl Delta {
    /// Folds a later change into this one (this one first).
    fn apply_later(&mut self, later: Delta) {
        for id in later.volumes_gone {
            self.volumes.remove(&id);
            self.volumes_gone.push(id);
        }
        self.volumes.extend(later.volumes);
        for id in later.snapshots_gone {
            self.snapshots.remove(&id);
            self.snapshots_gone.push(id);
        }
        self.snapshots.extend(later.snapshots);
        self.operations.extend(later.operations);
        self.calls.extend(later.calls);
        self.next_volume_seq = later.next_volume_seq.or(self.next_volume_seq);
        self.next_snapshot_seq = later.next_snapshot_seq.or(self.next_snapshot_seq);
        self.starts = later.starts.or(self.starts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Journal, load_with_seq};

    fn volume(id: &str, name: &str, bytes: i64) -> VolumeRecord {
        VolumeRecord {
            volume_id: id.into(),
            name: name.into(),
            capacity_bytes: bytes,
            parameters: BTreeMap::new(),
            mutable_parameters: BTreeMap::new(),
            secret_keys: Vec::new(),
            volume_context: BTreeMap::new(),
            content_source: None,
            accessible_topology: Vec::new(),
            published_nodes: BTreeMap::new(),
            created_at_ms: 1,
        }
    }

    fn deleted(id: &str) -> OperationRecord {
        let mut op = OperationRecord::new("DeleteVolume", None, Some(id.into()));
        op.deleted = true;
        op
    }

    /// The answers the plain ledger gives by scanning, which the indexes must match.
    fn scanned_by_name<'a>(ledger: &'a Ledger, name: &str) -> Option<&'a VolumeRecord> {
        ledger.volumes.values().find(|v| v.name == name)
    }

    #[test]
    fn the_indexes_give_the_answers_a_scan_of_the_ledger_gives() {
        let mut book = Book::default();
        book.insert_volume(volume("vol-000001", "pvc-a", 10));
        book.insert_volume(volume("vol-000002", "pvc-b", 20));
        // A non-idempotent driver's second volume of one name: the first one answers.
        book.insert_volume(volume("vol-000003", "pvc-a", 30));
        book.remove_volume("vol-000002");
        book.push_operation(deleted("vol-000002"));
        book.update_volume("vol-000001", |v| {
            v.published_nodes.insert("n1".into(), false);
        });

        for name in ["pvc-a", "pvc-b", "pvc-c"] {
            assert_eq!(book.volume_by_name(name), scanned_by_name(&book, name));
        }
        let sum: i64 = book.volumes.values().map(|v| v.capacity_bytes).sum();
        assert_eq!(book.used_bytes(), sum);
        for id in ["vol-000001", "vol-000002", "vol-000003"] {
            let scanned = book.operations.iter().any(|op| {
                op.method == "DeleteVolume" && op.deleted && op.volume_id.as_deref() == Some(id)
            });
            assert_eq!(book.was_deleted(id), scanned, "{id}");
        }

        // Removing the first volume of a shared name hands the name to the other one.
        book.remove_volume("vol-000001");
        assert_eq!(
            book.volume_by_name("pvc-a").map(|v| v.volume_id.as_str()),
            Some("vol-000003")
        );
        // Built from a loaded ledger, the indexes are the same.
        let rebuilt = Book::new(book.ledger.clone());
        assert_eq!(rebuilt.used_bytes(), book.used_bytes());
        assert!(rebuilt.was_deleted("vol-000002"));
        assert_eq!(
            rebuilt
                .volume_by_name("pvc-a")
                .map(|v| v.volume_id.as_str()),
            Some("vol-000003")
        );
    }

    #[test]
    fn the_journal_replays_to_the_ledger_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (ledger, seq) = load_with_seq(dir.path()).unwrap();
        let mut book = Book::new(ledger);
        let mut journal = Journal::open(dir.path(), seq).unwrap();
        let mut commit = |book: &mut Book| journal.append(book.take_delta()).unwrap();

        book.set_starts(1);
        commit(&mut book);
        for i in 0..50 {
            let seq = book.take_volume_seq();
            book.count_call("CreateVolume");
            book.insert_volume(volume(&format!("vol-{seq:06}"), &format!("pvc-{i}"), 1));
            book.push_operation(OperationRecord::new(
                "CreateVolume",
                Some(i.to_string()),
                None,
            ));
            commit(&mut book);
        }
        for i in (0..50).step_by(3) {
            book.remove_volume(&format!("vol-{i:06}"));
            book.push_operation(deleted(&format!("vol-{i:06}")));
            commit(&mut book);
        }
        book.update_volume("vol-000001", |v| v.capacity_bytes = 7);
        book.count_call("Probe");
        commit(&mut book);

        assert_eq!(Ledger::load(dir.path()).unwrap(), book.ledger);
        // A start compacts: the snapshot holds it all, and the journal goes on after it.
        let (ledger, seq) = load_with_seq(dir.path()).unwrap();
        crate::ledger::compact(&ledger, seq, dir.path()).unwrap();
        assert_eq!(Ledger::load(dir.path()).unwrap(), book.ledger);
    }

    #[test]
    fn a_failed_line_is_carried_by_the_next_one() {
        let mut book = Book::default();
        book.insert_volume(volume("vol-1", "pvc-a", 1));
        book.count_call("CreateVolume");
        let lost = book.take_delta();
        book.remove_volume("vol-1");
        book.insert_volume(volume("vol-2", "pvc-b", 1));
        book.restore_delta(lost);

        let mut replayed = Ledger::default();
        replayed.apply(book.take_delta());
        assert_eq!(replayed.volumes, book.volumes);
        assert_eq!(replayed.calls, book.calls);
    }
}
