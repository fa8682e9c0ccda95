//! The `grpc-timeout` header: parsing and formatting (gRPC over HTTP/2 spec).
//!
//! The sidecar propagates deadlines by forwarding the remaining time in this header at
//! each hop. This module only converts; it does not keep time.

use std::time::Duration;

/// The header name.
pub const HEADER: &str = "grpc-timeout";

/// Parses a `grpc-timeout` value such as `100m` or `5S`. Returns `None` when malformed.
pub fn parse(value: &[u8]) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit[0] {
        b'H' => Duration::from_secs(n.checked_mul(3600)?),
        b'M' => Duration::from_secs(n.checked_mul(60)?),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Formats a duration as a `grpc-timeout` value: at most 8 digits, in the finest unit that
/// fits, rounded up to that unit.
pub fn format(d: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let nanos = d.as_nanos();
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    for (per, unit) in units {
        let v = nanos.div_ceil(per);
        if v <= MAX {
            return format!("{v}{unit}");
        }
    }
    format!("{MAX}H")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse(b"100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse(b"5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse(b"7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse(b"9n"), Some(Duration::from_nanos(9)));
        for bad in [&b""[..], b"m", b"10", b"10x", b"123456789m", b"-1m", b"1.5S"] {
            assert_eq!(parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn formats_within_eight_digits_and_round_trips() {
        for d in [
            Duration::from_nanos(5),
            Duration::from_millis(250),
            Duration::from_secs(30),
            Duration::from_secs(86_400 * 30),
        ] {
            let s = format(d);
            assert!(s.len() <= 9, "{s}");
            let back = parse(s.as_bytes()).unwrap();
            assert!(back >= d, "{s} parsed to {back:?} < {d:?}");
        }
        assert_eq!(format(Duration::from_millis(250)), "250000u");
        assert_eq!(format(Duration::from_nanos(99_999_999)), "99999999n");
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            #[test]
            fn parsing_any_bytes_never_panics(value in proptest::collection::vec(any::<u8>(), 0..16)) {
                let _ = parse(&value);
            }

            #[test]
            fn every_accepted_value_round_trips(n in 0u64..100_000_000, unit in prop::sample::select(&b"HMSmun"[..])) {
                let mut value = n.to_string().into_bytes();
                value.push(unit);
                let d = parse(&value).expect("a well-formed value parses");
                // Formatting the parsed duration gives a value that parses back to no less
                // than it (rounded up to the unit that fits in 8 digits).
                let again = parse(format(d).as_bytes()).expect("a formatted value parses");
                prop_assert!(again >= d);
            }

            #[test]
            fn formatting_any_duration_gives_a_parsable_value_of_at_most_eight_digits(nanos in any::<u64>()) {
                let d = Duration::from_nanos(nanos);
                let s = format(d);
                prop_assert!(s.len() <= 9, "{}", s);
                prop_assert!(parse(s.as_bytes()).is_some_and(|back| back >= d));
            }
        }
    }
}
