//! Tests of the context-free grammar constraint: trie-walk masks equal brute force (every
//! token's bytes through the parser) along random walks; acceptance agrees with independent
//! recognizers (serde_json for JSON, a hand-written recursive descent for arithmetic, a
//! counter for balanced parentheses, regex-automata for one-lexeme grammars); GBNF accept
//! and reject examples; fork/rollback; errors for bad or oversized grammars.

use std::sync::Arc;

use proptest::prelude::*;
use specdec_core::constrain::{
    CompiledGrammar, CompiledRegex, Constraint, GrammarError, GrammarLimits, Matcher, RegexLimits,
    Vocabulary,
};
use specdec_core::testing;

const JSON: &str = r#"
# Strict JSON (RFC 8259), as serde_json reads it.
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* ws )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n\r]*
"#;

const ARITH: &str = r#"
root   ::= expr
expr   ::= term ( [-+] term )*
term   ::= factor ( [*/] factor )*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
"#;

const PARENS: &str = r#"root ::= ( "(" root ")" )*"#;

const C_LIKE: &str = r#"
root    ::= ws ( func ws )+
func    ::= type " " ident "(" params? ")" ws block
type    ::= "int" | "void"
params  ::= type " " ident ( "," ws type " " ident )*
block   ::= "{" ws ( stmt ws )* "}"
stmt    ::= "return" ( " " expr )? ";"
          | type " " ident ws "=" ws expr ws ";"
          | "if" ws "(" expr ")" ws block ( ws "else" ws block )?
          | ident ws "=" ws expr ws ";"
          | block
expr    ::= atom ( ws [-+*<] ws atom )*
atom    ::= ident | [0-9]+ | "(" expr ")" | ident "(" ( expr ( "," ws expr )* )? ")"
ident   ::= [a-z_] [a-z0-9_]*
ws      ::= [ \n]*
"#;

fn vocab(tokens: Vec<Option<Vec<u8>>>) -> Arc<Vocabulary> {
    // The last id is EOS.
    let eos = tokens.len() as i64;
    let mut tokens = tokens;
    tokens.push(None);
    Arc::new(Vocabulary::new(tokens, &[eos], None).unwrap())
}

fn gbnf(v: Arc<Vocabulary>, text: &str) -> Arc<CompiledGrammar> {
    Arc::new(CompiledGrammar::from_gbnf(v, text, GrammarLimits::default()).unwrap())
}

fn byte_vocab() -> Arc<Vocabulary> {
    vocab((0..=255u8).map(|b| Some(vec![b])).collect())
}

fn accepts(g: &CompiledGrammar, s: &str) -> bool {
    g.matches(s.as_bytes()).unwrap()
}

fn mask_of<C: Constraint>(m: &Matcher<C>) -> Vec<u32> {
    let mut out = vec![0u32; m.grammar().vocab().words()];
    m.fill_bitmask(&mut out).unwrap();
    out
}

