//! Property tests of the adaptive budget's statistics against brute force: path values by
//! walking each node's path, choices by trying every candidate at every size, and what
//! `observe` adds by counting.

use proptest::prelude::*;
use specdec_core::decode::{
    rank_band, Accepted, BudgetError, BudgetParams, BudgetStats, Pick, Tally, TreeView, BINS,
    BIN_EDGES, BIN_MID,
};

/// A tree: parents before children, depths derived, each node's conditional probability
/// in (0, 1] (some 0: a banned token, log-prob -inf).
#[derive(Debug, Clone)]
struct Tree {
    parents: Vec<i32>,
    depths: Vec<i32>,
    logprobs: Vec<f64>,
}

impl Tree {
    fn view(&self, scored: bool) -> TreeView<'_> {
        TreeView {
            parents: &self.parents,
            depths: &self.depths,
            logprobs: scored.then_some(&self.logprobs[..]),
            num_real: self.parents.len(),
        }
    }
}

fn tree() -> impl Strategy<Value = Tree> {
    let q = prop_oneof![Just(0.0f64), Just(1.0f64), Just(0.02f64), 0.001f64..1.0];
    proptest::collection::vec((any::<u32>(), q), 0..40).prop_map(|links| {
        let mut t = Tree {
            parents: vec![-1],
            depths: vec![0],
            logprobs: vec![0.0],
        };
        for (i, (link, q)) in links.into_iter().enumerate() {
            let p = link as usize % (i + 1);
            t.parents.push(p as i32);
            t.depths.push(t.depths[p] + 1);
            t.logprobs.push(t.logprobs[p] + q.ln());
        }
        t
    })
}

/// The settings of the example tests below.
fn fixed_params() -> BudgetParams {
    BudgetParams {
        prior: 1.0,
        prior_weight: 2.0,
        band_optimism: 1.0,
    }
}

fn params() -> impl Strategy<Value = BudgetParams> {
    (0.1f64..=2.0, 0.5f64..5.0, 0.0f64..3.0).prop_map(|(prior, prior_weight, band_optimism)| {
        BudgetParams {
            prior,
            prior_weight,
            band_optimism,
        }
    })
}

/// Statistics after observing `steps` (tree, accepted count) pairs, as sources 0 and 1
/// by the count's parity.
fn learnt(p: &BudgetParams, steps: &[(Tree, usize)]) -> BudgetStats {
    let mut s = BudgetStats::new();
    for (t, c) in steps {
        s.observe(p, &t.view(true), c % 2, Accepted::Count(*c))
            .unwrap();
    }
    s
}

/// A source's band sums: predicted, realised (empty if never observed).
fn bands(s: &BudgetStats, source: usize) -> (Vec<f64>, Vec<f64>) {
    let st = s.source(source);
    (st.band_predicted.clone(), st.band_realised.clone())
}

/// Node `i`'s probability given its parent (0 below a node of probability 0).
fn cond(t: &Tree, i: usize) -> f64 {
    let par = t.parents[i] as usize;
    if t.logprobs[par] == f64::NEG_INFINITY {
        0.0
    } else {
        (t.logprobs[i] - t.logprobs[par]).exp()
    }
}

fn bin(q: f64) -> usize {
    BIN_EDGES.iter().filter(|&&e| e <= q).count()
}

