//! A replica's steps: the product's decision on its cached claim, then the
//! acts in between decisions one step at a time, as `controller::claim`
//! carries them out (create.rs, intent.rs with kube/fresh.rs and
//! kube/clock.rs, abandon.rs), and the volume path's decision and its
//! deletion (`controller::volume`, delete.rs). Each step reads or writes the
//! API server once, or sends one CSI call.

use crate::config::{Check, Config, Mode, Variant};
use crate::product::{self, Act};
use crate::state::{Call, CallKind, Claim, Phase, Pv, State, Task, VolTask};

/// `CONFIRM_ROUNDS` of create.rs: copies re-read within one attempt.
const CONFIRM_ROUNDS: u8 = 3;

/// What the product decides for claim `i` on replica `r`'s caches, if it acts.
/// The claim controller reconciles a claim by name, one reconcile at a time:
/// no decision while this replica's act about an earlier claim of that name
/// (another UID) is under way.
pub fn decision(s: &State, cfg: &Config, r: usize, i: usize) -> Option<Act> {
    let rep = &s.replicas[r];
    // A replica past its renew deadline exits (`LeaseError::Lost`) unless it
    // renews first: it finishes the steps under way, it starts no new one.
    if !s.gate_open(r) || s.uids_of(i).any(|u| rep.tasks[u] != Task::Idle) {
        return None;
    }
    let claim = s
        .claim_cache(r, i)
        .filter(|c| product::kept_in_cache(i, c, cfg.policy()))?;
    let u = usize::from(claim.uid);
    product::decision(i, &claim, s.pv_cache(r, u), rep.memory[u], cfg.policy())
}

pub fn begin(s: &mut State, r: usize, i: usize, act: Act) {
    let copy = s.claim_cache(r, i).expect("decided on a cached claim");
    s.replicas[r].tasks[usize::from(copy.uid)] = match act {
        Act::Create => Task::Confirm { copy, round: 0 },
        Act::Abandon => Task::Abandon,
        Act::ReleaseIntent => Task::Release,
        Act::ReleaseCloneSource => Task::ReleaseSource,
    };
}

/// Whether `step` has anything to do (an awaited answer comes from the driver).
pub fn steps(task: Task) -> bool {
    !matches!(
        task,
        Task::Idle | Task::Creating | Task::Finding | Task::Deleting
    )
}

/// One step of replica `r`'s task for the claim of UID `u`.
pub fn step(s: &mut State, cfg: &Config, r: usize, u: usize) {
    let next = match s.replicas[r].tasks[u] {
        Task::Confirm { copy, round } => match gather(s, r, copy) {
            Some(src) => confirm(s, cfg, r, copy, round, src),
            None => Task::Idle,
        },
        Task::CatchUp {
            copy,
            round,
            version,
            src,
        } => catch_up(s, cfg, r, copy, round, version, src),
        Task::Clock {
            copy,
            round,
            since,
            src,
        } => {
            // The first own PV create after the check began, else a version round.
            let clock = s.replicas[r].clock;
            let version = if clock > since { clock } else { s.rv };
            Task::CatchUp {
                copy,
                round,
                version,
                src,
            }
        }
        Task::Listing { copy, round, src } => listing(s, cfg, r, copy, round, src),
        Task::Protect { src } => protect(s, src),
        Task::Gate => gate(s, r, u, CallKind::Create, Task::Creating, Task::Save),
        Task::EarlyRelease => {
            drop_intent(s, u);
            Task::Save
        }
        Task::Save if cfg.variant != Variant::UngatedSave && !s.gate_open(r) => Task::Idle,
        Task::Save => save(s, r, u),
        Task::Abandon => abandon(s, r, u),
        Task::Find => find(s, r, u),
        Task::Record => {
            // An edit on the claim's UID.
            if let Some(c) = s.claim_of(u).filter(|c| !c.handle) {
                s.write_claim(s.name_of(u), Some(Claim { handle: true, ..c }));
            }
            Task::Delete
        }
        Task::Delete => gate_delete(s, r, u),
        Task::ReleaseNow | Task::Release => {
            if !s.replicas[r].memory[u].intent_released {
                drop_intent(s, u);
                s.replicas[r].memory[u].intent_released = true;
            }
            Task::Idle
        }
        Task::ReleaseSource => release_source(s, cfg, r, u),
        Task::Idle | Task::Creating | Task::Finding | Task::Deleting => return,
    };
    s.replicas[r].tasks[u] = next;
}

