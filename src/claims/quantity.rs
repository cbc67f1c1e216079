//! Kubernetes quantities for countable (extended) resources: whole, non-negative units only.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum QuantityError {
    #[error("quantity {0:?} is negative")]
    Negative(String),
    #[error("quantity {0:?} is fractional; GPU resources are counted in whole units")]
    Fractional(String),
    #[error("quantity {0:?} is not a number")]
    Invalid(String),
    #[error("quantity {0:?} is too large")]
    TooLarge(String),
    #[error(
        "quantity {0:?} is more than {max} units, more than any device plugin advertises",
        max = MAX_GPU_UNITS
    )]
    Impossible(String),
}

/// Most units of one GPU resource a pod may claim or a node may offer: a million, where a large
/// node offers 8 GPUs (times its time-slicing replicas, or 7 MIG slices each). Anything above
/// is a corrupt or hostile object, not a count: summed and rendered it printed
/// `92233720368547758.07` GPUs (issue 22).
pub const MAX_GPU_UNITS: u64 = 1_000_000;

/// [`parse_units`] for a GPU count (a pod's claim, a node's allocatable): more than
/// [`MAX_GPU_UNITS`] is [`QuantityError::Impossible`]. Quota limits are not counts and may be
/// larger (`parse_units`).
pub fn parse_gpu_units(raw: &str) -> Result<u64, QuantityError> {
    let units = parse_units(raw)?;
    if units > MAX_GPU_UNITS {
        return Err(QuantityError::Impossible(echo(raw)));
    }
    Ok(units)
}

/// Longest part of a quantity kept in an error, in characters: the value comes from a dump or
/// an object and may be megabytes long.
const ECHO_CHARS: usize = 64;

/// `raw` for an error message, cut after [`ECHO_CHARS`] characters (marked with `…`).
fn echo(raw: &str) -> String {
    match raw.char_indices().nth(ECHO_CHARS) {
        None => raw.to_string(),
        Some((cut, _)) => format!("{}…", &raw[..cut]),
    }
}

