//! Hand-checked cases of the paged-KV manager: every refusal (with the state unchanged),
//! LRU eviction order, prefix hits after free, beams sharing and copying their tail.

use specdec_core::kv::{block_hash, BlockManager, KvError};
use specdec_core::testing::kv_snapshot as snap;

/// `f` must fail with `want` and leave the manager as it was.
fn refused(
    m: &mut BlockManager,
    want: KvError,
    f: impl FnOnce(&mut BlockManager) -> Result<(), KvError>,
) {
    let before = snap(m);
    assert_eq!(f(m), Err(want));
    assert_eq!(before, snap(m));
    m.check_invariants().unwrap();
}

#[test]
fn refusals_leave_state_unchanged() {
    let mut m = BlockManager::new(4, 4, true).unwrap();
    m.allocate(1, 6).unwrap();
    refused(&mut m, KvError::UnknownSequence(9), |m| m.free(9));
    refused(&mut m, KvError::UnknownSequence(9), |m| {
        m.append_slots(9, 1, None).map(|_| ())
    });
    refused(&mut m, KvError::SequenceExists(1), |m| m.allocate(1, 1));
    refused(&mut m, KvError::OutOfBlocks { needed: 3, free: 2 }, |m| {
        m.allocate(2, 9)
    });
    refused(&mut m, KvError::OutOfBlocks { needed: 3, free: 2 }, |m| {
        m.allocate_tokens(2, &[0; 9], b"", 0).map(|_| ())
    });
    refused(&mut m, KvError::OutOfBlocks { needed: 3, free: 2 }, |m| {
        m.append_slots(1, 11, None).map(|_| ())
    });
    refused(&mut m, KvError::NoStep(1), |m| {
        m.commit(1, &[0], None).map(|_| ())
    });
    m.fork(1, 2).unwrap();
    m.free(2).unwrap();
    refused(&mut m, KvError::AlreadyFreed(2), |m| m.free(2));
    refused(&mut m, KvError::AlreadyFreed(2), |m| m.fork(2, 3));
    refused(&mut m, KvError::AlreadyFreed(2), |m| {
        m.reserve_tree(2, 1).map(|_| ())
    });
    m.reserve_tree(1, 3).unwrap();
    refused(
        &mut m,
        KvError::NotReserved {
            seq: 1,
            node: 3,
            reserved: 3,
        },
        |m| m.commit(1, &[0, 3], None).map(|_| ()),
    );
    refused(
        &mut m,
        KvError::NotReserved {
            seq: 1,
            node: -1,
            reserved: 3,
        },
        |m| m.commit(1, &[-1], None).map(|_| ()),
    );
    refused(
        &mut m,
        KvError::Invalid(
            "sequence 1: accepted nodes must be strictly increasing, got [1, 1]".into(),
        ),
        |m| m.commit(1, &[1, 1], None).map(|_| ()),
    );
    refused(&mut m, KvError::PendingStep(1), |m| {
        m.reserve_tree(1, 1).map(|_| ())
    });
    refused(&mut m, KvError::PendingStep(1), |m| m.fork(1, 5));
    refused(&mut m, KvError::PendingStep(1), |m| {
        m.append_slots(1, 1, None).map(|_| ())
    });
    refused(&mut m, KvError::PendingStep(1), |m| m.reorder(&[1], &[0]));
    m.rollback(1).unwrap();
    // A batch with one bad member changes nothing for the good ones.
    m.allocate(3, 1).unwrap();
    refused(&mut m, KvError::UnknownSequence(7), |m| {
        m.reserve_tree_batch(&[1, 3, 7], &[1, 1, 1]).map(|_| ())
    });
    refused(&mut m, KvError::OutOfBlocks { needed: 3, free: 1 }, |m| {
        m.reserve_tree_batch(&[1, 3], &[3, 8]).map(|_| ())
    });
    // Absurd sizes are "out of blocks", never an overflow.
    let huge = usize::MAX - 1;
    let oob = |e: Result<(), KvError>| matches!(e, Err(KvError::OutOfBlocks { .. }));
    assert!(oob(m.append_slots(1, huge, None).map(|_| ())));
    assert!(oob(m.reserve_tree(1, huge).map(|_| ())));
    assert!(oob(m.allocate(9, huge)));
    assert!(oob(m.allocate_batch(&[9, 10], &[huge, huge])));
    assert!(oob(m
        .reserve_tree_batch(&[1, 3], &[huge, huge])
        .map(|_| ())));
    assert!(m.slot_mapping(1, huge, huge).is_err());
    m.check_invariants().unwrap();
    assert!(BlockManager::new(0, 4, false).is_err());
    assert!(BlockManager::new(1 << 20, 1 << 12, false).is_err());
}

