//! Grammar masks over draft trees: one row per node (root first), states advanced along
//! parents; and the token filter that makes the DDTree builder grammar-aware.

use super::{CompiledRegex, Constraint, GrammarError, Matcher};
use crate::tree::TokenFilter;

/// States of every node of a tree whose root is in `root_state`; DEAD for nodes whose token
/// (or an ancestor's) the constraint rejects; an error when a step runs past a limit.
pub fn tree_states<C: Constraint>(
    g: &C,
    root_state: C::State,
    tokens: &[i64],
    parents: &[i32],
) -> Result<Vec<C::State>, GrammarError> {
    let n = tokens.len();
    if parents.len() != n || n == 0 {
        return Err(GrammarError::Shape(format!(
            "tokens ({n}) and parents ({}) must have the same non-zero length",
            parents.len()
        )));
    }
    if parents[0] != -1 {
        return Err(GrammarError::Shape(
            "node 0 must be the root (parent -1)".into(),
        ));
    }
    let vocab = g.vocab();
    let mut states = Vec::with_capacity(n);
    states.push(root_state);
    for i in 1..n {
        let p = parents[i];
        if p < 0 || p as usize >= i {
            return Err(GrammarError::Shape(format!(
                "parents[{i}] = {p} must be in [0, {i})"
            )));
        }
        let t = vocab.check(tokens[i])?;
        states.push(g.step(states[p as usize].clone(), t)?);
    }
    Ok(states)
}

/// Fill rows `0..n` of `out` (`cols` words each) with the masks of the tree's nodes; returns
/// per node whether its path is valid. Invalid nodes get an all-zero row.
pub fn fill_tree_bitmask<C: Constraint>(
    m: &Matcher<C>,
    tokens: &[i64],
    parents: &[i32],
    out: &mut [u32],
    cols: usize,
) -> Result<Vec<bool>, GrammarError> {
    let g = m.grammar();
    let words = g.vocab().words();
    if cols < words || out.len() < tokens.len() * cols {
        return Err(GrammarError::Shape(format!(
            "bitmask needs >= {} rows of >= {words} words, got {} rows of {cols}",
            tokens.len(),
            out.len() / cols.max(1)
        )));
    }
    let states = tree_states(g.as_ref(), m.state(), tokens, parents)?;
    let mut valid = Vec::with_capacity(states.len());
    for (i, s) in states.into_iter().enumerate() {
        let row = &mut out[i * cols..(i + 1) * cols];
        valid.push(s != C::DEAD);
        g.fill_mask(s, row)?;
    }
    Ok(valid)
}

/// The DDTree builder's filter: one constraint state per emitted node (node 0 = the
/// matcher's).
pub struct GrammarFilter<'a, C: Constraint = CompiledRegex> {
    g: &'a C,
    states: Vec<C::State>,
}

impl<'a, C: Constraint> GrammarFilter<'a, C> {
    pub fn new(m: &'a Matcher<C>, capacity: usize) -> Self {
        let mut states = Vec::with_capacity(capacity);
        states.push(m.state());
        GrammarFilter {
            g: m.grammar(),
            states,
        }
    }

    /// States of the emitted nodes, in node order.
    pub fn states(&self) -> &[C::State] {
        &self.states
    }

    /// A step past a limit of the grammar's counts as rejected here (a filter cannot
    /// fail): the matcher's own step or fill at that token reports it.
    #[inline]
    fn next(&self, parent: usize, token: i64) -> C::State {
        let s = &self.states[parent];
        // Drafting past EOS would only spend budget on padding.
        if *s == C::TERMINATED {
            return C::DEAD;
        }
        match self.g.vocab().check(token) {
            Ok(t) => self.g.step(s.clone(), t).unwrap_or(C::DEAD),
            Err(_) => C::DEAD,
        }
    }
}

impl<C: Constraint> TokenFilter for GrammarFilter<'_, C> {
    fn allows(&mut self, parent: usize, token: i64) -> bool {
        self.next(parent, token) != C::DEAD
    }

    fn emitted(&mut self, node: usize, parent: usize, token: i64) {
        debug_assert_eq!(node, self.states.len());
        let s = self.next(parent, token);
        self.states.push(s);
    }
}

/// Set `logits[t]` to -inf for every token `t` that the bitmask row `mask` (its words in
/// order) disallows (bit
/// `t % 32` of word `t / 32` clear; tokens past the row's words are disallowed). What a
/// masked argmax or softmax then reads is the grammar's choice; a word at a time, since
/// most words of a grammar's row are all clear or all set.
pub fn apply_bitmask_row(logits: &mut [f32], mask: impl IntoIterator<Item = u32>) {
    let mut words = mask.into_iter();
    for chunk in logits.chunks_mut(32) {
        match words.next().unwrap_or(0) {
            u32::MAX => {}
            0 => chunk.fill(f32::NEG_INFINITY),
            bits => {
                for (b, x) in chunk.iter_mut().enumerate() {
                    if bits >> b & 1 == 0 {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}