fn allowed(mask: &[u32], n: usize) -> Vec<usize> {
    (0..n)
        .filter(|&t| mask[t / 32] >> (t % 32) & 1 == 1)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Independent recognizers

/// Arithmetic per ARITH, by recursive descent.
fn arith_ok(s: &[u8]) -> bool {
    fn expr(s: &[u8], i: &mut usize) -> bool {
        if !term(s, i) {
            return false;
        }
        while *i < s.len() && (s[*i] == b'+' || s[*i] == b'-') {
            *i += 1;
            if !term(s, i) {
                return false;
            }
        }
        true
    }
    fn term(s: &[u8], i: &mut usize) -> bool {
        if !factor(s, i) {
            return false;
        }
        while *i < s.len() && (s[*i] == b'*' || s[*i] == b'/') {
            *i += 1;
            if !factor(s, i) {
                return false;
            }
        }
        true
    }
    fn factor(s: &[u8], i: &mut usize) -> bool {
        match s.get(*i) {
            Some(b'0'..=b'9') => {
                while s.get(*i).is_some_and(u8::is_ascii_digit) {
                    *i += 1;
                }
                true
            }
            Some(b'(') => {
                *i += 1;
                let ok = expr(s, i) && s.get(*i) == Some(&b')');
                *i += 1;
                ok
            }
            Some(b'-') => {
                *i += 1;
                factor(s, i)
            }
            _ => false,
        }
    }
    let mut i = 0;
    expr(s, &mut i) && i == s.len()
}

/// Balanced parentheses: (is a viable prefix, is complete).
fn parens(s: &[u8]) -> (bool, bool) {
    let mut d = 0i64;
    for &c in s {
        d += if c == b'(' { 1 } else { -1 };
        if d < 0 || (c != b'(' && c != b')') {
            return (false, false);
        }
    }
    (true, d == 0)
}

// ---------------------------------------------------------------------------------------
// Examples

#[test]
fn json_examples() {
    let g = gbnf(byte_vocab(), JSON);
    for ok in [
        "{}",
        " [ ] ",
        r#"{"a": [1, -2.5e+3, true, null], "b": {"c": "d\n\u00e9"}}"#,
        "0",
        "\"é\"",
        "[[[[]]]]",
    ] {
        assert!(accepts(&g, ok), "{ok:?} should match");
    }
    for bad in [
        "{",
        "[1,]",
        "01",
        "{\"a\" 1}",
        "\"\\x\"",
        "tru",
        "[1 2]",
        "\"\u{1}\"",
    ] {
        assert!(!accepts(&g, bad), "{bad:?} should not match");
    }
}

#[test]
fn arithmetic_examples() {
    let g = gbnf(byte_vocab(), ARITH);
    for (s, ok) in [
        ("1+2*3", true),
        ("((1))", true),
        ("--4/(2-1)", true),
        ("1+", false),
        ("(1", false),
        ("1)", false),
        ("", false),
        ("12*(3+4)-5", true),
    ] {
        assert_eq!(accepts(&g, s), ok, "{s:?}");
        assert_eq!(arith_ok(s.as_bytes()), ok, "oracle on {s:?}");
    }
}

#[test]
fn c_like_examples() {
    let g = gbnf(byte_vocab(), C_LIKE);
    let good = "int main() {\n  int x = 1 + f(2, y);\n  if (x < 3) { return x; } else { x = 0; }\n  return;\n}\nvoid g(int a, int b) {}";
    assert!(accepts(&g, good));
    for bad in [
        "int main() { return 1 }",
        "int main() { x = ; }",
        "main() {}",
        "int main() { if x {} }",
        "int main() {",
    ] {
        assert!(!accepts(&g, bad), "{bad:?} should not match");
    }
    // Every proper prefix of a good program is alive, and nothing else is accepted.
    for i in 0..good.len() {
        assert_ne!(
            g.run_from_start(&good.as_bytes()[..i]).unwrap(),
            CompiledGrammar::DEAD
        );
    }
}

#[test]
fn gbnf_syntax_features() {
    let v = byte_vocab();
    let g = gbnf(
        v.clone(),
        r#"root ::= "a"{2,3} [^a-c]? x{2} # comment
x ::= "\x41" | "\u00e9" | [\]\[]"#,
    );
    for (s, ok) in [
        ("aaAA", true),
        ("aaazAé", true),
        ("aa[]", true),
        ("aaaaAA", false),
        ("aabAA", false),
        ("aA", false),
    ] {
        assert_eq!(accepts(&g, s), ok, "{s:?}");
    }
    // `[]` matches nothing, `[^]` any character.
    let empty = gbnf(v.clone(), "root ::= \"a\" | [] \"b\" | [^] \"c\"");
    assert!(accepts(&empty, "a") && accepts(&empty, "\u{e9}c"));
    assert!(!accepts(&empty, "b") && !accepts(&empty, "c"));
    let any = gbnf(v, "root ::= . . \"\"");
    assert!(accepts(&any, "é\n"));
    assert!(!accepts(&any, "é"));
}

#[test]
fn gbnf_errors_are_clear() {
    let v = byte_vocab();
    let lim = GrammarLimits::default;
    let err =
        |text: &str, l: GrammarLimits| CompiledGrammar::from_gbnf(v.clone(), text, l).unwrap_err();
    let msg = |e: GrammarError| e.to_string();
    assert!(msg(err("root ::= foo", lim())).contains("undefined rules: foo"));
    assert!(msg(err("start ::= \"a\"", lim())).contains("no rule named \"root\""));
    assert!(msg(err("root ::= \"a\"\nroot ::= \"b\"", lim())).contains("defined twice"));
    assert!(msg(err("root ::= \"a\" (", lim())).contains("line 1"));
    assert!(msg(err("root ::= \"a\n\nx ::= [", lim())).contains("unterminated"));
    assert!(msg(err("root ::= \"\\q\"", lim())).contains("unknown escape"));
    assert!(msg(err("root ::= \"a\" root", lim())).contains("derives no finite string"));
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(40), ")".repeat(40));
    let small = GrammarLimits {
        max_depth: 8,
        ..lim()
    };
    assert!(matches!(err(&deep, small), GrammarError::TooLarge(_)));
    assert!(CompiledGrammar::from_gbnf(v.clone(), &deep, lim()).is_ok());
    let tiny = GrammarLimits {
        max_symbols: 10,
        ..lim()
    };
    let e = err("root ::= x{20}\nx ::= \"a\" | root", tiny);
    assert!(msg(e).contains("max_symbols"));
    let few_states = GrammarLimits {
        max_lexer_states: 3,
        ..lim()
    };
    assert!(msg(err("root ::= \"abcdef\"", few_states)).contains("max_lexer_states"));
}

