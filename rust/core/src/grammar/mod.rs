//! Constrained decoding: vocabularies as exact bytes, a token trie shared per vocabulary,
//! regexes compiled to byte DFAs, allowed-token bitmaps computed by one pruned trie walk and
//! cached per DFA state (grammars with wide byte classes switch to a per-grammar trie with
//! equivalent bytes merged), matchers with rollback and O(1) fork, masks over draft trees and
//! the filter that makes the DDTree builder grammar-aware.
//!
//! Bitmask layout (shared with xgrammar and llguidance): `ceil(V / 32)` 32-bit words per
//! row; bit `t % 32` of word `t / 32` set = token `t` allowed.

mod cache;
mod class_trie;
mod compiled;
mod equiv;
mod error;
mod matcher;
mod regex;
mod tree_mask;
mod trie;
mod vocab;

pub use cache::MaskCache;
pub use compiled::{CompiledRegex, DEFAULT_CACHE_BYTES, TERMINATED};
pub use error::GrammarError;
pub use matcher::Matcher;
pub use regex::{RegexLimits, TableDfa, DEAD};
pub use tree_mask::{fill_tree_bitmask, tree_states, GrammarFilter};
pub use trie::{TokenTrie, TrieNode};
pub use vocab::Vocabulary;
