//! The state of the modelled world: the API server's objects and the order it
//! wrote them in (the watch feed every cache replays), the Lease and the
//! clock, the replicas, the CSI driver's backend and its calls in flight, the
//! user, and what went wrong at the moment of an act.
//!
//! Claims are indexed by name `i`. Each claim the user makes under a name is
//! another object with a UID of its own: incarnation `k` of name `i` has UID
//! `u = i + k × names` (`State::name_of`). Its PV and backend volume are named
//! after the UID, so they are indexed by `u`, as is what a replica remembers
//! and does about that claim.

/// A claim as the API server has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Claim {
    /// Its UID's index (`u`).
    pub uid: u8,
    pub rv: u8,
    /// The binder handed it to our driver (`volume.kubernetes.io/storage-provisioner`).
    pub handed: bool,
    /// Our intent finalizer (and, in policy mode, its label).
    pub intent: bool,
    /// Its deletion timestamp is set (Terminating while a finalizer holds it).
    pub deleting: bool,
    /// `spec.volumeName` is set.
    pub bound: bool,
    /// The abandoned volume's handle is recorded on it.
    pub handle: bool,
    /// It is a clone of the claim of this name (`spec.dataSource`).
    pub clones: Option<u8>,
    /// Our cloning protection (`provisioner.storage.kubernetes.io/cloning-protection`):
    /// it is the source of a clone being made.
    pub protected: bool,
}

/// A PV's phase, as the binder sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Available,
    Bound,
    Released,
}

/// The PV of claim UID `u` (its claimRef is that claim, its handle its volume),
/// as the product saves it: reclaim policy Delete, held by our finalizer from
/// its creation (`provision::build_pv`) until the volume path drops it, which
/// removes it (nothing else deletes a PV here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pv {
    pub rv: u8,
    pub phase: Phase,
    /// Its deletion timestamp is set (Terminating while our finalizer holds it).
    pub deleting: bool,
}

/// One kind of object as the API server wrote it: the writes every replica's
/// cache has seen folded into `base`, the rest in order. A cache is a
/// position in it; it lags arbitrarily and replays in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Feed<T> {
    pub base: Vec<Option<T>>,
    /// (resourceVersion, object index, the object after the write).
    pub events: Vec<(u8, u8, Option<T>)>,
    /// Events folded into `base` so far.
    pub folded: u8,
}

impl<T: Copy> Feed<T> {
    pub fn new(n: usize) -> Feed<T> {
        Feed {
            base: vec![None; n],
            events: Vec::new(),
            folded: 0,
        }
    }

    /// Events written so far.
    pub fn written(&self) -> u8 {
        self.folded + self.events.len() as u8
    }

    /// Object `i` as a cache that has seen `seen` events shows it.
    pub fn at(&self, seen: u8, i: usize) -> Option<T> {
        let upto = usize::from(seen - self.folded);
        self.events[..upto]
            .iter()
            .rev()
            .find(|(_, at, _)| usize::from(*at) == i)
            .map_or(self.base[i], |(_, _, obj)| *obj)
    }

    /// Whether a cache that has seen `seen` events has every event of a
    /// version up to `version` (what a bookmark tells the product).
    pub fn caught_up(&self, seen: u8, version: u8) -> bool {
        let upto = usize::from(seen - self.folded);
        self.events.get(upto).is_none_or(|(rv, _, _)| *rv > version)
    }

    /// Folds the events every cache has seen into the base, so that states
    /// that differ only in history every cache is past are one state.
    pub fn fold(&mut self, seen: u8) {
        let n = usize::from(seen - self.folded);
        for (_, i, obj) in self.events.drain(..n) {
            self.base[usize::from(i)] = obj;
        }
        self.folded = seen;
    }
}

