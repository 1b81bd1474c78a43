//! Regex -> byte-level DFA. `regex-automata` determinizes (anchored, all-matches semantics so
//! the whole language is kept); we then copy the reachable part into a flat table indexed by
//! [`StateId`] and fold every state that cannot reach a match into the dead
//! state 0, so "not dead" means "some continuation completes a match".

use rustc_hash::FxHashMap;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson;
use regex_automata::util::{start, syntax};
use regex_automata::{Anchored, MatchKind};
use regex_syntax::hir::{Hir, HirKind};

use crate::constrain::GrammarError;

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

/// A state of a [`TableDfa`], or a matcher's [`StateId::TERMINATED`]. Stored premultiplied
/// (`index * 256`, the offset of its row of transitions) so a transition is one add and one
/// load in the trie walk's inner loop; only this type does that arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct StateId(u32);

impl StateId {
    /// The dead state (index 0): no continuation completes a match; it loops to itself.
    pub const DEAD: StateId = StateId(0);
    /// A matcher's state after EOS was accepted (no DFA row: never index with it).
    pub const TERMINATED: StateId = StateId(u32::MAX);

    /// The state with dense index `index` (`0..num_states`).
    #[inline(always)]
    pub const fn from_index(index: usize) -> StateId {
        StateId((index * 256) as u32)
    }

    /// Dense index (`0..num_states`) of a DFA state.
    #[inline(always)]
    pub const fn index(self) -> usize {
        self.0 as usize / 256
    }

    /// Offset of the state's transition row in the table.
    #[inline(always)]
    const fn row(self) -> usize {
        self.0 as usize
    }
}

/// The raw (premultiplied) id, as the Python layer shows it.
impl From<StateId> for u32 {
    fn from(s: StateId) -> u32 {
        s.0
    }
}

/// Dead state; it loops to itself.
pub const DEAD: StateId = StateId::DEAD;

/// Byte positions of `hir` with every counted repetition written out (saturating): an upper
/// bound on the automaton positions regex-automata builds for it.
fn expanded_positions(hir: &Hir) -> usize {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => 0,
        HirKind::Literal(lit) => lit.0.len(),
        HirKind::Class(_) => 1,
        HirKind::Repetition(rep) => {
            let copies = rep.max.unwrap_or(rep.min).max(1) as usize;
            copies.saturating_mul(expanded_positions(&rep.sub).max(1))
        }
        HirKind::Capture(cap) => expanded_positions(&cap.sub),
        HirKind::Concat(parts) | HirKind::Alternation(parts) => parts
            .iter()
            .map(expanded_positions)
            .fold(0, usize::saturating_add),
    }
}

/// Flat DFA: `trans[s.row() + byte]` is the next state of `s`.
#[derive(Debug, Clone)]
pub struct TableDfa {
    trans: Vec<StateId>,
    accepting: Vec<bool>,
    start: StateId,
}

/// The text of a pattern written only as `\x{HEX}` escapes (how grammar front ends spell
/// property names and constants), or None.
pub(crate) fn escaped_literal(pattern: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = pattern;
    while !rest.is_empty() {
        let body = rest.strip_prefix("\\x{")?;
        let close = body.find('}')?;
        let hex = &body[..close];
        if hex.is_empty() || hex.len() > 6 {
            return None;
        }
        out.push(char::from_u32(u32::from_str_radix(hex, 16).ok()?)?);
        rest = &body[close + 1..];
    }
    (!out.is_empty()).then_some(out)
}

impl TableDfa {
    /// The DFA of exactly `text`'s bytes: a chain, built without the regex machinery.
    pub fn literal(text: &[u8]) -> TableDfa {
        let n = text.len();
        // State 0 dead, state i + 1 after i bytes.
        let mut edges = vec![[0u32; 256]; n + 2];
        for (i, &b) in text.iter().enumerate() {
            edges[i + 1][b as usize] = i as u32 + 2;
        }
        let mut accepting = vec![false; n + 2];
        accepting[n + 1] = true;
        TableDfa::trimmed(&edges, &accepting)
    }

