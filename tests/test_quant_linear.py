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
