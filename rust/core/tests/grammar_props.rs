//! Property tests of the constrain module (regex constraint): trie-walk masks equal brute force along random
//! walks, the DFA agrees with regex-automata's own matcher, rollback/fork restore state,
//! tree masks equal matchers advanced node by node, and bad input changes nothing.

use std::sync::Arc;

use proptest::prelude::*;
use regex_automata::meta::Regex;
use specdec_core::constrain::{
    fill_tree_bitmask, CompiledRegex, Constraint, GrammarError, Matcher, RegexLimits, Vocabulary,
    DEAD,
};
use specdec_core::testing;

const PATTERNS: &[&str] = &[
    "(ab|ba)*c?",
    "a(bc|é)*",
    "[abc]{1,4}",
    "(é|a)+b?",
    "[^a]*a",
    ".{0,3}",
    "(abc|ab|a)(c|ba)*",
    "x?",
];

fn alphabet() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop::sample::select(vec![b'a', b'b', b'c', b'x', 0xC3, 0xA9, b'\n']),
        1..4,
    )
}

fn vocab_strategy() -> impl Strategy<Value = Vec<Option<Vec<u8>>>> {
    prop::collection::vec(prop::option::weighted(0.9, alphabet()), 2..24)
}

fn compile(tokens: Vec<Option<Vec<u8>>>, pattern: &str) -> Arc<CompiledRegex> {
    // The last id is EOS; duplicates and special tokens are allowed on purpose.
    let eos = tokens.len() as i64 - 1;
    let v = Arc::new(Vocabulary::new(tokens, &[eos], None).unwrap());
    Arc::new(CompiledRegex::new(v, pattern, RegexLimits::default(), 1 << 20).unwrap())
}

fn mask_of(m: &Matcher) -> Vec<u32> {
    let mut out = vec![0u32; m.grammar().vocab().words() + 1];
    m.fill_bitmask(&mut out).unwrap();
    out
}

fn allowed(mask: &[u32], n: usize) -> Vec<usize> {
    (0..n)
        .filter(|&t| mask[t / 32] >> (t % 32) & 1 == 1)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(testing::cases(200)))]

    #[test]
    fn masks_equal_brute_force(
        tokens in vocab_strategy(),
        p in 0..PATTERNS.len(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        class_trie in any::<bool>(),
        levels in any::<bool>(),
    ) {
        let g = compile(tokens, PATTERNS[p]);
        if class_trie {
            g.use_class_trie();
        }
        if levels {
            // Masks of later states then start from cached similar states' masks.
            g.init_levels();
        }
        let n = g.vocab().vocab_size();
        let oracle = Regex::new(&format!("^(?:{})$", PATTERNS[p])).unwrap();
        let mut m = Matcher::new(g.clone());
        let mut text: Vec<u8> = Vec::new();
        for pick in picks {
            let mask = mask_of(&m);
            let mut brute = vec![0u32; mask.len()];
            g.brute_force_mask(m.state(), &mut brute);
            prop_assert_eq!(&mask, &brute);
            // EOS exactly where the text fully matches (regex-automata's own matcher).
            if !m.is_terminated() {
                let eos_ok = mask[(n - 1) / 32] >> ((n - 1) % 32) & 1 == 1;
                prop_assert_eq!(eos_ok, oracle.is_match(&text[..]));
            }
            let ids = allowed(&mask, n);
            if ids.is_empty() {
                break;
            }
            let t = ids[pick.index(ids.len())];
            prop_assert!(m.accept_token(t as i64).unwrap());
            text.extend_from_slice(g.vocab().token_bytes(t));
        }
    }

    #[test]
    fn dfa_agrees_with_regex_automata(p in 0..PATTERNS.len(), s in prop::collection::vec(
        prop::sample::select(vec![b'a', b'b', b'c', b'x', 0xC3, 0xA9, b'\n']), 0..8)) {
        let g = compile(vec![Some(b"a".to_vec()), None], PATTERNS[p]);
        let oracle = Regex::new(&format!("^(?:{})$", PATTERNS[p])).unwrap();
        let st = g.dfa().run(g.start(), &s);
        prop_assert_eq!(g.is_accepting(st), oracle.is_match(&s[..]));
        // Live states can still reach a match: some extension of `s` must match.
        if st != DEAD {
            let ext: Vec<&[u8]> = vec![b"", b"a", b"b", b"c", b"ba", b"bc", "é".as_bytes(), b"\xa9",
                b"aa", b"abc", b"\xa9b", b"\xa9a", b"ab", b"x"];
            let reach = ext.iter().any(|e| {
                let mut t = s.clone();
                t.extend_from_slice(e);
                oracle.is_match(&t[..])
            });
            prop_assert!(reach);
        }
    }

    #[test]
    fn rollback_and_fork_restore(
        tokens in vocab_strategy(),
        p in 0..PATTERNS.len(),
        seq in prop::collection::vec(0usize..24, 0..10),
        back in 0usize..12,
    ) {
        let g = compile(tokens, PATTERNS[p]);
        let n = g.vocab().vocab_size();
        let mut m = Matcher::new(g.clone());
        let mut states = vec![m.state()];
        for t in seq {
            if m.accept_token((t % n) as i64).unwrap() {
                states.push(m.state());
            }
        }
        let f = m.fork();
        let k = back.min(m.num_accepted());
        m.rollback(k).unwrap();
        prop_assert_eq!(m.state(), states[states.len() - 1 - k]);
        prop_assert_eq!(f.state(), *states.last().unwrap());
        let before = m.state();
        prop_assert_eq!(m.rollback(m.num_accepted() + 1), Err(GrammarError::Rollback {
            requested: m.num_accepted() + 1, available: m.num_accepted() }));
        let oor = |r: Result<bool, GrammarError>| matches!(r, Err(GrammarError::TokenOutOfRange { .. }));
        prop_assert!(oor(m.accept_token(n as i64)));
        prop_assert!(oor(m.accept_token(-1)));
        prop_assert_eq!(m.state(), before);
    }

    #[test]
    fn tree_masks_equal_matchers(
        tokens in vocab_strategy(),
        p in 0..PATTERNS.len(),
        nodes in prop::collection::vec((any::<prop::sample::Index>(), 0usize..24), 1..20),
    ) {
        let g = compile(tokens, PATTERNS[p]);
        let n = g.vocab().vocab_size();
        let words = g.vocab().words();
        let mut toks = vec![0i64];
        let mut parents = vec![-1i32];
        for (pi, t) in nodes {
            parents.push(pi.index(toks.len()) as i32);
            toks.push((t % n) as i64);
        }
        let root = Matcher::new(g.clone());
        let mut out = vec![7u32; toks.len() * words];
        let valid = fill_tree_bitmask(&root, &toks, &parents, &mut out, words).unwrap();
        for i in 0..toks.len() {
            let mut path = vec![];
            let mut j = i;
            while j > 0 {
                path.push(toks[j]);
                j = parents[j] as usize;
            }
            let mut m = root.fork();
            let ok = path.iter().rev().all(|&t| m.accept_token(t).unwrap());
            prop_assert_eq!(valid[i], ok);
            let row = &out[i * words..(i + 1) * words];
            if ok {
                prop_assert_eq!(row, &mask_of(&m)[..words]);
            } else {
                prop_assert!(row.iter().all(|&w| w == 0));
            }
        }
    }
}

