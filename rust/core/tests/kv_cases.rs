//! Hand-checked cases of the paged-KV manager: every refusal (with the state unchanged),
//! LRU eviction order, prefix hits after free, beams sharing and copying their tail.

use specdec_core::kv::{BlockManager, KvError};
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
        m.allocate_tokens(2, &[0; 9], 0).map(|_| ())
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
    assert_eq!(m.allocate_tokens(0, &toks, 0).unwrap(), 0);
    let t0 = m.block_table(0).unwrap().to_vec();
    assert_eq!(
        m.allocate_tokens(1, &toks, 0).unwrap(),
        4,
        "two full blocks hit"
    );
    assert_eq!(m.block_table(1).unwrap()[..2], t0[..2]);
    assert_eq!(
        m.allocate_tokens(2, &toks, 7).unwrap(),
        0,
        "another extra key misses"
    );
    m.free(2).unwrap();
    m.free(1).unwrap();
    m.free(0).unwrap();
    assert_eq!(m.num_free_blocks(), 8);
    // Freed cached blocks still hit.
    assert_eq!(
        m.allocate_tokens(3, &toks[..4], 0).unwrap(),
        2,
        "at most len-1 tokens come from the cache"
    );
    assert_eq!(m.allocate_tokens(4, &toks, 0).unwrap(), 4);
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
    assert_eq!(m.allocate_tokens(7, &toks, 0).unwrap(), 0);
}

#[test]
fn truncate_keeps_cached_blocks_immutable() {
    let mut m = BlockManager::new(8, 4, true).unwrap();
    let toks = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    m.allocate_tokens(0, &toks, 0).unwrap(); // blocks 0 and 1 full and cached
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
        m.allocate_tokens(1, &toks, 0).unwrap(),
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
