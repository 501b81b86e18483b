//! `model [--deep] [--threads N] [--only TEXT]`: checks every mode and
//! freshness answer (the small configurations, faults and takeover, or the
//! deep one), then the known-wrong variants, printing state counts, times and
//! counterexamples. Exits non-zero if the product breaks a property or a
//! wrong variant passes.

use model::{Config, MODES, Outcome, check, check_until};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let deep = args.iter().any(|a| a == "--deep");
    let threads = value("--threads").and_then(|n| n.parse().ok()).unwrap_or(1);
    // `--only TEXT`: the configurations whose name contains TEXT.
    let only = value("--only").unwrap_or_default();
    let sizes: &[fn(&'static str, model::Mode) -> Config] = if deep {
        &[Config::deep]
    } else {
        &[Config::faults, Config::takeover]
    };
    let mut failed = false;
    for &(name, mode) in MODES.iter().filter(|(name, _)| name.contains(&only)) {
        for size in sizes {
            let cfg = size(name, mode);
            let outcome = check(cfg.clone(), threads);
            println!("{} [{}]", outcome.report(), describe(&cfg));
            failed |= !outcome.broken.is_empty() || !outcome.unreached.is_empty();
        }
    }
    // The product before the fix of the findings (docs/reliability.md F1, F2),
    // under the takeover: its counterexamples.
    if args.iter().any(|a| a == "--ungated-save") {
        for &(name, mode) in MODES.iter().filter(|(name, _)| name.contains(&only)) {
            let cfg = Config::takeover(name, mode).with(model::Variant::UngatedSave);
            let outcome = check(cfg.clone(), threads);
            println!("UNGATED SAVE: {} [{}]", outcome.report(), describe(&cfg));
        }
    }
    for (cfg, done) in model::wrong_variants() {
        if !cfg.name.contains(&only) {
            continue;
        }
        let outcome: Outcome = check_until(cfg.clone(), threads, done);
        println!("{} [{}]", outcome.report(), describe(&cfg));
        failed |= outcome.broken.is_empty();
    }
    if failed {
        std::process::exit(1);
    }
}

fn describe(cfg: &Config) -> String {
    format!(
        "{} claim(s) x {} replicas, faults: {} lost answer(s), {} crash(es), {} lease expiry",
        cfg.claims, cfg.replicas, cfg.timeouts, cfg.crashes, cfg.ticks
    )
}
