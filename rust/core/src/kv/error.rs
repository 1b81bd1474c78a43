use thiserror::Error;

/// Everything a paged-KV operation can refuse. Every operation validates before it mutates,
/// so an error always leaves the manager exactly as it was.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KvError {
    #[error("unknown sequence {0}")]
    UnknownSequence(u64),
    #[error("sequence {0} was already freed")]
    AlreadyFreed(u64),
    #[error("sequence {0} already exists")]
    SequenceExists(u64),
    #[error("out of KV blocks: need {needed}, {free} free")]
    OutOfBlocks { needed: usize, free: usize },
    #[error("sequence {0} has tentative tree slots; commit or roll back first")]
    PendingStep(u64),
    #[error("sequence {seq}: node {node} was never reserved ({reserved} tentative slots)")]
    NotReserved {
        seq: u64,
        node: i64,
        reserved: usize,
    },
    #[error("sequence {0} has no tentative tree slots to commit")]
    NoStep(u64),
    #[error("{0}")]
    Invalid(String),
}
