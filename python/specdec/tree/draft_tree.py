"""The draft tree: node arrays and the verifier contract. The arrays are built and owned by
Rust (``specdec._core.TreeArrays``, one named object per tree); this class reads them and
converts to torch.

Conventions: ``n = N + 1`` nodes, the root (last committed or bonus token) at index 0 with
depth 0 and parent -1, drafted nodes after it in pop order (non-increasing prefix log-prob)
for DDTrees, a parent's index always smaller than its child's. A padded tree has padding nodes
(parent -1, depth 0, log-prob -inf) after its ``num_real`` real nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .. import _core
from .._arrays import I64_MAX, as_array, check_int
from ..errors import TreeError

if TYPE_CHECKING:
    import torch

__all__ = ["DraftTree", "TreeTensors"]


# DraftTree.root_only's templates, unscored and scored.
_ROOT_TEMPLATES: dict[bool, DraftTree] = {}


class DraftTree:
    """A draft tree and everything a verifier needs from it.

    ``tokens`` int64, ``parents`` int32, ``depths`` int32, ``logprobs`` float64 (cumulative
    drafter log-prob of each prefix; root 0), all of length ``num_nodes`` (root included).
    ``first_child``/``next_sibling`` (int32, -1 = none) are the child lookup of the walk,
    derived from ``parents`` in Rust when first read (only a walk needs them).
    A padded tree (:meth:`padded`) has ``num_real < num_nodes``.
    """

    __slots__ = ("_arrays", "tokens", "parents", "depths", "logprobs", "num_real", "_expected")

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    logprobs: np.ndarray
    num_real: int

    def __init__(
        self,
        tokens: Any,
        parents: Any,
        depths: Any | None = None,
        logprobs: Any | None = None,
        *,
        expected_acceptance: float | None = None,
    ) -> None:
        """Wrap node arrays given from outside (checked in Rust: root first, parents before
        children, depth = parent's depth + 1, padding nodes only after the real ones).
        ``depths`` is derived when omitted."""
        tok = np.ascontiguousarray(as_array(tokens, np.int64, "tokens", 1, exact=False))
        par = np.ascontiguousarray(as_array(parents, np.int32, "parents", 1, exact=False))
        dep = (
            None
            if depths is None
            else np.ascontiguousarray(as_array(depths, np.int32, "depths", 1, exact=False))
        )
        lp = (
            None
            if logprobs is None
            else np.ascontiguousarray(as_array(logprobs, np.float64, "logprobs", 1, exact=False))
        )
        if expected_acceptance is None and logprobs is None:
            expected_acceptance = math.nan  # no probabilities given: unknown
        self._wrap(_core.TreeArrays(tok, par, dep, lp, expected_acceptance))

    @classmethod
    def root_only(cls, token: int, *, scored: bool = False) -> DraftTree:
        """The tree of ``token`` alone (a plain step: nothing drafted); ``scored``: with
        log-probability 0, a drafter's empty proposal, which expects to accept nothing.
        A copy of a template with its root set: a step builds one or two of these, and
        the checked constructor took 7 us each (four times that right after a forward)."""
        key = bool(scored)
        template = _ROOT_TEMPLATES.get(key)
        if template is None:
            template = cls([0], [-1], logprobs=[0.0] if key else None)
            _ROOT_TEMPLATES[key] = template
        return template.with_root(token)

    @classmethod
    def _from_core(cls, arrays: _core.TreeArrays) -> DraftTree:
        # Arrays straight from a Rust builder are already consistent: skip the checks.
        self = cls.__new__(cls)
        self._wrap(arrays)
        return self

    def _wrap(self, arrays: _core.TreeArrays) -> None:
        self._arrays = arrays
        self.tokens = arrays.tokens
        self.parents = arrays.parents
        self.depths = arrays.depths
        self.logprobs = arrays.logprobs
        self.num_real = arrays.num_real
        self._expected = arrays.expected

    @property
    def first_child(self) -> np.ndarray:
        """int32 first child of each node (-1 = leaf)."""
        return self._arrays.first_child

    @property
    def next_sibling(self) -> np.ndarray:
        """int32 next child of the same parent, in index order (-1 = last)."""
        return self._arrays.next_sibling

    @property
    def expected_acceptance(self) -> float:
        """Surrogate expected acceptance length (DDTree Prop. 1): the drafted prefixes'
        probabilities summed; NaN for trees from explicit branches (no probabilities)."""
        if self._expected is None:
            self._expected = float(np.exp(self.logprobs[1 : self.num_real]).sum())
        return self._expected

    # -- sizes -------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        """Nodes including the root (``N + 1``); padding nodes count too."""
        return len(self.tokens)

    @property
    def num_drafted(self) -> int:
        """Drafted (non-root, non-padding) nodes ``N``."""
        return self.num_real - 1

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return (
            f"DraftTree(num_nodes={self.num_nodes}, num_real={self.num_real}, "
            f"max_depth={int(self.depths.max())}, "
            f"expected_acceptance={self.expected_acceptance:.4f})"
        )

    # -- verifier contract -------------------------------------------------------------
    def ancestor_bits(self) -> np.ndarray:
        """uint64 ``[n, ceil(n/64)]``: bit j of row i set iff j is i or an ancestor of i."""
        return self._arrays.bits

    def attention_mask(
        self, prefix_len: int, kind: Literal["bool", "additive"] = "bool"
    ) -> np.ndarray:
        """Dense ``[n, prefix_len + n]`` mask: each node sees the committed prefix and its own
        ancestors (itself included), never siblings. ``kind="bool"`` gives True = visible;
        ``"additive"`` gives float32 0 / -inf."""
        prefix_len = check_int(prefix_len, "prefix_len", 0)
        if not isinstance(kind, str) or kind not in ("bool", "additive"):
            raise TreeError(f"kind must be 'bool' or 'additive', got {kind!r}")
        return self._arrays.attention_mask(prefix_len, kind == "additive")

    def position_ids(self, prefix_len: int) -> np.ndarray:
        """int64 ``prefix_len + depth`` (RoPE positions follow depth, never the packed index).
        ``prefix_len`` is the root's position: the number of tokens committed before it."""
        if type(prefix_len) is not int or not 0 <= prefix_len <= I64_MAX:
            prefix_len = check_int(prefix_len, "prefix_len", 0)
        return self._arrays.position_ids(prefix_len)

    def retrieve_indices(self) -> np.ndarray:
        """int32 ``[num_leaves, max_depth + 1]``: node indices from the root to each leaf,
        padded with -1 (padding nodes are not leaves)."""
        return self._arrays.retrieve_indices()

    def padded(self, budget: int, pad_token: int = 0) -> DraftTree:
        """The same tree padded to ``budget`` drafted nodes (``budget + 1`` in all), so a
        CUDA-graph verifier sees the same shapes each step. Padding nodes have parent -1,
        depth 0, log-prob -inf, see only themselves and are never accepted. A padded tree can
        be padded again (to any budget that holds its real nodes)."""
        budget = check_int(budget, "padding budget", 0)
        pad_token = check_int(pad_token, "pad_token", 0)
        out = DraftTree._from_core(self._arrays.padded(budget, pad_token))
        out._expected = self._expected
        return out

    @property
    def valid(self) -> np.ndarray:
        """bool ``[n]``: True for real nodes, False for padding."""
        v = np.zeros(self.num_nodes, dtype=bool)
        v[: self.num_real] = True
        return v

    def pruned(self, max_drafted: int, max_depth: int | None = None) -> DraftTree:
        """The first ``max_drafted`` real drafted nodes (in node order) no deeper than
        ``max_depth``: for a best-first tree, its best tree of that size (what an adaptive
        budget or a context limit verifies). Padding is dropped; ancestors always come
        before their descendants, so the kept set is a tree."""
        max_drafted = check_int(max_drafted, "max_drafted", 0)
        n = self.num_real
        if n == 1 and self.num_nodes == 1:  # the root alone (most plain steps): nothing to cut
            if max_depth is not None:
                check_int(max_depth, "max_depth", 0)
            return self
        if n == self.num_nodes and max_drafted + 1 >= n:
            # Nothing to cut (the common case, once per step): skip the index arithmetic.
            if max_depth is None or int(self.depths.max()) <= check_int(max_depth, "max_depth", 0):
                return self
        keep_mask = np.ones(n, dtype=bool)
        if max_depth is not None:
            keep_mask &= self.depths[:n] <= check_int(max_depth, "max_depth", 0)
        idx = np.flatnonzero(keep_mask)[: max_drafted + 1]
        if len(idx) == n and n == self.num_nodes:
            return self
        remap = np.full(n + 1, -1, dtype=np.int32)  # remap[-1] (the root's parent) stays -1
        remap[idx] = np.arange(len(idx), dtype=np.int32)
        out = DraftTree._from_core(
            _core.TreeArrays(
                self.tokens[idx],
                remap[self.parents[idx]],
                self.depths[idx].copy(),
                self.logprobs[idx].copy(),
                self._unscored(),
            )
        )
        return out

    def best_path(self) -> DraftTree:
        """The single path that follows, from the root, the child of highest log-prob (the
        first child on ties): the chain a chain strategy verifies from a scored tree."""
        n = self.num_real
        path = [0]
        while True:
            kids = np.flatnonzero(self.parents[:n] == path[-1])
            if len(kids) == 0:
                break
            lp = self.logprobs[kids]
            path.append(int(kids[int(np.argmax(lp))]) if np.isfinite(lp).any() else int(kids[0]))
        idx = np.array(path)
        return DraftTree._from_core(
            _core.TreeArrays(
                self.tokens[idx],
                np.arange(-1, len(idx) - 1, dtype=np.int32),
                np.arange(len(idx), dtype=np.int32),
                self.logprobs[idx].copy(),
                self._unscored(),
            )
        )

    def _unscored(self) -> float | None:
        """NaN for a tree without probabilities (kept by trees derived from it), else None
        (the expected acceptance is then summed from the log-probs when read)."""
        return math.nan if self._expected is not None and math.isnan(self._expected) else None

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node``."""
        node = check_int(node, "node", 0)
        if node >= self.num_nodes:
            raise TreeError(f"node {node} is not in a tree of {self.num_nodes} nodes")
        path = []
        while node >= 0:
            path.append(int(node))
            node = int(self.parents[node])
        return path[::-1]

    def with_root(self, token: int) -> DraftTree:
        """The same tree with the root's token set (e.g. to the last bonus token)."""
        out = DraftTree._from_core(self._arrays.with_root(check_int(token, "root token", 0)))
        out._expected = self._expected
        return out

    def with_prefix(self, prefix: Sequence[int], root_token: int) -> DraftTree:
        """This tree below a chain: ``root_token``, then ``prefix`` (each of probability 1,
        e.g. a grammar's forced tokens), then this tree's drafted nodes under the chain's
        last node, which takes this tree's root's place (so this tree's root token should be
        ``prefix[-1]``). Node order stays best first: the chain, then this tree's nodes.
        Padding is dropped."""
        k = len(prefix)
        root_token = check_int(root_token, "root token", None)
        if k == 0:
            return self.with_root(root_token)
        n = self.num_real
        chain = np.arange(-1, k, dtype=np.int32)
        out = DraftTree._from_core(
            _core.TreeArrays(
                np.concatenate([np.array([root_token, *prefix], dtype=np.int64), self.tokens[1:n]]),
                np.concatenate([chain, self.parents[1:n] + k]),
                np.concatenate([np.arange(k + 1, dtype=np.int32), self.depths[1:n] + k]),
                np.concatenate([np.zeros(k + 1), self.logprobs[1:n]]),
                self._unscored(),
            )
        )
        return out

    def to(self, device: str | torch.device = "cpu") -> TreeTensors:
        """torch tensors of the node arrays on ``device`` (indices as int64)."""
        import torch

        def t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            return torch.from_numpy(a).to(device=device, dtype=dtype)

        return TreeTensors(
            tree=self,
            tokens=t(self.tokens, torch.long),
            parents=t(self.parents, torch.long),
            depths=t(self.depths, torch.long),
            logprobs=t(self.logprobs, torch.float64),
            first_child=t(self.first_child, torch.long),
            next_sibling=t(self.next_sibling, torch.long),
            valid=t(self.valid, torch.bool),
        )


@dataclass(frozen=True)
class TreeTensors:
    """A :class:`DraftTree`'s arrays as torch tensors on one device."""

    tree: DraftTree
    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    logprobs: torch.Tensor
    first_child: torch.Tensor
    next_sibling: torch.Tensor
    valid: torch.Tensor

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def position_ids(self, prefix_len: int) -> torch.Tensor:
        prefix_len = check_int(prefix_len, "prefix_len", 0)
        if prefix_len > 2**62:  # int64 positions must not wrap
            raise TreeError(f"prefix_len {prefix_len} is too large for int64 positions")
        return self.depths + prefix_len

    def attention_mask(
        self, prefix_len: int, kind: Literal["bool", "additive"] = "bool"
    ) -> torch.Tensor:
        import torch

        return torch.from_numpy(self.tree.attention_mask(prefix_len, kind)).to(self.device)
