"""Beam search: a worked example (a fixed logits table), equality with transformers'
``generate(num_beams=..., do_sample=False)`` on a tiny random Llama (every early-stopping
mode, three length penalties, widths 2 and 4, one and two returned sequences, batches), a
grammar against transformers' ``prefix_allowed_tokens_fn``, and the paged KV sharing: prompt
blocks held once, no block leaked, the batched paged forward equal to one-sequence forwards."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.cache import DenseKVCache, PagedKVCache, PagedKVPool
from specdec.constrain import Matcher, RegexGrammar, Vocabulary
from specdec.decode import BeamSearchResult, autoregressive_generate, beam_search
from specdec.models import LlamaConfig, LlamaModel

A, B, C, EOS = 0, 1, 2, 3
TABLE = {
    (): [2.0, 1.7, -2.0, -4.0],
    (A,): [-0.1, -0.2, -0.3, 0.0],
    (B,): [2.5, -3.0, -3.0, -1.0],
    (B, A): [-3.0, -3.0, -3.0, 3.0],
}
OTHERWISE = [-4.0, -4.0, -4.0, 4.0]


class TableTarget:
    """A fixed logits table, keyed by the generated tokens. The target stores each
    token id as its key and reads the context back from the cache, so a beam whose block
    table were reordered wrongly would see another beam's tokens."""

    vocab_size = 4
    max_positions = 64
    device = torch.device("cpu")
    dtype = torch.float32

    def __init__(self, prompt_len: int) -> None:
        self.prompt_len = prompt_len

    def new_cache(self, max_len: int | None = None) -> DenseKVCache:
        return DenseKVCache(1, 1, 2, max_len or 64)

    def __call__(
        self, ids: torch.Tensor, pos: torch.Tensor, cache: Any, mask: Any = None
    ) -> torch.Tensor:
        t = ids.numel()
        cache.begin(t)
        k = torch.stack([ids.float(), pos.float()], -1)[None]
        k_all, _ = cache.append(0, k, k)
        ctx = k_all[0, :, 0].round().long().tolist()
        assert k_all[0, :, 1].tolist() == list(range(len(ctx)))  # positions in order
        start = cache.committed_len
        gen = [tuple(ctx[self.prompt_len : i + 1]) for i in range(start, start + t)]
        rows = [TABLE.get(g, OTHERWISE) for g in gen]
        return torch.tensor(rows)


def test_the_worked_example() -> None:
    target = TableTarget(prompt_len=2)
    prompt = [C, C]
    assert autoregressive_generate(target, prompt, max_new_tokens=5, eos_token_id=EOS).tokens == [
        A,
        EOS,
    ]
    for lp in (0.0, 1.0, 2.0):
        r = beam_search(
            target,
            [prompt],
            num_beams=2,
            max_new_tokens=5,
            eos_token_id=EOS,
            length_penalty=lp,
            num_return_sequences=2,
        )
        assert isinstance(r, BeamSearchResult)
        assert r.sequences == [[[B, A, EOS], [A, EOS] if lp < 1 else r.sequences[0][1]]]
        best = r.hypotheses[0][0]
        assert best.logprob == pytest.approx(-0.911291, abs=1e-6)
        assert best.score == pytest.approx(best.logprob / 3**lp, rel=1e-6)
    r0 = beam_search(
        target,
        prompt,
        num_beams=2,
        max_new_tokens=5,
        eos_token_id=EOS,
        length_penalty=0.0,
        num_return_sequences=2,
    )
    assert [h.logprob for h in r0.hypotheses[0]] == pytest.approx([-0.911291, -1.808765], abs=1e-6)
    assert r0.scores[0] == pytest.approx([-0.911291, -1.808765], abs=1e-6)
    # Independent arithmetic: log-softmax of the table rows along each path.
    lsm = lambda row, i: row[i] - math.log(sum(math.exp(x) for x in row))  # noqa: E731
    bae = lsm(TABLE[()], B) + lsm(TABLE[(B,)], A) + lsm(TABLE[(B, A)], EOS)
    ae = lsm(TABLE[()], A) + lsm(TABLE[(A,)], EOS)
    assert r0.scores[0] == pytest.approx([bae, ae], abs=1e-6)


