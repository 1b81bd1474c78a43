"""The generator as a server owns it: submit and cancel from any thread while one thread
steps, every request ends in exactly one final output (finished, stopped, cancelled, zero
tokens, refused, failed), failures stay with their request, a tight KV pool waits and
preempts without changing a token, and nothing (blocks, drafter state) outlives its request.

The oracle is the target's own autoregressive decoding: greedy outputs must equal it token
for token, and a cancelled request's tokens must be a prefix of it."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import torch

import specdec
from specdec.decode import GenerationResult, RequestOutput, SpeculativeGenerator
from specdec.decode import autoregressive_generate as ar
from specdec.draft import BlockDrafter, CombinedDrafter, NgramDrafter, SuffixDrafter
from specdec.errors import ConfigError, DraftError, KVCacheError
from specdec.models import LlamaModel
from specdec.protocols import DraftRequest
from specdec.testing import tiny_config

VOCAB = 32
CFG = tiny_config(VOCAB, max_positions=512)
# The stress test's length: at least 10^4 steps (SPECDEC_STRESS_STEPS overrides, e.g. for a
# quick local run).
STRESS_STEPS = int(os.environ.get("SPECDEC_STRESS_STEPS", "10000"))


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return LlamaModel(CFG).double().init_random(3)


def prompt_pool(seed: int, count: int) -> list[list[int]]:
    """Prompts with repeats in them, so the suffix drafter finds matches."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        base = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 6))]
        out.append((base * rng.randrange(1, 4))[: rng.randrange(2, 14)])
    return out


