//! Bindings of `specdec_core::constrain`: `Vocabulary`, `RegexGrammar`, `CfgGrammar`,
//! `Matcher` (over either engine) newtypes,
//! bitmask fills into int32 numpy buffers (one row, a batch, a tree) with the GIL released,
//! and the grammar-aware DDTree builder.

use std::sync::Arc;

use numpy::{PyArray2, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rayon::prelude::*;
use specdec_core::constrain::grammar::json_schema::{JsonOptions, PropertyOrder};
use specdec_core::constrain::{
    self as core, CompiledGrammar, CompiledRegex, Constraint, ForcedLimits, GrammarError,
    GrammarFilter, GrammarLimits, RegexLimits,
};
use specdec_core::tree::{
    build_ddtree_filtered, check_sibling_tokens, check_tree_size, max_nodes, Marginals, TreeError,
};

use crate::arrays::{as_slice, read, vec1};
use crate::errors::OrRaise;
use crate::locked::Locked;
use crate::tree::{check_single_build, TreeArrays};

#[pyclass(module = "specdec._core", frozen)]
pub struct Vocabulary(pub Arc<core::Vocabulary>);

#[pymethods]
impl Vocabulary {
    /// Per-id bytes (`None` = special token), EOS ids and an optional padded size.
    #[new]
    #[pyo3(signature = (tokens, eos_ids, vocab_size=None))]
    fn new(
        py: Python<'_>,
        tokens: Vec<Option<Vec<u8>>>,
        eos_ids: Vec<i64>,
        vocab_size: Option<usize>,
    ) -> PyResult<Self> {
        let v = py
            .detach(|| core::Vocabulary::new(tokens, &eos_ids, vocab_size))
            .or_raise()?;
        Ok(Vocabulary(Arc::new(v)))
    }

    /// Parse Tekken JSON bytes (as shipped by `mistral_common`).
    #[staticmethod]
    #[pyo3(signature = (data, eos_ids=None))]
    fn from_tekken_json(
        py: Python<'_>,
        data: Vec<u8>,
        eos_ids: Option<Vec<i64>>,
    ) -> PyResult<Self> {
        let v = py
            .detach(|| core::Vocabulary::from_tekken_json(&data, eos_ids.as_deref()))
            .or_raise()?;
        Ok(Vocabulary(Arc::new(v)))
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }

    #[getter]
    fn eos_ids(&self) -> Vec<u32> {
        self.0.eos_ids().to_vec()
    }

    #[getter]
    fn num_trie_nodes(&self) -> usize {
        self.0.trie().num_nodes()
    }

    /// Bytes of one token (`None` for special, EOS and padding ids).
    fn token_bytes<'py>(
        &self,
        py: Python<'py>,
        token: i64,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let t = self.0.check(token).or_raise()?;
        Ok(self
            .0
            .has_bytes(t)
            .then(|| PyBytes::new(py, self.0.token_bytes(t))))
    }
}

#[pyclass(module = "specdec._core", frozen)]
pub struct RegexGrammar(pub Arc<CompiledRegex>);

#[pymethods]
impl RegexGrammar {
    #[new]
    #[pyo3(signature = (vocab, pattern, size_limit=None, cache_bytes=None, precompute_ms=5.0))]
    fn new(
        py: Python<'_>,
        vocab: &Vocabulary,
        pattern: String,
        size_limit: Option<usize>,
        cache_bytes: Option<usize>,
        precompute_ms: f64,
    ) -> PyResult<Self> {
        let mut limits = RegexLimits::default();
        if let Some(l) = size_limit {
            limits = RegexLimits {
                automaton_bytes: l,
                table_bytes: l,
            };
        }
        let v = vocab.0.clone();
        let g = py
            .detach(|| {
                let t0 = std::time::Instant::now();
                let g = CompiledRegex::new(
                    v,
                    &pattern,
                    limits,
                    cache_bytes.unwrap_or(core::DEFAULT_CACHE_BYTES),
                )?;
                if precompute_ms > 0.0 {
                    // The budget covers the whole compile, DFA construction included; one too
                    // long for a Duration (inf, or finite but huge: from_secs_f64 would panic)
                    // is no limit at all.
                    match std::time::Duration::try_from_secs_f64(precompute_ms / 1e3) {
                        Ok(budget) => g.precompute_within(budget.saturating_sub(t0.elapsed())),
                        Err(_) => g.precompute(),
                    }
                }
                Ok::<_, GrammarError>(g)
            })
            .or_raise()?;
        Ok(RegexGrammar(Arc::new(g)))
    }

