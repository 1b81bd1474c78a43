"""The soak test's short CI version (the long one is ``make soak``): a few hundred steps of the
simulated serving loop in ``tests/soak.py``, with a pool small enough that requests are
preempted, then no leaked block or sequence and every completed request equal to its
reference."""

from __future__ import annotations

import pytest
import torch

from soak import MaskedGreedy, Soak, main

STEPS = 300


@pytest.mark.parametrize("seed", [0, 1])
def test_soak_short(seed: int) -> None:
    soak = Soak(seed, num_blocks=48, fork_rate=0.15)
    s = soak.run(STEPS)
    assert s.errors == []
    assert s.mismatches == 0
    assert s.blocks_leaked == 0 and s.sequences_leaked == 0
    m = soak.manager
    assert m.num_free_blocks() == m.num_blocks and not (m.refcounts() > 0).any()
    assert m.sequences() == []
    # Everything the soak is about happened.
    assert s.steps == STEPS and s.completed > 50
    assert s.preempted > 0 and s.forks > 0 and s.cancelled > 0
    assert s.prefix_hit_tokens > 0 and s.constrained_completed > 0
    assert s.batch_steps > 0 and s.single_steps > 0


def test_soak_catches_a_broken_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: verifying constrained requests without their grammar masks is caught
    (mismatches against the masked reference, tokens the matcher rejects)."""

    def unmasked(
        self: MaskedGreedy, logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return logits.argmax(dim=-1)

    monkeypatch.setattr(MaskedGreedy, "choose", unmasked)
    s = Soak(0, constrained_rate=0.5).run(120)
    assert s.mismatches > 0 and s.errors
    assert s.blocks_leaked == 0 and s.sequences_leaked == 0


def test_soak_main_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--steps", "40", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("soak seed=2: 40 steps")
    for row in ("| steps | 40 |", "| blocks leaked | 0 |", "| mismatches | 0 |"):
        assert row in out
