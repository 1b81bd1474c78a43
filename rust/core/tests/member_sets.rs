//! Member sets (members in any order, once-only ones at most once, required ones present,
//! counted) against a brute-force reference over every short sequence of members, with the
//! chart small enough that states are carried between chart generations.

use std::sync::Arc;

use specdec_core::constrain::grammar::{GrammarBuilder, GrammarLimits, Sym};
use specdec_core::constrain::{CompiledGrammar, Vocabulary};

fn byte_vocab() -> Arc<Vocabulary> {
    let mut t: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
    t.push(None);
    Arc::new(Vocabulary::new(t, &[256], None).unwrap())
}

/// `{` members `}`: once-only `a` (required), `b`, `c`; repeatable `x`; `min..=max` in all.
fn grammar(min: u32, max: Option<u32>, max_states: usize) -> CompiledGrammar {
    let limits = GrammarLimits {
        max_states,
        ..GrammarLimits::default()
    };
    let mut b = GrammarBuilder::new(limits);
    let root = b.nonterminal("root");
    let set = b.nonterminal("set");
    let lex = |b: &mut GrammarBuilder, s: &str| b.lexeme(s).unwrap();
    let (a, bb, c, x) = (
        lex(&mut b, "a"),
        lex(&mut b, "b"),
        lex(&mut b, "c"),
        lex(&mut b, "x"),
    );
    let (sep, open, close) = (lex(&mut b, ","), lex(&mut b, "\\{"), lex(&mut b, "\\}"));
    let members: Vec<(Sym, bool, bool)> = vec![
        (a, true, true),
        (bb, false, true),
        (c, false, true),
        (x, false, false),
    ];
    b.member_set(set, &members, sep, min, max).unwrap();
    b.rule(root, vec![open, Sym::Nt(set), close]).unwrap();
    CompiledGrammar::new(byte_vocab(), b.build(root).unwrap()).unwrap()
}

fn reference(seq: &[char], min: usize, max: Option<usize>) -> bool {
    let once = |m: char| seq.iter().filter(|&&s| s == m).count() <= 1;
    seq.contains(&'a')
        && once('a')
        && once('b')
        && once('c')
        && seq.len() >= min
        && max.is_none_or(|m| seq.len() <= m)
}

#[test]
fn member_sets_equal_brute_force() {
    for (min, max) in [(0, None), (2, None), (0, Some(2)), (1, Some(3))] {
        for max_states in [1 << 20, 24] {
            let g = grammar(min, max, max_states);
            let mut seqs: Vec<Vec<char>> = vec![Vec::new()];
            for len in 1..=5 {
                let prev: Vec<Vec<char>> = seqs
                    .iter()
                    .filter(|s| s.len() == len - 1)
                    .cloned()
                    .collect();
                for s in prev {
                    for m in ['a', 'b', 'c', 'x'] {
                        let mut t = s.clone();
                        t.push(m);
                        seqs.push(t);
                    }
                }
            }
            for s in &seqs {
                let body: Vec<String> = s.iter().map(|c| c.to_string()).collect();
                let text = format!("{{{}}}", body.join(","));
                let want = reference(s, min as usize, max.map(|m| m as usize));
                assert_eq!(
                    g.matches(text.as_bytes()).unwrap(),
                    want,
                    "{text} min {min} max {max:?}"
                );
            }
            // Separators only between members.
            for bad in ["{,a}", "{a,}", "{a,,b}", "{ab}"] {
                assert!(!g.matches(bad.as_bytes()).unwrap(), "{bad}");
            }
        }
    }
}
