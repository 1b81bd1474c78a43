"""Reference implementations and test doubles the tests and benchmarks use: plain-Python
versions of the product's algorithms (independent oracles), synthetic drafter marginals, and
drafters with known behaviour. Nothing here is on a hot path."""

from __future__ import annotations

import heapq
import itertools
import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .draft.base import SequenceDrafter
from .draft.model import greedy_rollout
from .protocols import Target

if TYPE_CHECKING:
    from .models import LlamaConfig

__all__ = [
    "SCALES",
    "synthetic_marginals",
    "python_ddtree",
    "reference_ddtree",
    "brute_force_scores",
    "ancestor_path",
    "ancestor_set",
    "reference_tree_mask",
    "naive_walk",
    "reference_suffix_proposal",
    "RandomDrafter",
    "OracleDrafter",
    "AdversarialDrafter",
    "BanningDrafter",
    "tiny_config",
    "tiny_sampling_target",
    "smoke_target",
    "exact_pair_distribution",
    "pair_chi_square",
]


# -- trees -----------------------------------------------------------------------------------
#: Logit scales of the synthetic drafters: mean top-1 probability about 0.19 ("flat", wide
#: shallow trees) and about 0.53 ("peaked", closer to a trained drafter, deeper trees).
SCALES = {"flat": 3.0, "peaked": 6.0}


def synthetic_marginals(
    depth: int,
    k: int,
    vocab: int = 8192,
    seed: int = 0,
    batch: int | None = None,
    scale: float = SCALES["flat"],
) -> tuple[np.ndarray, np.ndarray]:
    """Drafter-like marginals: log-softmax of random logits, top ``k`` per depth, sorted."""
    rng = np.random.default_rng(seed)
    shape = (depth, vocab) if batch is None else (batch, depth, vocab)
    logits = rng.normal(0.0, scale, size=shape).astype(np.float32)
    logits -= logits.max(-1, keepdims=True)
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ids = np.argsort(-lp, axis=-1, kind="stable")[..., :k]
    vals = np.take_along_axis(lp, ids, -1).astype(np.float32)
    return np.ascontiguousarray(vals), np.ascontiguousarray(ids.astype(np.int64))


def python_ddtree(
    logprobs: np.ndarray, token_ids: np.ndarray, budget: int, prefix_len: int = 0
) -> tuple[list[int], list[int], np.ndarray, np.ndarray]:
    """Plain-Python DDTree: heapq over rank tuples, then the visibility matrix and positions."""
    depth = logprobs.shape[0]
    k = min(budget, logprobs.shape[1])
    lp = logprobs[:, :k].tolist()
    ids = token_ids[:, :k].tolist()
    tokens, parents, depths = [-1], [-1], [0]
    counter = 0
    heap: list[tuple[float, int, float, tuple[int, ...], int]] = [
        (-lp[0][0], counter, 0.0, (0,), 0)
    ]
    while heap and len(tokens) <= budget:
        neg, _, base, ranks, parent = heapq.heappop(heap)
        score = -neg
        d = len(ranks) - 1
        node = len(tokens)
        tokens.append(ids[d][ranks[-1]])
        parents.append(parent)
        depths.append(d + 1)
        r = ranks[-1] + 1
        if r < k and lp[d][r] != float("-inf"):
            counter += 1
            heapq.heappush(heap, (-(base + lp[d][r]), counter, base, ranks[:-1] + (r,), parent))
        if d + 1 < depth and lp[d + 1][0] != float("-inf"):
            counter += 1
            heapq.heappush(heap, (-(score + lp[d + 1][0]), counter, score, ranks + (0,), node))
    n = len(tokens)
    visible = np.zeros((n, n), dtype=bool)
    for i in range(n):
        if parents[i] >= 0:
            visible[i] = visible[parents[i]]
        visible[i, i] = True
    positions = np.asarray(depths, dtype=np.int64) + prefix_len
    return tokens, parents, visible, positions