/// What one replica is doing about one claim: the claim path's sequence
/// (`controller::claim`), one step of it at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Task {
    Idle,
    // ---- create (create.rs, intent.rs, fresh.rs) ----
    /// Gather and confirm the copy decided on: a clone's source read and
    /// checked (`gather::for_create`), then the fenced intent write, or in
    /// policy mode (the copy holds the intent) the freshness answer. `round`
    /// counts the copies re-read within one attempt (`CONFIRM_ROUNDS`). In
    /// the steps that continue a freshness answer, `src` is whether the clone's
    /// source as read carried our protection.
    Confirm {
        copy: Claim,
        round: u8,
    },
    /// A version round or the write clock gave `version`: wait for the claim
    /// cache to catch up with it (or time out into a listing round).
    CatchUp {
        copy: Claim,
        round: u8,
        version: u8,
        src: bool,
    },
    /// Waiting for the first own PV create after `since` (the write clock).
    Clock {
        copy: Claim,
        round: u8,
        since: u8,
        src: bool,
    },
    /// A listing round.
    Listing {
        copy: Claim,
        round: u8,
        src: bool,
    },
    /// Confirmed, a clone: its source protected (`protect::protect`: nothing
    /// if the source as read carried the protection, else an edit of the
    /// source claim on its UID).
    Protect {
        src: bool,
    },
    /// Confirmed: the leader gate, then `CreateVolume` (unless this process
    /// has the answer already).
    Gate,
    /// `CreateVolume` sent, its answer awaited.
    Creating,
    /// WRONG variant: the intent dropped before the save.
    EarlyRelease,
    /// Save the PV (`AlreadyExists` of ours is done).
    Save,
    // ---- abandon (abandon.rs) ----
    /// Saved already? Else read the claim, find its volume.
    Abandon,
    /// The cleanup's `CreateVolume` (by name: the handle), gated.
    Find,
    Finding,
    /// The handle recorded on the claim before the volume is deleted.
    Record,
    /// `DeleteVolume`, gated (`controller::backend`).
    Delete,
    Deleting,
    /// The intent dropped (the claim goes, if deleted).
    ReleaseNow,
    // ---- default mode, bound with the intent (IntentReleaser) ----
    Release,
    // ---- a deleted clone source (protect::release_clone_source) ----
    /// No clone of it pending in the claim cache: its protection removed.
    ReleaseSource,
}

/// What one replica is doing about one PV: the volume path's deletion
/// (`controller::volume::delete`), decided by the product's own
/// `volume::decide::decide` on the cached copy, one step at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VolTask {
    Idle,
    /// Decided `Delete` on this cached copy: the leader gate, then
    /// `confirm_delete` (the DELETE fenced on its UID and resourceVersion
    /// when it is held and not Terminating; else, or on a conflict, a fresh
    /// read decided again with `still_to_delete`).
    Confirm {
        copy: Pv,
    },
    /// Confirmed (`terminating`: the PV as the API server answered it is
    /// being deleted): the leader gate, then `DeleteVolume`.
    Gate {
        terminating: bool,
    },
    Deleting {
        terminating: bool,
    },
    /// The volume is gone and the PV was not being deleted: DELETE it (UID
    /// precondition; our finalizer keeps it, Terminating).
    DeletePv,
    /// Our finalizer dropped: the PV goes.
    DropFinalizer,
}

/// What a replica's process remembers about a claim (`ClaimMemory`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Memory {
    /// The driver answered its `CreateVolume` (the handle is known).
    pub created: bool,
    pub pv_saved: bool,
    pub intent_released: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replica {
    /// Has held the Lease since it (re)started: its controllers run.
    pub started: bool,
    /// Its leader gate is open while the clock is before this.
    pub until: u8,
    pub claims_seen: u8,
    pub pvs_seen: u8,
    pub tasks: Vec<Task>,
    pub vols: Vec<VolTask>,
    pub memory: Vec<Memory>,
    /// The volume path's memory (`VolumeEntry::deleted`): this process
    /// finished the PV's deletion; forgotten when the PV's deletion reaches
    /// its cache (`volume::forget_deleted`).
    pub pv_deleted: Vec<bool>,
    /// The version of this process's latest PV create (its write clock).
    pub clock: u8,
}

/// A CSI call sent and not yet run by the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Call {
    pub replica: u8,
    /// The claim UID whose volume it names.
    pub uid: u8,
    pub kind: CallKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// `CreateVolume` by the claim's name, from the create sequence.
    Create,
    /// The same, from the cleanup of a deleted claim.
    Find,
    /// `DeleteVolume` from the cleanup.
    DeleteAbandoned,
    /// `DeleteVolume` from the volume path.
    DeleteReleased,
}

/// The backend's volume of one claim UID's name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Volume {
    pub exists: bool,
    /// Volumes made under this name so far.
    pub made: u8,
}