def letters() -> specdec.Vocabulary:
    """A byte vocabulary the size of the test target's, its last token an end of text."""
    tokens: list[bytes | None] = [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz01234"]
    return specdec.Vocabulary.from_bytes([*tokens, None], eos_ids=[VOCAB - 1])


class References:
    """Greedy AR outputs per prompt (and grammar), computed once at the longest length
    asked: a shorter request, or one that stops at a stop token, is a prefix of it."""

    def __init__(self, target: LlamaModel, longest: int) -> None:
        self.target, self.longest = target, longest
        self._cache: dict[tuple[Any, ...], list[int]] = {}

    def __call__(
        self, prompt: Sequence[int], n: int, stop: int | None = None, constraint: Any = None
    ) -> list[int]:
        key = (tuple(prompt), id(constraint))
        if key not in self._cache:
            self._cache[key] = ar(
                self.target, list(prompt), max_new_tokens=self.longest, constraint=constraint
            ).tokens
        out = self._cache[key][:n]
        if stop is not None and stop in out:
            out = out[: out.index(stop) + 1]
        return out


def run_until_done(gen: SpeculativeGenerator, limit: int = 10_000) -> list[RequestOutput]:
    outs: list[RequestOutput] = []
    for _ in range(limit):
        if not gen.has_unfinished():
            return outs
        outs += gen.step()
    raise AssertionError("the generator did not finish")


def finals(outs: list[RequestOutput]) -> dict[int, GenerationResult]:
    done: dict[int, GenerationResult] = {}
    for o in outs:
        if o.finished:
            assert o.request_id not in done, "a request ended twice"
            assert o.result is not None
            done[o.request_id] = o.result
    return done


def assert_nothing_left(gen: SpeculativeGenerator, *drafters: Any) -> None:
    assert not gen.has_unfinished() and gen.num_running == 0 and gen.num_waiting == 0
    if gen._pool is not None:
        assert not gen._pool.manager.sequences(), "KV blocks outlived their requests"
        gen._pool.manager.check_invariants()
    for d in drafters:
        assert d.num_requests == 0, f"{type(d).__name__} still holds request state"


# -- threads -----------------------------------------------------------------------------------
def test_threads_submit_and_cancel_while_one_thread_steps(target: LlamaModel) -> None:
    """Eight threads submit and cancel at random (waiting, running and finished requests)
    while one thread steps, for STRESS_STEPS steps on a KV pool tight enough to make
    requests wait and be preempted."""
    block = BlockDrafter.for_target(target, block_size=4, seed=1)
    suffix = SuffixDrafter(max_depth=4)
    drafter = CombinedDrafter(block, suffix, max_depth=4)
    gen = SpeculativeGenerator(
        target, drafter, budget=6, max_depth=4, cache="paged", kv_tokens=112, block_size=4,
        max_batch=4,
    )  # fmt: skip
    pool = prompt_pool(11, 24)
    refs = References(target, 24)
    # A context-free grammar: its matchers share one chart, bounded by max_states.
    grammar = letters().gbnf('root ::= ("ab" | "cd" | [0-4])+', max_states=200)
    submitted: dict[int, tuple[list[int], int, int | None, Any]] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        mine: list[int] = []
        try:
            while not stop.is_set():
                if rng.random() < 0.6 and gen.num_waiting < 12:
                    p = rng.choice(pool)
                    n = rng.choice([0, 1, 3, 8, 16, 24])
                    g = grammar if rng.random() < 0.25 else None
                    ref = refs(p, 24, None, g)  # a constrained one may end early
                    s = rng.choice([None, None, ref[rng.randrange(len(ref))] if ref else None])
                    rid = gen.submit(p, max_new_tokens=n, stop_tokens=s, constraint=g)
                    with lock:
                        submitted[rid] = (p, n, s, g)
                    mine.append(rid)
                elif mine:
                    gen.cancel(rng.choice(mine))  # waiting, running or already ended
                stop.wait(rng.random() * 0.004)
        except BaseException as e:  # noqa: BLE001 - reported to the test below
            errors.append(e)

    for p in pool:  # the references first: the clients read them
        refs(p, 24)
        refs(p, 24, None, grammar)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    outs: list[RequestOutput] = []
    steps = 0
    try:
        while steps < STRESS_STEPS and not errors:
            got = gen.step()
            outs += got
            steps += gen.num_running > 0 or any(not o.finished for o in got)
    finally:
        stop.set()
        for t in threads:
            t.join()
    outs += run_until_done(gen)
    assert errors == []
    done = finals(outs)
    assert set(done) == set(submitted), "every submitted request ends with exactly one result"
    streamed: dict[int, list[int]] = {}
    for o in outs:
        streamed.setdefault(o.request_id, []).extend(o.new_tokens)
    reasons = {r.finish_reason for r in done.values()}
    assert reasons <= {"length", "stop", "cancelled"}, reasons
    assert "cancelled" in reasons and "stop" in reasons
    assert sum(r.preemptions for r in done.values()) > 0, "the tight pool never preempted"
    for rid, (p, n, s, g) in submitted.items():
        res = done[rid]
        want = refs(p, n, s, g)
        assert res.tokens == streamed.get(rid, [])
        if res.finish_reason == "cancelled":
            assert res.tokens == want[: len(res.tokens)]
        else:
            assert res.tokens == want, (p, n, s, g is not None, res.tokens, want, res.preemptions)
    assert_nothing_left(gen, drafter, block, suffix)
    assert grammar.num_states <= 200  # the shared grammar state stayed bounded


def test_step_belongs_to_one_thread(target: LlamaModel) -> None:
    gen = SpeculativeGenerator(target, strategy="ar")
    gen.step()  # this thread owns the loop now
    seen: list[BaseException] = []

    def other() -> None:
        try:
            gen.step()
        except BaseException as e:  # noqa: BLE001
            seen.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(seen) == 1 and isinstance(seen[0], ConfigError)
    assert "one thread" in str(seen[0])
    # submit and cancel are fine from anywhere.
    rid: list[int] = []
    t = threading.Thread(target=lambda: rid.append(gen.submit([1, 2, 3], max_new_tokens=4)))
    t.start()
    t.join()
    done = finals(run_until_done(gen))
    assert done[rid[0]].tokens == ar(target, [1, 2, 3], max_new_tokens=4).tokens


# -- every request ends once -------------------------------------------------------------------
def test_every_request_ends_in_one_output(target: LlamaModel) -> None:
    """Zero tokens, cancels of waiting, running and finished requests, and stops: each
    request has exactly one final output, handed over once and then forgotten."""
    gen = SpeculativeGenerator(target, SuffixDrafter(max_depth=4), budget=4, max_batch=1)
    zero = gen.submit([1, 2, 3], max_new_tokens=0)
    running = gen.submit([4, 5, 6], max_new_tokens=20)
    waiting = gen.submit([7, 8, 9], max_new_tokens=20)  # max_batch=1: it waits
    ok = gen.submit([3, 3, 3], max_new_tokens=3)
    first = gen.step()
    assert finals(first)[zero].tokens == [] and finals(first)[zero].finish_reason == "length"
    assert gen.cancel(running) and gen.cancel(waiting)
    second = gen.step()
    ended = finals(second)
    assert ended[running].finish_reason == ended[waiting].finish_reason == "cancelled"
    assert ended[waiting].tokens == [] and ended[waiting].steps == 0
    assert (
        ended[running].tokens
        == ar(target, [4, 5, 6], max_new_tokens=20).tokens[: len(ended[running].tokens)]
    )
    rest = finals(run_until_done(gen))
    assert set(rest) == {ok} and rest[ok].finish_reason == "length"
    assert gen.cancel(ok) is False and gen.cancel(zero) is False  # ended: nothing to do
    assert gen.step() == []  # handed over once, then forgotten
    assert_nothing_left(gen)


class FailingDrafter(NgramDrafter):
    """An n-gram drafter that raises for contexts containing ``bad``."""

    def __init__(self, bad: int) -> None:
        super().__init__(VOCAB, max_depth=4)
        self.bad = bad

    def propose(self, requests: Sequence[DraftRequest], budget: int) -> list[specdec.DraftTree]:
        if any(self.bad in r.context for r in requests):
            raise DraftError(f"cannot draft after token {self.bad}")
        return super().propose(requests, budget)


@pytest.mark.parametrize("cache", ["dense", "paged"])
def test_a_failure_ends_only_its_request(target: LlamaModel, cache: str) -> None:
    """A request whose drafter raises, and one whose grammar allows no token, end with
    finish_reason="error" and the error; the others of the same batch go on, unchanged."""
    vocab = specdec.Vocabulary.from_bytes([bytes([97 + i]) for i in range(VOCAB)], eos_ids=[])
    dead_end = vocab.regex("ab")  # after "ab" no token is allowed, and no stop token ends it
    gen = SpeculativeGenerator(
        target, FailingDrafter(bad=31), budget=4, cache=cache,  # type: ignore[arg-type]
        kv_tokens=512, block_size=4, max_batch=4,
    )  # fmt: skip
    good = [[1, 2, 3, 1, 2], [4, 5, 4, 5], [6, 7, 8]]
    rids = [gen.submit(p, max_new_tokens=12) for p in good]
    bad_draft = gen.submit([9, 31, 9], max_new_tokens=12)
    bad_grammar = gen.submit([1, 2], max_new_tokens=12, constraint=dead_end)
    done = finals(run_until_done(gen))
    assert done[bad_draft].finish_reason == "error"
    assert isinstance(done[bad_draft].error, DraftError)
    assert done[bad_grammar].finish_reason == "error"
    err = done[bad_grammar].error
    assert isinstance(err, specdec.NoAllowedTokens)
    assert done[bad_grammar].tokens == [0, 1]  # "ab", then nothing is allowed
    for rid, p in zip(rids, good, strict=True):
        assert done[rid].finish_reason == "length" and done[rid].error is None
        assert done[rid].tokens == ar(target, p, max_new_tokens=12).tokens
    assert_nothing_left(gen)
    # generate() raises the failure once every request of the call has ended.
    with pytest.raises(DraftError) as info:
        gen.generate([[1, 2, 3], [31, 2]], max_new_tokens=5)
    results = info.value.results  # type: ignore[attr-defined]
    assert [r.finish_reason for r in results] == ["length", "error"]
    assert_nothing_left(gen)


# -- a tight pool --------------------------------------------------------------------------------
@pytest.mark.parametrize("factor", [0.5, 1.0, 1.5])
def test_tight_pool_waits_and_preempts_without_changing_a_token(
    target: LlamaModel, factor: float
) -> None:
    """A pool of 0.5-1.5x what the batch needs at its longest: requests wait for blocks, the
    latest admitted is preempted when the running ones outgrow the pool and resumes from
    its committed tokens, a request that could never fit is refused at submit, and every
    output is still the target's greedy one, with no block left behind."""
    bs, budget, batch, n = 4, 6, 4, 40
    ps = prompt_pool(3, 8)
    need = max(-(-(len(p) + n + budget + 1) // bs) + 1 for p in ps)  # one request, whole
    kv_tokens = int(factor * need * batch) * bs
    block = BlockDrafter.for_target(target, block_size=4, seed=2)
    suffix = SuffixDrafter(max_depth=4)
    drafter = CombinedDrafter(block, suffix, max_depth=4)
    gen = SpeculativeGenerator(
        target, drafter, budget=budget, max_depth=4, cache="paged", kv_tokens=kv_tokens,
        block_size=bs, max_batch=batch,
    )  # fmt: skip
    with pytest.raises(KVCacheError, match="kv_tokens"):
        gen.submit([1] * 10, max_new_tokens=kv_tokens)  # could never fit alone
    rids = [gen.submit(p, max_new_tokens=n) for p in ps]
    outs: list[RequestOutput] = []
    most_waiting = 0
    while gen.has_unfinished():
        outs += gen.step()
        most_waiting = max(most_waiting, gen.num_waiting)
    done = finals(outs)
    assert most_waiting > 0
    for rid, p in zip(rids, ps, strict=True):
        assert done[rid].tokens == ar(target, p, max_new_tokens=n).tokens
    if factor < 1.0:
        assert sum(done[r].preemptions for r in rids) > 0
    assert_nothing_left(gen, drafter, block, suffix)


# -- no process-wide state -----------------------------------------------------------------------
def test_two_generators_share_one_model_across_threads(target: LlamaModel) -> None:
    """One model serves two generators at once, each on its own thread, whose drafters read
    different hidden states (decoder layers, the final-norm state): each generator's
    capture is its own, so both outputs are the target's greedy ones."""
    from specdec.draft import MedusaDrafter

    block = BlockDrafter.for_target(target, block_size=4, seed=3)
    medusa = MedusaDrafter.for_target(target, num_heads=3)
    with torch.no_grad():  # away from the zero start, so the heads draft something
        g = torch.Generator().manual_seed(4)
        for p in medusa.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    ps = prompt_pool(21, 6)
    want = [ar(target, p, max_new_tokens=16).tokens for p in ps]
    got: dict[str, list[list[int]]] = {}
    errors: list[BaseException] = []

    def run(name: str, drafter: Any, depth: int) -> None:
        try:
            gen = SpeculativeGenerator(target, drafter, budget=6, max_depth=depth, max_batch=3)
            got[name] = [r.tokens for r in gen.generate(ps, max_new_tokens=16)]
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [
        threading.Thread(target=run, args=("block", block, 4)),
        threading.Thread(target=run, args=("medusa", medusa, 3)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert got["block"] == want and got["medusa"] == want
    assert block.num_requests == 0


HOOKS_SCRIPT = """
import gc, torch
from specdec.models import LlamaConfig, LlamaModel, llama

cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
x, pos = torch.tensor([1, 2, 3]), torch.arange(3)

def run(seed):
    m = LlamaModel(cfg).init_random(seed)
    m(x, pos, m.new_cache(8), None)
    return m

assert llama._hook_handles == []
a, b = run(0), run(1)
assert len(llama._hook_handles) == 2
del a
gc.collect()
assert len(llama._hook_handles) == 2  # b still has a plan
# A weight assigned anew is still seen: b's next forward uses it, as a plain model's does.
c = LlamaModel(cfg).init_random(1)
c.packed_linear = False
for m in (b, c):
    m.model.layers[0].mlp.down_proj.weight = torch.nn.Parameter(torch.zeros(32, 48))
torch.testing.assert_close(b(x, pos, b.new_cache(8), None), c(x, pos, c.new_cache(8), None))
del b, c, m
gc.collect()
assert llama._hook_handles == [], llama._hook_handles
print("ok")
"""


def test_registration_hooks_leave_with_the_last_model() -> None:
    """The nn.Module registration hooks that keep packed weights fresh are installed while
    a model has a plan and removed with the last such model (in a fresh interpreter: this
    one's other tests hold models)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", HOOKS_SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# -- grammar state per request ----------------------------------------------------------------
class Biased:
    """The target with ``bias`` added to one token's logit (every other call delegated): a
    greedy request then nests ``[`` as deep as its grammar lets it."""

    def __init__(self, inner: LlamaModel, token: int, bias: float) -> None:
        self.inner, self.token, self.bias = inner, token, bias

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, *a: Any, **kw: Any) -> torch.Tensor:
        out: torch.Tensor = self.inner(*a, **kw)
        out[..., self.token] += self.bias
        return out

    def forward_batch(self, *a: Any, **kw: Any) -> torch.Tensor:
        out: torch.Tensor = self.inner.forward_batch(*a, **kw)
        out[..., self.token] += self.bias
        return out


def test_one_requests_grammar_overflow_fails_it_alone(target: LlamaModel) -> None:
    """A request nesting past its grammar's max_states fails alone ("error", GrammarError);
    requests on the same compiled grammar, in the same batch and after it, succeed with
    the constrained target's own output, and the shared chart stays within its bound."""
    biased = Biased(target, 0, 30.0)  # token 0 is "["
    tokens: list[bytes | None] = [bytes([c]) for c in b"[]0,abcdefghijklmnopqrstuvwxyz1"]
    vocab = specdec.Vocabulary.from_bytes([*tokens, None], eos_ids=[VOCAB - 1])
    nested = vocab.gbnf('root ::= "[" root "]" | "0"', max_states=40)
    gen = SpeculativeGenerator(
        biased,
        SuffixDrafter(max_depth=4),
        budget=4,
        constraint=nested,
        max_batch=4,  # type: ignore[arg-type]
    )
    deep = gen.submit([4, 5, 6], max_new_tokens=300)
    shallow = [gen.submit(p, max_new_tokens=12) for p in ([7, 8], [9, 9, 9])]
    done = finals(run_until_done(gen))
    assert done[deep].finish_reason == "error"
    assert isinstance(done[deep].error, specdec.GrammarError)
    assert "max_states" in str(done[deep].error)
    for rid, p in zip(shallow, ([7, 8], [9, 9, 9]), strict=True):
        assert done[rid].finish_reason == "length"
        assert done[rid].tokens == ar(biased, p, max_new_tokens=12, constraint=nested).tokens  # type: ignore[arg-type]
    # A new request on the same compiled grammar, after the overflow: it succeeds.
    after = gen.generate([1, 2], max_new_tokens=20)
    assert after.finish_reason == "length" and after.tokens == [0] * 20
    assert nested.num_states <= 40  # the shared chart stays bounded
    assert_nothing_left(gen)


class ChainDrafter:
    """Proposes the same chain after every context (a TreeDrafter)."""

    def __init__(self, chain: list[int]) -> None:
        self.chain = chain

    def propose(self, requests: Sequence[DraftRequest], budget: int) -> list[specdec.DraftTree]:
        return [
            specdec.tree_from_branches([self.chain[:budget]], root_token=int(r.context[-1]))
            for r in requests
        ]


def test_the_grammars_end_ends_the_request_inside_a_tree(target: LlamaModel) -> None:
    """A terminated matcher still allows its end token, so a drafted chain of end tokens is
    accepted whole: the request still ends at the first, as constrained AR decoding does."""
    grammar = letters().gbnf('root ::= ("ab" | "cd" | [0-4])+')
    p = [18, 1, 4, 6, 25]
    want = ar(target, p, max_new_tokens=8, constraint=grammar)
    assert want.finish_reason == "stop" and want.tokens[-1] == VOCAB - 1  # ends by the grammar
    chain = [*want.tokens, VOCAB - 1, VOCAB - 1]
    gen = SpeculativeGenerator(target, ChainDrafter(chain), budget=6, constraint=grammar)
    got = gen.generate(p, max_new_tokens=8)
    assert got.tokens == want.tokens and got.finish_reason == "stop"
    assert got.accepted[-1] > 0  # the chain was accepted past the end