    #[getter]
    fn pattern(&self) -> &str {
        self.0.pattern()
    }

    #[getter]
    fn num_states(&self) -> usize {
        self.0.dfa().num_states()
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.0.vocab().vocab_size()
    }

    /// Has this grammar switched to its merged byte-class trie (after a large walk)?
    #[getter]
    fn uses_class_trie(&self) -> bool {
        self.0.has_class_trie()
    }

    #[getter]
    fn cache_bytes(&self) -> usize {
        self.0.cache().used_bytes()
    }

    /// Test oracle: the mask after `text`, by running every token's bytes through the DFA
    /// one by one (no trie, no cache). uint32 `[ceil(V/32)]`.
    fn brute_force_mask<'py>(&self, py: Python<'py>, text: Vec<u8>) -> Bound<'py, PyAny> {
        let g = &self.0;
        let s = g.dfa().run(g.start(), &text);
        let mut out = vec![0u32; g.vocab().words()];
        py.detach(|| g.brute_force_mask(s, &mut out));
        vec1(py, out).into_any()
    }

    /// Does `text` fully match the regex?
    fn matches(&self, text: Vec<u8>) -> bool {
        let g = &self.0;
        g.is_accepting(g.dfa().run(g.start(), &text))
    }
}

#[pyclass(module = "specdec._core", frozen)]
pub struct CfgGrammar(pub Arc<CompiledGrammar>);

/// The [`GrammarLimits`] fields a Python caller may set (`None`: the default).
#[derive(Default)]
struct LimitArgs {
    cache_bytes: Option<usize>,
    max_depth: Option<usize>,
    max_states: Option<usize>,
    max_symbols: Option<usize>,
    max_lexer_states: Option<usize>,
    /// Per-lexeme automaton and table bytes (as `RegexGrammar`'s `size_limit`).
    size_limit: Option<usize>,
}

fn grammar_limits(a: LimitArgs) -> GrammarLimits {
    let mut l = GrammarLimits::default();
    if let Some(c) = a.cache_bytes {
        l.cache_bytes = c;
    }
    if let Some(d) = a.max_depth {
        l.max_depth = d;
    }
    if let Some(n) = a.max_states {
        l.max_states = n;
    }
    if let Some(n) = a.max_symbols {
        l.max_symbols = n;
    }
    if let Some(n) = a.max_lexer_states {
        l.max_lexer_states = n;
    }
    if let Some(b) = a.size_limit {
        l.lexeme = RegexLimits {
            automaton_bytes: b,
            table_bytes: b,
        };
    }
    l
}

