"""``python -m specdec.train {block,medusa} --target smollm2 --out DIR``: train a drafter for
SmolLM2-135M-Instruct on the standard library's source, within a time budget (resumes from
``DIR/train_state.pt`` when it is there). ``python -m specdec.train vocab --target smollm2
--out DIR --size N``: write ``DIR/draft_vocab.json``, the N most frequent tokens of the same
training split (the drafters' draft vocabulary subset, loaded when present)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from ..draft.block import BlockDrafter
from ..draft.medusa import MedusaDrafter
from ..errors import ConfigError
from .data import split_files, stdlib_files
from .loop import TrainConfig, train
from .vocab import frequent_vocab


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec.train", description=__doc__)
    ap.add_argument("kind", choices=("block", "medusa", "vocab"))
    ap.add_argument("--target", default="smollm2", choices=("smollm2",))
    ap.add_argument("--out", required=True, help="checkpoint directory to write")
    ap.add_argument("--minutes", type=float, default=60.0, help="time budget (all runs)")
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4, help="Medusa heads")
    ap.add_argument("--layers", type=int, default=1, help="block drafter layers")
    ap.add_argument(
        "--intermediate", type=int, default=None, help="block drafter MLP width (default 512)"
    )
    ap.add_argument(
        "--init-layer",
        type=int,
        default=None,
        help="block drafter: start the draft layer as a copy of this target layer",
    )
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20, help="linear warmup steps")
    ap.add_argument("--decay", type=float, default=4.0, help="depth d weighs exp(-d/decay)")
    ap.add_argument(
        "--reuse", type=int, default=1, help="drafter updates per target pass (per chunk)"
    )
    ap.add_argument("--blocks", type=int, default=32, help="block anchors per chunk")
    ap.add_argument("--positions", type=int, default=128, help="Medusa positions per chunk")
    ap.add_argument(
        "--cooldown",
        type=int,
        default=0,
        help="the learning rate falls linearly to 0 over the last N of --steps",
    )
    ap.add_argument("--eval-every", type=int, default=50, help="held-out figures every N steps")
    ap.add_argument("--size", type=int, default=8192, help="vocab: tokens kept (the most frequent)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fresh", action="store_true", help="ignore an existing train_state.pt")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from ..models import smollm2

    loaded = smollm2()
    target = loaded.model.eval()
    tok = loaded.tokenizer

    def encode(text: str) -> list[int]:
        return list(tok.encode(text).ids)

    split = split_files(stdlib_files(), seed=a.seed)
    if a.kind == "vocab":
        t0 = time.perf_counter()
        try:
            vocab = frequent_vocab(
                split.train,
                encode,
                target.config.vocab_size,
                a.size,
                source=f"python -m specdec.train vocab --target {a.target} --size {a.size} "
                f"--seed {a.seed}: the most frequent tokens of the training split",
            )
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        path = vocab.write(_mkdir(a.out))
        ex = vocab.extra
        print(
            f"vocab: {len(vocab)} of {vocab.vocab_size} tokens cover "
            f"{ex['coverage']:.4f} of {ex['counted_tokens']} training tokens "
            f"({ex['files']} files, {time.perf_counter() - t0:.1f} s) -> {path}"
        )
        return 0
    torch.manual_seed(a.seed)
    if a.kind == "block":
        drafter: BlockDrafter | MedusaDrafter = BlockDrafter.for_target(
            target,
            block_size=a.block_size,
            num_layers=a.layers,
            seed=a.seed,
            intermediate_size=a.intermediate,
            init_from=a.init_layer,
        )
    else:
        drafter = MedusaDrafter.for_target(target, num_heads=a.heads)
    cfg = TrainConfig(
        a.kind,
        seed=a.seed,
        minutes=a.minutes,
        steps=a.steps,
        seq_len=a.seq_len,
        lr=a.lr,
        blocks=a.blocks,
        positions=a.positions,
        warmup=a.warmup,
        decay=a.decay,
        reuse=a.reuse,
        eval_every=a.eval_every,
        cooldown=a.cooldown,
    )
    try:
        res = train(
            drafter, target, encode, split.train, split.held_out, cfg, a.out, resume=not a.fresh
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    last = res.held_out[-1]
    print(
        f"{a.kind}: {res.steps} steps in {res.seconds / 60:.1f} min; held-out KL "
        f"{last['kl']:.3f}, teacher-forced chain acceptance {last['accept']:.2f} -> {a.out}"
    )
    return 0


def _mkdir(path: str) -> Path:
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    return p


if __name__ == "__main__":
    sys.exit(main())