#[test]
fn tree_commit_moves_and_releases() {
    let mut m = BlockManager::new(8, 4, false).unwrap();
    m.allocate(0, 3).unwrap();
    let ap = m.reserve_tree(0, 7).unwrap(); // positions 3..10 -> blocks 0,1,2
    assert_eq!(ap.cow, None);
    assert_eq!(m.block_table(0).unwrap().len(), 3);
    let slots = ap.slots.clone();
    let moves = m.commit(0, &[0, 2, 5], None).unwrap();
    // Node 0 stays; node 2 -> position 4, node 5 -> position 5.
    assert_eq!(moves, vec![(slots[2], slots[1]), (slots[5], slots[2])]);
    assert_eq!(m.seq_len(0).unwrap(), (6, 0));
    assert_eq!(
        m.block_table(0).unwrap().len(),
        2,
        "the emptied third block is released"
    );
    assert_eq!(m.num_free_blocks(), 6);
    m.reserve_tree(0, 5).unwrap();
    m.rollback(0).unwrap();
    assert_eq!(m.num_free_blocks(), 6);
    m.check_invariants().unwrap();
}

#[test]
fn fork_shares_then_copy_on_write_of_partial_tail() {
    let mut m = BlockManager::new(8, 4, false).unwrap();
    m.allocate(0, 6).unwrap(); // 1 full + 1 partial block
    m.fork(0, 1).unwrap();
    assert_eq!(m.block_table(0).unwrap(), m.block_table(1).unwrap());
    assert_eq!(m.num_free_blocks(), 6, "fork copies nothing");
    let a = m.append_slots(1, 1, None).unwrap();
    let shared_tail = m.block_table(0).unwrap()[1];
    let (src, dst) = a.cow.expect("shared partial tail is copied");
    assert_eq!(src, shared_tail);
    assert_eq!(m.block_table(1).unwrap()[1], dst);
    assert_eq!(
        m.block_table(1).unwrap()[0],
        m.block_table(0).unwrap()[0],
        "full block still shared"
    );
    // The parent is now the only holder of the old tail: no copy.
    assert_eq!(m.append_slots(0, 1, None).unwrap().cow, None);
    // A full shared tail is never copied: growth goes to a new block.
    m.allocate(5, 4).unwrap();
    m.fork(5, 6).unwrap();
    assert_eq!(m.append_slots(6, 1, None).unwrap().cow, None);
    m.check_invariants().unwrap();
}

#[test]
fn beams_reorder_share_and_free() {
    let mut m = BlockManager::new(16, 2, false).unwrap();
    m.allocate(10, 3).unwrap();
    m.fork(10, 11).unwrap();
    m.fork(10, 12).unwrap();
    m.append_slots(11, 2, None).unwrap();
    m.append_slots(12, 2, None).unwrap();
    let used_before = 16 - m.num_free_blocks();
    // Beam 11 continues twice, 12 dies, 10 continues 11.
    m.reorder(&[10, 11, 12], &[1, 1, 1]).unwrap();
    let t = m.block_table(11).unwrap().to_vec();
    assert_eq!(m.block_table(10).unwrap(), &t[..]);
    assert_eq!(m.block_table(12).unwrap(), &t[..]);
    for &b in &t {
        assert_eq!(m.refcounts()[b as usize], 3);
    }
    assert!(
        16 - m.num_free_blocks() < used_before,
        "the dead beam's private blocks are freed"
    );
    // Children of one parent copy their shared partial tail on the next append.
    assert!(m.append_slots(10, 1, None).unwrap().cow.is_some());
    m.check_invariants().unwrap();
}

