"""Beam search on SmolLM2-135M: specdec's ``beam_search`` on shared paged KV blocks, the same
search with a private K/V copy per beam (``share_kv=False``: re-copied on every reorder, as a
cache without sharing must), and transformers' ``generate(num_beams=...)``, in one process
with the same thread count, on the same prompt.

Per beam width: beam tokens per second (selection steps x width / wall seconds; the three
run the same search, checked: same best hypothesis, same number of steps, transformers'
counted as its forward calls), and peak KV memory: specdec's
most blocks in use at once times the bytes of a block, transformers' final cache tensors
(K and V of every layer, ``[width, heads, prompt + steps - 1, head_dim]``; its peak is at
least that). transformers at width 1 runs greedy decoding, not beam search (its
``generate`` switches mode), so that row compares with greedy.

Run: ``python benches/bench_beam.py`` (prints markdown tables); ``--smoke`` runs a tiny
random model at two widths (a test that the script works, not a measurement).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from specdec.decode import BeamSearchResult, beam_search
from specdec.models import LlamaConfig, LlamaModel

# Two workloads: a short chat request, and a question about a passage (summarisation and
# question answering are where beam search is used; there the prompt outweighs the answer).
CHAT = [
    {"role": "system", "content": "You are a helpful assistant who answers carefully."},
    {
        "role": "user",
        "content": (
            "I am planning a three-day trip to Lisbon in late autumn. I like museums, old "
            "neighbourhoods, seafood and walking, but I do not like crowds or long queues. "
            "Suggest a plan for the first morning, with one museum and one place to eat."
        ),
    },
]
PASSAGE = (
    "The Rhine is one of the major rivers of Europe. It rises in the Swiss Alps, forms part "
    "of the borders between Switzerland and Liechtenstein, Switzerland and Austria, and "
    "Switzerland and Germany, then flows through Lake Constance before turning west along "
    "the Swiss-German border. At Basel it turns north, forming the border between France "
    "and Germany through the Upper Rhine Plain, and then flows through the Rhine Gorge, a "
    "narrow valley lined with castles and vineyards that is a UNESCO World Heritage Site. "
    "Below Bonn the river widens as it crosses the industrial Rhineland, passing Cologne and "
    "Duisburg, where one of the largest inland ports in the world handles coal, steel and "
    "containers. In the Netherlands it splits into several branches, among them the Waal "
    "and the Nederrijn, which reach the North Sea through the delta it shares with the Meuse. "
    "For centuries the Rhine has been a trade route linking the Alps with the sea: Roman "
    "forts guarded its banks, medieval towns raised tolls on its barges, and in the "
    "nineteenth century engineers straightened its course to make navigation safer and to "
    "drain the surrounding marshes. Today it carries more freight than any other European "
    "river, supplies drinking water to millions of people, and its valleys draw tourists "
    "who come for the wine, the walking paths and the river cruises."
)
DOC_QA = [
    {"role": "system", "content": "Answer in one sentence, using only the passage."},
    {"role": "user", "content": PASSAGE + "\n\nWhere does the Rhine reach the sea?"},
]
PROMPTS = {"doc-qa": DOC_QA, "chat": CHAT}


@dataclass(frozen=True)
class Row:
    method: str
    width: int
    seconds: float
    steps: int
    kv_bytes: int

    @property
    def tokens_per_s(self) -> float:
        return self.steps * self.width / self.seconds


def hf_kv_bytes(cache: Any) -> int:
    """Bytes of a transformers cache's K/V tensors (every layer)."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def run_hf(hf: Any, ids: list[int], width: int, new: int, eos: int) -> tuple[Any, float, int]:
    """transformers' output, seconds, and its steps (forwards: the prefill, then one per
    step but the last, as in specdec)."""
    x = torch.tensor([ids])
    calls = []
    hook = hf.register_forward_hook(lambda *_: calls.append(1))
    t0 = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=False,
            num_beams=width,
            max_new_tokens=new,
            eos_token_id=eos,
            pad_token_id=eos,
            return_dict_in_generate=True,
            output_scores=True,
        )
    sec = time.perf_counter() - t0
    hook.remove()
    return out, sec, len(calls)


def run_ours(model: LlamaModel, ids: list[int], width: int, new: int, eos: int,
             share: bool) -> tuple[BeamSearchResult, float]:  # fmt: skip
    t0 = time.perf_counter()
    r = beam_search(
        model, [ids], num_beams=width, max_new_tokens=new, eos_token_id=eos, share_kv=share
    )
    return r, time.perf_counter() - t0


