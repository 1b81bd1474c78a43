//! A matcher: one constraint state per accepted token, kept as a persistent list so `fork`
//! is an `Arc` clone (O(1)) and `rollback(n)` walks back `n` links.

use std::sync::Arc;

use super::{CompiledRegex, Constraint, GrammarError};

#[derive(Debug)]
struct Hist<S> {
    state: S,
    prev: Option<Arc<Hist<S>>>,
}

impl<S> Drop for Hist<S> {
    // Unlink iteratively: a long history must not recurse once per token.
    fn drop(&mut self) {
        let mut next = self.prev.take();
        while let Some(node) = next {
            match Arc::try_unwrap(node) {
                Ok(mut n) => next = n.prev.take(),
                Err(_) => break,
            }
        }
    }
}

#[derive(Debug)]
pub struct Matcher<C: Constraint = CompiledRegex> {
    grammar: Arc<C>,
    head: Arc<Hist<C::State>>,
    /// Accepted tokens still in the history (what `rollback` may undo).
    len: usize,
}

// Not derived: a derive would require `C: Clone`, and the constraint is shared, not copied.
impl<C: Constraint> Clone for Matcher<C> {
    fn clone(&self) -> Self {
        Matcher {
            grammar: self.grammar.clone(),
            head: self.head.clone(),
            len: self.len,
        }
    }
}

impl<C: Constraint> Matcher<C> {
    pub fn new(grammar: Arc<C>) -> Self {
        let start = grammar.start();
        Matcher {
            grammar,
            head: Arc::new(Hist {
                state: start,
                prev: None,
            }),
            len: 0,
        }
    }

    pub fn grammar(&self) -> &Arc<C> {
        &self.grammar
    }

    /// Current state (`C::TERMINATED` after EOS).
    #[inline]
    pub fn state(&self) -> C::State {
        self.head.state.clone()
    }

    /// Advance by one token; `Ok(false)` (state unchanged) if the grammar rejects it, an
    /// error (state unchanged) if the step runs past a limit of the grammar's.
    pub fn accept_token(&mut self, token: i64) -> Result<bool, GrammarError> {
        let t = self.grammar.vocab().check(token)?;
        let next = self.grammar.step(self.state(), t)?;
        if next == C::DEAD {
            return Ok(false);
        }
        self.push(next);
        Ok(true)
    }

    /// Accept tokens in order; stops at the first rejected one and returns how many were
    /// accepted (all ids are range-checked first, and a limit error undoes the tokens this
    /// call accepted, so an error changes nothing).
    pub fn accept_tokens(&mut self, tokens: &[i64]) -> Result<usize, GrammarError> {
        for &t in tokens {
            self.grammar.vocab().check(t)?;
        }
        let (head, len) = (self.head.clone(), self.len);
        for (i, &t) in tokens.iter().enumerate() {
            match self.accept_token(t) {
                Ok(true) => {}
                Ok(false) => return Ok(i),
                Err(e) => {
                    (self.head, self.len) = (head, len);
                    return Err(e);
                }
            }
        }
        Ok(tokens.len())
    }

    fn push(&mut self, state: C::State) {
        let prev = Some(self.head.clone());
        self.head = Arc::new(Hist { state, prev });
        self.len += 1;
    }

    pub fn is_terminated(&self) -> bool {
        self.state() == C::TERMINATED
    }

    /// EOS is allowed now.
    pub fn is_accepting(&self) -> bool {
        self.grammar.is_accepting(self.state())
    }

    pub fn num_accepted(&self) -> usize {
        self.len
    }

    /// Undo the last `n` accepted tokens.
    pub fn rollback(&mut self, n: usize) -> Result<(), GrammarError> {
        if n > self.len {
            return Err(GrammarError::Rollback {
                requested: n,
                available: self.len,
            });
        }
        for _ in 0..n {
            let prev = self.head.prev.clone().expect("history shorter than len");
            self.head = prev;
        }
        self.len -= n;
        Ok(())
    }

    /// Back to the start state with an empty history.
    pub fn reset(&mut self) {
        *self = Matcher::new(self.grammar.clone());
    }

    /// An independent copy sharing history (O(1)).
    pub fn fork(&self) -> Matcher<C> {
        self.clone()
    }

    /// Bitmask of the tokens allowed next into `out` (at least `words()` long); an error
    /// when it runs past a limit of the grammar's.
    pub fn fill_bitmask(&self, out: &mut [u32]) -> Result<(), GrammarError> {
        let words = self.grammar.vocab().words();
        if out.len() < words {
            return Err(GrammarError::Shape(format!(
                "bitmask row has {} words, the vocabulary needs {words}",
                out.len()
            )));
        }
        self.grammar.fill_mask(self.state(), out)
    }
}
