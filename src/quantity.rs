//! Kubernetes resource quantities as byte counts: parse a PVC's requested
//! storage, and format a volume's size the way Go's `BinarySI` does.

/// Why a quantity could not be read as bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantityError {
    Malformed,
    Negative,
    TooLarge,
}

/// Parses a quantity (`1Gi`, `500M`, `1.5Gi`, `1e9`, `123`, `1500m`) into a
/// whole number of bytes, rounding fractions up as `Quantity.Value()` does.
/// The one quantity parser of the crate: claims' sizes and byte flags.
pub fn parse(s: &str) -> Result<u64, QuantityError> {
    use QuantityError::*;
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(Negative);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(Malformed);
    }
    // Bounds that keep every product below in u128.
    if int_part.len() + frac_part.len() > 20 {
        return Err(Malformed);
    }
    let mantissa: u128 = format!("{int_part}{frac_part}")
        .parse()
        .map_err(|_| Malformed)?;
    let (shift, exp10): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        e if e.len() > 1 && e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| Malformed)?;
            if exp.abs() > 18 {
                return Err(Malformed);
            }
            (0, exp)
        }
        _ => return Err(Malformed),
    };
    let mut numerator = mantissa << shift;
    let mut denominator = 10u128.pow(frac_part.len() as u32);
    if exp10 >= 0 {
        numerator = numerator
            .checked_mul(10u128.pow(exp10.unsigned_abs()))
            .ok_or(TooLarge)?;
    } else {
        denominator *= 10u128.pow(exp10.unsigned_abs());
    }
    u64::try_from(numerator.div_ceil(denominator)).map_err(|_| TooLarge)
}

/// A claim's size in bytes, as CSI's `int64` takes it; `None` if malformed,
/// negative or too large.
pub fn parse_bytes(s: &str) -> Option<i64> {
    parse(s).ok().and_then(|b| i64::try_from(b).ok())
}

/// Formats bytes like Go's `resource.NewQuantity(n, BinarySI).String()`: the
/// largest binary suffix that divides exactly, else a plain number.
pub fn format_bytes(bytes: i64) -> String {
    const SUFFIXES: [(&str, i64); 6] = [
        ("Ei", 1 << 60),
        ("Pi", 1 << 50),
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    if bytes != 0 {
        for (suffix, unit) in SUFFIXES {
            if bytes % unit == 0 {
                return format!("{}{suffix}", bytes / unit);
            }
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_quantities() {
        let table: [(&str, Option<i64>); 16] = [
            ("1Gi", Some(1 << 30)),
            ("1Mi", Some(1 << 20)),
            ("1.5Gi", Some(3 << 29)),
            ("500M", Some(500_000_000)),
            ("1G", Some(1_000_000_000)),
            ("1e3", Some(1000)),
            ("1E6", Some(1_000_000)),
            ("123", Some(123)),
            ("+5", Some(5)),
            ("1500m", Some(2)),
            ("0.1", Some(1)),
            ("", None),
            ("-1Gi", None),
            ("1Xi", None),
            ("1..2", None),
            ("100Ei", None),
        ];
        for (input, want) in table {
            assert_eq!(parse_bytes(input), want, "{input}");
        }
    }

    #[test]
    fn formats_like_binary_si() {
        assert_eq!(format_bytes(1 << 30), "1Gi");
        assert_eq!(format_bytes(3 << 29), "1536Mi");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(0), "0");
        assert_eq!(format_bytes(5 << 40), "5Ti");
    }

    #[test]
    fn round_trips() {
        for n in [1i64, 1023, 1024, 1 << 20, (1 << 30) + 1, 10 << 30] {
            assert_eq!(parse_bytes(&format_bytes(n)), Some(n));
        }
    }
}
