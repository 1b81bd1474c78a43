//! Bindings of `specdec_core::kv`: `BlockManager` as a `#[pyclass]` newtype. Slot ids, block
//! ids and block tables come back as int32 numpy arrays (they index torch tensors directly);
//! copy pairs come back as `[k, 2]` int32 arrays `(src, dst)`.

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use specdec_core::kv::{self as core, KvError};

use crate::arrays::{as_slice, vec1, vec2};
use crate::errors::OrRaise;

type Arr<'py> = Bound<'py, PyAny>;

fn pairs<'py>(py: Python<'py>, p: impl IntoIterator<Item = (i32, i32)>) -> PyResult<Arr<'py>> {
    let flat: Vec<i32> = p.into_iter().flat_map(|(a, b)| [a, b]).collect();
    let rows = flat.len() / 2;
    vec2(py, flat, rows, 2)
}

/// `(slots, offsets, cow)` of a batched reservation or append, as numpy arrays.
fn reserve_batch_to_py<'py>(
    py: Python<'py>,
    b: core::ReserveBatch,
) -> PyResult<(Arr<'py>, Arr<'py>, Arr<'py>)> {
    let offsets: Vec<i64> = b.offsets.iter().map(|&o| o as i64).collect();
    Ok((
        vec1(py, b.slots).into_any(),
        vec1(py, offsets).into_any(),
        block_pairs(py, b.cow)?,
    ))
}

fn block_pairs<'py>(
    py: Python<'py>,
    p: impl IntoIterator<Item = (u32, u32)>,
) -> PyResult<Arr<'py>> {
    pairs(py, p.into_iter().map(|(a, b)| (a as i32, b as i32)))
}

fn i32s(v: &[u32]) -> Vec<i32> {
    v.iter().map(|&b| b as i32).collect()
}

fn to_counts(v: &[i64], what: &str) -> Result<Vec<usize>, KvError> {
    v.iter()
        .map(|&c| {
            usize::try_from(c)
                .map_err(|_| KvError::Invalid(format!("{what} must be >= 0, got {c}")))
        })
        .collect()
}

/// Paged KV bookkeeping: a pool of `num_blocks` blocks of `block_size` slots with refcounts,
/// an LRU free queue, per-sequence block tables, tentative tree slots, beams and (optionally)
/// a prefix cache. A refused operation raises a `KVCacheError` subclass and changes nothing.
#[pyclass(name = "BlockManager", module = "specdec._core")]
pub struct BlockManager(core::BlockManager);

