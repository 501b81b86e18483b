//! Everything but the sidecar: the user, kube-controller-manager's binder
//! (with the admission policies' intent in policy mode), the caches' watch
//! feeds, the Lease and the clock, the CSI driver, and the faults.

use crate::config::Config;
use crate::state::{
    CREATED_FOR_GONE_CLAIM, Call, CallKind, Claim, DELETED_BOUND_VOLUME, DELETED_CLONE_SOURCE,
    Memory, Phase, Pv, State, Task, User, VolTask, Volume,
};

/// Whether the user may create the claim of UID `u` now: the first of its
/// name, or one re-created under the name of a claim the user deleted and the
/// API server no longer has (a create under a name in use is refused).
pub fn can_create(s: &State, u: usize) -> bool {
    let i = s.name_of(u);
    s.user[u] == User::NotYet
        && s.source != Some(i as u8)
        && match u.checked_sub(s.claims.len()) {
            None => true,
            Some(before) => s.user[before] == User::Deleted && s.claims[i].is_none(),
        }
}

/// Whether the user may delete the claim of UID `u` (a re-created one only if
/// the configuration says so).
pub fn can_delete(s: &State, cfg: &Config, u: usize) -> bool {
    s.user[u] == User::Created && (u < s.claims.len() || cfg.delete_recreated)
}

/// The claim named `i` (its first UID), made and bound before the run, with
/// its PV and volume: the source claim 0 is a clone of.
pub fn source_exists(s: &mut State, i: usize) {
    s.source = Some(i as u8);
    s.user[i] = User::Created;
    s.volumes[i] = Volume {
        exists: true,
        made: 1,
    };
    s.write_pv(
        i,
        Some(Pv {
            rv: 0,
            phase: Phase::Bound,
            deleting: false,
        }),
    );
    s.write_claim(
        i,
        Some(Claim {
            uid: i as u8,
            rv: 0,
            handed: true,
            intent: false,
            deleting: false,
            bound: true,
            handle: false,
            clones: None,
            protected: false,
        }),
    );
}

/// The user creates the claim of UID `u` (not yet handed to any provisioner).
pub fn user_creates(s: &mut State, u: usize) {
    s.user[u] = User::Created;
    s.write_claim(
        s.name_of(u),
        Some(Claim {
            uid: u as u8,
            rv: 0,
            handed: false,
            intent: false,
            deleting: false,
            bound: false,
            handle: false,
            clones: s.clones(u),
            protected: false,
        }),
    );
}

/// The user deletes the claim of UID `u`: Terminating while a finalizer holds it.
pub fn user_deletes(s: &mut State, u: usize) {
    s.user[u] = User::Deleted;
    if let Some(c) = s.claim_of(u) {
        s.write_claim(
            s.name_of(u),
            Some(Claim {
                deleting: true,
                ..c
            }),
        );
    }
}

/// The binder hands the claim to our driver; in policy mode the
/// provisioning-intent policy adds the intent (and its label) in that update.
pub fn hand_off(s: &mut State, cfg: &Config, i: usize) -> bool {
    match s.claims[i] {
        Some(c) if can_hand_off(s, i) => {
            let intent = c.intent || cfg.policy();
            s.write_claim(
                i,
                Some(Claim {
                    handed: true,
                    intent,
                    ..c
                }),
            );
            true
        }
        _ => false,
    }
}

/// The binder binds the claim to its PV (the PV first, then the claim); in
/// policy mode the release-intent policy drops the intent in the claim's update.
pub fn bind(s: &mut State, cfg: &Config, i: usize) -> bool {
    if !can_bind(s, i) {
        return false;
    }
    let c = s.claims[i].expect("a claim to bind");
    let u = usize::from(c.uid);
    let p = s.pvs[u].expect("its PV");
    s.write_pv(
        u,
        Some(Pv {
            phase: Phase::Bound,
            ..p
        }),
    );
    let intent = c.intent && !cfg.policy();
    s.write_claim(
        i,
        Some(Claim {
            bound: true,
            intent,
            ..c
        }),
    );
    true
}