#[test]
fn prefix_cache_hits_survive_free_until_evicted_lru() {
    let mut m = BlockManager::new(8, 2, true).unwrap();
    let toks = [1, 2, 3, 4, 5];
    assert_eq!(m.allocate_tokens(0, &toks, b"", 0).unwrap(), 0);
    m.mark_computed(0, toks.len()).unwrap(); // its K/V is written now
    let t0 = m.block_table(0).unwrap().to_vec();
    assert_eq!(
        m.allocate_tokens(1, &toks, b"", 0).unwrap(),
        4,
        "two full blocks hit"
    );
    assert_eq!(m.block_table(1).unwrap()[..2], t0[..2]);
    assert_eq!(
        m.allocate_tokens(2, &toks, b"", 7).unwrap(),
        0,
        "another extra key misses"
    );
    m.free(2).unwrap();
    m.free(1).unwrap();
    m.free(0).unwrap();
    assert_eq!(m.num_free_blocks(), 8);
    // Freed cached blocks still hit.
    assert_eq!(
        m.allocate_tokens(3, &toks[..4], b"", 0).unwrap(),
        2,
        "at most len-1 tokens come from the cache"
    );
    assert_eq!(m.allocate_tokens(4, &toks, b"", 0).unwrap(), 4);
    m.free(3).unwrap();
    m.free(4).unwrap();
    // Only the least recently freed blocks are evicted when space is needed.
    let q = m.free_queue();
    m.allocate(5, 2).unwrap();
    assert_eq!(m.block_table(5).unwrap(), &q[..1]);
    m.check_invariants().unwrap();
    m.free(5).unwrap();
    m.allocate(6, 16).unwrap(); // takes every block: the cache is empty now
    assert_eq!(m.num_cached_blocks(), 0);
    m.free(6).unwrap();
    assert_eq!(m.allocate_tokens(7, &toks, b"", 0).unwrap(), 0);
}

#[test]
fn truncate_keeps_cached_blocks_immutable() {
    let mut m = BlockManager::new(8, 4, true).unwrap();
    let toks = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    m.allocate_tokens(0, &toks, b"", 0).unwrap();
    m.mark_computed(0, toks.len()).unwrap(); // blocks 0 and 1 full, computed and cached
    let t = m.block_table(0).unwrap().to_vec();
    assert!(m.is_cached(t[0]) && m.is_cached(t[1]));
    m.truncate_seq(0, 6).unwrap();
    assert_eq!(m.block_table(0).unwrap(), &t[..2]);
    // Writing into the cached (now partial) tail copies it first, even with refcount 1.
    let a = m.append_slots(0, 1, Some(&[42])).unwrap();
    assert_eq!(a.cow.map(|c| c.0), Some(t[1]));
    assert!(
        m.is_cached(t[1]),
        "the cached block keeps its content and its hash"
    );
    assert_eq!(m.refcounts()[t[1] as usize], 0);
    assert_eq!(
        m.allocate_tokens(1, &toks, b"", 0).unwrap(),
        8,
        "both blocks still hit"
    );
    assert_eq!(m.block_table(1).unwrap()[..2], t[..2]);
    assert_eq!(
        m.truncate_seq(1, 10),
        Err(KvError::Invalid(
            "truncate sequence 1 to 10: only 9 tokens are committed".into()
        ))
    );
    m.reserve_tree(1, 2).unwrap();
    assert_eq!(m.truncate_seq(1, 1), Err(KvError::PendingStep(1)));
    m.check_invariants().unwrap();
}