class RandomTable(TableTarget):
    """Random logits per generated prefix (vocab 3, EOS = 2), fixed by ``seed``."""

    vocab_size = 3

    def __init__(self, seed: int, prompt_len: int = 1) -> None:
        super().__init__(prompt_len)
        self.seed = seed
        self.rows: dict[tuple[int, ...], list[float]] = {}

    def row(self, gen: tuple[int, ...]) -> list[float]:
        if gen not in self.rows:
            g = torch.Generator().manual_seed(hash((self.seed, gen)) % 2**62)
            self.rows[gen] = (2 * torch.randn(3, generator=g, dtype=torch.float64)).tolist()
        return self.rows[gen]

    def __call__(
        self, ids: torch.Tensor, pos: torch.Tensor, cache: Any, mask: Any = None
    ) -> torch.Tensor:
        t = ids.numel()
        cache.begin(t)
        k = torch.stack([ids.float(), pos.float()], -1)[None]
        ctx = cache.append(0, k, k)[0][0, :, 0].round().long().tolist()
        start = cache.committed_len
        gen = [tuple(ctx[self.prompt_len : i + 1]) for i in range(start, start + t)]
        return torch.tensor([self.row(g) for g in gen])


def exhaustive(target: RandomTable, new: int, eos: int, lp: float) -> dict[tuple[int, ...], float]:
    """Every complete continuation (ends with EOS, or reaches ``new`` tokens) and its score."""
    out: dict[tuple[int, ...], float] = {}

    def walk(gen: tuple[int, ...], total: float) -> None:
        row = torch.tensor(target.row(gen), dtype=torch.float64).log_softmax(-1).tolist()
        for tok, x in enumerate(row):
            seq = (*gen, tok)
            if tok == eos or len(seq) == new:
                out[seq] = (total + x) / len(seq) ** lp
            else:
                walk(seq, total + x)

    walk((), 0.0)
    return out


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    lp=st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]),
    ret=st.integers(1, 4),
)
def test_wide_enough_never_search_is_exhaustive(seed: int, lp: float, ret: int) -> None:
    """With early_stopping="never" and more beams than live prefixes, transformers' beam
    search sees every complete sequence and cannot stop early (its bound holds): the
    result is the exhaustive top ``ret`` by normalised score."""
    target = RandomTable(seed)
    new, eos = 3, 2
    r = beam_search(
        target,
        [[0]],
        num_beams=12,
        max_new_tokens=new,
        eos_token_id=eos,
        length_penalty=lp,
        early_stopping="never",
        num_return_sequences=ret,
    )
    oracle = exhaustive(target, new, eos, lp)
    best = sorted(oracle.values(), reverse=True)[:ret]
    assert r.scores[0] == pytest.approx(best, rel=1e-5, abs=1e-5)
    for h in r.hypotheses[0]:
        assert h.score == pytest.approx(oracle[tuple(h.tokens)], rel=1e-5, abs=1e-5)


# -- transformers -------------------------------------------------------------------------