#[pymethods]
impl CfgGrammar {
    /// Compile GBNF text (start rule `root`), with the GIL released.
    #[staticmethod]
    #[pyo3(signature = (vocab, text, cache_bytes=None, max_depth=None, max_states=None, max_symbols=None, max_lexer_states=None, size_limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_gbnf(
        py: Python<'_>,
        vocab: &Vocabulary,
        text: String,
        cache_bytes: Option<usize>,
        max_depth: Option<usize>,
        max_states: Option<usize>,
        max_symbols: Option<usize>,
        max_lexer_states: Option<usize>,
        size_limit: Option<usize>,
    ) -> PyResult<Self> {
        let v = vocab.0.clone();
        let limits = grammar_limits(LimitArgs {
            cache_bytes,
            max_depth,
            max_states,
            max_symbols,
            max_lexer_states,
            size_limit,
        });
        let g = py
            .detach(|| CompiledGrammar::from_gbnf(v, &text, limits))
            .or_raise()?;
        Ok(CfgGrammar(Arc::new(g)))
    }

    /// Compile a Lark grammar (the supported subset; start rule `start`), GIL released.
    #[staticmethod]
    #[pyo3(signature = (vocab, text, cache_bytes=None, max_depth=None, max_states=None, max_symbols=None, max_lexer_states=None, size_limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_lark(
        py: Python<'_>,
        vocab: &Vocabulary,
        text: String,
        cache_bytes: Option<usize>,
        max_depth: Option<usize>,
        max_states: Option<usize>,
        max_symbols: Option<usize>,
        max_lexer_states: Option<usize>,
        size_limit: Option<usize>,
    ) -> PyResult<Self> {
        let v = vocab.0.clone();
        let limits = grammar_limits(LimitArgs {
            cache_bytes,
            max_depth,
            max_states,
            max_symbols,
            max_lexer_states,
            size_limit,
        });
        let g = py
            .detach(|| CompiledGrammar::from_lark(v, &text, limits))
            .or_raise()?;
        Ok(CfgGrammar(Arc::new(g)))
    }

    /// Compile a JSON Schema (JSON text) to the grammar of the JSON texts it accepts.
    #[staticmethod]
    #[pyo3(signature = (vocab, schema, whitespace=true, item_separator=",".to_owned(), key_separator=":".to_owned(), closed=false, declared_order=false, strict=true, format_assertion=true, cache_bytes=None, max_depth=None, max_states=None, max_symbols=None, max_lexer_states=None, size_limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_json_schema(
        py: Python<'_>,
        vocab: &Vocabulary,
        schema: String,
        whitespace: bool,
        item_separator: String,
        key_separator: String,
        closed: bool,
        declared_order: bool,
        strict: bool,
        format_assertion: bool,
        cache_bytes: Option<usize>,
        max_depth: Option<usize>,
        max_states: Option<usize>,
        max_symbols: Option<usize>,
        max_lexer_states: Option<usize>,
        size_limit: Option<usize>,
    ) -> PyResult<Self> {
        let v = vocab.0.clone();
        let limits = grammar_limits(LimitArgs {
            cache_bytes,
            max_depth,
            max_states,
            max_symbols,
            max_lexer_states,
            size_limit,
        });
        let opts = JsonOptions {
            whitespace,
            item_separator,
            key_separator,
            closed,
            property_order: if declared_order {
                PropertyOrder::Declared
            } else {
                PropertyOrder::Any
            },
            strict,
            format_assertion,
        };
        let g = py
            .detach(|| CompiledGrammar::from_json_schema_text(v, &schema, &opts, limits))
            .or_raise()?;
        Ok(CfgGrammar(Arc::new(g)))
    }

    /// A regex as the one-lexeme grammar `root ::= /pattern/`.
    #[staticmethod]
    #[pyo3(signature = (vocab, pattern, cache_bytes=None, max_states=None, size_limit=None))]
    fn from_regex(
        py: Python<'_>,
        vocab: &Vocabulary,
        pattern: String,
        cache_bytes: Option<usize>,
        max_states: Option<usize>,
        size_limit: Option<usize>,
    ) -> PyResult<Self> {
        let v = vocab.0.clone();
        let limits = grammar_limits(LimitArgs {
            cache_bytes,
            max_states,
            size_limit,
            ..LimitArgs::default()
        });
        let g = py
            .detach(|| CompiledGrammar::from_regex(v, &pattern, limits))
            .or_raise()?;
        Ok(CfgGrammar(Arc::new(g)))
    }

    /// Parser states interned so far (grows as new prefixes are parsed).
    #[getter]
    fn num_states(&self) -> usize {
        self.0.num_states()
    }

    #[getter]
    fn num_rules(&self) -> usize {
        self.0.grammar().num_rules()
    }

    /// Where a JSON Schema's grammar differs from the schema: (keyword, pointer, kind,
    /// detail) each, kind one of subset, superset, neither, spelling.
    #[getter]
    fn approximations(&self) -> Vec<(String, String, &'static str, String)> {
        (self.0.approximations().iter())
            .map(|a| {
                let kind = a.kind.name();
                (a.keyword.clone(), a.pointer.clone(), kind, a.detail.clone())
            })
            .collect()
    }

    #[getter]
    fn num_lexemes(&self) -> usize {
        self.0.grammar().num_lexemes()
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.0.vocab().vocab_size()
    }

    #[getter]
    fn cache_bytes(&self) -> usize {
        self.0.cache_bytes()
    }

    /// Test oracle: the mask after `text`, by running every token's bytes through the
    /// parser one by one (no trie walk, no mask cache). uint32 `[ceil(V/32)]`.
    fn brute_force_mask<'py>(&self, py: Python<'py>, text: Vec<u8>) -> PyResult<Bound<'py, PyAny>> {
        let g = &self.0;
        let mut out = vec![0u32; g.vocab().words()];
        py.detach(|| {
            let s = g.run_from_start(&text)?;
            g.brute_force_mask(s, &mut out);
            Ok::<_, GrammarError>(())
        })
        .or_raise()?;
        Ok(vec1(py, out).into_any())
    }

    /// Is `text` in the grammar's language?
    fn matches(&self, py: Python<'_>, text: Vec<u8>) -> PyResult<bool> {
        let g = &self.0;
        py.detach(|| g.matches(&text)).or_raise()
    }
}

