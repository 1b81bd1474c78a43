//! Tests of forced continuations: a grammar's next-byte sets equal stepping every byte
//! (the trait's plain default), and along random walks over JSON, C-like and enum grammars
//! every forced path is a prefix of the language (each byte keeps the state live, an EOS
//! path may end there), the paths' weights sum to 1, their longest common prefix is the
//! forced bytes, and every forced byte was the only live one (checked byte by byte against
//! all 256). The independent oracle (enumerating a small language with Python's `re`) is in
//! tests/test_grammar_drafts.py.

use std::sync::Arc;

use specdec_core::constrain::{
    forced_bytes, forced_paths, CompiledGrammar, CompiledRegex, Constraint, ForcedLimits,
    GrammarLimits, RegexLimits, Vocabulary, DEFAULT_CACHE_BYTES,
};
use specdec_core::testing::Lcg;

const JSON: &str = r#"
root   ::= object
object ::= "{" ( member ( "," member )* )? "}"
member ::= "\"" [a-z]{1,3} "\":" value
value  ::= object | "[" ( value ( "," value )* )? "]" | "\"" [a-z]* "\"" | [0-9]+ | "true" | "false" | "null"
"#;

const RECORD: &str = r#"
root   ::= "{\"name\": \"" [A-Za-z ]{1,12} "\", \"ok\": " ( "true" | "false" ) ", \"tier\": " tier "}"
tier   ::= "\"gold\"" | "\"silver\"" | "\"bronze\""
"#;

fn vocab() -> Arc<Vocabulary> {
    // Every byte, then EOS.
    let mut tokens: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
    tokens.push(None);
    Arc::new(Vocabulary::new(tokens, &[256], None).unwrap())
}

fn stepped_next<C: Constraint>(c: &C, s: C::State) -> [u64; 4] {
    let mut set = [0u64; 4];
    for b in 0..=255u8 {
        if c.step_bytes(s.clone(), &[b]).unwrap() != C::DEAD {
            set[b as usize / 64] |= 1 << (b % 64);
        }
    }
    set
}

fn live_bytes(set: &[u64; 4]) -> Vec<u8> {
    (0..=255u8)
        .filter(|&b| set[b as usize / 64] >> (b % 64) & 1 == 1)
        .collect()
}

/// Everything a state's forced paths must satisfy, checked by stepping.
fn check_state<C: Constraint>(c: &C, s: C::State, limits: ForcedLimits) {
    assert_eq!(c.next_bytes(s.clone()).unwrap(), stepped_next(c, s.clone()));
    let (forced, _) = forced_bytes(c, s.clone(), limits.max_bytes).unwrap();
    // Each forced byte was the only live byte, and the text could not end before it.
    let mut t = s.clone();
    for &b in &forced {
        assert!(!c.accepts_end(t.clone()));
        assert_eq!(live_bytes(&stepped_next(c, t.clone())), vec![b]);
        t = c.step_bytes(t, &[b]).unwrap();
    }
    let paths = forced_paths(c, s.clone(), limits).unwrap();
    assert!(!paths.is_empty());
    let total: f64 = paths.iter().map(|p| p.weight).sum();
    assert!((total - 1.0).abs() < 1e-9, "weights sum to {total}");
    assert!(paths.len() <= limits.max_paths.max(1));
    let mut lcp = paths[0].bytes.clone();
    for p in &paths {
        assert!(p.bytes.len() <= limits.max_bytes);
        assert!(p.choices as usize <= limits.levels);
        let end = c.step_bytes(s.clone(), &p.bytes).unwrap();
        assert!(end != C::DEAD, "path {:?} leaves the language", p.bytes);
        if p.eos {
            assert!(c.accepts_end(end));
        }
        let n = lcp.iter().zip(&p.bytes).take_while(|(a, b)| a == b).count();
        lcp.truncate(n);
    }
    if paths.len() > 1 {
        assert_eq!(lcp[..forced.len()], forced[..]);
    } else {
        assert!(paths[0].bytes.starts_with(&forced));
    }
    // The same answer through the trait (the grammar's cached one).
    assert_eq!(&*c.forced_paths(s, limits).unwrap(), &paths[..]);
}

