//! JSON Schema compiled to grammars: accept/reject examples per keyword (each accepted text
//! also checked as JSON by serde_json), recursion through `$ref`, layout options, errors for
//! unsupported keywords, and trie-walk masks equal brute force along random walks.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{json, Value};
use specdec_core::constrain::grammar::json_schema::{JsonOptions, Kind, PropertyOrder};
use specdec_core::constrain::{
    CompiledGrammar, Constraint, GrammarError, GrammarLimits, Matcher, Vocabulary,
};
use specdec_core::testing;

fn byte_vocab() -> Arc<Vocabulary> {
    let mut t: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
    t.push(None);
    Arc::new(Vocabulary::new(t, &[256], None).unwrap())
}

fn compile_with(schema: Value, opts: JsonOptions) -> Result<CompiledGrammar, GrammarError> {
    CompiledGrammar::from_json_schema(byte_vocab(), &schema, &opts, GrammarLimits::default())
}

fn compile(schema: Value) -> CompiledGrammar {
    compile_with(schema, JsonOptions::default()).unwrap()
}

fn check(g: &CompiledGrammar, good: &[&str], bad: &[&str]) {
    for s in good {
        assert!(g.matches(s.as_bytes()).unwrap(), "{s:?} should match");
        serde_json::from_str::<Value>(s).expect("accepted texts are JSON");
    }
    for s in bad {
        assert!(!g.matches(s.as_bytes()).unwrap(), "{s:?} should not match");
    }
}

#[test]
fn scalar_types_enum_const() {
    check(
        &compile(json!({"type": "integer"})),
        // By value: a zero fraction, and exponents whose value is an integer.
        &["0", "-12", "1.0", "-3.00", "1e2", "1.5e1", "-0"],
        // (Finite doubles only, written as floats print them: a spelling approximation.)
        &[
            "1.5", "01", "\"1\"", "1.5e0", "1.", "1.0.0", "1e400", "1.8e308", "15e0",
        ],
    );
    check(
        &compile(json!({"type": "number"})),
        &["1.5e3", "-0"],
        &["1.", "+1"],
    );
    check(
        &compile(json!({"type": ["string", "null"]})),
        &["\"a\\n\"", "null"],
        &["1"],
    );
    check(
        &compile(json!({"enum": ["a", 1, null, [1, 2]]})),
        &["\"a\"", "1", "null", "[1, 2]", "[1,2]"],
        &["\"b\"", "2"],
    );
    check(
        &compile(json!({"const": {"k": true}})),
        &["{\"k\": true}", "{ \"k\":true }"],
        &["{\"k\": false}", "{}"],
    );
    check(
        &compile(json!({"type": "boolean"})),
        &["true", "false"],
        &["null"],
    );
}

#[test]
fn integer_bounds() {
    let g = compile(json!({"type": "integer", "minimum": -12, "exclusiveMaximum": 100}));
    check(
        &g,
        &["-12", "0", "99", "7", "-0", "99.00", "-12.0"],
        // (Exponents are not written under bounds: a spelling approximation.)
        &["-13", "100", "1000", "007", "99.5", "100.0", "1e1"],
    );
    let g = compile(json!({"type": "integer", "exclusiveMinimum": 2.5}));
    check(&g, &["3", "123456789012"], &["2", "-5"]);
    let e = compile_with(
        json!({"type": "integer", "minimum": 3, "maximum": 2}),
        JsonOptions::default(),
    );
    assert!(e
        .unwrap_err()
        .to_string()
        .contains("no integer lies in [3, 2]"));
    // Multiples within bounds: the remainder automaton intersected with the range.
    check(
        &compile(json!({"type": "number", "minimum": 0, "multipleOf": 2})),
        &["0", "2", "4.0", "1000"],
        &["-2", "3", "2.5", "2e0"],
    );
    check(
        &compile(json!({"type": "integer", "maximum": 10, "multipleOf": 0.5})),
        &["-7", "0", "10", "10.0"],
        &["11", "1.5", "12", "11.0"],
    );
    // Unbounded multiples with exponents: 12 = 2^2 * 3, so `m e k` needs 3 | m, k >= 2.
    check(
        &compile(json!({"type": "integer", "multipleOf": 12})),
        &["24", "24.0", "3e2", "1.2e3", "3.6e+003"],
        &["6", "6.0", "3e1", "1.3e3", "3e-2", "36e2"],
    );
    let e = compile_with(
        json!({"type": "integer", "multipleOf": 12345.678}),
        JsonOptions::default(),
    );
    let e = e.unwrap_err();
    assert!(e.to_string().contains("multipleOf 12345.678"), "{e}");
    assert!(
        matches!(&e, GrammarError::Inexact { keyword, pointer, .. } if keyword == "multipleOf" && pointer == "#")
    );
    check(
        &compile(json!({"type": "number", "exclusiveMinimum": -1.5, "maximum": 2})),
        &["-1.25", "0", "2", "2.000", "1.99"],
        &["-1.5", "-2", "2.01", "3", "1e0", "-0"],
    );
}