#[pymethods]
impl BlockManager {
    #[new]
    #[pyo3(signature = (num_blocks, block_size, prefix_caching=false))]
    fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> PyResult<Self> {
        Ok(BlockManager(
            core::BlockManager::new(num_blocks, block_size, prefix_caching).or_raise()?,
        ))
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.0.block_size()
    }
    #[getter]
    fn num_blocks(&self) -> usize {
        self.0.num_blocks()
    }
    #[getter]
    fn prefix_caching(&self) -> bool {
        self.0.prefix_caching()
    }
    fn num_free_blocks(&self) -> usize {
        self.0.num_free_blocks()
    }
    fn num_cached_blocks(&self) -> usize {
        self.0.num_cached_blocks()
    }
    fn can_allocate(&self, num_tokens: usize) -> bool {
        self.0.can_allocate(num_tokens)
    }
    fn __len__(&self) -> usize {
        self.0.num_sequences()
    }
    fn __contains__(&self, seq: u64) -> bool {
        self.0.contains(seq)
    }
    fn sequences(&self) -> Vec<u64> {
        let mut s = self.0.sequences();
        s.sort_unstable();
        s
    }
    /// `(committed, tentative)` token counts.
    fn seq_len(&self, seq: u64) -> PyResult<(usize, usize)> {
        self.0.seq_len(seq).or_raise()
    }
    fn block_table<'py>(&self, py: Python<'py>, seq: u64) -> PyResult<Arr<'py>> {
        Ok(vec1(py, i32s(self.0.block_table(seq).or_raise()?)).into_any())
    }
    fn slot_mapping<'py>(
        &self,
        py: Python<'py>,
        seq: u64,
        start: usize,
        n: usize,
    ) -> PyResult<Arr<'py>> {
        Ok(vec1(py, self.0.slot_mapping(seq, start, n).or_raise()?).into_any())
    }
    /// Refcount of every block (int32 `[num_blocks]`).
    fn refcounts<'py>(&self, py: Python<'py>) -> Arr<'py> {
        vec1(py, i32s(self.0.refcounts())).into_any()
    }
    /// Free blocks, least recently freed (next evicted) first.
    fn free_queue<'py>(&self, py: Python<'py>) -> Arr<'py> {
        vec1(py, i32s(&self.0.free_queue())).into_any()
    }
    /// Recompute every structural invariant; raises `KVCacheError` naming the first broken.
    fn check_invariants(&self) -> PyResult<()> {
        self.0
            .check_invariants()
            .map_err(KvError::Invalid)
            .or_raise()
    }

    fn allocate(&mut self, seq: u64, num_tokens: usize) -> PyResult<()> {
        self.0.allocate(seq, num_tokens).or_raise()
    }
    /// Start `seq` with these token ids, reusing cached full blocks; returns the number of
    /// leading tokens whose K/V is already stored.
    #[pyo3(signature = (seq, tokens, extra_key=0))]
    fn allocate_tokens(
        &mut self,
        seq: u64,
        tokens: PyReadonlyArray1<'_, i64>,
        extra_key: u64,
    ) -> PyResult<usize> {
        self.0
            .allocate_tokens(seq, &as_slice(&tokens), extra_key)
            .or_raise()
    }
    /// Start `seq` with only the cached prefix of `tokens` (whole blocks, at most
    /// `len - 1` tokens); returns its length. Run the rest as a step and commit it with
    /// its token ids.
    #[pyo3(signature = (seq, tokens, extra_key=0))]
    fn allocate_cached_prefix(
        &mut self,
        seq: u64,
        tokens: PyReadonlyArray1<'_, i64>,
        extra_key: u64,
    ) -> PyResult<usize> {
        self.0
            .allocate_cached_prefix(seq, &as_slice(&tokens), extra_key)
            .or_raise()
    }
    /// Append `n` committed slots: `(slots, cow)`.
    #[pyo3(signature = (seq, n, tokens=None))]
    fn append_slots<'py>(
        &mut self,
        py: Python<'py>,
        seq: u64,
        n: usize,
        tokens: Option<PyReadonlyArray1<'py, i64>>,
    ) -> PyResult<(Arr<'py>, Arr<'py>)> {
        let t = tokens.as_ref().map(as_slice);
        let a = self.0.append_slots(seq, n, t.as_deref()).or_raise()?;
        Ok((vec1(py, a.slots).into_any(), block_pairs(py, a.cow)?))
    }
    /// Keep only the first `length` committed tokens (outside a step).
    fn truncate(&mut self, seq: u64, length: usize) -> PyResult<()> {
        self.0.truncate_seq(seq, length).or_raise()
    }
    /// Whether block `block` is registered in the prefix cache.
    fn is_cached(&self, block: u32) -> bool {
        self.0.is_cached(block)
    }
    fn fork(&mut self, parent: u64, child: u64) -> PyResult<()> {
        self.0.fork(parent, child).or_raise()
    }
    fn free(&mut self, seq: u64) -> PyResult<()> {
        self.0.free(seq).or_raise()
    }
    /// Reserve `n` tentative slots for a tree's nodes: `(slots, cow)`.
    fn reserve_tree<'py>(
        &mut self,
        py: Python<'py>,
        seq: u64,
        n: usize,
    ) -> PyResult<(Arr<'py>, Arr<'py>)> {
        let a = self.0.reserve_tree(seq, n).or_raise()?;
        Ok((vec1(py, a.slots).into_any(), block_pairs(py, a.cow)?))
    }
    /// Keep the accepted nodes; returns the `[m, 2]` `(src_slot, dst_slot)` moves.
    #[pyo3(signature = (seq, accepted, tokens=None))]
    fn commit<'py>(
        &mut self,
        py: Python<'py>,
        seq: u64,
        accepted: PyReadonlyArray1<'py, i64>,
        tokens: Option<PyReadonlyArray1<'py, i64>>,
    ) -> PyResult<Arr<'py>> {
        let t = tokens.as_ref().map(as_slice);
        let moves = self
            .0
            .commit(seq, &as_slice(&accepted), t.as_deref())
            .or_raise()?;
        pairs(py, moves)
    }
    fn rollback(&mut self, seq: u64) -> PyResult<()> {
        self.0.rollback(seq).or_raise()
    }
    /// One decode step's reservations: `(slots, offsets, cow)`; all or nothing.
    fn reserve_tree_batch<'py>(
        &mut self,
        py: Python<'py>,
        seqs: PyReadonlyArray1<'py, u64>,
        counts: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<(Arr<'py>, Arr<'py>, Arr<'py>)> {
        let (seqs, c) = (as_slice(&seqs), as_slice(&counts));
        let c = to_counts(&c, "node counts").or_raise()?;
        let m = &mut self.0;
        let b = py.detach(|| m.reserve_tree_batch(&seqs, &c)).or_raise()?;
        reserve_batch_to_py(py, b)
    }
    /// One decode step's commits (`accepted[offsets[i]:offsets[i+1]]` for `seqs[i]`):
    /// `(src_slots, dst_slots)`; all or nothing.
    #[pyo3(signature = (seqs, accepted, offsets, tokens=None))]
    fn commit_batch<'py>(
        &mut self,
        py: Python<'py>,
        seqs: PyReadonlyArray1<'py, u64>,
        accepted: PyReadonlyArray1<'py, i64>,
        offsets: PyReadonlyArray1<'py, i64>,
        tokens: Option<PyReadonlyArray1<'py, i64>>,
    ) -> PyResult<(Arr<'py>, Arr<'py>)> {
        let (seqs, acc, off) = (as_slice(&seqs), as_slice(&accepted), as_slice(&offsets));
        let off = to_counts(&off, "offsets").or_raise()?;
        let t = tokens.as_ref().map(as_slice);
        let t = t.as_deref();
        let m = &mut self.0;
        let b = py
            .detach(|| m.commit_batch(&seqs, &acc, &off, t))
            .or_raise()?;
        Ok((vec1(py, b.src).into_any(), vec1(py, b.dst).into_any()))
    }
    /// `append_slots` for many sequences: `(slots, offsets, cow)`; all or nothing.
    fn append_slots_batch<'py>(
        &mut self,
        py: Python<'py>,
        seqs: PyReadonlyArray1<'py, u64>,
        counts: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<(Arr<'py>, Arr<'py>, Arr<'py>)> {
        let (seqs, c) = (as_slice(&seqs), as_slice(&counts));
        let c = to_counts(&c, "slot counts").or_raise()?;
        let m = &mut self.0;
        let b = py.detach(|| m.append_slots_batch(&seqs, &c)).or_raise()?;
        reserve_batch_to_py(py, b)
    }
    /// `allocate` for many new sequences; all or nothing.
    fn allocate_batch(
        &mut self,
        seqs: PyReadonlyArray1<'_, u64>,
        counts: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<()> {
        let c = to_counts(&as_slice(&counts), "token counts").or_raise()?;
        self.0.allocate_batch(&as_slice(&seqs), &c).or_raise()
    }
    /// `fork(parents[i], children[i])` for all `i`; all or nothing.
    fn fork_batch(
        &mut self,
        parents: PyReadonlyArray1<'_, u64>,
        children: PyReadonlyArray1<'_, u64>,
    ) -> PyResult<()> {
        self.0
            .fork_batch(&as_slice(&parents), &as_slice(&children))
            .or_raise()
    }
    /// `free` for many sequences; all or nothing.
    fn free_batch(&mut self, seqs: PyReadonlyArray1<'_, u64>) -> PyResult<()> {
        self.0.free_batch(&as_slice(&seqs)).or_raise()
    }
    /// Beam `beams[i]` continues `beams[parents[i]]` (shared blocks, no copy).
    fn reorder(&mut self, beams: Vec<u64>, parents: Vec<i64>) -> PyResult<()> {
        let p = to_counts(&parents, "parent indices").or_raise()?;
        self.0.reorder(&beams, &p).or_raise()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BlockManager>()?;
    Ok(())
}
