"""The quantized linear layers (``specdec._core.QuantMatrix``) against gguf-py: its
dequantization is the oracle for the weights, a float64 product of those weights for the
products; bad input raises named errors."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec._core import QuantMatrix
from specdec.errors import ConfigError, SpecdecTypeError
from specdec.models.quant import QuantBlocks, stack


def quantized(fmt: str, rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """GGUF blocks of a random ``rows x cols`` matrix and gguf-py's dequantization of them."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 2.0)).astype(np.float32)
    kind = gguf.GGMLQuantizationType[fmt]
    raw = gguf.quants.quantize(w, kind)
    return raw, gguf.quants.dequantize(raw, kind).reshape(rows, cols).astype(np.float32)


shapes = st.tuples(
    st.sampled_from(["Q4_1", "Q8_0"]),
    st.integers(1, 70),  # rows: tiles of 16 and a ragged last one
    st.integers(1, 6).map(lambda n: 32 * n),
    st.integers(0, 20),  # input rows
    st.integers(0, 2**32 - 1),
)


@settings(max_examples=60, deadline=None)
@given(shapes)
def test_weights_and_products_match_gguf_py(shape: tuple[str, int, int, int, int]) -> None:
    fmt, rows, cols, m, seed = shape
    raw, w = quantized(fmt, rows, cols, seed)
    q = QuantMatrix(fmt, rows, cols, raw.reshape(-1))
    assert (q.format, q.rows, q.cols) == (fmt, rows, cols)
    assert np.array_equal(q.dequantize(), w)  # bit for bit (up to the sign of zeros)
    x = np.random.default_rng(seed + 1).standard_normal((m, cols)).astype(np.float32)
    out = np.full((m, rows), np.nan, dtype=np.float32)
    q.matmul(x, out)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = np.abs(x.astype(np.float64)) @ np.abs(w.T.astype(np.float64))
    assert np.all(np.abs(out - exact) <= 1e-6 * bound + 1e-30)
    for r in range(m):  # a row's result does not depend on the rows beside it
        one = np.empty((1, rows), dtype=np.float32)
        q.matmul(x[r : r + 1], one)
        assert np.array_equal(one[0], out[r])


def test_stack_is_one_matrix_of_the_rows() -> None:
    a, wa = quantized("Q4_1", 20, 64, 1)
    b, wb = quantized("Q4_1", 9, 64, 2)
    s = stack([QuantBlocks("Q4_1", 20, 64, a), QuantBlocks("Q4_1", 9, 64, b)])
    assert s.rows == 29 and np.array_equal(s.dequantize(), np.concatenate([wa, wb]))
    c, _ = quantized("Q8_0", 9, 64, 3)
    with pytest.raises(ConfigError, match="cannot join"):
        stack([QuantBlocks("Q4_1", 20, 64, a), QuantBlocks("Q8_0", 9, 64, c)])


def test_bad_input_names_the_problem() -> None:
    raw, _ = quantized("Q8_0", 4, 64, 0)
    flat = raw.reshape(-1)
    with pytest.raises(ConfigError, match='unknown block format "Q4_K"'):
        QuantMatrix("Q4_K", 4, 64, flat)
    with pytest.raises(ConfigError, match="needs 340 bytes"):
        QuantMatrix("Q8_0", 5, 64, flat)
    with pytest.raises(ConfigError, match="do not split into Q8_0 blocks"):
        QuantMatrix("Q8_0", 4, 60, flat)
    with pytest.raises(ConfigError, match="at least one row"):
        QuantMatrix("Q8_0", 0, 64, flat[:0])
    with pytest.raises(SpecdecTypeError):
        QuantMatrix("Q8_0", 4, 64, flat.astype(np.int16))
    q = QuantMatrix("Q8_0", 4, 64, flat)
    with pytest.raises(ConfigError, match="input rows have 32 columns, the matrix 64"):
        q.matmul(np.zeros((2, 32), np.float32), np.zeros((2, 4), np.float32))
    with pytest.raises(ConfigError, match="output must be 2 x 4"):
        q.matmul(np.zeros((2, 64), np.float32), np.zeros((2, 5), np.float32))
    with pytest.raises(ConfigError, match="C-contiguous"):
        q.matmul(np.zeros((2, 64), np.float32), np.zeros((4, 2), np.float32).T)
    with pytest.raises(SpecdecTypeError):
        q.matmul(np.zeros((2, 64), np.float64), np.zeros((2, 4), np.float32))