# -- oracles: plain versions of what Rust does fast -----------------------------------------
def reference_ddtree(
    lp: np.ndarray, ids: np.ndarray, budget: int, min_prob: float = 0.0
) -> tuple[list[int], list[int], list[int], list[float]]:
    """Algorithm 1 written plainly: heap of (-score, push counter, rank tuple, parent node).
    Scores are parent score + marginal, in float64, sibling pushed before child; the build
    stops at the first prefix of probability below ``min_prob``."""
    depth, width = lp.shape
    k = min(budget, width)
    tok, par, dep, score = [-1], [-1], [0], [0.0]
    heap: list[tuple[float, int, float, tuple[int, ...], int]] = []
    counter = itertools.count()

    def push(base: float, ranks: tuple[int, ...], parent: int) -> None:
        d = len(ranks) - 1
        v = float(lp[d, ranks[-1]])
        if v != -np.inf:
            heapq.heappush(heap, (-(base + v), next(counter), base, ranks, parent))

    push(0.0, (0,), 0)
    while heap and len(tok) <= budget:
        neg, _, base, ranks, parent = heapq.heappop(heap)
        if min_prob > 0.0 and -neg < math.log(min_prob):
            break
        node = len(tok)
        tok.append(int(ids[len(ranks) - 1, ranks[-1]]))
        par.append(parent)
        dep.append(len(ranks))
        score.append(-neg)
        if ranks[-1] + 1 < k:
            push(base, ranks[:-1] + (ranks[-1] + 1,), parent)
        if len(ranks) < depth:
            push(-neg, ranks + (0,), node)
    return tok, par, dep, score


def brute_force_scores(lp: np.ndarray) -> list[float]:
    """Scores of every finite prefix over all ranks, best first."""
    depth, width = lp.shape
    out = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(width), repeat=d):
            s = sum(float(lp[i, r]) for i, r in enumerate(ranks))
            if s != -np.inf:
                out.append(s)
    return sorted(out, reverse=True)


def ancestor_path(node: int, parents: Sequence[int]) -> list[int]:
    """Node indices from the root to ``node`` (walking the parents)."""
    path = []
    while node != -1:
        path.append(int(node))
        node = int(parents[node])
    return path[::-1]


def ancestor_set(parents: Sequence[int], i: int) -> set[int]:
    """``i`` and its ancestors."""
    return set(ancestor_path(i, parents))


def reference_tree_mask(parents: Sequence[int], p: int) -> torch.Tensor:
    """``[n, p + n]`` bool: every node sees the prefix, itself and its ancestors."""
    n = len(parents)
    m = torch.zeros(n, p + n, dtype=torch.bool)
    m[:, :p] = True
    for i in range(n):
        m[i, [p + j for j in ancestor_path(i, parents)]] = True
    return m


def naive_walk(
    tokens: Sequence[int], parents: Sequence[int], chosen: Sequence[int]
) -> tuple[list[int], int]:
    """The verifier walk by scanning every node for a matching child."""
    node, acc = 0, list[int]()
    while True:
        kids = [j for j in range(len(tokens)) if parents[j] == node and tokens[j] == chosen[node]]
        if not kids:
            return acc, int(chosen[node])
        acc.append(kids[0])
        node = kids[0]


def reference_suffix_proposal(
    sequences: Sequence[Sequence[int]],
    context: Sequence[int],
    *,
    max_match: int,
    max_depth: int,
    budget: int,
    min_prob: float = 0.0,
    min_match: int = 1,
    depth_factor: float | None = None,
) -> list[tuple[list[int], float]]:
    """What :meth:`specdec._core.SuffixIndex.propose` drafts, from scratch: the drafted paths
    (root excluded) in node order with their log path probabilities.

    ``sequences`` are the pooled sequences in the order a proposal reads them: the corpus
    partition's in the order they were added, then the request's own tokens. The longest
    suffix of ``context`` (at most ``max_match`` tokens) that occurs somewhere with a token
    after it is matched; every such occurrence, in order,
    contributes its next ``max_depth`` tokens. Each distinct prefix of those continuations
    is counted and scored count / occurrences; the first ``budget`` prefixes of probability
    >= ``min_prob``, sorted by count descending then first appearance (occurrence, then
    length), are the tree. No suffix shorter than ``min_match`` matches; with
    ``depth_factor`` a match of ``m`` tokens contributes ``floor(depth_factor * m)`` tokens
    (at least 1, at most ``max_depth``)."""
    ctx = list(context)
    for m in range(min(max_match, len(ctx)), min_match - 1, -1):
        suffix = ctx[len(ctx) - m :]
        depth = max_depth
        if depth_factor is not None:
            depth = min(max(1, math.floor(depth_factor * m)), max(max_depth, 1))
        conts = [
            list(seq[end : end + depth])
            for seq in sequences
            for end in range(m, len(seq))
            if list(seq[end - m : end]) == suffix
        ]
        if not conts or max_depth == 0:
            continue
        first: dict[tuple[int, ...], tuple[int, int]] = {}
        count: dict[tuple[int, ...], int] = {}
        for i, c in enumerate(conts):
            for length in range(1, len(c) + 1):
                key = tuple(c[:length])
                first.setdefault(key, (i, length))
                count[key] = count.get(key, 0) + 1
        total = len(conts)
        ranked = sorted(count, key=lambda k: (-count[k], first[k]))
        kept = [k for k in ranked if count[k] >= min_prob * total][:budget]
        return [(list(k), math.log(count[k] / total)) for k in kept]
    return []