proptest! {
    #[test]
    fn path_values_follow_each_path(
        t in tree(), p in params(), steps in proptest::collection::vec((tree(), 0usize..6), 0..6)
    ) {
        let stats = learnt(&p, &steps);
        let cal = stats.calibration(&p);
        let mut got = Vec::new();
        stats.path_values(&t.view(true), &cal, &mut got).unwrap();
        prop_assert_eq!(got.len(), t.parents.len() - 1);
        for i in 1..t.parents.len() {
            // Walk to the root: each step's conditional times its calibration, at most 1.
            let (mut want, mut node) = (1.0f64, i);
            while node > 0 {
                let par = t.parents[node] as usize;
                let q = cond(&t, node);
                let class = usize::from(t.depths[node] > 1);
                want *= (q * cal[class][bin(q)]).min(1.0);
                node = par;
            }
            prop_assert!((got[i - 1] - want).abs() <= 1e-9 * want.max(1e-300), "node {}: {} vs {}", i, got[i - 1], want);
            // Never more than certain, never more than the parent's value.
            prop_assert!((0.0..=1.0 + 1e-12).contains(&got[i - 1]));
            let par = t.parents[i] as usize;
            if par > 0 {
                prop_assert!(got[i - 1] <= got[par - 1] * (1.0 + 1e-12));
            }
        }
    }

    #[test]
    fn choose_takes_each_sizes_best_candidate(
        reqs in proptest::collection::vec(
            proptest::collection::vec((tree(), any::<bool>()), 1..4), 1..4
        ),
        p in params(),
        most in 0usize..50,
        steps in proptest::collection::vec((tree(), 0usize..6), 0..6),
        calibrated in any::<bool>(),
        scaled in proptest::option::of(proptest::collection::vec(0.0f64..3.0, 12)),
    ) {
        let stats = learnt(&p, &steps);
        let views: Vec<Vec<TreeView<'_>>> =
            reqs.iter().map(|ts| ts.iter().map(|(t, s)| t.view(*s)).collect()).collect();
        let pick = if calibrated { Pick::Calibrated } else { Pick::Drafted };
        // Per request and candidate, a factor on its values (None: 1).
        let scales: Option<Vec<Vec<f64>>> = scaled.as_ref().map(|f| {
            reqs.iter().enumerate().map(|(r, ts)| (0..ts.len()).map(|j| f[3 * r + j]).collect()).collect()
        });
        let choice = stats.choose(&p, &views, most, pick, scales.as_deref()).unwrap();
        let mut values = Vec::new();
        for b in 0..=most {
            let mut total = 0.0;
            for (r, ts) in views.iter().enumerate() {
                // Per candidate: its value on its first b nodes, and its rank (the drafter's
                // path probabilities summed, or with Calibrated or no probabilities, the value).
                let (sums, ranks): (Vec<f64>, Vec<f64>) = ts.iter().enumerate().map(|(j, t)| {
                    // Candidate j is valued with source j's size calibration.
                    let cal = stats.calibration(&p);
                    stats.node_values(&p, t, j, &cal, &mut values).unwrap();
                    let f = scales.as_ref().map_or(1.0, |s| s[r][j]);
                    let value: f64 = values.iter().take(b).map(|v| (v * f).min(1.0)).sum();
                    let rank = match t.logprobs {
                        Some(lp) if !calibrated => lp.iter().skip(1).take(b).map(|l| l.exp()).sum(),
                        _ => value,
                    };
                    (value, rank)
                }).unzip();
                let best = ranks.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let pick = choice.picks[r * (most + 1) + b];
                // The pick is a best-ranked candidate, and the first of them (up to rounding).
                prop_assert!(ranks[pick] >= best - 1e-9);
                prop_assert!(ranks[..pick].iter().all(|&s| s < best + 1e-9));
                total += sums[pick];
            }
            prop_assert!((choice.gains[b] - total).abs() <= 1e-9 * (1.0 + total));
        }
    }

    #[test]
    fn band_factors_are_shrunk_ratios(
        p in params(), steps in proptest::collection::vec((tree(), 0usize..6), 0..8), source in 0usize..3
    ) {
        let stats = learnt(&p, &steps);
        let f = stats.band_factors(&p, source, 8);
        let w = p.prior_weight;
        let mut before = p.prior;
        let (pred, real) = bands(&stats, source);
        for (k, fk) in f.iter().enumerate() {
            let pr = pred.get(k).copied().unwrap_or(0.0);
            let a = real.get(k).copied().unwrap_or(0.0);
            before = (a + w * before) / (pr + w);
            prop_assert!(*fk >= before.max(0.02) - 1e-12);
            if p.band_optimism == 0.0 || pr == 0.0 {
                prop_assert!((fk - before.max(0.02)).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn observe_counts_tried_and_accepted_nodes(
        t in tree(), p in params(), count in 0usize..8,
        steps in proptest::collection::vec((tree(), 0usize..6), 0..4),
    ) {
        let before = learnt(&p, &steps);
        let mut after = before.clone();
        after.observe(&p, &t.view(true), 1, Accepted::Count(count)).unwrap();
        let n = t.parents.len();
        // The accepted path: the likeliest child, depth by depth (first of ties).
        let mut hit = vec![false; n];
        hit[0] = true;
        let mut node = 0;
        for _ in 0..count {
            let kids: Vec<usize> = (1..n).filter(|&i| t.parents[i] as usize == node).collect();
            let Some(&first) = kids.first() else { break };
            let best = kids.iter().copied().fold(first, |b, i| if t.logprobs[i] > t.logprobs[b] { i } else { b });
            hit[best] = true;
            node = best;
        }
        let accepted = hit.iter().skip(1).filter(|&&h| h).count() as f64;
        let sum = |a: &[[f64; BINS]; 2]| a.iter().flatten().sum::<f64>();
        let tried_q: f64 = (1..n)
            .filter(|&i| hit[t.parents[i] as usize])
            .map(|i| cond(&t, i))
            .sum();
        if n > 1 {
            prop_assert!((sum(&after.predicted) - sum(&before.predicted) - tried_q).abs() < 1e-9);
            prop_assert!((sum(&after.realised) - sum(&before.realised) - accepted).abs() < 1e-9);
            // Source 1's bands take it all; source 0's are untouched.
            let (a1, b1) = (after.source(1), before.source(1));
            let br: f64 = a1.band_realised.iter().sum::<f64>() - b1.band_realised.iter().sum::<f64>();
            prop_assert!((br - accepted).abs() < 1e-9);
            prop_assert!(a1.band_predicted.len() > rank_band(n - 1));
            prop_assert_eq!(after.source(0), before.source(0));
            // Depth statistics: every depth up to the tree's deepest was tried once.
            let deepest = *t.depths.iter().max().unwrap() as usize;
            for d in 0..deepest {
                prop_assert_eq!(after.tried[d] - before.tried.get(d).copied().unwrap_or(0.0), 1.0);
            }
        } else {
            prop_assert_eq!(&after, &before);
        }
    }

    #[test]
    fn observe_by_nodes_equals_observe_by_count(t in tree(), p in params(), count in 0usize..8) {
        // The count's path as node indices: the same update.
        let n = t.parents.len();
        let mut path = Vec::new();
        let mut node = 0usize;
        for _ in 0..count {
            let kids: Vec<usize> = (1..n).filter(|&i| t.parents[i] as usize == node).collect();
            let Some(&first) = kids.first() else { break };
            node = kids.iter().copied().fold(first, |b, i| if t.logprobs[i] > t.logprobs[b] { i } else { b });
            path.push(node as i64);
        }
        let (mut a, mut b) = (BudgetStats::new(), BudgetStats::new());
        a.observe(&p, &t.view(true), 0, Accepted::Count(path.len())).unwrap();
        b.observe(&p, &t.view(true), 0, Accepted::Nodes(&path)).unwrap();
        prop_assert_eq!(a, b);
    }
}

/// Node tokens with distinct siblings (a draft tree's children of one node are distinct
/// tokens): each node's index among its parent's children.
fn sibling_tokens(t: &Tree) -> Vec<i64> {
    let mut next = vec![0i64; t.parents.len()];
    let mut tokens = vec![0i64];
    for &par in &t.parents[1..] {
        tokens.push(next[par as usize]);
        next[par as usize] += 1;
    }
    tokens
}

/// The nodes whose tokens from the root are the path's first tokens (brute force).
fn on_path(t: &Tree, tokens: &[i64], path: &[i64]) -> Vec<bool> {
    (0..t.parents.len())
        .map(|i| {
            let mut node = i;
            while node > 0 {
                let d = t.depths[node] as usize;
                if path.get(d - 1) != Some(&tokens[node]) {
                    return false;
                }
                node = t.parents[node] as usize;
            }
            true
        })
        .collect()
}

proptest! {
    #[test]
    fn observe_by_path_equals_observe_by_nodes_where_the_path_decides_every_node(
        t in tree(), p in params(), picks in proptest::collection::vec(0i64..3, 0..48),
        steps in proptest::collection::vec((tree(), 0usize..6), 0..4)
    ) {
        let tokens = sibling_tokens(&t);
        let max_d = t.depths.iter().copied().max().unwrap_or(0) as usize;
        let path: Vec<i64> = (0..=max_d).map(|d| picks.get(d).copied().unwrap_or(0)).collect();
        let hit = on_path(&t, &tokens, &path);
        let nodes: Vec<i64> = (1..t.parents.len()).filter(|&i| hit[i]).map(|i| i as i64).collect();
        let (mut a, mut b) = (learnt(&p, &steps), learnt(&p, &steps));
        a.observe(&p, &t.view(true), 0, Accepted::Path { tokens: &tokens, path: &path }).unwrap();
        b.observe(&p, &t.view(true), 0, Accepted::Nodes(&nodes)).unwrap();
        prop_assert_eq!(&a, &b);
        // Unscored: the same per-depth counts.
        let (mut a, mut b) = (BudgetStats::new(), BudgetStats::new());
        a.observe(&p, &t.view(false), 0, Accepted::Path { tokens: &tokens, path: &path }).unwrap();
        b.observe(&p, &t.view(false), 0, Accepted::Nodes(&nodes)).unwrap();
        prop_assert_eq!(a, b);
    }

    #[test]
    fn observe_by_path_counts_nodes_below_its_end_at_their_calibrated_expectation(
        t in tree(), p in params(), picks in proptest::collection::vec(0i64..3, 0..6),
        steps in proptest::collection::vec((tree(), 0usize..6), 0..4)
    ) {
        let tokens = sibling_tokens(&t);
        let before = learnt(&p, &steps);
        let cal = before.calibration(&p);
        let mut after = before.clone();
        after.observe(&p, &t.view(true), 0, Accepted::Path { tokens: &tokens, path: &picks }).unwrap();
        let hit = on_path(&t, &tokens, &picks);
        let n = t.parents.len();
        // Brute force per node: decided (depth within the path) -> 1 or 0; below the
        // path's end -> the product of calibrated conditionals up to the last decided
        // ancestor, times whether that one was accepted.
        let (was, now) = (bands(&before, 0).1, bands(&after, 0).1);
        let mut realised = vec![0.0f64; was.len().max(rank_band(n.max(2) - 1) + 1)];
        let (mut tried_q, mut tried_hits) = (0.0f64, 0.0f64);
        for i in 1..n {
            let mut e = 1.0;
            let mut node = i;
            while t.depths[node] as usize > picks.len() {
                let q = cond(&t, node);
                let class = usize::from(t.depths[node] > 1);
                e *= (q * cal[class][bin(q)]).min(1.0);
                node = t.parents[node] as usize;
            }
            e *= f64::from(u8::from(hit[node]));
            realised[rank_band(i)] += e;
            let par = t.parents[i] as usize;
            if t.depths[i] as usize <= picks.len() && hit[par] {
                tried_q += cond(&t, i);
                tried_hits += f64::from(u8::from(hit[i]));
            }
        }
        for (k, want) in realised.iter().enumerate() {
            let got = now.get(k).copied().unwrap_or(0.0) - was.get(k).copied().unwrap_or(0.0);
            prop_assert!((got - want).abs() <= 1e-9 * want.max(1.0), "band {}: {} vs {}", k, got, want);
        }
        let sum = |m: &[[f64; BINS]; 2]| m.iter().flatten().sum::<f64>();
        let dq = sum(&after.predicted) - sum(&before.predicted);
        let dh = sum(&after.realised) - sum(&before.realised);
        prop_assert!((dq - tried_q).abs() <= 1e-9 * tried_q.max(1.0));
        prop_assert!((dh - tried_hits).abs() <= 1e-9);
    }

    #[test]
    fn a_tally_is_the_decided_nodes_priced_values_and_their_hits(
        t in tree(), p in params(), picks in proptest::collection::vec(0i64..3, 0..6),
        steps in proptest::collection::vec((tree(), 0usize..6), 0..4), source in 0usize..2
    ) {
        // Brute force: the node values the budget priced before the step, summed over the
        // nodes the path decides (within its length, or with an ancestor there that it
        // rejected), against how many of those it accepted.
        let tokens = sibling_tokens(&t);
        let before = learnt(&p, &steps);
        let mut values = Vec::new();
        before.node_values(&p, &t.view(true), source, &before.calibration(&p), &mut values).unwrap();
        let hit = on_path(&t, &tokens, &picks);
        let within = |i: usize| t.depths[i] as usize <= picks.len();
        let (mut want_p, mut want_r) = (0.0f64, 0.0f64);
        for i in 1..t.parents.len() {
            let mut a = i;
            let mut rejected_above = false;
            while a != 0 {
                a = t.parents[a] as usize;
                rejected_above |= a != 0 && within(a) && !hit[a];
            }
            if within(i) || rejected_above {
                want_p += values[i - 1];
                want_r += f64::from(u8::from(within(i) && hit[i]));
            }
        }
        let mut after = before.clone();
        let got = after
            .observe(&p, &t.view(true), source, Accepted::Path { tokens: &tokens, path: &picks })
            .unwrap();
        prop_assert!((got.predicted - want_p).abs() <= 1e-9 * want_p.max(1.0));
        prop_assert_eq!(got.realised, want_r);
        // Every node decided (a path as deep as the tree): the same as by accepted nodes.
        let max_d = t.depths.iter().copied().max().unwrap_or(0) as usize;
        let full: Vec<i64> = (0..=max_d).map(|d| picks.get(d).copied().unwrap_or(0)).collect();
        let hit = on_path(&t, &tokens, &full);
        let nodes: Vec<i64> = (1..t.parents.len()).filter(|&i| hit[i]).map(|i| i as i64).collect();
        let by_path = before.clone()
            .observe(&p, &t.view(true), source, Accepted::Path { tokens: &tokens, path: &full })
            .unwrap();
        let by_nodes = before.clone()
            .observe(&p, &t.view(true), source, Accepted::Nodes(&nodes))
            .unwrap();
        prop_assert!((by_path.predicted - by_nodes.predicted).abs() <= 1e-9 * by_path.predicted.max(1.0));
        prop_assert_eq!(by_path.realised, by_nodes.realised);
        // An unscored tree has no values to price.
        let none = before.clone()
            .observe(&p, &t.view(false), source, Accepted::Path { tokens: &tokens, path: &picks })
            .unwrap();
        prop_assert_eq!(none, Tally::default());
    }
}

#[test]
fn observe_by_path_needs_a_token_per_node() {
    let p = fixed_params();
    let t = Tree {
        parents: vec![-1, 0, 1],
        depths: vec![0, 1, 2],
        logprobs: vec![0.0, -0.1, -0.3],
    };
    let err = BudgetStats::new()
        .observe(
            &p,
            &t.view(true),
            0,
            Accepted::Path {
                tokens: &[5, 6],
                path: &[6],
            },
        )
        .unwrap_err();
    assert!(matches!(err, BudgetError::Shape(_)), "{err}");
}

#[test]
fn calibration_starts_at_the_prior() {
    let p = fixed_params();
    let cal = BudgetStats::new().calibration(&p);
    for row in cal {
        for (b, v) in row.iter().enumerate() {
            assert_eq!(*v, 1.0f64.min(1.0 / BIN_MID[b]));
        }
    }
    assert_eq!(BudgetStats::new().band_factors(&p, 0, 3), [1.0, 1.0, 1.0]);
}

#[test]
fn unscored_trees_take_depth_rates() {
    let p = fixed_params();
    let t = Tree {
        parents: vec![-1, 0, 1, 0],
        depths: vec![0, 1, 2, 1],
        logprobs: vec![0.0; 4],
    };
    let mut s = BudgetStats::new();
    let mut v = Vec::new();
    s.path_values(&t.view(false), &s.calibration(&p), &mut v)
        .unwrap();
    assert_eq!(v, [0.5, 0.25, 0.5]); // nothing measured: halves per depth
    s.observe(&p, &t.view(false), 0, Accepted::Count(1))
        .unwrap();
    s.path_values(&t.view(false), &s.calibration(&p), &mut v)
        .unwrap();
    assert_eq!(v, [0.75, 0.25, 0.75]); // depth 1 reached once of once, depth 2 never
}

#[test]
fn bad_trees_and_accepted_nodes_are_errors() {
    let p = fixed_params();
    let mut s = BudgetStats::new();
    let t = Tree {
        parents: vec![-1, 0, 3, 1],
        depths: vec![0, 1, 2, 2],
        logprobs: vec![0.0; 4],
    };
    let err = s
        .observe(&p, &t.view(true), 0, Accepted::Count(0))
        .unwrap_err();
    assert_eq!(err, BudgetError::Parent { node: 2, parent: 3 });
    let err = s
        .choose(&p, &[vec![t.view(true)]], 4, Pick::Drafted, None)
        .unwrap_err();
    assert_eq!(err, BudgetError::Parent { node: 2, parent: 3 });
    let mut v = Vec::new();
    let cal = s.calibration(&p);
    assert!(s.node_values(&p, &t.view(false), 0, &cal, &mut v).is_err());
    let t = Tree {
        parents: vec![-1, 0],
        depths: vec![0, 1],
        logprobs: vec![0.0, -0.1],
    };
    let err = s
        .observe(&p, &t.view(true), 0, Accepted::Nodes(&[2]))
        .unwrap_err();
    assert_eq!(
        err,
        BudgetError::Accepted {
            index: 2,
            num_real: 2
        }
    );
    let t = Tree {
        parents: vec![-1, 0],
        depths: vec![0, 1],
        logprobs: vec![0.0, f64::NAN],
    };
    assert!(matches!(
        s.observe(&p, &t.view(true), 0, Accepted::Count(0)),
        Err(BudgetError::NaN { node: 1 })
    ));
    assert_eq!(s, BudgetStats::new()); // nothing learnt from a refused tree
    let bad = BudgetParams { prior: 0.0, ..p };
    assert!(matches!(bad.check(), Err(BudgetError::Param(_))));
}