    pub fn compile(pattern: &str, limits: RegexLimits) -> Result<Self, GrammarError> {
        // Literals (most lexemes of a JSON Schema: its property names) skip regex-automata,
        // whose set-up costs more than the literal's whole automaton.
        if let Some(text) = escaped_literal(pattern) {
            let max_states = (limits.table_bytes / (256 * 4)).max(2);
            if text.len() + 2 <= max_states {
                return Ok(TableDfa::literal(text.as_bytes()));
            }
        }
        let syntax_config = syntax::Config::new().utf8(true).unicode(true);
        let max_states = (limits.table_bytes / (256 * 4)).max(2);
        // A match of n bytes walks n + 1 distinct live states (a repeated one could be cut out
        // of the shortest match, or pumped in the longest of a finite language): refuse a
        // pattern whose table cannot fit before regex-automata spends seconds on `a{1000000}`.
        let hir = syntax::parse_with(pattern, &syntax_config)
            .map_err(|e| classify(pattern, &e.to_string()))?;
        let props = hir.properties();
        let longest = props.maximum_len().or(props.minimum_len()).unwrap_or(0);
        if longest > max_states {
            return Err(GrammarError::TooLarge(format!(
                "{pattern:?} needs more than {max_states} DFA states (table limit {} bytes)",
                limits.table_bytes
            )));
        }
        // Counted repetitions of unbounded or optional parts (`a?{333522}`, `(a|b*){99999}`)
        // escape the length test but still expand into that many automaton positions, which
        // regex-automata builds and determinizes for tens of seconds before a size limit
        // stops it (found by the 1M-input fuzz run).
        let expanded = expanded_positions(&hir);
        if expanded > max_states {
            return Err(GrammarError::TooLarge(format!(
                "{pattern:?} expands to {expanded} positions, more than the {max_states} DFA \
                 states of the table limit ({} bytes)",
                limits.table_bytes
            )));
        }
        let lim = Some(limits.automaton_bytes);
        let nfa = thompson::Compiler::new()
            .syntax(syntax_config)
            .configure(thompson::Config::new().nfa_size_limit(lim))
            .build(pattern)
            .map_err(|e| classify(pattern, &e.to_string()))?;
        // An NFA larger than the table: determinizing it costs seconds (each DFA state is a
        // set of NFA states) and the result rarely fits; refuse it now.
        if nfa.states().len() > max_states {
            return Err(GrammarError::TooLarge(format!(
                "{pattern:?} compiles to {} NFA states, more than the {max_states} DFA states \
                 of the table limit ({} bytes)",
                nfa.states().len(),
                limits.table_bytes
            )));
        }
        // Stop determinizing as soon as the DFA has more states than our table can hold:
        // with few byte classes regex-automata's states are small, so its byte limit alone
        // would let `.*X.{n}` (2^n states) run for seconds past the point of no use.
        let stride = 1usize << nfa.byte_classes().stride2();
        let states_bytes = (max_states + 8).saturating_mul(stride * 4) + (64 << 10);
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(Some(states_bytes.min(limits.automaton_bytes)))
                    // A quarter of the budget for the state sets being determinized: their
                    // growth is what takes the time (about 1 s per 16 MiB here).
                    .determinize_size_limit(Some(limits.automaton_bytes / 4)),
            )
            .build_from_nfa(&nfa)
            .map_err(|e| classify(pattern, &e.to_string()))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| GrammarError::Regex(format!("{pattern:?}: {e}")))?;

        // Breadth-first copy of the reachable states (index 0 is reserved for dead).
        let mut index: FxHashMap<_, u32> = FxHashMap::default();
        let mut order = vec![start];
        index.insert(start, 1);
        let mut edges: Vec<[u32; 256]> = vec![[0; 256]];
        let mut accepting = vec![false];
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

        Ok(TableDfa::trimmed(&edges, &accepting))
    }

    /// The product automaton: strings both DFAs match (trimmed like `compile`'s output).
    pub fn intersect(&self, other: &TableDfa, limits: RegexLimits) -> Result<Self, GrammarError> {
        self.product(other, false, limits)
    }

    /// Strings this DFA matches and `other` does not.
    pub fn difference(&self, other: &TableDfa, limits: RegexLimits) -> Result<Self, GrammarError> {
        self.product(other, true, limits)
    }

    /// Product construction; `minus`: accept where `other` rejects (its dead state is then
    /// a real sink state of the product, not a cut).
    fn product(
        &self,
        other: &TableDfa,
        minus: bool,
        limits: RegexLimits,
    ) -> Result<Self, GrammarError> {
        let mut edges: Vec<[u32; 256]> = vec![[0; 256]];
        let mut accepting = vec![false];
        if self.start != DEAD && (minus || other.start != DEAD) {
            let max_states = (limits.table_bytes / (256 * 4)).max(2);
            let mut index: FxHashMap<(StateId, StateId), u32> = FxHashMap::default();
            let mut order = vec![(self.start, other.start)];
            index.insert(order[0], 1);
            let mut i = 0;
            while i < order.len() {
                let (a, b) = order[i];
                let mut row = [0u32; 256];
                for byte in 0..=255u8 {
                    let pair = (self.next(a, byte), other.next(b, byte));
                    if pair.0 == DEAD || (pair.1 == DEAD && !minus) {
                        continue;
                    }
                    let k = match index.get(&pair) {
                        Some(&k) => k,
                        None => {
                            let k = order.len() as u32 + 1;
                            if k as usize >= max_states {
                                return Err(GrammarError::TooLarge(format!(
                                    "an intersection of two DFAs needs more than {max_states} \
                                     states (table limit {} bytes)",
                                    limits.table_bytes
                                )));
                            }
                            index.insert(pair, k);
                            order.push(pair);
                            k
                        }
                    };
                    row[byte as usize] = k;
                }
                edges.push(row);
                let in_other = b != DEAD && other.is_accepting(b);
                accepting.push(self.is_accepting(a) && in_other != minus);
                i += 1;
            }
        }
        Ok(TableDfa::trimmed(&edges, &accepting))
    }

    /// A DFA built by hand: `edges[s][byte]` the next state (0 dead, 1 the start), trimmed
    /// like `compile`'s output. Every target must index into `edges`.
    pub fn from_edges(edges: &[[u32; 256]], accepting: &[bool]) -> TableDfa {
        TableDfa::trimmed(edges, accepting)
    }

    /// The table of `edges` (state 0 dead, state 1 the start), keeping only the states that
    /// can still reach an accepting one (all others fold into the dead state).
    fn trimmed(edges: &[[u32; 256]], accepting: &[bool]) -> TableDfa {
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
        let mut live = accepting.to_vec();
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
        let mut rows: Vec<[u32; 256]> = vec![[0; 256]; k];
        let mut acc = vec![false; k];
        for s in 1..n {
            if !live[s] {
                continue;
            }
            let r = remap[s] as usize;
            for b in 0..256 {
                rows[r][b] = remap[edges[s][b] as usize];
            }
            acc[r] = accepting[s];
        }
        let start = remap.get(1).copied().unwrap_or(0);
        let (rows, acc, start) = merge_equal_rows(rows, acc, start);
        let mut trans = vec![DEAD; rows.len() * 256];
        for (r, row) in rows.iter().enumerate() {
            let base = StateId::from_index(r).row();
            for b in 0..256 {
                trans[base + b] = StateId::from_index(row[b] as usize);
            }
        }
        TableDfa {
            trans,
            accepting: acc,
            start: StateId::from_index(start as usize),
        }
    }

    #[inline(always)]
    pub fn next(&self, state: StateId, byte: u8) -> StateId {
        self.trans[state.row() + byte as usize]
    }

    /// As [`next`](Self::next) without the bounds check (the trie walk's inner loop).
    ///
    /// # Safety
    /// `state` must be a state of this DFA (not [`StateId::TERMINATED`]).
    #[inline(always)]
    pub unsafe fn next_unchecked(&self, state: StateId, byte: u8) -> StateId {
        // SAFETY: a state of this DFA has a full row of 256 transitions in `trans`.
        unsafe { *self.trans.get_unchecked(state.row() + byte as usize) }
    }

    /// Run `bytes` from `state`; DEAD as soon as no match is reachable.
    #[inline]
    pub fn run(&self, mut state: StateId, bytes: &[u8]) -> StateId {
        for &b in bytes {
            state = self.next(state, b);
            if state == DEAD {
                break;
            }
        }
        state
    }

    #[inline]
    pub fn is_accepting(&self, state: StateId) -> bool {
        self.accepting[state.index()]
    }

    pub fn start(&self) -> StateId {
        self.start
    }

    /// Live states plus the dead one.
    pub fn num_states(&self) -> usize {
        self.accepting.len()
    }

    /// Every state, dead (index 0) first.
    pub fn states(&self) -> impl Iterator<Item = StateId> {
        (0..self.num_states()).map(StateId::from_index)
    }
}

