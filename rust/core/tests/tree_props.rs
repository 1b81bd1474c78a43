//! Property tests of the DDTree builder and the verifier contract against brute force.

use proptest::prelude::*;
use specdec_core::testing::{self, all_prefixes, ancestors, naive_walk, Lcg};
use specdec_core::tree::{
    attention_mask, build_checked, build_checked_with, build_ddtree, build_ddtree_filtered,
    check_sibling_tokens, check_tree_size, max_nodes, pad_tree, retrieve_indices,
    tree_from_branches, walk, AllowAll, ChildLinks, Marginals, TreeError, MAX_TREE_NODES,
};

fn marginals() -> impl Strategy<Value = (usize, usize, Vec<f32>, Vec<i64>, usize)> {
    (1usize..=4, 1usize..=5, 1usize..=40).prop_flat_map(|(l, k, b)| {
        // A small value set makes ties common; -inf models banned tokens.
        let value = prop_oneof![
            Just(0.0f32),
            Just(-0.5f32),
            Just(-1.0f32),
            Just(-2.0f32),
            Just(f32::NEG_INFINITY),
            -6.0f32..0.0f32,
        ];
        (
            Just(l),
            Just(k),
            proptest::collection::vec(value, l * k),
            Just(b),
        )
            .prop_map(|(l, k, mut lp, b)| {
                for row in lp.chunks_mut(k) {
                    row.sort_by(|a, b| b.total_cmp(a));
                }
                // Distinct ids per row, shuffled deterministically by depth.
                let ids = (0..l)
                    .flat_map(|d| {
                        (0..k).map(move |r| ((r * 7 + d * 3) % 11) as i64 + 100 * r as i64)
                    })
                    .collect();
                (l, k, lp, ids, b)
            })
    })
}

/// Larger marginals (up to L = 16, K = 96, B = 400) for the unchecked fast builder and the
/// vector bitmap paths, which the small cases above barely exercise (queues past the
/// first, bitmap rows of several words).
fn large_marginals() -> impl Strategy<Value = (usize, usize, Vec<f32>, Vec<i64>, usize)> {
    (1usize..=16, 1usize..=96, 1usize..=400).prop_flat_map(|(l, k, b)| {
        let value = prop_oneof![
            Just(-0.25f32),
            Just(-1.0f32),
            Just(f32::NEG_INFINITY),
            -8.0f32..0.0f32,
            -8.0f32..0.0f32,
        ];
        (proptest::collection::vec(value, l * k), Just(b)).prop_map(move |(mut lp, b)| {
            for row in lp.chunks_mut(k) {
                row.sort_by(|a, b| b.total_cmp(a));
            }
            let ids = (0..(l * k) as i64).collect();
            (l, k, lp, ids, b)
        })
    })
}