def int8_reference(fmt: str, raw: np.ndarray, rows: int, x: np.ndarray) -> np.ndarray:
    """The int8 mode's arithmetic in numpy, from the GGUF bytes: each row block quantized
    (``amax / 127``, half to even), the integer dot products, then per block in order
    ``out = fma(d_w * d_x, dot, out)`` (and ``out = fma(m_w, s_x, out)`` for Q4_1), each
    fused multiply-add evaluated in float64 and rounded once to float32 (exact: the product
    of two float32 values is exact in float64, so the sum rounds once as an FMA's does)."""
    m, cols = x.shape
    nb = cols // 32
    blocks = raw.reshape(rows, nb, -1)
    d_w = blocks[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float32)
    if fmt == "Q4_1":
        m_w = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = blocks[:, :, 4:20]
        q_w = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int64)
    else:
        q_w = blocks[:, :, 2:].view(np.int8).astype(np.int64)
    xb = x.reshape(m, nb, 32)
    amax = np.abs(xb).max(axis=-1, initial=np.float32(0))
    d_x = (amax / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), d_x, out=np.zeros_like(d_x), where=d_x > 0)
    q_x = np.rint(xb * inv[..., None]).astype(np.int64)  # rint: half to even
    s_x = (d_x * q_x.sum(-1).astype(np.float32)).astype(np.float32)
    out = np.zeros((m, rows), dtype=np.float32)
    for b in range(nb):
        dot = np.einsum("mk,rk->mr", q_x[:, b], q_w[:, b]).astype(np.float64)
        u = (d_x[:, b, None] * d_w[None, :, b]).astype(np.float32)
        out = (u.astype(np.float64) * dot + out).astype(np.float32)
        if fmt == "Q4_1":
            out = (m_w[None, :, b].astype(np.float64) * s_x[:, b, None] + out).astype(np.float32)
    return out


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_int8_mode_is_its_integer_arithmetic(shape: tuple[str, int, int, int, int]) -> None:
    fmt, rows, cols, m, seed = shape
    raw, w = quantized(fmt, rows, cols, seed)
    q = QuantMatrix(fmt, rows, cols, raw.reshape(-1))
    x = np.random.default_rng(seed + 1).standard_normal((m, cols)).astype(np.float32)
    out = np.full((m, rows), np.nan, dtype=np.float32)
    q.matmul(x, out, numeric="int8")
    assert np.array_equal(out, int8_reference(fmt, raw.reshape(rows, -1), rows, x))
    # Within the activations' rounding of the float product: half a step, amax / 254.
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    step = np.repeat(np.abs(x).reshape(m, cols // 32, 32).max(-1, initial=0.0) / 254.0, 32, axis=1)
    bound = (step + 1e-6 * np.abs(x)) @ np.abs(w.T.astype(np.float64))
    assert np.all(np.abs(out - exact) <= 1.01 * bound + 1e-30)


def test_int8_mode_refuses_what_it_cannot_quantize() -> None:
    raw, _ = quantized("Q4_1", 4, 64, 0)
    q = QuantMatrix("Q4_1", 4, 64, raw.reshape(-1))
    x = np.ones((2, 64), np.float32)
    x[1, 5] = np.inf
    with pytest.raises(ConfigError, match="input row 1 has a non-finite value at column 5"):
        q.matmul(x, np.zeros((2, 4), np.float32), numeric="int8")
    with pytest.raises(ConfigError, match="numeric must be 'exact' or 'int8'"):
        q.matmul(x[:1], np.zeros((1, 4), np.float32), numeric="fast")  # type: ignore[arg-type]