#[test]
fn strings_pattern_length_format() {
    check(
        &compile(json!({"type": "string", "minLength": 2, "maxLength": 3})),
        &["\"ab\"", "\"a\\nb\""],
        &["\"a\"", "\"abcd\""],
    );
    check(
        &compile(json!({"type": "string", "pattern": "^[a-z]+[0-9]$"})),
        &["\"ab1\""],
        &["\"1\"", "\"ab1x\""],
    );
    // Unanchored: the pattern may occur anywhere.
    check(
        &compile(json!({"type": "string", "pattern": "ab"})),
        &["\"xxaby\"", "\"ab\""],
        &["\"ba\""],
    );
    check(
        &compile(json!({"type": "string", "pattern": "a", "maxLength": 2})),
        &["\"a\"", "\"xa\""],
        &["\"xxa\"", "\"b\""],
    );
    check(
        &compile(json!({"type": "string", "format": "date"})),
        &["\"2024-02-29\""],
        &["\"2024-13-01\""],
    );
    check(
        &compile(json!({"type": "string", "format": "uuid"})),
        &["\"123e4567-e89b-12d3-a456-426614174000\""],
        &["\"123\""],
    );
}

#[test]
fn objects_properties_required_additional() {
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
        "required": ["b"],
        "additionalProperties": false
    });
    check(
        &compile(schema.clone()),
        &[
            "{\"b\": \"x\"}",
            "{\"a\": 1, \"b\": \"x\", \"c\": true}",
            "{ \"b\":\"x\" , \"c\":false }",
            "{\"b\": \"x\", \"a\": 1}",
            "{\"c\": true, \"b\": \"x\", \"a\": 1}",
        ],
        &[
            "{}",
            "{\"a\": 1}",
            "{\"b\": \"x\", \"d\": 1}",
            "{\"b\": \"x\",}",
            "{\"b\": \"x\", \"b\": \"y\"}",
        ],
    );
    // Declared order on request (OpenAI-style).
    let declared = JsonOptions {
        property_order: PropertyOrder::Declared,
        ..JsonOptions::default()
    };
    check(
        &compile_with(schema.clone(), declared).unwrap(),
        &["{\"a\": 1, \"b\": \"x\"}"],
        &["{\"b\": \"x\", \"a\": 1}"],
    );
    // Without additionalProperties: extra properties after the declared ones...
    let open = json!({"properties": {"a": {"type": "integer"}}});
    check(
        &compile(open.clone()),
        &["{}", "{\"a\": 1, \"z\": [null]}", "{\"z\": {}}"],
        &["{\"a\": \"x\"}"],
    );
    // ...unless closed.
    let strict = JsonOptions {
        closed: true,
        ..JsonOptions::default()
    };
    let g = compile_with(open, strict).unwrap();
    check(&g, &["{\"a\": 1}", "{}"], &["{\"z\": 1}"]);
    let typed = json!({"type": "object", "additionalProperties": {"type": "integer"}});
    check(
        &compile(typed),
        &["{\"x\": 1, \"y\": 2}"],
        &["{\"x\": \"1\"}"],
    );
}