CFG = dict(
    vocab_size=16,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights large enough that logits differ clearly between contexts."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            else:
                std = 0.5 if p.dim() == 1 or "embed" in name else 1 / math.sqrt(p.shape[-1])
                p.copy_(std * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.fixture(scope="module")
def pair() -> tuple[Any, LlamaModel]:
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    hf = randomize_(LlamaForCausalLM(HFConfig(**CFG)).double().eval())
    ours = LlamaModel(LlamaConfig(**CFG)).double()  # type: ignore[arg-type]
    ours.load_state_dict(hf.state_dict())
    return hf, ours


def hf_beams(hf: Any, prompts: list[list[int]], **kw: Any) -> tuple[list[list[int]], list[float]]:
    """transformers' hypotheses (generated part, its own length) and sequence scores."""
    ids = torch.tensor(prompts)
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            return_dict_in_generate=True,
            output_scores=True,
            pad_token_id=0,
            **kw,
        )
    p = ids.shape[1]
    lens = (out.beam_indices >= 0).sum(1).tolist()
    seqs = [out.sequences[i, p : p + n].tolist() for i, n in enumerate(lens)]
    return seqs, out.sequences_scores.tolist()


# (prompts, eos): chosen so that searches end early, at different steps per mode.
CASES = [
    ([[2, 9, 4, 11]], 6),
    ([[1, 5, 7, 3]], 13),
    ([[1, 5, 7, 3], [2, 9, 4, 11]], 4),  # a batch, compared with transformers' batch
    ([[7, 7, 1], [2, 9, 4, 11, 3]], 9),  # lengths differ: compared prompt by prompt
]


@pytest.mark.parametrize("early_stopping", [False, True, "never"])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_matches_transformers(pair: Any, length_penalty: float, early_stopping: Any) -> None:
    hf, ours = pair
    for (prompts, eos), beams, ret in itertools.product(CASES, (2, 4), (1, 2)):
        kw = dict(
            num_beams=beams,
            max_new_tokens=10,
            eos_token_id=eos,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            num_return_sequences=ret,
        )
        if len({len(p) for p in prompts}) == 1:
            ref_seqs, ref_scores = hf_beams(hf, prompts, **kw)
        else:
            ref_seqs, ref_scores = [], []
            for p in prompts:
                s, sc = hf_beams(hf, [p], **kw)
                ref_seqs += s
                ref_scores += sc
        r = beam_search(ours, prompts, **kw)
        assert [s for ss in r.sequences for s in ss] == ref_seqs, kw
        assert [s for ss in r.scores for s in ss] == pytest.approx(ref_scores, abs=1e-5), kw
        for hs in r.hypotheses:
            for h in hs:
                assert h.score == pytest.approx(h.logprob / len(h.tokens) ** length_penalty)


def test_the_cases_stop_early_and_the_modes_differ(pair: Any) -> None:
    """The comparison above covers searches that end before ``max_new_tokens``, at steps
    that depend on the early-stopping mode."""
    _, ours = pair
    steps = {
        (lp, es): beam_search(
            ours,
            [[2, 9, 4, 11]],
            num_beams=2,
            max_new_tokens=10,
            eos_token_id=4,
            length_penalty=lp,
            early_stopping=es,
        ).steps
        for lp in (0.0, 1.0, 2.0)
        for es in (False, True, "never")
    }
    assert min(steps.values()) < 10
    for lp in (0.0, 1.0, 2.0):
        assert steps[lp, True] < steps[lp, "never"]


def test_logits_processors_as_in_transformers(pair: Any) -> None:
    from transformers import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

    hf, ours = pair
    prompts = [[1, 5, 7, 3], [2, 9, 4, 11]]
    kw = dict(num_beams=3, max_new_tokens=8, eos_token_id=4, num_return_sequences=3)
    ref = hf_beams(hf, prompts, no_repeat_ngram_size=2, repetition_penalty=1.3, **kw)
    procs = [RepetitionPenaltyLogitsProcessor(1.3), NoRepeatNGramLogitsProcessor(2)]
    r = beam_search(ours, prompts, logits_processors=procs, **kw)  # type: ignore[arg-type]
    assert [s for ss in r.sequences for s in ss] == ref[0]
    assert [s for ss in r.scores for s in ss] == pytest.approx(ref[1], abs=1e-5)


def test_grammar_per_beam_matches_prefix_constrained_transformers(pair: Any) -> None:
    hf, ours = pair
    letters = [bytes([c]) for c in b"abcdefghijklmno"] + [None]  # id 15: EOS
    vocab = Vocabulary.from_bytes(letters, eos_ids=[15])
    grammar = RegexGrammar(vocab, "(ab|ba|c[def])+g")

    def allowed(batch_id: int, ids: torch.Tensor) -> list[int]:
        m = Matcher(grammar)
        for t in ids[len(prompt) :].tolist():
            assert m.accept_token(t)
        return [int(t) for t in m.allowed_tokens()]

    for prompt in ([1, 5, 7, 3], [2, 9, 4, 11]):
        kw = dict(num_beams=4, max_new_tokens=9, eos_token_id=15, num_return_sequences=4)
        ref = hf_beams(hf, [prompt], prefix_allowed_tokens_fn=allowed, **kw)
        r = beam_search(ours, [prompt], constraint=grammar, **kw)  # type: ignore[arg-type]
        assert r.sequences[0] == ref[0]
        assert r.scores[0] == pytest.approx(ref[1], abs=1e-5)
        finished = [h for h in r.hypotheses[0] if h.tokens[-1] == 15]
        assert finished  # some hypotheses complete the grammar
        for h in r.hypotheses[0]:
            assert h.prompt_len == len(prompt)
            assert h.finish_reason == ("stop" if h in finished else "length")
            assert h.finish_reason == "stop" or len(h.tokens) == 9
        for h in finished:
            m = Matcher(grammar)
            assert m.accept_tokens(h.tokens) == len(h.tokens) and m.is_terminated()


# -- paged KV -----------------------------------------------------------------------------


class Watched:
    """A LlamaModel seen through: records every step's block tables and refcounts."""

    def __init__(self, model: LlamaModel, paged: bool = True) -> None:
        self.model = model
        self.tables: list[list[list[int]]] = []
        self.refcounts: list[list[int]] = []
        self.pool: PagedKVPool | None = None
        if paged:
            self.forward_paged = self._paged

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, *a: Any) -> torch.Tensor:
        cache = a[2]
        if isinstance(cache, PagedKVCache):
            self.pool = cache.pool
        out: torch.Tensor = self.model(*a)
        return out

    def _paged(self, ids: torch.Tensor, pos: torch.Tensor, caches: list[PagedKVCache]) -> Any:
        self.pool = caches[0].pool
        self.tables.append([c.block_table().tolist() for c in caches])
        self.refcounts.append(self.pool.manager.refcounts().tolist())
        return self.model.forward_paged(ids, pos, caches)