# -- drafters with known behaviour -----------------------------------------------------------
class RandomDrafter(SequenceDrafter):
    """Random logits (low acceptance)."""

    def __init__(self, vocab_size: int, *, seed: int = 0, scale: float = 3.0) -> None:
        self.vocab_size = vocab_size
        self.scale = scale
        self.gen = torch.Generator().manual_seed(seed)

    def draft_one(self, context: Sequence[int], depth: int) -> torch.Tensor:
        return self.scale * torch.randn(depth, self.vocab_size, generator=self.gen)


class OracleDrafter(SequenceDrafter):
    """Knows the target's greedy continuation; with ``miss > 0`` each depth's peak moves to a
    random wrong token with that probability."""

    def __init__(self, target: Target, *, miss: float = 0.0, seed: int = 0) -> None:
        self.target = target
        self.miss = miss
        self.gen = torch.Generator().manual_seed(seed)

    def draft_one(self, context: Sequence[int], depth: int) -> torch.Tensor:
        toks, _ = greedy_rollout(self.target, context, depth)
        v = self.target.vocab_size
        logits = torch.randn(depth, v, generator=self.gen)
        for d, t in enumerate(toks):
            if self.miss and float(torch.rand((), generator=self.gen)) < self.miss:
                t = (t + 1 + int(torch.randint(v - 1, (), generator=self.gen))) % v
            logits[d, t] = 10.0
        return logits


class AdversarialDrafter(SequenceDrafter):
    """Ranks the target's greedy next token last (-inf at depth 1, so no tree contains it):
    a greedy verifier accepts nothing and every step emits only its bonus token."""

    def __init__(self, target: Target, *, seed: int = 0) -> None:
        self.target = target
        self.gen = torch.Generator().manual_seed(seed)

    def draft_one(self, context: Sequence[int], depth: int) -> torch.Tensor:
        toks, _ = greedy_rollout(self.target, context, 1)
        logits = torch.randn(depth, self.target.vocab_size, generator=self.gen)
        logits[0, toks[0]] = -torch.inf
        return logits


class BanningDrafter(SequenceDrafter):
    """Wraps a drafter and bans (-inf) all but its ``keep(context)`` best tokens per depth, so
    trees can hold fewer nodes than the budget (padding really happens, and -inf marginals
    are exercised)."""

    def __init__(self, inner: SequenceDrafter, keep: Callable[[Sequence[int]], int]) -> None:
        self.inner = inner
        self.keep = keep

    def draft_one(self, context: Sequence[int], depth: int) -> torch.Tensor:
        logits = self.inner.draft_one(context, depth).clone()
        k = self.keep(context)
        banned = logits.argsort(dim=-1, descending=True)[:, k:]
        return logits.scatter(-1, banned, float("-inf"))


# -- tiny models -----------------------------------------------------------------------------
def tiny_config(vocab_size: int, *, max_positions: int = 160) -> LlamaConfig:
    """The tests' small Llama layout (hidden 32, two layers, 4 heads over 2 KV heads): fast
    enough for thousands of steps, big enough for batching, GQA and paged caches."""
    from .models import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )


