//! UTF-8 validity as a 9-state byte automaton (boundary, the continuations still owed, and
//! the lead bytes whose first continuation is restricted: no overlong forms, surrogates or
//! code points past U+10FFFF), for summaries of the token trie and checks of lexeme DFAs.

/// At a character boundary.
pub const BOUNDARY: u8 = 0;
/// States of [`next`]: boundary, 1-3 continuations owed, and E0, ED, F0, F4 owed one
/// restricted continuation.
pub const STATES: usize = 8;

/// The state after `b` from `u`, or None where `b` cannot follow (invalid UTF-8).
#[inline]
pub fn next(u: u8, b: u8) -> Option<u8> {
    let cont = (0x80..=0xBF).contains(&b);
    match u {
        0 => match b {
            0x00..=0x7F => Some(0),
            0xC2..=0xDF => Some(1),
            0xE0 => Some(4),
            0xE1..=0xEC | 0xEE..=0xEF => Some(2),
            0xED => Some(5),
            0xF0 => Some(6),
            0xF1..=0xF3 => Some(3),
            0xF4 => Some(7),
            _ => None,
        },
        1..=3 if cont => Some(u - 1),
        4 if (0xA0..=0xBF).contains(&b) => Some(1),
        5 if (0x80..=0x9F).contains(&b) => Some(1),
        6 if (0x90..=0xBF).contains(&b) => Some(2),
        7 if (0x80..=0x8F).contains(&b) => Some(2),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Agrees with the standard library (valid = complete, or completed by some
    /// continuation bytes) on strings of up to 3 bytes: every first byte, representative
    /// later ones (each range boundary of the table).
    #[test]
    fn matches_std() {
        const REPS: [u8; 19] = [
            0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xED,
            0xEF, 0xF0, 0xF4, 0xF5, 0xFF,
        ];
        const CONT: [u8; 6] = [0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF];
        let run = |bs: &[u8]| bs.iter().try_fold(BOUNDARY, |u, &b| next(u, b));
        let completable = |bs: &[u8]| {
            (0..=3u32).any(|k| {
                (0..6usize.pow(k)).any(|mut code| {
                    let mut v = bs.to_vec();
                    for _ in 0..k {
                        v.push(CONT[code % 6]);
                        code /= 6;
                    }
                    std::str::from_utf8(&v).is_ok()
                })
            })
        };
        for a in 0..=255u8 {
            for b in REPS {
                for c in REPS {
                    let s = [a, b, c];
                    for len in 1..=3 {
                        let bs = &s[..len];
                        let got = run(bs);
                        assert_eq!(got.is_some(), completable(bs), "{bs:x?}");
                        assert_eq!(
                            got == Some(BOUNDARY),
                            std::str::from_utf8(bs).is_ok(),
                            "{bs:x?}"
                        );
                    }
                }
            }
        }
    }
}
