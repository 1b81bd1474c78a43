//! Bindings of `specdec_core::kv`: `BlockManager` as a `#[pyclass]` newtype. Slot ids, block
//! ids and block tables come back as int32 numpy arrays (they index torch tensors directly);
//! copy pairs come back as `[k, 2]` int32 arrays `(src, dst)`.

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use specdec_core::kv::{self as core, KvError};

use crate::arrays::{as_slice, vec1, LazyArray};
use crate::errors::{kv_arg, raise, Class, OrRaise};
use crate::locked::Locked;

type Arr<'py> = Bound<'py, PyAny>;

/// Tentative or appended slots of one call, single or batched: `slots` (int32, sequence i's
/// are `slots[offsets[i]:offsets[i+1]]`), `offsets` (int64, one more than sequences) and
/// `cow`, the `[k, 2]` int32 `(src_block, dst_block)` copies to run before writing a slot.
#[pyclass(frozen, module = "specdec._core", name = "Reservation")]
pub struct Reservation {
    slots: LazyArray<i32>,
    offsets: LazyArray<i64>,
    cow: LazyArray<i32>,
}

impl Reservation {
    fn from_batch(b: core::ReserveBatch) -> Self {
        let offsets: Vec<i64> = b.offsets.iter().map(|&o| o as i64).collect();
        Reservation {
            slots: LazyArray::new(b.slots, None),
            offsets: LazyArray::new(offsets, None),
            cow: LazyArray::new(flat_pairs(b.cow), Some(2)),
        }
    }

    fn single(a: core::Appended) -> Self {
        let n = a.slots.len() as i64;
        Reservation {
            slots: LazyArray::new(a.slots, None),
            offsets: LazyArray::new(vec![0, n], None),
            cow: LazyArray::new(flat_pairs(a.cow), Some(2)),
        }
    }
}

#[pymethods]
impl Reservation {
    #[getter]
    fn slots(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.slots.get(py)
    }
    #[getter]
    fn offsets(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.offsets.get(py)
    }
    #[getter]
    fn cow(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.cow.get(py)
    }
}

/// `(src_block, dst_block)` pairs as a row-major int32 vector.
fn flat_pairs(p: impl IntoIterator<Item = (u32, u32)>) -> Vec<i32> {
    p.into_iter()
        .flat_map(|(a, b)| [a as i32, b as i32])
        .collect()
}

/// Commit moves of one call, single or batched: copy slot `src[i]` to `dst[i]` for all i
/// (gather all, then scatter; int32).
#[pyclass(frozen, module = "specdec._core", name = "CommitMoves")]
pub struct CommitMoves {
    src: LazyArray<i32>,
    dst: LazyArray<i32>,
}

impl CommitMoves {
    fn new(b: core::CommitBatch) -> Self {
        CommitMoves {
            src: LazyArray::new(b.src, None),
            dst: LazyArray::new(b.dst, None),
        }
    }
}

#[pymethods]
impl CommitMoves {
    #[getter]
    fn src(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.src.get(py)
    }
    #[getter]
    fn dst(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.dst.get(py)
    }
}

/// A sequence's token counts: `committed`, and `tentative` (reserved in the open step).
#[pyclass(frozen, module = "specdec._core", name = "SeqLength")]
pub struct SeqLength {
    #[pyo3(get)]
    committed: usize,
    #[pyo3(get)]
    tentative: usize,
}