/// A matcher over either engine.
#[derive(Clone)]
pub enum AnyMatcher {
    Regex(core::Matcher<CompiledRegex>),
    Cfg(core::Matcher<CompiledGrammar>),
}

/// Run `$e` with `$m` bound to the inner matcher, whichever engine it follows.
macro_rules! with_matcher {
    ($any:expr, $m:ident => $e:expr) => {
        match $any {
            AnyMatcher::Regex($m) => $e,
            AnyMatcher::Cfg($m) => $e,
        }
    };
}

impl AnyMatcher {
    fn words(&self) -> usize {
        with_matcher!(self, m => m.grammar().vocab().words())
    }

    fn vocab_size(&self) -> usize {
        with_matcher!(self, m => m.grammar().vocab().vocab_size())
    }

    fn fill_bitmask(&self, out: &mut [u32]) -> Result<(), GrammarError> {
        with_matcher!(self, m => m.fill_bitmask(out))
    }

    fn forced_paths(&self, limits: ForcedLimits) -> Result<Vec<ForcedPath>, GrammarError> {
        with_matcher!(self, m => {
            let paths = m.grammar().forced_paths(m.state(), limits)?;
            Ok(paths.iter().cloned().map(ForcedPath::from).collect())
        })
    }

    /// Is the current mask ready without a trie walk?
    fn is_cheap(&self) -> bool {
        with_matcher!(self, m => m.grammar().is_cheap(m.state()))
    }
}

/// One way the text can go from a matcher's state ([`Matcher::forced_paths`]).
#[pyclass(module = "specdec._core", frozen)]
pub struct ForcedPath {
    /// The path's bytes (forced bytes, choices and their forced tails).
    bytes: Vec<u8>,
    /// EOS follows the bytes.
    #[pyo3(get)]
    eos: bool,
    /// The product of `1 / options` over the choice points taken.
    #[pyo3(get)]
    weight: f64,
    /// Choice points taken (0: forced all the way).
    #[pyo3(get)]
    choices: u32,
}

impl From<core::ForcedPath> for ForcedPath {
    fn from(p: core::ForcedPath) -> Self {
        ForcedPath {
            bytes: p.bytes,
            eos: p.eos,
            weight: p.weight,
            choices: p.choices,
        }
    }
}

#[pymethods]
impl ForcedPath {
    #[getter(bytes)]
    fn py_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.bytes)
    }

    fn __repr__(&self) -> String {
        format!(
            "ForcedPath(bytes={:?}, eos={}, weight={}, choices={})",
            String::from_utf8_lossy(&self.bytes),
            if self.eos { "True" } else { "False" },
            self.weight,
            self.choices
        )
    }
}