/// `gather::for_create`'s source of a clone, read live and checked
/// (`clone::content_source`: bound, not being deleted, its PV there):
/// whether it carries our protection; `None` if it is refused. Nothing to read
/// for a claim that is no clone, or when this process has the driver's answer.
fn gather(s: &State, r: usize, copy: Claim) -> Option<bool> {
    let Some(source) = copy.clones else {
        return Some(false);
    };
    if s.replicas[r].memory[usize::from(copy.uid)].created {
        return Some(false);
    }
    s.claims[usize::from(source)]
        .filter(|c| c.bound && !c.deleting && s.pvs[usize::from(c.uid)].is_some())
        .map(|c| c.protected)
}

/// Where a confirmed attempt goes: a clone (without the driver's answer) has
/// its source protected first.
fn confirmed(s: &State, r: usize, copy: Claim, src: bool) -> Task {
    let answered = s.replicas[r].memory[usize::from(copy.uid)].created;
    if copy.clones.is_some() && !answered {
        Task::Protect { src }
    } else {
        Task::Gate
    }
}

/// `protect::protect`: nothing if the source as read carried our
/// protection; else an edit of the source claim (a conflict reads it again):
/// gone (`Edited::Gone`), the attempt fails as for a source that cannot be
/// read (finding F3: taken as done, the call named a volume being deleted);
/// being deleted, it takes no new finalizer (an error: the attempt fails).
fn protect(s: &mut State, src: bool) -> Task {
    if src {
        return Task::Gate;
    }
    let i = usize::from(s.source.expect("a clone has a source"));
    match s.claims[i] {
        None => Task::Idle,
        Some(c) if c.protected => Task::Gate,
        Some(c) if c.deleting => Task::Idle,
        Some(c) => {
            s.write_claim(
                i,
                Some(Claim {
                    protected: true,
                    ..c
                }),
            );
            Task::Gate
        }
    }
}

/// The cleanup's `CreateVolume`: unless this process has the answer, a
/// clone's request names its source, which `gather::for_cleanup` reads and
/// holds first (`hold_for_cleanup`): a source gone, unbound, without its PV,
/// or being deleted without our protection was never sent, and there is
/// nothing to ask (the handle is unknown: nothing deleted, the intent
/// released); else it is protected, then the call (one step: the source is
/// held from then on).
fn find(s: &mut State, r: usize, u: usize) -> Task {
    if let Some(source) = s.clones(u)
        && !s.replicas[r].memory[u].created
    {
        let i = usize::from(source);
        let held = s.claims[i].filter(|c| c.bound && s.pvs[usize::from(c.uid)].is_some());
        match held {
            Some(c) if c.deleting && !c.protected => return Task::ReleaseNow,
            Some(c) if !c.protected => s.write_claim(
                i,
                Some(Claim {
                    protected: true,
                    ..c
                }),
            ),
            Some(_) => {}
            None => return Task::ReleaseNow,
        }
    }
    gate(s, r, u, CallKind::Find, Task::Finding, Task::Record)
}

/// `protect::release_clone_source`: a clone of it pending in this replica's
/// claim cache keeps it (`ClonesPending`, retried); else the protection is
/// removed from the claim read fresh (on its UID): the claim goes with it.
fn release_source(s: &mut State, cfg: &Config, r: usize, u: usize) -> Task {
    let i = s.name_of(u);
    let pending = (0..s.claims.len()).any(|j| {
        s.claim_cache(r, j).is_some_and(|c| {
            product::kept_in_cache(j, &c, cfg.policy())
                && product::waits_for(j, &c, cfg.policy(), i)
        })
    });
    if pending {
        return Task::Idle;
    }
    if let Some(c) = s.claim_of(u).filter(|c| c.protected) {
        s.write_claim(
            i,
            Some(Claim {
                protected: false,
                ..c
            }),
        );
    }
    Task::Idle
}

/// What the API server said of the copy decided on (`intent::Confirmed`).
enum Confirmed {
    Current,
    /// The claim as it is now (and its name).
    Changed(Claim, usize),
    /// Gone, or (a listing round) newer and not at hand: nothing now.
    Gone,
}

fn carry_on(cfg: &Config, answer: Confirmed, round: u8, go: Task) -> Task {
    match answer {
        Confirmed::Current => go,
        Confirmed::Changed(fresh, i)
            if round + 1 < CONFIRM_ROUNDS && product::still_needs(i, &fresh, cfg.policy()) =>
        {
            Task::Confirm {
                copy: fresh,
                round: round + 1,
            }
        }
        Confirmed::Changed(..) | Confirmed::Gone => Task::Idle,
    }
}

