//! The invariants (DESIGN §2), as properties of every reachable state. A
//! claim is one UID: one re-created under the same name is another claim.
//!
//! Safety is checked on each state, or at the moment of the act that would
//! break it (`State::broken`). The two properties about the end — no volume
//! left once its claim is deleted, every claim that stays gets its PV — are
//! checked by a *fair completion* from every reachable state: from there on
//! no fault happens and the user does nothing more (faults are finite), one
//! replica holds the Lease (the clock advances only when nobody does, so a
//! lease expires and another replica takes over), and every other enabled
//! step — the driver, the binder, each cache, each replica's decisions and
//! acts — is taken in turn (weak fairness: of the steps enabled, the one
//! taken least recently goes next; a round-robin over the list of enabled
//! steps is not fair when that list changes with each step). A state
//! from which that schedule does not reach the goal within
//! `Config::settle_steps` is a counterexample. (This shows the protocol never
//! gets stuck and never leaks whatever happened before; it follows one fair
//! schedule, not every one.)

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use stateright::{Model, Property};

use crate::model::{Action, Protocol};
use crate::state::{
    CREATED_FOR_GONE_CLAIM, DELETED_BOUND_VOLUME, DELETED_CLONE_SOURCE, Phase, State, User,
};
use crate::world;

pub const ONE_VOLUME: &str = "at most one backend volume per claim";
pub const NO_BOUND_DELETE: &str = "no volume deleted while a PV naming it is bound";
pub const NO_CREATE_FOR_GONE: &str = "no CreateVolume for a claim the API server no longer has";
pub const NO_LEAK: &str = "no volume, PV or claim left once the claim is deleted (fair completion)";
pub const NO_CLONE_SOURCE_DELETE: &str =
    "no volume deleted while a clone of it is being made (a CreateVolume naming it in flight)";
pub const LIVE: &str = "every claim that stays gets its PV and loses the intent (fair completion)";

pub fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(ONE_VOLUME, |_, s: &State| {
            s.volumes.iter().all(|v| v.made <= 1)
        }),
        Property::always(NO_BOUND_DELETE, |_, s: &State| {
            s.broken & DELETED_BOUND_VOLUME == 0
        }),
        Property::always(NO_CREATE_FOR_GONE, |_, s: &State| {
            s.broken & CREATED_FOR_GONE_CLAIM == 0
        }),
        Property::always(NO_CLONE_SOURCE_DELETE, |_, s: &State| {
            s.broken & DELETED_CLONE_SOURCE == 0
        }),
        Property::always(NO_LEAK, |m: &Protocol, s: &State| m.verdict(s).clean),
        Property::always(LIVE, |m: &Protocol, s: &State| m.verdict(s).live),
        // Not vacuous: each of these is reached.
        Property::sometimes("a claim gets its PV", |_, s: &State| {
            s.claims.iter().flatten().any(|c| c.bound && !c.intent)
        }),
        Property::sometimes(
            "a claim deleted mid-provisioning is cleaned up",
            |_, s: &State| {
                (0..s.user.len()).any(|u| {
                    s.user[u] == User::Deleted
                        && s.volumes[u].made == 1
                        && !s.volumes[u].exists
                        && s.pvs[u].is_none()
                        && s.claim_of(u).is_none()
                })
            },
        ),
        // (Only where a clone is made.)
        Property::sometimes(
            "a clone gets its PV, and its source, deleted, is cleaned up",
            |_, s: &State| {
                s.source.is_none_or(|src| {
                    let src = usize::from(src);
                    s.claims[0].is_some_and(|c| c.bound)
                        && s.user[src] == User::Deleted
                        && s.claims[src].is_none()
                        && !s.volumes[src].exists
                })
            },
        ),
        // (Only where the user may re-create a claim.)
        Property::sometimes(
            "a claim re-created under the name of a deleted one gets its PV",
            |m: &Protocol, s: &State| {
                m.cfg.recreations == 0
                    || (s.claims.len()..s.user.len())
                        .any(|u| s.claim_of(u).is_some_and(|c| c.bound && !c.intent))
            },
        ),
        // (Only where a lease may expire.)
        Property::sometimes(
            "a replica takes over from another",
            |m: &Protocol, s: &State| {
                m.cfg.ticks == 0 || s.replicas.iter().filter(|r| r.started).count() > 1
            },
        ),
    ]
}

