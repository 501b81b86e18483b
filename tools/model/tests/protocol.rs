//! Every mode and freshness answer, one claim and two replicas: with a lost
//! answer and a crash every property holds; with a lease expiry (the leader
//! paused past it, resuming) too, now that the PV save is behind the leader
//! gate; with the claim deleted and created again under its name (a new UID)
//! too; the product before that fix gives the counterexamples of
//! docs/reliability.md ("Found by the model", F1 and F2). Each known-wrong
//! variant is caught. Traces: `cargo test -p model -- --nocapture`, or `make model`.

use model::properties::{LIVE, NO_BOUND_DELETE, NO_CREATE_FOR_GONE, NO_LEAK, ONE_VOLUME};
use model::{Check, Config, Mode, Variant, check, check_until, wrong_variants};

fn holds(cfg: Config) {
    let outcome = check(cfg, 1);
    println!("{}", outcome.report());
    assert!(outcome.broken.is_empty(), "{}", outcome.report());
    assert!(outcome.unreached.is_empty(), "{}", outcome.report());
}

/// The product under a takeover breaks nothing; the product before the fix
/// (its save not behind the leader gate) breaks exactly `found` (the findings).
fn takeover(name: &'static str, mode: Mode, found: &[&str]) {
    holds(Config::takeover(name, mode));
    let outcome = check(Config::takeover(name, mode).with(Variant::UngatedSave), 1);
    println!("{}", outcome.report());
    let broken: Vec<&str> = outcome.broken.iter().map(|(name, _)| *name).collect();
    assert_eq!(broken, found, "{}", outcome.report());
}

const POLICY_FINDING: &[&str] = &[ONE_VOLUME, NO_BOUND_DELETE, NO_CREATE_FOR_GONE, NO_LEAK];

#[test]
fn default_mode() {
    holds(Config::faults("default mode", Mode::Default));
    holds(Config::recreation("default mode", Mode::Default));
    takeover("default mode", Mode::Default, &[NO_BOUND_DELETE]);
}

#[test]
fn policy_mode_with_a_consistent_read() {
    let mode = Mode::Policy(Check::Read);
    holds(Config::faults("policy mode, read", mode));
    holds(Config::recreation("policy mode, read", mode));
    takeover("policy mode, read", mode, POLICY_FINDING);
}

#[test]
fn policy_mode_with_version_rounds() {
    let mode = Mode::Policy(Check::VersionRound);
    holds(Config::faults("policy mode, version round", mode));
    holds(Config::recreation("policy mode, version round", mode));
    takeover("policy mode, version round", mode, POLICY_FINDING);
}

#[test]
fn policy_mode_with_listing_rounds() {
    let mode = Mode::Policy(Check::ListingRound);
    holds(Config::faults("policy mode, listing round", mode));
    holds(Config::recreation("policy mode, listing round", mode));
    takeover("policy mode, listing round", mode, POLICY_FINDING);
}

#[test]
fn policy_mode_with_the_write_clock() {
    let mode = Mode::Policy(Check::WriteClock);
    holds(Config::faults("policy mode, write clock", mode));
    holds(Config::recreation("policy mode, write clock", mode));
    takeover("policy mode, write clock", mode, POLICY_FINDING);
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
    assert!(!broken.contains(&LIVE), "{broken:?}");
}
