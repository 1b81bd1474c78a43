//! Context-free grammars as a [`Constraint`]: rules over regex-defined lexemes (from GBNF
//! text, a regex, or a JSON Schema), parsed by an Earley parser whose sets are interned.
//!
//! Why Earley, and why interned sets:
//! - Earley takes any context-free grammar as written (left recursion, ambiguity, empty
//!   rules), so the front ends (GBNF, a regex, later Lark and JSON Schema) need no grammar
//!   transformation beyond desugaring repetitions, and its sets are prefix-exact: a non-empty
//!   set means some continuation completes the text, which is what a mask must know.
//! - A parser state must be a small value ([`Constraint::State`]) that a matcher keeps per
//!   token. An Earley set whose items point to their origins *by id* is a complete,
//!   immutable description of the parse so far, so sets are hash-consed in an arena owned by
//!   the compiled grammar ([`earley`]) and a state is the set's `u32` id (with its arena):
//!   fork and rollback cost nothing (old ids stay valid while a state holds their arena),
//!   and equal states share one cached transition row and one cached mask, however they
//!   were reached. An origin is the origin set's
//!   projection on what the item's rule can complete into (a node, as in a graph-structured
//!   stack), not the whole set, so repeated structure (array elements, members, list items)
//!   brings the parser back to the same states instead of new ones.
//! - Lexemes are scanned inside the items (each carries its lexeme's DFA state), so there is
//!   no separate tokenizing lexer and no lexing ambiguity; a bare regex is the one-lexeme
//!   grammar `root ::= /regex/`.
//!
//! A compiled grammar's arena is a chart *generation* ([`generation`]): bounded by
//! `max_states`, shared by its requests, and replaced by a fresh one when full, each state
//! carried over on its next step; so one request past the limit fails alone. Masks are the
//! union of what each scanning lexeme allows on its own (one DFA walk of the token trie per
//! lexeme state, shared by all parser states) and a parser walk of the few subtrees where a
//! lexeme can end inside a token ([`mask`]), cached per state; fills of one grammar run in
//! parallel (no lock is held across a walk).

mod cfg;
mod earley;
mod formats;
pub mod gbnf;
mod generation;
mod int_range;
pub mod json_schema;
pub mod lark;
mod lexer;
mod mask;
mod multiple_of;
mod walk_cache;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use cfg::{Grammar, GrammarBuilder, GrammarLimits, Rule, Sym};
pub use walk_cache::SharedWalks;

use earley::{Full, DEAD_SET};
use generation::Generation;
use mask::{CacheBudget, LexWalks};

use super::{forced_paths, Constraint, ForcedLimits, ForcedPath, GrammarError, Vocabulary};

/// A parser state: an interned Earley set of one chart generation (which it keeps alive),
/// or the dead or the matcher's terminated state.
#[derive(Clone)]
pub struct ParserState {
    gen: Option<Arc<Generation>>,
    id: u32,
}

impl ParserState {
    pub const DEAD: ParserState = ParserState {
        gen: None,
        id: DEAD_SET,
    };
    pub const TERMINATED: ParserState = ParserState {
        gen: None,
        id: u32::MAX,
    };

    /// Set `id` of `gen` (the dead set is the one DEAD, whatever its chart).
    fn live(gen: Arc<Generation>, id: u32) -> ParserState {
        if id == DEAD_SET {
            ParserState::DEAD
        } else {
            ParserState { gen: Some(gen), id }
        }
    }
}

/// Equal states: one set of one chart. (The same parse carried to two charts is two states
/// whose steps and masks agree.)
impl PartialEq for ParserState {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && match (&self.gen, &other.gen) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

impl Eq for ParserState {}

impl std::fmt::Debug for ParserState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.gen {
            Some(g) => write!(f, "ParserState({}:{})", g.number, self.id),
            None if self.id == DEAD_SET => f.write_str("ParserState::DEAD"),
            None => f.write_str("ParserState::TERMINATED"),
        }
    }
}

/// The raw id within its chart, as the Python layer shows it.
impl From<ParserState> for u32 {
    fn from(s: ParserState) -> u32 {
        s.id
    }
}

/// A grammar compiled against one vocabulary.
#[derive(Debug)]
pub struct CompiledGrammar {
    vocab: Arc<Vocabulary>,
    grammar: Grammar,
    /// The chart new requests start in and carried states go to.
    current: Mutex<Arc<Generation>>,
    /// Generations started so far.
    generations: AtomicU64,
    walks: LexWalks,
    budget: Arc<CacheBudget>,
    /// Where a JSON Schema's grammar differs from the schema (empty otherwise).
    approximations: Vec<json_schema::Approximation>,
}

