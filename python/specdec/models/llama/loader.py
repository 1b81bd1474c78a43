"""Loading a local Hugging Face checkpoint directory (``config.json`` + ``*.safetensors``,
no network) into a :class:`~specdec.models.llama.LlamaModel`."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...errors import CheckpointError
from ...verify.attention import Backend
from .config import LlamaConfig
from .model import LlamaModel

__all__ = ["load_checkpoint"]


def load_checkpoint(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    backend: Backend = "auto",
) -> LlamaModel:
    """Load a local Llama/Qwen2-format checkpoint directory (``config.json`` and one or more
    ``*.safetensors`` files). ``dtype`` defaults to the config's ``torch_dtype``/``dtype``
    (float32 if absent)."""
    from safetensors.torch import load_file

    d = Path(path)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"no config.json in {d}")
    cfg = json.loads(cfg_path.read_text())
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {d}")
    config = LlamaConfig.from_hf(cfg)
    if dtype is None:
        name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
        dtype = getattr(torch, str(name).replace("torch.", ""), None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"unknown checkpoint dtype {name!r}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = LlamaModel(config, backend=backend)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = set(shapes)
    missing = sorted(expected - set(state))
    unexpected = sorted(k for k in set(state) - expected if "rotary_emb" not in k)
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {d} does not match the config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    for k in expected:
        if tuple(state[k].shape) != shapes[k]:
            raise CheckpointError(
                f"{k}: checkpoint shape {tuple(state[k].shape)}, expected {shapes[k]}"
            )
    model.load_state_dict(
        {k: state[k].to(device=device, dtype=dtype) for k in expected}, assign=True
    )
    return model.eval()