/// `intent::confirm`: the freshness answer for a copy that holds the intent
/// in policy mode, else the fenced write.
fn confirm(s: &mut State, cfg: &Config, r: usize, copy: Claim, round: u8, src: bool) -> Task {
    let go = confirmed(s, r, copy, src);
    let check = match cfg.mode {
        Mode::Policy(check) if copy.intent => check,
        _ => return carry_on(cfg, record(s, copy), round, go),
    };
    match check {
        Check::Read => carry_on(cfg, read(s, copy), round, go),
        Check::VersionRound => Task::CatchUp {
            copy,
            round,
            version: s.rv,
            src,
        },
        Check::WriteClock => Task::Clock {
            copy,
            round,
            since: s.rv,
            src,
        },
        Check::ListingRound => listing(s, cfg, r, copy, round, src),
        Check::CacheAlone => go,
    }
}

/// `intent::record`: the intent written with the copy's UID and
/// resourceVersion as preconditions; a conflict reads the claim (another
/// claim of that name is gone for this one).
fn record(s: &mut State, copy: Claim) -> Confirmed {
    let i = s.name_of(copy.uid.into());
    match s.claims[i] {
        Some(now) if now.rv == copy.rv => {
            if now.deleting && !now.intent {
                // No new finalizer on an object being deleted (422).
                return Confirmed::Gone;
            }
            if !now.intent {
                s.write_claim(
                    i,
                    Some(Claim {
                        intent: true,
                        ..now
                    }),
                );
            }
            Confirmed::Current
        }
        _ => read(s, copy),
    }
}

/// `intent::read`: one consistent read of the claim.
fn read(s: &State, copy: Claim) -> Confirmed {
    let i = s.name_of(copy.uid.into());
    match s.claims[i] {
        Some(now) if now.uid == copy.uid => {
            if now.rv == copy.rv && now.intent {
                Confirmed::Current
            } else {
                Confirmed::Changed(now, i)
            }
        }
        _ => Confirmed::Gone,
    }
}

/// The cache caught up with `version` (`Fresh::Caught`, `intent::as_cached`),
/// or it did not in time: a listing round.
fn catch_up(
    s: &State,
    cfg: &Config,
    r: usize,
    copy: Claim,
    round: u8,
    version: u8,
    src: bool,
) -> Task {
    if !s.claim_feed.caught_up(s.replicas[r].claims_seen, version) {
        return Task::Listing { copy, round, src };
    }
    let i = s.name_of(copy.uid.into());
    let cached = s
        .claim_cache(r, i)
        .filter(|c| product::kept_in_cache(i, c, cfg.policy()));
    let answer = match cached {
        Some(now) if now.uid == copy.uid && now.rv == copy.rv => Confirmed::Current,
        Some(now) if now.uid == copy.uid => Confirmed::Changed(now, i),
        // Deleted, re-created, or bound and so left out of the cache.
        _ => Confirmed::Gone,
    };
    carry_on(cfg, answer, round, confirmed(s, r, copy, src))
}

/// A listing round (`intent::as_listed`): the labelled claims with their
/// UIDs and versions; a claim not among them is read.
fn listing(s: &State, cfg: &Config, r: usize, copy: Claim, round: u8, src: bool) -> Task {
    let i = s.name_of(copy.uid.into());
    let go = confirmed(s, r, copy, src);
    match s.claims[i].filter(|c| c.intent) {
        Some(now) if now.uid != copy.uid => Task::Idle,
        Some(now) if now.rv == copy.rv => go,
        // `Confirmed::Newer`: its watch event brings it, decided again then.
        Some(_) => Task::Idle,
        None => carry_on(cfg, read(s, copy), round, go),
    }
}

/// The leader gate, then the call (unless this process has the driver's
/// answer already: `known`). Not leader: the attempt fails (`NotLeader`).
fn gate(s: &mut State, r: usize, u: usize, kind: CallKind, waiting: Task, known: Task) -> Task {
    if s.replicas[r].memory[u].created {
        return known;
    }
    if !s.gate_open(r) {
        return Task::Idle;
    }
    s.calls.push(Call {
        replica: r as u8,
        uid: u as u8,
        kind,
    });
    waiting
}

fn gate_delete(s: &mut State, r: usize, u: usize) -> Task {
    if !s.gate_open(r) {
        return Task::Idle;
    }
    s.calls.push(Call {
        replica: r as u8,
        uid: u as u8,
        kind: CallKind::DeleteAbandoned,
    });
    Task::Deleting
}

/// The task a create's answer leads to.
pub fn after_create(cfg: &Config) -> Task {
    match cfg.variant {
        Variant::Product | Variant::UngatedSave => Task::Save,
        Variant::ReleaseBeforeSave => Task::EarlyRelease,
    }
}

/// Saves the PV (its creation stamps this process's write clock);
/// `AlreadyExists` with our claimRef is done.
fn save(s: &mut State, r: usize, u: usize) -> Task {
    if s.pvs[u].is_none() {
        s.write_pv(
            u,
            Some(Pv {
                rv: 0,
                phase: Phase::Available,
                deleting: false,
            }),
        );
        s.replicas[r].clock = s.rv;
    }
    s.replicas[r].memory[u].pv_saved = true;
    Task::Idle
}

