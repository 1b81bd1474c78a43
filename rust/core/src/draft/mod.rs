//! Drafters that need no training and run in Rust: [`SuffixIndex`], a suffix index over a
//! request's own tokens that proposes a scored draft tree of likely continuations, pooled
//! with a [`SuffixCorpus`] of earlier outputs shared across requests (one partition per
//! cache salt, bounded, least recently used sequences evicted first).

mod corpus;
mod suffix;

pub use corpus::{CorpusPart, SuffixCorpus};
pub use suffix::{CorpusId, MatchLimits, Proposal, SuffixIndex};

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
    #[error("no corpus sequence with id {0} (never added, removed, or evicted past the bound)")]
    UnknownCorpus(u64),
    #[error("a corpus sequence of {len} tokens cannot fit a corpus bound of {max} tokens")]
    CorpusTooLong { len: usize, max: usize },
    #[error(
        "the corpus matches suffixes of up to {corpus} tokens, the index {index}: they must agree"
    )]
    MaxMatchMismatch { index: usize, corpus: usize },
    #[error("propose needs a context of at least one token (its last token is the root)")]
    EmptyContext,
    #[error("min_match must be >= 1, got {0}")]
    MinMatch(usize),
    #[error("depth_factor must be finite and > 0, got {0}")]
    DepthFactor(f64),
}