/// Random walks through `c`'s language: at each state the checks, then a random live byte.
fn walk<C: Constraint>(c: &C, seed: u64, steps: usize) {
    let mut rng = Lcg::new(seed);
    let limits = ForcedLimits::default();
    let mut s = c.start();
    for _ in 0..steps {
        check_state(c, s.clone(), limits);
        let live = live_bytes(&stepped_next(c, s.clone()));
        if live.is_empty() {
            break;
        }
        let b = live[rng.below(live.len() as u64) as usize];
        s = c.step_bytes(s, &[b]).unwrap();
    }
}

#[test]
fn json_like_grammar_paths_hold_along_random_walks() {
    let g = CompiledGrammar::from_gbnf(vocab(), JSON, GrammarLimits::default()).unwrap();
    for seed in 0..20 {
        walk(&g, seed, 60);
    }
}

#[test]
fn record_grammar_forces_keys_and_branches_on_enums() {
    let g = CompiledGrammar::from_gbnf(vocab(), RECORD, GrammarLimits::default()).unwrap();
    let s = g.start();
    let (forced, _) = forced_bytes(&g, s.clone(), 64).unwrap();
    assert_eq!(forced, b"{\"name\": \"");
    // After the name's closing quote: the key is forced, then true/false, then the tier.
    let s = g.step_bytes(s, b"{\"name\": \"Al\"").unwrap();
    let limits = ForcedLimits {
        max_bytes: 64,
        max_branches: 4,
        levels: 1,
        max_paths: 16,
    };
    let mut paths: Vec<(String, bool)> = forced_paths(&g, s.clone(), limits)
        .unwrap()
        .iter()
        .map(|p| (String::from_utf8(p.bytes.clone()).unwrap(), p.eos))
        .collect();
    paths.sort();
    let want = [
        ", \"ok\": false, \"tier\": \"",
        ", \"ok\": true, \"tier\": \"",
    ];
    assert_eq!(
        paths,
        want.iter()
            .map(|w| (w.to_string(), false))
            .collect::<Vec<_>>()
    );
    // Two levels: the tier's three names close the object, and EOS follows.
    let deep = ForcedLimits {
        levels: 2,
        ..limits
    };
    let got = forced_paths(&g, s.clone(), deep).unwrap();
    assert_eq!(got.len(), 6);
    for p in got.iter() {
        assert!(p.eos && p.bytes.ends_with(b"\"}"), "{:?}", p);
        assert!((p.weight - 1.0 / 6.0).abs() < 1e-12);
    }
    // A path cap: the choice that would exceed it is not expanded.
    let capped = forced_paths(
        &g,
        s,
        ForcedLimits {
            max_paths: 3,
            ..deep
        },
    )
    .unwrap();
    assert!(capped.len() <= 3);
    check_state(
        &g,
        g.step_bytes(g.start(), b"{\"name\": \"Al\"").unwrap(),
        deep,
    );
}

#[test]
fn a_free_choice_forces_nothing_and_a_finished_text_forces_eos() {
    let g = CompiledGrammar::from_gbnf(vocab(), RECORD, GrammarLimits::default()).unwrap();
    // Inside the name: many bytes are live; no path goes further than here.
    let s = g.step_bytes(g.start(), b"{\"name\": \"A").unwrap();
    let paths = forced_paths(&g, s, ForcedLimits::default()).unwrap();
    assert_eq!(paths.len(), 1);
    assert!(paths[0].bytes.is_empty() && !paths[0].eos);
    // After the closing brace only EOS may follow.
    let done = g
        .step_bytes(
            g.start(),
            b"{\"name\": \"A\", \"ok\": true, \"tier\": \"gold\"}",
        )
        .unwrap();
    let paths = forced_paths(&g, done, ForcedLimits::default()).unwrap();
    assert_eq!(paths.len(), 1);
    assert!(paths[0].eos && paths[0].bytes.is_empty());
    // Dead and terminated states have none.
    type C = CompiledGrammar;
    assert!(
        forced_paths(&g, <C as Constraint>::DEAD, ForcedLimits::default())
            .unwrap()
            .is_empty()
    );
    assert!(
        forced_paths(&g, <C as Constraint>::TERMINATED, ForcedLimits::default())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn regex_constraint_paths_hold_along_random_walks() {
    let r = CompiledRegex::new(
        vocab(),
        r#"(abc|abd)x(yes|no)-[0-9]{2}(end)?"#,
        RegexLimits::default(),
        DEFAULT_CACHE_BYTES,
    )
    .unwrap();
    for seed in 0..20 {
        walk(&r, seed, 30);
    }
    let (forced, _) = forced_bytes(&r, r.start(), 64).unwrap();
    assert_eq!(forced, b"ab");
}
