"""The extension points of the decode step, in one place.

::

    draft (Drafter) -> build tree (TreeShape) -> mask (Constraint) -> verify (Target over a
    KVCache) -> walk -> commit (KVCache)

(a TreeDrafter drafts and builds in one call).

A new drafter, tree shape, constraint, cache or target implements one of these and lives in
one new file beside its siblings (``specdec/draft/``, ``specdec/tree/``, ``specdec/constrain/``,
``specdec/cache/``, ``specdec/models/``). Protocols are structural: implementations need not
inherit from them, except :class:`KVCache`, an abstract base class the verifier checks with
``isinstance``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import Tensor

    from .tree import DraftTree

__all__ = [
    "Target",
    "Drafter",
    "DraftRequest",
    "TreeDrafter",
    "RequestLifecycle",
    "TreeShape",
    "KVCache",
    "Constraint",
    "HiddenCapture",
    "ArgmaxCapture",
    "LogitsMask",
]


# -- draft -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftRequest:
    """One sequence to draft for.

    ``context``: every token so far (prompt and output); its last token is the root of the
    next tree. ``hidden_states``: the target's hidden states ``[m, H]`` at the ``m`` positions
    the last verify step committed (block drafters and Medusa heads read them, so drafting
    costs no extra target pass); ``None`` where the target exposes none. ``request_id``: the
    request this context belongs to, as given to :meth:`RequestLifecycle.add_request` (a
    drafter with per-request state keys it by this id); ``None`` for a one-off call, which
    a drafter serves from the context alone. ``prefix``: tokens the step's tree starts with
    whatever the drafter says (a grammar's forced tokens, :mod:`specdec.draft.grammar`): a
    drafter that honours it (``accepts_prefix = True``) drafts what follows them, its tree
    rooted at ``prefix[-1]``; they are not part of the context (they may be rejected).
    """

    context: Sequence[int]
    hidden_states: torch.Tensor | None = None
    request_id: int | None = None
    prefix: Sequence[int] = ()


@runtime_checkable
class Drafter(Protocol):
    """Proposes per-depth logits for a batch of sequences: ``[R, depth, V]`` for R requests
    (``-inf`` bans a token). :class:`specdec.draft.SequenceDrafter` turns a one-sequence
    ``draft_one(context, depth) -> [depth, V]`` into this."""

    def draft(self, requests: Sequence[DraftRequest], depth: int) -> torch.Tensor: ...


@runtime_checkable
class TreeDrafter(Protocol):
    """Proposes whole draft trees instead of per-depth marginals (suffix and n-gram lookup
    drafters, whose proposals are a scored trie or a chain): one tree per request, at most
    ``budget`` drafted nodes, its root the request's last context token. A generator given
    one skips the tree shape: draft and build are one call."""

    def propose(self, requests: Sequence[DraftRequest], budget: int) -> list[DraftTree]: ...


@runtime_checkable
class RequestLifecycle(Protocol):
    """A drafter's per-request state, following the requests of a serving loop (the
    generator calls these when they exist; drafters without state need neither).

    ``add_request`` comes before the first :class:`DraftRequest` with that ``request_id``;
    ``cache_salt`` is the request's tenant namespace (state shared across requests, such as
    a corpus of earlier outputs, is never shared across salts). ``remove_request`` comes
    once when the request ends, for any reason, and frees everything held for it;
    ``output`` is its generated tokens when it finished normally (a stop token or its
    length), ``None`` when it was cancelled or failed. ``num_requests``: requests held."""

    def add_request(
        self, request_id: int, prompt: Sequence[int], *, cache_salt: bytes | str | None = None
    ) -> None: ...

    def remove_request(self, request_id: int, output: Sequence[int] | None = None) -> None: ...

    @property
    def num_requests(self) -> int: ...


# -- build tree ------------------------------------------------------------------------------
@runtime_checkable
class TreeShape(Protocol):
    """Turns one request's draft logits ``[L, V]`` into the tree to verify (DDTree, chain...).
    ``max_drafted``: the most drafted nodes a tree of this shape has (for cache sizing and
    fixed-shape padding)."""

    @property
    def max_drafted(self) -> int: ...

    def build(self, logits: torch.Tensor, root_token: int) -> DraftTree: ...


# -- mask ------------------------------------------------------------------------------------
@runtime_checkable
class Constraint(Protocol):
    """The grammar state of one sequence (a matcher): what the pipeline needs to mask a
    tree's nodes and to follow the committed tokens. :class:`specdec.Matcher` implements it
    over either engine (a :class:`specdec.RegexGrammar` or a :class:`specdec.CfgGrammar`)."""

    def accept_token(self, token: int) -> bool: ...

    def rollback(self, n: int = 1) -> None: ...

    def fork(self) -> Constraint: ...

    def is_terminated(self) -> bool: ...

    def fill_next_token_bitmask(self, bitmask: np.ndarray | torch.Tensor, row: int = 0) -> None: ...


@dataclass
class HiddenCapture:
    """Which hidden states one target forward keeps, passed per call (``hidden=``) so one
    model serves any number of callers: the outputs of the decoder ``layers`` (0-based,
    increasing) and, with ``final``, the final-norm state the LM head reads. After the
    forward, ``states`` holds them concatenated in that order: ``[T, width]`` (``[R, T,
    width]`` for a batch), ``width = (len(layers) + final) * hidden_size``; ``None`` when
    nothing is kept. Block drafters and Medusa heads read them, so drafting costs no extra
    target pass. A target that supports it has ``captures_hidden = True``."""

    layers: tuple[int, ...] = ()
    final: bool = False
    states: torch.Tensor | None = None

    @property
    def active(self) -> bool:
        return bool(self.layers) or self.final

    def width(self, hidden_size: int) -> int:
        """Width of a row of :attr:`states` for a model of ``hidden_size``."""
        return (len(self.layers) + self.final) * hidden_size


@dataclass
class ArgmaxCapture:
    """Asks one target forward (``argmax=``) for each logits row's argmax, computed as the
    target writes the logits. After the forward, ``tokens`` holds them: ``[T]`` int64
    (``[R, T]`` for a batch), the first maximum with NaN counting as the largest
    (``torch.argmax``'s choice); ``None`` where this forward computed none, and the caller
    takes the argmax of the logits itself. A greedy step reads these instead of the logits:
    on the CPU the LM head's output lies split between the cores' caches, and one thread's
    scan of it after the step costs as much as the step's other bookkeeping. A target that
    supports it has ``captures_argmax = True``."""

    tokens: torch.Tensor | None = None


@dataclass
class LogitsMask:
    """A grammar's mask for one target forward's logits (``allowed=``): ``bitmask`` int32
    ``[rows, ceil(V / 32)]``, a row per logits row (``[T]``, or ``R * T`` for a batch, row
    by row), bit ``t % 32`` of word ``t / 32`` set where token ``t`` is allowed (the layout
    of :func:`~specdec.constrain.fill_tree_bitmask`). A target that masks its logits as it
    writes them sets ``applied``: every token a row does not allow is then ``-inf``, and an
    :class:`ArgmaxCapture` of that forward is the masked argmax; where ``applied`` stays
    False the caller masks the logits. ``LlamaModel``'s fused CPU step does so and skips the
    LM head's weights for the tiles of 16 tokens that no row allows: where a grammar allows
    a few tokens, most of the head (30 MB of SmolLM2's 96 MB of blocks) is not read. A target that
    supports it has ``masks_logits = True``."""

    bitmask: np.ndarray
    applied: bool = False


# -- verify ----------------------------------------------------------------------------------
@runtime_checkable
class Target(Protocol):
    """What the verifier needs from a target model: one forward over ``input_ids`` at
    ``position_ids`` after the cache's committed prefix, with an optional bool mask
    ``[T, committed + T]`` (True = visible), returning logits ``[T, V]``. The forward calls
    ``cache.begin`` and ``cache.append``; the caller commits or rolls back."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_positions(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def new_cache(self, max_len: int | None = None) -> KVCache: ...

    def __call__(
        self, input_ids: Tensor, position_ids: Tensor, cache: KVCache, mask: Tensor | None = None
    ) -> Tensor: ...


# -- commit ----------------------------------------------------------------------------------
class KVCache(ABC):
    """Per-sequence K/V storage for every layer, with tentative slots for one step.

    A decode step feeds ``num_new`` tokens (a tree's root and drafted nodes, one token, or a
    prompt) in one forward::

        cache.begin(num_new)                      # reserve tentative room after the prefix
        k_all, v_all = cache.append(layer, k, v)  # per layer: store, get [prefix + new] K/V
        cache.commit(keep)                        # keep these new tokens, contiguous
        # or cache.rollback()                     # drop all of this step's tokens

    The target's forward calls ``begin`` and ``append`` and leaves the step pending; the
    verifier or a generate loop then commits or rolls back. Implementations:
    :class:`specdec.cache.DenseKVCache`, :class:`specdec.cache.PagedKVCache`,
    :class:`specdec.cache.HFKVCache`.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    @abstractmethod
    def committed_len(self) -> int:
        """Tokens committed so far (the next token's position)."""

    @property
    @abstractmethod
    def pending(self) -> int:
        """Tokens of the current step stored tentatively (0 outside a step)."""

    @abstractmethod
    def begin(self, num_new: int) -> None:
        """Start a step of ``num_new`` tokens (any earlier tentative tokens must be gone)."""

    @abstractmethod
    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's ``[kv_heads, num_new, head_dim]`` K/V for ``layer`` and return the
        layer's keys and values ``[kv_heads, committed_len + num_new, head_dim]``: the
        committed prefix first, then this step's tokens in order."""

    @abstractmethod
    def commit(self, keep: Sequence[int] | np.ndarray | torch.Tensor) -> None:
        """Keep the step's tokens at indices ``keep`` (strictly increasing) as committed,
        contiguous after the prefix, and release every other tentative token.
        (``WalkResult.kept_nodes()`` is what a tree step keeps.)"""

    def check_commit(self, keep: Sequence[int] | np.ndarray | torch.Tensor) -> None:
        """Raise what :meth:`commit` would raise for ``keep``, changing nothing, so a batch
        of caches can be checked before any of them commits (all or nothing)."""
        from .cache.base import check_keep

        check_keep(keep, self.pending)

    def commit_fed(self, fed: torch.Tensor) -> None:
        """Keep every token of a causal step whose fed token ids were ``fed`` (a prefill, or
        one decoded token). Same as ``commit(range(len(fed)))``; a cache that keys blocks by
        their tokens (:class:`specdec.cache.PagedKVCache` with prefix caching) overrides it
        to learn the ids, since only the caller knows what was fed."""
        self.commit(range(fed.numel()))

    def commit_tree(self, keep: np.ndarray, tokens: np.ndarray) -> None:
        """Keep the nodes ``keep`` of a tree step (``WalkResult.kept_nodes()``), whose tokens
        are ``tokens``. Same as ``commit(keep)``; a cache that keys blocks by their tokens
        overrides it, so the accepted path's full blocks can be reused by later requests."""
        self.commit(keep)

    @abstractmethod
    def rollback(self) -> None:
        """Release every tentative token of the current step."""

    @abstractmethod
    def committed_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed ``[kv_heads, committed_len, head_dim]`` K/V of ``layer``."""
