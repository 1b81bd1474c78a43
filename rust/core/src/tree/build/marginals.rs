use super::check_token;
use crate::tree::TreeError;

/// Validated per-depth drafter marginals: `L` rows of `K` log-probs sorted descending,
/// with their token ids (range-checked too, except through `build_checked`, which checks
/// the ids its tree holds), both row-major.
#[derive(Debug, Clone, Copy)]
pub struct Marginals<'a> {
    logprobs: &'a [f32],
    token_ids: &'a [i64],
    depth: usize,
    width: usize,
    /// Columns the builder may read; only these are validated.
    used: usize,
}

impl<'a> Marginals<'a> {
    /// Validate `[depth, width]` arrays for an unconstrained build of `budget` drafted nodes:
    /// only the first min(budget, K) columns can enter the tree (Lemma 1), so only those are
    /// read and checked.
    pub fn new(
        logprobs: &'a [f32],
        token_ids: &'a [i64],
        depth: usize,
        width: usize,
        budget: i64,
    ) -> Result<Self, TreeError> {
        let used = budget_columns(width, budget)?;
        Self::with_columns(logprobs, token_ids, depth, width, used, true)
    }

    /// Validate every column: a constrained build may skip any number of disallowed
    /// top-ranked tokens, so all K candidates can be needed whatever the budget.
    pub fn all_columns(
        logprobs: &'a [f32],
        token_ids: &'a [i64],
        depth: usize,
        width: usize,
    ) -> Result<Self, TreeError> {
        Self::with_columns(logprobs, token_ids, depth, width, width, true)
    }

    /// Validate the first `used` columns; `check_ids: false` skips the token-id range scan,
    /// for `build_checked`, which checks the ids the tree actually holds after the build
    /// (the scan would read every `i64` id, most of the validation's memory traffic, for
    /// ids that mostly never enter the tree).
    pub(super) fn with_columns(
        logprobs: &'a [f32],
        token_ids: &'a [i64],
        depth: usize,
        width: usize,
        used: usize,
        check_ids: bool,
    ) -> Result<Self, TreeError> {
        if depth == 0 || width == 0 {
            return Err(TreeError::Shape(format!(
                "marginals must have L >= 1 depths and K >= 1 candidates, got [{depth}, {width}]"
            )));
        }
        // The builder indexes entries and nodes with u32.
        if depth
            .checked_mul(width)
            .is_none_or(|n| n > u32::MAX as usize)
        {
            return Err(TreeError::Shape(format!(
                "marginals [{depth}, {width}] have more than 2^32 entries"
            )));
        }
        if logprobs.len() != depth * width || token_ids.len() != depth * width {
            return Err(TreeError::Shape(format!(
                "logprobs ({} values) and token_ids ({} values) must both be [{depth}, {width}]",
                logprobs.len(),
                token_ids.len()
            )));
        }
        let bad = if check_ids {
            first_bad_row::<true>(logprobs, token_ids, width, used)
        } else {
            first_bad_row_no_ids(logprobs, token_ids, width, used)
        };
        if let Some(d) = bad {
            let (row, ids) = (
                &logprobs[d * width..d * width + used],
                &token_ids[d * width..d * width + used],
            );
            return Err(Self::first_error(row, ids, d));
        }
        Ok(Marginals {
            logprobs,
            token_ids,
            depth,
            width,
            used,
        })
    }

    fn first_error(row: &[f32], ids: &[i64], d: usize) -> TreeError {
        let mut prev = 0.0f32;
        for (r, (&v, &t)) in row.iter().zip(ids).enumerate() {
            if v.is_nan() {
                return TreeError::NaN { depth: d, rank: r };
            }
            if v > 0.0 {
                return TreeError::NotLogProb {
                    depth: d,
                    rank: r,
                    value: v,
                };
            }
            if r > 0 && v > prev {
                return TreeError::Unsorted {
                    depth: d,
                    rank: r,
                    prev,
                    next: v,
                };
            }
            prev = v;
            if let Err(e) = check_token(t, || format!("token_ids[{d}, {r}]")) {
                return e;
            }
        }
        TreeError::Shape(format!("invalid marginals in row {d}"))
    }

    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Candidates per depth the builder may use (validated columns).
    pub fn used_width(&self) -> usize {
        self.used
    }

    #[inline]
    pub fn logprob(&self, d: usize, r: usize) -> f32 {
        self.logprobs[d * self.width + r]
    }

    #[inline]
    pub fn token(&self, d: usize, r: usize) -> i64 {
        self.token_ids[d * self.width + r]
    }

    /// Row-major log-probs, token ids and the row stride, for the unchecked hot loop.
    #[inline]
    pub(super) fn raw(&self) -> (&'a [f32], &'a [i64], usize) {
        (self.logprobs, self.token_ids, self.width)
    }
}

/// Columns an unconstrained build of `budget` drafted nodes can use: min(budget, K).
pub(super) fn budget_columns(width: usize, budget: i64) -> Result<usize, TreeError> {
    if budget <= 0 {
        return Err(TreeError::Budget(budget));
    }
    Ok(width.min(budget as usize))
}

/// `first_bad_row` without the id scan (the per-build check), with 8-lane compares when
/// the CPU has AVX2 (the baseline x86-64 build has 4).
fn first_bad_row_no_ids(
    logprobs: &[f32],
    token_ids: &[i64],
    width: usize,
    used: usize,
) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { first_bad_row_avx2(logprobs, token_ids, width, used) };
    }
    first_bad_row::<false>(logprobs, token_ids, width, used)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn first_bad_row_avx2(
    logprobs: &[f32],
    token_ids: &[i64],
    width: usize,
    used: usize,
) -> Option<usize> {
    first_bad_row::<false>(logprobs, token_ids, width, used)
}

/// Index of the first row whose first `used` entries are not valid marginals: a log-prob
/// that is NaN, positive or above its predecessor, or (with `IDS`) a token id outside
/// [0, 2^31).
#[inline(always)]
fn first_bad_row<const IDS: bool>(
    logprobs: &[f32],
    token_ids: &[i64],
    width: usize,
    used: usize,
) -> Option<usize> {
    let rows = logprobs.len() / width;
    (0..rows).find(|&d| {
        let row = &logprobs[d * width..d * width + used];
        let ids = &token_ids[d * width..d * width + used];
        // Branch-free scans over integer flags (they vectorize); `first_error` rescans a bad
        // row to name the problem. `!(next <= prev)` catches both a NaN and an ascent, and
        // with `row[0] <= 0` (false for NaN) a non-ascending row is all <= 0.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        let not_logprob = u32::from(!(row[0] <= 0.0));
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        let unsorted = row[1..]
            .iter()
            .zip(row)
            .fold(0u32, |acc, (&next, &prev)| acc | u32::from(!(next <= prev)));
        // A token id is valid iff it has no bit at or above bit 31 (the sign included):
        // OR them all and test once.
        let bad_id = if IDS {
            ids.iter().fold(0u64, |acc, &t| acc | t as u64) >> 31
        } else {
            0
        };
        (not_logprob | unsorted) != 0 || bad_id != 0
    })
}
