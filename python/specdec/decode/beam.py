"""Beam search on shared paged KV blocks, scored exactly as Hugging Face transformers'
``generate(num_beams=..., do_sample=False)`` (checked against transformers 5.24,
``GenerationMixin._beam_search`` and its helpers).

The scoring rules, as transformers applies them (and this module re-implements):

* Each step takes the top ``K = max(2, 1 + number of EOS ids) * num_beams`` continuations of
  all beams by accumulated log-probability (``log_softmax`` of float32 logits, then the
  logits processors), so that ``num_beams`` non-finished ones remain even if the best ones
  all end. At the first step only beam 0 is live: the others start at ``-1e9``.
* A continuation ends when its token is an EOS id (``eos_token_id`` and ``stop_tokens``
  alike), when it reaches ``max_new_tokens``, or when its token ends the constraint (a
  specdec addition: transformers has no grammar).
  Only the first ``num_beams`` of the ``K`` may join the finished hypotheses, scored
  ``sum_logprob / generated_len ** length_penalty`` (prompt excluded, the chosen EOS
  counted); the best ``num_beams`` finished hypotheses are kept. The running beams are the
  best ``num_beams`` continuations that did not end.
* ``early_stopping=True``: stop adding (and, once every prompt is full, stop searching) as
  soon as ``num_beams`` hypotheses are finished. ``False``: stop when the best running beam,
  normalised by the current generated length, cannot beat the worst finished one.
  ``"never"``: the same test, but with a positive length penalty the running beam is
  normalised by ``max_new_tokens`` (its best possible length).
* The search runs until no prompt can improve, or all its continuations ended; prompts of
  one call stop together (as transformers' batches do).

The K/V lives in a :class:`~specdec.cache.PagedKVPool`: each prompt is prefilled once into
one sequence and forked into the beams, so the prompt's blocks are held once for all beams.
Each step the Rust block manager reorders the block tables (``reorder``: beam ``i`` continues
its parent, sharing every block, no K/V copied) and the next append copies only a shared
partial tail block (copy-on-write). Token ids, scores, finished flags and the grammar
matchers are reordered by the same parent indices.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from .._arrays import check_float, check_int
from ..cache.paged import PagedKVCache, PagedKVPool
from ..constrain.torch import allocate_token_bitmask, apply_token_bitmask_inplace
from ..errors import ConfigError, SpecdecTypeError
from ..protocols import Constraint, Target
from .common import FinishReason, check_max_new_tokens, new_matcher, prompt_ids, stop_set

__all__ = ["BeamHypothesis", "BeamSearchResult", "beam_search"]

EarlyStopping = bool | Literal["never"]
LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# transformers' stand-in for "impossible": added, not assigned, so the float32 rounding of
# every score matches its implementation bit for bit.
_NEG = -1.0e9


@dataclass(frozen=True)
class BeamHypothesis:
    """One returned sequence. ``tokens``: generated ids (prompt excluded, a final EOS
    included); ``score``: ``logprob / len(tokens) ** length_penalty`` (transformers'
    ``sequences_scores``); ``logprob``: the summed log-probabilities of ``tokens`` (after the
    logits processors and the constraint's mask); ``prompt_len``: its prompt's tokens;
    ``finish_reason``: as :class:`~specdec.GenerationResult`'s, ``"stop"`` (it ends with a
    stop token, or its last token ended the constraint) or ``"length"``
    (``max_new_tokens``)."""

    tokens: list[int]
    score: float
    logprob: float
    prompt_len: int = 0
    finish_reason: FinishReason = "length"


@dataclass(frozen=True)
class BeamSearchResult:
    """``hypotheses[p]``: prompt ``p``'s ``num_return_sequences`` hypotheses, best first.
    ``steps``: selection steps run (forwards after the prefill: ``steps - 1``).
    ``peak_kv_blocks``: most KV blocks in use at once (all prompts, all beams);
    ``kv_block_bytes``: bytes of one block (K and V, every layer); ``timings``: seconds per
    stage (``prefill``, ``forward``, ``select``: log-softmax, processors, mask and top-K,
    ``reorder``: block tables and matchers), for the whole call, as every prompt's beams run
    in the same forwards; ``seconds``: the whole call."""

    hypotheses: list[list[BeamHypothesis]]
    steps: int
    peak_kv_blocks: int
    kv_block_bytes: int
    timings: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def sequences(self) -> list[list[list[int]]]:
        """Generated token ids per prompt, best first."""
        return [[h.tokens for h in hs] for hs in self.hypotheses]

    @property
    def scores(self) -> list[list[float]]:
        """Length-normalised scores per prompt, best first."""
        return [[h.score for h in hs] for hs in self.hypotheses]

    @property
    def peak_kv_bytes(self) -> int:
        return self.peak_kv_blocks * self.kv_block_bytes


@dataclass(frozen=True)
class _Config:
    num_beams: int
    max_new_tokens: int
    eos: torch.Tensor  # [E] int64
    length_penalty: float
    early_stopping: EarlyStopping
    num_return_sequences: int
    keep: int  # K candidates per step


def _check_config(
    target: Target,
    num_beams: Any,
    max_new_tokens: Any,
    eos_token_id: Any,
    stop_tokens: Any,
    length_penalty: Any,
    early_stopping: Any,
    num_return_sequences: Any,
) -> _Config:
    beams = check_int(num_beams, "num_beams", 1, ConfigError)
    new = check_max_new_tokens(max_new_tokens)
    ret = check_int(num_return_sequences, "num_return_sequences", 1, ConfigError)
    if ret > beams:
        raise ConfigError(
            f"num_return_sequences ({ret}) must be at most num_beams ({beams}): only "
            f"num_beams hypotheses are kept"
        )
    vocab = target.vocab_size
    # Every stop token is an EOS id to the search (transformers' eos_token_id list).
    eos = sorted(stop_set(stop_tokens, eos_token_id, vocab))
    lp = check_float(length_penalty, "length_penalty", ConfigError)
    if not math.isfinite(lp):
        raise ConfigError(f"length_penalty must be finite, got {lp}")
    if not (early_stopping is True or early_stopping is False or early_stopping == "never"):
        raise ConfigError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    keep = max(2, 1 + len(eos)) * beams
    if keep > beams * vocab:
        raise ConfigError(f"a vocabulary of {vocab} tokens is too small for {beams} beams")
    return _Config(beams, new, torch.tensor(eos, dtype=torch.long), lp, early_stopping, ret, keep)


def _prompt_rows(prompts: Any) -> list[list[int]]:
    """One prompt (ints, or a 1-D tensor) or several (lists, or a 2-D tensor)."""
    if isinstance(prompts, (torch.Tensor, np.ndarray)):
        if prompts.ndim == 2:
            return [prompt_ids(p) for p in prompts]
        return [prompt_ids(prompts)]
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise SpecdecTypeError(f"prompts must be token id lists, got {type(prompts).__name__}")
    if not prompts:
        raise ConfigError("beam_search needs at least one prompt")
    first = prompts[0]
    if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
        return [prompt_ids(prompts)]
    return [prompt_ids(p) for p in prompts]


def _matchers(constraint: Any, n: int) -> list[Constraint] | None:
    """One matcher per prompt: forks of ``constraint`` (a matcher, whose state they start
    from) or fresh matchers of a grammar."""
    if constraint is None:
        return None
    out: list[Constraint] = []
    for _ in range(n):
        m = new_matcher(constraint)
        assert m is not None
        out.append(m)
    return out


class _Beams:
    """The K/V side: one paged sequence per running beam, all prompts in one pool."""

    def __init__(
        self, target: Target, rows: list[list[int]], cfg: _Config, block_size: int, share: bool
    ) -> None:
        probe = target.new_cache(1)
        self.target, self.share, self.cfg = target, share, cfg
        bs = check_int(block_size, "block_size", 1, ConfigError)
        n, new = cfg.num_beams, cfg.max_new_tokens
        if share:
            # Full prompt blocks once; each beam's own part spans at most ceil(new/bs) + 1
            # blocks; + 2 per beam for the copy-on-write a reservation checks for up front.
            blocks = sum(len(p) // bs + n * (-(-new // bs) + 3) for p in rows) + 1
        else:  # every beam a full copy, and old and new copies side by side while reordering
            blocks = sum(2 * n * (-(-(len(p) + new) // bs) + 1) for p in rows) + 1
        dtype = getattr(target, "dtype", torch.float32)
        self.pool = PagedKVPool(
            probe.num_layers,
            probe.num_kv_heads,
            probe.head_dim,
            blocks,
            bs,
            dtype=dtype,
            device=target.device,
        )
        self.block_bytes = (
            2
            * probe.num_layers
            * bs
            * probe.num_kv_heads
            * probe.head_dim
            * self.pool.k.element_size()
        )
        self.peak = 0
        self.caches: list[PagedKVCache] = []

    def used(self) -> int:
        u = self.pool.num_blocks - self.pool.manager.num_free_blocks()
        self.peak = max(self.peak, u)
        return u

    def prefill(self, rows: list[list[int]]) -> torch.Tensor:
        """Each prompt once; its beams share its blocks. Returns last logits ``[B, V]``."""
        dev = torch.device(self.target.device)
        # A model with forward_last (LlamaModel) runs the LM head on the last token only.
        last = getattr(self.target, "forward_last", None)
        out = []
        for ids in rows:
            root = self.pool.sequence()
            self.caches.append(root)
            feed = torch.tensor(ids, dtype=torch.long, device=dev)
            pos = torch.arange(len(ids), device=dev)
            out.append(
                self.target(feed, pos, root, None)[-1] if last is None else last(feed, pos, root)
            )
            root.commit_fed(feed)
            self.used()
            for _ in range(self.cfg.num_beams - 1):
                self.caches.append(root.fork() if self.share else self._copy(root))
        self.used()
        return torch.stack(out)

    def _copy(self, src: PagedKVCache) -> PagedKVCache:
        """A private copy of ``src``'s K/V (the unshared baseline)."""
        dst = self.pool.sequence()
        n = src.committed_len
        slots = self.pool.manager.append_slots(dst.seq, n).slots
        self.pool.move_slots(self.pool.manager.slot_mapping(src.seq, 0, n), slots)
        dst._len = n
        return dst

    def reorder(self, parents: list[int]) -> None:
        """Beam ``i`` continues beam ``parents[i]`` (global indices)."""
        if self.share:
            self.pool.reorder(self.caches, parents)
            return
        old = self.caches
        self.caches = [self._copy(old[p]) for p in parents]
        self.used()
        for c in old:
            c.free()

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token per beam, all beams at once where the model allows; ``[R, V]``."""
        dev = torch.device(self.target.device)
        tokens, positions = tokens.to(dev), positions.to(dev)
        paged = getattr(self.target, "forward_paged", None)
        if paged is not None:
            logits: torch.Tensor = paged(tokens, positions, self.caches)
            self.used()
            self.pool.commit_decode(self.caches)
            return logits
        rows = []
        for i, c in enumerate(self.caches):
            rows.append(self.target(tokens[i : i + 1], positions[i : i + 1], c, None)[-1])
            self.used()
            c.commit_fed(tokens[i : i + 1])
        return torch.stack(rows)

    def free(self) -> None:
        for c in self.caches:
            c.free()
        self.caches = []


def _processed_logprobs(
    logits: torch.Tensor,
    rows: list[list[int]],
    run_tokens: torch.Tensor,
    t: int,
    cfg: _Config,
    processors: Sequence[LogitsProcessor],
    matchers: list[Constraint] | None,
) -> torch.Tensor:
    """``log_softmax`` of float32 logits, then the processors (per prompt, with that
    prompt's beams' ids ``[num_beams, prompt + t]`` as transformers passes them), then the
    grammar mask. ``[B, num_beams, V]``."""
    n = cfg.num_beams
    lp = torch.log_softmax(logits.to(device="cpu", dtype=torch.float32), dim=-1)
    if processors:
        parts = []
        for b, ids in enumerate(rows):
            prompt = torch.tensor(ids, dtype=torch.long).expand(n, len(ids))
            seq = torch.cat((prompt, run_tokens[b, :, :t]), dim=1)
            part = lp[b * n : (b + 1) * n]
            for proc in processors:
                part = proc(seq, part)
            parts.append(part)
        lp = torch.cat(parts)
    if matchers is not None:
        mask = allocate_token_bitmask(len(matchers), lp.shape[-1])
        for r, m in enumerate(matchers):
            m.fill_next_token_bitmask(mask, r)
        apply_token_bitmask_inplace(lp, mask)
    return lp.view(len(rows), n, -1)


def beam_search(
    target: Target,
    prompts: Sequence[Sequence[int]] | Sequence[int] | torch.Tensor,
    *,
    num_beams: int,
    max_new_tokens: int,
    eos_token_id: Collection[int] | int | None = None,
    stop_tokens: Collection[int] | int | None = None,
    constraint: Any = None,
    length_penalty: float = 1.0,
    early_stopping: EarlyStopping = False,
    num_return_sequences: int = 1,
    logits_processors: Sequence[LogitsProcessor] = (),
    block_size: int = 16,
    share_kv: bool = True,
) -> BeamSearchResult:
    """Beam search with transformers' semantics (see the module docstring) over ``target``
    (a :class:`~specdec.protocols.Target`; one with ``forward_paged``, as
    :class:`~specdec.models.LlamaModel`, runs all beams of all prompts in one forward per
    step).

    ``prompts``: one prompt (ids) or several; ``stop_tokens`` and ``eos_token_id`` (each an
    id or several) end a hypothesis, included in its tokens: both are transformers' EOS
    ids; ``constraint``: a grammar (with ``.matcher()``) or a matcher whose state each
    prompt starts from (each beam follows its own fork, disallowed tokens get ``-inf`` after
    the processors, and a token that ends the constraint ends the hypothesis);
    ``logits_processors``: callables ``(input_ids [num_beams, len], log_probs [num_beams,
    V]) -> log_probs``, so transformers' ``LogitsProcessor`` objects work as they do in
    ``generate``. ``share_kv=False`` gives every beam a private copy of its K/V, re-copied
    on every reorder (the baseline the benchmark compares with); the results are the same.
    ``max_new_tokens=0`` gives every prompt ``num_return_sequences`` empty hypotheses.

    ``num_beams=1`` is beam search with one beam: transformers' ``generate`` switches to
    greedy decoding there instead, which can differ when a length penalty or
    ``early_stopping="never"`` lets the search continue past an EOS."""
    t_start = time.perf_counter()
    cfg = _check_config(
        target,
        num_beams,
        max_new_tokens,
        eos_token_id,
        stop_tokens,
        length_penalty,
        early_stopping,
        num_return_sequences,
    )
    rows = _prompt_rows(prompts)
    longest = max(len(p) for p in rows)
    # The last token chosen is never fed, so positions run to prompt + new - 2.
    if longest + cfg.max_new_tokens - 1 > target.max_positions:
        raise ConfigError(
            f"a prompt of {longest} tokens plus {cfg.max_new_tokens} new tokens needs "
            f"{longest + cfg.max_new_tokens - 1} positions; the model has {target.max_positions}"
        )
    for i, p in enumerate(processors := tuple(logits_processors)):
        if not callable(p):
            raise SpecdecTypeError(f"logits_processors[{i}] is not callable")
    share = bool(share_kv)
    prompt_matchers = _matchers(constraint, len(rows))
    n, bsz, new = cfg.num_beams, len(rows), cfg.max_new_tokens
    matchers = (
        None if prompt_matchers is None else [m.fork() for m in prompt_matchers for _ in range(n)]
    )
    timings = dict.fromkeys(("prefill", "forward", "select", "reorder"), 0.0)
    t0 = time.perf_counter()
    beams = _Beams(target, rows, cfg, block_size, share)
    state = _State.start(bsz, n, new)
    t = 0
    try:
        if new > 0:
            logits = beams.prefill(rows).repeat_interleave(n, dim=0)
            start = t0
            t0 = time.perf_counter()
            timings["prefill"] = t0 - start  # the pool, and each prompt's forward
            while True:
                lp = _processed_logprobs(
                    logits, rows, state.run_tokens, t, cfg, processors, matchers
                )
                parents, done = state.step(lp, t, cfg, matchers)
                t += 1
                t1 = time.perf_counter()
                timings["select"] += t1 - t0
                if done:
                    break
                glob = (parents + torch.arange(bsz)[:, None] * n).reshape(-1).tolist()
                tokens = state.run_tokens[:, :, t - 1].reshape(-1)
                beams.reorder(glob)
                if matchers is not None:
                    matchers = [matchers[p].fork() for p in glob]
                    for m, tok in zip(matchers, tokens.tolist(), strict=True):
                        m.accept_token(tok)  # a -inf continuation is refused: it stays dead
                positions = torch.tensor([len(p) + t - 1 for p in rows for _ in range(n)])
                t2 = time.perf_counter()
                logits = beams.forward(tokens, positions)
                t0 = time.perf_counter()
                timings["reorder"] += t2 - t1
                timings["forward"] += t0 - t2
    finally:
        beams.free()
    lens = [len(p) for p in rows]
    if new == 0:
        hyps = [
            [BeamHypothesis([], 0.0, 0.0, k) for _ in range(cfg.num_return_sequences)] for k in lens
        ]
    else:
        hyps = state.results(cfg.num_return_sequences, lens)
    return BeamSearchResult(
        hyps,
        steps=t,
        peak_kv_blocks=beams.peak,
        kv_block_bytes=beams.block_bytes,
        timings=timings,
        seconds=time.perf_counter() - t_start,
    )


def _ends_constraint(
    matchers: list[Constraint], n: int, parent: torch.Tensor, tok: torch.Tensor
) -> torch.Tensor:
    """``[B, K]`` bool: candidate ``tok[b, k]`` of beam ``parent[b, k]`` ends its
    constraint (a refused token ends nothing: its score is -inf)."""
    out = torch.zeros(tok.shape, dtype=torch.bool)
    for b in range(tok.shape[0]):
        for k in range(tok.shape[1]):
            m = matchers[b * n + int(parent[b, k])].fork()
            out[b, k] = m.accept_token(int(tok[b, k])) and m.is_terminated()
    return out


@dataclass
class _State:
    """transformers' beam state per prompt ``[B, num_beams, ...]``, on the CPU in float32."""

    run_tokens: torch.Tensor  # [B, N, new] generated ids of the running beams
    run_scores: torch.Tensor  # [B, N] summed log-probs
    fin_tokens: torch.Tensor  # [B, N, new]
    fin_scores: torch.Tensor  # [B, N] normalised scores (-1e9: empty)
    fin_logprob: torch.Tensor  # [B, N] summed log-probs of the finished ones
    fin_len: torch.Tensor  # [B, N] generated length
    fin_flag: torch.Tensor  # [B, N] bool
    fin_stop: torch.Tensor  # [B, N] bool: ended by a stop token or the constraint
    open_: torch.Tensor  # [B, 1] bool: may still improve (the early-stop heuristic)

    @classmethod
    def start(cls, b: int, n: int, new: int) -> _State:
        run_scores = torch.zeros(b, n)
        run_scores[:, 1:] = _NEG  # only beam 0 is live: the beams start identical
        return cls(
            run_tokens=torch.zeros(b, n, new, dtype=torch.long),
            run_scores=run_scores,
            fin_tokens=torch.zeros(b, n, new, dtype=torch.long),
            fin_scores=torch.full((b, n), _NEG),
            fin_logprob=torch.full((b, n), _NEG),
            fin_len=torch.zeros(b, n, dtype=torch.long),
            fin_flag=torch.zeros(b, n, dtype=torch.bool),
            fin_stop=torch.zeros(b, n, dtype=torch.bool),
            open_=torch.ones(b, 1, dtype=torch.bool),
        )

    def step(
        self, lp: torch.Tensor, t: int, cfg: _Config, matchers: list[Constraint] | None = None
    ) -> tuple[torch.Tensor, bool]:
        """Choose the step's continuations from log-probs ``lp`` ``[B, N, V]`` of the
        running beams at generated length ``t`` (``matchers``: theirs, when constrained);
        returns each new running beam's parent ``[B, N]`` and whether the search is
        over."""
        b, n, v = lp.shape
        acc = (lp + self.run_scores[:, :, None]).reshape(b, n * v)
        top_lp, top_idx = torch.topk(acc, k=cfg.keep)
        parent, tok = top_idx // v, top_idx % v
        cand = torch.take_along_dim(self.run_tokens, parent[:, :, None], dim=1)
        cand[:, :, t] = tok
        stops = torch.isin(tok, cfg.eos)
        if matchers is not None:
            stops |= _ends_constraint(matchers, n, parent, tok)
        ends = stops | (t + 1 >= cfg.max_new_tokens)

        # Running beams: the best N continuations that did not end.
        run_lp = top_lp + ends.to(torch.float32) * _NEG
        nxt = torch.topk(run_lp, k=n)[1]
        self.run_tokens = torch.take_along_dim(cand, nxt[:, :, None], dim=1)
        self.run_scores = torch.take_along_dim(run_lp, nxt, dim=1)
        parents = torch.take_along_dim(parent, nxt, dim=1)

        # Finished: only the first N candidates may join, each normalised by its length.
        first_n = torch.arange(cfg.keep) < n
        joined = ends & first_n[None]
        s = top_lp / ((t + 1) ** cfg.length_penalty)
        full = self.fin_flag.all(dim=-1, keepdim=True) & (cfg.early_stopping is True)
        s = s + full.to(torch.float32) * _NEG
        s = s + (~self.open_).to(torch.float32) * _NEG
        s = s + (~joined) * _NEG
        merged = torch.cat((self.fin_scores, s), dim=1)
        best = torch.topk(merged, k=n)[1]

        def pick(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            cat = torch.cat((old, new), dim=1)
            idx = best if cat.dim() == 2 else best[:, :, None]
            return torch.take_along_dim(cat, idx, dim=1)

        self.fin_tokens = pick(self.fin_tokens, cand)
        self.fin_logprob = pick(self.fin_logprob, top_lp)
        self.fin_len = pick(self.fin_len, torch.full_like(tok, t + 1))
        self.fin_flag = pick(self.fin_flag, joined)
        self.fin_stop = pick(self.fin_stop, stops)
        self.fin_scores = torch.take_along_dim(merged, best, dim=1)

        # Can a running beam still beat the worst finished one? With a positive penalty
        # under "never" it is judged at its longest possible length, else at the current.
        length = t + 1
        if cfg.early_stopping == "never" and cfg.length_penalty > 0.0:
            length = cfg.max_new_tokens
        best_running = self.run_scores[:, :1] / (length**cfg.length_penalty)
        worst = torch.where(
            self.fin_flag, self.fin_scores.min(dim=1, keepdim=True)[0], torch.tensor(_NEG)
        )
        self.open_ = self.open_ & (best_running > worst).any(dim=-1, keepdim=True)
        go_on = (
            bool(self.open_.any())
            and not (bool(self.fin_flag.all()) and cfg.early_stopping is True)
            and not bool(ends.all())
        )
        return parents, not go_on

    def results(self, k: int, prompt_lens: list[int]) -> list[list[BeamHypothesis]]:
        out = []
        for b in range(self.fin_tokens.shape[0]):
            hs = []
            for i in range(k):
                m = int(self.fin_len[b, i])
                hs.append(
                    BeamHypothesis(
                        tokens=self.fin_tokens[b, i, :m].tolist(),
                        score=float(self.fin_scores[b, i]),
                        logprob=float(self.fin_logprob[b, i]),
                        prompt_len=prompt_lens[b],
                        finish_reason="stop" if bool(self.fin_stop[b, i]) else "length",
                    )
                )
            out.append(hs)
        return out