/// The binder marks a PV whose claim is gone Released (gone: no claim of
/// that name, or another claim under it: the claimRef's UID differs).
pub fn release(s: &mut State, u: usize) -> bool {
    match s.pvs[u] {
        Some(p) if can_release(s, u) => {
            s.write_pv(
                u,
                Some(Pv {
                    phase: Phase::Released,
                    ..p
                }),
            );
            true
        }
        _ => false,
    }
}

pub fn can_hand_off(s: &State, i: usize) -> bool {
    s.claims[i].is_some_and(|c| !c.handed && !c.deleting)
}

pub fn can_bind(s: &State, i: usize) -> bool {
    s.claims[i].is_some_and(|c| {
        c.handed
            && !c.bound
            && s.pvs[usize::from(c.uid)].is_some_and(|p| p.phase == Phase::Available)
    })
}

pub fn can_release(s: &State, u: usize) -> bool {
    s.claim_of(u).is_none() && s.pvs[u].is_some_and(|p| p.phase != Phase::Released)
}

/// Replica `r`'s claim cache replays the next write; a claim's deletion
/// makes the process forget it (`forget_deleted`).
pub fn claim_event(s: &mut State, r: usize) -> bool {
    let seen = s.replicas[r].claims_seen;
    if seen >= s.claim_feed.written() {
        return false;
    }
    let (_, i, obj) = s.claim_feed.events[usize::from(seen - s.claim_feed.folded)];
    // The deleted claim, as the cache had it.
    let gone = s.claim_cache(r, usize::from(i)).filter(|_| obj.is_none());
    s.replicas[r].claims_seen += 1;
    if let Some(c) = gone {
        s.replicas[r].memory[usize::from(c.uid)] = Memory::default();
    }
    true
}

/// Replica `r`'s PV cache replays the next write; a PV's deletion makes the
/// volume path forget it (`volume::forget_deleted`).
pub fn pv_event(s: &mut State, r: usize) -> bool {
    let seen = s.replicas[r].pvs_seen;
    if seen >= s.pv_feed.written() {
        return false;
    }
    let (_, u, obj) = s.pv_feed.events[usize::from(seen - s.pv_feed.folded)];
    s.replicas[r].pvs_seen += 1;
    if obj.is_none() {
        s.replicas[r].pv_deleted[usize::from(u)] = false;
    }
    true
}

/// Replica `r` takes or renews the Lease (expired, free, or its own). A
/// replica that (re)starts has listed its caches (`State::compact`).
pub fn can_lead(s: &State, r: usize) -> bool {
    let free = match s.lease {
        None => true,
        Some((holder, expires)) => usize::from(holder) == r || s.now >= expires,
    };
    let until = s.now + 1;
    let rep = &s.replicas[r];
    free && !(rep.started && rep.until == until && s.lease == Some((r as u8, until)))
}

pub fn lead(s: &mut State, r: usize) -> bool {
    if !can_lead(s, r) {
        return false;
    }
    let until = s.now + 1;
    s.lease = Some((r as u8, until));
    let rep = &mut s.replicas[r];
    rep.started = true;
    rep.until = until;
    true
}

/// The index of a call the driver may run now: the oldest for its name.
pub fn runnable(s: &State, k: usize) -> bool {
    let call = s.calls[k];
    !s.calls[..k].iter().any(|c| c.uid == call.uid)
}