/// Merge states with the same acceptance and the same row, until none are left (the
/// determinizer leaves copies of one state apart, e.g. the start and the state after a
/// byte of a `.*` prefix; merged, "this character leads back to the same state" holds, which
/// mask walks rely on to settle text whole). Dead (0) stays 0; a bounded number of rounds.
fn merge_equal_rows(
    mut rows: Vec<[u32; 256]>,
    mut acc: Vec<bool>,
    mut start: u32,
) -> (Vec<[u32; 256]>, Vec<bool>, u32) {
    for _ in 0..8 {
        let n = rows.len();
        let mut first: FxHashMap<(&[u32; 256], bool), u32> = FxHashMap::default();
        let mut map = vec![0u32; n];
        let mut kept = 1u32;
        for s in 1..n {
            match first.entry((&rows[s], acc[s])) {
                std::collections::hash_map::Entry::Occupied(e) => map[s] = *e.get(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(kept);
                    map[s] = kept;
                    kept += 1;
                }
            }
        }
        if kept as usize == n {
            break;
        }
        let mut new_rows = vec![[0u32; 256]; kept as usize];
        let mut new_acc = vec![false; kept as usize];
        for s in 1..n {
            let t = map[s] as usize;
            for b in 0..256 {
                new_rows[t][b] = map[rows[s][b] as usize];
            }
            new_acc[t] = acc[s];
        }
        start = map[start as usize];
        rows = new_rows;
        acc = new_acc;
    }
    (rows, acc, start)
}