impl CompiledGrammar {
    /// Compile against `vocab`; an error when `max_states` cannot hold the start state.
    pub fn new(vocab: Arc<Vocabulary>, grammar: Grammar) -> Result<Self, GrammarError> {
        let budget = Arc::new(CacheBudget::new(grammar.limits.cache_bytes));
        let first = Generation::new(&grammar, 0, budget.clone()).map_err(|Full| {
            GrammarError::TooLarge(format!(
                "the start state needs more than {} parser states (max_states)",
                grammar.limits.max_states
            ))
        })?;
        Ok(CompiledGrammar {
            vocab,
            walks: LexWalks::new(budget.clone()),
            budget,
            current: Mutex::new(Arc::new(first)),
            generations: AtomicU64::new(1),
            grammar,
            approximations: Vec::new(),
        })
    }

    /// Parse GBNF text (llama.cpp syntax, start rule `root`) and compile it.
    pub fn from_gbnf(
        vocab: Arc<Vocabulary>,
        text: &str,
        limits: GrammarLimits,
    ) -> Result<Self, GrammarError> {
        CompiledGrammar::new(vocab, gbnf::parse(text, limits)?)
    }

    /// Parse a Lark grammar (the subset [`lark`] documents; start rule `start`) and compile it.
    pub fn from_lark(
        vocab: Arc<Vocabulary>,
        text: &str,
        limits: GrammarLimits,
    ) -> Result<Self, GrammarError> {
        CompiledGrammar::new(vocab, lark::parse(text, limits)?)
    }

    /// Compile a JSON Schema document to the grammar of the JSON texts it accepts.
    pub fn from_json_schema(
        vocab: Arc<Vocabulary>,
        schema: &serde_json::Value,
        opts: &json_schema::JsonOptions,
        limits: GrammarLimits,
    ) -> Result<Self, GrammarError> {
        let (grammar, approximations) = json_schema::compile(schema, opts, limits)?;
        let mut g = CompiledGrammar::new(vocab, grammar)?;
        g.approximations = approximations;
        Ok(g)
    }

    /// Where the grammar differs from its JSON Schema (compiled with `strict` off; spelling
    /// and format approximations also with it on).
    pub fn approximations(&self) -> &[json_schema::Approximation] {
        &self.approximations
    }

    /// As [`from_json_schema`](Self::from_json_schema), the schema given as JSON text.
    pub fn from_json_schema_text(
        vocab: Arc<Vocabulary>,
        schema: &str,
        opts: &json_schema::JsonOptions,
        limits: GrammarLimits,
    ) -> Result<Self, GrammarError> {
        let schema: serde_json::Value = serde_json::from_str(schema)
            .map_err(|e| GrammarError::Grammar(format!("the schema is not JSON: {e}")))?;
        Self::from_json_schema(vocab, &schema, opts, limits)
    }

    /// A regex as the one-lexeme grammar `root ::= /pattern/`.
    pub fn from_regex(
        vocab: Arc<Vocabulary>,
        pattern: &str,
        limits: GrammarLimits,
    ) -> Result<Self, GrammarError> {
        let mut b = GrammarBuilder::new(limits);
        let root = b.nonterminal("root");
        let lex = b.lexeme(pattern)?;
        b.rule(root, vec![lex])?;
        CompiledGrammar::new(vocab, b.build(root)?)
    }

    pub fn grammar(&self) -> &Grammar {
        &self.grammar
    }

    fn current(&self) -> Arc<Generation> {
        self.lock_current().clone()
    }

    fn lock_current(&self) -> MutexGuard<'_, Arc<Generation>> {
        // Only ever assigned whole: a poisoned lock still holds a valid generation.
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Parser states in the current chart generation (the dead one included).
    pub fn num_states(&self) -> usize {
        mask::read_chart(&self.current().chart).num_states()
    }

    /// Sets and nodes in the current chart generation: at most `max_states`.
    pub fn chart_size(&self) -> usize {
        mask::read_chart(&self.current().chart).size()
    }

    /// Chart generations started so far (one more each time a full chart is replaced).
    pub fn generations(&self) -> u64 {
        self.generations.load(Ordering::Relaxed)
    }

    /// Bytes the mask caches hold (lexeme walks, and the masks of every live generation).
    pub fn cache_bytes(&self) -> usize {
        self.budget.used()
    }

    /// Is `state`'s mask ready without a trie walk?
    pub fn is_cheap(&self, state: ParserState) -> bool {
        let Some(mut gen) = state.gen else {
            return true;
        };
        let mut id = state.id;
        while let Some((to, t)) = gen.moved_to(id) {
            (gen, id) = (to, t);
        }
        gen.masks.contains(id)
    }

    /// State after `bytes` from the start.
    pub fn run_from_start(&self, bytes: &[u8]) -> Result<ParserState, GrammarError> {
        self.step_bytes(self.start(), bytes)
    }

    /// Does `text` belong to the grammar's language? An error when one step of it needs
    /// more than `max_states` parser states.
    pub fn matches(&self, text: &[u8]) -> Result<bool, GrammarError> {
        Ok(self.is_accepting(self.run_from_start(text)?))
    }

