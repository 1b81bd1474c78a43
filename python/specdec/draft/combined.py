"""A model drafter and a suffix drafter together: per request and step, whichever tree
expects to accept more (DDTree's surrogate: the drafted prefixes' probabilities summed, the
model's marginals against the suffix index's empirical path probabilities). Repeated text
goes to the suffix index, new text to the model."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .._arrays import check_int
from ..errors import DraftError
from ..protocols import Drafter, DraftRequest
from ..tree import DDTreeShape, DraftTree
from .suffix import SuffixDrafter

__all__ = ["CombinedDrafter"]


class CombinedDrafter:
    """A :class:`~specdec.protocols.TreeDrafter` over a per-depth ``model`` drafter (e.g.
    :class:`~specdec.draft.BlockDrafter`, drafting ``max_depth`` tokens) and a ``suffix``
    drafter. The model drafts every step (it keeps its per-request state) and reads the
    target's hidden states when it does. :meth:`add_request` and :meth:`remove_request` go
    to both (to the model when it has them)."""

    def __init__(self, model: Drafter, suffix: SuffixDrafter | None = None, *, max_depth: int = 8):
        if not isinstance(model, Drafter):
            raise DraftError(f"model must be a Drafter, got {type(model).__name__}")
        self.model = model
        self.suffix = suffix if suffix is not None else SuffixDrafter(max_depth=16)
        self.max_depth = check_int(max_depth, "max_depth", 1, DraftError)
        self.chose_suffix = 0  # trees taken from the suffix index (the rest: the model)
        self.chose_model = 0

    def __getattr__(self, name: str) -> Any:
        # What the generator reads off a drafter of hidden states (hidden_layers,
        # hidden_final, vocab_size, check_target) is the model's.
        if name in ("hidden_layers", "hidden_final", "vocab_size", "check_target"):
            return getattr(self.model, name)
        raise AttributeError(name)

    # -- requests (RequestLifecycle): the suffix drafter's, and the model's when it has any --
    def add_request(
        self, request_id: int, prompt: Sequence[int], *, cache_salt: bytes | str | None = None
    ) -> None:
        self.suffix.add_request(request_id, prompt, cache_salt=cache_salt)
        add = getattr(self.model, "add_request", None)
        if add is not None:
            try:
                add(request_id, prompt, cache_salt=cache_salt)
            except BaseException:
                self.suffix.remove_request(request_id)  # both hold the request, or neither
                raise

    def remove_request(self, request_id: int, output: Sequence[int] | None = None) -> None:
        remove = getattr(self.model, "remove_request", None)
        try:
            self.suffix.remove_request(request_id, output)
        finally:  # the model's state is freed even when the suffix drafter refused
            if remove is not None:
                remove(request_id, output)

    @property
    def num_requests(self) -> int:
        return self.suffix.num_requests

    accepts_prefix = True  # DraftRequest.prefix: the model's depths after it, the suffix's lookup

    def propose(
        self, requests: Sequence[DraftRequest], budget: int, *, max_depth: int | None = None
    ) -> list[DraftTree]:
        """One tree per request of at most ``budget`` drafted nodes; the model drafts at
        most ``max_depth`` depths (default: its ``max_depth``; an adaptive budget asks for
        fewer)."""
        out = []
        for mt, st in self.candidates(requests, budget, max_depth=max_depth):
            s_exp = st.expected_acceptance if st.num_drafted else 0.0
            picked_suffix = math.isfinite(s_exp) and s_exp > mt.expected_acceptance
            self.record(picked_suffix)
            out.append(st if picked_suffix else mt)
        return out

    def candidates(
        self,
        requests: Sequence[DraftRequest],
        budget: int,
        *,
        max_depth: int | None = None,
        model: bool = True,
    ) -> list[tuple[DraftTree, DraftTree]]:
        """Per request both trees, (the model's DDTree, the suffix drafter's tree), for a
        caller that chooses itself (the adaptive budget, at the size it picks, by the same
        surrogate; :meth:`record` counts its choice). ``model=False``: the model does not
        run (its tree is the root alone; a model that reads hidden states gets the skipped
        steps' at its next draft)."""
        budget = check_int(budget, "budget", 1, DraftError)
        cap = (
            self.max_depth
            if max_depth is None
            else min(self.max_depth, check_int(max_depth, "max_depth", 1, DraftError))
        )
        # A best-first tree of ``budget`` nodes is at most that deep: no deeper marginals.
        depth = min(cap, budget)
        # A request's prefix takes the model's first depths: its tree starts after them.
        skip = [len(r.prefix) for r in requests]
        drafted = min(self.max_depth, depth + max(skip))
        logits = self.model.draft(requests, drafted) if model else None
        shape = DDTreeShape(budget)
        suffix = self.suffix.propose(requests, budget)
        out = []
        for i, (r, st, k) in enumerate(zip(requests, suffix, skip, strict=True)):
            root = int(r.prefix[-1]) if k else int(r.context[-1])
            rows = None if logits is None else logits[i, k : k + depth]
            # (A scored root alone: it expects nothing, so the suffix tree is preferred.)
            mt = (
                shape.build(rows, root)
                if rows is not None and len(rows)
                else DraftTree.root_only(root, scored=True)
            )
            out.append((mt, st))
        return out

    def record(self, suffix: bool) -> None:
        """Count one tree taken from the suffix index (``True``) or the model."""
        if suffix:
            self.chose_suffix += 1
        else:
            self.chose_model += 1
