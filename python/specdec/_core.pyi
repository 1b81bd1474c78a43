"""Type stub of the Rust extension ``specdec._core`` (kept true by ``mypy.stubtest`` in
``make lint``). The public API is the Python package; these are its building blocks.

Every refusal raises a :class:`specdec.SpecdecError` subclass (``TreeError``,
``KVCacheError`` and its subclasses, ``GrammarError``, ``DraftError``, ``SpecdecTypeError``)
and changes nothing."""

import builtins
from collections.abc import Sequence
from typing import Literal, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Self

__version__: str

# ---- tree ---------------------------------------------------------------------------------
@final
class TreeArrays:
    """A draft tree's arrays, built and checked in Rust: node arrays of length ``n`` (root at
    0, padding nodes after the ``num_real`` real ones), ancestor bits ``[n, ceil(n/64)]``,
    and the walk's child links derived on first use."""

    def __new__(
        cls,
        tokens: npt.NDArray[np.int64],
        parents: npt.NDArray[np.int32],
        depths: npt.NDArray[np.int32] | None = None,
        logprobs: npt.NDArray[np.float64] | None = None,
        expected: float | None = None,
    ) -> Self:
        """Check node arrays given from outside (root first, parents before children, depth =
        parent's + 1, padding last) and derive the ancestor bits."""

    @property
    def tokens(self) -> npt.NDArray[np.int64]:
        """Token of each node (the root's is the last committed or bonus token)."""

    @property
    def parents(self) -> npt.NDArray[np.int32]:
        """Parent of each node (-1: the root, or a padding node)."""

    @property
    def depths(self) -> npt.NDArray[np.int32]:
        """Depth of each node (root and padding 0)."""

    @property
    def logprobs(self) -> npt.NDArray[np.float64]:
        """Cumulative drafter log-prob of each node's prefix (root 0, padding -inf)."""

    @property
    def bits(self) -> npt.NDArray[np.uint64]:
        """Ancestor bits: bit j of row i set iff node j is i or an ancestor of i."""

    @property
    def expected(self) -> float | None:
        """Expected acceptance if known (NaN: unscored tree); None: sum it from logprobs."""

    @property
    def num_real(self) -> int:
        """Nodes before the padding (root included)."""

    @property
    def first_child(self) -> npt.NDArray[np.int32]:
        """First child of each node (-1: leaf), derived and checked on first use."""

    @property
    def next_sibling(self) -> npt.NDArray[np.int32]:
        """Next child of the same parent in index order (-1: last)."""

    def attention_mask(
        self, prefix_len: int, additive: bool = False
    ) -> npt.NDArray[np.bool_] | npt.NDArray[np.float32]:
        """Dense ``[n, prefix_len + n]`` mask: bool (True = visible) or float32 0 / -inf."""

    def position_ids(self, prefix_len: int) -> npt.NDArray[np.int64]:
        """``prefix_len + depth`` per node."""

    def retrieve_indices(self) -> npt.NDArray[np.int32]:
        """One row per leaf: node indices from the root, padded with -1."""

    def padded(self, budget: int, pad_token: int) -> TreeArrays:
        """The real nodes padded to ``budget`` drafted nodes."""

    def with_root(self, token: int) -> TreeArrays:
        """The same tree with the root's token set."""

    def __len__(self) -> int: ...

@final
class WalkOutcome:
    """The verifier walk's result."""

    @property
    def accepted(self) -> npt.NDArray[np.int32]:
        """Accepted node indices, root to leaf (root excluded)."""

    @property
    def bonus_token(self) -> int:
        """The verifier's token after the last accepted node."""

def build_ddtree(
    logprobs: npt.NDArray[np.float32],
    token_ids: npt.NDArray[np.int64],
    budget: int,
    root_token: int = -1,
    min_logprob: float | None = None,
    check_duplicates: bool = True,
) -> TreeArrays:
    """The best-first DDTree of at most ``budget`` drafted nodes from ``[L, K]`` marginals."""

