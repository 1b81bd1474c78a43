"""The short CI version of ``make fuzz``: every entry point, a few hundred random inputs each;
no crash (only SpecdecError refusals), no hang, no refusal that changes state."""

from __future__ import annotations

import pytest

from fuzz import ENTRY_POINTS, run_entry_point


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_fuzz_entry_point(name: str) -> None:
    tally = run_entry_point(name, examples=150, seed=0)
    assert tally.inputs >= 150
    assert not tally.crashes, tally.crashes
    assert tally.hangs == 0
    assert tally.refused > 0 or name == "walk / walk_batch"  # bad inputs were generated
