//! The walk on arbitrary (edited) child links: it never panics or loops, and either walks
//! exactly as a bounded reference does or refuses the links as an invalid tree.

use proptest::prelude::*;
use specdec_core::testing::{self, naive_walk};
use specdec_core::tree::{child_links, walk, ChildLinks, TreeError, WalkOutcome};

/// Reference semantics with an explicit step cap (so it ends even on cyclic links): follow
/// the links while each points forward inside the tree; `None` when one does not.
fn reference(tokens: &[i64], links: &ChildLinks, chosen: &[i64]) -> Option<(Vec<i32>, i64)> {
    let n = tokens.len() as i64;
    let (mut node, mut accepted) = (0i64, vec![]);
    for _ in 0..=n * n {
        let want = chosen[node as usize];
        let (mut link, mut after) = (links.first_child[node as usize] as i64, node);
        loop {
            if link < 0 {
                return Some((accepted, want));
            }
            if link <= after || link >= n {
                return None;
            }
            if tokens[link as usize] == want {
                break;
            }
            after = link;
            link = links.next_sibling[link as usize] as i64;
        }
        accepted.push(link as i32);
        node = link;
    }
    unreachable!("forward links end within n * n steps")
}

/// Small trees with links drawn from [-2, n + 2): out of range, backward, self and cyclic
/// links are all common; tokens and choices from a tiny alphabet so matches are common too.
fn arbitrary_links() -> impl Strategy<Value = (Vec<i64>, ChildLinks, Vec<i64>)> {
    (1usize..10).prop_flat_map(|n| {
        let link = -2i32..(n as i32 + 2);
        (
            proptest::collection::vec(0i64..3, n),
            proptest::collection::vec(link.clone(), n),
            proptest::collection::vec(link, n),
            proptest::collection::vec(0i64..3, n),
        )
            .prop_map(|(tokens, first_child, next_sibling, chosen)| {
                let links = ChildLinks {
                    first_child,
                    next_sibling,
                };
                (tokens, links, chosen)
            })
    })
}

/// Random valid trees: each node's parent precedes it.
fn arbitrary_tree() -> impl Strategy<Value = (Vec<i64>, Vec<i32>, Vec<i64>)> {
    (1usize..16).prop_flat_map(|n| {
        let parents: Vec<_> = (0..n)
            .map(|i| {
                if i == 0 {
                    Just(-1).boxed()
                } else {
                    (0..i as i32).boxed()
                }
            })
            .collect();
        (
            proptest::collection::vec(0i64..3, n),
            parents,
            proptest::collection::vec(0i64..3, n),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(testing::cases(2000)))]

    #[test]
    fn edited_links_walk_or_are_refused((tokens, links, chosen) in arbitrary_links()) {
        match (walk(&tokens, &links, &chosen), reference(&tokens, &links, &chosen)) {
            (Ok(WalkOutcome { accepted, bonus }), Some(want)) => {
                prop_assert_eq!((accepted, bonus), want)
            }
            (Err(TreeError::InvalidTree(_)), None) => {}
            (got, want) => prop_assert!(false, "walk gave {:?}, reference {:?}", got, want),
        }
    }

    #[test]
    fn valid_links_walk_like_the_naive_descent((tokens, parents, chosen) in arbitrary_tree()) {
        let out = walk(&tokens, &child_links(&parents), &chosen).unwrap();
        prop_assert_eq!((out.accepted, out.bonus), naive_walk(&tokens, &parents, &chosen));
    }
}

fn links(first_child: &[i32], next_sibling: &[i32]) -> ChildLinks {
    ChildLinks {
        first_child: first_child.to_vec(),
        next_sibling: next_sibling.to_vec(),
    }
}

fn refusal(tokens: &[i64], l: &ChildLinks, chosen: &[i64]) -> String {
    match walk(tokens, l, chosen) {
        Err(TreeError::InvalidTree(m)) => m,
        other => panic!("expected InvalidTree, got {other:?}"),
    }
}

#[test]
fn out_of_range_child_is_refused_not_a_panic() {
    let m = refusal(&[0, 1], &links(&[5, -1], &[-1, -1]), &[1, 1]);
    assert!(m.contains("first_child[0] = 5"), "{m}");
}

#[test]
fn out_of_range_sibling_is_refused_not_a_panic() {
    // Node 1 does not match, so the walk reads its sibling link, which is out of range.
    let m = refusal(&[0, 1, 2], &links(&[1, -1, -1], &[-1, 7, -1]), &[2, 0, 0]);
    assert!(m.contains("next_sibling[1] = 7"), "{m}");
    assert!(m.contains("children of node 0"), "{m}");
}

#[test]
fn sibling_cycle_is_refused_not_a_hang() {
    // 1 -> 2 -> 1 -> ...: no sibling carries token 9.
    let m = refusal(&[0, 1, 2], &links(&[1, -1, -1], &[-1, 2, 1]), &[9, 0, 0]);
    assert!(m.contains("next_sibling[2] = 1"), "{m}");
}

#[test]
fn self_and_backward_child_links_are_refused() {
    let m = refusal(&[0, 1], &links(&[0, -1], &[-1, -1]), &[0, 0]);
    assert!(m.contains("first_child[0] = 0"), "{m}");
    // Accept node 1, whose child link points back to the root.
    let m = refusal(&[0, 1], &links(&[1, 0], &[-1, -1]), &[1, 0]);
    assert!(m.contains("first_child[1] = 0"), "{m}");
}

#[test]
fn links_not_followed_are_not_checked() {
    // The bad sibling link of node 1 is never read: its token matches first.
    let out = walk(&[0, 1, 2], &links(&[1, -1, -1], &[-1, 0, -1]), &[1, 5, 5]).unwrap();
    assert_eq!((out.accepted, out.bonus), (vec![1], 5));
}

#[test]
fn empty_tree_is_refused() {
    let m = refusal(&[], &links(&[], &[]), &[]);
    assert!(m.contains("root"), "{m}");
}
