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
    // At most KEY_MAX_STATES states: a linear search beats hashing, and runs of bytes
    // with one successor (most of a row) reuse the last answer.
    let mut order: Vec<StateId> = vec![q];
    let mut key: Vec<u32> = Vec::with_capacity(257 * 8);
    let mut k = 0;
    while k < order.len() {
        let s = order[k];
        key.push(dfa.is_accepting(s) as u32);
        let mut last = (DEAD, 0u32);
        for b in 0..=255u8 {
            let t = dfa.next(s, b);
            if t == last.0 {
                key.push(last.1);
                continue;
            }
            let c = match order.iter().position(|&o| o == t) {
                Some(p) => p as u32 + 1,
                None => {
                    if order.len() == KEY_MAX_STATES {
                        return None;
                    }
                    order.push(t);
                    order.len() as u32
                }
            };
            last = (t, c);
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

/// A canonical key, interned: equal ids, equal sub-automata.
pub type KeyId = u32;

#[derive(Debug, Default)]
struct Inner {
    keys: FxHashMap<Box<[u32]>, KeyId>,
    walks: FxHashMap<KeyId, Arc<LexMask>>,
    /// Per state of an automaton the process-wide lexeme cache holds (by its address: the
    /// `Arc` kept here keeps the address from being reused): its key id, or None when the
    /// state has none (it does not loop, or too many states lie beyond it). Every grammar
    /// spelling a lexeme the same way shares the automaton, so after the first one a
    /// state's key costs a lookup, not a breadth-first pass over 256 bytes per state.
    by_state: FxHashMap<(usize, StateId), Option<KeyId>>,
    held: FxHashMap<usize, Arc<TableDfa>>,
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

impl Inner {
    fn intern(&mut self, key: Box<[u32]>) -> Option<KeyId> {
        if let Some(&id) = self.keys.get(&key) {
            return Some(id);
        }
        let size = 4 * key.len();
        if self.used_bytes + size > SHARED_CAP_BYTES {
            return None;
        }
        let id = self.keys.len() as KeyId;
        self.keys.insert(key, id);
        self.used_bytes += size;
        Some(id)
    }
}

impl SharedWalks {
    /// The shared walks of `trie`, with those every JSON grammar starts with already done
    /// (a few milliseconds on a 131k vocabulary): the string body, numbers, whitespace, and
    /// punctuation with whitespace around it, from each state that loops (compiling them
    /// also leaves their automata in the lexeme cache, and their states' keys here).
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
            for q in dfa.states().filter(|&q| q != DEAD) {
                if let Some(id) = shared.key_of(&lexeme, q) {
                    let walk = lex_walk(&lexeme, q, trie, words, &mut body, None);
                    shared.offer(id, Arc::new(walk));
                }
            }
        }
        shared
    }

    /// The key of `lexeme`'s automaton from state `q` when the state loops (text,
    /// whitespace: the states whose walks are long and recur across grammars; a literal's
    /// walk is short), remembered per state for automata of the lexeme cache.
    pub fn key_of(&self, lexeme: &Lexeme, q: StateId) -> Option<KeyId> {
        let dfa = lexeme.table()?;
        let compute = || {
            (self_loops(dfa, q) > 0)
                .then(|| canonical_key(dfa, q))
                .flatten()
        };
        let Some(arc) = lexeme.cached_table() else {
            let key = compute()?;
            return self.lock().intern(key);
        };
        let addr = Arc::as_ptr(arc) as usize;
        if let Some(&id) = self.lock().by_state.get(&(addr, q)) {
            return id;
        }
        let key = compute();
        let mut inner = self.lock();
        let id = key.and_then(|k| inner.intern(k));
        inner.held.entry(addr).or_insert_with(|| arc.clone());
        inner.by_state.insert((addr, q), id);
        id
    }

    pub fn get(&self, id: KeyId) -> Option<Arc<LexMask>> {
        self.lock().walks.get(&id).cloned()
    }

    pub fn offer(&self, id: KeyId, walk: Arc<LexMask>) {
        let mut inner = self.lock();
        let size = walk.bytes();
        if inner.used_bytes + size <= SHARED_CAP_BYTES && !inner.walks.contains_key(&id) {
            inner.walks.insert(id, walk);
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
