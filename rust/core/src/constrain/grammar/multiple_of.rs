//! DFAs of the decimal numbers that are multiples of `a / 10^d` (JSON Schema `multipleOf`).
//!
//! Divisibility of a digit string is regular: reading digits left to right, the value mod `a`
//! is `(r * 10 + digit) mod a`, so a remainder per state suffices. A decimal `x = int.frac` is
//! a multiple of `a / 10^d` exactly when `x * 10^d` is an integer (every fraction digit past
//! the `d`-th is zero) divisible by `a`; the first `d` fraction digits extend the remainder,
//! and a shorter fraction is padded with zeros (`r * 10^(d - j)`) when it ends.
//! Texts are canonical JSON numbers without an exponent (`-0` included, as JSON allows it).

use super::formats::dfa_from_step;
use crate::constrain::TableDfa;

/// Most states a `multipleOf` automaton may have (each is a 1 KiB row of the table).
pub const MAX_STATES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum St {
    Start,
    Minus,
    /// The integer part `0`.
    Zero,
    /// A nonzero integer part so far, with its value mod `a`.
    Int(u64),
    /// After `.`, no fraction digit yet.
    Dot(u64),
    /// `j` (1..=d) fraction digits read.
    Frac(u64, u32),
    /// More than `d` fraction digits (only zeros allowed past the `d`-th).
    Tail(u64),
}

/// States the automaton of `a / 10^d` needs at most (before trimming).
pub fn states_needed(a: u64, d: u32) -> usize {
    (a as usize)
        .saturating_mul(d as usize + 3)
        .saturating_add(4)
}

/// The canonical decimal texts (`fraction`: with an optional `.digits` part; otherwise
/// integers only) whose value is a multiple of `a / 10^d`; `a >= 1`, and the caller keeps
/// [`states_needed`] within [`MAX_STATES`].
pub fn multiple_of_dfa(a: u64, d: u32, fraction: bool) -> TableDfa {
    let pow = |k: u32| (0..k).fold(1u64, |p, _| p * 10 % a);
    let accepting = |s: St| match s {
        St::Zero => true,
        St::Int(r) => r * pow(d) % a == 0,
        St::Frac(r, j) => r * pow(d - j) % a == 0,
        St::Tail(r) => r == 0,
        St::Start | St::Minus | St::Dot(_) => false,
    };
    let step = |s: St, b: u8| -> Option<St> {
        let digit = b.is_ascii_digit().then(|| u64::from(b - b'0'));
        let fraction_digit = |r: u64, j: u32| match digit {
            Some(c) if j < d => Some(St::Frac((r * 10 + c) % a, j + 1)),
            Some(0) => Some(St::Tail(r)),
            _ => None,
        };
        match s {
            St::Start if b == b'-' => Some(St::Minus),
            St::Start | St::Minus => match digit {
                Some(0) => Some(St::Zero),
                Some(c) => Some(St::Int(c % a)),
                None => None,
            },
            St::Zero if b == b'.' && fraction => Some(St::Dot(0)),
            St::Int(r) if b == b'.' && fraction => Some(St::Dot(r)),
            St::Int(r) => digit.map(|c| St::Int((r * 10 + c) % a)),
            St::Zero => None,
            St::Dot(r) => fraction_digit(r, 0),
            St::Frac(r, j) => fraction_digit(r, j),
            St::Tail(r) => (digit == Some(0)).then_some(St::Tail(r)),
        }
    };
    dfa_from_step(St::Start, step, accepting)
}

/// The mantissas of integer texts with an exponent (`-?digits[.digits]`, then `e` or `E`
/// and anything after it) whose digits, the dot skipped, are a multiple of `a`: intersected
/// with a regex that gives the syntax.
pub fn mantissa_multiple_dfa(a: u64) -> TableDfa {
    // `None`: past the exponent marker.
    let step = |s: Option<u64>, b: u8| match (s, b) {
        (Some(r), b'0'..=b'9') => Some(Some((r * 10 + u64::from(b - b'0')) % a)),
        (Some(r), b'-' | b'.') => Some(Some(r)),
        (Some(0), b'e' | b'E') | (None, _) => Some(None),
        _ => None,
    };
    dfa_from_step(Some(0), step, |s| s.is_none())
}

#[cfg(test)]
mod tests {
    use super::multiple_of_dfa;
    use proptest::prelude::*;

    /// Is the decimal text `t` (no exponent) a multiple of `a / 10^d`? Exact, in integers:
    /// `t = X / 10^f`, a multiple iff `X * 10^d` is divisible by `a * 10^f`.
    fn oracle(t: &str, a: u64, d: u32) -> bool {
        let t = t.trim_start_matches('-');
        let (int, frac) = t.split_once('.').unwrap_or((t, ""));
        let x: u128 = format!("{int}{frac}").parse().unwrap();
        let f = frac.len() as u32;
        (x * 10u128.pow(d)).is_multiple_of(u128::from(a) * 10u128.pow(f))
    }

    fn accepts(dfa: &crate::constrain::TableDfa, t: &str) -> bool {
        dfa.is_accepting(dfa.run(dfa.start(), t.as_bytes()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::testing::cases(64)))]

        #[test]
        fn integers_match_the_remainder(a in 1u64..200, xs in prop::collection::vec(-100_000i64..100_000, 50)) {
            let dfa = multiple_of_dfa(a, 0, false);
            for x in xs {
                prop_assert_eq!(accepts(&dfa, &x.to_string()), x % a as i64 == 0, "{} by {}", x, a);
                let dotted = format!("{x}.0");
                prop_assert!(!accepts(&dfa, &dotted));
            }
        }

        #[test]
        fn decimals_match_exact_arithmetic(
            a in 1u64..60,
            d in 0u32..4,
            xs in prop::collection::vec((0u64..100_000, 0u32..7, any::<bool>()), 50),
        ) {
            let dfa = multiple_of_dfa(a, d, true);
            for (x, f, neg) in xs {
                // x / 10^f written with exactly f fraction digits (trailing zeros kept).
                let s = format!("{:0w$}", x, w = f as usize + 1);
                let (int, frac) = s.split_at(s.len() - f as usize);
                let int = int.trim_start_matches('0');
                let int = if int.is_empty() { "0" } else { int };
                let mut t = if f == 0 { int.to_owned() } else { format!("{int}.{frac}") };
                if neg {
                    t.insert(0, '-');
                }
                prop_assert_eq!(accepts(&dfa, &t), oracle(&t, a, d), "{} by {}/10^{}", t, a, d);
            }
        }
    }

    #[test]
    fn mantissas_by_their_digits() {
        let dfa = super::mantissa_multiple_dfa(7);
        for (t, ok) in [
            ("7e1", true),
            ("-1.4e+3", true),
            ("0.07E2", true),
            ("1.5e2", false),
        ] {
            assert_eq!(accepts(&dfa, t), ok, "{t}");
        }
    }

    #[test]
    fn rejects_non_canonical_texts() {
        let dfa = multiple_of_dfa(3, 1, true);
        for bad in ["", "-", "03", "3.", ".3", "--3", "3e0", "+3", "1.5.0"] {
            assert!(!accepts(&dfa, bad), "{bad:?}");
        }
        for good in ["0", "-0", "3", "0.3", "0.30", "-1.5", "4.5"] {
            assert!(accepts(&dfa, good), "{good:?}");
        }
    }
}
