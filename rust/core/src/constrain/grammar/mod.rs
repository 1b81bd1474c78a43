//! Context-free grammars as a [`Constraint`]: rules over regex-defined lexemes (from GBNF
//! text, a regex, or a JSON Schema), parsed by an Earley parser whose sets are interned.
//!
//! Why Earley, and why interned sets:
//! - Earley takes any context-free grammar as written (left recursion, ambiguity, empty
//!   rules), so the front ends (GBNF, a regex, later Lark and JSON Schema) need no grammar
//!   transformation beyond desugaring repetitions, and its sets are prefix-exact: a non-empty
//!   set means some continuation completes the text, which is what a mask must know.
//! - A parser state must be a small `Copy` value ([`Constraint::State`]) that a matcher keeps
//!   per token. An Earley set whose items point to their origins *by id* is a complete,
//!   immutable description of the parse so far, so sets are hash-consed in an arena owned by
//!   the compiled grammar ([`earley`]) and a state is the set's `u32` id: fork and rollback
//!   cost nothing (old ids stay valid forever), and equal states share one cached transition
//!   row and one cached mask, however they were reached. An origin is the origin set's
//!   projection on what the item's rule can complete into (a node, as in a graph-structured
//!   stack), not the whole set, so repeated structure (array elements, members, list items)
//!   brings the parser back to the same states instead of new ones.
//! - Lexemes are scanned inside the items (each carries its lexeme's DFA state), so there is
//!   no separate tokenizing lexer and no lexing ambiguity; a bare regex is the one-lexeme
//!   grammar `root ::= /regex/`.
//!
//! The arena sits behind a mutex (interior mutability: [`Constraint`] steps take `&self`);
//! masks are the union of what each scanning lexeme allows on its own (one DFA walk of the
//! token trie per lexeme state, shared by all parser states) and a parser walk of the few
//! subtrees where a lexeme can end inside a token ([`mask`]), cached per state.

mod cfg;
mod earley;
pub mod gbnf;
mod int_range;
pub mod json_schema;
pub mod lark;
mod lexer;
mod mask;
mod multiple_of;
mod walk_cache;

use std::sync::{Arc, Mutex, MutexGuard};

pub use cfg::{Grammar, GrammarBuilder, GrammarLimits, Rule, Sym};
pub use walk_cache::SharedWalks;

use earley::{Chart, DEAD_SET};
use mask::MaskStore;

use super::{Constraint, GrammarError, Vocabulary};

/// A parser state: the id of an interned Earley set, or the matcher's terminated state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct ParserState(u32);

impl ParserState {
    pub const DEAD: ParserState = ParserState(DEAD_SET);
    pub const TERMINATED: ParserState = ParserState(u32::MAX);
}

/// The raw id, as the Python layer shows it.
impl From<ParserState> for u32 {
    fn from(s: ParserState) -> u32 {
        s.0
    }
}

#[derive(Debug)]
struct Shared {
    chart: Chart,
    masks: MaskStore,
}

/// A grammar compiled against one vocabulary.
#[derive(Debug)]
pub struct CompiledGrammar {
    vocab: Arc<Vocabulary>,
    grammar: Grammar,
    shared: Mutex<Shared>,
    start: ParserState,
}

impl CompiledGrammar {
    pub fn new(vocab: Arc<Vocabulary>, grammar: Grammar) -> Self {
        let chart = Chart::new(&grammar);
        let start = ParserState(chart.start());
        let masks = MaskStore::new(grammar.limits.cache_bytes);
        CompiledGrammar {
            vocab,
            grammar,
            shared: Mutex::new(Shared { chart, masks }),
            start,
        }
    }

    /// Parse GBNF text (llama.cpp syntax, start rule `root`) and compile it.
    pub fn from_gbnf(
        vocab: Arc<Vocabulary>,
        text: &str,
        limits: GrammarLimits,
    ) -> Result<Self, GrammarError> {
        Ok(CompiledGrammar::new(vocab, gbnf::parse(text, limits)?))
    }

    /// Parse a Lark grammar (the subset [`lark`] documents; start rule `start`) and compile it.
    pub fn from_lark(
        vocab: Arc<Vocabulary>,
        text: &str,
        limits: GrammarLimits,
    ) -> Result<Self, GrammarError> {
        Ok(CompiledGrammar::new(vocab, lark::parse(text, limits)?))
    }

    /// Compile a JSON Schema document to the grammar of the JSON texts it accepts.
    pub fn from_json_schema(
        vocab: Arc<Vocabulary>,
        schema: &serde_json::Value,
        opts: &json_schema::JsonOptions,
        limits: GrammarLimits,
    ) -> Result<Self, GrammarError> {
        Ok(CompiledGrammar::new(
            vocab,
            json_schema::compile(schema, opts, limits)?,
        ))
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
        Ok(CompiledGrammar::new(vocab, b.build(root)?))
    }

    pub fn grammar(&self) -> &Grammar {
        &self.grammar
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panic while holding the lock leaves only caches half-filled, never a wrong entry
        // (sets are pushed and indexed together), so a poisoned lock is still usable.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Parser states interned so far (the dead one included).
    pub fn num_states(&self) -> usize {
        self.lock().chart.num_states()
    }

    /// Err once a step needed more parser states than `max_states` allows (that step went
    /// to the dead state, so its result must not be trusted).
    pub fn check_limits(&self) -> Result<(), GrammarError> {
        if self.lock().chart.overflowed() {
            return Err(GrammarError::TooLarge(format!(
                "the grammar needed more than {} parser states (max_states): the text is too \
                 long or the grammar too ambiguous for one compiled grammar",
                self.grammar.limits.max_states
            )));
        }
        Ok(())
    }

    pub fn cache_bytes(&self) -> usize {
        self.lock().masks.used_bytes()
    }

    /// Is `state`'s mask ready without a trie walk?
    pub fn is_cheap(&self, state: ParserState) -> bool {
        state == ParserState::TERMINATED
            || state == ParserState::DEAD
            || self.lock().masks.contains(state.0)
    }

    /// State after `bytes` from the start.
    pub fn run_from_start(&self, bytes: &[u8]) -> ParserState {
        self.step_bytes(self.start, bytes)
    }

    /// Does `text` belong to the grammar's language?
    pub fn matches(&self, text: &[u8]) -> bool {
        // (Callers that must tell "no" from "out of states" call check_limits after.)
        self.is_accepting(self.run_from_start(text))
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
        self.start
    }

    fn step_bytes(&self, state: ParserState, bytes: &[u8]) -> ParserState {
        ParserState(self.lock().chart.run(&self.grammar, state.0, bytes))
    }

    fn accepts_end(&self, state: ParserState) -> bool {
        self.lock().chart.accepts(state.0)
    }

    fn fill_live_mask(&self, state: ParserState, out: &mut [u32]) {
        let mut guard = self.lock();
        let sh = &mut *guard;
        if !sh.masks.write(state.0, out) {
            mask::fill(
                &mut sh.chart,
                &mut sh.masks,
                &self.grammar,
                self.vocab.trie(),
                self.vocab.walks(),
                state.0,
                out,
            );
        }
        if sh.chart.accepts(state.0) {
            super::set_eos(&self.vocab, out);
        }
    }
}