/// Shared across threads: the grammar state sits behind a lock (see [`Locked`]), taken with
/// the GIL released for a mask that needs a trie walk, otherwise, when free, with the GIL
/// held. No critical section touches a Python object. The vocabulary's sizes never change
/// and are read without it.
#[pyclass(module = "specdec._core", frozen)]
pub struct Matcher {
    state: Locked<AnyMatcher>,
    words: usize,
    vocab_size: usize,
}

impl Matcher {
    fn from_any(m: AnyMatcher) -> Self {
        Matcher {
            words: m.words(),
            vocab_size: m.vocab_size(),
            state: Locked::new(m),
        }
    }
}

fn row_slice(
    buf: &mut [i32],
    rows: usize,
    cols: usize,
    row: i64,
) -> Result<&mut [u32], GrammarError> {
    if row < 0 || row as usize >= rows {
        return Err(GrammarError::Shape(format!(
            "row {row} outside a bitmask of {rows} rows"
        )));
    }
    let r = row as usize;
    Ok(as_u32(&mut buf[r * cols..(r + 1) * cols]))
}

fn as_u32(s: &mut [i32]) -> &mut [u32] {
    // SAFETY: i32 and u32 share size and alignment, every bit pattern is valid for both, and
    // the exclusive borrow of `s` moves into the result; the bit pattern is what the mask means.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u32>(), s.len()) }
}

/// A bitmask buffer borrowed for writing: `release` says whether the GIL may be released
/// while it is written. Only an array that owns its memory qualifies: a view (of a torch
/// tensor, say) could be freed or resized by another thread once the GIL is gone.
struct Buffer<'a> {
    words: &'a mut [i32],
    rows: usize,
    cols: usize,
    release: bool,
}