proptest! {
    // The duplicate test rejects draws without two distinct columns (k = 1, a == c): allow
    // rejects in proportion to the case count, which `make fuzz` raises.
    #![proptest_config(ProptestConfig {
        cases: testing::cases(400),
        max_global_rejects: 8 * testing::cases(400),
        ..ProptestConfig::default()
    })]

    #[test]
    fn builder_is_optimal_prefix_closed_and_ordered((l, k, lp, ids, b) in marginals()) {
        let m = Marginals::new(&lp, &ids, l, k, b as i64).unwrap();
        let built = build_ddtree(&m, b, 7, None);
        let t = &built.tree;
        let n = t.len();
        // Brute force over all K (not only min(B, K)): Lemma 1 says nothing is lost.
        let mut all = all_prefixes(&lp, l, k, k);
        all.sort_by(|a, b| b.1.total_cmp(&a.1));
        let take = b.min(all.len());
        prop_assert_eq!(n - 1, take);
        let best: f64 = all[..take].iter().map(|p| p.1).sum();
        let got: f64 = t.logprobs[1..].iter().sum();
        prop_assert!((best - got).abs() < 1e-9, "best {} got {}", best, got);
        let ea: f64 = all[..take].iter().map(|p| p.1.exp()).sum();
        prop_assert!((ea - t.expected_acceptance()).abs() < 1e-9);
        prop_assert_eq!(t.tokens[0], 7);
        for i in 1..n {
            let p = t.parents[i] as usize;
            prop_assert!(p < i);
            prop_assert_eq!(t.depths[i], t.depths[p] + 1);
            prop_assert!(t.logprobs[i] <= t.logprobs[i - 1] || i == 1);
            prop_assert!(t.logprobs[i].is_finite());
            // The node's score is its parent's plus the marginal of its token at its depth.
            let d = t.depths[i] as usize - 1;
            let r = (0..k).find(|&r| ids[d * k + r] == t.tokens[i]).unwrap();
            prop_assert_eq!(t.logprobs[i], t.logprobs[p] + lp[d * k + r] as f64);
        }
        // No two siblings carry the same token (each prefix once).
        for i in 1..n {
            for j in 1..i {
                prop_assert!(!(t.parents[i] == t.parents[j] && t.tokens[i] == t.tokens[j]));
            }
        }
        // Ancestor bits and the dense mask are the ancestor relation.
        let mask = attention_mask::<bool>(&built.bits, 2);
        for i in 0..n {
            let anc = ancestors(&t.parents, i);
            for j in 0..n {
                prop_assert_eq!(built.bits.get(i, j), anc[j]);
                prop_assert_eq!(mask[i * (n + 2) + 2 + j], anc[j]);
            }
            prop_assert!(mask[i * (n + 2)] && mask[i * (n + 2) + 1]);
        }
        // Retrieve rows end at leaves and follow parents.
        let (rows, cols, data) = retrieve_indices(&t.parents, &t.depths);
        let leaves = (0..n).filter(|&i| !t.parents.contains(&(i as i32))).count();
        prop_assert_eq!(rows, leaves);
        for r in 0..rows {
            let row = &data[r * cols..(r + 1) * cols];
            prop_assert_eq!(row[0], 0);
            for c in 1..cols {
                if row[c] >= 0 { prop_assert_eq!(t.parents[row[c] as usize], row[c - 1]); }
            }
        }
    }

    #[test]
    fn queue_build_equals_one_heap_build((l, k, lp, ids, b) in marginals(), thr in prop::option::of(-4.0f64..0.0)) {
        // The fast path (rank-class queues) and the filtered path (one heap) with a filter
        // that allows everything must give the same tree, tie order included.
        let m = Marginals::new(&lp, &ids, l, k, b as i64).unwrap();
        let fast = build_ddtree(&m, b, 3, thr).tree;
        let heap = build_ddtree_filtered(&m, b, 3, thr, &mut AllowAll).tree;
        prop_assert_eq!(fast, heap);
    }

    #[test]
    fn large_queue_build_equals_one_heap_build_and_bits_are_ancestors(
        (l, k, lp, ids, b) in large_marginals(),
        thr in prop::option::of(-12.0f64..0.0),
    ) {
        let m = Marginals::new(&lp, &ids, l, k, b as i64).unwrap();
        let built = build_ddtree(&m, b, 3, thr);
        let heap = build_ddtree_filtered(&m, b, 3, thr, &mut AllowAll).tree;
        prop_assert_eq!(&built.tree, &heap);
        let parents = &built.tree.parents;
        for i in 0..parents.len() {
            for (j, &a) in ancestors(parents, i).iter().enumerate() {
                prop_assert_eq!(built.bits.get(i, j), a, "bit ({}, {})", i, j);
            }
        }
    }

    #[test]
    fn duplicate_ids_are_rejected_exactly_when_one_parent_gets_both(
        (l, k, lp, mut ids, b) in marginals(),
        (row, a, c) in (0usize..4, 0usize..5, 0usize..5),
        thr in prop::option::of(-4.0f64..0.0),
    ) {
        // Plant one repeat: column `j` of row `d` takes the id of column `i < j`.
        let (d, i, j) = (row % l, a.min(c) % k, a.max(c) % k);
        prop_assume!(i < j);
        let token = ids[d * k + i];
        ids[d * k + j] = token;
        let expected = TreeError::DuplicateToken { depth: d, rank: j, first_rank: i, token };
        // The tree without the check: fast and one-heap builders agree.
        let m = Marginals::new(&lp, &ids, l, k, b as i64).unwrap();
        let fast = build_ddtree(&m, b, 3, thr).tree;
        let heap = build_ddtree_filtered(&m, b, 3, thr, &mut AllowAll).tree;
        prop_assert_eq!(&fast, &heap);
        let all = Marginals::all_columns(&lp, &ids, l, k).unwrap();
        prop_assert_eq!(&build_ddtree_filtered(&all, b, 3, thr, &mut AllowAll).tree, &heap);
        // Brute-force oracle: two children of one parent share a token.
        let n = fast.len();
        let shared = (1..n).any(|x| {
            (1..x).any(|y| fast.parents[x] == fast.parents[y] && fast.tokens[x] == fast.tokens[y])
        });
        // The prefix claim: that happens iff some depth-d parent has more than j children.
        let widest = (0..n)
            .filter(|&p| fast.depths[p] as usize == d)
            .map(|p| fast.parents.iter().filter(|&&q| q == p as i32).count())
            .max()
            .unwrap_or(0);
        prop_assert_eq!(shared, j < widest);
        match build_checked(&lp, &ids, l, k, b as i64, 3, thr) {
            Err(e) => prop_assert!(shared && e == expected, "{:?}", e),
            Ok(t) => {
                prop_assert!(!shared);
                prop_assert_eq!(&t.tree, &fast);
            }
        }
        let want = if shared { Err(expected) } else { Ok(()) };
        prop_assert_eq!(check_sibling_tokens(&fast, &m), want.clone());
        prop_assert_eq!(check_sibling_tokens(&heap, &all), want);
        let unchecked = build_checked_with(&lp, &ids, l, k, b as i64, 3, thr, false).unwrap();
        prop_assert_eq!(&unchecked.tree, &fast);
    }

    #[test]
    fn duplicate_check_agrees_with_brute_force_on_large_ids(
        (l, k, lp, ids, b) in large_marginals(),
        plants in proptest::collection::vec((0usize..16, 0usize..96, 0usize..96), 0..4),
        big in any::<bool>(),
    ) {
        // In-range ids past the stamp array's range take the sorting fallback.
        let mut ids: Vec<i64> = if big { ids.iter().map(|&t| t + (1 << 24)).collect() } else { ids };
        for &(row, a, c) in &plants {
            let (d, i, j) = (row % l, a % k, c % k);
            ids[d * k + j] = ids[d * k + i];
        }
        let m = Marginals::new(&lp, &ids, l, k, b as i64).unwrap();
        let tree = build_ddtree(&m, b, 0, None).tree;
        // Oracle: M_d, the most children of a depth-d node, by brute force; then the first
        // row, then the first column, repeating an earlier one among its first M_d columns.
        let expected = (0..l).find_map(|d| {
            let widest = (0..tree.len())
                .filter(|&p| tree.depths[p] as usize == d)
                .map(|p| tree.parents.iter().filter(|&&q| q == p as i32).count())
                .max()
                .unwrap_or(0);
            (0..widest).find_map(|r| {
                (0..r).find(|&q| ids[d * k + q] == ids[d * k + r]).map(|q| {
                    TreeError::DuplicateToken { depth: d, rank: r, first_rank: q, token: ids[d * k + r] }
                })
            })
        });
        let got = build_checked(&lp, &ids, l, k, b as i64, 0, None).err();
        prop_assert_eq!(&got, &expected);
        prop_assert_eq!(check_sibling_tokens(&tree, &m).err(), expected);
    }

    #[test]
    fn min_logprob_stops_at_threshold((l, k, lp, ids, b) in marginals(), thr in -4.0f64..0.0) {
        let m = Marginals::new(&lp, &ids, l, k, b as i64).unwrap();
        let full = build_ddtree(&m, b, -1, None).tree;
        let cut = build_ddtree(&m, b, -1, Some(thr)).tree;
        let expect = full.logprobs.iter().skip(1).take_while(|&&s| s >= thr).count();
        prop_assert_eq!(cut.len() - 1, expect);
        prop_assert_eq!(&cut.tokens[..], &full.tokens[..cut.len()]);
    }

    #[test]
    fn walk_matches_naive_descent((l, k, lp, ids, b) in marginals(), seed in any::<u64>()) {
        let built = build_checked(&lp, &ids, l, k, b as i64, 5, None).unwrap();
        let t = &built.tree;
        let n = t.len();
        // Chosen tokens: mostly tokens of some child (so walks go deep), sometimes others.
        let mut rng = Lcg::new(seed);
        let chosen: Vec<i64> = (0..n).map(|i| {
            let kids: Vec<usize> = (0..n).filter(|&j| t.parents[j] == i as i32).collect();
            if !kids.is_empty() && rng.below(4) != 0 { t.tokens[kids[rng.below(kids.len() as u64) as usize]] } else { 999 }
        }).collect();
        let out = walk(&t.tokens, &built.links(), &chosen).unwrap();
        let (acc, bonus) = naive_walk(&t.tokens, &t.parents, &chosen);
        prop_assert_eq!(out.accepted, acc);
        prop_assert_eq!(out.bonus, bonus);
    }
}

