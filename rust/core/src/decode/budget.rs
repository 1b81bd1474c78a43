//! What the adaptive budget learns from verified steps, and the expected acceptance it puts
//! on each node of a candidate tree from it (the Python `AdaptiveBudget` explains the
//! policy). Run once or twice per decode step right after a target forward has evicted the
//! caches: as numpy calls these took 0.45 ms a step on two cores (2% of a SmolLM2 step),
//! mostly cold-cache interpreter work, so they are one compact pass each here.
//!
//! * **Per-node calibration**: per depth class (depth 1, deeper) and bin of conditional
//!   probability, accepted over predicted among tried nodes (parent accepted); each class
//!   shrunk towards the other's ratio, itself shrunk towards `prior`.
//! * **Size calibration**: per source (a request's candidate) and rank band (ranks 1, 2,
//!   3-4, 5-8, ... of a best-first tree), accepted over predicted (per-node calibrated)
//!   values of observed nodes, each band shrunk towards the band before it, plus
//!   `band_optimism` standard errors.
//! * Observed nodes: the verified ones, or with [`Accepted::Path`] every node of every
//!   candidate the committed tokens decide.
//! * **Per-depth acceptance** for trees without probabilities (explicit branches).

use thiserror::Error;

/// Bins of conditional probability the calibration keeps apart.
pub const BINS: usize = 10;
/// Upper edges of the bins but the last (whose edge is +inf).
pub const BIN_EDGES: [f64; BINS - 1] = [0.02, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 0.95];
/// A typical probability of each bin: a ratio is capped at `1 / BIN_MID` (no node surer
/// than certain at the bin's typical probability).
pub const BIN_MID: [f64; BINS] = [
    0.01, 0.035, 0.075, 0.15, 0.25, 0.375, 0.525, 0.7, 0.875, 0.975,
];

/// Everything that can be wrong with the input of the budget's statistics.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum BudgetError {
    #[error("tree arrays differ in length or are shorter than num_real: {0}")]
    Shape(String),
    #[error("node {node}'s parent {parent} does not precede it")]
    Parent { node: usize, parent: i32 },
    #[error("node {node}'s depth {depth} is not its parent's depth + 1")]
    Depth { node: usize, depth: i32 },
    #[error("node {node}'s log-probability is NaN")]
    NaN { node: usize },
    #[error("accepted node {index} is not a drafted node of this tree (1..{num_real})")]
    Accepted { index: i64, num_real: usize },
    #[error("{0}")]
    Param(String),
}

/// The shrinkage settings (the Python `AdaptiveBudget`'s fields, passed with each call so
/// a changed setting takes effect at once).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetParams {
    /// Every calibration's value before any step.
    pub prior: f64,
    /// How many predicted tokens the prior (or the value shrunk towards) is worth.
    pub prior_weight: f64,
    /// Standard errors added to each rank band's factor.
    pub band_optimism: f64,
}

impl BudgetParams {
    pub fn check(&self) -> Result<(), BudgetError> {
        let ok = self.prior > 0.0
            && self.prior <= 2.0
            && self.prior_weight > 0.0
            && self.prior_weight.is_finite()
            && self.band_optimism >= 0.0
            && self.band_optimism.is_finite();
        if ok {
            Ok(())
        } else {
            Err(BudgetError::Param(format!(
                "budget settings out of range: prior {} (in (0, 2]), prior_weight {} (finite, \
                 > 0), band_optimism {} (finite, >= 0)",
                self.prior, self.prior_weight, self.band_optimism
            )))
        }
    }
}

/// A tree's first `num_real` nodes as the budget reads them (root first, parents before
/// children). `logprobs` is None for an unscored tree (explicit branches).
#[derive(Debug, Clone, Copy)]
pub struct TreeView<'a> {
    pub parents: &'a [i32],
    pub depths: &'a [i32],
    pub logprobs: Option<&'a [f64]>,
    pub num_real: usize,
}

