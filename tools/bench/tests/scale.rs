//! The scale profile at its smallest, so that CI notices when it breaks: 1,000 bound pairs,
//! a burst of 50 claims, 10 s of idling, every contender once, on a control plane the
//! benchmark starts for itself (as in smoke.rs: the benchmark makes the provisioner identity
//! a cluster admin). It checks that each phase ran and measured something, not how fast.
//!
//! Needs what `make test` builds first: the test bed (testbed/build.sh) and the workspace's
//! binaries (`cargo build --workspace --bins`), taken from the directory of this package's
//! own binary.

mod common;

use std::time::Instant;

use serde_json::Value;

const PAIRS: u64 = 1000;
const BURST: u64 = 50;

#[test]
fn the_scale_profile_at_a_thousand_pairs_measures_every_phase() {
    let t0 = Instant::now();
    let (pairs, burst) = (PAIRS.to_string(), BURST.to_string());
    let run = common::run(
        "scale",
        "scale",
        &["--pairs", &pairs, "--burst", &burst, "--idle-secs", "10"],
    );
    let (stdout, results) = (&run.stdout, &run.results);
    eprintln!("the scale profile at {PAIRS} pairs took {:?}", t0.elapsed());
    for table in [
        "#### Idle RSS (MiB, VmRSS after idling)",
        "#### Forced relist: cut → PV of a claim created after the cut (s)",
        "#### The test bed at each size",
        "| 1,000 |",
    ] {
        assert!(
            stdout.contains(table),
            "no `{table}` in the report:\n{stdout}"
        );
    }

    let positive = |r: &Value, path: &[&str]| {
        let v = path.iter().fold(r, |v, k| &v[*k]);
        assert!(
            v.as_f64().is_some_and(|x| x > 0.0),
            "{} {}: {v} in {r}",
            r["who"],
            path.join(".")
        );
    };
    for r in results {
        let who = r["who"].as_str().unwrap_or("?");
        assert_eq!(r["notes"], Value::Array(vec![]), "{who}: {}", r["notes"]);
        assert_eq!(r["scale"]["pairs"].as_u64(), Some(PAIRS), "{who}");
        for field in ["claims", "provisioned", "bound"] {
            assert_eq!(r[field].as_u64(), Some(BURST), "{who}: {field}");
        }
        assert!(r["all_gone_secs"].as_f64().is_some(), "{who}: not deleted");
        for path in [
            &["startup_secs"][..],
            &["startup_bytes"],
            &["idle_rss_kib"],
            &["peak_rss_kib"],
            &["cpu_provision_secs"],
            &["scale", "startup_peak_kib"],
            &["scale", "relist", "secs"],
            &["scale", "relist", "peak_kib"],
            &["scale", "relist", "bytes"],
            &["scale", "control_plane", "apiserver_rss_kib"],
            &["scale", "control_plane", "etcd_db_bytes"],
        ] {
            positive(r, path);
        }
        // The cut made the contender list again, not merely watch again.
        assert!(
            r["scale"]["relist"]["gone"].as_u64() >= Some(1),
            "{who}: {}",
            r["scale"]["relist"]
        );
        assert_eq!(
            r["api_provision"]["create persistentvolumes"].as_f64(),
            Some(BURST as f64),
            "{who}: the API server counted its requests through the proxy: {}",
            r["api_provision"]
        );
        if who != "floor" {
            positive(r, &["scale", "scrape_secs"]);
            positive(r, &["scale", "scrape_bytes"]);
        }
    }
    let of = |who: &str| {
        results
            .iter()
            .find(|r| r["who"] == who)
            .unwrap_or_else(|| panic!("{who} ran"))
    };
    // The first size had the cluster filled for it.
    assert_eq!(
        of("ours")["scale"]["fill"]["added"].as_u64(),
        Some(PAIRS),
        "{}",
        of("ours")["scale"]["fill"]
    );
    // One audit, in ours' turn, finding nothing: every volume of the driver has its PV.
    let audit = &of("ours")["scale"]["audit"];
    assert_eq!(audit["exit"].as_i64(), Some(0), "{audit}");
    assert_eq!(audit["findings"].as_u64(), Some(0), "{audit}");
    positive(of("ours"), &["scale", "audit", "secs"]);
    positive(of("ours"), &["scale", "audit", "peak_kib"]);
    assert!(of("upstream")["scale"]["audit"].is_null());
    let idle = |who: &str| of(who)["idle_rss_kib"].as_u64().unwrap_or(u64::MAX);
    assert!(
        idle("ours") < idle("upstream"),
        "ours idles in less memory than upstream with {PAIRS} pairs: {} KiB against {} KiB",
        idle("ours"),
        idle("upstream")
    );
}