fn classify(pattern: &str, msg: &str) -> GrammarError {
    if msg.contains("exceeded") || msg.contains("too big") || msg.contains("size limit") {
        GrammarError::TooLarge(format!("{pattern:?}: {msg}"))
    } else {
        GrammarError::Regex(format!("{pattern:?}: {msg}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The same text spelled as `\x{..}` escapes but forced through regex-automata (a
    /// trailing empty group defeats the literal fast path).
    fn via_regex(text: &str) -> TableDfa {
        let escaped: String = text
            .chars()
            .map(|c| format!("\\x{{{:X}}}", c as u32))
            .collect();
        TableDfa::compile(&format!("{escaped}(?:)"), RegexLimits::default()).unwrap()
    }

    proptest! {
        /// The literal fast path accepts and rejects exactly what the regex does, on the
        /// literal's prefixes, extensions and one-byte edits.
        #[test]
        fn literal_equals_regex(text in "[a-z\"\\\\é€0-9 ]{1,12}", probe in prop::collection::vec(any::<u8>(), 0..16)) {
            let escaped: String = text.chars().map(|c| format!("\\x{{{:X}}}", c as u32)).collect();
            let decoded = escaped_literal(&escaped);
            prop_assert_eq!(decoded.as_deref(), Some(text.as_str()));
            let fast = TableDfa::compile(&escaped, RegexLimits::default()).unwrap();
            let slow = via_regex(&text);
            let bytes = text.as_bytes();
            let mut inputs: Vec<Vec<u8>> = (0..=bytes.len()).map(|k| bytes[..k].to_vec()).collect();
            inputs.push([bytes, &probe[..]].concat());
            inputs.push(probe.clone());
            for i in 0..bytes.len() {
                let mut e = bytes.to_vec();
                e[i] ^= 1;
                inputs.push(e);
            }
            for x in inputs {
                let (a, b) = (fast.run(fast.start(), &x), slow.run(slow.start(), &x));
                prop_assert_eq!(a == DEAD, b == DEAD, "alive on {:?}", x);
                prop_assert_eq!(a != DEAD && fast.is_accepting(a), b != DEAD && slow.is_accepting(b));
            }
        }
    }

    #[test]
    fn only_escape_sequences_are_literals() {
        assert_eq!(escaped_literal("\\x{61}\\x{E9}").as_deref(), Some("aé"));
        for p in [
            "a",
            "\\x{61}b",
            "\\x{}",
            "\\x{110000}",
            "\\x{61",
            "",
            "\\x{61}*",
        ] {
            assert_eq!(escaped_literal(p), None, "{p:?}");
        }
    }
}