#[test]
fn regex_grammar_masks_equal_the_regex_engine() {
    let tokens: Vec<Option<Vec<u8>>> = ["a", "b", "ab", "ba", "c", "abc", "é", "\u{e9}a", "x"]
        .iter()
        .map(|t| Some(t.as_bytes().to_vec()))
        .collect();
    let v = vocab(tokens);
    for p in ["(ab|ba)*c?", "a(bc|é)*", "[abc]{1,4}", "x?"] {
        let g =
            Arc::new(CompiledGrammar::from_regex(v.clone(), p, GrammarLimits::default()).unwrap());
        let r =
            Arc::new(CompiledRegex::new(v.clone(), p, RegexLimits::default(), 1 << 20).unwrap());
        let (mut mg, mut mr) = (Matcher::new(g), Matcher::new(r));
        for step in 0..6 {
            let (a, b) = (mask_of(&mg), mask_of(&mr));
            assert_eq!(a, b, "{p:?} step {step}");
            let ids = allowed(&a, v.vocab_size());
            let Some(&t) = ids.get(step % ids.len().max(1)) else {
                break;
            };
            assert!(mg.accept_token(t as i64).unwrap());
            assert!(mr.accept_token(t as i64).unwrap());
        }
    }
}

#[test]
fn fork_and_rollback_restore_states() {
    let tokens: Vec<Option<Vec<u8>>> = ["(", ")", "()", "(("]
        .iter()
        .map(|t| Some(t.as_bytes().to_vec()))
        .collect();
    let g = gbnf(vocab(tokens), PARENS);
    let mut m = Matcher::new(g);
    let s0 = m.state();
    assert_eq!(m.accept_tokens(&[3, 2, 1]).unwrap(), 3);
    let fork = m.fork();
    let mask = mask_of(&m);
    assert!(m.accept_token(1).unwrap());
    assert!(m.is_accepting());
    assert!(!m.accept_token(1).unwrap());
    m.rollback(1).unwrap();
    assert_eq!(m.state(), fork.state());
    assert_eq!(mask_of(&m), mask);
    m.rollback(3).unwrap();
    assert_eq!(m.state(), s0);
    assert!(m.rollback(1).is_err());
    // EOS only at depth 0, then only EOS.
    assert!(m.accept_token(4).unwrap());
    assert!(m.is_terminated());
    assert!(!m.accept_token(0).unwrap());
}

// ---------------------------------------------------------------------------------------
// Properties

fn small_tokens(alphabet: &'static [u8]) -> impl Strategy<Value = Vec<Option<Vec<u8>>>> {
    let tok = prop::collection::vec(prop::sample::select(alphabet), 1..4);
    prop::collection::vec(prop::option::weighted(0.95, tok), 4..40)
}

const GRAMMARS: &[(&str, &[u8])] = &[
    (JSON, b"{}[],:\"\\ -0123.eEtrunlfasb\n\xc3\xa9"),
    (ARITH, b"0123+-*/()"),
    (PARENS, b"()"),
    (C_LIKE, b"intvodrufe(){};=+<,0 \nxy_"),
];

