//! Grammar state per request: a compiled grammar's chart stays within `max_states` however
//! many requests run over it (full charts are replaced by fresh generations), masks and
//! verdicts after a replacement equal a fresh grammar's, one request past the limit fails
//! alone, and mask fills of one grammar from several threads equal one thread's.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{json, Value};
use specdec_core::constrain::grammar::json_schema::JsonOptions;
use specdec_core::constrain::{
    CompiledGrammar, Constraint, GrammarError, GrammarLimits, Matcher, Vocabulary,
};
use specdec_core::testing;

/// Single bytes (printable ASCII and whitespace), and JSON fragments spanning lexemes.
fn json_vocab() -> Arc<Vocabulary> {
    let mut t: Vec<Option<Vec<u8>>> = (b' '..=b'~').map(|b| Some(vec![b])).collect();
    for b in [b'\n', b'\t'] {
        t.push(Some(vec![b]));
    }
    for frag in [
        "{\"", "\":", "\": ", "\", \"", ", \"", "\"}", "\"]", "[\"", "[[", "]]", "], ", "true",
        "false", "null", "name", "tags", "sub", "12", "3.5", "-0", "e+1", " }", "{}", "[]", "ab",
        "bc", "d e", "\\\"", "\\n", "\\u00e9", "xyz", "},", "]}", "é",
    ] {
        t.push(Some(frag.as_bytes().to_vec()));
    }
    let eos = t.len() as i64;
    t.push(None);
    Arc::new(Vocabulary::new(t, &[eos], None).unwrap())
}

fn limits(max_states: usize) -> GrammarLimits {
    GrammarLimits {
        max_states,
        ..GrammarLimits::default()
    }
}

fn compile(v: &Arc<Vocabulary>, schema: &Value, max_states: usize) -> Arc<CompiledGrammar> {
    let g = CompiledGrammar::from_json_schema(
        v.clone(),
        schema,
        &JsonOptions::default(),
        limits(max_states),
    );
    Arc::new(g.unwrap())
}

/// Nesting bounded by the schema: no single step needs many parser states.
fn flat_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "n": {"type": "integer"},
            "tags": {"type": "array", "items": {"enum": ["ab", "bc", "d e"]}},
            "sub": {
                "type": "object",
                "properties": {
                    "x": {"type": "number"},
                    "y": {"type": "array", "items": {"type": "boolean"}},
                },
            },
        },
    })
}

/// Arrays of arrays: each level of nesting is a parser state more.
fn nested_schema() -> Value {
    json!({"type": "array", "items": {"$ref": "#"}})
}

fn mask_of<C: Constraint>(m: &Matcher<C>) -> Vec<u32> {
    let mut out = vec![0u32; m.grammar().vocab().words()];
    m.fill_bitmask(&mut out).unwrap();
    out
}

fn allowed(mask: &[u32]) -> Vec<usize> {
    (0..mask.len() * 32)
        .filter(|&t| mask[t / 32] >> (t % 32) & 1 == 1)
        .collect()
}

fn accept_text<C: Constraint>(m: &mut Matcher<C>, text: &[u8]) -> Result<bool, GrammarError> {
    for &b in text {
        // Tokens 0..95 are the bytes b' '..=b'~'.
        if !m.accept_token((b - b' ') as i64)? {
            return Ok(false);
        }
    }
    Ok(true)
}