#[test]
fn arrays_items_prefix_bounds() {
    check(
        &compile(
            json!({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}),
        ),
        &["[1]", "[1, 2, 3]", "[ 1 ,2 ]"],
        &["[]", "[1, 2, 3, 4]", "[\"a\"]", "[1,]"],
    );
    check(
        &compile(json!({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})),
        &["[]", "[\"a\"]", "[\"a\", 1]"],
        &["[1]", "[\"a\", 1, 2]"],
    );
    check(
        &compile(
            json!({"prefixItems": [{"const": 0}], "items": {"type": "boolean"}, "minItems": 2}),
        ),
        &["[0, true]", "[0, true, false, true]"],
        &["[0]", "[true, true]"],
    );
    check(
        &compile(json!({"type": "array"})),
        &["[]", "[1, \"a\", {\"b\": []}]"],
        &["[1 2]"],
    );
}

#[test]
fn combinators_and_recursive_refs() {
    let tree = json!({
        "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "integer"},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}
        }, "required": ["v"], "additionalProperties": false}},
        "$ref": "#/$defs/node"
    });
    check(
        &compile(tree),
        &[
            "{\"v\": 1}",
            "{\"v\": 1, \"kids\": [{\"v\": 2, \"kids\": [{\"v\": 3}]}, {\"v\": 4}]}",
        ],
        &["{\"v\": 1, \"kids\": [{}]}", "{\"kids\": []}"],
    );
    check(
        &compile(json!({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})),
        &["1", "\"a\""],
        &["\"ab\""],
    );
    check(
        &compile(json!({"oneOf": [{"const": 1}, {"const": 2}]})),
        &["1", "2"],
        &["3"],
    );
    let merged = json!({"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"properties": {"b": {"type": "null"}}, "required": ["b"]}
    ]});
    check(
        &compile(merged),
        &["{\"a\": 1, \"b\": null}"],
        &["{\"a\": 1}", "{\"b\": null}"],
    );
    // additionalProperties reads its own member's properties: merging would let "a" through.
    let closed = json!({"allOf": [
        {"properties": {"a": {"type": "integer"}}},
        {"properties": {"b": {"type": "null"}}, "additionalProperties": false}
    ]});
    let e = compile_with(closed, JsonOptions::default()).unwrap_err();
    assert!(e
        .to_string()
        .contains("additionalProperties beside properties of another member"));
    let self_ref = json!({"type": "array", "items": {"$ref": "#"}});
    check(&compile(self_ref), &["[]", "[[], [[]]]"], &["[1]"]);
}

#[test]
fn layout_options() {
    let compact = JsonOptions {
        whitespace: false,
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        closed: true,
        ..JsonOptions::default()
    };
    let g = compile_with(
        json!({"properties": {"a": {"type": "array"}, "b": {"const": [1, 2]}}}),
        compact,
    )
    .unwrap();
    check(
        &g,
        &["{\"a\": [1, 2], \"b\": [1, 2]}", "{}"],
        &["{\"a\":[1, 2]}", "{ \"a\": [] }", "{\"b\": [1,2]}"],
    );
}

