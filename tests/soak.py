"""Soak test: a simulated serving loop over one small paged KV pool.

A tiny random Llama target (float64, so batched, paged and dense forwards agree far below any
argmax margin) serves a stream of requests with random arrivals, cancellations, preemption
when the pool runs out of blocks (the victim is freed and restarts later from its prompt,
where a prefix hit may reuse its blocks), forks of live requests, shared prompt prefixes
(prefix-cache hits) and regex-constrained requests over a tiny byte vocabulary. Each step
drafts a tree per running request and verifies all of them in one ``Verifier.step_batch``
(sometimes one ``Verifier.step`` each), under a greedy rule that applies each constrained
node's grammar bitmask.

Checked as it runs: the manager's sequences are exactly the live requests' (no leak), each
cache holds its context minus the last token, a refused batch changes no cache (all or
nothing), and every completed request equals its reference: the target's greedy
autoregressive output (``autoregressive_generate``), or for a constrained request the
bitmask-masked greedy autoregressive output on a dense cache, and for a fork its parent's.
At the end every request is freed and: no block is held (refcounts all zero, every block
free or evictable), no sequence is left, the manager's invariants hold, no mismatch.

``make soak`` runs ``python3 tests/soak.py --steps 100000``; ``tests/test_soak.py`` runs a
short version in CI.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import specdec
from specdec.cache import PagedKVCache, PagedKVPool
from specdec.decode.common import emit
from specdec.draft.base import SequenceDrafter
from specdec.models import LlamaConfig, LlamaModel
from specdec.testing import BanningDrafter, OracleDrafter, RandomDrafter
from specdec.tree import DDTreeShape, DraftTree
from specdec.verify import DecodingRule, StepResult, Verifier

VOCAB = 64
EOS = 0
MAX_NEW = 32  # references are computed this far, requests ask for 4 .. MAX_NEW tokens
DEPTH = 4  # drafted depths per step
MAX_BUDGET = 8

# A tiny byte vocabulary the size of the model's: EOS, single characters, a few merges.
_PIECES = (
    [None]
    + [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz0123456789, -"]
    + [b"ab", b"ba", b"cd", b"yes", b"no", b", ", b"12", b"00", b"abc", b"x", b"-1"]
)
_PIECES = _PIECES + [f"<{i}>".encode() for i in range(VOCAB - len(_PIECES))]
PATTERNS = (
    r"[a-f]+",
    r"(yes|no)(, (yes|no)){0,5}",
    r"[0-9]{1,3}(,[0-9]{1,3}){0,6}",
    r"(ab|cd|e)+x?",
    r"-?[1-9][0-9]{0,4}",
)


# -- the pieces of the simulation ------------------------------------------------------------
class MaskedGreedy(DecodingRule):
    """Greedy, with the grammar bitmask of every constrained node applied first: ``rows``
    are the logits rows (node ``i`` of batch row ``r`` is row ``r * n + i``) of constrained
    nodes on grammar-valid paths, ``bitmask`` their int32 masks. Unconstrained rows (and
    invalid or padding nodes, which the walk never enters) are plain argmax."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.bitmask: np.ndarray | None = None

    def choose(
        self, logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        self._check(logits)
        if self.rows:
            assert self.bitmask is not None and len(self.rows) == len(self.bitmask)
            logits = logits.clone()
            specdec.apply_token_bitmask_inplace(logits, self.bitmask, indices=self.rows)
        return logits.argmax(dim=-1)


class RefDrafter(SequenceDrafter):
    """A cheap oracle: knows the request's reference continuation and drafts it, each depth
    missing (peak on a random token) with probability ``miss``; noise past the reference."""

    def __init__(self, ref: Sequence[int], prompt_len: int, miss: float, seed: int) -> None:
        self.ref, self.prompt_len, self.miss = list(ref), prompt_len, miss
        self.gen = torch.Generator().manual_seed(seed)
        self.rng = random.Random(seed)

    def draft_one(self, context: Sequence[int], depth: int) -> torch.Tensor:
        logits = torch.randn(depth, VOCAB, generator=self.gen)
        start = len(context) - self.prompt_len
        for d in range(depth):
            if start + d < len(self.ref) and self.rng.random() >= self.miss:
                logits[d, self.ref[start + d]] = 8.0
            else:
                logits[d, self.rng.randrange(VOCAB)] = 8.0
        return logits


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new: int
    pattern: str | None
    expected: list[int]  # the reference output, already cut at max_new (and EOS)
    drafter: SequenceDrafter
    budget: int
    pad: bool
    out: list[int] = field(default_factory=list)
    cache: PagedKVCache | None = None
    matcher: specdec.Matcher | None = None
    admitted_at: int = 0
    forked: bool = False

    @property
    def context(self) -> list[int]:
        return self.prompt + self.out


@dataclass
class Stats:
    steps: int = 0
    arrived: int = 0
    completed: int = 0
    cancelled: int = 0
    preempted: int = 0
    forks: int = 0
    prefix_hit_tokens: int = 0
    constrained: int = 0
    constrained_completed: int = 0
    batch_steps: int = 0
    single_steps: int = 0
    out_of_blocks: int = 0
    tokens_emitted: int = 0
    drafted_accepted: int = 0
    blocks_leaked: int = 0
    sequences_leaked: int = 0
    mismatches: int = 0
    unfinished_at_end: int = 0
    cached_blocks_at_end: int = 0
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)


