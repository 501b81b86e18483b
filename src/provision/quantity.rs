//! Kubernetes resource quantities as byte counts: parse a PVC's requested
//! storage, and format a volume's size the way Go's `BinarySI` does.

/// Parses a quantity (`1Gi`, `500M`, `1.5Gi`, `1e9`, `123`) into bytes,
/// rounding fractions up. Returns `None` for malformed or negative input.
pub fn parse_bytes(s: &str) -> Option<i64> {
    let s = s.trim();
    if s.is_empty() || s.starts_with('-') {
        return None;
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return None;
    }
    // Numerator and power-of-ten denominator, kept exact in u128.
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    let digits = format!("{int_part}{frac_part}");
    let mut mantissa: u128 = digits.parse().ok()?;
    let mut scale_down: u32 = frac_part.len() as u32;
    let (mul, exp10): (u128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        e if e.starts_with(['e', 'E']) => (1, e[1..].parse::<i32>().ok()?),
        _ => return None,
    };
    mantissa = mantissa.checked_mul(mul)?;
    if exp10 >= 0 {
        mantissa = mantissa.checked_mul(10u128.checked_pow(exp10 as u32)?)?;
    } else {
        scale_down = scale_down.checked_add(exp10.unsigned_abs())?;
    }
    let div = 10u128.checked_pow(scale_down)?;
    let bytes = mantissa.div_ceil(div);
    i64::try_from(bytes).ok()
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