#[test]
fn unsupported_keywords_are_listed() {
    let e = compile_with(
        json!({"type": ["object", "array"], "properties": {"n": {"type": "integer", "unevaluatedItems": false}, "s": {"not": {"minLength": 1, "maxLength": 3}}}, "uniqueItems": true, "x-ignored": 1}),
        JsonOptions::default(),
    )
    .unwrap_err();
    // Strict: one error, naming the first keyword that cannot be exact and where.
    let m = e.to_string();
    assert!(m.contains("unevaluatedItems at #/properties/n"), "{m}");
    assert!(m.contains("2 more inexact places"), "{m}");
    assert!(matches!(e, GrammarError::Inexact { .. }));
    // Not strict: compiled, each approximation listed with how it differs.
    let lax = JsonOptions {
        strict: false,
        ..JsonOptions::default()
    };
    let g = compile_with(
        json!({"type": ["object", "array"], "properties": {"n": {"type": "integer", "unevaluatedItems": false}, "s": {"not": {"minLength": 1, "maxLength": 3}}}, "uniqueItems": true, "x-ignored": 1}),
        lax,
    )
    .unwrap();
    let listed: Vec<(&str, &str, Kind)> = (g.approximations().iter())
        .filter(|a| a.kind != Kind::Spelling)
        .map(|a| (a.keyword.as_str(), a.pointer.as_str(), a.kind))
        .collect();
    for k in [
        ("unevaluatedItems", "#/properties/n", Kind::Superset),
        ("not", "#/properties/s", Kind::Superset),
        ("uniqueItems", "#", Kind::Superset),
    ] {
        assert!(listed.contains(&k), "{listed:?}");
    }
    // Keywords outside the JSON Schema vocabularies are annotations.
    assert!(!listed.iter().any(|a| a.0 == "x-ignored"), "{listed:?}");
    let bad_ref =
        compile_with(json!({"$ref": "#/$defs/missing"}), JsonOptions::default()).unwrap_err();
    assert!(bad_ref.to_string().contains("points to nothing"));
    let remote =
        compile_with(json!({"$ref": "http://x/y.json"}), JsonOptions::default()).unwrap_err();
    assert!(remote.to_string().contains("same document"));
    let cycle = json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "allOf": [{"$ref": "#/$defs/a"}]});
    let e = compile_with(cycle, JsonOptions::default()).unwrap_err();
    assert!(e.to_string().contains("cycle"), "{e}");
    let self_ref = compile_with(json!({"$ref": "#"}), JsonOptions::default()).unwrap_err();
    assert!(self_ref.to_string().contains("derives no finite string"));
    let deep = (0..40).fold(
        json!({"type": "integer"}),
        |s, _| json!({"type": "array", "items": s}),
    );
    let lim = GrammarLimits {
        max_depth: 8,
        ..GrammarLimits::default()
    };
    let e = CompiledGrammar::from_json_schema(byte_vocab(), &deep, &JsonOptions::default(), lim)
        .unwrap_err();
    assert!(matches!(e, GrammarError::TooLarge(_)));
}

fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "yz"]}}, "required": ["a"], "additionalProperties": false}),
        json!({"type": "array", "items": {"anyOf": [{"type": "boolean"}, {"$ref": "#"}]}, "maxItems": 3}),
        json!({"type": "string", "pattern": "^a[bc]*$", "maxLength": 5}),
        json!({}),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(testing::cases(32)))]

    #[test]
    fn masks_equal_brute_force(
        which in 0..4usize,
        tokens in prop::collection::vec(prop::collection::vec(prop::sample::select(b"{}[],:\" ab1xyztruefalsn-".to_vec()), 1..5), 4..40),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let n = tokens.len();
        let mut t: Vec<Option<Vec<u8>>> = tokens.into_iter().map(Some).collect();
        t.push(None);
        let v = Arc::new(Vocabulary::new(t, &[n as i64], None).unwrap());
        let g = Arc::new(CompiledGrammar::from_json_schema(v.clone(), &schemas()[which], &JsonOptions::default(), GrammarLimits::default()).unwrap());
        let mut m = Matcher::new(g.clone());
        let mut text = Vec::new();
        for pick in picks {
            let mut mask = vec![0u32; v.words()];
            m.fill_bitmask(&mut mask).unwrap();
            let mut brute = vec![0u32; v.words()];
            g.brute_force_mask(m.state(), &mut brute);
            prop_assert_eq!(&mask, &brute);
            let ids: Vec<usize> = (0..v.vocab_size()).filter(|&t| mask[t / 32] >> (t % 32) & 1 == 1).collect();
            if ids.is_empty() || m.is_terminated() {
                break;
            }
            let t = ids[pick.index(ids.len())];
            prop_assert!(m.accept_token(t as i64).unwrap());
            if v.is_eos(t) {
                // A finished text is JSON.
                prop_assert!(serde_json::from_slice::<Value>(&text).is_ok(), "{:?}", String::from_utf8_lossy(&text));
            }
            text.extend_from_slice(v.token_bytes(t));
        }
    }
}

