"""The short CI version of ``make fuzz``: every entry point, a few hundred random inputs each
(hypothesis examples and variants of them); no crash (only SpecdecError refusals), no hang,
no refusal that changes state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fuzz import ENTRY_POINTS, Mutator, Tally, fan, fingerprint, run_entry_point


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_fuzz_entry_point(name: str) -> None:
    tally = run_entry_point(name, examples=60, seed=0, variants=8)
    assert tally.examples == 60 and tally.inputs >= 100
    assert not tally.crashes, tally.crashes
    assert tally.crash_count == 0 and tally.hangs == 0
    assert tally.accepted + tally.refused == tally.inputs
    assert tally.refused > 0 or name == "walk / walk_batch"  # bad inputs were generated


def test_variants_are_distinct_inputs() -> None:
    # Each call of a fan is a different input, so "calls" counts inputs, not repeats.
    base = [np.arange(6, dtype=np.float32).reshape(2, 3), 4, None, torch.zeros(2), "a+b"]
    seen: list[object] = []
    fan(Tally(), 5.0, Mutator(1), base, lambda *a: seen.append(fingerprint(list(a))), 200)
    assert len(seen) == 200 and len(set(seen)) == 200
    assert seen[0] == fingerprint(base)  # the example itself comes first


def test_inputs_option_reaches_the_call_count() -> None:
    tally = run_entry_point("tree_from_branches", examples=5, seed=0, variants=16, inputs=500)
    assert tally.inputs >= 500 and tally.examples > 5
    assert tally.crash_count == 0 and tally.hangs == 0