impl TreeView<'_> {
    /// Checks what the passes below index by: lengths, parents before children, depths.
    pub fn check(&self) -> Result<(), BudgetError> {
        let n = self.num_real;
        let lp_len = self.logprobs.map_or(n, <[f64]>::len);
        if n == 0 || self.parents.len() < n || self.depths.len() < n || lp_len < n {
            return Err(BudgetError::Shape(format!(
                "num_real {n}, parents {}, depths {}, logprobs {lp_len}",
                self.parents.len(),
                self.depths.len()
            )));
        }
        for i in 1..n {
            let p = self.parents[i];
            if p < 0 || p as usize >= i {
                return Err(BudgetError::Parent { node: i, parent: p });
            }
            if self.depths[i] != self.depths[p as usize] + 1 || self.depths[0] != 0 {
                return Err(BudgetError::Depth {
                    node: i,
                    depth: self.depths[i],
                });
            }
            if self.logprobs.is_some_and(|lp| lp[i].is_nan()) {
                return Err(BudgetError::NaN { node: i });
            }
        }
        Ok(())
    }

    fn parent(&self, i: usize) -> usize {
        self.parents[i] as usize // checked: 0 <= parent < i
    }
}

/// What a verified step accepted of a tree: its accepted node indices (root excluded), or
/// only their count (taken as the likeliest path's first nodes), or the path the target's
/// rule took.
#[derive(Debug, Clone, Copy)]
pub enum Accepted<'a> {
    Nodes(&'a [i64]),
    Count(usize),
    /// The tokens the step committed (the accepted ones, then the bonus): the rule's
    /// choice at each depth along its path, with `tokens` the tree's node tokens. The walk
    /// accepts a child when its token is the rule's choice at its parent, so the path
    /// decides every node of the tree it was cut from, not just the nodes verified: a node
    /// is accepted when its tokens are the path's. Only nodes below the path's last token
    /// are open; each counts its expected acceptance given that token (its calibrated
    /// conditional probabilities from there). Learning from the whole drafted tree, not
    /// the cut, removes a selection: a size is otherwise measured only on the steps the
    /// budget already thought it paid at (over-confident suffix chains, mostly), so nodes
    /// of ranks 5-8 of the block drafter's trees on SmolLM2's code prompts were valued at
    /// half of what they accepted, and trees came out smaller than the best fixed size.
    Path {
        tokens: &'a [i64],
        path: &'a [i64],
    },
}

/// The rank band of a node rank (1-based position in a best-first tree): 1 -> 0, 2 -> 1,
/// 3-4 -> 2, 5-8 -> 3, ... (band k holds ranks 2^(k-1) + 1 ..= 2^k).
pub fn rank_band(rank: usize) -> usize {
    let r = rank.max(1) - 1;
    (usize::BITS - r.leading_zeros()) as usize
}

/// A node's log-probability given its parent (`-inf` below a node of probability 0: a
/// banned token's subtree is worth nothing, not NaN).
fn conditional(lp: &[f64], node: usize, parent: usize) -> f64 {
    if lp[parent] == f64::NEG_INFINITY {
        f64::NEG_INFINITY
    } else {
        lp[node] - lp[parent]
    }
}

fn bin_of(q: f64) -> usize {
    BIN_EDGES.partition_point(|&e| e <= q) // numpy's searchsorted(side="right")
}

/// How [`BudgetStats::choose`] ranks a request's candidate trees at each size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pick {
    /// By the drafters' own expected acceptance (the sum of the first `b` nodes' path
    /// probabilities, DDTree's surrogate); trees without probabilities by their values.
    /// The calibration is learnt from verified trees only: ranked by it, a source is
    /// verified only where the calibration already favours it.
    #[default]
    Drafted,
    /// By the calibrated values (the node values that also price the size).
    Calibrated,
}

