"""Teacher-forced distillation of a drafter from its target.

Per training step: one chunk of text goes through the target once (hidden states captured,
its next-token distributions the soft labels), then the drafter predicts, from the same
hidden states, what the target would say further on, and the loss is the KL divergence from
the target's distribution to the drafter's at every predicted position:

* block drafter: ``blocks`` anchors p per chunk; the block [token p, MASK...] sees the context
  features of positions < p and predicts, at block position j, the target's distribution at
  position p + j (the token after p + j);
* Medusa heads: ``positions`` positions t per chunk; head k predicts the target's
  distribution at t + k.

Deterministic given the seed (data order, anchors, initialisation); stops at a time budget;
resumable from the checkpoint it writes (``train_state.pt``) every ``save_every`` steps.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from ..draft.base import hidden_capture
from ..draft.block import BlockDrafter
from ..draft.medusa import MedusaDrafter
from ..errors import CheckpointError, ConfigError
from ..protocols import HiddenCapture
from .data import chunks

__all__ = ["TrainConfig", "TrainResult", "train", "teacher_pass", "Kind"]

Kind = Literal["block", "medusa"]
STATE = "train_state.pt"
# What a resumed run must share with the run it continues (the budget and steps may grow).
_RESUMABLE_FIELDS = (
    "kind",
    "seed",
    "seq_len",
    "blocks",
    "positions",
    "lr",
    "warmup",
    "decay",
    "reuse",
)
LOG = "train_log.json"


@dataclass(frozen=True)
class TrainConfig:
    """``minutes``: time budget (the run stops at the first step past it, all runs of a
    resumed training together); ``steps``: most steps; ``seq_len``: tokens per chunk;
    ``blocks`` / ``positions``: predictions per chunk (block drafter / Medusa heads);
    ``decay``: the loss weight of depth d is ``exp(-d / decay)`` (0: equal); ``reuse``:
    drafter updates per target pass (each chunk's hidden states and target distributions,
    the expensive part of a step, are kept for ``reuse`` consecutive updates, each with
    fresh anchors / positions); ``cooldown``: the learning rate falls linearly to 0 over the
    last ``cooldown`` of the ``steps`` (0: constant after the warmup; a resumed run may set
    it, like the budget)."""

    kind: Kind
    seed: int = 0
    minutes: float = 60.0
    steps: int = 1_000_000
    seq_len: int = 256
    blocks: int = 16
    positions: int = 64
    lr: float = 1e-3
    warmup: int = 20
    decay: float = 4.0
    reuse: int = 1
    cooldown: int = 0
    eval_every: int = 50
    eval_chunks: int = 8
    save_every: int = 25

    def __post_init__(self) -> None:
        if self.kind not in ("block", "medusa"):
            raise ConfigError(f"kind must be 'block' or 'medusa', got {self.kind!r}")
        for name in (
            "seq_len",
            "blocks",
            "positions",
            "reuse",
            "eval_every",
            "eval_chunks",
            "save_every",
        ):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cooldown < 0 or self.cooldown > self.steps:
            raise ConfigError(f"cooldown must be in [0, steps], got {self.cooldown}")
        if self.minutes <= 0 or self.lr <= 0:
            raise ConfigError(f"minutes and lr must be > 0, got {self.minutes}, {self.lr}")


@dataclass
class TrainResult:
    """What a run did: steps in all, seconds in all (resumed runs added), the last training
    loss (mean KL, nats) and held-out figures per evaluation."""

    steps: int = 0
    seconds: float = 0.0
    loss: float = math.nan
    held_out: list[dict[str, float]] = field(default_factory=list)


def teacher_pass(
    target: Any, ids: Sequence[int], capture: HiddenCapture
) -> tuple[torch.Tensor, torch.Tensor]:
    """One causal target forward over ``ids``: (the hidden states ``capture`` names, ``[T,
    W]``, the target's next-token log-probabilities ``[T, V]``)."""
    dev = target.device
    t = torch.tensor(list(ids), dtype=torch.long, device=dev)
    cache = target.new_cache(len(ids))
    logits = target(t, torch.arange(len(ids), device=dev), cache, None, hidden=capture)
    cache.rollback()
    hidden = capture.states
    if hidden is None:
        raise ConfigError("the capture names no hidden states (no layers, not final)")
    return hidden.float(), torch.log_softmax(logits.float(), -1)


def _kl(
    student_logits: torch.Tensor, teacher_logp: torch.Tensor, decay: float = 0.0
) -> torch.Tensor:
    """KL(teacher || student) (nats) over ``[N, D, V]``: the mean over N of a weighted mean
    over depths, depth d weighted ``exp(-d / decay)`` (0: equal weights). A drafted token
    only counts if every shallower one was accepted, so shallow depths matter most."""
    logq = torch.log_softmax(student_logits.float(), -1)
    kl = (teacher_logp.exp() * (teacher_logp - logq)).sum(-1)  # [N, D]
    d = torch.arange(kl.shape[-1], dtype=kl.dtype)
    w = torch.exp(-d / decay) if decay > 0 else torch.ones_like(d)
    return (kl * w).sum(-1).mean() / w.sum()


def _predict(
    drafter: BlockDrafter | MedusaDrafter,
    cfg: TrainConfig,
    ids: Sequence[int],
    hidden: torch.Tensor,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's logits ``[N, D, V]`` at sampled places of one chunk, and the positions
    ``[N, D]`` of the target distributions they are compared with."""
    n = len(ids)
    if isinstance(drafter, BlockDrafter):
        el = drafter.config.block_size
        if n < el + 2:
            raise ConfigError(f"seq_len {n} is too short for blocks of {el}")
        anchors = torch.randperm(n - el, generator=gen)[: cfg.blocks] + 1  # p in [1, n - el]
        pos = torch.arange(n)
        kv = drafter.context_kv(hidden, pos)
        visible = pos[None] < anchors[:, None]
        roots = torch.tensor([ids[int(p)] for p in anchors])
        h = drafter.block_hidden(roots, anchors, kv, visible)
        return drafter.logits(h), anchors[:, None] + torch.arange(el)[None]
    k = drafter.config.num_heads
    if n < k + 2:
        raise ConfigError(f"seq_len {n} is too short for {k} heads")
    ts = torch.randperm(n - k, generator=gen)[: cfg.positions]
    h = drafter.head_hidden(hidden[ts])
    return drafter.logits(h), ts[:, None] + torch.arange(1, k + 1)[None]


@torch.no_grad()
def _evaluate(
    drafter: BlockDrafter | MedusaDrafter,
    target: Any,
    cfg: TrainConfig,
    held: list[tuple[list[int], torch.Tensor, torch.Tensor]],
) -> dict[str, float]:
    """Held-out KL and chain acceptance (teacher-forced: 1 + the leading depths where the
    drafter's argmax is the target's), on fixed held-out chunks (with their teacher passes)
    and anchors; ``kl@0``: the KL at the first drafted depth alone; ``accept@4``: the chain
    cut at depth 4 (the Medusa heads' depth)."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    kls, kl0, acc, acc4 = [], [], [], []
    for ids, hidden, logp in held:
        logits, where = _predict(drafter, cfg, ids, hidden, gen)
        teacher = logp[where]
        kls.append(float(_kl(logits, teacher)))
        kl0.append(float(_kl(logits[:, :1], teacher[:, :1])))
        same = (logits.argmax(-1) == teacher.argmax(-1)).int()
        run = same.cumprod(-1)
        acc.append(float(1 + run.sum(-1).float().mean()))
        acc4.append(float(1 + run[:, :4].sum(-1).float().mean()))
    n = len(kls)
    return {
        "kl": sum(kls) / n,
        "kl@0": sum(kl0) / n,
        "accept": sum(acc) / n,
        "accept@4": sum(acc4) / n,
    }


def train(
    drafter: BlockDrafter | MedusaDrafter,
    target: Any,
    encode: Callable[[str], list[int]],
    train_files: Sequence[Path],
    held_out_files: Sequence[Path],
    cfg: TrainConfig,
    out: str | Path,
    *,
    resume: bool = True,
    progress: bool = True,
) -> TrainResult:
    """Train ``drafter`` against ``target`` and write it to ``out`` (its checkpoint
    directory, plus ``train_state.pt`` to resume from and ``train_log.json``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    want = "block" if isinstance(drafter, BlockDrafter) else "medusa"
    if cfg.kind != want:
        raise ConfigError(f"TrainConfig.kind is {cfg.kind!r} but the drafter is a {want} drafter")
    capture = hidden_capture(drafter)
    assert capture is not None  # both kinds read hidden states
    for p in target.parameters():
        p.requires_grad_(False)
    torch.manual_seed(cfg.seed)
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, weight_decay=0.0)
    res = TrainResult()
    state_path = out / STATE
    if resume and state_path.is_file():
        st = torch.load(state_path, weights_only=False)
        same = {k: v for k, v in asdict(cfg).items() if k in _RESUMABLE_FIELDS}
        old = {**asdict(TrainConfig(cfg.kind)), **st.get("config", {})}  # older: defaults
        was = {k: v for k, v in old.items() if k in _RESUMABLE_FIELDS}
        if was != same:
            raise CheckpointError(
                f"{state_path} was written with another training config: {was}, now {same}"
            )
        drafter.load_state_dict(st["drafter"])
        opt.load_state_dict(st["optimizer"])
        res = TrainResult(**st["result"])
    held_ids = list(_take(chunks(held_out_files, encode, cfg.seq_len), cfg.eval_chunks))
    if not held_ids:
        raise ConfigError("the held-out files give no chunk of seq_len tokens")
    with torch.no_grad():  # the target is frozen: its held-out passes are computed once
        held = [(ids, *teacher_pass(target, ids, capture)) for ids in held_ids]
    data = chunks(train_files, encode, cfg.seq_len)
    for _ in range(res.steps // cfg.reuse):  # resume: the chunks already trained on
        next(data, None)
    # The current chunk and its teacher pass (None: take the next chunk at the next step;
    # a run resumed inside a chunk's reuse recomputes that chunk's pass, the same numbers).
    current: tuple[list[int], torch.Tensor, torch.Tensor] | None = None
    t_start, done_before = time.perf_counter(), res.seconds
    losses: list[float] = []

    def save() -> None:
        res.seconds = done_before + time.perf_counter() - t_start
        torch.save(
            {
                "config": asdict(cfg),
                "drafter": drafter.state_dict(),
                "optimizer": opt.state_dict(),
                "result": asdict(res),
            },
            state_path,
        )

    drafter.train()
    while res.steps < cfg.steps:
        elapsed = done_before + time.perf_counter() - t_start
        if elapsed >= cfg.minutes * 60:
            break
        if current is None or res.steps % cfg.reuse == 0:
            ids = next(data, None)
            if ids is None:  # the data ran out: start over (another pass)
                data = chunks(train_files, encode, cfg.seq_len)
                ids = next(data, None)
                if ids is None:
                    raise ConfigError("the training files give no chunk of seq_len tokens")
            with torch.no_grad():
                current = (ids, *teacher_pass(target, ids, capture))
        ids, hidden, logp = current
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + res.steps)
        logits, where = _predict(drafter, cfg, ids, hidden, gen)
        loss = _kl(logits, logp[where], cfg.decay)
        for g in opt.param_groups:
            g["lr"] = cfg.lr * _lr_factor(cfg, res.steps)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        res.steps += 1
        losses.append(float(loss.detach()))
        res.loss = sum(losses[-20:]) / len(losses[-20:])
        if res.steps % cfg.eval_every == 0:
            drafter.eval()
            res.held_out.append({"step": res.steps, **_evaluate(drafter, target, cfg, held)})
            drafter.train()
        if res.steps % cfg.save_every == 0:
            save()
        if progress:
            last = res.held_out[-1]["accept"] if res.held_out else math.nan
            print(
                f"\r{cfg.kind} step {res.steps} | loss {res.loss:.3f} | held-out accept "
                f"{last:.2f} | {elapsed / 60:.1f}/{cfg.minutes:g} min",
                end="",
                file=sys.stderr,
                flush=True,
            )
    drafter.eval()
    if not res.held_out or res.held_out[-1]["step"] != res.steps:
        res.held_out.append({"step": res.steps, **_evaluate(drafter, target, cfg, held)})
    save()
    if progress:
        print(file=sys.stderr)
    note = (
        f"python -m specdec.train {cfg.kind}: {res.steps} steps of {cfg.seq_len} tokens, "
        f"{res.seconds / 60:.1f} min, seed {cfg.seed}; held-out teacher-forced accept "
        f"{res.held_out[-1]['accept']:.2f}"
    )
    drafter.save(out, note=note)
    (out / LOG).write_text(json.dumps({"config": asdict(cfg), **asdict(res)}, indent=2) + "\n")
    return res


def _lr_factor(cfg: TrainConfig, step: int) -> float:
    """Warmup, constant, then (``cooldown``) a linear fall to 0 at ``steps``."""
    f = min(1.0, (step + 1) / cfg.warmup)
    if cfg.cooldown:
        f = min(f, (cfg.steps - step) / cfg.cooldown)
    return f


def _take(it: Iterator[list[int]], n: int) -> Iterator[list[int]]:
    for _ in range(n):
        x = next(it, None)
        if x is None:
            return
        yield x