/// Walk `picks` through the grammar, checking the trie-walk mask against brute force (and a
/// second, cached read) at every step; returns the texts reached.
fn walk_checks(
    g: Arc<CompiledGrammar>,
    picks: &[prop::sample::Index],
) -> Result<Vec<Vec<u8>>, TestCaseError> {
    let n = g.vocab().vocab_size();
    let mut m = Matcher::new(g.clone());
    let mut text = Vec::new();
    let mut texts = vec![text.clone()];
    for pick in picks {
        let mask = mask_of(&m);
        let mut brute = vec![0u32; mask.len()];
        g.brute_force_mask(m.state(), &mut brute);
        prop_assert_eq!(&mask, &brute);
        prop_assert_eq!(&mask_of(&m), &mask);
        let ids = allowed(&mask, n);
        if ids.is_empty() || m.is_terminated() {
            break;
        }
        let t = ids[pick.index(ids.len())];
        prop_assert!(m.accept_token(t as i64).unwrap());
        text.extend_from_slice(g.vocab().token_bytes(t));
        texts.push(text.clone());
    }
    Ok(texts)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(testing::cases(48)))]

    #[test]
    fn masks_equal_brute_force(
        which in 0..GRAMMARS.len(),
        tokens in small_tokens(b"{}[],:\"\\ -0123.eEtrunlfasb\n()+*/intvod;=<xy_"),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let (text, alphabet) = GRAMMARS[which];
        // Mostly tokens over the grammar's own alphabet, so walks go deep.
        let tokens: Vec<Option<Vec<u8>>> = tokens.into_iter().enumerate().map(|(i, t)| {
            t.map(|b| if i % 4 == 3 { b } else { b.iter().map(|&c| alphabet[c as usize % alphabet.len()]).collect() })
        }).collect();
        walk_checks(gbnf(vocab(tokens), text), &picks)?;
    }

    #[test]
    fn parens_masks_equal_counter_oracle(
        tokens in small_tokens(b"()"),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let v = vocab(tokens);
        let g = gbnf(v.clone(), PARENS);
        for text in walk_checks(g.clone(), &picks)? {
            let s = g.run_from_start(&text).unwrap();
            let mut mask = vec![0u32; v.words()];
            g.fill_mask(s, &mut mask).unwrap();
            for t in 0..v.vocab_size() {
                let want = if v.is_eos(t) {
                    parens(&text).1
                } else {
                    let mut e = text.clone();
                    e.extend_from_slice(v.token_bytes(t));
                    v.has_bytes(t) && parens(&e).0
                };
                prop_assert_eq!(mask[t / 32] >> (t % 32) & 1 == 1, want, "token {}", t);
            }
        }
    }

    #[test]
    fn arithmetic_agrees_with_recursive_descent(s in prop::collection::vec(prop::sample::select(b"12+-*/()".to_vec()), 0..12)) {
        let g = gbnf(byte_vocab(), ARITH);
        prop_assert_eq!(g.matches(&s).unwrap(), arith_ok(&s));
    }

    #[test]
    fn json_agrees_with_serde(value in json_value(), edit in any::<(prop::sample::Index, u8, u8)>(), pretty in any::<bool>()) {
        let g = gbnf(byte_vocab(), JSON);
        let mut s = if pretty { serde_json::to_string_pretty(&value) } else { serde_json::to_string(&value) }.unwrap().into_bytes();
        prop_assert!(g.matches(&s).unwrap());
        // One random edit: delete, or insert a JSON-ish byte.
        let at = edit.0.index(s.len() + 1);
        const INS: &[u8] = b"{}[],:\" -0.eE1\\u";
        match edit.1 % 3 {
            0 if at < s.len() => { s.remove(at); }
            1 => s.insert(at, INS[edit.2 as usize % INS.len()]),
            _ => {}
        }
        let parsed = serde_json::from_slice::<serde_json::Value>(&s);
        // serde_json also rejects numbers past f64's range, which the grammar cannot see.
        prop_assume!(!parsed.as_ref().is_err_and(|e| e.to_string().contains("out of range")));
        let want = parsed.is_ok();
        prop_assert_eq!(g.matches(&s).unwrap(), want, "{:?}", String::from_utf8_lossy(&s));
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-1000i64..1000).prop_map(Value::from),
        (-100.0f64..100.0).prop_map(Value::from),
        "[a-c é\"\\\\\n]{0,4}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-c]{0,2}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn parser_states_recur_across_repetitions() {
    // Origins are projected nodes, not whole sets, so the state after the k-th array element
    // (or object member, or string character) is the same for every k: a long text adds no
    // states, hence no new mask walks.
    let g = gbnf(byte_vocab(), JSON);
    // (The first elements differ: their origins still point at the array's opening.)
    let warm = r#"[{"k": [1, "s"]}, {"k": [2, "t"]}, {"k": [9, "v"]}, "#;
    assert_ne!(
        g.run_from_start(warm.as_bytes()).unwrap(),
        CompiledGrammar::DEAD
    );
    let before = g.num_states();
    let long = format!("{}{}", warm, r#"{"k": [3, "u"]}, "#.repeat(50));
    let end = g.run_from_start(long.as_bytes()).unwrap();
    assert_eq!(g.run_from_start(warm.as_bytes()).unwrap(), end);
    assert_eq!(g.num_states(), before);
    let p = gbnf(byte_vocab(), ARITH);
    p.run_from_start("1+2*3-4+".repeat(3).as_bytes()).unwrap();
    let before = p.num_states();
    p.run_from_start("1+2*3-4+".repeat(40).as_bytes()).unwrap();
    assert_eq!(p.num_states(), before);
}