/// Per choice, for every size `b` in `0..=most`: the expected acceptance summed over the
/// requests, each taking the candidate [`Pick`] ranks highest at that size (valued by its
/// calibrated node values).
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// `[most + 1]`: requests' summed expected accepted tokens at each size.
    pub gains: Vec<f64>,
    /// `[requests][most + 1]`, row-major: the candidate each request takes at each size
    /// (the first of ties).
    pub picks: Vec<usize>,
}

/// What one observed tree's decided nodes were worth as the budget priced them (their
/// values with the size calibration, [`BudgetStats::node_values`] as before the
/// observation) and what they realised (1 accepted, 0 not). A path decides the nodes
/// within its length and those below a rejected one; the rest are left out. A caller sums
/// these per request to see how far one request's text departs from what the statistics
/// say.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    pub predicted: f64,
    pub realised: f64,
}

/// The size calibration's sums for one source's trees (a request's candidate position: for
/// a combined drafter 0 the model's tree, 1 the suffix index's). Per source: the sources'
/// trees err differently by rank (suffix chains over-confident throughout, a model's
/// deeper ranks under-valued), and one factor per band for both priced the model's trees
/// with the suffix chains' failures. (The per-node calibration stays shared: its bins
/// already part the sources' probabilities, and kept per source as well, block + suffix
/// came out 3-4% slower in `bench_budget_replay.py`.)
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SourceStats {
    /// Per rank band: observed nodes' values (per-node calibrated) summed.
    pub band_predicted: Vec<f64>,
    /// Per rank band: observed nodes accepted (or expected to be, see [`Accepted::Path`]).
    pub band_realised: Vec<f64>,
}

impl SourceStats {
    /// Zero sums for `bands` rank bands (one tree's, before it is added).
    fn zeros(bands: usize) -> Self {
        SourceStats {
            band_predicted: vec![0.0; bands],
            band_realised: vec![0.0; bands],
        }
    }

    fn add(&mut self, other: &SourceStats) {
        for (mine, theirs) in [
            (&mut self.band_predicted, &other.band_predicted),
            (&mut self.band_realised, &other.band_realised),
        ] {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0.0);
            }
            mine.iter_mut().zip(theirs).for_each(|(m, t)| *m += t);
        }
    }
}

/// A source nothing was learnt from yet.
static UNSEEN: SourceStats = SourceStats {
    band_predicted: Vec::new(),
    band_realised: Vec::new(),
};

/// The learnt statistics (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BudgetStats {
    /// Per (depth class, bin): tried nodes' conditional probabilities summed.
    pub predicted: [[f64; BINS]; 2],
    /// Per (depth class, bin): tried nodes accepted.
    pub realised: [[f64; BINS]; 2],
    /// Per source: its size calibration's sums.
    pub sources: Vec<SourceStats>,
    /// Per depth (0-based): verified trees that reached it.
    pub tried: Vec<f64>,
    /// Per depth: steps that accepted that deep.
    pub reached: Vec<f64>,
}

impl BudgetStats {
    pub fn new() -> Self {
        Self::default()
    }

    /// What was learnt from `source`'s trees (nothing yet: all zero).
    pub fn source(&self, source: usize) -> &SourceStats {
        self.sources.get(source).unwrap_or(&UNSEEN)
    }

    /// Adds one tree's sums: `bins` (predicted, realised) to the per-node calibration's,
    /// `bands` to `source`'s.
    fn add(&mut self, source: usize, bins: &[[[f64; BINS]; 2]; 2], bands: &SourceStats) {
        for (mine, theirs) in [
            (&mut self.predicted, &bins[0]),
            (&mut self.realised, &bins[1]),
        ] {
            for (m, t) in mine.iter_mut().flatten().zip(theirs.iter().flatten()) {
                *m += t;
            }
        }
        if self.sources.len() <= source {
            self.sources.resize(source + 1, SourceStats::default());
        }
        self.sources[source].add(bands);
    }

