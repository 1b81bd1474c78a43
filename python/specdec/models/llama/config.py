"""The decoder's shape and options (:class:`LlamaConfig`), read from a Hugging Face
``config.json`` where one is given."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ...errors import ConfigError

__all__ = ["LlamaConfig"]


@dataclass
class LlamaConfig:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v/o (Llama's flag)
    qkv_bias: bool = False  # bias on q/k/v only (Qwen2)
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        dims = (
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.max_position_embeddings,
        )
        if min(dims) <= 0:
            raise ConfigError(f"config dimensions must be positive: {self}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> LlamaConfig:
        """From a Hugging Face ``config.json`` dict (Llama, Qwen2, Mistral without sliding
        window). Unsupported features (RoPE scaling, sliding window) raise ConfigError rather
        than giving silently different logits."""
        mt = cfg.get("model_type", "llama")
        if mt not in ("llama", "qwen2", "mistral"):
            raise ConfigError(f"unsupported model_type {mt!r} (llama, qwen2, mistral)")
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling")
        rtype = (scaling or {}).get("rope_type", (scaling or {}).get("type")) or rope.get(
            "rope_type", "default"
        )
        if rtype != "default":
            raise ConfigError(f"RoPE scaling {rtype!r} is not supported")
        if cfg.get("use_sliding_window") or (mt == "mistral" and cfg.get("sliding_window")):
            raise ConfigError("sliding-window attention is not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {cfg.get('hidden_act')!r} is not supported (silu)")
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in cfg.items() if k in names}
        kw["rope_theta"] = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        if mt == "qwen2":
            kw["qkv_bias"] = True
        return cls(**kw)