#[test]
fn paper_worked_example() {
    // vocab {A,B,C,D} = ids 0..3; rows sorted descending with their ids.
    let q = [
        [(0, 0.55f32), (1, 0.35), (2, 0.06), (3, 0.04)],
        [(1, 0.50), (0, 0.30), (2, 0.15), (3, 0.05)],
        [(2, 0.55), (3, 0.25), (0, 0.12), (1, 0.08)],
    ];
    let lp: Vec<f32> = q.iter().flatten().map(|&(_, p)| p.ln()).collect();
    let ids: Vec<i64> = q.iter().flatten().map(|&(t, _)| t).collect();
    let b = build_checked(&lp, &ids, 3, 4, 6, -1, None).unwrap();
    // A, B, AB, BB, AA, ABC
    assert_eq!(b.tree.tokens, vec![-1, 0, 1, 1, 1, 0, 2]);
    assert_eq!(b.tree.parents, vec![-1, 0, 0, 1, 2, 1, 3]);
    assert!((b.tree.expected_acceptance() - 1.66625).abs() < 1e-6);
    // Verifier: A at the root, B after A, D after AB.
    let mut chosen = vec![0i64; 7];
    chosen[0] = 0;
    chosen[1] = 1;
    chosen[3] = 3;
    let out = walk(&b.tree.tokens, &b.links(), &chosen).unwrap();
    assert_eq!(out.accepted, vec![1, 3]);
    assert_eq!(out.bonus, 3);
}