def make_target(seed: int = 0, layers: int = 2) -> LlamaModel:
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    return LlamaModel(cfg).init_random(seed).double().eval()


def constrained_reference(
    target: LlamaModel, grammar: specdec.RegexGrammar, prompt: Sequence[int], n: int
) -> list[int]:
    """Masked greedy autoregressive decoding on a dense cache: at each step the matcher's
    bitmask, then argmax; stops after EOS or ``n`` tokens."""
    matcher = specdec.Matcher(grammar)
    cache = target.new_cache(len(prompt) + n)
    bitmask = specdec.allocate_token_bitmask(1, VOCAB)
    out: list[int] = []
    feed = list(prompt)
    with torch.no_grad():
        while len(out) < n:
            start = cache.committed_len
            logits = target(torch.tensor(feed), torch.arange(start, start + len(feed)), cache)
            cache.commit(torch.arange(len(feed)))
            matcher.fill_next_token_bitmask(bitmask)
            row = specdec.apply_token_bitmask(logits[-1:].clone(), bitmask)
            tok = int(row.argmax())
            assert matcher.accept_token(tok), "the mask allowed a token the matcher rejects"
            out.append(tok)
            if tok == EOS:
                break
            feed = [tok]
    return out


class Soak:
    """The serving loop. ``step()`` is one scheduler iteration; ``finish()`` frees everything
    and checks for leaks."""

    def __init__(
        self,
        seed: int = 0,
        *,
        num_blocks: int = 64,
        block_size: int = 4,
        max_running: int = 8,
        arrival_rate: float = 0.45,
        cancel_rate: float = 0.004,
        fork_rate: float = 0.05,
        constrained_rate: float = 0.25,
        single_step_rate: float = 0.1,
        watermark: int = 4,
        check_every: int = 1,
        layers: int = 2,
    ) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.target = make_target(seed, layers)
        c = self.target.config
        self.pool = PagedKVPool(
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim or 0,
            num_blocks,
            block_size,
            prefix_caching=True,
            dtype=torch.float64,
        )
        self.manager = self.pool.manager
        self.rule = MaskedGreedy()
        self.verifier = Verifier(self.target, self.rule)
        self.vocab = specdec.Vocabulary.from_bytes(_PIECES, eos_ids=[EOS])
        self.grammars = {p: self.vocab.regex(p) for p in PATTERNS}
        self.max_running = max_running
        self.arrival_rate, self.cancel_rate, self.fork_rate = arrival_rate, cancel_rate, fork_rate
        self.constrained_rate, self.single_step_rate = constrained_rate, single_step_rate
        self.check_every = check_every
        self.watermark = watermark  # free blocks kept back when admitting
        # Shared system prompts (prefix-cache hits) and a pool of prompts over them.
        self.families = [
            [self.rng.randrange(1, VOCAB) for _ in range(n)] for n in (6, 9, 13, 18, 24)
        ]
        self.prompts = [self._fresh_prompt() for _ in range(48)]
        self.refs: dict[tuple[tuple[int, ...], str | None], list[int]] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.next_rid = 0
        self.step_no = 0
        self.stats = Stats()

    # ---- requests ------------------------------------------------------------------------
    def _fresh_prompt(self) -> list[int]:
        fam = self.rng.choice(self.families + [[]])
        suffix = [self.rng.randrange(1, VOCAB) for _ in range(self.rng.randint(1, 14))]
        return fam + suffix

    def reference(self, prompt: list[int], pattern: str | None) -> list[int]:
        key = (tuple(prompt), pattern)
        ref = self.refs.get(key)
        if ref is None:
            if pattern is None:
                ref = specdec.autoregressive_generate(
                    self.target, prompt, max_new_tokens=MAX_NEW
                ).tokens
            else:
                ref = constrained_reference(self.target, self.grammars[pattern], prompt, MAX_NEW)
            self.refs[key] = ref
        return ref

    def _drafter(self, ref: list[int], prompt_len: int) -> SequenceDrafter:
        seed = self.rng.randrange(2**31)
        u = self.rng.random()
        if u < 0.6:
            return RefDrafter(ref, prompt_len, self.rng.choice((0.0, 0.1, 0.3, 0.6)), seed)
        if u < 0.8:
            return RandomDrafter(VOCAB, seed=seed)
        if u < 0.99:
            inner = RefDrafter(ref, prompt_len, 0.2, seed)
            return BanningDrafter(inner, lambda ctx: 1 + len(ctx) % 3)
        return OracleDrafter(self.target, miss=0.3, seed=seed)

    def arrive(self) -> None:
        self.stats.arrived += 1
        if self.rng.random() < 0.03:
            prompt = self._fresh_prompt()  # a new distinct prompt (a new reference)
        else:
            prompt = list(self.rng.choice(self.prompts))
        pattern = None
        if self.rng.random() < self.constrained_rate:
            pattern = self.rng.choice(PATTERNS)
            self.stats.constrained += 1
        max_new = self.rng.randint(4, MAX_NEW)
        ref = self.reference(prompt, pattern)
        expected = ref[:max_new]
        req = Request(
            rid=self.next_rid,
            prompt=prompt,
            max_new=max_new,
            pattern=pattern,
            expected=expected,
            drafter=self._drafter(ref, len(prompt)),
            budget=self.rng.randint(1, MAX_BUDGET),
            pad=self.rng.random() < 0.2,
        )
        self.next_rid += 1
        self.waiting.append(req)

    def fork(self, parent: Request) -> None:
        """A new request continuing ``parent``'s sequence (shared blocks, forked matcher):
        it must produce exactly the parent's output."""
        assert parent.cache is not None
        try:
            cache = parent.cache.fork()
        except specdec.OutOfBlocks:
            self.stats.out_of_blocks += 1
            return
        self.stats.arrived += 1
        self.stats.forks += 1
        if parent.pattern is not None:
            self.stats.constrained += 1
        ref = self.reference(parent.prompt, parent.pattern)
        child = Request(
            rid=self.next_rid,
            prompt=parent.prompt,
            max_new=parent.max_new,
            pattern=parent.pattern,
            expected=parent.expected,
            drafter=self._drafter(ref, len(parent.prompt)),
            budget=self.rng.randint(1, MAX_BUDGET),
            pad=self.rng.random() < 0.2,
            out=list(parent.out),
            cache=cache,
            matcher=None if parent.matcher is None else parent.matcher.fork(),
            admitted_at=self.step_no,
            forked=True,
        )
        self.next_rid += 1
        self.running.append(child)

    def release(self, req: Request) -> None:
        if req.cache is not None:
            req.cache.free()
            req.cache = None
        req.matcher = None

    def preempt(self, req: Request) -> None:
        """Free the request's blocks and queue it to restart from its prompt."""
        self.stats.preempted += 1
        self.running.remove(req)
        self.release(req)
        req.out = []
        self.waiting.appendleft(req)

    def admit(self, req: Request) -> bool:
        """Start ``req``: prefix hit, prefill of the rest of its prompt but the last token
        (the first tree's root). False (nothing held) if the pool is out of blocks."""
        try:
            cache = self.pool.sequence(req.prompt)
        except specdec.OutOfBlocks:
            self.stats.out_of_blocks += 1
            return False
        hit = cache.committed_len
        assert hit < len(req.prompt), "a prefix hit must leave the last prompt token"
        try:
            if hit < len(req.prompt) - 1:
                self.verifier.prefill(req.prompt[hit:-1], cache)
        except specdec.OutOfBlocks:
            self.stats.out_of_blocks += 1
            cache.free()
            return False
        self.stats.prefix_hit_tokens += hit
        req.cache = cache
        req.out = []
        req.matcher = None
        if req.pattern is not None:
            req.matcher = specdec.Matcher(self.grammars[req.pattern])
        req.admitted_at = self.step_no
        return True

    # ---- one decode step -----------------------------------------------------------------
    def build_tree(self, req: Request) -> DraftTree:
        ctx = req.context
        logits = req.drafter.draft_one(ctx, DEPTH)
        if req.matcher is None:
            tree = DDTreeShape(req.budget).build(logits, ctx[-1])
        else:
            lp = torch.log_softmax(logits.float(), dim=-1)
            vals, ids = torch.sort(lp, dim=-1, descending=True, stable=True)
            tree = specdec.build_ddtree_constrained(
                np.ascontiguousarray(vals.numpy()),
                np.ascontiguousarray(ids.numpy()),
                req.budget,
                req.matcher,
                root_token=ctx[-1],
            )
        if req.pad and tree.num_drafted < MAX_BUDGET:
            tree = tree.padded(MAX_BUDGET, pad_token=self.rng.randrange(VOCAB))
        return tree

    def set_masks(self, reqs: Sequence[Request], trees: Sequence[DraftTree]) -> None:
        """The rule's bitmask rows for the constrained requests' valid nodes, laid out as the
        verifier's logits rows (batch row r, node i -> r * n + i)."""
        n = max(t.num_nodes for t in trees)
        rows: list[int] = []
        masks: list[np.ndarray] = []
        for r, (req, tree) in enumerate(zip(reqs, trees, strict=True)):
            if req.matcher is None:
                continue
            buf = specdec.allocate_token_bitmask(tree.num_nodes, VOCAB)
            valid = specdec.fill_tree_bitmask(req.matcher, tree, buf)
            assert valid[0], "the root state must be valid"
            idx = np.flatnonzero(valid)
            rows.extend((r * n + idx).tolist())
            masks.append(buf[idx])
        self.rule.rows = rows
        self.rule.bitmask = np.concatenate(masks) if masks else None

    def advance(self, req: Request, res: StepResult) -> None:
        """Take a step's tokens; complete (compare, free) a request that is done."""
        assert req.cache is not None
        self.stats.drafted_accepted += res.num_accepted
        toks = res.tokens
        if req.cache.committed_len != len(req.context) + res.num_accepted:
            self.error(f"request {req.rid}: cache length out of step with its context")
        if req.matcher is not None:
            took = req.matcher.accept_tokens(toks)
            if took != len(toks):
                self.error(f"request {req.rid}: the matcher rejected a verified token")
        done = emit(req.out, toks, req.max_new, EOS if req.pattern is not None else None)
        self.stats.tokens_emitted += len(toks)
        if done:
            self.complete(req)

    def complete(self, req: Request) -> None:
        self.running.remove(req)
        self.release(req)
        self.stats.completed += 1
        if req.pattern is not None:
            self.stats.constrained_completed += 1
        if req.out != req.expected:
            self.stats.mismatches += 1
            self.error(
                f"request {req.rid} (prompt {req.prompt}, pattern {req.pattern!r}, "
                f"fork {req.forked}): got {req.out}, expected {req.expected}"
            )

    def error(self, msg: str) -> None:
        if len(self.stats.errors) < 20:
            self.stats.errors.append(f"step {self.step_no}: {msg}")

    def verify_batch(self) -> None:
        """All running requests in one step_batch; on OutOfBlocks check nothing changed,
        preempt the youngest request and retry with the rest."""
        self.stats.batch_steps += 1
        while self.running:
            reqs = list(self.running)
            trees = [self.build_tree(r) for r in reqs]
            caches = [r.cache for r in reqs]
            assert all(c is not None for c in caches)
            before = [c.committed_len for c in caches if c is not None]
            self.set_masks(reqs, trees)
            try:
                results = self.verifier.step_batch(trees, [c for c in caches if c is not None])
            except specdec.OutOfBlocks:
                self.stats.out_of_blocks += 1
                after = [(c.committed_len, c.pending) for c in caches if c is not None]
                if after != [(b, 0) for b in before]:
                    self.error("a refused step_batch changed a cache (not all or nothing)")
                victim = max(reqs, key=lambda r: (r.admitted_at, r.rid))
                self.preempt(victim)
                continue
            for req, res in zip(reqs, results, strict=True):
                self.advance(req, res)
            return

    def verify_single(self) -> None:
        """One Verifier.step per running request; a request the pool cannot hold is
        preempted."""
        self.stats.single_steps += 1
        for req in list(self.running):
            if req not in self.running:
                continue
            tree = self.build_tree(req)
            self.set_masks([req], [tree])
            assert req.cache is not None
            try:
                res = self.verifier.step(tree, req.cache)
            except specdec.OutOfBlocks:
                self.stats.out_of_blocks += 1
                if req.cache.pending:
                    self.error("a refused step left its cache pending")
                self.preempt(req)
                continue
            self.advance(req, res)

    def step(self) -> None:
        rng = self.rng
        self.step_no += 1
        self.stats.steps += 1
        # Arrivals (Poisson), some of them forks of a live request.
        for _ in range(np.random.default_rng(rng.randrange(2**32)).poisson(self.arrival_rate)):
            if self.running and rng.random() < self.fork_rate:
                self.fork(rng.choice(self.running))
            else:
                self.arrive()
        # Cancellations, running or waiting.
        for req in list(self.running):
            if rng.random() < self.cancel_rate:
                self.running.remove(req)
                self.release(req)
                self.stats.cancelled += 1
        for req in list(self.waiting):
            if rng.random() < self.cancel_rate:
                self.waiting.remove(req)
                self.stats.cancelled += 1
        # Admission, oldest first, while the pool holds them.
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            need = -(-(len(req.prompt) + MAX_BUDGET + 1) // self.pool.block_size)
            if self.running and self.manager.num_free_blocks() < need + self.watermark:
                break
            if not self.admit(req):
                if not self.running:
                    raise AssertionError(f"request {req.rid} does not fit an empty pool")
                break
            self.waiting.popleft()
            self.running.append(req)
        if self.running:
            if rng.random() < self.single_step_rate:
                self.verify_single()
            else:
                self.verify_batch()
        if self.check_every and self.step_no % self.check_every == 0:
            self.check()

    def check(self) -> None:
        live = {r.cache.seq for r in self.running if r.cache is not None}
        if set(self.manager.sequences()) != live:
            self.error(f"manager sequences {sorted(self.manager.sequences())} != live {live}")
        for r in self.running:
            assert r.cache is not None
            if r.cache.committed_len != len(r.context) - 1 or r.cache.pending:
                self.error(f"request {r.rid}: the cache does not hold its context minus one")
        self.manager.check_invariants()

    def finish(self) -> Stats:
        """Free every request, then count what is still held."""
        self.stats.unfinished_at_end = len(self.running) + len(self.waiting)
        for req in list(self.running):
            self.release(req)
        self.running.clear()
        self.waiting.clear()
        self.manager.check_invariants()
        m = self.manager
        held = int((m.refcounts() > 0).sum())
        self.stats.blocks_leaked = max(held, m.num_blocks - m.num_free_blocks())
        self.stats.sequences_leaked = len(m.sequences())
        self.stats.cached_blocks_at_end = m.num_cached_blocks()
        return self.stats

    def run(self, steps: int, progress: int = 0) -> Stats:
        t0 = time.perf_counter()
        with torch.no_grad():
            for i in range(1, steps + 1):
                self.step()
                if progress and i % progress == 0:
                    s = self.stats
                    print(
                        f"{i} steps, {time.perf_counter() - t0:.0f} s, {s.completed} completed, "
                        f"{s.preempted} preempted, {s.mismatches} mismatches",
                        file=sys.stderr,
                        flush=True,
                    )
        stats = self.finish()
        stats.wall_s = time.perf_counter() - t0
        return stats


# -- report ----------------------------------------------------------------------------------
def summary(s: Stats, seed: int) -> str:
    return (
        f"soak seed={seed}: {s.steps} steps in {s.wall_s:.1f} s "
        f"({s.steps / max(s.wall_s, 1e-9):.0f} steps/s), {s.arrived} arrived, "
        f"{s.completed} completed, {s.cancelled} cancelled, {s.preempted} preempted, "
        f"{s.forks} forks, {s.prefix_hit_tokens} prefix-hit tokens, {s.constrained} constrained, "
        f"blocks leaked {s.blocks_leaked}, sequences leaked {s.sequences_leaked}, "
        f"mismatches {s.mismatches}"
    )


def table(s: Stats) -> str:
    rows: list[tuple[str, Any]] = [
        ("steps", s.steps),
        ("requests arrived (forks included)", s.arrived),
        ("requests completed", s.completed),
        ("requests cancelled", s.cancelled),
        ("preemptions (OutOfBlocks)", s.preempted),
        ("forks", s.forks),
        ("prefix-hit tokens", s.prefix_hit_tokens),
        ("constrained requests (completed)", f"{s.constrained} ({s.constrained_completed})"),
        ("step_batch / per-request steps", f"{s.batch_steps} / {s.single_steps}"),
        ("tokens emitted (drafted accepted)", f"{s.tokens_emitted} ({s.drafted_accepted})"),
        ("unfinished at the end (freed)", s.unfinished_at_end),
        ("cached blocks at the end (free, evictable)", s.cached_blocks_at_end),
        ("blocks leaked", s.blocks_leaked),
        ("sequences leaked", s.sequences_leaked),
        ("mismatches", s.mismatches),
        ("wall time", f"{s.wall_s:.1f} s"),
    ]
    lines = ["| soak | |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blocks", type=int, default=64, help="KV blocks in the pool")
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--max-running", type=int, default=8)
    ap.add_argument(
        "--check-every", type=int, default=1, help="steps between full invariant checks"
    )
    ap.add_argument("--progress", type=int, default=0, help="report every N steps (stderr)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    soak = Soak(
        args.seed,
        num_blocks=args.blocks,
        block_size=args.block_size,
        max_running=args.max_running,
        check_every=args.check_every,
    )
    stats = soak.run(args.steps, args.progress)
    print(summary(stats, args.seed))
    print()
    print(table(stats))
    for e in stats.errors:
        print("ERROR", e, file=sys.stderr)
    ok = (
        stats.blocks_leaked == 0
        and stats.sequences_leaked == 0
        and stats.mismatches == 0
        and not stats.errors
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