/// Where the user is with one claim (one UID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum User {
    NotYet,
    Created,
    Deleted,
}

/// Acts that broke an invariant at the moment they ran (bits of `State::broken`).
pub const CREATED_FOR_GONE_CLAIM: u8 = 1;
pub const DELETED_BOUND_VOLUME: u8 = 2;
pub const DELETED_CLONE_SOURCE: u8 = 4;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub now: u8,
    /// The API server's revision (claims and PVs share it: one etcd).
    pub rv: u8,
    /// By name.
    pub claims: Vec<Option<Claim>>,
    /// The name of the claim that claim 0 is a clone of (the clone
    /// configurations): bound already at the start, with its PV and volume.
    pub source: Option<u8>,
    /// By claim UID, as are `volumes`, `user` and each replica's `tasks`,
    /// `vols`, `memory` and `pv_deleted`.
    pub pvs: Vec<Option<Pv>>,
    pub claim_feed: Feed<Claim>,
    pub pv_feed: Feed<Pv>,
    /// The Lease: holder and the time it expires at.
    pub lease: Option<(u8, u8)>,
    pub replicas: Vec<Replica>,
    pub volumes: Vec<Volume>,
    /// CSI calls in flight, oldest first; the driver runs one call per
    /// volume name at a time, in the order sent (its per-volume lock).
    pub calls: Vec<Call>,
    pub user: Vec<User>,
    pub timeouts: u8,
    pub crashes: u8,
    pub ticks: u8,
    pub broken: u8,
}

impl State {
    /// The name of claim UID `u`.
    pub fn name_of(&self, u: usize) -> usize {
        u % self.claims.len()
    }

    /// The UIDs name `i` may have.
    pub fn uids_of(&self, i: usize) -> impl Iterator<Item = usize> + use<> {
        (i..self.user.len()).step_by(self.claims.len())
    }

    /// The name of the claim that the claim of UID `u` is a clone of.
    pub fn clones(&self, u: usize) -> Option<u8> {
        self.source.filter(|_| self.name_of(u) == 0)
    }

    /// The claim of UID `u`, if the API server still has it.
    pub fn claim_of(&self, u: usize) -> Option<Claim> {
        self.claims[self.name_of(u)].filter(|c| usize::from(c.uid) == u)
    }

    pub fn claim_cache(&self, r: usize, i: usize) -> Option<Claim> {
        self.claim_feed.at(self.replicas[r].claims_seen, i)
    }

    pub fn pv_cache(&self, r: usize, u: usize) -> Option<Pv> {
        self.pv_feed.at(self.replicas[r].pvs_seen, u)
    }

    pub fn gate_open(&self, r: usize) -> bool {
        self.now < self.replicas[r].until
    }

    /// Writes claim `i` (`None`: removed). A deleted claim without a
    /// finalizer is removed by the same write.
    pub fn write_claim(&mut self, i: usize, claim: Option<Claim>) {
        self.rv += 1;
        let claim = claim
            .filter(|c| !c.deleting || c.intent || c.protected)
            .map(|c| Claim { rv: self.rv, ..c });
        self.claims[i] = claim;
        self.claim_feed.events.push((self.rv, i as u8, claim));
    }

    pub fn write_pv(&mut self, u: usize, pv: Option<Pv>) {
        self.rv += 1;
        let pv = pv.map(|p| Pv { rv: self.rv, ..p });
        self.pvs[u] = pv;
        self.pv_feed.events.push((self.rv, u as u8, pv));
    }

    /// Folds what every cache has seen. A replica that is not running has no
    /// cache to speak of: it lists when it starts, so it is kept at the end.
    pub fn compact(&mut self) {
        let (claims, pvs) = (self.claim_feed.written(), self.pv_feed.written());
        for rep in self.replicas.iter_mut().filter(|r| !r.started) {
            rep.claims_seen = claims;
            rep.pvs_seen = pvs;
        }
        let claims = self.replicas.iter().map(|r| r.claims_seen).min();
        let pvs = self.replicas.iter().map(|r| r.pvs_seen).min();
        self.claim_feed.fold(claims.unwrap_or(0));
        self.pv_feed.fold(pvs.unwrap_or(0));
    }
}
