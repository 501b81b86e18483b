//! The model: every step any actor may take next, and what it does.

use std::fmt;

use stateright::{Model, Property};

use crate::config::Config;
use crate::product::Act;
use crate::properties;
use crate::state::{Feed, Memory, Replica, State, Task, User, VolTask, Volume};
use crate::{sidecar, world};

/// The protocol under one configuration.
pub struct Protocol {
    pub cfg: Config,
    /// Fair completions already run, by state (see `properties`).
    pub(crate) settled: properties::Settled,
}

impl Protocol {
    pub fn new(cfg: Config) -> Protocol {
        Protocol {
            cfg,
            settled: Default::default(),
        }
    }
}

/// One step of one actor. A claim is named by its name (`claim 0`) where the
/// actor works by name, by its UID (`claim u1`) where by object; a PV by the
/// claim UID it is named after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// (UID)
    UserCreates(u8),
    /// (UID)
    UserDeletes(u8),
    /// (name)
    HandOff(u8),
    /// (name)
    Bind(u8),
    /// (PV)
    Release(u8),
    /// A replica's claim cache replays the next write.
    ClaimEvent(u8),
    PvEvent(u8),
    Lead(u8),
    Tick,
    /// The driver runs the call at this index of the calls in flight.
    Run(u8),
    /// (replica, name): the product's claim decision, and the act it begins.
    Decide(u8, u8, Act),
    /// (replica, UID): the next step of the act under way.
    Step(u8, u8),
    /// (replica, PV): the product's volume decision is `Delete`; it begins.
    VolDecide(u8, u8),
    VolStep(u8, u8),
    /// Fault: a CSI call's answer is lost (replica, UID).
    Timeout(u8, u8),
    /// Fault: a replica crashes.
    Crash(u8),
}

impl Action {
    /// Whether it is a fault, a user's choice or the clock: steps a fair
    /// completion leaves out.
    pub fn is_choice(&self) -> bool {
        matches!(
            self,
            Action::UserCreates(_)
                | Action::UserDeletes(_)
                | Action::Tick
                | Action::Lead(_)
                | Action::Timeout(..)
                | Action::Crash(_)
        )
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::UserCreates(u) => write!(f, "user creates claim u{u}"),
            Action::UserDeletes(u) => write!(f, "user deletes claim u{u}"),
            Action::HandOff(i) => write!(f, "binder hands claim {i} to the driver"),
            Action::Bind(i) => write!(f, "binder binds claim {i} to its PV"),
            Action::Release(u) => write!(f, "binder marks PV u{u} Released"),
            Action::ClaimEvent(r) => write!(f, "replica {r}'s claim cache replays a write"),
            Action::PvEvent(r) => write!(f, "replica {r}'s PV cache replays a write"),
            Action::Lead(r) => write!(f, "replica {r} takes or renews the Lease"),
            Action::Tick => write!(f, "the clock advances (a lease may expire)"),
            Action::Run(k) => write!(f, "the driver runs call #{k} in flight"),
            Action::Decide(r, i, act) => write!(f, "replica {r} decides on claim {i}: {act:?}"),
            Action::Step(r, u) => write!(f, "replica {r}, claim u{u}: next step"),
            Action::VolDecide(r, u) => write!(f, "replica {r} decides on PV u{u}: Delete"),
            Action::VolStep(r, u) => write!(f, "replica {r}, PV u{u}: next step"),
            Action::Timeout(r, u) => {
                write!(f, "FAULT: replica {r}'s call for claim u{u} times out")
            }
            Action::Crash(r) => write!(f, "FAULT: replica {r} crashes"),
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let cfg = &self.cfg;
        // The user's claim names, and the source of the clone.
        let n = cfg.claims + usize::from(cfg.clone);
        // Claim UIDs: each name's first claim and its re-creations.
        let m = n * (1 + usize::from(cfg.recreations));
        let replica = Replica {
            started: false,
            until: 0,
            claims_seen: 0,
            pvs_seen: 0,
            tasks: vec![Task::Idle; m],
            vols: vec![VolTask::Idle; m],
            memory: vec![Memory::default(); m],
            pv_deleted: vec![false; m],
            clock: 0,
        };
        let mut s = State {
            now: 0,
            rv: 0,
            claims: vec![None; n],
            source: None,
            pvs: vec![None; m],
            claim_feed: Feed::new(n),
            pv_feed: Feed::new(m),
            lease: None,
            replicas: vec![replica; cfg.replicas],
            volumes: vec![Volume::default(); m],
            calls: Vec::new(),
            user: vec![User::NotYet; m],
            timeouts: cfg.timeouts,
            crashes: cfg.crashes,
            ticks: cfg.ticks,
            broken: 0,
        };
        if cfg.clone {
            world::source_exists(&mut s, cfg.claims);
        }
        s.compact();
        vec![s]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        self.world_actions(s, out);
        for r in 0..s.replicas.len() {
            self.replica_actions(s, r, out);
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        self.apply(&mut s, action);
        s.compact();
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }

    fn format_step(&self, last: &State, action: Action) -> Option<String> {
        self.next_state(last, action)
            .map(|next| crate::trace::summary(&next))
    }
}

impl Protocol {
    fn world_actions(&self, s: &State, out: &mut Vec<Action>) {
        for (u, user) in s.user.iter().enumerate() {
            match user {
                User::NotYet if world::can_create(s, u) => out.push(Action::UserCreates(u as u8)),
                User::Created if world::can_delete(s, &self.cfg, u) => {
                    out.push(Action::UserDeletes(u as u8))
                }
                User::NotYet | User::Created | User::Deleted => {}
            }
        }
        for i in 0..s.claims.len() {
            let c = i as u8;
            if world::can_hand_off(s, i) {
                out.push(Action::HandOff(c));
            }
            if world::can_bind(s, i) {
                out.push(Action::Bind(c));
            }
        }
        for u in 0..s.pvs.len() {
            if world::can_release(s, u) {
                out.push(Action::Release(u as u8));
            }
        }
        for k in 0..s.calls.len() {
            if world::runnable(s, k) {
                out.push(Action::Run(k as u8));
            }
        }
        if s.ticks > 0 {
            out.push(Action::Tick);
        }
    }

