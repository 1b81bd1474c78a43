//! Lexemes: regular languages of bytes, each compiled to the same trimmed byte DFA the regex
//! constraint uses (so "not dead" means "some continuation completes the lexeme").

use crate::constrain::regex::{RegexLimits, StateId, TableDfa, DEAD};
use crate::constrain::GrammarError;

#[derive(Debug)]
pub struct Lexeme {
    pub regex: String,
    pub dfa: TableDfa,
}

impl Lexeme {
    pub fn compile(regex: &str, limits: RegexLimits) -> Result<Self, GrammarError> {
        Ok(Lexeme {
            regex: regex.to_owned(),
            dfa: TableDfa::compile(regex, limits)?,
        })
    }

    /// A lexeme from a ready DFA (`name` shows in errors and [`Grammar::describe`]).
    ///
    /// [`Grammar::describe`]: super::Grammar::describe
    pub fn from_dfa(name: &str, dfa: TableDfa) -> Self {
        Lexeme {
            regex: name.to_owned(),
            dfa,
        }
    }

    /// Matches no string at all (its start state is dead).
    pub fn is_empty(&self) -> bool {
        self.dfa.start() == DEAD
    }

    /// Matches the empty string.
    pub fn nullable(&self) -> bool {
        !self.is_empty() && self.dfa.is_accepting(self.dfa.start())
    }

    #[inline]
    pub fn start(&self) -> StateId {
        self.dfa.start()
    }
}