/// Borrow a writable C-contiguous int32 `[rows, cols]` numpy buffer.
fn with_buffer<R>(
    bitmask: &Bound<'_, PyAny>,
    words: usize,
    f: impl FnOnce(Buffer<'_>) -> PyResult<R>,
) -> PyResult<R> {
    let arr = bitmask.cast::<PyArray2<i32>>().map_err(|_| {
        PyErr::from(crate::errors::Error::from(GrammarError::Shape(
            "bitmask must be a 2-D int32 numpy array".into(),
        )))
    })?;
    let release = arr.getattr(pyo3::intern!(arr.py(), "base"))?.is_none();
    let mut rw = arr.try_readwrite().map_err(|e| {
        PyErr::from(crate::errors::Error::from(GrammarError::Shape(format!(
            "bitmask cannot be written: {e}"
        ))))
    })?;
    let (rows, cols) = (rw.shape()[0], rw.shape()[1]);
    if cols < words {
        return Err(GrammarError::Shape(format!(
            "bitmask has {cols} words per row, the vocabulary needs {words}"
        )))
        .or_raise();
    }
    let slice = rw.as_slice_mut().map_err(|_| {
        PyErr::from(crate::errors::Error::from(GrammarError::Shape(
            "bitmask must be C-contiguous".into(),
        )))
    })?;
    f(Buffer {
        words: slice,
        rows,
        cols,
        release,
    })
}

#[pymethods]
impl Matcher {
    #[new]
    fn new(grammar: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(g) = grammar.cast::<RegexGrammar>() {
            return Ok(Matcher::from_any(AnyMatcher::Regex(core::Matcher::new(
                g.get().0.clone(),
            ))));
        }
        if let Ok(g) = grammar.cast::<CfgGrammar>() {
            return Ok(Matcher::from_any(AnyMatcher::Cfg(core::Matcher::new(
                g.get().0.clone(),
            ))));
        }
        Err(crate::errors::raise(
            crate::errors::Class::Type,
            format!(
                "grammar must be a RegexGrammar or a CfgGrammar, got {}",
                grammar.get_type().name()?
            ),
        ))
    }

    fn accept_token(&self, py: Python<'_>, token: i64) -> PyResult<bool> {
        self.state
            .with(py, |m| with_matcher!(&mut *m, m => m.accept_token(token)))
            .or_raise()
    }

    fn accept_tokens(&self, py: Python<'_>, tokens: Vec<i64>) -> PyResult<usize> {
        self.state
            .with(
                py,
                |m| with_matcher!(&mut *m, m => m.accept_tokens(&tokens)),
            )
            .or_raise()
    }

    fn is_terminated(&self, py: Python<'_>) -> bool {
        self.state
            .with(py, |m| with_matcher!(&*m, m => m.is_terminated()))
    }

    fn is_accepting(&self, py: Python<'_>) -> bool {
        self.state
            .with(py, |m| with_matcher!(&*m, m => m.is_accepting()))
    }

    #[getter]
    fn num_accepted(&self, py: Python<'_>) -> usize {
        self.state
            .with(py, |m| with_matcher!(&*m, m => m.num_accepted()))
    }

    #[getter]
    fn state(&self, py: Python<'_>) -> u32 {
        self.state
            .with(py, |m| with_matcher!(&*m, m => m.state().into()))
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn rollback(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        self.state
            .with(py, |m| with_matcher!(m, m => m.rollback(n)))
            .or_raise()
    }

    fn reset(&self, py: Python<'_>) {
        self.state.with(py, |m| with_matcher!(m, m => m.reset()))
    }

    fn fork(&self, py: Python<'_>) -> Matcher {
        Matcher::from_any(self.state.with(py, |m| m.clone()))
    }

    /// Every way the text can go from here: the forced bytes, and at each choice point of
    /// at most `max_branches` options (EOS counts as one) each option with its forced tail,
    /// `levels` points deep, at most `max_paths` paths of `max_bytes` bytes (cached per
    /// parser state; computed with the GIL released).
    #[pyo3(signature = (*, max_bytes=64, max_branches=4, levels=2, max_paths=16))]
    fn forced_paths(
        &self,
        py: Python<'_>,
        max_bytes: usize,
        max_branches: usize,
        levels: usize,
        max_paths: usize,
    ) -> PyResult<Vec<ForcedPath>> {
        let limits = ForcedLimits {
            max_bytes,
            max_branches,
            levels,
            max_paths,
        };
        // A clone shares the history (O(1)): the walk runs on it without the lock or GIL.
        let m = self.state.with(py, |m| m.clone());
        py.detach(|| m.forced_paths(limits)).or_raise()
    }

    /// Fill row `row` of an int32 `[B, >= ceil(V/32)]` numpy buffer (the GIL is released
    /// when the mask needs a trie walk).
    #[pyo3(signature = (bitmask, row=0))]
    fn fill_next_token_bitmask(
        &self,
        py: Python<'_>,
        bitmask: &Bound<'_, PyAny>,
        row: i64,
    ) -> PyResult<()> {
        with_buffer(bitmask, self.words, |buf| {
            let out = row_slice(buf.words, buf.rows, buf.cols, row).or_raise()?;
            let fill = move |m: &mut AnyMatcher| m.fill_bitmask(out);
            if !buf.release {
                self.state.holding_gil(py, fill)
            } else if self.state.with(py, |m| m.is_cheap()) {
                // A cached mask is a copy: not worth a GIL round trip.
                self.state.with(py, fill)
            } else {
                self.state.detached(py, fill)
            }
            .or_raise()
        })
    }
}

/// Fill one row per matcher (`rows[i]`, default `i`) with the GIL released, in parallel.
#[pyfunction]
#[pyo3(signature = (matchers, bitmask, rows=None))]
fn fill_next_token_bitmask_batch(
    py: Python<'_>,
    matchers: Vec<PyRef<'_, Matcher>>,
    bitmask: &Bound<'_, PyAny>,
    rows: Option<Vec<i64>>,
) -> PyResult<()> {
    // Copies, each taken under its own lock (one matcher may come twice).
    let ms: Vec<AnyMatcher> = matchers
        .iter()
        .map(|m| m.state.with(py, |a| a.clone()))
        .collect();
    let targets: Vec<i64> = rows.unwrap_or_else(|| (0..ms.len() as i64).collect());
    if targets.len() != ms.len() {
        return Err(GrammarError::Shape(format!(
            "{} rows for {} matchers",
            targets.len(),
            ms.len()
        )))
        .or_raise();
    }
    let Some(first) = ms.first() else {
        return Ok(());
    };
    let words = first.words();
    with_buffer(bitmask, words, |buf| {
        let (nrows, cols) = (buf.rows, buf.cols);
        let mut seen = vec![false; nrows];
        for (m, &r) in ms.iter().zip(&targets) {
            if r < 0 || r as usize >= nrows {
                return Err(GrammarError::Shape(format!(
                    "row {r} outside a bitmask of {nrows} rows"
                )))
                .or_raise();
            }
            if std::mem::replace(&mut seen[r as usize], true) {
                return Err(GrammarError::Shape(format!("row {r} given twice"))).or_raise();
            }
            if m.words() > cols {
                return Err(GrammarError::Shape(
                    "a matcher's vocabulary is wider than the bitmask".into(),
                ))
                .or_raise();
            }
        }
        let release = buf.release;
        let words = as_u32(buf.words);
        let mut fill = move || {
            // Disjoint rows: hand each matcher its own row.
            let mut slots: Vec<Option<&mut [u32]>> = words.chunks_mut(cols).map(Some).collect();
            let jobs: Vec<(&AnyMatcher, &mut [u32])> = ms
                .iter()
                .zip(&targets)
                .map(|(m, &r)| (m, slots[r as usize].take().expect("row checked unique")))
                .collect();
            jobs.into_par_iter()
                .try_for_each(|(m, out)| m.fill_bitmask(out))
        };
        if release { py.detach(fill) } else { fill() }.or_raise()
    })
}

/// Fill rows `row_offset..row_offset + n` with the masks of a tree's nodes (root first);
/// returns a bool array: does the grammar accept each node's path? Padding nodes of a padded
/// tree get all-zero rows and False.
#[pyfunction]
#[pyo3(signature = (matcher, tree, bitmask, row_offset=0))]
fn fill_tree_bitmask<'py>(
    py: Python<'py>,
    matcher: &Matcher,
    tree: &TreeArrays,
    bitmask: &Bound<'py, PyAny>,
    row_offset: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let (tokens, parents) = (read(tree.tokens(py))?, read(tree.parents(py))?);
    let (n, real) = (tokens.len(), tree.num_real());
    let (tokens, parents) = (&as_slice(&tokens)[..real], &as_slice(&parents)[..real]);
    let state = &matcher.state;
    let mut valid = with_buffer(bitmask, matcher.words, |buf| {
        let end = row_offset.checked_add(n).filter(|&e| e <= buf.rows);
        let Some(end) = end else {
            return Err(GrammarError::Shape(format!(
                "a tree of {n} nodes from row {row_offset} needs more rows than the bitmask's {}",
                buf.rows
            )))
            .or_raise();
        };
        let cols = buf.cols;
        let release = buf.release;
        let rows = as_u32(&mut buf.words[row_offset * cols..end * cols]);
        let (real_rows, pad_rows) = rows.split_at_mut(real * cols);
        pad_rows.fill(0);
        let fill = move |m: &mut AnyMatcher| with_matcher!(&*m, m => core::fill_tree_bitmask(m, tokens, parents, real_rows, cols));
        if release {
            state.detached(py, fill)
        } else {
            state.holding_gil(py, fill)
        }
        .or_raise()
    })?;
    valid.resize(n, false);
    Ok(vec1(py, valid).into_any())
}

/// Set disallowed logits to -inf in place: row `rows[i]` (default `i`) of the C-contiguous
/// float32 `logits` `[B, V]`, its first `vocab` columns, by row `i` of the int32 `bitmask`
/// `[n, W]` (columns past `32 * W` disallowed; those past `vocab` untouched), GIL released.
#[pyfunction]
#[pyo3(signature = (logits, bitmask, vocab, rows=None))]
fn apply_token_bitmask_f32(
    py: Python<'_>,
    mut logits: numpy::PyReadwriteArray2<'_, f32>,
    bitmask: PyReadonlyArray2<'_, i32>,
    vocab: usize,
    rows: Option<Vec<usize>>,
) -> PyResult<()> {
    let (b, v) = (logits.shape()[0], logits.shape()[1]);
    let (n, w) = (bitmask.shape()[0], bitmask.shape()[1]);
    let shape = |msg: String| Err(GrammarError::Shape(msg)).or_raise();
    if vocab > v {
        return shape(format!("vocab {vocab} is over the logits' {v} columns"));
    }
    let rows = rows.unwrap_or_else(|| (0..n).collect());
    if rows.len() != n {
        return shape(format!(
            "bitmask has {n} rows for {} logits rows",
            rows.len()
        ));
    }
    if let Some(&r) = rows.iter().find(|&&r| r >= b) {
        return shape(format!("row {r} is outside logits of {b} rows"));
    }
    let mask = as_slice(&bitmask);
    let c_order = logits.is_c_contiguous();
    let (Ok(out), true) = (logits.as_slice_mut(), c_order) else {
        return shape("logits must be a C-contiguous float32 array".to_string());
    };
    py.detach(|| {
        for (i, &r) in rows.iter().enumerate() {
            // (i32 and u32 words have the same bits.)
            let words = mask[i * w..(i + 1) * w].iter().map(|&x| x as u32);
            core::apply_bitmask_row(&mut out[r * v..r * v + vocab], words);
        }
    });
    Ok(())
}

/// Grammar-aware DDTree: ranks restricted to the tokens each node's grammar state allows.
#[pyfunction]
#[pyo3(signature = (logprobs, token_ids, budget, matcher, root_token=-1, min_logprob=None, check_duplicates=true))]
#[allow(clippy::too_many_arguments)]
fn build_ddtree_constrained<'py>(
    py: Python<'py>,
    logprobs: PyReadonlyArray2<'py, f32>,
    token_ids: PyReadonlyArray2<'py, i64>,
    budget: i64,
    matcher: &Matcher,
    root_token: i64,
    min_logprob: Option<f64>,
    check_duplicates: bool,
) -> PyResult<TreeArrays> {
    let (l, k) = check_single_build(&logprobs, &token_ids, root_token, min_logprob).or_raise()?;
    let (lp, ids) = (as_slice(&logprobs), as_slice(&token_ids));
    let built = matcher
        .state
        .detached(py, |m| {
            if budget <= 0 {
                return Err(TreeError::Budget(budget));
            }
            let marg = Marginals::all_columns(&lp, &ids, l, k)?;
            let cap = max_nodes(budget as usize, l, k);
            check_tree_size(cap)?;
            let built = with_matcher!(&*m, m => {
                let mut filter = GrammarFilter::new(m, cap);
                build_ddtree_filtered(&marg, budget as usize, root_token, min_logprob, &mut filter)
            });
            if check_duplicates {
                check_sibling_tokens(&built.tree, &marg)?;
            }
            Ok::<_, TreeError>(built)
        })
        .or_raise()?;
    TreeArrays::built(py, built)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // numpy's C API and its borrow checking are set up on first use: do it at import, so a
    // process's first mask does not pay it (nor does every worker a server forks after import).
    let probe = PyArray2::<i32>::zeros(m.py(), [1, 1], false);
    drop(probe.try_readwrite().map_err(|e| {
        PyErr::from(crate::errors::Error::from(GrammarError::Shape(format!(
            "numpy buffer check failed at import: {e}"
        ))))
    })?);
    m.add_class::<Vocabulary>()?;
    m.add_class::<RegexGrammar>()?;
    m.add_class::<CfgGrammar>()?;
    m.add_class::<Matcher>()?;
    m.add_class::<ForcedPath>()?;
    m.add_function(wrap_pyfunction!(fill_next_token_bitmask_batch, m)?)?;
    m.add_function(wrap_pyfunction!(fill_tree_bitmask, m)?)?;
    m.add_function(wrap_pyfunction!(apply_token_bitmask_f32, m)?)?;
    m.add_function(wrap_pyfunction!(build_ddtree_constrained, m)?)?;
    Ok(())
}
