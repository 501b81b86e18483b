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

/// Finding F3 (docs/reliability.md, "Found by the model, and fixed: a clone
/// sent after its source vanished"), the checker's path replayed step by
/// step, default mode, no fault: the clone's source is read bound and
/// unprotected; the user deletes the source, which goes at once; the
/// protection's edit finds it gone. Before the fix `protect::protect` took
/// `Edited::Gone` as done and `CreateVolume` went out naming the source's
/// volume, which the volume path deleted while that call was in flight; now
/// the attempt fails there, nothing is sent, and the source's volume is
/// deleted with no clone of it under way.
#[test]
fn finding_f3_a_clone_is_not_sent_once_its_source_is_gone() {
    use model::properties::NO_CLONE_SOURCE_DELETE;
    use model::state::DELETED_CLONE_SOURCE;
    use model::{Action, Protocol, product::Act};
    use stateright::Model;

    let protocol = Protocol::new(Config::clone("default mode", Mode::Default));
    let mut s = protocol.init_states().remove(0);
    let enabled = |s: &model::state::State| {
        let mut enabled = Vec::new();
        protocol.actions(s, &mut enabled);
        enabled
    };
    let path = [
        Action::UserCreates(0),
        Action::HandOff(0),
        Action::Lead(1),
        Action::Decide(1, 0, Act::Create),
        // The source read (bound, unprotected) and the fenced intent write.
        Action::Step(1, 0),
        // The source deleted: no finalizer holds it.
        Action::UserDeletes(1),
        Action::Release(1),
        Action::PvEvent(1),
        // The protection's edit: the source is gone; the attempt fails.
        Action::Step(1, 0),
        // The volume path deletes the source's volume: the only call.
        Action::VolDecide(1, 1),
        Action::VolStep(1, 1),
        Action::VolStep(1, 1),
        Action::Run(0),
    ];
    for (i, action) in path.into_iter().enumerate() {
        assert!(
            enabled(&s).contains(&action),
            "{action} not enabled in {}",
            model::trace::summary(&s)
        );
        s = protocol.next_state(&s, action).expect("a step");
        if i == 8 {
            assert!(
                !enabled(&s).contains(&Action::Step(1, 0)),
                "the failed attempt goes no further: {}",
                model::trace::summary(&s)
            );
        }
    }
    assert_eq!(
        s.broken & DELETED_CLONE_SOURCE,
        0,
        "{NO_CLONE_SOURCE_DELETE}: {}",
        model::trace::summary(&s)
    );
}

/// The clone configuration in every mode (a bound claim cloned, either
/// deleted at any moment): every property holds (before the fix of F3, its
/// property broke in each).
#[test]
fn finding_f3_clones_hold_in_every_mode() {
    for &(name, mode) in model::MODES {
        holds(Config::clone(name, mode));
    }
}