#[test]
fn notes_branches_example() {
    let b = tree_from_branches(&[vec![4, 5, 6], vec![4, 7, 8], vec![9, 0, 1]], 11).unwrap();
    assert_eq!(b.tree.tokens, vec![11, 4, 9, 5, 7, 0, 6, 8, 1]);
    assert_eq!(b.tree.parents, vec![-1, 0, 0, 1, 1, 2, 3, 4, 5]);
    let mask = attention_mask::<bool>(&b.bits, 1);
    let seen: Vec<usize> = mask
        .chunks(10)
        .skip(1)
        .map(|r| r.iter().filter(|&&x| x).count())
        .collect();
    assert_eq!(seen, vec![3, 3, 4, 4, 4, 5, 5, 5]);
    let mut chosen = vec![0i64; 9];
    chosen[0] = 4;
    chosen[1] = 7;
    chosen[4] = 3;
    let out = walk(&b.tree.tokens, &b.links(), &chosen).unwrap();
    assert_eq!(out.accepted, vec![1, 4]);
    assert_eq!(out.bonus, 3);
    let released = b.tree.len() - 1 - out.accepted.len();
    assert_eq!(released, 6);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let ok_ids = vec![0i64, 1];
    let e = |lp: Vec<f32>, ids: Vec<i64>, l, k, b| {
        build_checked(&lp, &ids, l, k, b, -1, None).unwrap_err()
    };
    assert!(matches!(
        e(vec![-1.0, f32::NAN], ok_ids.clone(), 1, 2, 4),
        TreeError::NaN { .. }
    ));
    assert!(matches!(
        e(vec![-2.0, -1.0], ok_ids.clone(), 1, 2, 4),
        TreeError::Unsorted { .. }
    ));
    assert!(matches!(
        e(vec![0.5, -1.0], ok_ids.clone(), 1, 2, 4),
        TreeError::NotLogProb { .. }
    ));
    assert!(matches!(
        e(vec![-1.0, -2.0], ok_ids.clone(), 1, 2, 0),
        TreeError::Budget(0)
    ));
    assert!(matches!(e(vec![], vec![], 0, 2, 4), TreeError::Shape(_)));
    assert!(matches!(e(vec![], vec![], 1, 0, 4), TreeError::Shape(_)));
    assert!(matches!(
        e(vec![-1.0], ok_ids.clone(), 1, 2, 4),
        TreeError::Shape(_)
    ));
    assert!(matches!(
        e(vec![-1.0, -2.0], vec![0, 1 << 40], 1, 2, 4),
        TreeError::TokenOutOfRange { .. }
    ));
    // Ids are checked where the tree uses them: the error names the entry of a used id...
    let used = e(vec![-1.0, -2.0, -1.0, -3.0], vec![0, 1, -5, 9], 2, 2, 3);
    assert!(
        matches!(&used, TreeError::TokenOutOfRange { token: -5, location } if location == "token_ids[1, 0]"),
        "{used:?}"
    );
    // ... and an id past the budget's columns or below the tree's reach is never read.
    let ok = build_checked(&[-1.0, -2.0, -9.0], &[4, 5, -1], 1, 3, 2, -1, None).unwrap();
    assert_eq!(ok.tree.tokens, vec![-1, 4, 5]);
    let ok = build_checked(
        &[-0.1, -9.0, -0.1, -9.0],
        &[4, 1 << 40, 6, 7],
        2,
        2,
        2,
        -1,
        None,
    )
    .unwrap();
    assert_eq!(ok.tree.tokens, vec![-1, 4, 6]);
    let links = ChildLinks {
        first_child: vec![-1],
        next_sibling: vec![-1],
    };
    assert!(walk(&[0], &links, &[]).is_err());
    assert!(tree_from_branches(&[], 0).is_err());
    assert!(tree_from_branches(&[vec![]], 0).is_err());
}