    /// Per depth class and bin: accepted over predicted so far, shrunk towards the other
    /// class's ratio (worth `prior_weight` nodes), itself shrunk towards `prior`; clipped
    /// to `[0.02, 1 / BIN_MID]`.
    pub fn calibration(&self, p: &BudgetParams) -> [[f64; BINS]; 2] {
        let w = p.prior_weight;
        let mut out = [[0.0; BINS]; 2];
        for (c, row) in out.iter_mut().enumerate() {
            for (b, v) in row.iter_mut().enumerate() {
                let (po, ro) = (self.predicted[1 - c][b], self.realised[1 - c][b]);
                let other = (ro + w * p.prior) / (po + w);
                let ratio = (self.realised[c][b] + w * other) / (self.predicted[c][b] + w);
                *v = ratio.clamp(0.02, 1.0 / BIN_MID[b]);
            }
        }
        out
    }

    /// `[bands]`: per rank band of `source`'s trees, accepted over predicted values of the
    /// observed nodes, shrunk towards the band before (band 0 towards `prior`), plus
    /// `band_optimism` standard errors (accepted counts taken as Poisson); at least 0.02.
    pub fn band_factors(&self, p: &BudgetParams, source: usize, bands: usize) -> Vec<f64> {
        let w = p.prior_weight;
        let mut before = p.prior;
        let st = self.source(source);
        (0..bands)
            .map(|k| {
                let pr = st.band_predicted.get(k).copied().unwrap_or(0.0);
                let a = st.band_realised.get(k).copied().unwrap_or(0.0);
                before = (a + w * before) / (pr + w);
                (before + p.band_optimism * (before * pr).sqrt() / (pr + w)).max(0.02)
            })
            .collect()
    }

    /// Each drafted node's expected contribution to the acceptance length before the size
    /// calibration, in node order (`[num_real - 1]`, into `out`): for a scored tree its
    /// path probability with each step's conditional probability scaled by `cal` (capped
    /// so no step is surer than certain); for an unscored one the measured acceptance rate
    /// of its depth.
    pub fn path_values(
        &self,
        tree: &TreeView<'_>,
        cal: &[[f64; BINS]; 2],
        out: &mut Vec<f64>,
    ) -> Result<(), BudgetError> {
        tree.check()?;
        self.path_values_checked(tree, cal, out);
        Ok(())
    }

    fn path_values_checked(&self, tree: &TreeView<'_>, cal: &[[f64; BINS]; 2], out: &mut Vec<f64>) {
        let n = tree.num_real;
        out.clear();
        let Some(lp) = tree.logprobs else {
            out.extend((1..n).map(|i| self.depth_rate(tree.depths[i] as usize)));
            return;
        };
        // log_cal[class][bin], and each node's path sum of log ratios (parents come first).
        let mut log_cal = [[0.0; BINS]; 2];
        for (lc, c) in log_cal.iter_mut().zip(cal) {
            for (l, v) in lc.iter_mut().zip(c) {
                *l = v.ln();
            }
        }
        let mut sums = vec![0.0f64; n];
        for i in 1..n {
            let par = tree.parent(i);
            let cond = conditional(lp, i, par);
            let class = usize::from(tree.depths[i] > 1);
            let log_r = log_cal[class][bin_of(cond.exp())].min(-cond);
            sums[i] = sums[par] + log_r;
            out.push((lp[i] + sums[i]).exp());
        }
    }

    fn depth_rate(&self, depth: usize) -> f64 {
        let d = depth.max(1) - 1;
        match (self.tried.get(d), self.reached.get(d)) {
            (Some(t), Some(r)) => (r + 0.5) / (t + 1.0),
            _ => 0.5f64.powi(depth as i32),
        }
    }

