"""Grammar drafts: what a constraint forces, drafted into the tree.

- Forced paths against an independent oracle: a finite language written out in Python, its
  completions from every prefix enumerated, their longest common prefix and first bytes
  computed directly (no automaton), for the regex engine and the grammar engine alike.
- Canonical tokens against the tokenizer itself (SmolLM2's), and the longest-token
  fallback of a vocabulary without one.
- The generator with grammar drafts is lossless: greedy output equals constrained plain
  decoding, and seeded sampling equals constrained plain sampling, on a random tiny target
  (whose choices are rarely the canonical tokenization: forced chains are rejected in the
  middle and at their last token) and on SmolLM2 with JSON Schemas (compact and free
  whitespace, enums and booleans), for the suffix, block and combined drafters under fixed
  and adaptive budgets; every output validates.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest

import specdec
from specdec.decode import SpeculativeGenerator, autoregressive_generate
from specdec.draft import SuffixDrafter
from specdec.draft.grammar import GrammarDrafts, Spelling
from specdec.errors import DraftError, GrammarError
from specdec.testing import OracleDrafter, tiny_config
from specdec.tree import DraftTree
from specdec.verify import Sampling

# A finite language: every word is written out, so completions can be enumerated.
PARTS = [["{"], ['"name":"'], ["al", "bo", "b"], ['","ok":'], ["true", "false"], ["}", ',"x":1}']]
WORDS = sorted({"".join(p).encode() for p in itertools.product(*PARTS)})


def _re_escape(s: str) -> str:
    return "".join("\\" + c if c in '{}[]().*+?|^$\\"' else c for c in s)


def _regex() -> str:
    return "".join("(" + "|".join(_re_escape(o) for o in opts) + ")" for opts in PARTS)


def _gbnf() -> str:
    def lit(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "root ::= " + " ".join("(" + " | ".join(lit(o) for o in opts) + ")" for opts in PARTS)


def _byte_vocab() -> specdec.Vocabulary:
    return specdec.Vocabulary.from_bytes([bytes([b]) for b in range(256)] + [None], [256])


def _lcp(xs: list[bytes]) -> bytes:
    out = xs[0]
    for x in xs[1:]:
        n = 0
        while n < min(len(out), len(x)) and out[n] == x[n]:
            n += 1
        out = out[:n]
    return out


def _oracle_forced(prefix: bytes) -> bytes:
    """The bytes every completion of ``prefix`` starts with, stopping where a word ends."""
    comps = [w[len(prefix) :] for w in WORDS if w.startswith(prefix)]
    f = _lcp(comps)
    # The text may end at any completion shorter than the common prefix's end.
    ends = [len(c) for c in comps if len(c) <= len(f)]
    return f[: min(ends)] if ends else f


def _oracle_paths(prefix: bytes) -> set[tuple[bytes, bool]]:
    """One level of choices after the forced bytes: each next byte with its forced tail,
    and EOS where a word ends."""
    f = _oracle_forced(prefix)
    at = prefix + f
    out: set[tuple[bytes, bool]] = set()
    if at in WORDS:
        out.add((f, True))
    for b in sorted({w[len(at)] for w in WORDS if w.startswith(at) and len(w) > len(at)}):
        nxt = at + bytes([b])
        tail = _oracle_forced(nxt)
        end = nxt + tail
        only_eos = end in WORDS and not any(w.startswith(end) and w != end for w in WORDS)
        out.add((f + bytes([b]) + tail, only_eos))
    return out


@pytest.mark.parametrize("engine", ["regex", "gbnf"])
def test_forced_paths_match_the_enumerated_language(engine: str) -> None:
    vocab = _byte_vocab()
    grammar = vocab.regex(_regex()) if engine == "regex" else vocab.gbnf(_gbnf())
    prefixes = sorted({w[:i] for w in WORDS for i in range(len(w) + 1)})
    checked = 0
    for p in prefixes:
        m = grammar.matcher()
        assert m.accept_tokens(list(p)) == len(p)
        assert m.forced_bytes() == _oracle_forced(p), p
        if p in WORDS and not any(w.startswith(p) and w != p for w in WORDS):
            assert [(x.bytes, x.eos) for x in m.forced_paths()] == [(b"", True)]
            continue
        got = m.forced_paths(max_branches=256, levels=1, max_paths=1000)
        assert {(x.bytes, x.eos) for x in got} == _oracle_paths(p), p
        assert abs(sum(x.weight for x in got) - 1.0) < 1e-9
        checked += 1
    assert checked > 40
    # After EOS: nothing.
    m = grammar.matcher()
    m.accept_tokens(list(WORDS[0]))
    assert m.accept_token(256) and m.forced_paths() == [] and m.forced_bytes() == b""


def test_forced_paths_refuse_bad_limits() -> None:
    m = _byte_vocab().regex(_regex()).matcher()
    with pytest.raises(GrammarError, match="max_paths"):
        m.forced_paths(max_paths=0)
    with pytest.raises(GrammarError, match="levels"):
        m.forced_paths(levels=-1)


def test_canonical_tokens_are_the_tokenizers(lm: Any) -> None:
    vocab = lm.vocabulary()
    tok = lm.tokenizer
    for text in ['{"name": "', '", "age": ', "true, ", '"]}', "Zürich", ' "x_y": [', "  \n"]:
        want = tuple(tok.encode(text, add_special_tokens=False).ids)
        assert vocab.canonical_tokens(text.encode()) == want
    # An incomplete UTF-8 character at the end is left out.
    data = "aü".encode()[:-1]
    assert vocab.canonical_tokens(data) == tuple(tok.encode("a", add_special_tokens=False).ids)
    # Without a tokenizer: the longest token at each step.
    v = specdec.Vocabulary.from_bytes([b"a", b"b", b"ab", b"abb", b"ba"], [])
    assert v.canonical_tokens(b"abbab") == (3, 2)
    assert v.canonical_tokens(b"babz") == (4, 1)  # stops where no token spells on


def test_grammar_draft_has_forced_tokens_then_weighted_branches() -> None:
    vocab = _byte_vocab()
    m = vocab.gbnf(_gbnf()).matcher()
    m.accept_tokens(list(b'{"name":"al'))
    d = GrammarDrafts(levels=1).draft(m)
    assert bytes(d.forced) == b'","ok":'
    assert d.branches is not None and not d.ends
    t = d.branches
    # The two branches, "true" and "false", each with weight 1/2 on every node.
    leaves = [i for i in range(t.num_nodes) if i not in t.parents]
    paths = {bytes(t.tokens[t.path_to(i)][1:].tolist()) for i in leaves}
    assert paths == {b"true", b"false"}
    assert np.allclose(np.exp(t.logprobs[1:]), 0.5)
    # At the end: EOS is forced.
    m.accept_tokens(list(b'","ok":true}'))
    d = GrammarDrafts().draft(m)
    assert d.forced == (256,) and d.ends and d.branches is None


# -- the model's spelling of forced bytes --------------------------------------------------
SPELL_TOKENS = [b"a", b"b", b"c", b"ab", b"bc", b"abc", b"ca"]


def _spell_vocab() -> specdec.Vocabulary:
    return specdec.Vocabulary.from_bytes([*SPELL_TOKENS, None], [len(SPELL_TOKENS)])


def _tokenizations(data: bytes) -> set[tuple[bytes, ...]]:
    """Brute force: every way to write ``data`` in SPELL_TOKENS."""
    if not data:
        return {()}
    return {
        (t, *rest)
        for t in SPELL_TOKENS
        if data.startswith(t)
        for rest in _tokenizations(data[len(t) :])
    }


def test_prefix_tokens_are_every_token_data_starts_with() -> None:
    v = _spell_vocab()
    for data in (b"abcab", b"bca", b"c", b"x", b""):
        want = sorted((t for t in SPELL_TOKENS if t and data.startswith(t)), key=len, reverse=True)
        assert [v.token_bytes(t) for t in v.prefix_tokens(data)] == want


def test_spelling_tree_holds_every_spelling_with_chances_that_add_up() -> None:
    v = _spell_vocab()
    eos = len(SPELL_TOKENS)
    data = b"abcabca"
    nodes = Spelling().tree(v, [(data, 1.0, True)], eos, 10_000)
    spelt: dict[int, bytes] = {0: b""}
    done = set()
    for i, n in enumerate(nodes[1:], 1):
        assert n.parent < i  # best first: parents come first
        if n.token == eos:
            assert spelt[n.parent] == data
            done.add(tuple(v.token_bytes(nodes[j].token) for j in _path(nodes, n.parent)))
            continue
        spelt[i] = spelt[n.parent] + (v.token_bytes(n.token) or b"")
        assert data.startswith(spelt[i])
    assert done == _tokenizations(data)
    # Each node's children share its chance out whole (EOS after a whole spelling).
    for i in spelt:
        kids = [n.chance for n in nodes if n.parent == i]
        assert sum(kids) == pytest.approx(nodes[i].chance)
    # Unlearnt, the tokenizer's spelling (here the longest token each step) is the likeliest.
    best = max((n for n in nodes if n.token == eos), key=lambda n: n.chance)
    got = [v.token_bytes(nodes[j].token) for j in _path(nodes, best.parent)]
    assert got == [v.token_bytes(t) for t in v.canonical_tokens(data)]


def _path(nodes: list[Any], at: int) -> list[int]:
    out = []
    while at > 0:
        out.append(at)
        at = nodes[at].parent
    return out[::-1]


def test_grammar_drafts_learn_the_models_spelling() -> None:
    v = _spell_vocab()
    eos = len(SPELL_TOKENS)
    a, bc, abc = (SPELL_TOKENS.index(t) for t in (b"a", b"bc", b"abc"))
    grammar = v.regex("abc")
    drafts = GrammarDrafts()
    d = drafts.draft(grammar.matcher())
    assert d.data == b"abc" and d.forced == (abc, eos) and d.ends  # the tokenizer's way
    # The model writes "a" "bc" every time: the draft follows.
    for _ in range(12):
        drafts.learn(v, drafts.draft(grammar.matcher()), [a, bc, eos])
    d = drafts.draft(grammar.matcher())
    assert d.forced == (a, bc, eos) and d.ends and d.branches is None
    # Where the model's pieces are a toss-up, the forced tokens stop and the spellings branch.
    fresh = GrammarDrafts()
    for i in range(12):
        toks = [a, bc, eos] if i % 2 else [abc, eos]
        fresh.learn(v, fresh.draft(grammar.matcher()), toks)
    d = fresh.draft(grammar.matcher())
    assert d.forced == () and d.branches is not None
    t = d.branches
    kids = {int(t.tokens[i]) for i in range(1, t.num_nodes) if t.parents[i] == 0}
    assert {a, abc} <= kids
    # Without spellings: the tokenizer's own, whatever was learnt.
    assert GrammarDrafts(spellings=0).draft(grammar.matcher()).forced == (abc, eos)


def test_spelling_records_stay_bounded() -> None:
    """A long-running server meets pairs without end: the records kept stay within
    ``max_records``, the most tried kept."""
    tokens = [bytes([c]) for c in range(97, 123)]
    tokens += [a + b for a in tokens for b in tokens]
    v = specdec.Vocabulary.from_bytes(tokens, [])
    sp = Spelling()
    sp.max_records = 64
    often = b"ab"
    for i, (a, b) in enumerate(itertools.product(range(26), repeat=2)):
        data = bytes([97 + a, 97 + b])
        sp.learn(v, data, [v.prefix_tokens(data)[-1]])  # the one-letter token
        sp.learn(v, often, [v.prefix_tokens(often)[-1]])
        assert len(sp._tried) <= sp.max_records, i
    # The pair tried every time is still known: its single-letter choice stands out.
    chances = dict(sp.choices(v, often))
    assert chances[v.prefix_tokens(often)[-1]] > 0.9


def test_grammar_drafts_options_are_checked() -> None:
    with pytest.raises(DraftError, match="sure"):
        GrammarDrafts(sure=0.0)
    with pytest.raises(DraftError, match="spellings"):
        GrammarDrafts(spellings=-1)


def test_with_prefix_puts_a_chain_before_the_tree() -> None:
    t = DraftTree([7, 1, 2, 3], [-1, 0, 0, 1], logprobs=[0.0, -0.1, -0.5, -0.3])
    g = t.with_prefix([5, 6, 7], 9)
    assert g.tokens.tolist() == [9, 5, 6, 7, 1, 2, 3]
    assert g.parents.tolist() == [-1, 0, 1, 2, 3, 3, 4]
    assert g.depths.tolist() == [0, 1, 2, 3, 4, 4, 5]
    assert g.logprobs.tolist() == [0.0, 0.0, 0.0, 0.0, -0.1, -0.5, -0.3]
    assert g.expected_acceptance == pytest.approx(3 + t.expected_acceptance)


# -- lossless generation on a tiny random target ----------------------------------------------
TINY_TOKENS = [
    *[bytes([c]) for c in b'{}",:0123abcdefklnrsuvt'],
    b'{"',
    b'":',
    b'",',
    b'"}',
    b"true",
    b"fal",
    b"se}",
    b'"a',
    b"ab",
]
TINY_GBNF = r"""
root ::= "{\"k\":" ("true" | "false") ",\"v\":\"" [a-e]{1,5} "\"" (",\"n\":" [0-3]{1,2})? "}"
"""


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    from specdec.models import LlamaModel

    vocab = specdec.Vocabulary.from_bytes([*TINY_TOKENS, None], [len(TINY_TOKENS)])
    # Random weights: its choices rarely follow the longest-token tokenization.
    target = LlamaModel(tiny_config(len(TINY_TOKENS) + 1)).double().init_random(5, std=0.6)
    return target, vocab.gbnf(TINY_GBNF)


def _text(vocab: Any, tokens: list[int]) -> bytes:
    return b"".join(vocab.token_bytes(t) or b"" for t in tokens)


@pytest.mark.parametrize("budget", [3, 12, "auto"])
def test_greedy_with_grammar_drafts_is_constrained_plain_decoding(tiny: Any, budget: Any) -> None:
    target, grammar = tiny
    eos = len(TINY_TOKENS)
    prompts = [[i % eos, (3 * i + 1) % eos, (5 * i + 2) % eos] for i in range(12)]
    want = [
        autoregressive_generate(
            target, p, max_new_tokens=40, constraint=grammar, stop_tokens=[eos]
        ).tokens
        for p in prompts
    ]
    accepted = forced = 0
    for drafter in (SuffixDrafter(max_depth=6), OracleDrafter(target, miss=0.5, seed=2)):
        drafts = GrammarDrafts()
        observe = drafts.observe
        seen: list[tuple[int, int]] = []
        # Every verified forced chain: its drafted and accepted tokens.
        drafts.observe = lambda d, a, s=seen, o=observe: (s.append((d, a)), o(d, a))[1]  # type: ignore[method-assign]
        gen = SpeculativeGenerator(
            target, drafter, budget=budget, max_depth=4, constraint=grammar, max_batch=4,
            grammar_drafts=drafts,
        )  # fmt: skip
        got = gen.generate(prompts, max_new_tokens=40, stop_tokens=[eos])
        assert [r.tokens for r in got] == want
        accepted += sum(a for _, a in seen)
        forced += sum(d for d, _ in seen)
        for r in got:
            if r.finish_reason == "stop":
                assert grammar.matches(_text(grammar.vocab, r.tokens))
    # Forced tokens were accepted, and others rejected (of the verified chains): the random
    # target often writes the forced bytes in other tokens than the longest-token
    # tokenization.
    assert 0 < accepted < forced


def test_seeded_sampling_with_grammar_drafts_is_constrained_plain_sampling(tiny: Any) -> None:
    target, grammar = tiny
    eos = len(TINY_TOKENS)
    rule = Sampling(temperature=1.3)
    prompts = [[i % eos, (7 * i + 3) % eos] for i in range(10)]
    want = [
        autoregressive_generate(
            target, p, max_new_tokens=40, rule=rule, seed=100 + i, constraint=grammar
        ).tokens
        for i, p in enumerate(prompts)
    ]
    gen = SpeculativeGenerator(
        target, SuffixDrafter(max_depth=6), rule=rule, budget=8, constraint=grammar, max_batch=5
    )
    rids = [gen.submit(p, max_new_tokens=40, seed=100 + i) for i, p in enumerate(prompts)]
    done: dict[int, list[int]] = {}
    drafted = 0
    while gen.has_unfinished():
        for o in gen.step():
            if o.finished:
                assert o.result is not None
                done[o.request_id] = o.result.tokens
                drafted += o.result.grammar_tokens
    assert [done[r] for r in rids] == want
    assert drafted > 0


def test_grammar_drafts_can_be_turned_off(tiny: Any) -> None:
    target, grammar = tiny
    gen = SpeculativeGenerator(target, budget=4, constraint=grammar, grammar_drafts=False)
    r = gen.generate([1, 2], max_new_tokens=20)
    assert r.grammar_tokens == 0
    with pytest.raises(specdec.SpecdecTypeError, match="grammar_drafts"):
        SpeculativeGenerator(target, constraint=grammar, grammar_drafts="yes")  # type: ignore[arg-type]


# -- SmolLM2 with JSON Schemas ----------------------------------------------------------------
@pytest.fixture(scope="module")
def lm() -> Any:
    from specdec.models import smollm2

    return smollm2()


SCHEMAS = {
    "record": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "sunny": {"type": "boolean"},
            "level": {"enum": ["low", "medium", "high"]},
            "days": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["city", "sunny", "level", "days"],
        "additionalProperties": False,
    },
    "list": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "tag": {"enum": ["a", "b"]}},
            "required": ["id", "tag"],
            "additionalProperties": False,
        },
        "minItems": 2,
        "maxItems": 3,
    },
}


@pytest.mark.parametrize(
    ("schema", "whitespace", "drafter", "budget"),
    [
        ("record", False, "suffix", "auto"),
        ("record", True, "suffix", 8),
        ("list", False, "block", 8),
        ("list", False, "combined", "auto"),
    ],
)
def test_smollm2_json_with_grammar_drafts_is_constrained_plain_decoding(
    lm: Any, schema: str, whitespace: bool, drafter: str, budget: Any
) -> None:
    import jsonschema  # type: ignore[import-untyped]

    from specdec.draft import BlockDrafter, CombinedDrafter

    vocab = lm.vocabulary()
    grammar = vocab.json_schema(SCHEMAS[schema], whitespace=whitespace, property_order="declared")
    prompt = lm.encode_chat(
        [{"role": "user", "content": "Reply with JSON for: " + json.dumps(SCHEMAS[schema])}]
    )
    stop = vocab.eos_ids
    want = autoregressive_generate(
        lm.model, prompt, max_new_tokens=60, constraint=grammar, stop_tokens=stop
    ).tokens
    d: Any
    if drafter == "suffix":
        d = SuffixDrafter(max_depth=16)
    elif drafter == "block":
        d = BlockDrafter.shipped(lm.model)
    else:
        d = CombinedDrafter(BlockDrafter.shipped(lm.model), SuffixDrafter(max_depth=16))
    gen = SpeculativeGenerator(lm.model, d, budget=budget, max_depth=8, constraint=grammar)
    r = gen.generate(prompt, max_new_tokens=60, stop_tokens=stop)
    assert r.tokens == want
    assert r.grammar_tokens > 0
    if r.finish_reason == "stop":
        text = _text(vocab, [t for t in r.tokens if t not in stop]).decode()
        jsonschema.validate(json.loads(text), SCHEMAS[schema])


def test_the_budget_prices_forced_nodes_as_sure_tokens() -> None:
    """With ``forced``, each forced node adds one sure token and its share of the forward:
    a size's value is the plain value plus the forced count, its cost the cost model's at
    every row padded to the longest chain, and no size passes ``max_budget`` in all."""
    from specdec.decode import AdaptiveBudget, CostModel
    from specdec.errors import ConfigError

    cost = CostModel([1, 33], [1.0, 3.0])
    tree = DraftTree([5, 6, 7, 8], [-1, 0, 1, 2], logprobs=[0.0, -0.2, -0.4, -0.6])
    plain = AdaptiveBudget(cost, 8, growth=None).choose_among([[tree], [tree]])
    ab = AdaptiveBudget(cost, 8, growth=None)
    got = ab.choose_among([[tree], [tree]], forced=[3, 1])
    assert got.nodes <= 8 - 3
    b = got.nodes
    assert got.expected_seconds == pytest.approx(float(cost(2 * (3 + b + 1))) + ab.host_seconds)
    # The candidates' own values, plus one per request and the four sure tokens.
    values = float(ab.node_values(tree)[:b].sum())
    assert got.expected_tokens == pytest.approx(2 + 4 + 2 * values)
    assert plain.nodes >= 1
    with pytest.raises(ConfigError, match="forced"):
        ab.choose_among([[tree]], forced=[1, 2])


def test_respell_follows_the_requests_own_spelling_of_the_forced_bytes() -> None:
    v = specdec.Vocabulary.from_bytes(
        [b"a", b"b", b"c", b"ab", b"abc", b"bc", b'"', b":", b'":', None], [9]
    )
    forced = v.canonical_tokens(b'abc":')  # longest first: abc, ":
    assert forced == (4, 8)
    # The request wrote these bytes as "a" "bc" '"' ":" before: that spelling, EOS kept.
    assert GrammarDrafts.respell(v, (*forced, 9), [0, 5, 6, 7]) == (0, 5, 6, 7, 9)
    # Its path leaves the bytes after "a" "bc": the rest canonical.
    assert GrammarDrafts.respell(v, forced, [0, 5, 1]) == (0, 5, 8)
    # A path that agrees, or spells none of the bytes, changes nothing.
    assert GrammarDrafts.respell(v, forced, [4, 8, 0]) == forced
    assert GrammarDrafts.respell(v, forced, [1, 2]) == forced
    assert GrammarDrafts.respell(v, forced, []) == forced


def test_the_forced_chain_stops_where_it_stops_paying() -> None:
    d = GrammarDrafts(max_forced=8)
    assert d.chain_limit() == 8  # no evidence yet: the whole chain
    for _ in range(20):
        d.observe(6, 2)  # the first two accepted, the third rejected, every time
    assert d.chain_limit() == 2
    d.observe(0, 0)  # nothing drafted: nothing learnt
    assert d.chain_limit() == 2
    for _ in range(300):
        d.observe(2, 2)  # whole chains pass; the third position's record fades
    assert d.chain_limit() > 2
