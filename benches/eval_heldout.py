"""Held-out figures of drafter checkpoints for SmolLM2-135M-Instruct, on the training's own
held-out chunks (the standard library files the seed holds out): KL (nats, mean over
depths), teacher-forced chain acceptance at the drafter's full depth and cut at depth 4.

Run: ``python benches/eval_heldout.py --block DIR --medusa DIR`` (default: the shipped
weights; ``--chunks``: held-out chunks of 256 tokens, default 8 = the training's;
``--draft-vocab full,auto,FILE...``: one evaluation per draft vocabulary, ``auto`` = the
checkpoint's ``draft_vocab.json`` when it has one; ``@f32`` / ``@bf16`` after one: the
drafter's packed precision; with a subset the KL is infinite, since tokens outside it get no
probability, so only the acceptance figures compare).
"""

from __future__ import annotations

import argparse
import json

import torch

from specdec.draft import BlockDrafter, MedusaDrafter
from specdec.draft.base import hidden_capture
from specdec.train import TrainConfig, split_files, stdlib_files
from specdec.train.data import chunks
from specdec.train.loop import _evaluate, _take, teacher_pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--block", default=None)
    ap.add_argument("--medusa", default=None)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--draft-vocab", default="auto", help="comma list: full, auto, or files")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdec.models import smollm2

    lm = smollm2()
    target = lm.model.eval()

    def encode(text: str) -> list[int]:
        return list(lm.tokenizer.encode(text).ids)

    split = split_files(stdlib_files(), seed=0)
    ids = list(_take(chunks(split.held_out, encode, 256), a.chunks))
    out = {}
    for kind, path in (("block", a.block), ("medusa", a.medusa)):
        cls = BlockDrafter if kind == "block" else MedusaDrafter
        held = None
        for choice in a.draft_vocab.split(","):
            vocab, _, prec = choice.partition("@")
            v = None if vocab == "full" else vocab
            bf16 = {"": None, "bf16": True, "f32": False}[prec]
            d = (
                cls.load(path, target, draft_vocab=v, bf16=bf16)
                if path
                else cls.shipped(target, draft_vocab=v, bf16=bf16)
            )
            if held is None:
                capture = hidden_capture(d)
                assert capture is not None
                with torch.no_grad():
                    held = [(x, *teacher_pass(target, x, capture)) for x in ids]
            cfg = TrainConfig(kind, blocks=32, positions=128)  # type: ignore[arg-type]
            res = _evaluate(d.float(), target, cfg, held)
            n = len(d.draft_vocab) if d.draft_vocab is not None else "full"
            out[f"{kind} {choice}"] = res
            print(kind, path or "shipped", f"vocab {choice} ({n})", json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
