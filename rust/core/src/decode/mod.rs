//! The decode loop's own bookkeeping, beside the pipeline's stages: [`budget`], the adaptive
//! budget's learnt statistics and the values it puts on draft trees' nodes (the Python layer
//! keeps the policy: cost model, trust region, probes).

pub mod budget;

pub use budget::{
    rank_band, Accepted, BudgetError, BudgetParams, BudgetStats, Choice, Pick, Tally, TreeView,
    BINS, BIN_EDGES, BIN_MID,
};
