//! Constrained decoding: which tokens may come next under a [`Constraint`], as bitmaps over
//! the vocabulary, for one sequence ([`Matcher`], with rollback and O(1) fork) or for every
//! node of a draft tree ([`fill_tree_bitmask`]), and the filter that makes the DDTree builder
//! constraint-aware ([`GrammarFilter`]).
//!
//! - [`vocab`]: vocabularies as exact bytes per token, and the token trie shared per
//!   vocabulary.
//! - [`regex`]: the first constraint, regexes compiled to byte DFAs whose masks come from one
//!   pruned trie walk, cached per DFA state.
//! - [`grammar`]: context-free grammars over regex lexemes (GBNF text, a bare regex), parsed
//!   by an Earley parser with interned sets, masks cached per parser state.
//!
//! Bitmask layout (shared with xgrammar and llguidance): `ceil(V / 32)` 32-bit words per
//! row; bit `t % 32` of word `t / 32` set = token `t` allowed.

mod error;
mod forced;
pub mod grammar;
mod matcher;
pub mod regex;
mod tree_mask;
pub mod vocab;

use std::fmt::Debug;
use std::sync::Arc;

pub use error::GrammarError;
pub use forced::{forced_bytes, forced_paths, ForcedLimits, ForcedPath};
pub use grammar::{CompiledGrammar, GrammarBuilder, GrammarLimits, ParserState};
pub use matcher::Matcher;
pub use regex::{
    CompiledRegex, MaskCache, RegexLimits, StateId, TableDfa, DEAD, DEFAULT_CACHE_BYTES, TERMINATED,
};
pub use tree_mask::{apply_bitmask_row, fill_tree_bitmask, tree_states, GrammarFilter};
pub use vocab::{TokenTrie, TrieNode, Vocabulary};

/// A language over token bytes, as an automaton the decoder advances one token at a time.
///
/// Implementors supply the start state, the step over a token's bytes, end-acceptance and
/// the mask of a live state; the EOS protocol (EOS only where the language may end, then
/// nothing but EOS) and the handling of the dead and terminated states are shared here.
pub trait Constraint {
    /// An automaton state; cheap to clone (matchers keep one per accepted token).
    type State: Clone + Eq + Debug;
    /// No continuation is in the language; nothing is allowed.
    const DEAD: Self::State;
    /// EOS was accepted; only EOS may follow (padding in a batch).
    const TERMINATED: Self::State;

    /// The vocabulary the constraint was compiled against.
    fn vocab(&self) -> &Arc<Vocabulary>;

    fn start(&self) -> Self::State;

    /// State after `bytes` from the live state `state` ([`Self::DEAD`] once no continuation
    /// can complete); an error when the step runs past one of the constraint's limits (a
    /// grammar's `max_states`), which is this request's alone.
    fn step_bytes(&self, state: Self::State, bytes: &[u8]) -> Result<Self::State, GrammarError>;

    /// May the text end in the live state `state`?
    fn accepts_end(&self, state: Self::State) -> bool;

    /// Write the allowed-token bitmap of the live state `state` into `out` (exactly
    /// `vocab().words()` words, every one written), EOS included where the text may end;
    /// an error (and `out` not the mask) when it runs past a limit, as [`Self::step_bytes`].
    fn fill_live_mask(&self, state: Self::State, out: &mut [u32]) -> Result<(), GrammarError>;

    /// The bytes that keep the live state `state` live, as a 256-bit set (bit `b % 64` of
    /// word `b / 64`). By default every byte is stepped; engines that know their next bytes
    /// (a grammar's scanning lexemes) say so directly.
    fn next_bytes(&self, state: Self::State) -> Result<[u64; 4], GrammarError> {
        let mut set = [0u64; 4];
        for b in 0..=255u8 {
            if self.step_bytes(state.clone(), &[b])? != Self::DEAD {
                set[b as usize / 64] |= 1 << (b % 64);
            }
        }
        Ok(set)
    }

    /// [`forced_paths`] from `state` (a grammar caches them per parser state).
    fn forced_paths(
        &self,
        state: Self::State,
        limits: ForcedLimits,
    ) -> Result<Arc<[ForcedPath]>, GrammarError>
    where
        Self: Sized,
    {
        Ok(forced_paths(self, state, limits)?.into())
    }

    /// State after `token` from `state` (DEAD if the constraint rejects it). `token` must
    /// be in range (checked by the caller).
    #[inline]
    fn step(&self, state: Self::State, token: usize) -> Result<Self::State, GrammarError> {
        let vocab = self.vocab();
        if state == Self::TERMINATED {
            // A finished sequence may keep emitting EOS (padding in a batch), nothing else.
            return Ok(if vocab.is_eos(token) {
                Self::TERMINATED
            } else {
                Self::DEAD
            });
        }
        if state == Self::DEAD {
            return Ok(Self::DEAD);
        }
        if vocab.is_eos(token) {
            return Ok(if self.accepts_end(state) {
                Self::TERMINATED
            } else {
                Self::DEAD
            });
        }
        if !vocab.has_bytes(token) {
            return Ok(Self::DEAD);
        }
        self.step_bytes(state, vocab.token_bytes(token))
    }

    /// May generation stop here (EOS allowed)?
    fn is_accepting(&self, state: Self::State) -> bool {
        state != Self::TERMINATED && state != Self::DEAD && self.accepts_end(state)
    }

    /// Write the allowed-token bitmap of `state` into `out[..words]` (words past the
    /// vocabulary's are zeroed). After termination only EOS is allowed.
    fn fill_mask(&self, state: Self::State, out: &mut [u32]) -> Result<(), GrammarError> {
        let words = self.vocab().words();
        debug_assert!(out.len() >= words);
        out[words..].fill(0);
        let out = &mut out[..words];
        if state == Self::TERMINATED || state == Self::DEAD {
            out.fill(0);
            if state == Self::TERMINATED {
                set_eos(self.vocab(), out);
            }
            return Ok(());
        }
        self.fill_live_mask(state, out)
    }

    /// Slow reference: every token stepped on its own, no trie, no cache (a test oracle; a
    /// token whose step runs past a limit counts as not allowed).
    fn brute_force_mask(&self, state: Self::State, out: &mut [u32]) {
        out.fill(0);
        if state == Self::TERMINATED {
            set_eos(self.vocab(), out);
            return;
        }
        for t in 0..self.vocab().vocab_size() {
            if self.step(state.clone(), t).is_ok_and(|s| s != Self::DEAD) {
                out[t / 32] |= 1 << (t % 32);
            }
        }
    }
}

/// Set the EOS bits of `out`.
fn set_eos(vocab: &Vocabulary, out: &mut [u32]) {
    for &e in vocab.eos_ids() {
        out[e as usize / 32] |= 1 << (e % 32);
    }
}
