//! Drafters that need no training and run in Rust: [`SuffixIndex`], a suffix index over
//! token sequences (the request's own tokens and a corpus of earlier outputs) that proposes
//! a scored draft tree of likely continuations.

mod suffix;

pub use suffix::{CorpusId, SuffixIndex};

use thiserror::Error;

use crate::tree::TreeError;

/// Everything that can be wrong with the input of a drafter.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum DraftError {
    /// Input a tree builder would refuse too (a budget of 0, token ids outside [0, 2^31)).
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error("max_match must be >= 1, got {0}")]
    MaxMatch(usize),
    #[error("min_prob must be in [0, 1], got {0}")]
    MinProb(f64),
    #[error("no corpus sequence with id {0} (never added, or already removed)")]
    UnknownCorpus(u64),
    #[error("propose needs a context of at least one token (its last token is the root)")]
    EmptyContext,
}
