"""The decoder's modules (parameter names follow the Hugging Face layout, so a checkpoint's
state dict loads as is) and the RMSNorm / RoPE math the forward paths share."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from .config import LlamaConfig

__all__ = [
    "RMSNorm",
    "rope_cos_sin",
    "Attention",
    "MLP",
    "DecoderLayer",
    "Backbone",
]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in at least float32 (as the reference implementation does) for bf16/fp16.
        if x.dtype == torch.float32:  # the fused kernel: same math, one call
            return nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dt = torch.promote_types(x.dtype, torch.float32)
        h = x.to(dt)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _norm(x: Tensor, norm: RMSNorm) -> Tensor:
    """``norm(x)`` without the module call (the fused kernel for float32, as RMSNorm does)."""
    if x.dtype == torch.float32:
        w = norm.weight
        return nn.functional.rms_norm(x, w.shape, w, norm.eps)
    out: Tensor = norm(x)
    return out


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[T, head_dim]`` for the half-split RoPE layout of Llama checkpoints."""
    ft = torch.promote_types(dtype, torch.float32)
    inv = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=ft) / head_dim)
    )
    ang = positions.to(ft)[:, None] * inv[None]
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rope(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """RoPE on ``x [..., D]``: ``x * cos + rotate_half(x) * sin`` in four ops, bit for bit
    (``rotate_half(x) * sin`` is the halves of ``x`` swapped times ``sin`` with its first half
    negated: a negation is exact). ``cos`` / ``sin_signed`` broadcast against ``x``."""
    half = x.shape[-1] // 2
    rot = x.view(*x.shape[:-1], 2, half).flip(-2).flatten(-2)
    rot.mul_(sin_signed)
    return (x * cos).add_(rot)


class Attention(nn.Module):
    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear
    h: int
    hkv: int
    hd: int

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        hd = c.head_dim or 0
        qkv = c.attention_bias or c.qkv_bias
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * hd, bias=qkv)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * hd, bias=qkv)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * hd, bias=qkv)
        self.o_proj = nn.Linear(c.num_attention_heads * hd, c.hidden_size, bias=c.attention_bias)
        self.h, self.hkv, self.hd = c.num_attention_heads, c.num_key_value_heads, hd


class MLP(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    self_attn: Attention
    mlp: MLP
    input_layernorm: RMSNorm
    post_attention_layernorm: RMSNorm

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Backbone(nn.Module):
    embed_tokens: nn.Embedding
    norm: RMSNorm

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def decoder_layers(self) -> list[DecoderLayer]:
        """The layers, typed (``nn.ModuleList`` items are untyped)."""
        return [cast(DecoderLayer, layer) for layer in self.layers]
