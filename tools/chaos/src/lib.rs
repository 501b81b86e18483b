//! Chaos runs against the test bed: N replicas of a sidecar (ours or upstream's), behind
//! the fault-injecting API proxy, provisioning for the fault-injecting test driver while
//! claims come and go, the API misbehaves, the driver fails and crashes, sidecars are
//! SIGKILLed, the Lease holder is frozen past its lease, and (on a control plane of its
//! own) kube-apiserver and etcd restart. At the end an invariant checker compares the driver's ledger with the API.
//! In policy mode the shipped intent policies are installed (and removed mid-run as a fault).
//! See docs/reliability.md.

pub mod check;
pub mod faults;
pub mod intent;
pub mod policies;
pub mod procs;
pub mod report;
pub mod run;
pub mod scenarios;
pub mod sweep;
pub mod timetravel;
pub mod world;

pub use faults::FaultMix;
pub use report::Report;
pub use run::{ChaosConfig, run};
pub use scenarios::Scenario;
pub use world::{Sidecar, Testbed};

/// Parses a Go-style duration made of `h`, `m`, `s`, `ms` parts (`90s`, `5m`, `1m30s`).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let mut total = 0f64;
    let mut number = String::new();
    let mut chars = s.trim().chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let unit = if c == 'm' && chars.peek() == Some(&'s') {
            chars.next();
            0.001
        } else {
            match c {
                'h' => 3600.0,
                'm' => 60.0,
                's' => 1.0,
                _ => return Err(format!("bad duration {s:?}")),
            }
        };
        let n: f64 = number.parse().map_err(|_| format!("bad duration {s:?}"))?;
        total += n * unit;
        number.clear();
        any = true;
    }
    if !number.is_empty() || !any {
        return Err(format!("bad duration {s:?} (use e.g. 90s, 5m, 1m30s)"));
    }
    Ok(std::time::Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn parses_go_style_durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("90").is_err());
        assert!(parse_duration("x").is_err());
    }
}
