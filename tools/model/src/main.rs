//! `model [--deep] [--threads N] [--only TEXT] [--size NAME] [--recreations N]`:
//! checks every mode and freshness answer (the small configurations: faults,
//! takeover and recreation; or the deep ones: deep and deep-recreation), then
//! the known-wrong variants, printing state counts, times and
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
    // `--recreations N`: claims the user may re-create under each name (else
    // the configuration's own).
    let recreations: Option<u8> = value("--recreations").and_then(|n| n.parse().ok());
    let sized = |cfg: Config| match recreations {
        Some(n) => Config {
            recreations: n,
            ..cfg
        },
        None => cfg,
    };
    type Size = fn(&'static str, model::Mode) -> Config;
    let sizes: &[(&str, Size)] = if deep {
        &[
            ("deep", Config::deep),
            ("deep-recreation", Config::deep_recreation),
        ]
    } else {
        &[
            ("faults", Config::faults),
            ("takeover", Config::takeover),
            ("recreation", Config::recreation),
            ("clone", Config::clone),
        ]
    };
    // `--size NAME`: that size only (and no wrong variant).
    let size_only = value("--size");
    let sizes = sizes
        .iter()
        .filter(|(name, _)| size_only.as_deref().is_none_or(|only| only == *name));
    let mut failed = false;
    for &(name, mode) in MODES.iter().filter(|(name, _)| name.contains(&only)) {
        for (_, size) in sizes.clone() {
            let cfg = sized(size(name, mode));
            let outcome = check(cfg.clone(), threads);
            println!("{} [{}]", outcome.report(), describe(&cfg));
            failed |= !outcome.broken.is_empty() || !outcome.unreached.is_empty();
        }
    }
    // The product before the fix of the findings (docs/reliability.md F1, F2),
    // under the takeover: its counterexamples.
    if args.iter().any(|a| a == "--ungated-save") {
        for &(name, mode) in MODES.iter().filter(|(name, _)| name.contains(&only)) {
            let cfg = sized(Config::takeover(name, mode).with(model::Variant::UngatedSave));
            let outcome = check(cfg.clone(), threads);
            println!("UNGATED SAVE: {} [{}]", outcome.report(), describe(&cfg));
        }
    }
    for (cfg, done) in model::wrong_variants() {
        if !cfg.name.contains(&only) || size_only.is_some() {
            continue;
        }
        let cfg = sized(cfg);
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
        "{} claim(s), {} re-creation(s) each{}, x {} replicas, faults: {} lost answer(s), {} crash(es), {} lease expiry",
        cfg.claims,
        cfg.recreations,
        if cfg.recreations > 0 && !cfg.delete_recreated {
            " (kept)"
        } else {
            ""
        },
        cfg.replicas,
        cfg.timeouts,
        cfg.crashes,
        cfg.ticks
    )
}