#[test]
fn fsm_example_language() {
    // Tokens A, B, C, EOS; language A (B|C) EOS.
    let v = Arc::new(
        Vocabulary::new(
            vec![
                Some(b"A".to_vec()),
                Some(b"B".to_vec()),
                Some(b"C".to_vec()),
                None,
            ],
            &[3],
            None,
        )
        .unwrap(),
    );
    let g = Arc::new(CompiledRegex::new(v, "A(B|C)", RegexLimits::default(), 1 << 20).unwrap());
    let logits = [
        [-2.0f32, 4.0, 3.0, 1.0],
        [5.0, 1.0, 2.0, 0.0],
        [3.0, 2.0, 1.0, -1.0],
    ];
    let mut m = Matcher::new(g);
    let mut out = vec![];
    for row in logits {
        let mask = mask_of(&m);
        let best = (0..4)
            .filter(|&t| mask[0] >> t & 1 == 1)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap();
        assert!(m.accept_token(best as i64).unwrap());
        out.push(best);
    }
    assert_eq!(out, vec![0, 2, 3]);
    assert!(m.is_terminated());
}

#[test]
fn bad_regex_and_size_limit() {
    let v = Arc::new(Vocabulary::new(vec![Some(b"a".to_vec()), None], &[1], None).unwrap());
    let err = CompiledRegex::new(v.clone(), "a(", RegexLimits::default(), 0).unwrap_err();
    assert!(matches!(err, GrammarError::Regex(_)), "{err}");
    let small = RegexLimits {
        automaton_bytes: 1 << 16,
        table_bytes: 1 << 16,
    };
    let err = CompiledRegex::new(v.clone(), "[ab]*a[ab]{16}", small, 0).unwrap_err();
    assert!(matches!(err, GrammarError::TooLarge(_)), "{err}");
    let tiny_table = RegexLimits {
        automaton_bytes: 64 << 20,
        table_bytes: 4 * 1024,
    };
    let err = CompiledRegex::new(v, "[0-9]{10}", tiny_table, 0).unwrap_err();
    assert!(matches!(err, GrammarError::TooLarge(_)), "{err}");
}

#[test]
fn huge_counted_repetition_is_refused_before_expansion() {
    // `a{1000000}` took seconds to expand before the table limit refused it (found by the
    // Python fuzzer); the match-length bound now refuses it from the syntax tree alone.
    let v = Arc::new(Vocabulary::new(vec![Some(b"a".to_vec()), None], &[1], None).unwrap());
    for p in ["a{1000000}", "(ab){600000}", "a{0,1000000}", "x{70000}b*"] {
        let err = CompiledRegex::new(v.clone(), p, RegexLimits::default(), 0).unwrap_err();
        assert!(matches!(err, GrammarError::TooLarge(_)), "{p}: {err}");
    }
    // Long patterns whose table fits still compile.
    for p in ["a{20000}", "a{0,20000}", "(ab){10000}b*"] {
        assert!(
            CompiledRegex::new(v.clone(), p, RegexLimits::default(), 0).is_ok(),
            "{p}"
        );
    }
}

#[test]
fn cache_cap_zero_still_correct() {
    let v = Arc::new(
        Vocabulary::new(
            vec![
                Some(b"ab".to_vec()),
                Some(b"a".to_vec()),
                Some(b"b".to_vec()),
                None,
            ],
            &[3],
            None,
        )
        .unwrap(),
    );
    let cached =
        Arc::new(CompiledRegex::new(v.clone(), "(ab)+", RegexLimits::default(), 1 << 20).unwrap());
    let uncached = Arc::new(CompiledRegex::new(v, "(ab)+", RegexLimits::default(), 0).unwrap());
    for g in [cached.clone(), uncached.clone()] {
        let m = Matcher::new(g);
        assert_eq!(allowed(&mask_of(&m), 4), vec![0, 1]);
    }
    assert_eq!(uncached.cache().used_bytes(), 0);
    assert!(cached.cache().used_bytes() > 0);
}