    fn replica_actions(&self, s: &State, r: usize, out: &mut Vec<Action>) {
        let (rep, r8) = (&s.replicas[r], r as u8);
        if rep.started && rep.claims_seen < s.claim_feed.written() {
            out.push(Action::ClaimEvent(r8));
        }
        if rep.started && rep.pvs_seen < s.pv_feed.written() {
            out.push(Action::PvEvent(r8));
        }
        if world::can_lead(s, r) {
            out.push(Action::Lead(r8));
        }
        for i in 0..s.claims.len() {
            if let Some(act) = sidecar::decision(s, &self.cfg, r, i) {
                out.push(Action::Decide(r8, i as u8, act));
            }
        }
        for u in 0..s.pvs.len() {
            let c = u as u8;
            if sidecar::steps(rep.tasks[u]) {
                out.push(Action::Step(r8, c));
            }
            if sidecar::vol_decision(s, r, u) {
                out.push(Action::VolDecide(r8, c));
            }
            if !matches!(rep.vols[u], VolTask::Idle | VolTask::Deleting { .. }) {
                out.push(Action::VolStep(r8, c));
            }
            let waits = matches!(
                rep.tasks[u],
                Task::Creating | Task::Finding | Task::Deleting
            ) || matches!(rep.vols[u], VolTask::Deleting { .. });
            if waits && s.timeouts > 0 {
                out.push(Action::Timeout(r8, c));
            }
        }
        if s.crashes > 0 && rep.started {
            out.push(Action::Crash(r8));
        }
    }

    pub(crate) fn apply(&self, s: &mut State, action: Action) {
        let cfg = &self.cfg;
        match action {
            Action::UserCreates(i) => world::user_creates(s, i.into()),
            Action::UserDeletes(i) => world::user_deletes(s, i.into()),
            Action::HandOff(i) => {
                world::hand_off(s, cfg, i.into());
            }
            Action::Bind(i) => {
                world::bind(s, cfg, i.into());
            }
            Action::Release(i) => {
                world::release(s, i.into());
            }
            Action::ClaimEvent(r) => {
                world::claim_event(s, r.into());
            }
            Action::PvEvent(r) => {
                world::pv_event(s, r.into());
            }
            Action::Lead(r) => {
                world::lead(s, r.into());
            }
            Action::Tick => {
                s.now += 1;
                s.ticks = s.ticks.saturating_sub(1);
            }
            Action::Run(k) => world::run_call(s, k.into(), sidecar::after_create(cfg)),
            Action::Decide(r, i, act) => sidecar::begin(s, r.into(), i.into(), act),
            Action::Step(r, i) => sidecar::step(s, cfg, r.into(), i.into()),
            Action::VolDecide(r, i) => sidecar::vol_begin(s, r.into(), i.into()),
            Action::VolStep(r, i) => sidecar::vol_step(s, r.into(), i.into()),
            Action::Timeout(r, i) => {
                world::time_out(s, r.into(), i.into());
            }
            Action::Crash(r) => world::crash(s, r.into()),
        }
    }
}
