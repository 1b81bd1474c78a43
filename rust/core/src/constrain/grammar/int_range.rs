//! Regexes for the decimal integers in a range (JSON Schema `minimum`/`maximum` on
//! integers): canonical decimal text only (no leading zeros, no `-0`).

/// A regex matching exactly the canonical decimal texts of the integers in `[lo, hi]`
/// (`None`: unbounded on that side). `lo <= hi` when both are given.
pub fn int_range_regex(lo: Option<i64>, hi: Option<i64>) -> String {
    let mut alts = Vec::new();
    // Negative part: -[a, b] with a = max(1, -hi), b = -lo.
    if !matches!(lo, Some(l) if l >= 0) {
        let a = match hi {
            Some(h) if h < 0 => h.unsigned_abs(),
            _ => 1,
        };
        let b = lo.map(i64::unsigned_abs);
        alts.push(format!("-(?:{})", nonneg(a, b)));
    }
    // Non-negative part: [max(0, lo), hi].
    if !matches!(hi, Some(h) if h < 0) {
        let a = lo.map_or(0, |l| l.max(0) as u64);
        let b = hi.map(|h| h as u64);
        alts.push(nonneg(a, b));
    }
    format!("(?:{})", alts.join("|"))
}

/// The canonical texts of the integers in `[a, b]`, `b = None` unbounded (`a <= b`).
fn nonneg(a: u64, b: Option<u64>) -> String {
    let mut alts = Vec::new();
    let la = digits(a);
    let top = b.map_or(la, digits);
    // Lengths strictly between the first and the last are full: one alternative for all.
    let full = |from: usize, to: usize| format!("[1-9][0-9]{{{},{}}}", from - 1, to - 1);
    for len in [la, top] {
        if len == top && la == top && !alts.is_empty() {
            break;
        }
        let lo = if len == la { a } else { pow10(len - 1) };
        let hi = match b {
            Some(b) if len == top => b,
            _ => pow10(len).saturating_sub(1).max(lo),
        };
        alts.push(same_len(&pad(lo, len), &pad(hi, len)));
    }
    if top > la + 1 {
        alts.push(full(la + 1, top - 1));
    }
    if b.is_none() {
        // Every longer number.
        alts.push(format!("[1-9][0-9]{{{la},}}"));
    }
    alts.join("|")
}

fn digits(x: u64) -> usize {
    x.to_string().len()
}

fn pow10(n: usize) -> u64 {
    10u64.saturating_pow(n as u32)
}

fn pad(x: u64, len: usize) -> String {
    format!("{x:0len$}")
}

/// Digit strings of one length between `x` and `y` (inclusive, `x <= y`).
fn same_len(x: &str, y: &str) -> String {
    if x.is_empty() {
        return String::new();
    }
    if x.bytes().all(|c| c == b'0') && y.bytes().all(|c| c == b'9') {
        return format!("[0-9]{{{}}}", x.len());
    }
    let (x0, y0) = (x.as_bytes()[0], y.as_bytes()[0]);
    let rest = x.len() - 1;
    if x0 == y0 {
        return format!("{}{}", x0 as char, group(&same_len(&x[1..], &y[1..])));
    }
    let mut alts = vec![format!(
        "{}{}",
        x0 as char,
        group(&same_len(&x[1..], &"9".repeat(rest)))
    )];
    if x0 + 1 < y0 {
        alts.push(format!(
            "[{}-{}][0-9]{{{rest}}}",
            (x0 + 1) as char,
            (y0 - 1) as char
        ));
    }
    alts.push(format!(
        "{}{}",
        y0 as char,
        group(&same_len(&"0".repeat(rest), &y[1..]))
    ));
    alts.join("|")
}

fn group(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!("(?:{s})")
    }
}

#[cfg(test)]
mod tests {
    use super::int_range_regex;
    use proptest::prelude::*;
    use regex_automata::meta::Regex;

    fn check(lo: Option<i64>, hi: Option<i64>, xs: &[i64]) -> Result<(), TestCaseError> {
        let re = Regex::new(&format!("^{}$", int_range_regex(lo, hi))).unwrap();
        for &x in xs {
            let want = !matches!(lo, Some(l) if x < l) && !matches!(hi, Some(h) if x > h);
            prop_assert_eq!(
                re.is_match(&x.to_string()),
                want,
                "{} in {:?}..={:?}",
                x,
                lo,
                hi
            );
        }
        // Non-canonical texts never match.
        for bad in ["-0", "00", "01", "-01", "", "-"] {
            prop_assert!(!re.is_match(bad), "{:?}", bad);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::testing::cases(64)))]

        #[test]
        fn matches_exactly_the_range(
            a in -5000i64..5000,
            span in 0i64..20000,
            lo_open in any::<bool>(),
            hi_open in any::<bool>(),
            xs in prop::collection::vec(-30000i64..30000, 40),
        ) {
            let lo = (!lo_open).then_some(a);
            let hi = (!hi_open).then_some(a + span);
            let mut probe = xs;
            // Around the bounds, where off-by-one errors live.
            for d in -11..=11 {
                probe.push(a + d);
                probe.push(a + span + d);
            }
            check(lo, hi, &probe)?;
        }
    }

    #[test]
    fn extremes() {
        check(
            Some(i64::MIN),
            Some(i64::MAX),
            &[i64::MIN, -1, 0, 1, i64::MAX],
        )
        .unwrap();
        check(Some(0), Some(0), &[-1, 0, 1]).unwrap();
        check(None, Some(-10), &[-11, -10, -9, 0]).unwrap();
    }
}
