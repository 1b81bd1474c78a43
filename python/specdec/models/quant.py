"""The target's linear layers on the GGUF file's own quantized blocks.

A decode step of a small model reads every weight once and does little arithmetic with it,
so the bytes it reads set much of its pace; a float32 copy of a ``Q4_1`` matrix is 6.4x the
bytes of the blocks (at several rows the kernel's arithmetic sets the pace instead, and
from ~60 rows oneDNN's float32 product is faster). :func:`~specdec.models.gguf.load_gguf` therefore
keeps, beside the float32 weights it dequantizes (what autograd, ``state_dict`` and peers
read), the blocks themselves as :class:`specdec._core.QuantMatrix` objects, and the model's
forward multiplies by those when a step has few rows (:attr:`LlamaModel.quant_max_rows`).
Each weight is dequantized on the fly exactly as gguf-py does, so the product is the float32
product with the same float32 weights, up to summation order (as oneDNN's is).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from .._core import QuantMatrix, quant_simd_available

# Block formats the kernel multiplies by (GGUF tensor type names).
QUANT_FORMATS = ("Q4_1", "Q8_0")

# How products on the blocks round: "exact", the float32 product of the dequantized weights
# (up to summation order); "int8", each input row quantized per block of 32 to 8 bits and
# integer dot products with the quants (llama.cpp's numeric class, AVX-512 VNNI).
Numeric = Literal["exact", "int8"]
NUMERIC_MODES: tuple[Numeric, ...] = ("exact", "int8")


@dataclass(frozen=True)
class QuantBlocks:
    """One weight's GGUF blocks: ``rows`` rows of ``cols / 32`` blocks of ``format``, the
    rows in the order of the float weight (``raw``: uint8, one row after the other)."""

    format: str
    rows: int
    cols: int
    raw: np.ndarray


def stack(parts: Sequence[QuantBlocks]) -> QuantMatrix:
    """One matrix of the parts' rows, one above the other (q/k/v, gate/up as one product)."""
    return QuantMatrix.stack([(p.format, p.rows, p.cols, p.raw.reshape(-1)) for p in parts])


@dataclass
class QuantizedLinears:
    """A model's decode-step linear groups (per layer q/k/v, o, gate/up, down; then the
    head: the order of ``LlamaModel._linear_groups``) as quantized matrices with their
    biases, and the float tensors they stand for with their version counters: a weight
    replaced or changed in place no longer matches its blocks, and the model stops using
    them."""

    plan: list[tuple[Tensor | QuantMatrix, Tensor | None]]
    held: list[Tensor]
    versions: list[int]
    # The module-registration count when ``held`` was last checked against the model.
    registrations: int

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m, _ in self.plan if isinstance(m, QuantMatrix))


def quant_matmul(
    x: Tensor, w: QuantMatrix, bias: Tensor | None = None, numeric: Numeric = "exact"
) -> Tensor:
    """``F.linear(x, W, bias)`` for the quantized ``W`` (``x``: CPU float32 ``[..., cols]``),
    the product rounded as ``numeric`` says."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], w.rows, dtype=torch.float32)
    w.matmul(x2.numpy(), out.numpy(), numeric=numeric)
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], w.rows)


def kernel_available() -> bool:
    """Whether the fast kernel runs on this CPU (AVX-512). Without it the model keeps its
    float32 path: the portable kernel gives the same results far slower than a BLAS."""
    return bool(quant_simd_available())


_threads_lock = threading.Lock()
_threads_users = 0
_threads_before = 0


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` inside the block, restored after. torch's
    setting is process-wide: blocks entered from several threads at once share one setting,
    and the last to leave restores what the first found."""
    global _threads_users, _threads_before
    with _threads_lock:
        if _threads_users == 0:
            _threads_before = torch.get_num_threads()
            if _threads_before != n:
                torch.set_num_threads(n)
        _threads_users += 1
    try:
        yield
    finally:
        with _threads_lock:
            _threads_users -= 1
            if _threads_users == 0 and torch.get_num_threads() != _threads_before:
                torch.set_num_threads(_threads_before)