    fn too_large(&self) -> GrammarError {
        GrammarError::TooLarge(format!(
            "one step needed more than {} parser states (max_states): the text is nested too \
             deeply or the grammar is too ambiguous",
            self.grammar.limits.max_states
        ))
    }

    /// Run `op` on state `id` of `gen`. Once `op` needs a state past a full chart's cap,
    /// the state is carried to a newer generation (the current one if it has room, else a
    /// fresh one) and `op` runs there; an error only when the state and `op` do not fit in
    /// a fresh chart of their own. Returns where `op` ran and its answer.
    fn apply<R>(
        &self,
        gen: &Arc<Generation>,
        id: u32,
        mut op: impl FnMut(&Generation, u32) -> Result<R, Full>,
    ) -> Result<(Arc<Generation>, u32, R), GrammarError> {
        let (mut gen, mut id) = (gen.clone(), id);
        loop {
            if let Some((to, t)) = gen.moved_to(id) {
                (gen, id) = (to, t);
                continue;
            }
            if let Ok(r) = op(&gen, id) {
                return Ok((gen, id, r));
            }
            gen.set_full();
            let state = gen.export(id);
            let cur = self.current();
            if !Arc::ptr_eq(&cur, &gen) && !cur.is_full() {
                match cur.import(&state) {
                    Ok(t) => {
                        (gen, id) = gen.set_moved(id, (cur, t));
                        continue;
                    }
                    Err(Full) => cur.set_full(),
                }
            }
            // A fresh chart, private until the state and `op` fit in it.
            let number = self.generations.fetch_add(1, Ordering::Relaxed);
            let budget = self.budget.clone();
            let fresh =
                Generation::new(&self.grammar, number, budget).map_err(|Full| self.too_large())?;
            let t = fresh.import(&state).map_err(|Full| self.too_large())?;
            let r = op(&fresh, t).map_err(|Full| self.too_large())?;
            let fresh = Arc::new(fresh);
            {
                let mut current = self.lock_current();
                // (Unless another thread already put a chart with room there.)
                if Arc::ptr_eq(&current, &cur) || current.is_full() {
                    *current = fresh.clone();
                }
            }
            gen.set_moved(id, (fresh.clone(), t));
            return Ok((fresh, t, r));
        }
    }

    /// Write `id`'s mask (cached, else computed and offered to the cache).
    fn fill_in(&self, gen: &Generation, id: u32, out: &mut [u32]) -> Result<(), Full> {
        if let Some(m) = gen.masks.get(id) {
            m.write(out);
            return Ok(());
        }
        let (trie, walks) = (self.vocab.trie(), self.vocab.walks());
        let m = mask::fill(&gen.chart, &self.walks, &self.grammar, trie, walks, id, out)?;
        gen.masks.offer(id, m);
        Ok(())
    }
}

impl Constraint for CompiledGrammar {
    type State = ParserState;
    const DEAD: ParserState = ParserState::DEAD;
    const TERMINATED: ParserState = ParserState::TERMINATED;

    fn vocab(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    fn start(&self) -> ParserState {
        let gen = self.current();
        let start = gen.start;
        ParserState::live(gen, start)
    }

    fn step_bytes(&self, state: ParserState, bytes: &[u8]) -> Result<ParserState, GrammarError> {
        let Some(gen) = &state.gen else {
            return Ok(ParserState::DEAD);
        };
        let (gen, _, t) = self.apply(gen, state.id, |gen, id| gen.run(&self.grammar, id, bytes))?;
        Ok(ParserState::live(gen, t))
    }

    fn accepts_end(&self, state: ParserState) -> bool {
        state.gen.is_some_and(|g| g.accepts(state.id))
    }

    fn next_bytes(&self, state: ParserState) -> Result<[u64; 4], GrammarError> {
        // Every byte a scanning item's lexeme takes leads to a live set (Earley sets are
        // prefix-exact), so the chart's scan set is the answer.
        Ok(match &state.gen {
            Some(gen) => gen.first_bytes(&self.grammar, state.id),
            None => [0; 4],
        })
    }

    fn forced_paths(
        &self,
        state: ParserState,
        limits: ForcedLimits,
    ) -> Result<Arc<[ForcedPath]>, GrammarError> {
        let Some(gen) = state.gen.clone() else {
            return Ok(Arc::from(Vec::new()));
        };
        if let Some(p) = gen.cached_forced(state.id, limits) {
            return Ok(p);
        }
        let paths: Arc<[ForcedPath]> = forced_paths(self, state.clone(), limits)?.into();
        gen.cache_forced(state.id, limits, paths.clone());
        Ok(paths)
    }

    fn fill_live_mask(&self, state: ParserState, out: &mut [u32]) -> Result<(), GrammarError> {
        let Some(gen) = &state.gen else {
            out.fill(0);
            return Ok(());
        };
        let (gen, id, ()) = self.apply(gen, state.id, |gen, id| self.fill_in(gen, id, out))?;
        if gen.accepts(id) {
            super::set_eos(&self.vocab, out);
        }
        Ok(())
    }
}