#[test]
fn parser_state_cap_is_a_clear_error() {
    // Nested arrays need a new parser state per level: a small cap is reached quickly.
    let limits = GrammarLimits {
        max_states: 64,
        ..GrammarLimits::default()
    };
    let g = CompiledGrammar::from_json_schema(
        byte_vocab(),
        &json!({"type": "array", "items": {"$ref": "#"}}),
        &JsonOptions::default(),
        limits,
    )
    .unwrap();
    let e = g
        .step_bytes(g.start(), &b"[".repeat(200))
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than 64 parser states (max_states)"), "{e}");
    assert!(g.num_states() <= 64);
}

// ---------------------------------------------------------------------------------------
// Wide vocabularies: the mask paths that settle whole subtrees (string bodies), count string
// lengths in the lexeme state, and build masks as lists, bitmaps or complements need
// vocabularies of hundreds of tokens mixing text, quotes, escapes, control bytes, multi-byte
// characters (some excluded by `\s`), cut and invalid UTF-8.

#[rustfmt::skip]
const PIECES: &[&[u8]] = &[
    b"a", b"b", b"x", b"u", b"n", b"1", b"9", b":", b" ", b"\n", b"\t", b"\x01", b"\"", b"\\",
    b"{", b"}", b"[", b"]", b",", b"\xc3\xa9", b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80",
    b"\xc2\xa0", b"\xe2\x80\xa8", b"\xc3", b"\xe4\xb8", b"\x80", b"\xff", b"ab", b"abc",
];

fn wide_tokens() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let token =
        prop::collection::vec(prop::sample::select(PIECES), 1..5).prop_map(|ps| ps.concat());
    prop::collection::vec(token, 300..1200)
}