/// Known answers: the digests below were computed with Python's `hashlib.sha256` over the
/// encoding in `kv::prefix_cache`'s module doc; the same bytes are also built by hand here
/// and hashed with the `sha2` crate, so the test pins both the encoding and the digest.
#[test]
fn block_hash_is_sha256_of_the_documented_encoding() {
    use sha2::{Digest, Sha256};
    let hex = |h: &[u8]| h.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let h0 = block_hash(None, &[1, 2, 3, -1], b"tenant-a", 7);
    let h1 = block_hash(Some(&h0), &[5, 6, 7, 8], b"tenant-a", 7);
    assert_eq!(
        hex(&h0),
        "83a17bb1fb1538ad7f18f5c606f19ad83a8f9ecf6de4710e6c053deadd42d075"
    );
    assert_eq!(
        hex(&h1),
        "91e7bea74228a1637472f55ed866d1ee0c0f338e42674d4ae30eaca6d9cb4e49"
    );
    let mut bytes = b"specdec/kv-block/v1".to_vec();
    bytes.push(1);
    bytes.extend_from_slice(&h0);
    bytes.extend_from_slice(&7u64.to_le_bytes());
    bytes.extend_from_slice(&8u64.to_le_bytes());
    bytes.extend_from_slice(b"tenant-a");
    bytes.extend_from_slice(&4u64.to_le_bytes());
    for t in [5i64, 6, 7, 8] {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    assert_eq!(h1, <[u8; 32]>::from(Sha256::digest(&bytes)));
    // Length prefixes: moving bytes between fields changes the hash.
    assert_ne!(
        block_hash(None, &[], b"ab", 0),
        block_hash(None, &[0x62], b"a", 0)
    );
    assert_ne!(
        block_hash(None, &[1], b"", 0),
        block_hash(None, &[1], b"", 1)
    );
}

/// Two sequences with the same prompt started back to back (one scheduling step, no K/V
/// written yet): the second must not reuse blocks whose K/V nobody computed. Before
/// registration waited for computed K/V, the second call reported 8 cached tokens.
#[test]
fn same_prompt_in_one_step_shares_nothing_until_computed() {
    let mut m = BlockManager::new(16, 4, true).unwrap();
    let p: Vec<i64> = (0..10).collect();
    assert_eq!(m.allocate_tokens(0, &p, b"", 0).unwrap(), 0);
    assert_eq!(
        m.allocate_tokens(1, &p, b"", 0).unwrap(),
        0,
        "uncomputed K/V hit"
    );
    assert_eq!(m.num_cached_blocks(), 0);
    m.mark_computed(0, 6).unwrap(); // only block 0 is covered
    assert_eq!(m.allocate_tokens(2, &p, b"", 0).unwrap(), 4);
    m.mark_computed(0, p.len()).unwrap();
    assert_eq!(m.allocate_tokens(3, &p, b"", 0).unwrap(), 8);
    assert_eq!(
        m.mark_computed(0, 11),
        Err(KvError::Invalid(
            "sequence 0: 11 computed tokens but only 10 are committed".into()
        ))
    );
    // Appended slots are written after `append_slots` returns: not cached before that.
    let q: Vec<i64> = (100..108).collect();
    m.allocate_tokens(4, &[], b"", 0).unwrap();
    m.append_slots(4, 8, Some(&q)).unwrap();
    assert_eq!(
        m.allocate_tokens(5, &q, b"", 0).unwrap(),
        0,
        "appended K/V hit"
    );
    m.mark_computed(4, 8).unwrap();
    assert_eq!(m.allocate_tokens(6, &q, b"", 0).unwrap(), 4);
    m.check_invariants().unwrap();
}

/// A tree step's commit with token ids registers the blocks it fills (its forward wrote
/// them and read the whole prefix).
#[test]
fn tree_commit_registers_the_blocks_it_fills() {
    let mut m = BlockManager::new(16, 4, true).unwrap();
    let p: Vec<i64> = (0..9).collect();
    assert_eq!(m.allocate_cached_prefix(0, &p, b"s", 3).unwrap(), 0);
    m.reserve_tree(0, 9).unwrap();
    assert_eq!(m.allocate_tokens(1, &p, b"s", 3).unwrap(), 0);
    let all: Vec<i64> = (0..9).collect();
    m.commit(0, &all, Some(&p)).unwrap();
    assert_eq!(m.allocate_cached_prefix(2, &p, b"s", 3).unwrap(), 8);
    // A commit without ids stops registration: nothing further becomes hittable.
    m.reserve_tree(0, 4).unwrap();
    m.commit(0, &[0, 1, 2, 3], None).unwrap();
    assert_eq!(m.num_cached_blocks(), 2);
    m.check_invariants().unwrap();
}

/// Equal prompts under different cache salts (or extra keys) share no block.
#[test]
fn cache_salt_separates_equal_prompts() {
    let mut m = BlockManager::new(32, 4, true).unwrap();
    let p: Vec<i64> = (0..13).collect();
    let start = |m: &mut BlockManager, seq, salt: &[u8], extra| {
        let hit = m.allocate_tokens(seq, &p, salt, extra).unwrap();
        m.mark_computed(seq, p.len()).unwrap();
        hit
    };
    assert_eq!(start(&mut m, 0, b"tenant-a", 0), 0);
    assert_eq!(start(&mut m, 1, b"tenant-b", 0), 0);
    assert_eq!(start(&mut m, 2, b"", 0), 0);
    assert_eq!(start(&mut m, 3, b"tenant-a", 1), 0);
    let tables: Vec<Vec<u32>> = (0..4).map(|s| m.block_table(s).unwrap()).collect();
    for i in 0..4 {
        for j in 0..i {
            assert!(
                tables[i].iter().all(|b| !tables[j].contains(b)),
                "sequences {i} and {j} share a block"
            );
        }
    }
    assert_eq!(start(&mut m, 4, b"tenant-b", 0), 12, "the same salt hits");
    assert_eq!(m.block_table(4).unwrap()[..3], tables[1][..3]);
}