def tiny_pair() -> tuple[LlamaModel, Any, list[int], int]:
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    cfg: dict[str, Any] = dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    ours = LlamaModel(LlamaConfig(**cfg)).init_random(0)
    hf: Any = LlamaForCausalLM(HFConfig(**cfg))
    hf.eval()
    hf.load_state_dict(ours.state_dict())
    return ours, hf, list(range(1, 40)), 2


def smollm2_pair(prompt: str) -> tuple[LlamaModel, Any, list[int], int]:
    from transformers import AutoModelForCausalLM

    from specdec.models import smollm2
    from specdec.models.gguf import smollm2_path

    loaded = smollm2()
    f = smollm2_path()
    hf: Any = AutoModelForCausalLM.from_pretrained(f.parent, gguf_file=f.name, dtype=torch.float32)
    hf.eval()
    if loaded.eos_token_id is None:  # beam search's EOS semantics are what is measured
        raise SystemExit("the GGUF file names no EOS token")
    return loaded.model, hf, loaded.encode_chat(PROMPTS[prompt]), loaded.eos_token_id


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny random model, widths 1-2")
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--new", type=int, default=32, help="max_new_tokens")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    ap.add_argument("--prompt", choices=sorted(PROMPTS), default="doc-qa")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.smoke:
        model, hf, ids, eos = tiny_pair()
        widths, new, repeats = [1, 2], 4, 1
    else:
        model, hf, ids, eos = smollm2_pair(args.prompt)
        widths, new, repeats = args.widths, args.new, args.repeats
    run_ours(model, ids, 2, 2, eos, True)  # warm-up: first-call allocations and imports
    run_hf(hf, ids, 2, 2, eos)
    rows: list[Row] = []
    for w in widths:
        best: dict[str, Row] = {}
        for _ in range(repeats):
            shared, s_sec = run_ours(model, ids, w, new, eos, True)
            copied, c_sec = run_ours(model, ids, w, new, eos, False)
            out, h_sec, hf_steps = run_hf(hf, ids, w, new, eos)
            assert copied.sequences == shared.sequences and copied.steps == shared.steps
            gen = out.sequences[0, len(ids) :].tolist()
            best_ours = shared.sequences[0][0]
            if w > 1:  # same search: same best hypothesis (transformers pads it to its width)
                assert gen[: len(best_ours)] == best_ours, (gen, best_ours)
            assert w == 1 or hf_steps == shared.steps, (hf_steps, shared.steps)
            for r in (
                Row("specdec shared", w, s_sec, shared.steps, shared.peak_kv_bytes),
                Row("specdec copies", w, c_sec, copied.steps, copied.peak_kv_bytes),
                Row("transformers", w, h_sec, hf_steps, hf_kv_bytes(out.cache)),
            ):
                if r.method not in best or r.seconds < best[r.method].seconds:
                    best[r.method] = r
        rows += best.values()
    print(
        f"SmolLM2-135M float32 ({'tiny random model' if args.smoke else args.prompt}): "
        f"prompt {len(ids)} tokens, max_new_tokens {new}, {args.threads} thread(s), "
        f"best of {repeats}; ratios are specdec shared over the other method\n"
    )
    print("| width | steps | shared tok/s | vs copies | vs transformers | shared KV MiB "
          "| KV vs copies | KV vs transformers |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for w in widths:
        by = {r.method: r for r in rows if r.width == w}
        s, c, h = by["specdec shared"], by["specdec copies"], by["transformers"]
        print(
            f"| {w} | {s.steps} | {s.tokens_per_s:.1f} | {s.tokens_per_s / c.tokens_per_s:.2f}x "
            f"| {s.tokens_per_s / h.tokens_per_s:.2f}x | {s.kv_bytes / 2**20:.2f} "
            f"| {s.kv_bytes / max(c.kv_bytes, 1):.2f} | {s.kv_bytes / max(h.kv_bytes, 1):.2f} |"
        )
    print()
    print("| method | width | seconds | steps | tok/s | KV MiB |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        mib = r.kv_bytes / 2**20
        print(f"| {r.method} | {r.width} | {r.seconds:.2f} | {r.steps} | "
              f"{r.tokens_per_s:.1f} | {mib:.2f} |")  # fmt: skip
    assert all(math.isfinite(r.tokens_per_s) for r in rows)


if __name__ == "__main__":
    main()