def build_ddtree_batch(
    logprobs: npt.NDArray[np.float32],
    token_ids: npt.NDArray[np.int64],
    budgets: npt.NDArray[np.int64],
    root_tokens: npt.NDArray[np.int64] | None = None,
    min_logprob: float | None = None,
    check_duplicates: bool = True,
) -> list[TreeArrays]:
    """R DDTrees from ``[R, L, K]`` marginals, in parallel with the GIL released."""

def tree_from_branches(branches: list[list[int]], root_token: int = -1) -> TreeArrays:
    """Explicit token paths merged into one tree, shared prefixes once."""

def walk(tree: TreeArrays, chosen: npt.NDArray[np.int64]) -> WalkOutcome:
    """Descend while the verifier's chosen token at the current node is a child's token."""

def walk_batch(trees: list[TreeArrays], chosen: npt.NDArray[np.int64]) -> list[WalkOutcome]:
    """:func:`walk` for R trees; row i of ``[R, n_max]`` ``chosen`` belongs to tree i."""

# ---- draft --------------------------------------------------------------------------------
@final
class SuffixIndex:
    """A suffix index over one request's own tokens: for each context length up to
    ``max_match``, the occurrences of every m-gram. Safe to share between threads (a second
    caller waits). Bad input raises ``DraftError`` (``TreeError`` for budgets and token ids)
    and changes nothing."""

    def __new__(cls, max_match: int = 8) -> Self: ...
    @property
    def max_match(self) -> int: ...
    def __len__(self) -> int: ...
    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the request's own sequence."""

    def propose(
        self,
        context: Sequence[int],
        max_depth: int,
        budget: int,
        min_prob: float = 0.0,
        corpus: SuffixCorpus | None = None,
        cache_salt: bytes | str | None = None,
        min_match: int = 1,
        depth_factor: float | None = None,
    ) -> TreeArrays:
        """The tree of the ``budget`` most frequent continuations of ``context`` (root: its last
        token), best-first by path probability, ``logprobs`` = log path probabilities; pooled
        over this index and the ``cache_salt`` partition of ``corpus`` (same ``max_match``),
        whose sequences drafted from become its most recently used. Only a context suffix of
        at least ``min_match`` tokens matches; with ``depth_factor`` the tree is at most
        ``floor(depth_factor * matched length)`` tokens deep (at least 1)."""

