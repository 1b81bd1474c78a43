"""specdec.integrations without the engines' own machinery: importing specdec loads neither
vLLM nor transformers; grammar specs (clear errors, choices against a brute-force check);
the transformers logits processor on SmolLM2 (outputs validate with jsonschema, match the
regex, are one of the choices); the vLLM proposer's per-request bookkeeping (requests that
join, finish, are preempted and resume, against a drafter fed each history at once) and
the vLLM logits processor's batch bookkeeping (added, removed, moved and swapped rows,
against a fresh matcher per request). tests/vllm/ runs both in vLLM itself
(``make test-vllm``)."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from specdec.constrain import Vocabulary
from specdec.constrain.numpy import unpack_bitmask
from specdec.draft import SuffixDrafter
from specdec.errors import GrammarError, SpecdecTypeError
from specdec.integrations.grammars import GrammarSpec, choice_gbnf
from specdec.integrations.vllm.logits import GrammarLogitsProcessor as VllmGrammarProcessor
from specdec.integrations.vllm.proposer import SuffixChains, best_chain
from specdec.tree import DraftTree


def test_importing_specdec_imports_no_engine() -> None:
    code = (
        "import sys, specdec, specdec.integrations, specdec.integrations.vllm, "
        "specdec.integrations.grammars\n"
        "print(sorted(m for m in ('vllm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- grammar specs ------------------------------------------------------------------------------


def byte_vocab() -> Vocabulary:
    return Vocabulary.from_bytes([*(bytes([b]) for b in range(256)), None], [256])


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({}, "exactly one of"),
        ({"regex": "a", "gbnf": 'root ::= "a"'}, "got regex, gbnf"),
        ({"jsonschema": {}}, "unknown key(s) 'jsonschema'"),
        ({"choice": []}, "at least one string"),
        ({"json_schema": "{not json"}, "not valid JSON"),
    ],
)
def test_bad_specs_name_what_is_wrong(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(words)):
        GrammarSpec.parse(spec)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("regex", "must be a dict"),
        ({"choice": "yes"}, "list of strings"),
        ({"choice": ["a", 3]}, "item 1 is int"),
        ({"regex": 5}, "regex must be a str"),
    ],
)
def test_wrong_types_name_what_is_wrong(spec: Any, words: str) -> None:
    with pytest.raises(SpecdecTypeError, match=re.escape(words)):
        GrammarSpec.parse(spec)


@pytest.mark.parametrize(
    "spec",
    [
        {"json_schema": {"type": "objectx"}},
        {"regex": "a("},
        {"gbnf": "root ::= missing"},
        {"lark": "start: ("},
    ],
)
def test_bad_grammars_fail_the_check(spec: dict[str, Any]) -> None:
    with pytest.raises(GrammarError):
        GrammarSpec.parse(spec).check()


def test_choices_are_exactly_the_language() -> None:
    rng = random.Random(0)
    alphabet = ['"', "\\", "\n", "\t", "a", "b", " ", "é", "\x01", "]", "["]
    vocab = byte_vocab()
    for _ in range(30):
        choices = ["".join(rng.choices(alphabet, k=rng.randint(0, 4))) for _ in range(3)]
        g = vocab.gbnf(choice_gbnf(choices))
        # Brute force: every string over the alphabet up to length 3, and every choice.
        for n in range(4):
            for _ in range(40):
                s = "".join(rng.choices(alphabet, k=n))
                assert g.matches(s) == (s in choices), (choices, s)
        for c in choices:
            assert g.matches(c)


# -- transformers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_hf() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.models.gguf import smollm2_path

    f = smollm2_path()
    tok = AutoTokenizer.from_pretrained(f.parent, gguf_file=f.name)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(f.parent, gguf_file=f.name, dtype=torch.float32)
    return tok, model.eval()


def generate(tok: Any, model: Any, prompts: list[str], proc: Any, **kw: Any) -> list[str]:
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]
    enc = tok(texts, return_tensors="pt", padding=True)
    out = model.generate(**enc, logits_processor=[proc], do_sample=False, **kw)
    new = out[:, enc["input_ids"].shape[1] :]
    return [tok.decode(row, skip_special_tokens=True) for row in new]


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


def test_transformers_json_schema_outputs_validate(smollm2_hf: tuple[Any, Any]) -> None:
    import jsonschema

    from specdec.integrations.transformers import GrammarLogitsProcessor

    tok, model = smollm2_hf
    proc = GrammarLogitsProcessor.from_tokenizer(
        tok, json_schema=PERSON, vocab_size=model.config.vocab_size
    )
    prompts = ["Describe a person as JSON.", "Give me a JSON record for Ann, 31, with a dog."]
    for text in generate(tok, model, prompts, proc, max_new_tokens=80):
        jsonschema.validate(json.loads(text), PERSON)


def test_transformers_regex_choice_and_beams(smollm2_hf: tuple[Any, Any]) -> None:
    from specdec.integrations.transformers import GrammarLogitsProcessor

    tok, model = smollm2_hf
    v = model.config.vocab_size
    pattern = r"[A-Z][a-z]+, [0-9]{2}-[0-9]{2}"
    proc = GrammarLogitsProcessor.from_tokenizer(tok, {"regex": pattern}, vocab_size=v)
    (text,) = generate(tok, model, ["Name a city and a date."], proc, max_new_tokens=20)
    assert re.fullmatch(pattern, text), text
    choices = ["yes", "no", "it depends"]
    proc = GrammarLogitsProcessor.from_tokenizer(tok, choice=choices, vocab_size=v)
    # Beam search reorders rows between steps: each row is replayed when it does.
    texts = generate(tok, model, ["Is the sky blue?"], proc, max_new_tokens=8, num_beams=3)
    assert texts[0] in choices, texts


def test_transformers_bad_input_is_named(smollm2_hf: tuple[Any, Any]) -> None:
    from specdec.integrations.transformers import GrammarLogitsProcessor

    tok, _ = smollm2_hf
    with pytest.raises(GrammarError, match="not both"):
        GrammarLogitsProcessor.from_tokenizer(tok, {"regex": "a"}, regex="b")
    with pytest.raises(SpecdecTypeError, match="fast tokenizer"):
        GrammarLogitsProcessor.from_tokenizer(object(), regex="a")
    with pytest.raises(SpecdecTypeError, match="CfgGrammar or a RegexGrammar"):
        GrammarLogitsProcessor("a")  # type: ignore[arg-type]


# -- the vLLM proposer's bookkeeping -------------------------------------------------------------


def random_tree(rng: random.Random, n: int) -> DraftTree:
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    lp = [0.0] * n
    for i in range(1, n):
        lp[i] = lp[parents[i]] + np.log(rng.choice([0.1, 0.25, 0.5, 0.25]))
    return DraftTree(list(range(100, 100 + n)), parents, depths, lp)


def test_best_chain_is_the_best_path() -> None:
    rng = random.Random(1)
    for _ in range(200):
        tree = random_tree(rng, rng.randint(1, 30))
        oracle = tree.best_path().tokens[1:].tolist()
        for limit in (0, 1, 3, 100):
            assert best_chain(tree, limit) == oracle[:limit]


def fresh_chain(history: list[list[int]], prompt_len: int, corpus: list[list[int]]) -> list[int]:
    """The oracle: a new drafter given the corpus and then the final context at once."""
    d = SuffixDrafter(max_match=8, max_depth=8, min_prob=0.1, remember_outputs=True, min_match=1)
    for c in corpus:
        d.add_corpus(c)
    chains = SuffixChains(max_tokens=8, min_prob=0.1)
    chains.drafter = d
    return chains.draft("x", history[-1], prompt_len, 8)


def test_chains_follow_confidence() -> None:
    rng = random.Random(2)
    chains = SuffixChains(max_tokens=8, min_prob=0.1)
    period = [rng.randrange(1000) for _ in range(13)]
    ctx = period * 3 + period[:5]
    # A context that repeats itself: the whole draft is the period's continuation.
    assert chains.draft("a", ctx, 10, 8) == (period * 2)[5:13]
    assert chains.draft("a", ctx, 10, 3) == period[5:8]
    # No token repeats: nothing is likely, nothing is drafted.
    assert chains.draft("b", rng.sample(range(1000, 2000), 60), 30, 8) == []


def test_finished_outputs_join_the_corpus_dropped_ones_do_not() -> None:
    rng = random.Random(3)
    out = rng.sample(range(5000, 6000), 40)
    for keep in (True, False):
        chains = SuffixChains(max_tokens=8, min_prob=0.1)
        prompt = rng.sample(range(1000), 20)
        chains.draft("a", prompt + out, len(prompt), 8)
        (chains.finish if keep else chains.drop)("a")
        assert chains.num_requests == 0
        other = rng.sample(range(1000, 2000), 20) + out[:10]
        got = chains.draft("b", other, 20, 8)
        assert got == (out[10:18] if keep else []), keep


@dataclass
class Sim:
    """A request in the simulated engine: its prompt, what it will generate, and how far."""

    prompt: list[int]
    output: list[int]
    done: int = 0
    history: list[list[int]] = field(default_factory=list)


def test_requests_join_finish_preempt_and_resume_like_fresh_drafters() -> None:
    rng = random.Random(4)
    motifs = [rng.sample(range(3000), 9) for _ in range(3)]

    def text(n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            out += rng.choice(motifs) if rng.random() < 0.7 else [rng.randrange(3000)]
        return out[:n]

    chains = SuffixChains(max_tokens=8, min_prob=0.1)
    sims = {f"r{i}": Sim(text(rng.randint(5, 30)), text(rng.randint(10, 60))) for i in range(12)}
    waiting = list(sims)
    running: list[str] = []
    preempted: list[str] = []
    finished: list[list[int]] = []  # outputs in the order they joined the corpus
    while waiting or running or preempted:
        # Join up to 4 running; resume preempted first (as vLLM's scheduler does).
        while len(running) < 4 and (preempted or waiting):
            running.append(preempted.pop(0) if preempted else waiting.pop(0))
        rng.shuffle(running)  # rows move around
        if len(running) > 1 and rng.random() < 0.2:
            preempted.append(running.pop())  # out of the batch, still alive
        alive = set(running) | set(preempted)
        chains.retain(alive)
        for key in running:
            s = sims[key]
            s.done += rng.randint(1, 3)
            context = s.prompt + s.output[: s.done]
            got = chains.draft(key, context, len(s.prompt), 8)
            # The oracle holds the same corpus (outputs finished before this step) and the
            # final context in one go.
            assert got == fresh_chain([context], len(s.prompt), finished), key
        for key in [k for k in running if sims[k].done >= len(sims[k].output)]:
            running.remove(key)
            s = sims[key]
            chains.retain(set(running) | set(preempted))
            finished.append((s.prompt + s.output[: s.done])[len(s.prompt) :])
    assert chains.num_requests == 0


def test_a_reused_id_starts_afresh() -> None:
    chains = SuffixChains(max_tokens=8, min_prob=0.1)
    chains.draft("a", [1, 2, 3, 1, 2, 3, 1], 3, 8)
    other = [9, 8, 7, 9, 8, 7, 9]
    assert chains.draft("a", other, 3, 8) == fresh_chain([other], 3, [])


# -- the vLLM logits processor's bookkeeping -----------------------------------------------------


class Direction:
    """vLLM's MoveDirectionality as the processor reads it (by name)."""

    def __init__(self, name: str) -> None:
        self.name = name


