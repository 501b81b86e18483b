//! The small configurations of every mode and freshness answer pass (one
//! claim, two replicas; lost answers and a crash, or a takeover); each
//! known-wrong variant is caught with a counterexample (printed with
//! `--nocapture`). The deep configuration is `make model-deep`.

use model::properties::{NO_CREATE_FOR_GONE, NO_LEAK};
use model::{Check, Config, Mode, check, check_until, wrong_variants};

fn passes(name: &'static str, mode: Mode) {
    for cfg in [Config::faults(name, mode), Config::takeover(name, mode)] {
        let outcome = check(cfg, 1);
        println!("{}", outcome.report());
        assert!(outcome.broken.is_empty(), "{}", outcome.report());
        assert!(outcome.unreached.is_empty(), "{}", outcome.report());
    }
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

/// The names of the properties the wrong variant named `which` broke.
fn broken_by(which: &str) -> Vec<&'static str> {
    let (cfg, done) = wrong_variants()
        .into_iter()
        .find(|(cfg, _)| cfg.name.contains(which))
        .expect("a wrong variant of that name");
    let outcome = check_until(cfg, 1, done);
    println!("{}", outcome.report());
    outcome.broken.iter().map(|(name, _)| *name).collect()
}

#[test]
fn the_check_on_the_cache_alone_is_caught() {
    let broken = broken_by("cache alone");
    assert!(broken.contains(&NO_CREATE_FOR_GONE), "{broken:?}");
    assert!(broken.contains(&NO_LEAK), "{broken:?}");
}

#[test]
fn the_intent_released_before_the_pv_is_saved_is_caught() {
    let broken = broken_by("released before");
    assert!(broken.contains(&NO_LEAK), "{broken:?}");
}
