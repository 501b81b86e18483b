//! What one run of the checker models: the mode, the freshness answer, the
//! size (claims × replicas × faults), and the known-wrong variants that must
//! fail.

/// Who makes the intent durable (docs/compatibility.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The sidecar's fenced intent write before every `CreateVolume`; the
    /// sidecar releases the intent once the claim is bound.
    Default,
    /// `--admission-intent` with both policies: the intent is added in the
    /// binder's hand-off update and removed in its bind update; a claim that
    /// holds it is confirmed by the freshness answer given.
    Policy(Check),
}

/// How policy mode confirms the cached copy of a claim that holds the intent
/// (`kube::fresh`, `kube::clock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Check {
    /// One consistent read of the claim (`Fresh::Read`).
    Read,
    /// A version round: the API server's current version, then the claim
    /// cache caught up with it, or a listing round if it does not in time.
    VersionRound,
    /// A listing round at once: the labelled claims, each with its version.
    ListingRound,
    /// The version of the first of this replica's PV creates after the check
    /// began (shared revision space), else a version round.
    WriteClock,
    /// WRONG (upstream's): the cached copy is taken as the claim.
    CacheAlone,
}

/// A change to the product's protocol that must be caught.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The product as it is: its PV save passes the leader gate, as
    /// `CreateVolume` does (a replica paused past its lease saves nothing when
    /// it resumes; the new leader saves it).
    Product,
    /// WRONG: the intent is dropped as soon as `CreateVolume` answers, before
    /// the PV is saved.
    ReleaseBeforeSave,
    /// WRONG (the product before 2026-12-07, and upstream): the PV save does
    /// not pass the leader gate, so a replica paused past its lease saves the
    /// PV when it resumes (the model's findings F1 and F2).
    UngatedSave,
}

/// One configuration of the checker.
#[derive(Clone, Debug)]
pub struct Config {
    pub name: &'static str,
    pub mode: Mode,
    pub variant: Variant,
    /// Claim names the user creates claims under (and may delete).
    pub claims: usize,
    /// Claims the user may create again under each name once the claim of
    /// that name is gone (same name, a new UID).
    pub recreations: u8,
    /// Whether the user may delete a re-created claim too (else it stays,
    /// and must get its PV).
    pub delete_recreated: bool,
    /// Claim 0 is a clone of another claim of ours, bound with its PV and
    /// volume from the start, which the user may delete at any moment.
    pub clone: bool,
    /// Sidecar replicas contending for the Lease.
    pub replicas: usize,
    /// CSI calls whose answer may be lost (a timeout, before or after the
    /// driver acted).
    pub timeouts: u8,
    /// Replica crashes (memory and caches lost, restart with a fresh list).
    pub crashes: u8,
    /// Ticks the clock may advance (each may expire a lease).
    pub ticks: u8,
    /// Steps the fair completion may take before a liveness failure is called.
    pub settle_steps: usize,
}

impl Config {
    /// One claim, two replicas, and either the faults or the takeover: the
    /// small configurations `cargo test` checks for each mode.
    fn one_claim(name: &'static str, mode: Mode) -> Config {
        Config {
            name,
            mode,
            variant: Variant::Product,
            claims: 1,
            recreations: 0,
            delete_recreated: true,
            clone: false,
            replicas: 2,
            timeouts: 0,
            crashes: 0,
            ticks: 0,
            settle_steps: 400,
        }
    }

    /// One lost answer and one crash (the Lease never expires: one leader).
    pub fn faults(name: &'static str, mode: Mode) -> Config {
        Config {
            timeouts: 1,
            crashes: 1,
            ..Config::one_claim(name, mode)
        }
    }

    /// One lease expiry: the leader paused past it, the other replica taking
    /// over with a cache of its own, the first resuming (no other fault).
    pub fn takeover(name: &'static str, mode: Mode) -> Config {
        Config {
            ticks: 1,
            ..Config::one_claim(name, mode)
        }
    }

    /// A claim deleted at any moment and created again under the same name
    /// (a new UID), which stays; no fault: the stale caches and the orderings
    /// alone.
    pub fn recreation(name: &'static str, mode: Mode) -> Config {
        Config {
            recreations: 1,
            delete_recreated: false,
            ..Config::one_claim(name, mode)
        }
    }

    /// The same, the re-created claim deleted at any moment too
    /// (`make model-deep`: thirty times the states).
    pub fn deep_recreation(name: &'static str, mode: Mode) -> Config {
        Config {
            delete_recreated: true,
            ..Config::recreation(name, mode)
        }
    }

    /// A clone of a bound claim, either deleted at any moment; no fault.
    pub fn clone(name: &'static str, mode: Mode) -> Config {
        Config {
            clone: true,
            ..Config::one_claim(name, mode)
        }
    }

    /// All of it at once: a lost answer, a crash and a takeover
    /// (`make model-deep`).
    pub fn deep(name: &'static str, mode: Mode) -> Config {
        Config {
            timeouts: 1,
            crashes: 1,
            ticks: 1,
            ..Config::one_claim(name, mode)
        }
    }

    pub fn with(mut self, variant: Variant) -> Config {
        self.variant = variant;
        self
    }

    pub fn policy(&self) -> bool {
        matches!(self.mode, Mode::Policy(_))
    }
}

/// Every mode and freshness answer the product has.
pub const MODES: &[(&str, Mode)] = &[
    ("default mode (fenced intent write)", Mode::Default),
    ("policy mode, consistent read", Mode::Policy(Check::Read)),
    (
        "policy mode, version round",
        Mode::Policy(Check::VersionRound),
    ),
    (
        "policy mode, listing round",
        Mode::Policy(Check::ListingRound),
    ),
    ("policy mode, write clock", Mode::Policy(Check::WriteClock)),
];

/// The known-wrong variants, each with the counterexamples it must give (the
/// checker stops once it has them).
pub fn wrong_variants() -> Vec<(Config, stateright::HasDiscoveries)> {
    use crate::properties::{NO_CREATE_FOR_GONE, NO_LEAK};
    let cache_alone = Config {
        timeouts: 1,
        ..Config::takeover(
            "WRONG: policy mode, the check on the cache alone (as upstream)",
            Mode::Policy(Check::CacheAlone),
        )
    };
    let early_release = Config::faults(
        "WRONG: default mode, the intent released before the PV is saved",
        Mode::Default,
    )
    .with(Variant::ReleaseBeforeSave);
    let all =
        |names: &[&'static str]| stateright::HasDiscoveries::AllOf(names.iter().copied().collect());
    vec![
        (cache_alone, all(&[NO_CREATE_FOR_GONE, NO_LEAK])),
        (early_release, all(&[NO_LEAK])),
    ]
}