/// Where a fair completion from a state ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Every deleted claim is gone, with its PV and its backend volume.
    pub clean: bool,
    /// Every claim that stays is bound, its PV Bound, its intent released.
    pub live: bool,
}

impl Verdict {
    fn of(s: &State) -> Verdict {
        let mut v = Verdict {
            clean: true,
            live: true,
        };
        for u in 0..s.user.len() {
            match s.user[u] {
                User::NotYet => {}
                // A clone whose source the user deleted before its volume was
                // made waits for ever (refused: the source must be bound and
                // not being deleted), as upstream's.
                User::Created
                    if s.volumes[u].made == 0
                        && s.clones(u)
                            .is_some_and(|src| s.user[usize::from(src)] == User::Deleted) => {}
                User::Created => {
                    v.live &= s.claim_of(u).is_some_and(|c| c.bound && !c.intent)
                        && s.pvs[u].is_some_and(|p| p.phase == Phase::Bound);
                }
                User::Deleted => {
                    v.clean &=
                        s.claim_of(u).is_none() && s.pvs[u].is_none() && !s.volumes[u].exists;
                }
            }
        }
        v
    }

    fn reached(self) -> bool {
        self.clean && self.live
    }
}

/// Fair completions already run: a state's verdict by its hash.
pub type Settled = Mutex<HashMap<u64, Verdict>>;

fn key(s: &State) -> u64 {
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

impl Protocol {
    /// The verdict of the fair completion from `s` (memoised: a completion
    /// that reaches the goal gives it to every state it passed).
    pub fn verdict(&self, s: &State) -> Verdict {
        if let Some(v) = self.settled.lock().expect("poisoned").get(&key(s)) {
            return *v;
        }
        let (path, end) = self.complete(s);
        let verdict = Verdict::of(&end);
        let mut memo = self.settled.lock().expect("poisoned");
        if verdict.reached() {
            memo.extend(path.iter().map(|(state, _)| (key(state), verdict)));
        }
        memo.insert(key(s), verdict);
        verdict
    }

    /// The fair completion from `s`: the states it passed with the step
    /// taken from each, and where it ended.
    pub fn complete(&self, s: &State) -> (Vec<(State, Action)>, State) {
        let mut s = s.clone();
        let mut path = Vec::new();
        let mut taken = HashMap::new();
        for _ in 0..self.cfg.settle_steps {
            if Verdict::of(&s).reached() {
                break;
            }
            let Some(action) = self.fair_next(&s, &mut taken, path.len()) else {
                break;
            };
            let mut next = s.clone();
            self.apply(&mut next, action);
            next.compact();
            path.push((std::mem::replace(&mut s, next), action));
        }
        (path, s)
    }

    /// The next step of the fair schedule: a leader first (taking the Lease,
    /// or letting the clock expire it), then every other step in turn: the
    /// enabled step taken least recently (`taken`: when each was last taken;
    /// `now`: this step's number).
    fn fair_next(
        &self,
        s: &State,
        taken: &mut HashMap<Action, usize>,
        now: usize,
    ) -> Option<Action> {
        let replicas = 0..s.replicas.len();
        if !replicas.clone().any(|r| s.gate_open(r)) {
            return Some(match replicas.clone().find(|&r| world::can_lead(s, r)) {
                Some(r) => Action::Lead(r as u8),
                None => Action::Tick,
            });
        }
        let mut all = Vec::new();
        self.actions(s, &mut all);
        let steps: Vec<Action> = all.into_iter().filter(|a| !a.is_choice()).collect();
        let next = steps
            .into_iter()
            .min_by_key(|a| taken.get(a).map_or(0, |at| at + 1))?;
        taken.insert(next, now);
        Some(next)
    }
}
