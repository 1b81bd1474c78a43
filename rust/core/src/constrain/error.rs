use thiserror::Error;

/// Errors of the constrained-decoding module. Every fallible call leaves its inputs (and any
/// matcher) unchanged when it returns one of these.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum GrammarError {
    /// The regex does not parse or uses a feature the byte DFA cannot express.
    #[error("invalid regex: {0}")]
    Regex(String),
    /// The grammar text (GBNF, ...) does not parse, or names an undefined rule.
    #[error("invalid grammar: {0}")]
    Grammar(String),
    /// The input uses features this compiler does not support (each listed).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A JSON Schema that cannot be compiled exactly (strict mode): the first keyword that
    /// cannot, and where.
    #[error("unsupported: {keyword} at {pointer}: {detail}")]
    Inexact {
        keyword: String,
        pointer: String,
        detail: String,
    },
    /// The automaton would exceed its configured size limit.
    #[error("grammar too large: {0}")]
    TooLarge(String),
    /// A token id outside `[0, vocab_size)`.
    #[error("token id {token} is out of range for a vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { token: i64, vocab_size: usize },
    /// Bad vocabulary input (duplicate EOS, ids out of range, malformed tokenizer file...).
    #[error("invalid vocabulary: {0}")]
    Vocab(String),
    /// Wrong buffer or array shape.
    #[error("shape error: {0}")]
    Shape(String),
    /// `rollback(n)` asked for more tokens than were accepted.
    #[error("cannot roll back {requested} tokens: only {available} accepted")]
    Rollback { requested: usize, available: usize },
    /// Two objects built over different vocabularies were combined.
    #[error("{0}")]
    Mismatch(String),
}
