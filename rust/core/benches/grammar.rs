//! Criterion benches of the regex constraint on the Tekken 131k vocabulary (path from
//! `SPECDEC_TEKKEN`, else found through the installed `mistral_common`; a synthetic
//! vocabulary otherwise): regex compile, cached mask, uncached trie walk, tree masks; and
//! a JSON Schema's cold mask fills along documents from one thread and from two.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use serde_json::json;
use specdec_core::constrain::grammar::json_schema::JsonOptions;
use specdec_core::constrain::{
    fill_tree_bitmask, CompiledGrammar, CompiledRegex, GrammarLimits, Matcher, RegexLimits,
    Vocabulary,
};

fn tekken_path() -> Option<String> {
    if let Ok(p) = std::env::var("SPECDEC_TEKKEN") {
        return Some(p);
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import mistral_common,os;print(os.path.join(os.path.dirname(mistral_common.__file__),'data','tekken_240911.json'))",
        ])
        .output()
        .ok()?;
    let p = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    std::path::Path::new(&p).exists().then_some(p)
}

fn vocab() -> Arc<Vocabulary> {
    if let Some(p) = tekken_path() {
        let data = std::fs::read(p).expect("read tekken");
        return Arc::new(Vocabulary::from_tekken_json(&data, None).expect("tekken"));
    }
    // Synthetic: all 1..3-letter lowercase strings plus digits and punctuation.
    let mut toks: Vec<Option<Vec<u8>>> = vec![None, None, None];
    for a in b'a'..=b'z' {
        toks.push(Some(vec![a]));
        for b in b'a'..=b'z' {
            toks.push(Some(vec![a, b]));
            for c in b'a'..=b'z' {
                toks.push(Some(vec![b' ', a, b, c]));
            }
        }
    }
    for d in b' '..=b'@' {
        toks.push(Some(vec![d]));
    }
    Arc::new(Vocabulary::new(toks, &[2], None).unwrap())
}

fn grammar(v: &Arc<Vocabulary>, p: &str, cache: usize) -> Arc<CompiledRegex> {
    Arc::new(CompiledRegex::new(v.clone(), p, RegexLimits::default(), cache).unwrap())
}

fn benches(c: &mut Criterion) {
    let v = vocab();
    let words = v.words();
    let mut g = c.benchmark_group("grammar");
    g.bench_function("compile date regex", |b| {
        b.iter(|| grammar(&v, black_box(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"), 1 << 20))
    });
    let quoted = r#""([^"\\]|\\.)*""#;
    let cached = grammar(&v, quoted, 1 << 28);
    let mut m = Matcher::new(cached.clone());
    m.accept_token(1000 + b'"' as i64).unwrap();
    let mut out = vec![0u32; words];
    g.bench_function("mask cached (quoted string)", |b| {
        b.iter(|| m.fill_bitmask(black_box(&mut out)).unwrap())
    });
    let uncached = grammar(&v, quoted, 0);
    let mut mu = Matcher::new(uncached);
    mu.accept_token(1000 + b'"' as i64).unwrap();
    g.bench_function("mask trie walk uncached (quoted string, inside)", |b| {
        b.iter(|| mu.fill_bitmask(black_box(&mut out)).unwrap())
    });
    let digits = grammar(&v, r"[0-9]+", 0);
    let md = Matcher::new(digits);
    g.bench_function("mask trie walk uncached ([0-9]+)", |b| {
        b.iter(|| md.fill_bitmask(black_box(&mut out)).unwrap())
    });
    for n in [64usize, 256] {
        // A chain-and-fan tree of quote-free tokens under the open quote.
        let tokens: Vec<i64> = (0..n as i64)
            .map(|i| if i == 0 { 0 } else { 1000 + 97 + i % 20 })
            .collect();
        let parents: Vec<i32> = (0..n as i32)
            .map(|i| if i == 0 { -1 } else { (i - 1) / 4 })
            .collect();
        let mut buf = vec![0u32; n * words];
        g.bench_function(format!("tree mask {n} nodes (warm)"), |b| {
            b.iter(|| fill_tree_bitmask(&m, &tokens, &parents, black_box(&mut buf), words).unwrap())
        });
    }
    g.finish();
}

/// A schema whose bounds and patterns change with `k` (the documents below match every
/// version): each compile has lexemes whose trie walks no earlier compile cached.
fn person_schema(k: usize) -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 60 + k},
            "age": {"type": "integer", "minimum": 0},
            "email": {"type": "string", "pattern": format!("^[a-z.]+@[a-z]{{1,{}}}\\.[a-z]{{2,3}}$", 20 + k)},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 30 + k}},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "zip": {"type": "string", "pattern": format!("^[0-9]{{{},5}}$", 1 + k % 4)},
                },
                "required": ["city"],
            },
            "score": {"type": "number"},
        },
        "required": ["name", "age"],
    })
}

const PERSON_DOCS: [&str; 4] = [
    r#"{"name": "Alice Smith", "age": 31, "email": "alice@example.org", "tags": ["admin", "ops"]}"#,
    r#"{"name": "Bob", "age": 4, "address": {"city": "Paris", "zip": "75001"}, "score": 0.5}"#,
    r#"{"name": "Chloe Martin", "age": 57, "tags": [], "score": -12.25e3}"#,
    r#"{"name": "Dmitri", "age": 0, "email": "d.k@mail.ru", "address": {"city": "Omsk"}}"#,
];

/// A fresh grammar (cold masks) and a matcher at every prefix of every document (one byte a
/// token): a batch of requests of one schema at different places.
fn cold_batch(g: Arc<CompiledGrammar>, docs: &[Vec<i64>]) -> Vec<Matcher<CompiledGrammar>> {
    let mut out = Vec::new();
    for doc in docs {
        let mut m = Matcher::new(g.clone());
        out.push(m.clone());
        for &t in doc {
            assert!(m.accept_token(t).unwrap());
            out.push(m.clone());
        }
    }
    out
}

fn schema_benches(c: &mut Criterion) {
    let v = vocab();
    let words = v.words();
    let byte_token = |b: u8| {
        (0..v.vocab_size())
            .find(|&t| v.has_bytes(t) && v.token_bytes(t) == [b])
            .expect("a token per byte") as i64
    };
    let docs: Vec<Vec<i64>> = (PERSON_DOCS.iter())
        .map(|d| d.bytes().map(byte_token).collect())
        .collect();
    let k = AtomicUsize::new(0);
    let setup = || {
        let schema = person_schema(k.fetch_add(1, Ordering::Relaxed));
        let opts = JsonOptions::default();
        let g =
            CompiledGrammar::from_json_schema(v.clone(), &schema, &opts, GrammarLimits::default());
        cold_batch(Arc::new(g.unwrap()), &docs)
    };
    let mut g = c.benchmark_group("json schema batch fill (cold)");
    g.sample_size(20);
    for threads in [1usize, 2] {
        g.bench_function(
            format!("{} matchers, {threads} threads", setup().len()),
            |b| {
                b.iter_batched(
                    setup,
                    |batch| {
                        std::thread::scope(|s| {
                            for part in 0..threads {
                                let batch = &batch;
                                s.spawn(move || {
                                    let mut out = vec![0u32; words];
                                    for m in batch.iter().skip(part).step_by(threads) {
                                        m.fill_bitmask(&mut out).unwrap();
                                    }
                                });
                            }
                        })
                    },
                    BatchSize::PerIteration,
                )
            },
        );
    }
    g.finish();
}

criterion_group!(grammar_benches, benches, schema_benches);
criterion_main!(grammar_benches);
