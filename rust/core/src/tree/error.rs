use thiserror::Error;

/// Everything that can be wrong with the input of a tree operation.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum TreeError {
    #[error("{0}")]
    Shape(String),
    #[error("budget must be >= 1, got {0}")]
    Budget(i64),
    #[error("logprobs[{depth}, {rank}] is NaN")]
    NaN { depth: usize, rank: usize },
    #[error("logprobs[{depth}, {rank}] = {value} is not a log-probability (must be <= 0, +inf is not allowed)")]
    NotLogProb {
        depth: usize,
        rank: usize,
        value: f32,
    },
    #[error(
        "logprobs row {depth} is not sorted in descending order at rank {rank} ({prev} < {next})"
    )]
    Unsorted {
        depth: usize,
        rank: usize,
        prev: f32,
        next: f32,
    },
    /// Two columns of one row the build may read hold the same token id.
    #[error(
        "token_ids[{depth}, {rank}] = {token} repeats token_ids[{depth}, {first_rank}]: the \
         candidates of one depth must be distinct tokens"
    )]
    DuplicateToken {
        depth: usize,
        rank: usize,
        first_rank: usize,
        token: i64,
    },
    #[error("token id {token} at {location} is outside [0, 2^31)")]
    TokenOutOfRange { token: i64, location: String },
    #[error("{0}")]
    InvalidTree(String),
    #[error("tree has {drafted} drafted nodes, more than the padding budget {budget}")]
    PadTooSmall { drafted: usize, budget: usize },
    /// A tree (or an array derived from it) too large to index or to allocate.
    #[error("{0}")]
    TooLarge(String),
}
