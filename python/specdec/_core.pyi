"""Type stub of the Rust extension ``specdec._core`` (keep in step with rust/python/src)."""

import numpy as np
import numpy.typing as npt

__version__: str

# ---- tree ---------------------------------------------------------------------------------
# A tree crosses the boundary as (tokens i64, parents i32, depths i32, logprobs f64,
# ancestor_bits u64 [n, W], first_child i32, next_sibling i32, expected_acceptance).
TreeTuple = tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int32],
    npt.NDArray[np.int32],
    npt.NDArray[np.float64],
    npt.NDArray[np.uint64],
    npt.NDArray[np.int32],
    npt.NDArray[np.int32],
    float,
]

def build_ddtree(
    logprobs: npt.NDArray[np.float32],
    token_ids: npt.NDArray[np.int64],
    budget: int,
    root_token: int = -1,
    min_logprob: float | None = None,
) -> TreeTuple: ...
def build_ddtree_batch(
    logprobs: npt.NDArray[np.float32],
    token_ids: npt.NDArray[np.int64],
    budgets: npt.NDArray[np.int64],
    root_tokens: npt.NDArray[np.int64] | None = None,
    min_logprob: float | None = None,
) -> list[TreeTuple]: ...
def tree_from_branches(branches: list[list[int]], root_token: int = -1) -> TreeTuple: ...
def tree_arrays(
    parents: npt.NDArray[np.int32], depths: npt.NDArray[np.int32]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int32], npt.NDArray[np.int32]]: ...
def attention_mask(
    bits: npt.NDArray[np.uint64], prefix_len: int, additive: bool = False
) -> npt.NDArray[np.bool_] | npt.NDArray[np.float32]: ...
def retrieve_indices(
    parents: npt.NDArray[np.int32], depths: npt.NDArray[np.int32]
) -> npt.NDArray[np.int32]: ...
def pad_tree(
    tokens: npt.NDArray[np.int64],
    parents: npt.NDArray[np.int32],
    depths: npt.NDArray[np.int32],
    logprobs: npt.NDArray[np.float64],
    budget: int,
    pad_token: int,
) -> TreeTuple: ...
def walk(
    tokens: npt.NDArray[np.int64],
    first_child: npt.NDArray[np.int32],
    next_sibling: npt.NDArray[np.int32],
    chosen: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int32], int]: ...
def walk_batch(
    trees: list[
        tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int32]]
    ],
    chosen: npt.NDArray[np.int64],
) -> list[tuple[npt.NDArray[np.int32], int]]: ...

# ---- kv -----------------------------------------------------------------------------------

# ---- grammar ------------------------------------------------------------------------------