/// `#[pyo3(from_py_with = salt_arg)]`: a per-request cache salt as bytes: `None` (no salt,
/// the same as `b""` for block hashes), `bytes`, or `str` (its UTF-8). Anything else is a
/// `SpecdecTypeError`: silently hashing, say, `repr(obj)` could make two tenants' salts equal.
fn salt_arg(ob: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u8>>> {
    salt_of(ob, Class::KvCache)
}

/// [`salt_arg`] reporting a str without UTF-8 as `value`.
pub(crate) fn salt_of(ob: &Bound<'_, PyAny>, value: Class) -> PyResult<Option<Vec<u8>>> {
    if let Ok(s) = ob.cast::<PyString>() {
        // A str with lone surrogates has no UTF-8: a bad value, not a bad type.
        let s = s.to_str().map_err(|e| {
            raise(
                value,
                format!("cache_salt is not valid UTF-8: {}", e.value(ob.py())),
            )
        })?;
        return Ok(Some(s.as_bytes().to_vec()));
    }
    bytes_or_none(ob, "cache_salt must be bytes, str or None")
}

/// `None` or the contents of a `bytes` object; any other type is a `SpecdecTypeError`.
fn bytes_or_none(ob: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<Vec<u8>>> {
    if ob.is_none() {
        return Ok(None);
    }
    match ob.cast::<PyBytes>() {
        Ok(b) => Ok(Some(b.as_bytes().to_vec())),
        Err(_) => {
            let ty = ob
                .get_type()
                .name()
                .map_or_else(|_| "?".to_string(), |n| n.to_string());
            Err(raise(Class::Type, format!("{what}, got {ty}")))
        }
    }
}

/// `#[pyo3(from_py_with = parent_arg)]`: `None` or a 32-byte block hash.
fn parent_arg(ob: &Bound<'_, PyAny>) -> PyResult<Option<core::BlockHash>> {
    match bytes_or_none(ob, "parent must be bytes or None")? {
        None => Ok(None),
        Some(p) => p.as_slice().try_into().map(Some).map_err(|_| {
            raise(
                Class::KvCache,
                format!("parent must be a 32-byte block hash, got {} bytes", p.len()),
            )
        }),
    }
}

/// SHA-256 content hash of one full block (the prefix cache's key), over the encoding
/// documented in `specdec.cache.paged`: `parent` is the previous block's 32-byte hash, or
/// `None` for a sequence's first block.
#[pyfunction]
#[pyo3(signature = (parent, tokens, cache_salt=None, extra_key=0))]
fn block_hash<'py>(
    py: Python<'py>,
    #[pyo3(from_py_with = parent_arg)] parent: Option<core::BlockHash>,
    #[pyo3(from_py_with = kv_arg)] tokens: PyReadonlyArray1<'py, i64>,
    #[pyo3(from_py_with = salt_arg)] cache_salt: Option<Vec<u8>>,
    #[pyo3(from_py_with = kv_arg)] extra_key: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let h = core::block_hash(
        parent.as_ref(),
        &as_slice(&tokens),
        cache_salt.as_deref().unwrap_or_default(),
        extra_key,
    );
    Ok(PyBytes::new(py, &h))
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
///
/// Shared across threads: every call takes the manager's lock (see [`Locked`]); the batched
/// calls take it with the GIL released, the others, short, with the GIL held when it is free.
/// No critical section touches a Python object: arguments are converted before, errors and
/// arrays made after.
#[pyclass(frozen, name = "BlockManager", module = "specdec._core")]
pub struct BlockManager(Locked<core::BlockManager>);

type BatchReserve =
    fn(&mut core::BlockManager, &[u64], &[usize]) -> Result<core::ReserveBatch, KvError>;

impl BlockManager {
    /// A batched reservation (tree slots or appended slots) with the GIL released.
    fn reserve_batch(
        &self,
        py: Python<'_>,
        seqs: PyReadonlyArray1<'_, u64>,
        counts: PyReadonlyArray1<'_, i64>,
        what: &str,
        reserve: BatchReserve,
    ) -> PyResult<Reservation> {
        let (seqs, c) = (as_slice(&seqs), as_slice(&counts));
        let c = to_counts(&c, what).or_raise()?;
        let b = self.0.detached(py, |m| reserve(m, &seqs, &c)).or_raise()?;
        Ok(Reservation::from_batch(b))
    }
}

#[pymethods]
impl BlockManager {
    #[new]
    #[pyo3(signature = (num_blocks, block_size, prefix_caching=false))]
    fn new(
        #[pyo3(from_py_with = kv_arg)] num_blocks: usize,
        #[pyo3(from_py_with = kv_arg)] block_size: usize,
        #[pyo3(from_py_with = kv_arg)] prefix_caching: bool,
    ) -> PyResult<Self> {
        Ok(BlockManager(Locked::new(
            core::BlockManager::new(num_blocks, block_size, prefix_caching).or_raise()?,
        )))
    }

    #[getter]
    fn block_size(&self, py: Python<'_>) -> usize {
        self.0.with(py, |m| m.block_size())
    }
    #[getter]
    fn num_blocks(&self, py: Python<'_>) -> usize {
        self.0.with(py, |m| m.num_blocks())
    }
    #[getter]
    fn prefix_caching(&self, py: Python<'_>) -> bool {
        self.0.with(py, |m| m.prefix_caching())
    }
    fn num_free_blocks(&self, py: Python<'_>) -> usize {
        self.0.with(py, |m| m.num_free_blocks())
    }
    fn num_cached_blocks(&self, py: Python<'_>) -> usize {
        self.0.with(py, |m| m.num_cached_blocks())
    }
    fn can_allocate(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] num_tokens: usize,
    ) -> bool {
        self.0.with(py, |m| m.can_allocate(num_tokens))
    }
    fn __len__(&self, py: Python<'_>) -> usize {
        self.0.with(py, |m| m.num_sequences())
    }
    fn __contains__(&self, py: Python<'_>, #[pyo3(from_py_with = kv_arg)] seq: u64) -> bool {
        self.0.with(py, |m| m.contains(seq))
    }
    fn sequences(&self, py: Python<'_>) -> Vec<u64> {
        let mut s = self.0.with(py, |m| m.sequences());
        s.sort_unstable();
        s
    }
    /// Committed and tentative token counts.
    fn seq_len(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] seq: u64,
    ) -> PyResult<SeqLength> {
        let (committed, tentative) = self.0.with(py, |m| m.seq_len(seq)).or_raise()?;
        Ok(SeqLength {
            committed,
            tentative,
        })
    }
    fn block_table<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = kv_arg)] seq: u64,
    ) -> PyResult<Arr<'py>> {
        let t = self
            .0
            .with(py, |m| m.block_table(seq).map(|t| i32s(&t)))
            .or_raise()?;
        Ok(vec1(py, t).into_any())
    }
    fn slot_mapping<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = kv_arg)] seq: u64,
        #[pyo3(from_py_with = kv_arg)] start: usize,
        #[pyo3(from_py_with = kv_arg)] n: usize,
    ) -> PyResult<Arr<'py>> {
        let s = self
            .0
            .with(py, |m| m.slot_mapping(seq, start, n))
            .or_raise()?;
        Ok(vec1(py, s).into_any())
    }
    /// Refcount of every block (int32 `[num_blocks]`).
    fn refcounts<'py>(&self, py: Python<'py>) -> Arr<'py> {
        vec1(py, self.0.with(py, |m| i32s(m.refcounts()))).into_any()
    }
    /// Free blocks, least recently freed (next evicted) first.
    fn free_queue<'py>(&self, py: Python<'py>) -> Arr<'py> {
        vec1(py, self.0.with(py, |m| i32s(&m.free_queue()))).into_any()
    }
    /// Recompute every structural invariant; raises `KVCacheError` naming the first broken.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.0
            .with(py, |m| m.check_invariants())
            .map_err(KvError::Invalid)
            .or_raise()
    }

    fn allocate(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] seq: u64,
        #[pyo3(from_py_with = kv_arg)] num_tokens: usize,
    ) -> PyResult<()> {
        self.0.with(py, |m| m.allocate(seq, num_tokens)).or_raise()
    }
    /// Start `seq` with these token ids, reusing cached full blocks of the same
    /// `cache_salt` and `extra_key`; returns the number of leading tokens whose K/V is
    /// already stored. The rest enter the cache after `mark_computed` (or a commit).
    #[pyo3(signature = (seq, tokens, extra_key=0, cache_salt=None))]
    fn allocate_tokens(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] seq: u64,
        #[pyo3(from_py_with = kv_arg)] tokens: PyReadonlyArray1<'_, i64>,
        #[pyo3(from_py_with = kv_arg)] extra_key: u64,
        #[pyo3(from_py_with = salt_arg)] cache_salt: Option<Vec<u8>>,
    ) -> PyResult<usize> {
        let (tokens, salt) = (as_slice(&tokens), cache_salt.unwrap_or_default());
        self.0
            .with(py, |m| m.allocate_tokens(seq, &tokens, &salt, extra_key))
            .or_raise()
    }
    /// Start `seq` with only the cached prefix of `tokens` (whole blocks, at most
    /// `len - 1` tokens); returns its length. Run the rest as a step and commit it with
    /// its token ids.
    #[pyo3(signature = (seq, tokens, extra_key=0, cache_salt=None))]
    fn allocate_cached_prefix(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] seq: u64,
        #[pyo3(from_py_with = kv_arg)] tokens: PyReadonlyArray1<'_, i64>,
        #[pyo3(from_py_with = kv_arg)] extra_key: u64,
        #[pyo3(from_py_with = salt_arg)] cache_salt: Option<Vec<u8>>,
    ) -> PyResult<usize> {
        let (tokens, salt) = (as_slice(&tokens), cache_salt.unwrap_or_default());
        self.0
            .with(py, |m| {
                m.allocate_cached_prefix(seq, &tokens, &salt, extra_key)
            })
            .or_raise()
    }
    /// The K/V of the first `num_tokens` committed tokens is written: their full blocks may
    /// enter the prefix cache.
    fn mark_computed(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] seq: u64,
        #[pyo3(from_py_with = kv_arg)] num_tokens: usize,
    ) -> PyResult<()> {
        self.0
            .with(py, |m| m.mark_computed(seq, num_tokens))
            .or_raise()
    }
    /// Append `n` committed slots (their K/V is written after the call, so `tokens` are
    /// recorded but cached only after `mark_computed` or the next commit).
    #[pyo3(signature = (seq, n, tokens=None))]
    fn append_slots<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = kv_arg)] seq: u64,
        #[pyo3(from_py_with = kv_arg)] n: usize,
        #[pyo3(from_py_with = kv_arg)] tokens: Option<PyReadonlyArray1<'py, i64>>,
    ) -> PyResult<Reservation> {
        let t = tokens.as_ref().map(as_slice);
        let t = t.as_deref();
        let a = self.0.with(py, |m| m.append_slots(seq, n, t)).or_raise()?;
        Ok(Reservation::single(a))
    }
    /// Keep only the first `length` committed tokens (outside a step).
    fn truncate(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] seq: u64,
        #[pyo3(from_py_with = kv_arg)] length: usize,
    ) -> PyResult<()> {
        self.0.with(py, |m| m.truncate_seq(seq, length)).or_raise()
    }
    /// Whether block `block` is registered in the prefix cache.
    fn is_cached(&self, py: Python<'_>, #[pyo3(from_py_with = kv_arg)] block: u32) -> bool {
        self.0.with(py, |m| m.is_cached(block))
    }
    fn fork(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] parent: u64,
        #[pyo3(from_py_with = kv_arg)] child: u64,
    ) -> PyResult<()> {
        self.0.with(py, |m| m.fork(parent, child)).or_raise()
    }
    fn free(&self, py: Python<'_>, #[pyo3(from_py_with = kv_arg)] seq: u64) -> PyResult<()> {
        self.0.with(py, |m| m.free(seq)).or_raise()
    }
    /// Reserve `n` tentative slots for a tree's nodes.
    fn reserve_tree(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] seq: u64,
        #[pyo3(from_py_with = kv_arg)] n: usize,
    ) -> PyResult<Reservation> {
        let a = self.0.with(py, |m| m.reserve_tree(seq, n)).or_raise()?;
        Ok(Reservation::single(a))
    }
    /// Keep the accepted nodes (indices into the step's nodes); returns the slot moves.
    #[pyo3(signature = (seq, accepted, tokens=None))]
    fn commit<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = kv_arg)] seq: u64,
        #[pyo3(from_py_with = kv_arg)] accepted: PyReadonlyArray1<'py, i64>,
        #[pyo3(from_py_with = kv_arg)] tokens: Option<PyReadonlyArray1<'py, i64>>,
    ) -> PyResult<CommitMoves> {
        let t = tokens.as_ref().map(as_slice);
        let (t, acc) = (t.as_deref(), as_slice(&accepted));
        let moves = self.0.with(py, |m| m.commit(seq, &acc, t)).or_raise()?;
        let (src, dst) = moves.into_iter().unzip();
        Ok(CommitMoves::new(core::CommitBatch { src, dst }))
    }
    fn rollback(&self, py: Python<'_>, #[pyo3(from_py_with = kv_arg)] seq: u64) -> PyResult<()> {
        self.0.with(py, |m| m.rollback(seq)).or_raise()
    }
    /// One decode step's reservations; all or nothing.
    fn reserve_tree_batch<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = kv_arg)] seqs: PyReadonlyArray1<'py, u64>,
        #[pyo3(from_py_with = kv_arg)] counts: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Reservation> {
        self.reserve_batch(
            py,
            seqs,
            counts,
            "node counts",
            core::BlockManager::reserve_tree_batch,
        )
    }
    /// One decode step's commits (`accepted[offsets[i]:offsets[i+1]]` for `seqs[i]`):
    /// all or nothing.
    #[pyo3(signature = (seqs, accepted, offsets, tokens=None))]
    fn commit_batch<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = kv_arg)] seqs: PyReadonlyArray1<'py, u64>,
        #[pyo3(from_py_with = kv_arg)] accepted: PyReadonlyArray1<'py, i64>,
        #[pyo3(from_py_with = kv_arg)] offsets: PyReadonlyArray1<'py, i64>,
        #[pyo3(from_py_with = kv_arg)] tokens: Option<PyReadonlyArray1<'py, i64>>,
    ) -> PyResult<CommitMoves> {
        let (seqs, acc, off) = (as_slice(&seqs), as_slice(&accepted), as_slice(&offsets));
        let off = to_counts(&off, "offsets").or_raise()?;
        let t = tokens.as_ref().map(as_slice);
        let t = t.as_deref();
        let b = self
            .0
            .detached(py, |m| m.commit_batch(&seqs, &acc, &off, t))
            .or_raise()?;
        Ok(CommitMoves::new(b))
    }
    /// `append_slots` for many sequences; all or nothing.
    fn append_slots_batch<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = kv_arg)] seqs: PyReadonlyArray1<'py, u64>,
        #[pyo3(from_py_with = kv_arg)] counts: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Reservation> {
        self.reserve_batch(
            py,
            seqs,
            counts,
            "slot counts",
            core::BlockManager::append_slots_batch,
        )
    }
    /// `allocate` for many new sequences; all or nothing.
    fn allocate_batch(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] seqs: PyReadonlyArray1<'_, u64>,
        #[pyo3(from_py_with = kv_arg)] counts: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<()> {
        let c = to_counts(&as_slice(&counts), "token counts").or_raise()?;
        let seqs = as_slice(&seqs);
        self.0.with(py, |m| m.allocate_batch(&seqs, &c)).or_raise()
    }
    /// `fork(parents[i], children[i])` for all `i`; all or nothing.
    fn fork_batch(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] parents: PyReadonlyArray1<'_, u64>,
        #[pyo3(from_py_with = kv_arg)] children: PyReadonlyArray1<'_, u64>,
    ) -> PyResult<()> {
        let (p, c) = (as_slice(&parents), as_slice(&children));
        self.0.with(py, |m| m.fork_batch(&p, &c)).or_raise()
    }
    /// `free` for many sequences; all or nothing.
    fn free_batch(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] seqs: PyReadonlyArray1<'_, u64>,
    ) -> PyResult<()> {
        let seqs = as_slice(&seqs);
        self.0.with(py, |m| m.free_batch(&seqs)).or_raise()
    }
    /// Beam `beams[i]` continues `beams[parents[i]]` (shared blocks, no copy).
    fn reorder(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = kv_arg)] beams: Vec<u64>,
        #[pyo3(from_py_with = kv_arg)] parents: Vec<i64>,
    ) -> PyResult<()> {
        let p = to_counts(&parents, "parent indices").or_raise()?;
        self.0.with(py, |m| m.reorder(&beams, &p)).or_raise()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BlockManager>()?;
    m.add_class::<Reservation>()?;
    m.add_class::<CommitMoves>()?;
    m.add_class::<SeqLength>()?;
    m.add_function(wrap_pyfunction!(block_hash, m)?)?;
    Ok(())
}