    /// [`Self::path_values`] times the size calibration (each node's rank band factor),
    /// at most its parent's and 1 (a scored tree; an unscored one's values are its depth
    /// rates).
    pub fn node_values(
        &self,
        p: &BudgetParams,
        tree: &TreeView<'_>,
        source: usize,
        cal: &[[f64; BINS]; 2],
        out: &mut Vec<f64>,
    ) -> Result<(), BudgetError> {
        tree.check()?;
        self.node_values_checked(p, tree, source, cal, out);
        Ok(())
    }

    fn node_values_checked(
        &self,
        p: &BudgetParams,
        tree: &TreeView<'_>,
        source: usize,
        cal: &[[f64; BINS]; 2],
        out: &mut Vec<f64>,
    ) {
        self.path_values_checked(tree, cal, out);
        if tree.logprobs.is_some() {
            self.size_values(p, tree, source, out);
        }
    }

    /// Path values (in node order) into node values: each times its rank band's factor, at
    /// most its parent's and 1.
    fn size_values(&self, p: &BudgetParams, tree: &TreeView<'_>, source: usize, out: &mut [f64]) {
        if out.is_empty() {
            return;
        }
        let factors = self.band_factors(p, source, rank_band(out.len()) + 1);
        for r in 0..out.len() {
            // At most its parent's: a node is accepted only after its parent (band factors
            // above 1, learnt on repeats whose deep tokens all held, had priced a new
            // text's 6-node chain at 4.4 tokens where its first node was worth 0.5).
            let par = tree.parent(r + 1);
            let cap = if par == 0 { 1.0 } else { out[par - 1] };
            out[r] = (out[r] * factors[rank_band(r + 1)]).min(cap);
        }
    }

