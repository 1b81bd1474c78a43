//! Regex -> byte-level DFA. `regex-automata` determinizes (anchored, all-matches semantics so
//! the whole language is kept); we then copy the reachable part into a flat table with
//! premultiplied state ids and fold every state that cannot reach a match into the dead
//! state 0, so "not dead" means "some continuation completes a match".

use std::collections::HashMap;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson;
use regex_automata::util::{start, syntax};
use regex_automata::{Anchored, MatchKind};

use super::GrammarError;

/// Limits applied while compiling (bytes of automaton memory).
#[derive(Debug, Clone, Copy)]
pub struct RegexLimits {
    /// Cap on the regex-automata NFA, determinizer and dense DFA, each.
    pub automaton_bytes: usize,
    /// Cap on the final transition table (`states * 256 * 4` bytes).
    pub table_bytes: usize,
}

impl Default for RegexLimits {
    fn default() -> Self {
        RegexLimits {
            automaton_bytes: 64 << 20,
            table_bytes: 64 << 20,
        }
    }
}

/// Dead state (premultiplied id 0); it loops to itself.
pub const DEAD: u32 = 0;

/// Flat DFA: `trans[s + byte]` is the next state, with `s` a premultiplied id (`index * 256`).
#[derive(Debug, Clone)]
pub struct TableDfa {
    trans: Vec<u32>,
    accepting: Vec<bool>,
    start: u32,
}

impl TableDfa {
    pub fn compile(pattern: &str, limits: RegexLimits) -> Result<Self, GrammarError> {
        let lim = Some(limits.automaton_bytes);
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(lim)
                    .determinize_size_limit(lim),
            )
            .syntax(syntax::Config::new().utf8(true).unicode(true))
            .thompson(thompson::Config::new().nfa_size_limit(lim))
            .build(pattern)
            .map_err(|e| classify(pattern, &e.to_string()))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| GrammarError::Regex(format!("{pattern:?}: {e}")))?;

        // Breadth-first copy of the reachable states (index 0 is reserved for dead).
        let mut index: HashMap<_, u32> = HashMap::new();
        let mut order = vec![start];
        index.insert(start, 1);
        let mut edges: Vec<[u32; 256]> = vec![[0; 256]];
        let mut accepting = vec![false];
        let max_states = (limits.table_bytes / (256 * 4)).max(2);
        let mut i = 0;
        while i < order.len() {
            let s = order[i];
            if dfa.is_quit_state(s) {
                return Err(GrammarError::Regex(format!(
                    "{pattern:?} needs a feature the byte DFA cannot express (e.g. a Unicode \
                     word boundary)"
                )));
            }
            let mut row = [0u32; 256];
            for b in 0..=255u8 {
                let n = dfa.next_state(s, b);
                if dfa.is_dead_state(n) {
                    continue;
                }
                let next = match index.get(&n) {
                    Some(&k) => k,
                    None => {
                        let k = order.len() as u32 + 1;
                        if k as usize >= max_states {
                            return Err(GrammarError::TooLarge(format!(
                                "{pattern:?} needs more than {max_states} DFA states (table \
                                 limit {} bytes)",
                                limits.table_bytes
                            )));
                        }
                        index.insert(n, k);
                        order.push(n);
                        k
                    }
                };
                row[b as usize] = next;
            }
            edges.push(row);
            accepting.push(dfa.is_match_state(dfa.next_eoi_state(s)));
            i += 1;
        }

        // Keep only states that can still reach an accepting one.
        let n = edges.len();
        let mut rev: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (s, row) in edges.iter().enumerate().skip(1) {
            for &t in row.iter() {
                if t != 0 {
                    rev[t as usize].push(s as u32);
                }
            }
        }
        let mut live = accepting.clone();
        let mut work: Vec<u32> = (0..n as u32).filter(|&s| live[s as usize]).collect();
        while let Some(t) = work.pop() {
            for &s in &rev[t as usize] {
                if !live[s as usize] {
                    live[s as usize] = true;
                    work.push(s);
                }
            }
        }
        live[0] = false;
        let mut remap = vec![0u32; n];
        let mut kept = 1u32;
        for s in 1..n {
            if live[s] {
                remap[s] = kept;
                kept += 1;
            }
        }
        let k = kept as usize;
        let mut trans = vec![DEAD; k * 256];
        let mut acc = vec![false; k];
        for s in 1..n {
            if !live[s] {
                continue;
            }
            let base = remap[s] as usize * 256;
            for b in 0..256 {
                trans[base + b] = remap[edges[s][b] as usize] * 256;
            }
            acc[remap[s] as usize] = accepting[s];
        }
        Ok(TableDfa {
            trans,
            accepting: acc,
            start: remap[1] * 256,
        })
    }

    #[inline(always)]
    pub fn next(&self, state: u32, byte: u8) -> u32 {
        self.trans[state as usize + byte as usize]
    }

    /// As [`next`](Self::next) without the bounds check (the trie walk's inner loop).
    ///
    /// # Safety
    /// `state` must be a state id of this DFA (premultiplied, as returned by it).
    #[inline(always)]
    pub unsafe fn next_unchecked(&self, state: u32, byte: u8) -> u32 {
        *self.trans.get_unchecked(state as usize + byte as usize)
    }

    /// Run `bytes` from `state`; DEAD as soon as no match is reachable.
    #[inline]
    pub fn run(&self, mut state: u32, bytes: &[u8]) -> u32 {
        for &b in bytes {
            state = self.next(state, b);
            if state == DEAD {
                break;
            }
        }
        state
    }

    #[inline]
    pub fn is_accepting(&self, state: u32) -> bool {
        self.accepting[(state / 256) as usize]
    }

    pub fn start(&self) -> u32 {
        self.start
    }

    /// Live states plus the dead one.
    pub fn num_states(&self) -> usize {
        self.accepting.len()
    }

    /// Dense index (0..num_states) of a premultiplied state id.
    #[inline]
    pub fn index(state: u32) -> usize {
        (state / 256) as usize
    }
}

fn classify(pattern: &str, msg: &str) -> GrammarError {
    if msg.contains("exceeded") || msg.contains("too big") || msg.contains("size limit") {
        GrammarError::TooLarge(format!("{pattern:?}: {msg}"))
    } else {
        GrammarError::Regex(format!("{pattern:?}: {msg}"))
    }
}