@final
class SuffixCorpus:
    """Earlier outputs shared by requests: one partition per cache salt (``None`` is its own,
    a str salt is its UTF-8), at most ``max_tokens`` tokens over all of them; past the bound,
    least recently used sequences leave first (used: added, or drafted from). Safe to share
    between threads."""

    def __new__(cls, max_match: int = 8, max_tokens: int = 262144) -> Self: ...
    @property
    def max_match(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def num_tokens(self) -> int:
        """Tokens held over every partition."""

    @property
    def num_partitions(self) -> int:
        """Salts that hold at least one sequence."""

    def __len__(self) -> int: ...
    def __contains__(self, key: object, /) -> bool: ...
    def ids_by_use(self) -> list[int]:
        """The held sequence ids, least recently used first."""

    def add(self, tokens: Sequence[int], cache_salt: bytes | str | None = None) -> int:
        """Add an earlier output under ``cache_salt``, evicting least recently used sequences
        until it fits (``DraftError`` when longer than the whole bound); returns its id."""

    def remove(self, id: int) -> None:
        """Drop a held sequence (``DraftError`` when it is not held)."""

# ---- decode -------------------------------------------------------------------------------
CALIBRATION_BIN_EDGES: list[float]
"""Upper edges of the adaptive budget's conditional-probability bins (the last, +inf, left
out)."""

@final
class BudgetTally:
    """One observed tree's nodes that its step decided: their values as the budget priced
    them before the step (``predicted``, summed) and how many were accepted
    (``realised``); nothing for a tree without probabilities."""

    @property
    def predicted(self) -> float: ...
    @property
    def realised(self) -> float: ...

@final
class BudgetGains:
    """Per size ``b`` in ``0..=most``: the requests' summed expected acceptance and the
    candidate each request takes at that size."""

    @property
    def gains(self) -> npt.NDArray[np.float64]:
        """``[most + 1]``."""

    @property
    def picks(self) -> npt.NDArray[np.int64]:
        """``[requests, most + 1]`` (the first of tied candidates)."""

@final
class BudgetStats:
    """What the adaptive budget has learnt from verified steps: per-node calibration (per
    depth class and conditional-probability bin), size calibration (per rank band), and
    per-depth acceptance for trees without probabilities. The shrinkage settings come with
    every call. Bad input raises ``ConfigError`` and changes nothing."""

    def __new__(cls) -> Self: ...
    def calibration(
        self, *, prior: float, prior_weight: float, band_optimism: float
    ) -> npt.NDArray[np.float64]:
        """``[2, bins]``: per depth class (depth 1, deeper) and bin, the calibration ratio."""

    def band_factors(
        self,
        bands: int,
        *,
        prior: float,
        prior_weight: float,
        band_optimism: float,
        source: int = 0,
    ) -> npt.NDArray[np.float64]:
        """``[bands]``: per rank band of ``source``'s trees (a request's candidate
        position), the size calibration's factor."""

    def node_values(
        self,
        tree: TreeArrays,
        *,
        prior: float,
        prior_weight: float,
        band_optimism: float,
        sized: bool = True,
        source: int = 0,
    ) -> npt.NDArray[np.float64]:
        """Each drafted node's expected contribution to the acceptance length; ``sized=False``:
        before the size calibration (``source``'s)."""

    def choose(
        self,
        candidates: Sequence[Sequence[TreeArrays]],
        most: int,
        *,
        prior: float,
        prior_weight: float,
        band_optimism: float,
        pick: Literal["drafted", "calibrated"] = "drafted",
        scales: Sequence[Sequence[float]] | None = None,
    ) -> BudgetGains:
        """Per request (its candidate trees) and size ``0..=most``: the candidate ranked
        highest at that size (``pick``: by the drafters' path probabilities summed, or by
        the node values), and the requests' summed values of the picked candidates.
        ``scales``: per request, one factor per candidate, on its node values (each at
        most 1 after)."""

    def observe(
        self,
        tree: TreeArrays,
        accepted: npt.NDArray[np.int64] | int,
        *,
        prior: float,
        prior_weight: float,
        band_optimism: float,
        source: int = 0,
    ) -> BudgetTally:
        """Learn from a verified tree: its accepted node indices (root excluded) or their
        count (the likeliest path's first nodes). Returns its nodes' tally."""

    def observe_path(
        self,
        tree: TreeArrays,
        path: npt.NDArray[np.int64],
        *,
        prior: float,
        prior_weight: float,
        band_optimism: float,
        source: int = 0,
    ) -> BudgetTally:
        """Learn from a drafted tree the step's rule decided beyond the nodes it verified:
        ``path`` is the tokens the step committed (accepted, then the bonus), the rule's
        choice at each depth of its path. A node within the path's length is accepted when
        its tokens are the path's; one below its end counts its calibrated expectation.
        Returns the tally of the nodes the path decides."""

    @property
    def predicted(self) -> npt.NDArray[np.float64]:
        """``[2, bins]``: tried nodes' conditional probabilities summed."""

    @property
    def realised(self) -> npt.NDArray[np.float64]:
        """``[2, bins]``: tried nodes accepted."""

    @property
    def band_predicted(self) -> npt.NDArray[np.float64]:
        """``[sources, bands]``: per source and rank band, observed nodes' values summed (0
        past a source's last band)."""

    @property
    def band_realised(self) -> npt.NDArray[np.float64]:
        """``[sources, bands]``: per source and rank band, observed nodes accepted."""

    @property
    def tried(self) -> npt.NDArray[np.float64]:
        """Per depth: verified trees that reached it."""

    @property
    def reached(self) -> npt.NDArray[np.float64]:
        """Per depth: steps that accepted that deep."""

# ---- kv -----------------------------------------------------------------------------------
@final
class Reservation:
    """Slots reserved or appended by one call (single or batched)."""

    @property
    def slots(self) -> npt.NDArray[np.int32]:
        """Slot ids (``block * block_size + offset``); sequence i's are
        ``slots[offsets[i]:offsets[i + 1]]``."""

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """One more entry than sequences."""

    @property
    def cow(self) -> npt.NDArray[np.int32]:
        """``[k, 2]`` ``(src_block, dst_block)`` copies to run before writing any slot."""

@final
class CommitMoves:
    """Slot moves of one commit call (single or batched): gather ``src``, scatter to ``dst``."""

    @property
    def src(self) -> npt.NDArray[np.int32]: ...
    @property
    def dst(self) -> npt.NDArray[np.int32]: ...

@final
class SeqLength:
    """A sequence's token counts."""

    @property
    def committed(self) -> int: ...
    @property
    def tentative(self) -> int:
        """Tokens reserved in the open step."""

@final
class BlockManager:
    """Paged KV bookkeeping: refcounted blocks, an LRU free queue, block tables, tentative
    tree slots, beams and an optional prefix cache. A refused call raises a
    ``KVCacheError`` subclass and changes nothing."""

    def __new__(cls, num_blocks: int, block_size: int, prefix_caching: bool = False) -> Self: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def prefix_caching(self) -> bool: ...
    def num_free_blocks(self) -> int: ...
    def num_cached_blocks(self) -> int: ...
    def can_allocate(self, num_tokens: int) -> bool: ...
    def __len__(self) -> int: ...
    def __contains__(self, seq: int, /) -> bool: ...
    def sequences(self) -> list[int]: ...
    def seq_len(self, seq: int) -> SeqLength:
        """Committed and tentative token counts."""

    def block_table(self, seq: int) -> npt.NDArray[np.int32]: ...
    def slot_mapping(self, seq: int, start: int, n: int) -> npt.NDArray[np.int32]: ...
    def refcounts(self) -> npt.NDArray[np.int32]:
        """Refcount of every block."""

    def free_queue(self) -> npt.NDArray[np.int32]:
        """Free blocks, least recently freed (next evicted) first."""

    def check_invariants(self) -> None:
        """Recompute every structural invariant; raises naming the first broken one."""

    def allocate(self, seq: int, num_tokens: int) -> None: ...
    def allocate_tokens(
        self,
        seq: int,
        tokens: npt.NDArray[np.int64],
        extra_key: int = 0,
        cache_salt: bytes | str | None = None,
    ) -> int:
        """Start ``seq`` with these token ids, reusing cached full blocks of the same
        ``cache_salt`` and ``extra_key``; returns how many leading tokens already hold K/V.
        The rest enter the cache after ``mark_computed`` (or a commit)."""

    def allocate_cached_prefix(
        self,
        seq: int,
        tokens: npt.NDArray[np.int64],
        extra_key: int = 0,
        cache_salt: bytes | str | None = None,
    ) -> int:
        """Start ``seq`` with only the cached prefix of ``tokens``; returns its length."""

    def mark_computed(self, seq: int, num_tokens: int) -> None:
        """The K/V of the first ``num_tokens`` committed tokens is written: their full blocks
        may enter the prefix cache."""

    def append_slots(
        self, seq: int, n: int, tokens: npt.NDArray[np.int64] | None = None
    ) -> Reservation:
        """Append ``n`` committed slots (cached only after ``mark_computed`` or a commit)."""

    def truncate(self, seq: int, length: int) -> None: ...
    def is_cached(self, block: int) -> bool: ...
    def fork(self, parent: int, child: int) -> None: ...
    def free(self, seq: int) -> None: ...
    def reserve_tree(self, seq: int, n: int) -> Reservation:
        """Reserve ``n`` tentative slots for a tree's nodes."""

    def commit(
        self,
        seq: int,
        accepted: npt.NDArray[np.int64],
        tokens: npt.NDArray[np.int64] | None = None,
    ) -> CommitMoves:
        """Keep the accepted nodes (indices into the step's nodes)."""

    def rollback(self, seq: int) -> None: ...
    def reserve_tree_batch(
        self, seqs: npt.NDArray[np.uint64], counts: npt.NDArray[np.int64]
    ) -> Reservation:
        """One decode step's reservations; all or nothing."""

    def commit_batch(
        self,
        seqs: npt.NDArray[np.uint64],
        accepted: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        tokens: npt.NDArray[np.int64] | None = None,
    ) -> CommitMoves:
        """One decode step's commits (``accepted[offsets[i]:offsets[i+1]]`` for
        ``seqs[i]``); all or nothing."""

    def append_slots_batch(
        self, seqs: npt.NDArray[np.uint64], counts: npt.NDArray[np.int64]
    ) -> Reservation:
        """``append_slots`` for many sequences; all or nothing."""

    def allocate_batch(
        self, seqs: npt.NDArray[np.uint64], counts: npt.NDArray[np.int64]
    ) -> None: ...
    def fork_batch(
        self, parents: npt.NDArray[np.uint64], children: npt.NDArray[np.uint64]
    ) -> None: ...
    def free_batch(self, seqs: npt.NDArray[np.uint64]) -> None: ...
    def reorder(self, beams: list[int], parents: list[int]) -> None:
        """Beam ``beams[i]`` continues ``beams[parents[i]]`` (shared blocks, no copy)."""

def block_hash(
    parent: bytes | None,
    tokens: npt.NDArray[np.int64],
    cache_salt: bytes | str | None = None,
    extra_key: int = 0,
) -> bytes:
    """SHA-256 content hash of one full block (see ``specdec.cache.paged``)."""

# ---- constrain ----------------------------------------------------------------------------
@final
class Vocabulary:
    """Each token's exact bytes, EOS ids, and the token trie shared by every grammar."""

    def __new__(
        cls, tokens: list[bytes | None], eos_ids: list[int], vocab_size: int | None = None
    ) -> Self: ...
    @staticmethod
    def from_tekken_json(data: bytes, eos_ids: list[int] | None = None) -> Vocabulary: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_ids(self) -> list[int]: ...
    @property
    def num_trie_nodes(self) -> int: ...
    def token_bytes(self, token: int) -> bytes | None: ...

@final
class RegexGrammar:
    """A regex compiled to a byte DFA over one vocabulary, masks cached per state."""

    def __new__(
        cls,
        vocab: Vocabulary,
        pattern: str,
        size_limit: int | None = None,
        cache_bytes: int | None = None,
        precompute_ms: float = 5.0,
    ) -> Self: ...
    @property
    def pattern(self) -> str: ...
    @property
    def num_states(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def cache_bytes(self) -> int: ...
    @property
    def uses_class_trie(self) -> bool: ...
    def brute_force_mask(self, text: bytes) -> npt.NDArray[np.uint32]:
        """The allowed-token mask after ``text``, by trying every token (a test oracle)."""

    def matches(self, text: bytes) -> bool: ...

@final
class CfgGrammar:
    """A context-free grammar over regex lexemes compiled against one vocabulary (Earley
    parser with interned states), masks cached per parser state. Its matchers share a chart
    of at most ``max_states`` states, replaced by a fresh one when full; a step or fill that
    needs more states than that on its own raises ``GrammarError`` for that matcher only."""

    @staticmethod
    def from_gbnf(
        vocab: Vocabulary,
        text: str,
        cache_bytes: int | None = None,
        max_depth: int | None = None,
        max_states: int | None = None,
        max_symbols: int | None = None,
        max_lexer_states: int | None = None,
        size_limit: int | None = None,
    ) -> CfgGrammar: ...
    @staticmethod
    def from_lark(
        vocab: Vocabulary,
        text: str,
        cache_bytes: int | None = None,
        max_depth: int | None = None,
        max_states: int | None = None,
        max_symbols: int | None = None,
        max_lexer_states: int | None = None,
        size_limit: int | None = None,
    ) -> CfgGrammar: ...
    @staticmethod
    def from_json_schema(
        vocab: Vocabulary,
        schema: str,
        whitespace: bool = True,
        item_separator: str = ",",
        key_separator: str = ":",
        closed: bool = False,
        declared_order: bool = False,
        strict: bool = True,
        format_assertion: bool = True,
        cache_bytes: int | None = None,
        max_depth: int | None = None,
        max_states: int | None = None,
        max_symbols: int | None = None,
        max_lexer_states: int | None = None,
        size_limit: int | None = None,
    ) -> CfgGrammar: ...
    @staticmethod
    def from_regex(
        vocab: Vocabulary,
        pattern: str,
        cache_bytes: int | None = None,
        max_states: int | None = None,
        size_limit: int | None = None,
    ) -> CfgGrammar: ...
    @property
    def num_states(self) -> int:
        """Parser states in the current chart (at most ``max_states``)."""

    @property
    def num_rules(self) -> int: ...
    @property
    def approximations(self) -> list[tuple[str, str, str, str]]: ...
    @property
    def num_lexemes(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def cache_bytes(self) -> int: ...
    def brute_force_mask(self, text: bytes) -> npt.NDArray[np.uint32]:
        """The allowed-token mask after ``text``, by trying every token (a test oracle)."""

    def matches(self, text: bytes) -> bool: ...

@final
class Matcher:
    """One sequence's grammar state: O(1) fork, rollback, bitmask fills."""

    def __new__(cls, grammar: RegexGrammar | CfgGrammar) -> Self: ...
    def accept_token(self, token: int) -> bool: ...
    def accept_tokens(self, tokens: list[int]) -> int: ...
    def is_terminated(self) -> bool: ...
    def is_accepting(self) -> bool: ...
    @property
    def num_accepted(self) -> int: ...
    @property
    def state(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    def rollback(self, n: int) -> None: ...
    def reset(self) -> None: ...
    def fork(self) -> Matcher: ...
    def fill_next_token_bitmask(self, bitmask: npt.NDArray[np.int32], row: int = 0) -> None:
        """Fill row ``row`` of an int32 ``[B, >= ceil(V/32)]`` numpy buffer."""
    def forced_paths(
        self, *, max_bytes: int = 64, max_branches: int = 4, levels: int = 2, max_paths: int = 16
    ) -> list[ForcedPath]:
        """Every way the text can go from here (forced bytes, then small choices with their
        forced tails); cached per parser state."""

@final
class ForcedPath:
    """One way the text can go from a matcher's state."""

    @property
    def bytes(self) -> builtins.bytes: ...
    @property
    def eos(self) -> bool: ...
    @property
    def weight(self) -> float: ...
    @property
    def choices(self) -> int: ...

def fill_next_token_bitmask_batch(
    matchers: list[Matcher], bitmask: npt.NDArray[np.int32], rows: list[int] | None = None
) -> None:
    """One row per matcher (``rows[i]``, default ``i``), in parallel."""

def fill_tree_bitmask(
    matcher: Matcher,
    tree: TreeArrays,
    bitmask: npt.NDArray[np.int32],
    row_offset: int = 0,
) -> npt.NDArray[np.bool_]:
    """One row per tree node (padding rows zero); returns whether each node's path is valid."""

def apply_token_bitmask_f32(
    logits: npt.NDArray[np.float32],
    bitmask: npt.NDArray[np.int32],
    vocab: int,
    rows: list[int] | None = None,
) -> None:
    """Disallowed logits to -inf in place: row ``rows[i]`` (default ``i``) of ``logits``'
    first ``vocab`` columns by row ``i`` of ``bitmask``."""

def build_ddtree_constrained(
    logprobs: npt.NDArray[np.float32],
    token_ids: npt.NDArray[np.int64],
    budget: int,
    matcher: Matcher,
    root_token: int = -1,
    min_logprob: float | None = None,
    check_duplicates: bool = True,
) -> TreeArrays:
    """The DDTree over grammar-valid prefixes only (all K columns read)."""

# ---- linear -------------------------------------------------------------------------------
@final
class QuantMatrix:
    """A weight matrix (``rows`` outputs x ``cols`` inputs) in a GGUF block format (``Q4_1``,
    ``Q8_0``), multiplied by float32 rows without dequantizing it first. Bad shapes, sizes
    and formats raise ``ConfigError``."""

    def __new__(cls, format_name: str, rows: int, cols: int, raw: npt.NDArray[np.uint8]) -> Self:
        """From GGUF's bytes: the rows' blocks in order (``rows * cols / 32`` blocks)."""

    @staticmethod
    def stack(parts: Sequence[tuple[str, int, int, npt.NDArray[np.uint8]]]) -> QuantMatrix:
        """The parts' rows one above the other (``(format, rows, cols, raw)`` each; one
        format and one width)."""

    @property
    def format(self) -> str: ...
    @property
    def rows(self) -> int: ...
    @property
    def cols(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def matmul(
        self,
        x: npt.NDArray[np.float32],
        out: npt.NDArray[np.float32],
        *,
        numeric: Literal["exact", "int8"] = "exact",
    ) -> None:
        """``out[:] = x @ W.T``: ``x`` ``[m, cols]``, ``out`` C-contiguous ``[m, rows]``;
        the GIL released, the work split over the cores. ``numeric="int8"``: each row
        quantized per block of 32 to 8 bits and multiplied by the quants with integer dot
        products (llama.cpp's numeric class; a non-finite input raises ``ConfigError``)."""

    def dequantize(self) -> npt.NDArray[np.float32]:
        """The float32 weights ``[rows, cols]``, as gguf-py dequantizes them."""

@final
class LlamaStack:
    """A Llama-style decoder stack on GGUF blocks (:class:`QuantMatrix`, shared, not
    copied), run for a whole step of a few rows in one call with the GIL released: the
    float32 math of ``LlamaModel``'s torch path up to summation order. Weights that do not
    fit ``dims`` raise ``ConfigError``."""

    def __new__(
        cls,
        dims: tuple[int, int, int, int, int, int, int],
        eps: float,
        linears: Sequence[QuantMatrix],
        biases: Sequence[npt.NDArray[np.float32] | None],
        norms: Sequence[npt.NDArray[np.float32]],
        rope_cos: npt.NDArray[np.float32],
        rope_sin: npt.NDArray[np.float32],
    ) -> Self:
        """``dims``: (hidden, intermediate, layers, heads, kv_heads, head_dim, vocab).
        ``linears`` / ``biases``: per layer q/k/v (packed), o, gate/up (packed), down, then
        the head. ``norms``: per layer input and post-attention, then the final norm.
        ``rope_cos`` / ``rope_sin`` ``[positions, head_dim]``: ``x * cos +
        swap_halves(x) * sin``, ``sin`` with its first half negated."""

    @property
    def rope_positions(self) -> int: ...
    @property
    def profiling(self) -> bool:
        """Whether each successful :meth:`step` adds its time per phase to
        :meth:`profile` (off when built; off, a step reads no clock)."""

    @profiling.setter
    def profiling(self, on: bool) -> None: ...
    def profile(self) -> StepProfile:
        """The profiled steps' totals since the last :meth:`reset_profile`."""

    def reset_profile(self) -> None: ...
    def step(
        self,
        x: npt.NDArray[np.float32] | None,
        positions: npt.NDArray[np.int64],
        kv: Sequence[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], bool]],
        buffers: npt.NDArray[np.int64],
        slots: npt.NDArray[np.int64],
        new_slots: npt.NDArray[np.int64],
        mask: npt.NDArray[np.bool_] | None,
        logits: npt.NDArray[np.float32],
        last: bool,
        capture_layers: Sequence[int],
        capture_final: bool,
        hidden: npt.NDArray[np.float32] | None,
        *,
        numeric: Literal["exact", "int8"] = "exact",
        argmax: npt.NDArray[np.int64] | None = None,
        ids: npt.NDArray[np.int64] | None = None,
        embed: npt.NDArray[np.float32] | None = None,
        allowed: npt.NDArray[np.int32] | None = None,
    ) -> None:
        """One step of ``R`` rows of ``T`` new tokens: ``x`` ``[R * T, hidden]`` (their
        embeddings), ``positions`` ``[R * T]``. ``kv``: the step's K/V buffers, each
        ``(k, v, paged)``, C-contiguous float32 ``[layers, kv_heads, slots, head_dim]``
        (a dense cache) or with ``paged`` ``[layers, slots, kv_heads, head_dim]`` (a pool);
        ``buffers`` ``[R]``: each row's buffer. ``slots`` ``[R, S]``: the slots a row
        attends over (the columns of ``mask`` ``[R, T, S]``, True = visible; ``None``:
        causal over the last ``T`` columns); ``new_slots`` ``[R, T]``: where the new K/V is
        written (before attention). Writes ``logits`` ``[R * T, vocab]`` (``last``: ``[R,
        vocab]``, each row's last token) and, where ``capture_layers`` / ``capture_final``
        ask, ``hidden`` ``[R * T, width]``. Bad sizes and positions raise
        ``VerifyError``, slots or buffers out of range ``KVCacheError``; nothing is written
        then. ``numeric``: how the products round, as in :meth:`QuantMatrix.matmul`.
        ``argmax``: C-contiguous int64, one per logits row: where each row's largest logit
        first occurs (NaN counting as the largest, as ``torch.argmax``), scanned on every
        core after the head. ``x`` None: the stack gathers the rows itself, ``ids`` ``[R *
        T]`` from ``embed``, a C-contiguous ``[vocab, hidden]`` table (an id outside it
        raises ``VerifyError``). ``allowed``: int32 ``[logits rows, ceil(vocab / 32)]``, a
        token bitmask row per logits row (a grammar's): every token it does not allow gets
        ``-inf``, and the head computes only the tiles of 16 tokens some row allows
        (``argmax`` is then the masked argmax); allowed tokens' logits are bit for bit
        those of a step without it."""

@final
class StepProfile:
    """Where a :class:`LlamaStack`'s profiled steps spent their time, in nanoseconds:
    ``wall_ns`` of the ``calls``, split into ``matmul_ns`` (every linear layer and the head,
    and SwiGLU where the gate and up products are joined in place), ``attention_ns`` and
    ``other_ns`` (input checks, buffers, norms, RoPE, K/V writes, residual adds,
    hidden-state copies); the phases sum to at most ``wall_ns``."""

    @property
    def calls(self) -> int: ...
    @property
    def wall_ns(self) -> int: ...
    @property
    def matmul_ns(self) -> int: ...
    @property
    def attention_ns(self) -> int: ...
    @property
    def other_ns(self) -> int: ...

def quant_simd_available() -> bool:
    """Whether the fast (AVX-512) kernel runs on this CPU."""

def quant_int8_simd_available() -> bool:
    """Whether the int8 mode's fast (AVX-512 VNNI) kernel runs on this CPU."""
