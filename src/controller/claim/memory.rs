//! What the claim path remembers between reconciles, per claim UID, in the
//! controllers' one kind of memory ([`crate::controller::memory`]: bounded,
//! forgotten in one place, with the retry state of each claim). Every entry
//! only saves work — a `CreateVolume`, a request, a wait — and is
//! recomputable from the API server.

use std::time::{Duration, Instant};

use super::decide::Recall;
use crate::controller::memory::Memory;
use crate::csi::pb;

#[derive(Default)]
pub struct ClaimEntry {
    /// When the first attempt started, for the provisioning-duration metric.
    started: Option<Instant>,
    /// The driver's answer whose PV is not saved yet: a retry saves it
    /// without another `CreateVolume`.
    created: Option<pb::Volume>,
    /// This process saved (or found) the claim's PV: the PV cache may not
    /// show it yet.
    pv_saved: bool,
    /// This process removed the claim's intent: a stale cached copy that still
    /// shows it needs no second request.
    intent_released: bool,
    /// `--node-deployment`: tries this node made to take an Immediate claim,
    /// for the growing delay of the race.
    races: u32,
}

pub type ClaimMemory = Memory<ClaimEntry>;

impl Memory<ClaimEntry> {
    /// What a decision about the claim needs to know from this process.
    pub fn recall(&self, uid: &str) -> Recall {
        Recall {
            created: self.created(uid),
            pv_saved: self.pv_saved(uid),
            intent_released: self.intent_released(uid),
            held: self.held(uid),
        }
    }

    /// Notes the start of an attempt (the first one counts).
    pub fn attempt_started(&self, uid: &str) {
        self.with(uid, |e| {
            e.started.get_or_insert_with(Instant::now);
        });
    }

    /// How long ago the first attempt started, once, for the duration metric.
    pub fn take_started(&self, uid: &str) -> Option<Duration> {
        self.with(uid, |e| e.started.take().map(|t| t.elapsed()))
    }

    pub fn created(&self, uid: &str) -> Option<pb::Volume> {
        self.read(uid, |e| e.created.clone()).flatten()
    }

    pub fn remember_created(&self, uid: &str, volume: &pb::Volume) {
        self.with(uid, |e| e.created = Some(volume.clone()));
    }

    pub fn forget_created(&self, uid: &str) {
        self.with(uid, |e| e.created = None);
    }

    pub fn mark_pv_saved(&self, uid: &str) {
        self.with(uid, |e| {
            e.pv_saved = true;
            e.created = None;
        });
    }

    pub fn pv_saved(&self, uid: &str) -> bool {
        self.read(uid, |e| e.pv_saved).unwrap_or(false)
    }

    pub fn mark_intent_released(&self, uid: &str) {
        self.with(uid, |e| e.intent_released = true);
    }

    pub fn intent_released(&self, uid: &str) -> bool {
        self.read(uid, |e| e.intent_released).unwrap_or(false)
    }

    /// Counts a try to take an Immediate claim for this node; returns how
    /// many came before it.
    pub fn next_race(&self, uid: &str) -> u32 {
        self.with(uid, |e| {
            let before = e.races;
            e.races = e.races.saturating_add(1);
            before
        })
    }

    /// The claim was taken (by a node, maybe this one): a race for it later
    /// (sent back by the scheduler) starts with the shortest delay.
    pub fn reset_races(&self, uid: &str) {
        if self.read(uid, |e| e.races).is_some_and(|n| n > 0) {
            self.with(uid, |e| e.races = 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::memory::Hold;

    fn memory() -> ClaimMemory {
        ClaimMemory::new(Duration::from_secs(1), Duration::from_secs(5))
    }

    #[test]
    fn a_forgotten_claim_starts_afresh() {
        let m = memory();
        m.failed("a", Hold::Nothing);
        m.failed("a", Hold::Nothing);
        m.mark_pv_saved("a");
        m.mark_intent_released("a");
        m.next_race("a");
        m.forget("a");
        assert!(m.is_empty());
        assert!(!m.pv_saved("a") && !m.intent_released("a"));
        assert_eq!(m.failed("a", Hold::Nothing).as_secs(), 1, "no failures");
        assert_eq!(m.next_race("a"), 0, "no races");
    }

    #[test]
    fn reading_does_not_create_entries() {
        let m = memory();
        assert!(!m.pv_saved("x"));
        assert!(m.created("x").is_none());
        assert!(!m.intent_released("x"));
        m.reset_races("x");
        assert!(m.is_empty());
    }

    #[test]
    fn a_saved_pv_drops_the_remembered_answer() {
        let m = memory();
        let v = pb::Volume {
            volume_id: "h".into(),
            ..Default::default()
        };
        m.remember_created("a", &v);
        assert_eq!(m.created("a").map(|v| v.volume_id), Some("h".into()));
        m.mark_pv_saved("a");
        assert!(m.created("a").is_none() && m.pv_saved("a"));
    }

    #[test]
    fn races_count_per_claim_until_reset() {
        let m = memory();
        assert_eq!((m.next_race("a"), m.next_race("a")), (0, 1));
        assert_eq!(m.next_race("b"), 0);
        m.reset_races("a");
        assert_eq!(m.next_race("a"), 0);
    }
}