/// Parses a quantity such as `1`, `8`, `2000m`, `1k` into whole units.
///
/// Extended resources must be integers (the API server rejects anything else), so a fraction or
/// a negative value in a dump is reported as bad input instead of being rounded.
pub fn parse_units(raw: &str) -> Result<u64, QuantityError> {
    let s = raw.trim();
    if s.starts_with('-') {
        return Err(QuantityError::Negative(echo(raw)));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if number.is_empty() {
        return Err(QuantityError::Invalid(echo(raw)));
    }
    // Scale as (numerator, denominator) so milli-units stay exact.
    let (mul, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        _ => return Err(QuantityError::Invalid(echo(raw))),
    };
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if frac_part.contains('.') || (int_part.is_empty() && frac_part.is_empty()) {
        return Err(QuantityError::Invalid(echo(raw)));
    }
    // Leading zeros of the integer and trailing zeros of the fraction do not change the value.
    let int_part = int_part.trim_start_matches('0');
    let frac_part = frac_part.trim_end_matches('0');
    // 20 integer digits hold every u64; 18 fraction digits keep the scale well inside u128.
    if frac_part.len() > 18 || int_part.len() > 20 {
        return Err(QuantityError::TooLarge(echo(raw)));
    }
    let frac_scale = 10u128.pow(frac_part.len() as u32);
    let int_value: u128 = if int_part.is_empty() {
        0
    } else {
        int_part
            .parse()
            .map_err(|_| QuantityError::Invalid(echo(raw)))?
    };
    let frac_value: u128 = if frac_part.is_empty() {
        0
    } else {
        frac_part
            .parse()
            .map_err(|_| QuantityError::Invalid(echo(raw)))?
    };
    // Checked: 20 integer digits, 18 fraction digits and a binary suffix overflow u128.
    let numerator = int_value
        .checked_mul(frac_scale)
        .and_then(|v| v.checked_add(frac_value))
        .and_then(|v| v.checked_mul(mul))
        .ok_or_else(|| QuantityError::TooLarge(echo(raw)))?;
    let denominator = frac_scale * div;
    if !numerator.is_multiple_of(denominator) {
        return Err(QuantityError::Fractional(echo(raw)));
    }
    u64::try_from(numerator / denominator).map_err(|_| QuantityError::TooLarge(echo(raw)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_whole_units() {
        assert_eq!(parse_units("1"), Ok(1));
        assert_eq!(parse_units("8"), Ok(8));
        assert_eq!(parse_units("2000m"), Ok(2));
        assert_eq!(parse_units("1k"), Ok(1000));
        assert_eq!(parse_units("1.0"), Ok(1));
        assert_eq!(parse_units("0"), Ok(0));
    }

    #[test]
    fn rejects_bad_units() {
        assert!(matches!(parse_units("-1"), Err(QuantityError::Negative(_))));
        assert!(matches!(
            parse_units("0.5"),
            Err(QuantityError::Fractional(_))
        ));
        assert!(matches!(
            parse_units("500m"),
            Err(QuantityError::Fractional(_))
        ));
        assert!(matches!(parse_units("two"), Err(QuantityError::Invalid(_))));
        assert!(matches!(parse_units(""), Err(QuantityError::Invalid(_))));
        assert!(matches!(
            parse_units("1.2.3"),
            Err(QuantityError::Invalid(_))
        ));
        assert!(matches!(parse_units("1x"), Err(QuantityError::Invalid(_))));
        assert!(matches!(
            parse_units("99999999999999999999"),
            Err(QuantityError::TooLarge(_))
        ));
    }

    /// Found by the `quantity` fuzz target: u64 values past 18 digits were refused, and 18+18
    /// digits with a binary suffix overflowed u128 (a panic in debug builds).
    #[test]
    fn large_values_fit_or_are_too_large() {
        assert_eq!(parse_units("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_units("018446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_units("0000000000000000000000000001"), Ok(1));
        assert_eq!(parse_units("1.0000000000000000000000000"), Ok(1));
        assert_eq!(parse_units("000"), Ok(0));
        assert_eq!(
            parse_units("1000000000000000000"),
            Ok(1_000_000_000_000_000_000)
        );
        assert!(matches!(
            parse_units("18446744073709551616"),
            Err(QuantityError::TooLarge(_))
        ));
        assert!(matches!(
            parse_units("999999999999999999.999999999999999999Gi"),
            Err(QuantityError::TooLarge(_))
        ));
        assert!(matches!(
            parse_units("99999999999999999999.5Gi"),
            Err(QuantityError::TooLarge(_))
        ));
    }

    #[test]
    fn long_quantities_are_cut_in_errors() {
        let raw = format!("{}x", "1".repeat(100_000));
        let msg = parse_units(&raw).expect_err("invalid").to_string();
        assert!(msg.len() < 200 && msg.contains("…"), "{msg}");
    }

    #[test]
    fn gpu_counts_are_bounded() {
        assert_eq!(parse_gpu_units("1000000"), Ok(MAX_GPU_UNITS));
        assert_eq!(parse_gpu_units("1M"), Ok(MAX_GPU_UNITS));
        assert_eq!(parse_gpu_units("8"), Ok(8));
        for raw in ["1000001", "18446744073709551615", "1G", "2Mi"] {
            assert_eq!(
                parse_gpu_units(raw),
                Err(QuantityError::Impossible(raw.into())),
                "{raw}"
            );
        }
        let msg = QuantityError::Impossible("1G".into()).to_string();
        assert!(msg.contains("more than 1000000 units"), "{msg}");
        // Other errors stay what they were.
        assert!(matches!(
            parse_gpu_units("0.5"),
            Err(QuantityError::Fractional(_))
        ));
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,24}") {
            let _ = parse_units(&s);
        }

        #[test]
        fn integers_round_trip(n in 0u64..1_000_000) {
            prop_assert_eq!(parse_units(&n.to_string()), Ok(n));
            prop_assert_eq!(parse_units(&format!("{}m", n * 1000)), Ok(n));
        }
    }
}