# -- sampling ----------------------------------------------------------------------------------
def tiny_sampling_target(vocab_size: int = 6, seed: int = 7) -> Any:
    """A float64 two-layer Llama over ``vocab_size`` tokens whose next-token distributions
    are spread enough for a chi-square test of sampling to have many cells."""
    from .models import LlamaConfig, LlamaModel

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    return LlamaModel(cfg).double().init_random(seed, std=0.6)


def smoke_target(seed: int = 0) -> Any:
    """The benches' ``--smoke`` target: a random three-layer Llama over 64 tokens (the
    scripts run end to end in seconds; nothing it measures means anything)."""
    from .models import LlamaConfig, LlamaModel

    return LlamaModel(LlamaConfig(vocab_size=64, num_hidden_layers=3)).init_random(seed)


def exact_pair_distribution(target: Any, prompt: Sequence[int]) -> dict[tuple[int, int], float]:
    """P(first two generated tokens) at temperature 1, by enumeration with plain causal
    forwards (the oracle a sampler is tested against)."""

    def probs(seq: list[int]) -> torch.Tensor:
        lg = target(torch.tensor(seq), torch.arange(len(seq)), target.new_cache(len(seq)), None)
        return torch.softmax(lg[-1], -1)

    v = target.vocab_size
    p1 = probs(list(prompt))
    return {(a, b): float(p1[a] * probs([*prompt, a])[b]) for a in range(v) for b in range(v)}


def pair_chi_square(
    counts: dict[tuple[int, int], int], exact: dict[tuple[int, int], float]
) -> float:
    """The chi-square p-value of observed pair ``counts`` against ``exact`` (cells expected
    under 5 pooled into one)."""
    from scipy import stats

    n = sum(counts.values())
    keys = sorted(exact, key=lambda k: -exact[k])
    big = [k for k in keys if exact[k] * n >= 5]
    obs = [counts.get(k, 0) for k in big] + [n - sum(counts.get(k, 0) for k in big)]
    exp = [exact[k] * n for k in big] + [n * (1 - sum(exact[k] for k in big))]
    return float(stats.chisquare(obs, exp).pvalue)


def permute_like_llama_cpp(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's row order for q/k: each head's two halves interleaved."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


_PRINTABLE = [chr(c) for c in range(0x21, 0x7F)]  # a byte-level vocabulary's printable part


def write_gguf(
    path: str | os.PathLike[str],
    model: Any,
    qtype: str = "F32",
    *,
    arch: str = "llama",
    override: dict[str, np.ndarray] | None = None,
) -> None:
    """``model`` (a ``LlamaModel`` whose vocabulary has at least 98 tokens) written to ``path``
    as llama.cpp would: metadata, a byte-level vocabulary, renamed tensors with q/k rows
    permuted, 2-D tensors quantized to ``qtype`` (a GGUF type name); ``override``: raw
    ``Q4_K`` data for some tensors (by GGUF name), to write a type the loader refuses."""
    import gguf

    from .models.gguf import _GLOBAL_NAMES, _LAYER_NAMES

    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    tokens = ["<|endoftext|>", *_PRINTABLE, "\u0120", "he", "hel"]  # \u0120: a space
    tokens += [f"<unused{i}>" for i in range(c.vocab_size - len(tokens))]
    w.add_token_list(tokens)
    w.add_token_merges(["h e", "he l"])
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_eos_token_id(0)
    names = {v: k for k, v in _GLOBAL_NAMES.items()}
    layer = {v: k for k, v in _LAYER_NAMES.items()}
    kind = gguf.GGMLQuantizationType[qtype]
    for name, p in model.state_dict().items():
        a = p.detach().numpy().astype(np.float32)
        if name.startswith("model.layers."):
            _, _, n, rest = name.split(".", 3)
            gname = f"blk.{n}.{layer[rest]}"
        else:
            gname = names[name]
        if gname.endswith("attn_q.weight"):
            a = permute_like_llama_cpp(a, c.num_attention_heads)
        elif gname.endswith("attn_k.weight"):
            a = permute_like_llama_cpp(a, c.num_key_value_heads)
        if override and gname in override:
            w.add_tensor(gname, override[gname], raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        elif a.ndim == 1 or qtype == "F32":
            w.add_tensor(gname, a)
        else:
            w.add_tensor(gname, gguf.quants.quantize(a, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