const LIMIT: usize = 60;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(testing::cases(32)))]

    /// Several requests over one grammar whose chart holds only `LIMIT` states: interleaved
    /// random walks (with rollbacks, which go back to states of replaced charts) keep the
    /// current chart within `LIMIT`, and every mask and verdict equals that of a grammar
    /// compiled without the small limit (never replaced) fed the same tokens.
    #[test]
    fn bounded_chart_masks_equal_a_fresh_grammar(
        moves in prop::collection::vec(
            (0..4usize, any::<prop::sample::Index>(), 0..12u8), 1..160),
    ) {
        let v = json_vocab();
        let schema = flat_schema();
        let g = compile(&v, &schema, LIMIT);
        let oracle = compile(&v, &schema, 1 << 22);
        let mut ms: Vec<(Matcher<CompiledGrammar>, Matcher<CompiledGrammar>)> = (0..4)
            .map(|_| (Matcher::new(g.clone()), Matcher::new(oracle.clone())))
            .collect();
        for (who, pick, act) in moves {
            let (m, o) = &mut ms[who];
            let want = mask_of(o);
            prop_assert_eq!(&mask_of(m), &want);
            prop_assert_eq!(m.is_accepting(), o.is_accepting());
            prop_assert!(g.chart_size() <= LIMIT, "{} > {LIMIT}", g.chart_size());
            match act {
                0 if o.num_accepted() > 0 => {
                    let n = 1 + pick.index(o.num_accepted());
                    m.rollback(n).unwrap();
                    o.rollback(n).unwrap();
                }
                1 => {
                    *m = Matcher::new(g.clone());
                    *o = Matcher::new(oracle.clone());
                }
                _ => {
                    let ids = allowed(&want);
                    if ids.is_empty() || o.is_terminated() {
                        continue;
                    }
                    let t = ids[pick.index(ids.len())] as i64;
                    prop_assert!(o.accept_token(t).unwrap());
                    prop_assert!(m.accept_token(t).unwrap());
                    // A token the mask leaves out is refused by both.
                    if let Some(bad) = (0..v.vocab_size()).find(|&t| want[t / 32] >> (t % 32) & 1 == 0) {
                        let (mut m2, mut o2) = (m.fork(), o.fork());
                        m2.rollback(1).unwrap();
                        o2.rollback(1).unwrap();
                        prop_assert!(!o2.accept_token(bad as i64).unwrap());
                        prop_assert!(!m2.accept_token(bad as i64).unwrap());
                    }
                }
            }
        }
        prop_assert!(g.chart_size() <= LIMIT);
    }
}

#[test]
fn the_small_limit_replaces_charts_in_the_property_test() {
    // The property above is about replaced charts: its walks do replace them.
    let v = json_vocab();
    let g = compile(&v, &flat_schema(), LIMIT);
    let mut m = Matcher::new(g.clone());
    let doc = br#"{"name": "xyz", "n": 12, "tags": ["ab", "d e"], "sub": {"x": 3.5, "y": [true]}}"#;
    assert!(accept_text(&mut m, doc).unwrap());
    assert!(m.is_accepting());
    assert!(g.generations() > 1, "{} generations", g.generations());
    assert!(g.chart_size() <= LIMIT);
}

