"""What the trained drafters share: the target facts a drafter is tied to (hidden size,
vocabulary, layer count), and their checkpoint directories (``config.json`` +
``model.safetensors``) with checks that name any mismatch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, ConfigError
from ..models.llama import linears

__all__ = [
    "TargetFacts",
    "target_facts",
    "save_dir",
    "load_dir",
    "shipped_path",
    "shared_head_logits",
    "CONFIG",
    "WEIGHTS",
]

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
# Package data: the drafters `python -m specdec.train` made for SmolLM2-135M-Instruct.
SHIPPED = Path(__file__).parent / "weights"


def shipped_path(kind: str) -> Path:
    """The shipped checkpoint directory of ``kind`` (``"block"`` or ``"medusa"``) for
    SmolLM2-135M-Instruct; CheckpointError when this install has none."""
    d = SHIPPED / kind
    if not (d / CONFIG).is_file() or not (d / WEIGHTS).is_file():
        raise CheckpointError(f"no shipped {kind!r} drafter in {SHIPPED}")
    return d


@dataclass(frozen=True)
class TargetFacts:
    """What a drafter trained on one target must share with the target it drafts for."""

    hidden_size: int
    vocab_size: int
    num_layers: int

    def check(self, other: TargetFacts, what: str) -> None:
        """ConfigError naming every field where ``other`` (the target) differs."""
        bad = [
            f"{name} {getattr(self, name)} vs the target's {getattr(other, name)}"
            for name in ("hidden_size", "vocab_size", "num_layers")
            if getattr(self, name) != getattr(other, name)
        ]
        if bad:
            raise ConfigError(f"{what} was made for another target: " + "; ".join(bad))


def target_facts(target: Any) -> TargetFacts:
    """The facts of a :class:`~specdec.models.LlamaModel` (anything with a Llama ``config``)."""
    c = getattr(target, "config", None)
    try:
        return TargetFacts(
            int(c.hidden_size),  # type: ignore[union-attr]
            int(c.vocab_size),  # type: ignore[union-attr]
            int(c.num_hidden_layers),  # type: ignore[union-attr]
        )
    except AttributeError as e:
        raise ConfigError(
            f"trained drafters need a LlamaModel-style target (with .config), got "
            f"{type(target).__name__}"
        ) from e


def target_weights(target: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's token embedding and LM head weights (the drafters share them, frozen:
    they keep detached views for the plain path, and the tensors themselves so that their
    packed LM head is the target's own packed copy, see :func:`shared_head_logits`)."""
    emb = target.model.embed_tokens.weight
    head = emb if getattr(target, "lm_head", None) is None else target.lm_head.weight
    return emb, head


def shared_head_logits(
    hidden: torch.Tensor, head: torch.Tensor, plain: torch.Tensor, packed: bool
) -> torch.Tensor:
    """``hidden @ head.T``: the target's shared LM head ``head`` (its own weight tensor) on
    the drafter's final-norm hidden states. With ``packed`` and no autograd, through the
    packed oneDNN linear the target's decode steps use, keyed by that tensor, so drafter and
    target share one packed copy (``specdec.models.llama.linears``); else the plain product
    with ``plain`` (the detached weight: no gradient reaches the target)."""
    if packed and not torch.is_grad_enabled() and head.dtype == hidden.dtype:
        return linears(hidden, [head], [None])[0]
    out: torch.Tensor = hidden @ plain.to(hidden.dtype).T
    return out


def save_dir(path: str | Path, config: dict[str, Any], state: dict[str, torch.Tensor]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (float16: the shipped size) to ``path``."""
    from safetensors.torch import save_file

    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().to(torch.float16).contiguous().cpu() for k, v in state.items()},
        str(d / WEIGHTS),
    )
    (d / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return d


def load_dir(path: str | Path, kind: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read a drafter checkpoint directory of ``kind`` (its config's ``drafter`` field)."""
    from safetensors.torch import load_file

    d = Path(path)
    if not d.is_dir():
        raise CheckpointError(f"no drafter checkpoint directory at {d}")
    for name in (CONFIG, WEIGHTS):
        if not (d / name).is_file():
            raise CheckpointError(f"the drafter checkpoint {d} has no {name}")
    try:
        cfg = json.loads((d / CONFIG).read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{d / CONFIG} is not JSON: {e}") from e
    if not isinstance(cfg, dict) or cfg.get("drafter") != kind:
        got = cfg.get("drafter") if isinstance(cfg, dict) else type(cfg).__name__
        raise CheckpointError(f"{d} holds a {got!r} drafter, not a {kind!r} one")
    return cfg, load_file(str(d / WEIGHTS))


def check_state(
    where: str | Path, state: dict[str, torch.Tensor], want: dict[str, torch.Tensor]
) -> None:
    """Same parameter names and shapes as the module, or a CheckpointError naming them."""
    missing = sorted(set(want) - set(state))
    unexpected = sorted(set(state) - set(want))
    if missing or unexpected:
        raise CheckpointError(
            f"drafter checkpoint {where} does not match its config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    for k, v in want.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise CheckpointError(
                f"{where}: {k} has shape {tuple(state[k].shape)}, its config gives {tuple(v.shape)}"
            )