/// The intent dropped from the claim (an edit on its UID); a deleted claim
/// goes with its last finalizer.
fn drop_intent(s: &mut State, u: usize) {
    if let Some(c) = s.claim_of(u).filter(|c| c.intent) {
        s.write_claim(s.name_of(u), Some(Claim { intent: false, ..c }));
    }
}

/// abandon.rs: saved already (the volume path owns the volume): release;
/// else read the claim and find its volume by the recorded handle, this
/// process's answer, or the idempotent `CreateVolume`.
fn abandon(s: &State, r: usize, u: usize) -> Task {
    let memory = s.replicas[r].memory[u];
    if memory.pv_saved || s.pvs[u].is_some() {
        return Task::ReleaseNow;
    }
    match s.claim_of(u) {
        Some(c) if c.intent && c.handed => {
            if c.handle {
                Task::Delete
            } else if memory.created {
                Task::Record
            } else {
                Task::Find
            }
        }
        _ => Task::Idle,
    }
}

/// The volume path: the product's decision on the PV as replica `r`'s cache
/// shows it, with what the process remembers (`volume::reconcile`); a replica
/// past its renew deadline starts nothing new.
pub fn vol_decision(s: &State, r: usize, u: usize) -> bool {
    let rep = &s.replicas[r];
    s.gate_open(r)
        && rep.vols[u] == VolTask::Idle
        && s.pv_cache(r, u)
            .is_some_and(|p| product::deletes(s.name_of(u), u, s.clones(u), &p, rep.pv_deleted[u]))
}

pub fn vol_begin(s: &mut State, r: usize, u: usize) {
    let copy = s.pv_cache(r, u).expect("decided on a cached PV");
    s.replicas[r].vols[u] = VolTask::Confirm { copy };
}

/// One step of replica `r`'s deletion of PV `u` (delete.rs).
pub fn vol_step(s: &mut State, r: usize, u: usize) {
    let next = match s.replicas[r].vols[u] {
        VolTask::Confirm { copy } => confirm_delete(s, r, u, copy),
        VolTask::Gate { terminating } => {
            if s.gate_open(r) {
                s.calls.push(Call {
                    replica: r as u8,
                    uid: u as u8,
                    kind: CallKind::DeleteReleased,
                });
                VolTask::Deleting { terminating }
            } else {
                VolTask::Idle
            }
        }
        VolTask::DeletePv => match s.pvs[u] {
            // The DELETE (UID precondition) answers the object our finalizer
            // keeps; one already Terminating is answered as it is.
            Some(p) => {
                if !p.deleting {
                    s.write_pv(
                        u,
                        Some(Pv {
                            deleting: true,
                            ..p
                        }),
                    );
                }
                VolTask::DropFinalizer
            }
            None => {
                s.replicas[r].pv_deleted[u] = true;
                VolTask::Idle
            }
        },
        VolTask::DropFinalizer => {
            if s.pvs[u].is_some() {
                s.write_pv(u, None);
            }
            s.replicas[r].pv_deleted[u] = true;
            VolTask::Idle
        }
        VolTask::Idle | VolTask::Deleting { .. } => return,
    };
    s.replicas[r].vols[u] = next;
}

/// `delete` up to the call: not leader, nothing (`NotLeader`); then
/// `confirm_delete`. A PV held by our finalizer (every PV here) and not
/// Terminating in the copy decided on gets the DELETE fenced on that copy's
/// UID and resourceVersion: it takes (the PV is Terminating now), or the PV
/// is gone, or it conflicts; a conflict, or a copy already Terminating, reads
/// the PV and decides again on it (`still_to_delete`). (The conflict and the
/// read are one step: the conflict changes nothing.)
fn confirm_delete(s: &mut State, r: usize, u: usize, copy: Pv) -> VolTask {
    if !s.gate_open(r) {
        return VolTask::Idle;
    }
    if !copy.deleting {
        match s.pvs[u] {
            None => return VolTask::Idle,
            Some(now) if now.rv == copy.rv => {
                s.write_pv(
                    u,
                    Some(Pv {
                        deleting: true,
                        ..now
                    }),
                );
                return VolTask::Gate { terminating: true };
            }
            Some(_) => {}
        }
    }
    match s.pvs[u] {
        Some(fresh) if product::still_deletes(s.name_of(u), u, s.clones(u), &fresh, &copy) => {
            VolTask::Gate {
                terminating: fresh.deleting,
            }
        }
        _ => VolTask::Idle,
    }
}
