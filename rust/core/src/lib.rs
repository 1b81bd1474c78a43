//! specdec-core: the CPU-bound steps of tree speculative decoding, free of Python.
//!
//! # The pipeline
//!
//! One decode step runs: **draft -> build tree -> mask -> verify -> walk -> commit**.
//!
//! 1. *Draft* (outside this crate): a drafter proposes, per depth, its top-K candidate
//!    tokens with their log-probs.
//! 2. *Build tree* ([`tree::build`]): the best `B` prefixes of those marginals become a draft
//!    tree, node 0 being the last committed (or bonus) token.
//! 3. *Mask*: the verifier's attention follows the tree ([`tree::contract`]: ancestor bits,
//!    dense masks, position ids); under a [`constrain::Constraint`] each node also gets the
//!    tokens allowed after it. [`kv`] reserves tentative KV slots for the nodes.
//! 4. *Verify* (outside this crate): the target model scores every node in one forward.
//! 5. *Walk* ([`tree::walk`](mod@tree::walk)): descend from the root while the verifier's
//!    choice is a child.
//! 6. *Commit* ([`kv`]): the accepted nodes' slots become committed tokens; the rest are
//!    released.
//!
//! A drafter that needs no model can also hand over a whole tree: [`draft::SuffixIndex`]
//! proposes the most frequent continuations of the context as a scored tree, pooled with a
//! [`draft::SuffixCorpus`] of earlier outputs.
//!
//! The `testing` module (cargo feature `testing`, on for this crate's own tests, benches and
//! examples) holds the seeded generator and brute-force oracles they share.
//!
//! ## Build a tree
//!
//! ```
//! use specdec_core::tree::build_checked;
//!
//! // Two depths of three candidates, log-probs sorted descending in each row.
//! let lp = [-0.1f32, -2.5, -3.0, -0.2, -1.9, -4.0];
//! let ids = [10i64, 11, 12, 20, 21, 22];
//! let built = build_checked(&lp, &ids, 2, 3, 4, 5, None).unwrap();
//! // Root 5, then the four best prefixes: 10, 10 20, 10 21, 11.
//! assert_eq!(built.tree.tokens, [5, 10, 20, 21, 11]);
//! assert_eq!(built.tree.parents, [-1, 0, 1, 1, 0]);
//! ```
//!
//! ## Ancestor bits, masks and positions
//!
//! ```
//! use specdec_core::tree::{ancestor_bits, attention_mask, position_ids};
//!
//! let (parents, depths) = ([-1, 0, 1, 1, 0], [0, 1, 2, 2, 1]);
//! let bits = ancestor_bits(&parents);
//! assert!(bits.get(3, 1) && bits.get(3, 0) && !bits.get(3, 2));
//! // Node 3 sees the root, node 1 and itself (no prefix columns here).
//! let mask = attention_mask::<bool>(&bits, 0);
//! assert_eq!(mask[15..20], [true, true, false, true, false]);
//! assert_eq!(position_ids(&depths, 100), [100, 101, 102, 102, 101]);
//! ```
//!
//! ## Constrain: a regex mask over a tiny vocabulary
//!
//! ```
//! use std::sync::Arc;
//! use specdec_core::constrain::{CompiledRegex, Matcher, RegexLimits, Vocabulary};
//!
//! // Tokens "a", "b", "ab" and EOS (id 3).
//! let text = |s: &str| Some(s.as_bytes().to_vec());
//! let vocab = Vocabulary::new(vec![text("a"), text("b"), text("ab"), None], &[3], None);
//! let regex = CompiledRegex::new(Arc::new(vocab.unwrap()), "a+b", RegexLimits::default(), 1 << 20);
//! let mut m = Matcher::new(Arc::new(regex.unwrap()));
//! let mut mask = [0u32; 1];
//! m.fill_bitmask(&mut mask).unwrap();
//! assert_eq!(mask[0], 0b0101); // "a" or "ab"
//! assert!(m.accept_token(2).unwrap());
//! m.fill_bitmask(&mut mask).unwrap();
//! assert_eq!(mask[0], 0b1000); // the text matches: only EOS
//! ```
//!
//! ## KV: reserve tentative slots, commit the accepted ones
//!
//! ```
//! use specdec_core::kv::BlockManager;
//!
//! let mut kv = BlockManager::new(8, 4, false).unwrap(); // 8 blocks of 4 slots
//! kv.allocate(1, 6).unwrap(); // a 6-token prompt
//! let reserved = kv.reserve_tree(1, 5).unwrap(); // one slot per tree node
//! assert_eq!(reserved.slots.len(), 5);
//! // Keep the root and nodes 1 and 3: node 3's K/V moves next to node 1's.
//! let moves = kv.commit(1, &[0, 1, 3], None).unwrap();
//! assert_eq!(moves, [(reserved.slots[3], reserved.slots[2])]);
//! assert_eq!(kv.seq_len(1).unwrap(), (9, 0));
//! ```
//!
//! ## Draft a tree without a model: the suffix index
//!
//! ```
//! use specdec_core::draft::{SuffixCorpus, SuffixIndex};
//!
//! let mut index = SuffixIndex::new(4).unwrap(); // match suffixes of up to 4 tokens
//! index.extend(&[1, 2, 3, 1, 2, 4, 1, 2]).unwrap(); // the request's own tokens
//! let built = index.propose(&[1, 2], None, 2, 3, 0.0).unwrap().built;
//! // "1 2" was followed by "3 1" and "4 1": each once, in order of appearance.
//! assert_eq!(built.tree.tokens, [2, 3, 1, 4]);
//! assert_eq!(built.tree.parents, [-1, 0, 1, 0]);
//! assert!((built.tree.logprobs[1].exp() - 0.5).abs() < 1e-12);
//!
//! // Earlier outputs of the same tenant (cache salt), at most 1000 tokens in all.
//! let mut corpus = SuffixCorpus::new(4, 1000).unwrap();
//! let id = corpus.add(Some(b"tenant-a"), &[1, 2, 3, 5]).unwrap();
//! let p = index.propose(&[1, 2], Some(corpus.part(Some(b"tenant-a"))), 1, 3, 0.0).unwrap();
//! assert_eq!(p.built.tree.tokens, [2, 3, 4]); // "3" twice in three occurrences, "4" once
//! assert_eq!(p.matched, [id]);
//! corpus.touch(&p.matched); // drafted from: the last to be evicted
//! ```
//!
//! ## Walk the verifier's choices
//!
//! ```
//! use specdec_core::tree::{tree_from_branches, walk};
//!
//! let built = tree_from_branches(&[vec![10, 20], vec![10, 21], vec![11]], 5).unwrap();
//! assert_eq!(built.tree.tokens, [5, 10, 11, 20, 21]);
//! // The verifier's token at every node: 10 after the root, 21 after 10, 7 after 21.
//! let chosen = [10, 21, 0, 0, 7];
//! let out = walk(&built.tree.tokens, &built.links(), &chosen).unwrap();
//! assert_eq!(out.accepted, [1, 4]);
//! assert_eq!(out.bonus, 7);
//! ```

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod constrain;
pub mod decode;
pub mod draft;
pub mod kv;
pub mod linear;
pub mod model;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tree;
