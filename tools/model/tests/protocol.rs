//! The small configuration of every mode and freshness answer passes; each
//! known-wrong variant is caught with a counterexample (printed with
//! `--nocapture`). The deeper run is `make model-deep`.

use model::properties::{NO_CREATE_FOR_GONE, NO_LEAK};
use model::{Check, Config, Mode, Variant, check};

fn passes(name: &'static str, mode: Mode) {
    let outcome = check(Config::small(name, mode), 1);
    println!("{}", outcome.report());
    assert!(outcome.broken.is_empty(), "{}", outcome.report());
    assert!(outcome.unreached.is_empty(), "{}", outcome.report());
}

#[test]
fn default_mode_keeps_every_invariant() {
    passes("default mode", Mode::Default);
}

#[test]
fn policy_mode_with_a_consistent_read_keeps_every_invariant() {
    passes("policy mode, read", Mode::Policy(Check::Read));
}

#[test]
fn policy_mode_with_version_rounds_keeps_every_invariant() {
    passes("policy mode, version round", Mode::Policy(Check::VersionRound));
}

#[test]
fn policy_mode_with_listing_rounds_keeps_every_invariant() {
    passes("policy mode, listing round", Mode::Policy(Check::ListingRound));
}

#[test]
fn policy_mode_with_the_write_clock_keeps_every_invariant() {
    passes("policy mode, write clock", Mode::Policy(Check::WriteClock));
}

/// The names of the properties a wrong variant broke.
fn broken_by(cfg: Config) -> Vec<&'static str> {
    let outcome = check(cfg, 1);
    println!("{}", outcome.report());
    outcome.broken.iter().map(|(name, _)| *name).collect()
}

#[test]
fn the_check_on_the_cache_alone_is_caught() {
    let broken = broken_by(Config::small(
        "WRONG: the check on the cache alone",
        Mode::Policy(Check::CacheAlone),
    ));
    assert!(broken.contains(&NO_CREATE_FOR_GONE), "{broken:?}");
    assert!(broken.contains(&NO_LEAK), "{broken:?}");
}

#[test]
fn the_intent_released_before_the_pv_is_saved_is_caught() {
    let broken = broken_by(
        Config::small("WRONG: the intent released before the save", Mode::Default)
            .with(Variant::ReleaseBeforeSave),
    );
    assert!(broken.contains(&NO_LEAK), "{broken:?}");
}