    /// Per request (`candidates[r]`: its candidate trees) and size `b` in `0..=most`: the
    /// candidate `pick` ranks highest on its first `b` nodes (the first of ties), and the
    /// requests' summed values of the picked candidates. `scales[r][j]`, when given, scales
    /// the values of request `r`'s candidate `j` (each at most 1 after): what one request's
    /// own steps say of its sources, beside the statistics all requests share.
    pub fn choose(
        &self,
        p: &BudgetParams,
        candidates: &[Vec<TreeView<'_>>],
        most: usize,
        pick: Pick,
        scales: Option<&[Vec<f64>]>,
    ) -> Result<Choice, BudgetError> {
        for tree in candidates.iter().flatten() {
            tree.check()?;
        }
        if let Some(sc) = scales {
            let shape_ok = sc.len() == candidates.len()
                && sc.iter().zip(candidates).all(|(s, c)| s.len() == c.len());
            if !shape_ok {
                return Err(BudgetError::Shape(
                    "scales must hold one value per candidate tree of each request".into(),
                ));
            }
            if let Some(bad) = sc.iter().flatten().find(|x| !(x.is_finite() && **x >= 0.0)) {
                return Err(BudgetError::Shape(format!(
                    "scales must be finite and >= 0, got {bad}"
                )));
            }
        }
        let cal = self.calibration(p);
        let mut gains = vec![0.0; most + 1];
        let mut picks = vec![0usize; candidates.len() * (most + 1)];
        let mut best = vec![0.0f64; most + 1];
        let mut best_rank = vec![0.0f64; most + 1];
        let mut values = Vec::new();
        for (r, trees) in candidates.iter().enumerate() {
            let row = &mut picks[r * (most + 1)..(r + 1) * (most + 1)];
            best_rank.fill(f64::NEG_INFINITY);
            for (j, tree) in trees.iter().enumerate() {
                self.node_values_checked(p, tree, j, &cal, &mut values);
                if let Some(sc) = scales {
                    let f = sc[r][j];
                    values.iter_mut().for_each(|v| *v = (*v * f).min(1.0));
                }
                let drafted = tree.logprobs.filter(|_| pick == Pick::Drafted);
                let (mut cum, mut rank) = (0.0, 0.0);
                for b in 0..=most {
                    if b > 0 {
                        let v = values.get(b - 1).copied().unwrap_or(0.0);
                        cum += v;
                        rank += match drafted {
                            Some(lp) if b < tree.num_real => lp[b].exp(),
                            Some(_) => 0.0,
                            None => v,
                        };
                    }
                    if rank > best_rank[b] {
                        (best_rank[b], best[b], row[b]) = (rank, cum, j);
                    }
                }
            }
            if !trees.is_empty() {
                for (g, v) in gains.iter_mut().zip(&best) {
                    *g += v;
                }
            }
        }
        Ok(Choice { gains, picks })
    }

    /// Learn from one verified tree: what it accepted, its values as predicted before this
    /// update. A node was tried when its parent was accepted (or is the root); every node
    /// verified counts towards its rank band; per depth, whether the step reached it.
    pub fn observe(
        &mut self,
        p: &BudgetParams,
        tree: &TreeView<'_>,
        source: usize,
        accepted: Accepted<'_>,
    ) -> Result<Tally, BudgetError> {
        tree.check()?;
        let n = tree.num_real;
        let count = match accepted {
            Accepted::Nodes(idx) => {
                if let Some(&bad) = idx.iter().find(|&&i| i < 1 || i as usize >= n) {
                    return Err(BudgetError::Accepted {
                        index: bad,
                        num_real: n,
                    });
                }
                idx.len()
            }
            Accepted::Count(c) => c,
            Accepted::Path { tokens, path } => {
                if tokens.len() < n {
                    return Err(BudgetError::Shape(format!(
                        "num_real {n}, tokens {}",
                        tokens.len()
                    )));
                }
                return Ok(self.observe_path(p, tree, source, tokens, path));
            }
        };
        if n <= 1 {
            return Ok(Tally::default());
        }
        let mut tally = Tally::default();
        if let Some(lp) = tree.logprobs {
            let cal = self.calibration(p);
            let mut values = Vec::with_capacity(n - 1);
            self.path_values_checked(tree, &cal, &mut values);
            let mut sized = values.clone();
            self.size_values(p, tree, source, &mut sized);
            let mut hit = vec![false; n];
            hit[0] = true;
            match accepted {
                Accepted::Nodes(idx) => idx.iter().for_each(|&i| hit[i as usize] = true),
                _ => {
                    // The likeliest child, depth by depth (the first of ties).
                    let mut node = 0;
                    for _ in 0..count {
                        let mut next: Option<usize> = None;
                        for i in node + 1..n {
                            if tree.parent(i) == node && next.is_none_or(|b| lp[i] > lp[b]) {
                                next = Some(i);
                            }
                        }
                        let Some(i) = next else { break };
                        hit[i] = true;
                        node = i;
                    }
                }
            }
            let mut bins = [[[0.0; BINS]; 2]; 2];
            let mut d = SourceStats::zeros(rank_band(n - 1) + 1);
            for i in 1..n {
                let got = f64::from(u8::from(hit[i]));
                let par = tree.parent(i);
                if hit[par] {
                    let q = conditional(lp, i, par).exp();
                    let (class, bin) = (usize::from(tree.depths[i] > 1), bin_of(q));
                    bins[0][class][bin] += q;
                    bins[1][class][bin] += got;
                }
                d.band_predicted[rank_band(i)] += values[i - 1];
                d.band_realised[rank_band(i)] += got;
                tally.predicted += sized[i - 1];
                tally.realised += got;
            }
            self.add(source, &bins, &d);
        }
        let max_d = tree.depths[1..n].iter().copied().max().unwrap_or(0).max(0) as usize;
        self.count_depths(max_d, count);
        Ok(tally)
    }

    /// [`Self::observe`] of [`Accepted::Path`] (`tokens` checked to cover the tree).
    fn observe_path(
        &mut self,
        p: &BudgetParams,
        tree: &TreeView<'_>,
        source: usize,
        tokens: &[i64],
        path: &[i64],
    ) -> Tally {
        let n = tree.num_real;
        let mut tally = Tally::default();
        if n <= 1 {
            return tally;
        }
        let depth = |i: usize| tree.depths[i] as usize; // >= 1 for a drafted node (checked)
        let known = |i: usize| depth(i) <= path.len();
        let on_path = |i: usize| path.get(depth(i) - 1) == Some(&tokens[i]);
        // Per node: 1 accepted, 0 rejected, or below the path's end, its expected
        // acceptance given the last decided ancestor (calibrated conditionals multiplied).
        let mut hit = vec![0.0f64; n];
        hit[0] = 1.0;
        // Per node: whether the path decides it (within its length, or below a rejected
        // ancestor: then it is rejected too).
        let mut decided = vec![true; n];
        // Per depth the path decides: whether the tree reached it and the path held there.
        let (mut deepest, mut max_d) = (0usize, 0usize);
        let scored = tree.logprobs.map(|lp| {
            let cal = self.calibration(p);
            let mut values = Vec::with_capacity(n - 1);
            self.path_values_checked(tree, &cal, &mut values);
            let mut sized = values.clone();
            self.size_values(p, tree, source, &mut sized);
            (lp, cal, values, sized)
        });
        let mut bins = [[[0.0; BINS]; 2]; 2];
        let mut delta = SourceStats::zeros(rank_band(n - 1) + 1);
        for i in 1..n {
            let par = tree.parent(i);
            let class = usize::from(depth(i) > 1);
            if known(i) {
                max_d = max_d.max(depth(i));
                // Decided: its parent accepted (then it was tried) or not (then neither).
                if hit[par] == 1.0 {
                    hit[i] = f64::from(u8::from(on_path(i)));
                    if hit[i] == 1.0 {
                        deepest = deepest.max(depth(i));
                    }
                    if let Some((lp, _, _, _)) = &scored {
                        let q = conditional(lp, i, par).exp();
                        bins[0][class][bin_of(q)] += q;
                        bins[1][class][bin_of(q)] += hit[i];
                    }
                }
            } else if let Some((lp, cal, _, _)) = &scored {
                // Below the path's end: what the calibration expects given its parent.
                let cond = conditional(lp, i, par);
                let log_r = cal[class][bin_of(cond.exp())].ln().min(-cond);
                hit[i] = hit[par] * (cond + log_r).exp();
            }
            if let Some((_, _, values, sized)) = &scored {
                delta.band_predicted[rank_band(i)] += values[i - 1];
                delta.band_realised[rank_band(i)] += hit[i];
                decided[i] = known(i) || (decided[par] && hit[par] == 0.0);
                if decided[i] {
                    tally.predicted += sized[i - 1];
                    tally.realised += hit[i];
                }
            }
        }
        if scored.is_some() {
            self.add(source, &bins, &delta);
        }
        self.count_depths(max_d, deepest);
        tally
    }

    /// One tree's per-depth counts: depths `1..=drafted` tried, `1..=reached` reached.
    fn count_depths(&mut self, drafted: usize, reached: usize) {
        if self.tried.len() < drafted {
            self.tried.resize(drafted, 0.0);
            self.reached.resize(drafted, 0.0);
        }
        for d in 0..drafted {
            self.tried[d] += 1.0;
            self.reached[d] += f64::from(u8::from(reached > d));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_bands_double() {
        let got: Vec<usize> = (1..=9).map(rank_band).collect();
        assert_eq!(got, [0, 1, 2, 2, 3, 3, 3, 3, 4]);
    }

    #[test]
    fn bins_match_searchsorted_right() {
        assert_eq!(bin_of(0.0), 0);
        assert_eq!(bin_of(0.02), 1); // an edge goes to the bin above
        assert_eq!(bin_of(0.5), 6);
        assert_eq!(bin_of(1.0), 9);
    }
}