#[test]
fn one_request_past_the_limit_fails_alone() {
    let v = json_vocab();
    let g = compile(&v, &nested_schema(), 40);
    let oracle = compile(&v, &nested_schema(), 1 << 22);
    // A request in the middle of a document when another one fails.
    let mut live = Matcher::new(g.clone());
    assert!(accept_text(&mut live, b"[[],[").unwrap());
    // Each `[` nests one level deeper; the request fails (on a fill or a step) once one
    // operation needs more than 40 states, and a failed step keeps the state.
    let mut deep = Matcher::new(g.clone());
    let mut err = None;
    for depth in 0..400 {
        let mut mask = vec![0u32; v.words()];
        if let Err(e) = deep.fill_bitmask(&mut mask) {
            err = Some(e);
            break;
        }
        let before = (deep.state(), deep.num_accepted());
        match deep.accept_token((b'[' - b' ') as i64) {
            Ok(ok) => assert!(ok, "`[` refused at depth {depth}"),
            Err(e) => {
                assert_eq!((deep.state(), deep.num_accepted()), before);
                assert_eq!(mask_of(&deep), mask);
                err = Some(e);
                break;
            }
        }
    }
    let err = err.expect("400 levels of nesting fit in 40 states");
    assert!(matches!(err, GrammarError::TooLarge(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("more than 40 parser states (max_states)"),
        "{err}"
    );
    // The other live request, and new ones, go on, with the verdicts of a fresh grammar.
    assert!(accept_text(&mut live, b"[]]]").unwrap());
    assert!(live.is_accepting());
    for (text, ok) in [
        (&b"[[[]],[]]"[..], true),
        (b"[]", true),
        (b"[[[[]]]]", true),
        (b"[1]", false),
        (b"[[]", false),
        (b"[],", false),
    ] {
        let mut m = Matcher::new(g.clone());
        let mut o = Matcher::new(oracle.clone());
        let mut all = true;
        for &b in text {
            assert_eq!(
                mask_of(&m),
                mask_of(&o),
                "{:?}",
                String::from_utf8_lossy(text)
            );
            let t = (b - b' ') as i64;
            let want = o.accept_token(t).unwrap();
            assert_eq!(m.accept_token(t).unwrap(), want);
            if !want {
                all = false;
                break;
            }
        }
        let whole = |m: &Matcher<CompiledGrammar>| all && m.is_accepting();
        assert_eq!(whole(&m), ok, "{:?}", String::from_utf8_lossy(text));
        assert_eq!(whole(&o), ok);
    }
    assert!(g.chart_size() <= 40);
    // The grammar-level calls are per request too.
    assert!(g.matches(b"[[],[[]]]").unwrap());
    let e = g.matches(&b"[".repeat(400)).unwrap_err();
    assert!(e.to_string().contains("(max_states)"), "{e}");
    assert!(!g.matches(b"[[],]").unwrap());
}

#[test]
fn a_start_state_past_the_limit_is_a_compile_error() {
    let v = json_vocab();
    let e =
        CompiledGrammar::from_json_schema(v, &flat_schema(), &JsonOptions::default(), limits(2))
            .unwrap_err();
    assert!(matches!(e, GrammarError::TooLarge(_)), "{e:?}");
    assert!(e.to_string().contains("(max_states)"), "{e}");
}

/// Texts of `flat_schema` (properties in declared order), as byte tokens.
const DOCS: &[&str] = &[
    r#"{"name": "ab", "n": -0, "tags": ["bc"]}"#,
    r#"{"tags": [], "sub": {"x": 3.5e+1, "y": [true, false, true]}}"#,
    r#"{"name": "d e xyz", "n": 1234567, "sub": {}}"#,
    r#"{"name": "", "tags": ["ab", "ab", "d e"]}"#,
    r#"{ "n" : 12 , "sub" : { "y" : [ ] } }"#,
    r#"{"name": "\u00e9\n", "tags": ["d e"], "sub": {"x": -0.5}}"#,
];

/// Masks along every prefix of every document, by one matcher per document.
fn masks_along(g: &Arc<CompiledGrammar>, doc: &str) -> Vec<Vec<u32>> {
    let mut m = Matcher::new(g.clone());
    let mut out = vec![mask_of(&m)];
    for &b in doc.as_bytes() {
        assert!(m.accept_token((b - b' ') as i64).unwrap(), "{doc}");
        out.push(mask_of(&m));
    }
    out
}

#[test]
fn fills_from_several_threads_equal_one_thread() {
    let v = json_vocab();
    for max_states in [1 << 22, LIMIT] {
        let oracle = compile(&v, &flat_schema(), 1 << 22);
        let want: Vec<Vec<Vec<u32>>> = DOCS.iter().map(|d| masks_along(&oracle, d)).collect();
        for round in 0..4 {
            // A fresh grammar each round: every thread meets uncached states at once.
            let g = compile(&v, &flat_schema(), max_states);
            let got: Vec<Vec<Vec<u32>>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..DOCS.len())
                    .map(|k| {
                        let g = g.clone();
                        // Documents in a different order per round.
                        s.spawn(move || masks_along(&g, DOCS[(k + round) % DOCS.len()]))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (k, masks) in got.iter().enumerate() {
                let d = (k + round) % DOCS.len();
                assert_eq!(masks, &want[d], "{} (max_states {max_states})", DOCS[d]);
            }
            assert!(g.chart_size() <= max_states);
        }
    }
}