#[test]
fn duplicate_ids_name_depth_token_and_both_columns() {
    let lp = [
        -0.01f32,
        -5.0,
        -6.0,
        -0.1,
        -0.2,
        -0.3,
        -0.1,
        -0.2,
        f32::NEG_INFINITY,
    ];
    let ids = [1i64, 2, 3, 4, 5, 4, 7, 8, 7];
    // Budget 8: node 1 gets all three row-1 entries, id 4 twice.
    let err = build_checked(&lp, &ids, 3, 3, 8, -1, None).unwrap_err();
    assert_eq!(
        err,
        TreeError::DuplicateToken {
            depth: 1,
            rank: 2,
            first_rank: 0,
            token: 4
        }
    );
    assert_eq!(
        err.to_string(),
        "token_ids[1, 2] = 4 repeats token_ids[1, 0]: the candidates of one depth must be \
         distinct tokens"
    );
    // Budget 5: no parent reaches row 1's column 2, and row 2's id 7 at column 0 goes to two
    // different parents (its repeat at -inf never enters): the tree is built.
    let t = build_checked(&lp, &ids, 3, 3, 5, -1, None).unwrap().tree;
    assert_eq!(t.tokens, [-1, 1, 4, 5, 7, 7]);
    assert_eq!(t.parents, [-1, 0, 1, 1, 2, 3]);
    let no_row1 = [1i64, 2, 3, 4, 5, 6, 7, 8, 7];
    assert!(build_checked(&lp, &no_row1, 3, 3, 8, -1, None).is_ok());
    // The opt-out builds the tree anyway.
    assert!(build_checked_with(&lp, &ids, 3, 3, 8, -1, None, false).is_ok());
    // Many calls on one thread wrap the 16-bit stamp: repeats are still found, and distinct
    // rows are still accepted after the stamp array is cleared.
    for _ in 0..70_000 / 3 {
        assert!(build_checked(&lp, &no_row1, 3, 3, 8, -1, None).is_ok());
    }
    assert!(build_checked(&lp, &ids, 3, 3, 8, -1, None).is_err());
}

#[test]
fn budgets_past_what_the_marginals_hold_allocate_nothing_extra_or_are_refused() {
    // max_nodes against a plain count of the prefixes.
    for (budget, rows, k) in [
        (1usize, 1usize, 1usize),
        (5, 2, 2),
        (6, 2, 2),
        (7, 2, 2),
        (100, 3, 4),
        (3, 0, 9),
    ] {
        let prefixes = (1..=rows as u32).map(|d| k.pow(d)).sum::<usize>();
        assert_eq!(max_nodes(budget, rows, k), budget.min(prefixes) + 1);
    }
    assert_eq!(max_nodes(usize::MAX, 64, 1 << 20), usize::MAX);
    // Two possible prefixes: any budget gives the same 3-node tree.
    let lp = [-0.1f32, -2.0];
    let t = build_checked(&lp, &[3, 4], 1, 2, i64::MAX, -1, None).unwrap();
    assert_eq!(t.tree.tokens, vec![-1, 3, 4]);
    // 8^16 possible prefixes: a tree past int32 indices, or one whose 2^59-byte ancestor
    // bitmap cannot be allocated, is an error (not an abort).
    let lp = vec![-1.0f32; 16 * 8];
    let ids: Vec<i64> = (0..16 * 8).map(|i| i % 8).collect();
    for budget in [1i64 << 40, i32::MAX as i64 - 1] {
        let err = build_checked(&lp, &ids, 16, 8, budget, -1, None).unwrap_err();
        assert!(matches!(err, TreeError::TooLarge(_)), "{err:?}");
    }
    let small = build_checked(&lp, &ids, 16, 8, 4, -1, None).unwrap();
    assert!(pad_tree(&small.tree, usize::MAX, 0).is_err());
    assert!(check_tree_size(1025).is_ok());
    // The node limit keeps the quadratic ancestor bitmap within 512 MiB: padding a small
    // tree to 2^18 nodes built an 8 GiB bitmap for tens of seconds before.
    assert!(check_tree_size(MAX_TREE_NODES).is_ok());
    let err = pad_tree(&small.tree, 1 << 18, 0).unwrap_err();
    assert!(matches!(err, TreeError::TooLarge(_)), "{err:?}");
}