fn wide_schemas() -> Vec<Value> {
    vec![
        json!({"type": "string", "minLength": 2, "maxLength": 5}),
        json!({"type": "string", "maxLength": 1000}),
        json!({"type": "string", "minLength": 12}),
        json!({"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 40}}),
        json!({"type": "string", "pattern": "^[^:\\s]+:[^:\\s]+$"}),
        json!({"type": "object", "properties": {"ab": {"type": "string"}, "abc": {"type": "integer"}}}),
        json!({"type": "string"}),
        // A multi-byte character that leads out of the body state, alive.
        json!({"type": "string", "pattern": "^[^\u{e9}:]*(?:\u{e9}[^\u{e9}:]*)?$"}),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(testing::cases(24)))]

    #[test]
    fn wide_vocab_masks_equal_brute_force(
        which in 0..8usize,
        tokens in wide_tokens(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let n = tokens.len();
        let mut t: Vec<Option<Vec<u8>>> = tokens.into_iter().map(Some).collect();
        t.push(None);
        let v = Arc::new(Vocabulary::new(t, &[n as i64], None).unwrap());
        let schema = &wide_schemas()[which];
        let g = Arc::new(CompiledGrammar::from_json_schema(v.clone(), schema, &JsonOptions::default(), GrammarLimits::default()).unwrap());
        let mut m = Matcher::new(g.clone());
        for pick in picks {
            let mut mask = vec![0u32; v.words()];
            m.fill_bitmask(&mut mask).unwrap();
            let mut brute = vec![0u32; v.words()];
            g.brute_force_mask(m.state(), &mut brute);
            prop_assert_eq!(&mask, &brute);
            let ids: Vec<usize> = (0..v.vocab_size()).filter(|&t| mask[t / 32] >> (t % 32) & 1 == 1).collect();
            if ids.is_empty() || m.is_terminated() {
                break;
            }
            prop_assert!(m.accept_token(ids[pick.index(ids.len())] as i64).unwrap());
        }
    }

    /// A length-bounded string (its count kept in the lexeme state) accepts exactly what the
    /// unrolled regex `"(?:char){min,max}"`, compiled by regex-automata, accepts.
    #[test]
    fn counted_strings_match_the_unrolled_regex(
        min in 0u64..4,
        span in prop::option::of(0u64..6),
        texts in prop::collection::vec(prop::collection::vec(prop::sample::select(PIECES), 0..8), 1..20),
    ) {
        let max = span.map(|s| min + s);
        let mut schema = json!({"type": "string", "minLength": min});
        if let Some(m) = max {
            schema["maxLength"] = json!(m);
        }
        let g = compile(schema);
        let char_re = r#"(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))"#;
        let bounds = match max {
            Some(m) => format!("{{{min},{m}}}"),
            None => format!("{{{min},}}"),
        };
        let re = regex_automata::meta::Regex::new(&format!("^\"{char_re}{bounds}\"$")).unwrap();
        for pieces in texts {
            // Inside quotes, and as written (the quotes among the pieces).
            let body = pieces.concat();
            for text in [[&b"\""[..], &body, b"\""].concat(), body] {
                prop_assert_eq!(g.matches(&text).unwrap(), re.is_match(&text[..]), "{:?}", String::from_utf8_lossy(&text));
            }
        }
    }
}

/// Exhaustively: every text of up to three tokens over a small vocabulary (whose tokens
/// repeat pieces so that subtrees are deep), masks equal brute force in every state reached.
#[test]
fn small_vocab_masks_equal_brute_force_exhaustively() {
    let pieces: &[&[u8]] = &[b"a", b"\"", b"\xc3\xa9", b" ", b"\\", b"\xc2\xa0", b":"];
    // Under "b", only text (whole subtrees a walk may settle); elsewhere everything.
    let text: &[&[u8]] = &[b"b", b"\xc3\xa9", b" ", b"\xc3\xa8"];
    let mut tokens: Vec<Option<Vec<u8>>> = Vec::new();
    for a in pieces {
        tokens.push(Some(a.to_vec()));
        for b in pieces {
            tokens.push(Some([*a, *b].concat()));
        }
    }
    for a in text {
        for b in text {
            tokens.push(Some([b"b", *a, *b].concat()));
            for c in text {
                tokens.push(Some([b"b", *a, *b, *c].concat()));
            }
        }
    }
    let n = tokens.len();
    tokens.push(None);
    let v = Arc::new(Vocabulary::new(tokens, &[n as i64], None).unwrap());
    for schema in wide_schemas() {
        let g = Arc::new(
            CompiledGrammar::from_json_schema(
                v.clone(),
                &schema,
                &JsonOptions::default(),
                GrammarLimits::default(),
            )
            .unwrap(),
        );
        let mut frontier = vec![Matcher::new(g.clone())];
        for _ in 0..3 {
            let mut next = Vec::new();
            for m in &frontier {
                let mut mask = vec![0u32; v.words()];
                m.fill_bitmask(&mut mask).unwrap();
                let mut brute = vec![0u32; v.words()];
                g.brute_force_mask(m.state(), &mut brute);
                assert_eq!(mask, brute, "{schema}");
                // Follow a few allowed tokens (spread over the ids) to keep it small.
                let ids: Vec<usize> = (0..n)
                    .filter(|&t| mask[t / 32] >> (t % 32) & 1 == 1)
                    .collect();
                for &t in ids.iter().step_by(ids.len().div_ceil(12).max(1)) {
                    let mut f = m.clone();
                    assert!(f.accept_token(t as i64).unwrap());
                    next.push(f);
                }
            }
            frontier = next;
        }
    }
}