@pytest.fixture(scope="module")
def small() -> LlamaModel:
    cfg = {**CFG, "vocab_size": 64}
    return LlamaModel(LlamaConfig(**cfg)).init_random(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("beams", [1, 3, 4])
def test_prompt_blocks_held_once_and_nothing_leaks(small: LlamaModel, beams: int) -> None:
    bs, p, new = 4, 11, 9
    prompt = list(range(1, p + 1))
    w = Watched(small)
    r = beam_search(
        w,
        [prompt],
        num_beams=beams,
        max_new_tokens=new,
        eos_token_id=None,
        block_size=bs,
        num_return_sequences=beams,
    )
    full = p // bs  # the prompt's full blocks
    assert w.pool is not None and w.tables
    for tables, rc in zip(w.tables, w.refcounts, strict=True):
        shared = tables[0][:full]
        assert all(t[:full] == shared for t in tables)  # the same blocks in every beam...
        assert all(rc[b] == beams for b in shared)  # ...held once, referenced by each beam
    # Each beam's own blocks: at most its generated part plus the prompt's partial tail.
    assert r.peak_kv_blocks <= full + beams * (-(-(p % bs + new) // bs))
    copied = beam_search(
        small,
        [prompt],
        num_beams=beams,
        max_new_tokens=new,
        eos_token_id=None,
        block_size=bs,
        share_kv=False,
    )
    assert copied.sequences[0][0] == r.sequences[0][0]
    assert copied.peak_kv_blocks >= beams * -(-(p + new - 1) // bs)
    if beams > 1:
        assert r.peak_kv_blocks < copied.peak_kv_blocks
    m = w.pool.manager
    assert len(m) == 0 and m.num_free_blocks() == m.num_blocks
    m.check_invariants()


def test_every_kv_path_gives_the_same_search(small: LlamaModel) -> None:
    prompts = [[5, 6, 7, 8, 9, 10, 11], [3, 1, 4]]
    kw: dict[str, Any] = dict(num_beams=3, max_new_tokens=7, eos_token_id=2)
    kw["num_return_sequences"] = 3
    ref = beam_search(small, prompts, **kw)
    for other in (
        beam_search(Watched(small, paged=False), prompts, **kw),  # one forward per beam
        beam_search(small, prompts, share_kv=False, **kw),  # private copies
        beam_search(small, prompts, block_size=1, **kw),
    ):
        assert other.sequences == ref.sequences
        flat = [x for xs in other.scores for x in xs]
        assert flat == pytest.approx([x for xs in ref.scores for x in xs], abs=1e-5)


def test_forward_paged_matches_one_sequence_forwards(small: LlamaModel) -> None:
    pool = PagedKVPool(2, 2, 8, 64, 4)
    a = pool.sequence()
    ids = torch.tensor([5, 9, 2, 7, 1, 3])
    small(ids, torch.arange(6), a)
    a.commit_fed(ids)
    b = a.fork()  # shares a's partial tail: the step copies it first
    c = pool.sequence()
    small(ids[:2], torch.arange(2), c)
    c.commit_fed(ids[:2])
    toks = torch.tensor([4, 8, 11])
    pos = torch.tensor([6, 6, 2])
    got = small.forward_paged(toks, pos, [a, b, c])
    pool.commit_decode([a, b, c])
    for row, (ctx, tok) in enumerate(((ids, 4), (ids, 8), (ids[:2], 11))):
        full = torch.cat((ctx, torch.tensor([tok])))
        ref = small(full, torch.arange(len(full)), small.new_cache(16))[-1]
        torch.testing.assert_close(got[row], ref, rtol=1e-5, atol=1e-5)
    assert a.block_table()[1] != b.block_table()[1]  # the tail was copied on write
    assert a.block_table()[0] == b.block_table()[0]
    pool.manager.check_invariants()


def test_packed_linears_match_plain_and_follow_weight_changes(small: LlamaModel) -> None:
    """The decode paths' packed oneDNN linears give the plain ``F.linear`` logits (to float
    rounding), ``forward_last`` is ``forward``'s last row, and a weight changed in place or
    replaced is packed again rather than read stale."""
    ids = torch.tensor([5, 9, 2, 7, 1, 3])

    def paged_and_last() -> tuple[torch.Tensor, torch.Tensor]:
        pool = PagedKVPool(2, 2, 8, 64, 4)
        a = pool.sequence()
        last = small.forward_last(ids, torch.arange(6), a)
        a.commit_fed(ids)
        step = small.forward_paged(torch.tensor([4]), torch.tensor([6]), [a])[0]
        pool.rollback_decode([a])
        return last, step

    def reference() -> tuple[torch.Tensor, torch.Tensor]:
        full = torch.cat((ids, torch.tensor([4])))
        out = small(full, torch.arange(7), small.new_cache(16))
        return out[-2], out[-1]

    layer = small.model.decoder_layers()[0]
    old = layer.mlp.up_proj.weight.detach().clone()
    try:
        for packed in (True, False):
            small.packed_linear = packed
            for got, want in zip(paged_and_last(), reference(), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        small.packed_linear = True
        paged_and_last()  # packs the weights
        with torch.no_grad():
            layer.mlp.up_proj.weight.mul_(-0.5)  # in place
        for got, want in zip(paged_and_last(), reference(), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        layer.self_attn.q_proj.weight = torch.nn.Parameter(
            layer.self_attn.q_proj.weight.detach() * 2.0  # replaced
        )
        for got, want in zip(paged_and_last(), reference(), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    finally:
        small.packed_linear = True
        with torch.no_grad():
            layer.mlp.up_proj.weight.copy_(old)
            layer.self_attn.q_proj.weight = torch.nn.Parameter(
                layer.self_attn.q_proj.weight.detach() / 2.0
            )


def test_packed_forward_and_forward_batch_match_plain(small: LlamaModel) -> None:
    """The verify paths (``forward`` with a tree mask, ``forward_batch``) take the packed
    linears too: their logits are the plain ``F.linear`` ones to float rounding."""
    assert small.dtype == torch.float32
    ids = torch.tensor([[5, 9, 2, 7], [1, 3, 8, 4]])
    pos = torch.arange(4).expand(2, 4)
    tree = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool
    )  # 0 -> {1, 2}, 2 -> 3
    got: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}
    try:
        for packed in (False, True):
            small.packed_linear = packed
            one = small(ids[0], pos[0], small.new_cache(16), tree)
            caches = [small.new_cache(16), small.new_cache(16)]
            batch = small.forward_batch(ids, pos, caches, tree.expand(2, 4, 4).contiguous())
            got[packed] = (one, batch)
    finally:
        small.packed_linear = True
    for a, b in zip(got[True], got[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[True][1][0], got[True][0], rtol=1e-5, atol=1e-5)
