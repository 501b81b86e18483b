//! Everything but the sidecar: the user, kube-controller-manager's binder
//! (with the admission policies' intent in policy mode), the caches' watch
//! feeds, the Lease and the clock, the CSI driver, and the faults.

use crate::config::Config;
use crate::state::{
    CREATED_FOR_GONE_CLAIM, Call, CallKind, Claim, DELETED_BOUND_VOLUME, Memory, Phase, Pv, State,
    Task, User, VolTask,
};

/// The user creates claim `i` (not yet handed to any provisioner).
pub fn user_creates(s: &mut State, i: usize) {
    s.user[i] = User::Created;
    s.write_claim(
        i,
        Some(Claim {
            rv: 0,
            handed: false,
            intent: false,
            deleting: false,
            bound: false,
            handle: false,
        }),
    );
}

/// The user deletes claim `i`: Terminating while a finalizer holds it.
pub fn user_deletes(s: &mut State, i: usize) {
    s.user[i] = User::Deleted;
    if let Some(c) = s.claims[i] {
        s.write_claim(
            i,
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
    match (s.claims[i], s.pvs[i]) {
        (Some(c), Some(p)) if can_bind(s, i) => {
            s.write_pv(
                i,
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
        _ => false,
    }
}

/// The binder marks a PV whose claim is gone Released.
pub fn release(s: &mut State, i: usize) -> bool {
    match s.pvs[i] {
        Some(p) if can_release(s, i) => {
            s.write_pv(
                i,
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
    s.claims[i].is_some_and(|c| c.handed && !c.bound)
        && s.pvs[i].is_some_and(|p| p.phase == Phase::Available)
}

pub fn can_release(s: &State, i: usize) -> bool {
    s.claims[i].is_none() && s.pvs[i].is_some_and(|p| p.phase != Phase::Released)
}

/// Replica `r`'s claim cache replays the next write; a claim's deletion
/// makes the process forget it (`forget_deleted`).
pub fn claim_event(s: &mut State, r: usize) -> bool {
    let seen = s.replicas[r].claims_seen;
    if seen >= s.claim_feed.written() {
        return false;
    }
    let (_, i, obj) = s.claim_feed.events[usize::from(seen - s.claim_feed.folded)];
    s.replicas[r].claims_seen += 1;
    if obj.is_none() {
        s.replicas[r].memory[usize::from(i)] = Memory::default();
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
    let (_, i, obj) = s.pv_feed.events[usize::from(seen - s.pv_feed.folded)];
    s.replicas[r].pvs_seen += 1;
    if obj.is_none() {
        s.replicas[r].pv_deleted[usize::from(i)] = false;
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
    !s.calls[..k].iter().any(|c| c.claim == call.claim)
}

/// The driver runs call `k`: creates by name (idempotent) or deletes; its
/// answer reaches the caller if the caller still waits for it (a create's
/// caller goes on to `after_create`).
pub fn run_call(s: &mut State, k: usize, after_create: Task) {
    let Call {
        replica,
        claim,
        kind,
    } = s.calls.remove(k);
    let i = usize::from(claim);
    let vol = &mut s.volumes[i];
    match kind {
        CallKind::Create | CallKind::Find => {
            if s.claims[i].is_none() {
                s.broken |= CREATED_FOR_GONE_CLAIM;
            }
            if !vol.exists {
                vol.exists = true;
                vol.made += 1;
            }
        }
        CallKind::DeleteAbandoned | CallKind::DeleteReleased => {
            if s.pvs[i].is_some_and(|p| p.phase == Phase::Bound) {
                s.broken |= DELETED_BOUND_VOLUME;
            }
            vol.exists = false;
        }
    }
    if replica != NOBODY {
        answer(s, usize::from(replica), i, kind, after_create);
    }
}

fn answer(s: &mut State, r: usize, i: usize, kind: CallKind, after_create: Task) {
    let rep = &mut s.replicas[r];
    match (kind, rep.tasks[i]) {
        (CallKind::Create, Task::Creating) => {
            rep.memory[i].created = true;
            rep.tasks[i] = after_create;
        }
        (CallKind::Find, Task::Finding) => {
            rep.memory[i].created = true;
            rep.tasks[i] = Task::Record;
        }
        (CallKind::DeleteAbandoned, Task::Deleting) => {
            rep.memory[i].created = false;
            rep.tasks[i] = Task::ReleaseNow;
        }
        (CallKind::DeleteReleased, _) => {
            if let VolTask::Deleting { terminating } = rep.vols[i] {
                rep.vols[i] = if terminating {
                    VolTask::DropFinalizer
                } else {
                    VolTask::DeletePv
                };
            }
        }
        _ => {}
    }
}

/// A call of replica `r` about claim `i` times out (or its answer is lost):
/// the attempt fails, the call may still run.
pub fn time_out(s: &mut State, r: usize, i: usize) -> bool {
    let rep = &mut s.replicas[r];
    let kinds: &[CallKind] = match (rep.tasks[i], rep.vols[i]) {
        (Task::Creating, _) => &[CallKind::Create],
        (Task::Finding, _) => &[CallKind::Find],
        (Task::Deleting, _) => &[CallKind::DeleteAbandoned],
        (_, VolTask::Deleting { .. }) => &[CallKind::DeleteReleased],
        _ => return false,
    };
    if kinds[0] == CallKind::DeleteReleased {
        rep.vols[i] = VolTask::Idle;
    } else {
        rep.tasks[i] = Task::Idle;
    }
    orphan(s, |c| {
        usize::from(c.replica) == r && usize::from(c.claim) == i && kinds.contains(&c.kind)
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