@dataclass
class Update:
    removed: list[int] = field(default_factory=list)
    added: list[tuple[int, Any, list[int] | None, list[int]]] = field(default_factory=list)
    moved: list[tuple[int, int, Direction]] = field(default_factory=list)


@dataclass
class Params:
    extra_args: dict[str, Any] | None = None


def test_vllm_processor_follows_the_batch_like_fresh_matchers() -> None:
    rng = random.Random(5)
    vocab = byte_vocab()
    v = vocab.vocab_size
    proc = VllmGrammarProcessor.__new__(VllmGrammarProcessor)
    proc._setup(vocab, v, 8)
    specs = [
        {"regex": "(ab|cd)+e"},
        {"choice": ["xy", "xz", "w"]},
        {"json_schema": {"type": "array", "items": {"type": "integer"}}},
        None,  # unconstrained
    ]
    rows: dict[int, tuple[Any, list[int]]] = {}  # batch index -> (spec, output list)
    for _ in range(300):
        up = Update()
        if rows and rng.random() < 0.2:  # a request leaves (finished or preempted)
            i = rng.choice(sorted(rows))
            up.removed.append(i)
            del rows[i]
        if len(rows) < 6 and rng.random() < 0.4:  # one joins (a resumed one keeps output)
            free = [i for i in range(8) if i not in rows]
            i = min(free)
            spec = rng.choice(specs)
            out: list[int] = []
            rows[i] = (spec, out)
            params = Params(None if spec is None else {"specdec": spec, "other": 1})
            up.added.append((i, params, [1, 2], out))
        if len(rows) > 1 and rng.random() < 0.3:
            a, b = rng.sample(sorted(rows), 2)
            if rng.random() < 0.5:
                up.moved.append((a, b, Direction("SWAP")))
                rows[a], rows[b] = rows[b], rows[a]
            else:
                free = [i for i in range(8) if i not in rows]
                if free:
                    up.moved.append((a, free[0], Direction("UNIDIRECTIONAL")))
                    rows[free[0]] = rows.pop(a)
        proc.update_state(up if (up.removed or up.added or up.moved) else None)
        width = max(rows, default=-1) + 1
        logits = torch.zeros(width, v)
        proc.apply(logits)
        for i, (spec, out) in rows.items():
            allowed = torch.isfinite(logits[i]).numpy()
            if spec is None:
                assert allowed.all()
                continue
            # Oracle: a fresh matcher fed the request's output.
            m = GrammarSpec.parse(spec).compile(vocab).matcher()
            assert m.accept_tokens(out) == len(out)
            bm = np.zeros((1, (v + 31) // 32), dtype=np.int32)
            m.fill_next_token_bitmask(bm)
            assert (unpack_bitmask(bm, v)[0] == allowed).all(), (spec, out)
            # Sample the next token among the allowed ones (EOS ends the request).
            t = int(rng.choice(np.flatnonzero(allowed)))
            if t in vocab.eos_ids:
                continue
            out.append(t)
        for i in [i for i, (s, out) in rows.items() if s is not None and len(out) > 12]:
            proc.update_state(Update(removed=[i]))
            del rows[i]
    assert proc.stats.failed == []


def test_vllm_processor_validates_params() -> None:
    VllmGrammarProcessor.validate_params(Params(None))
    VllmGrammarProcessor.validate_params(Params({"other": 1}))
    VllmGrammarProcessor.validate_params(Params({"specdec": {"regex": "[0-9]+"}}))
    VllmGrammarProcessor.validate_params(Params({"specdec": '{"choice": ["a", "b"]}'}))
    for bad, words in [
        ({"regex": "a("}, "unclosed group"),
        ({"json_schema": {"type": "objectx"}}, "objectx"),
        ({"choices": ["a"]}, "unknown key(s) 'choices'"),
        ("yes", "not JSON text"),
        ('["regex"]', "must be a dict"),
        ('{"choice": ["a", 1]}', "item 1 is int"),
    ]:
        with pytest.raises(ValueError, match=re.escape(words)) as e:
            VllmGrammarProcessor.validate_params(Params({"specdec": bad}))
        assert str(e.value).startswith("specdec grammar: ")


def test_step_costs_threshold_is_slope_times_rate() -> None:
    from specdec.integrations.vllm.proposer import StepCosts

    rng = np.random.default_rng(6)
    costs = StepCosts(window=32, least=8)
    fed = rng.integers(8, 40, size=50)
    secs = 0.05 + 0.002 * fed + rng.normal(0, 1e-4, size=50)
    out = rng.integers(8, 20, size=50)
    for i, (f, t, o) in enumerate(zip(fed, secs, out, strict=True)):
        if i == 7:
            assert costs.threshold() == 0.0  # fewer than `least` steps: no cut yet
        costs.add(int(f), float(t), int(o))
    slope, icpt = np.polyfit(fed[-32:], secs[-32:], 1)
    line = costs.line()
    assert line is not None
    assert (line.token_s, line.step_s) == (pytest.approx(slope), pytest.approx(icpt))
    rate = out[-16:].sum() / secs[-16:].sum()  # the rate follows the last `recent` steps
    assert costs.threshold() == pytest.approx(slope * rate)
    before = costs.threshold()
    # A larger batch: the same line, twice the output per second. After `recent` steps the
    # threshold is the new rate's, while the window's older steps still fit the slope.
    for f, t in zip(fed[:16], secs[:16], strict=True):
        costs.add(int(f), float(t), 28)
    rate = 16 * 28 / secs[:16].sum()
    slope = np.polyfit(np.r_[fed[-16:], fed[:16]], np.r_[secs[-16:], secs[:16]], 1)[0]
    assert costs.threshold() == pytest.approx(slope * rate)
    assert before * 1.5 < costs.threshold() < 0.9
    flat = StepCosts(least=2)
    for _ in range(4):
        flat.add(8, 0.05, 8)
    assert flat.threshold() == 0.0  # one token count only: the slope is unknown
    assert flat.line() is None


def test_chains_cut_where_calibrated_acceptance_falls() -> None:
    rng = random.Random(7)
    period = rng.sample(range(1000), 5)
    ctx = period * 4
    chains = SuffixChains(max_tokens=8, min_prob=0.1)
    assert len(chains.draft("a", ctx, 5, 8, threshold=0.5)) == 8  # uncalibrated: trusted
    # Its first tokens keep failing: the calibrated values fall below the threshold.
    for _ in range(30):
        chains.draft("a", ctx, 5, 8, threshold=0.5)
        chains.learn("a", [period[0] + 1])
    assert chains.draft("a", ctx, 5, 8, threshold=0.5) == []
    assert len(chains.draft("a", ctx, 5, 8, threshold=0.0)) == 8  # no threshold, no cut


def test_chains_follow_each_requests_own_evidence() -> None:
    """Two requests share the calibration; one's chains keep failing, the other's hold.
    The failing one's chains are cut shorter than the holding one's at the same threshold,
    and a finished request's evidence goes with it."""
    rng = random.Random(8)
    good, bad = rng.sample(range(1000), 6), rng.sample(range(1000, 2000), 6)
    chains = SuffixChains(max_tokens=8, min_prob=0.1)
    for _ in range(6):
        chains.draft("good", good * 4, 6, 8, threshold=0.3)
        chains.learn("good", good[:6] + [good[0]])  # all six drafted tokens held
        chains.draft("bad", bad * 4, 6, 8, threshold=0.3)
        chains.learn("bad", [bad[0] + 1])  # the first drafted token failed
    rid_good, rid_bad = chains._requests["good"].rid, chains._requests["bad"].rid
    assert (
        chains.calibration.request_factor(rid_bad)
        < 0.5
        < chains.calibration.request_factor(rid_good)
    )
    got_good = chains.draft("good", good * 4, 6, 8, threshold=0.3)
    got_bad = chains.draft("bad", bad * 4, 6, 8, threshold=0.3)
    assert len(got_bad) < len(got_good)
    chains.finish("bad")
    assert chains.calibration.request_factor(rid_bad) == 1.0
