//! Trie walks shared beyond one grammar: a lexeme state's walk ([`LexMask`]) depends only on
//! what the DFA does from that state on, not on which grammar or lexeme it belongs to. Keyed
//! by the canonical form of the sub-automaton reachable from the state, one walk serves every
//! grammar compiled against the vocabulary (every JSON Schema's string values and keys reach
//! the same string-body automaton), and the vocabulary computes the JSON string body's walk
//! when it is built, so even a process's first schema finds it ready.

use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use super::json_schema::common_lexemes;
use super::lexer::Lexeme;
use super::mask::{lex_walk, BodyCache, LexMask};
use crate::constrain::regex::{RegexLimits, StateId, TableDfa, DEAD};
use crate::constrain::vocab::TokenTrie;

/// Sub-automata larger than this are not keyed (their keys cost more than they save, and
/// such states rarely recur across grammars).
const KEY_MAX_STATES: usize = 24;

/// The canonical form of the automaton reachable from `q` (states numbered in breadth-first
/// order, bytes in order; per state: accepting, then 256 successors, dead as 0), or None
/// when more than [`KEY_MAX_STATES`] states are reachable. Equal keys mean equal languages
/// from the two states, state by state, so equal walks.
pub fn canonical_key(dfa: &TableDfa, q: StateId) -> Option<Box<[u32]>> {
    let mut order: Vec<StateId> = vec![q];
    let mut id: FxHashMap<StateId, u32> = FxHashMap::default();
    id.insert(q, 1);
    let mut key: Vec<u32> = Vec::with_capacity(257 * 8);
    let mut k = 0;
    while k < order.len() {
        let s = order[k];
        key.push(dfa.is_accepting(s) as u32);
        for b in 0..=255u8 {
            let t = dfa.next(s, b);
            if t == DEAD {
                key.push(0);
                continue;
            }
            let n = id.len() as u32 + 1;
            let c = *id.entry(t).or_insert(n);
            if c == n {
                if order.len() == KEY_MAX_STATES {
                    return None;
                }
                order.push(t);
            }
            key.push(c);
        }
        k += 1;
    }
    Some(key.into())
}

/// How many bytes lead from `q` back to `q`.
pub fn self_loops(dfa: &TableDfa, q: StateId) -> usize {
    (0..=255u8).filter(|&b| dfa.next(q, b) == q).count()
}

/// The state most bytes lead to from `q` (not dead), and how many bytes do.
pub fn majority_successor(dfa: &TableDfa, q: StateId) -> Option<(StateId, usize)> {
    let mut succ: Vec<StateId> = (0..=255u8)
        .map(|b| dfa.next(q, b))
        .filter(|&t| t != DEAD)
        .collect();
    succ.sort_unstable();
    // (chunk_by is 1.77, within the MSRV.)
    succ.chunk_by(|a, b| a == b)
        .map(|run| (run[0], run.len()))
        .reduce(|best, x| if x.1 > best.1 { x } else { best })
}

/// Walks keyed by [`canonical_key`], for one vocabulary, under a memory cap.
#[derive(Debug)]
pub struct SharedWalks {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    walks: FxHashMap<Box<[u32]>, Arc<LexMask>>,
    used_bytes: usize,
}

/// Memory the shared walks may hold per vocabulary.
const SHARED_CAP_BYTES: usize = 64 << 20;

impl Default for SharedWalks {
    fn default() -> Self {
        SharedWalks {
            inner: Mutex::new(Inner::default()),
        }
    }
}

impl SharedWalks {
    /// The shared walks of `trie`, with those every JSON grammar starts with already done
    /// (a few milliseconds on a 131k vocabulary): the string body, numbers, whitespace, and
    /// punctuation with whitespace around it, from each state that loops (compiling them
    /// also leaves their automata in the lexeme cache).
    pub fn seeded(trie: &TokenTrie, words: usize) -> Self {
        let shared = SharedWalks::default();
        if trie.nodes.is_empty() {
            return shared;
        }
        for regex in common_lexemes() {
            let Ok(lexeme) = Lexeme::compile(&regex, RegexLimits::default()) else {
                continue;
            };
            let dfa = lexeme.table().expect("a regex lexeme has a table");
            let mut body = BodyCache::new(dfa.num_states());
            for q in dfa
                .states()
                .filter(|&q| q != DEAD && self_loops(dfa, q) > 0)
            {
                if let Some(key) = canonical_key(dfa, q) {
                    let walk = lex_walk(&lexeme, q, trie, words, &mut body, None);
                    shared.offer(key, Arc::new(walk));
                }
            }
        }
        shared
    }

    pub fn get(&self, key: &[u32]) -> Option<Arc<LexMask>> {
        self.lock().walks.get(key).cloned()
    }

    pub fn offer(&self, key: Box<[u32]>, walk: Arc<LexMask>) {
        let mut inner = self.lock();
        let size = walk.bytes() + 4 * key.len();
        if inner.used_bytes + size <= SHARED_CAP_BYTES && !inner.walks.contains_key(&key) {
            inner.walks.insert(key, walk);
            inner.used_bytes += size;
        }
    }

    pub fn len(&self) -> usize {
        self.lock().walks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Entries are inserted whole: a poisoned lock still holds only complete walks.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON_STRING: &str = r#""(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*""#;

    fn inside(regex: &str) -> (TableDfa, StateId) {
        let dfa = TableDfa::compile(regex, RegexLimits::default()).unwrap();
        let q = dfa.next(dfa.start(), b'"');
        (dfa, q)
    }

    #[test]
    fn equal_languages_share_a_key_and_others_do_not() {
        let (a, qa) = inside(JSON_STRING);
        // The same language spelled another way, and a string minus one name, one byte in.
        let (b, qb) = inside(r#""(?:(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})){0,})""#);
        let (c, qc) = inside(r#""(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*""#);
        let ka = canonical_key(&a, qa).unwrap();
        assert_eq!(Some(&ka), canonical_key(&b, qb).as_ref());
        assert_eq!(Some(&ka), canonical_key(&c, qc).as_ref());
        let (d, qd) = inside(r#""(?:[^"\\\x00-\x1F])*""#);
        assert_ne!(Some(ka), canonical_key(&d, qd));
        // A key is a function of the language from the state: the body loops, so the key
        // from the body equals the key one byte further.
        assert_eq!(canonical_key(&a, qa), canonical_key(&a, a.next(qa, b'x')));
    }

    #[test]
    fn majority_successor_of_a_name_state_is_the_body() {
        let (a, q) = inside(JSON_STRING);
        let (r, n) = majority_successor(&a, q).unwrap();
        assert_eq!(r, q);
        assert!(n >= 90 && self_loops(&a, q) == n);
        // One byte into a name: most bytes lead into the body, which loops.
        let names = TableDfa::compile(r#""abc"|"abd""#, RegexLimits::default()).unwrap();
        let p = names.next(names.start(), b'"');
        assert_eq!(majority_successor(&names, p).map(|(_, n)| n), Some(1));
    }
}
