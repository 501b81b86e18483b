//! Go's duration syntax (`time.ParseDuration` / `Duration.String`) for flag
//! values, so manifests written for the Go sidecar (`--timeout=15s`,
//! `--retry-interval-max=1m30s`) mean the same thing here.

use std::time::Duration;

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// Largest duration Go can represent (`math.MaxInt64` nanoseconds, ~292
/// years); anything longer is rejected as Go rejects it.
const MAX_NANOS: u128 = i64::MAX as u128;

/// Parses a Go duration: a sequence of decimal numbers, each with an optional
/// fraction and a mandatory unit (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), e.g.
/// `300ms`, `1.5h`, `2h45m`. A bare `0` is allowed without a unit.
///
/// Unlike Go, negative durations are an error: no flag of this program has a
/// meaning for them.
pub fn parse_go_duration(input: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {input:?}");
    let mut rest = input;
    if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    } else if rest.starts_with('-') {
        return Err(format!("negative duration {input:?} is not allowed"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }

    let mut total: u128 = 0;
    while !rest.is_empty() {
        // The number: digits, optionally a '.' and more digits; at least one
        // digit on either side of the point.
        let int_len = leading_digits(rest);
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(r) = rest.strip_prefix('.') {
            let frac_len = leading_digits(r);
            frac_part = &r[..frac_len];
            rest = &r[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }

        // The unit: everything up to the next number.
        let unit_len = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let unit_nanos: u128 = match unit {
            "" => return Err(format!("missing unit in duration {input:?}")),
            "ns" => 1,
            // U+00B5 (micro sign) and U+03BC (Greek mu), as Go accepts both.
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => NANOS_PER_SECOND,
            "m" => 60 * NANOS_PER_SECOND,
            "h" => 3_600 * NANOS_PER_SECOND,
            other => return Err(format!("unknown unit {other:?} in duration {input:?}")),
        };

        let whole = parse_bounded(int_part).ok_or_else(invalid)?;
        let mut nanos = whole.checked_mul(unit_nanos).ok_or_else(invalid)?;
        if !frac_part.is_empty() {
            // Digits beyond nanosecond precision cannot change the result
            // for any unit up to an hour; keep 20 so the arithmetic is exact.
            let kept = &frac_part[..frac_part.len().min(20)];
            let numerator = kept.parse::<u128>().map_err(|_| invalid())?;
            let scale = 10u128.pow(kept.len() as u32);
            nanos += numerator * unit_nanos / scale;
        }
        total += nanos;
        if total > MAX_NANOS {
            return Err(invalid());
        }
    }
    Ok(nanos_to_duration(total))
}

/// Formats a duration the way Go's `Duration.String` does (`1m30s`, `1.5s`,
/// `300ms`, `0s`), so messages quote values in the syntax the flags take.
pub fn format_go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < NANOS_PER_SECOND {
        let (unit, per_unit) = if nanos < 1_000 {
            ("ns", 1)
        } else if nanos < 1_000_000 {
            ("\u{b5}s", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", decimal(nanos, per_unit));
    }
    let hours = nanos / (3_600 * NANOS_PER_SECOND);
    let minutes = nanos / (60 * NANOS_PER_SECOND) % 60;
    let seconds = decimal(nanos % (60 * NANOS_PER_SECOND), NANOS_PER_SECOND);
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// `value / per_unit` written with the shortest exact decimal fraction.
fn decimal(value: u128, per_unit: u128) -> String {
    let whole = value / per_unit;
    let frac = value % per_unit;
    if frac == 0 {
        return whole.to_string();
    }
    let width = per_unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

fn leading_digits(s: &str) -> usize {
    s.bytes().take_while(u8::is_ascii_digit).count()
}

/// Parses the integer part of one number; `None` once it cannot fit in a Go
/// duration whatever the unit (an empty part, as in `.5s`, is zero).
fn parse_bounded(digits: &str) -> Option<u128> {
    let mut value: u128 = 0;
    for b in digits.bytes() {
        value = value * 10 + u128::from(b - b'0');
        if value > MAX_NANOS {
            return None;
        }
    }
    Some(value)
}

fn nanos_to_duration(nanos: u128) -> Duration {
    // Bounded by MAX_NANOS, so both parts fit.
    let secs = (nanos / NANOS_PER_SECOND) as u64;
    let sub = (nanos % NANOS_PER_SECOND) as u32;
    Duration::new(secs, sub)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_go_durations() {
        let cases: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("+0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("10s", Duration::from_secs(10)),
            ("+10s", Duration::from_secs(10)),
            ("1m30s", Duration::from_secs(90)),
            ("2m0s", Duration::from_secs(120)),
            ("500ms", ms(500)),
            ("1h", Duration::from_secs(3600)),
            ("1.5s", ms(1500)),
            (".5s", ms(500)),
            ("1.s", Duration::from_secs(1)),
            ("1.5h", Duration::from_secs(5400)),
            ("2h45m", Duration::from_secs(2 * 3600 + 45 * 60)),
            ("1h1m1s1ms1us1ns", Duration::new(3661, 1_001_001)),
            ("300us", Duration::from_micros(300)),
            ("300\u{b5}s", Duration::from_micros(300)),
            ("300\u{3bc}s", Duration::from_micros(300)),
            ("7ns", Duration::from_nanos(7)),
            ("0.000000001s", Duration::from_nanos(1)),
            // Beyond nanosecond precision is truncated, as in Go.
            ("0.0000000019s", Duration::from_nanos(1)),
            ("1.0000000000000000000000001s", Duration::from_secs(1)),
            ("00010s", Duration::from_secs(10)),
            ("5m", Duration::from_secs(300)),
            (
                "9223372036854775807ns",
                Duration::new(9_223_372_036, 854_775_807),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_go_duration(input).as_ref(),
                Ok(want),
                "input {input:?}"
            );
        }
    }

    #[test]
    fn rejects_what_go_rejects_and_negatives() {
        let cases: &[(&str, &str)] = &[
            ("", "invalid duration"),
            ("10", "missing unit"),
            ("1m30", "missing unit"),
            ("s", "invalid duration"),
            (".s", "invalid duration"),
            ("1..5s", "missing unit"),
            ("-1s", "negative duration"),
            ("-0", "negative duration"),
            ("10x", "unknown unit \"x\""),
            ("10 s", "unknown unit \" s\""),
            ("10S", "unknown unit \"S\""),
            ("1d", "unknown unit \"d\""),
            ("+", "invalid duration"),
            ("9223372036854775808ns", "invalid duration"),
            ("2562048h", "invalid duration"),
            ("99999999999999999999999h", "invalid duration"),
        ];
        for (input, want) in cases {
            let err = parse_go_duration(input).expect_err(input);
            assert!(
                err.contains(want),
                "input {input:?}: error {err:?} should contain {want:?}"
            );
        }
    }

    #[test]
    fn formats_like_go() {
        let cases: &[(Duration, &str)] = &[
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::from_micros(300), "300\u{b5}s"),
            (Duration::from_nanos(1_500), "1.5\u{b5}s"),
            (ms(500), "500ms"),
            (ms(1500), "1.5s"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::new(3661, 1_000_000), "1h1m1.001s"),
        ];
        for (d, want) in cases {
            assert_eq!(format_go_duration(*d), *want);
            assert_eq!(parse_go_duration(want).unwrap(), *d, "round trip {want}");
        }
    }
}
