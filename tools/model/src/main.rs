//! `model [--deep] [--threads N]`: checks every mode and freshness answer (the
//! small configuration, or the deeper one), then the known-wrong variants,
//! printing state counts, times and counterexamples. Exits non-zero if the
//! product breaks a property or a wrong variant passes.

use model::{Check, Config, MODES, Mode, Variant, check};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let deep = args.iter().any(|a| a == "--deep");
    let threads = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let size = if deep { Config::deep } else { Config::small };
    let mut failed = false;
    for &(name, mode) in MODES {
        let outcome = check(size(name, mode), threads);
        println!("{}", outcome.report());
        failed |= !outcome.broken.is_empty() || !outcome.unreached.is_empty();
    }
    let wrong = [
        size("WRONG: policy mode, the check on the cache alone (as upstream)", Mode::Policy(Check::CacheAlone)),
        size("WRONG: default mode, the intent released before the PV is saved", Mode::Default)
            .with(Variant::ReleaseBeforeSave),
    ];
    for cfg in wrong {
        let outcome = check(cfg, threads);
        println!("{}", outcome.report());
        failed |= outcome.broken.is_empty();
    }
    if failed {
        std::process::exit(1);
    }
}
