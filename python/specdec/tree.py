"""Draft trees: the DDTree builder, trees from explicit branches, the verifier contract and
the verifier walk. The heavy lifting is in Rust (``specdec._core``); this module holds the
arrays and converts to torch.

Conventions (see DESIGN.md): ``n = N + 1`` nodes, the root (last committed or bonus token) at
index 0 with depth 0 and parent -1, drafted nodes after it in pop order (non-increasing
prefix log-prob) for DDTrees, a parent's index always smaller than its child's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from . import _core
from .errors import TreeError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DraftTree",
    "TreeTensors",
    "WalkResult",
    "build_ddtree",
    "build_ddtree_batch",
    "ddtree_from_logits",
    "tree_from_branches",
    "walk",
    "walk_batch",
]


class DraftTree:
    """A draft tree and everything a verifier needs from it.

    ``tokens`` int64, ``parents`` int32, ``depths`` int32, ``logprobs`` float64 (cumulative
    drafter log-prob of each prefix; root 0), all of length ``num_nodes`` (root included).
    ``first_child``/``next_sibling`` (int32, -1 = none) are the child lookup of the walk,
    derived from ``parents`` when first read (only a walk needs them).
    A padded tree (:meth:`padded`) has ``num_real < num_nodes``.
    """

    __slots__ = (
        "tokens",
        "parents",
        "depths",
        "logprobs",
        "_first_child",
        "_next_sibling",
        "_expected",
        "num_real",
        "_bits",
        "_retrieve",
    )

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
        """Wrap node arrays given from outside (checked: root first, parents before children,
        depth = parent's depth + 1). ``depths`` is derived when omitted."""
        tok = np.ascontiguousarray(tokens, dtype=np.int64)
        par = np.ascontiguousarray(parents, dtype=np.int32)
        if tok.ndim != 1 or par.shape != tok.shape:
            raise TreeError(f"tokens {tok.shape} and parents {par.shape} must be 1-D, same length")
        if depths is None:
            dep = np.zeros(len(par), dtype=np.int32)
            for i in range(1, len(par)):
                p = int(par[i])
                dep[i] = dep[p] + 1 if 0 <= p < i else -1
        else:
            dep = np.ascontiguousarray(depths, dtype=np.int32)
        lp = (
            np.zeros(len(tok), dtype=np.float64)
            if logprobs is None
            else np.ascontiguousarray(logprobs, dtype=np.float64)
        )
        if lp.shape != tok.shape:
            raise TreeError(f"logprobs {lp.shape} must match tokens {tok.shape}")
        bits = _core.tree_arrays(par, dep)
        if expected_acceptance is None and logprobs is None:
            expected_acceptance = math.nan  # no probabilities given: unknown
        self._from_core((tok, par, dep, lp, bits, expected_acceptance), into=self)

    @classmethod
    def _from_core(
        cls, arrays: tuple, num_real: int | None = None, into: DraftTree | None = None
    ) -> DraftTree:
        # Arrays straight from Rust are already consistent: skip the checks.
        self = cls.__new__(cls) if into is None else into
        (
            self.tokens,
            self.parents,
            self.depths,
            self.logprobs,
            self._bits,
            self._expected,
        ) = arrays
        self.num_real = len(self.tokens) if num_real is None else num_real
        self._first_child = self._next_sibling = self._retrieve = None
        return self

    @property
    def first_child(self) -> np.ndarray:
        """int32 first child of each node (-1 = leaf)."""
        fc = self._first_child
        if fc is None:
            fc, self._next_sibling = _core.child_links(self.parents)
            self._first_child = fc
        return fc

    @property
    def next_sibling(self) -> np.ndarray:
        """int32 next child of the same parent, in index order (-1 = last)."""
        ns = self._next_sibling
        if ns is None:
            self._first_child, ns = _core.child_links(self.parents)
            self._next_sibling = ns
        return ns

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
        return self._bits

    def attention_mask(
        self, prefix_len: int, kind: Literal["bool", "additive"] = "bool"
    ) -> np.ndarray:
        """Dense ``[n, prefix_len + n]`` mask: each node sees the committed prefix and its own
        ancestors (itself included), never siblings. ``kind="bool"`` gives True = visible;
        ``"additive"`` gives float32 0 / -inf."""
        _check_prefix(prefix_len)
        if kind not in ("bool", "additive"):
            raise TreeError(f"kind must be 'bool' or 'additive', got {kind!r}")
        return _core.attention_mask(self._bits, prefix_len, kind == "additive")

    def position_ids(self, prefix_len: int) -> np.ndarray:
        """int64 ``prefix_len + depth`` (RoPE positions follow depth, never the packed index).
        ``prefix_len`` is the root's position: the number of tokens committed before it."""
        if type(prefix_len) is not int or prefix_len < 0:
            _check_prefix(prefix_len)
            prefix_len = int(prefix_len)
        return _core.position_ids(self.depths, prefix_len)

    def retrieve_indices(self) -> np.ndarray:
        """int32 ``[num_leaves, max_depth + 1]``: node indices from the root to each leaf,
        padded with -1 (padding nodes are not leaves)."""
        if self._retrieve is None:
            self._retrieve = _core.retrieve_indices(self.parents, self.depths)
        return self._retrieve

    def padded(self, budget: int, pad_token: int = 0) -> DraftTree:
        """The same tree padded to ``budget`` drafted nodes (``budget + 1`` in all), so a
        CUDA-graph verifier sees the same shapes each step. Padding nodes have parent -1,
        depth 0, log-prob -inf, see only themselves and are never accepted."""
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
            raise TreeError(f"padding budget must be an int >= 0, got {budget!r}")
        arrays = _core.pad_tree(
            self.tokens, self.parents, self.depths, self.logprobs, int(budget), int(pad_token)
        )
        out = DraftTree._from_core(arrays, num_real=self.num_real)
        out._expected = self._expected
        return out

    @property
    def valid(self) -> np.ndarray:
        """bool ``[n]``: True for real nodes, False for padding."""
        v = np.zeros(self.num_nodes, dtype=bool)
        v[: self.num_real] = True
        return v

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node``."""
        path = []
        while node >= 0:
            path.append(int(node))
            node = int(self.parents[node])
        return path[::-1]

    def with_root(self, token: int) -> DraftTree:
        """The same tree with the root's token set (e.g. to the last bonus token)."""
        out = DraftTree._from_core(
            (self.tokens.copy(), self.parents, self.depths, self.logprobs, self._bits, None),
            num_real=self.num_real,
        )
        out._expected = self._expected
        out._first_child, out._next_sibling = self._first_child, self._next_sibling
        out.tokens[0] = token
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
        _check_prefix(prefix_len)
        return self.depths + prefix_len

    def attention_mask(
        self, prefix_len: int, kind: Literal["bool", "additive"] = "bool"
    ) -> torch.Tensor:
        import torch

        return torch.from_numpy(self.tree.attention_mask(prefix_len, kind)).to(self.device)


@dataclass(frozen=True)
class WalkResult:
    """``accepted``: node indices (root excluded) in root-to-leaf order; ``bonus_token``: the
    verifier's token after the last accepted node, which the tree did not contain."""

    accepted: np.ndarray
    bonus_token: int
    accepted_tokens: list[int]

    @property
    def num_accepted(self) -> int:
        return len(self.accepted)

    @property
    def tokens(self) -> list[int]:
        """Every token this step emits: the accepted ones then the bonus."""
        return [*self.accepted_tokens, self.bonus_token]


def _check_prefix(prefix_len: int) -> None:
    if not isinstance(prefix_len, (int, np.integer)) or isinstance(prefix_len, bool):
        raise TreeError(f"prefix_len must be an int, got {type(prefix_len).__name__}")
    if prefix_len < 0:
        raise TreeError(f"prefix_len must be >= 0, got {prefix_len}")


_DTYPES = {t: np.dtype(t) for t in (np.float32, np.int64, np.int32)}
_NDARRAY, _F32, _I64 = np.ndarray, _DTYPES[np.float32], _DTYPES[np.int64]


def _as_array(x: Any, dtype: type, name: str, ndim: int, exact: bool) -> np.ndarray:
    """Borrow ``x`` as a numpy array of ``dtype`` without copying when it already is one.
    ``exact``: refuse other dtypes instead of converting (float marginals must be float32)."""
    # Fast path (once per decode step on the hot path): already the right array.
    if type(x) is np.ndarray and x.ndim == ndim and x.dtype is _DTYPES.get(dtype):
        return x
    if not isinstance(x, np.ndarray):
        if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor
            x = x.detach().cpu().numpy()
        else:
            x = np.asarray(x)
    if x.ndim != ndim:
        raise TreeError(f"{name} must be {ndim}-D, got shape {x.shape}")
    if x.dtype != dtype:
        if exact or not np.issubdtype(x.dtype, np.integer):
            raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {x.dtype}")
        x = x.astype(dtype)
    return x


def build_ddtree(
    logprobs: Any,
    token_ids: Any,
    budget: int,
    *,
    min_logprob: float | None = None,
    root_token: int = -1,
) -> DraftTree:
    """Build the optimal draft tree of at most ``budget`` drafted nodes from per-depth
    marginals (``[L, K]`` float32 log-probs, each row sorted descending, and their int64
    token ids): best-first heap over rank tuples, K = min(budget, K). Entries at -inf never
    enter the tree; equal scores pop in push order. ``min_logprob`` stops the build once the
    best remaining prefix is below it. ``root_token`` is stored at index 0 (-1 = unknown).
    Log-probs are checked in every column the build may read; token ids where the tree uses
    them (an id outside [0, 2^31) that enters the tree raises :class:`TreeError`)."""
    # Checks inline: this runs once per decode step, and at B = 1024 the whole build takes
    # about 20 us, so every call saved shows.
    if type(budget) is not int:
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
            raise TypeError(f"budget must be an int, got {type(budget).__name__}")
        budget = int(budget)
    lp, ids = logprobs, token_ids
    if not (type(lp) is _NDARRAY and lp.dtype is _F32 and lp.ndim == 2):
        lp = _as_array(lp, np.float32, "logprobs", 2, exact=True)
    if not (type(ids) is _NDARRAY and ids.dtype is _I64 and ids.ndim == 2):
        ids = _as_array(ids, np.int64, "token_ids", 2, exact=False)
    return DraftTree._from_core(_core.build_ddtree(lp, ids, budget, root_token, min_logprob))


def build_ddtree_batch(
    logprobs: Any,
    token_ids: Any,
    budgets: Sequence[int] | np.ndarray | int,
    *,
    min_logprob: float | None = None,
    root_tokens: Sequence[int] | np.ndarray | None = None,
) -> list[DraftTree]:
    """Build R trees from ``[R, L, K]`` marginals, each with its own budget, in parallel in
    Rust with the GIL released."""
    lp = _as_array(logprobs, np.float32, "logprobs", 3, exact=True)
    ids = _as_array(token_ids, np.int64, "token_ids", 3, exact=False)
    b = np.full(lp.shape[0], budgets, dtype=np.int64) if np.isscalar(budgets) else budgets
    b = _as_array(b, np.int64, "budgets", 1, exact=False)
    roots = (
        None if root_tokens is None else _as_array(root_tokens, np.int64, "root_tokens", 1, False)
    )
    return [
        DraftTree._from_core(t) for t in _core.build_ddtree_batch(lp, ids, b, roots, min_logprob)
    ]


def tree_from_branches(branches: Sequence[Sequence[int]], *, root_token: int = -1) -> DraftTree:
    """Merge explicit token paths (Medusa choices, static EAGLE trees) into one tree, shared
    prefixes once, packed breadth-first (by depth, then parent, then first appearance).
    ``logprobs`` are 0 and ``expected_acceptance`` NaN: branches carry no probabilities."""
    try:
        paths = [[int(t) for t in b] for b in branches]
    except (TypeError, ValueError) as e:
        raise TypeError(f"branches must be a sequence of token-id sequences: {e}") from None
    return DraftTree._from_core(_core.tree_from_branches(paths, root_token))


def ddtree_from_logits(
    logits: torch.Tensor,
    budget: int | Sequence[int],
    *,
    temperature: float = 1.0,
    min_logprob: float | None = None,
    root_tokens: int | Sequence[int] | None = None,
) -> DraftTree | list[DraftTree]:
    """Draft logits ``[L, V]`` (one tree) or ``[R, L, V]`` (a list) on any device ->
    log-softmax and top-K on that device (K = min(max budget, V)), one host copy of the
    ``[.., L, K]`` result, then the Rust builder."""
    import torch

    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() not in (2, 3) or logits.shape[-1] == 0 or logits.shape[-2] == 0:
        raise TreeError(
            f"logits must be [L, V] or [R, L, V] with L, V >= 1, got {tuple(logits.shape)}"
        )
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if temperature <= 0:
        raise TreeError(f"temperature must be > 0, got {temperature}")
    single = logits.dim() == 2
    x = logits.unsqueeze(0) if single else logits
    budgets = [int(budget)] * x.shape[0] if isinstance(budget, (int, np.integer)) else list(budget)
    if len(budgets) != x.shape[0] or min(budgets) <= 0:
        raise TreeError(
            f"need one budget >= 1 per request, got {budgets} for {x.shape[0]} requests"
        )
    k = min(max(budgets), x.shape[-1])
    with torch.no_grad():
        lp = torch.log_softmax(x.float() / temperature if temperature != 1.0 else x.float(), -1)
        vals, idx = torch.topk(lp, k, dim=-1, sorted=True)
        if x.device.type == "cpu":
            lpv, ids = vals.numpy(), idx.numpy()  # views, no copy
        else:
            # One device->host transfer: the float32 values' bits ride along with the ids.
            packed = torch.cat([idx, vals.view(torch.int32).to(torch.int64)], dim=-1).cpu()
            ids = packed[..., :k].numpy()
            lpv = packed[..., k:].to(torch.int32).view(torch.float32).numpy()
    # A NaN logit turns its whole row NaN after log-softmax, so the top-K values show it.
    if np.isnan(lpv).any():
        raise TreeError("logits contain NaN (or +inf, which log-softmax turns into NaN)")
    ids, lpv = np.ascontiguousarray(ids), np.ascontiguousarray(lpv)
    roots: Any = root_tokens
    if single:
        root = -1 if roots is None else int(roots)  # type: ignore[arg-type]
        return build_ddtree(lpv[0], ids[0], budgets[0], min_logprob=min_logprob, root_token=root)
    if isinstance(roots, (int, np.integer)):
        roots = [int(roots)] * x.shape[0]
    return build_ddtree_batch(lpv, ids, budgets, min_logprob=min_logprob, root_tokens=roots)


def _chosen_array(chosen: Any, name: str, ndim: int) -> np.ndarray:
    return _as_array(chosen, np.int64, name, ndim, exact=False)


def walk(tree: DraftTree, chosen_tokens: Any) -> WalkResult:
    """Descend from the root while the verifier's chosen token at the current node is one of
    its children; the first miss is the bonus token. ``chosen_tokens[i]`` is the verifier's
    token at node i (argmax, or one sample of its own distribution)."""
    chosen = _chosen_array(chosen_tokens, "chosen_tokens", 1)
    acc, bonus = _core.walk(tree.tokens, tree.first_child, tree.next_sibling, chosen)
    return WalkResult(acc, int(bonus), tree.tokens[acc].tolist())


def walk_batch(trees: Sequence[DraftTree], chosen_tokens: Any) -> list[WalkResult]:
    """:func:`walk` for R trees at once; ``chosen_tokens`` is ``[R, n_max]`` (row i uses its
    first ``trees[i].num_nodes`` entries)."""
    chosen = _chosen_array(chosen_tokens, "chosen_tokens", 2)
    outs = _core.walk_batch([(t.tokens, t.first_child, t.next_sibling) for t in trees], chosen)
    return [
        WalkResult(acc, int(bonus), t.tokens[acc].tolist())
        for t, (acc, bonus) in zip(trees, outs, strict=True)
    ]