/// The driver runs call `k`: creates by name (idempotent) or deletes; its
/// answer reaches the caller if the caller still waits for it (a create's
/// caller goes on to `after_create`).
pub fn run_call(s: &mut State, k: usize, after_create: Task) {
    let Call { replica, uid, kind } = s.calls.remove(k);
    let u = usize::from(uid);
    let gone = s.claim_of(u).is_none();
    // A clone made from a volume that is gone: the driver refuses it.
    let no_source = s
        .clones(u)
        .is_some_and(|i| !s.volumes[usize::from(i)].exists);
    let mut failed = false;
    match kind {
        CallKind::Create | CallKind::Find => {
            if gone {
                s.broken |= CREATED_FOR_GONE_CLAIM;
            }
            let vol = &mut s.volumes[u];
            if !vol.exists && no_source {
                failed = true;
            } else if !vol.exists {
                vol.exists = true;
                vol.made += 1;
            }
        }
        CallKind::DeleteAbandoned | CallKind::DeleteReleased => {
            if s.pvs[u].is_some_and(|p| p.phase == Phase::Bound) {
                s.broken |= DELETED_BOUND_VOLUME;
            }
            // A clone of this volume still being made (a call that may make
            // one is in flight).
            let cloned = s.calls.iter().any(|c| {
                matches!(c.kind, CallKind::Create | CallKind::Find)
                    && s.clones(usize::from(c.uid)).map(usize::from) == Some(s.name_of(u))
                    && !s.volumes[usize::from(c.uid)].exists
            });
            if cloned && s.source.map(usize::from) == Some(u) {
                s.broken |= DELETED_CLONE_SOURCE;
            }
            s.volumes[u].exists = false;
        }
    }
    if replica != NOBODY {
        answer(s, usize::from(replica), u, kind, failed, after_create);
    }
}

fn answer(s: &mut State, r: usize, u: usize, kind: CallKind, failed: bool, after_create: Task) {
    let rep = &mut s.replicas[r];
    match (kind, rep.tasks[u]) {
        // A refused create: the attempt fails.
        (CallKind::Create, Task::Creating) | (CallKind::Find, Task::Finding) if failed => {
            rep.tasks[u] = Task::Idle;
        }
        (CallKind::Create, Task::Creating) => {
            rep.memory[u].created = true;
            rep.tasks[u] = after_create;
        }
        (CallKind::Find, Task::Finding) => {
            rep.memory[u].created = true;
            rep.tasks[u] = Task::Record;
        }
        (CallKind::DeleteAbandoned, Task::Deleting) => {
            rep.memory[u].created = false;
            rep.tasks[u] = Task::ReleaseNow;
        }
        (CallKind::DeleteReleased, _) => {
            if let VolTask::Deleting { terminating } = rep.vols[u] {
                rep.vols[u] = if terminating {
                    VolTask::DropFinalizer
                } else {
                    VolTask::DeletePv
                };
            }
        }
        _ => {}
    }
}

/// A call of replica `r` about the claim of UID `u` times out (or its answer is lost):
/// the attempt fails, the call may still run.
pub fn time_out(s: &mut State, r: usize, u: usize) -> bool {
    let rep = &mut s.replicas[r];
    let kinds: &[CallKind] = match (rep.tasks[u], rep.vols[u]) {
        (Task::Creating, _) => &[CallKind::Create],
        (Task::Finding, _) => &[CallKind::Find],
        (Task::Deleting, _) => &[CallKind::DeleteAbandoned],
        (_, VolTask::Deleting { .. }) => &[CallKind::DeleteReleased],
        _ => return false,
    };
    if kinds[0] == CallKind::DeleteReleased {
        rep.vols[u] = VolTask::Idle;
    } else {
        rep.tasks[u] = Task::Idle;
    }
    orphan(s, |c| {
        usize::from(c.replica) == r && usize::from(c.uid) == u && kinds.contains(&c.kind)
    });
    s.timeouts -= 1;
    true
}

/// Calls whose caller gave up (or died): they still run, nobody hears the answer.
fn orphan(s: &mut State, which: impl Fn(&Call) -> bool) {
    for call in s.calls.iter_mut().filter(|c| which(c)) {
        call.replica = NOBODY;
    }
}

/// The caller of an orphaned call.
pub const NOBODY: u8 = u8::MAX;

/// Replica `r` crashes: its memory, caches and attempts are lost; it
/// restarts when it takes the Lease again.
pub fn crash(s: &mut State, r: usize) {
    s.crashes -= 1;
    orphan(s, |c| usize::from(c.replica) == r);
    let rep = &mut s.replicas[r];
    rep.started = false;
    rep.until = 0;
    rep.tasks.fill(Task::Idle);
    rep.vols.fill(VolTask::Idle);
    rep.memory.fill(Memory::default());
    rep.pv_deleted.fill(false);
    rep.clock = 0;
}
