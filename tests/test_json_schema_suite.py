"""JSON-Schema-Test-Suite (draft 2020-12, copied into tests/data with its LICENSE and
SOURCE_COMMIT) as a ratchet on the JSON Schema compiler, over the Tekken vocabulary.

Each instance is written as compact JSON (``json.dumps(..., separators=(",", ":"))``) and
tokenized with the Tekken tokenizer of ``mistral_common`` (the tokenizer a model would use,
not a byte-greedy walk of the vocabulary); the matcher must accept a valid instance token by
token and end accepting, and reject an invalid one at some token or at EOS. The suite's own
``valid`` flags are the oracle. Each instance is recorded as ``pass``, ``refused`` (the
schema raised GrammarError at compile time), ``false_positive`` (invalid, accepted) or
``false_negative`` (valid, rejected); a case (one schema) passes when all its instances do.

The record is tests/data/json_schema_ratchet.json; the test fails when the pass count drops
below it or when a recorded passing case stops passing. After an improvement, rewrite it with
``python tests/test_json_schema_suite.py --update``."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from specdec import Vocabulary
from specdec.constrain.grammar import CfgGrammar
from specdec.errors import GrammarError

SUITE = Path(__file__).parent / "data" / "json-schema-test-suite" / "draft2020-12"
RECORD = Path(__file__).parent / "data" / "json_schema_ratchet.json"


def _tokenizer() -> Any:
    import mistral_common
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    path = os.path.join(os.path.dirname(mistral_common.__file__), "data", "tekken_240911.json")
    return Tekkenizer.from_file(path)


def run_suite() -> tuple[dict[str, str], Counter[str]]:
    """Every case's status, and the instance outcomes counted by kind (``optional/`` files
    counted under ``optional:`` keys)."""
    vocab = Vocabulary.from_tekken()
    tok = _tokenizer()
    cases: dict[str, str] = {}
    counts: Counter[str] = Counter()
    for path in sorted(SUITE.rglob("*.json")):
        rel = path.relative_to(SUITE).as_posix()
        group = "optional:" if rel.startswith("optional/") else ""
        for i, case in enumerate(json.loads(path.read_text())):
            name = f"{rel}#{i} {case['description']}"
            try:
                g = CfgGrammar.from_json_schema(vocab, case["schema"])
            except GrammarError:
                cases[name] = "refused"
                counts[group + "refused"] += len(case["tests"])
                continue
            ok = True
            for t in case["tests"]:
                text = json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False)
                m = g.matcher()
                ids = tok.encode(text, bos=False, eos=False)
                accepted = m.accept_tokens(ids) == len(ids) and m.is_accepting()
                if accepted == t["valid"]:
                    counts[group + "pass"] += 1
                else:
                    ok = False
                    counts[group + ("false_negative" if t["valid"] else "false_positive")] += 1
            cases[name] = "pass" if ok else "fail"
    return cases, counts


def _summary(cases: dict[str, str], counts: Counter[str]) -> dict[str, Any]:
    return {
        "cases": dict(Counter(cases.values())),
        "instances": dict(sorted(counts.items())),
    }


def test_json_schema_test_suite_ratchet() -> None:
    record = json.loads(RECORD.read_text())
    cases, counts = run_suite()
    assert set(cases) == set(record["cases"]), "the suite changed: rerun with --update"
    lost = [c for c, s in record["cases"].items() if s == "pass" and cases[c] != "pass"]
    assert not lost, f"cases that passed no longer do: {lost}"
    assert counts["pass"] >= record["summary"]["instances"]["pass"]
    assert counts["optional:pass"] >= record["summary"]["instances"].get("optional:pass", 0)


if __name__ == "__main__":
    cases, counts = run_suite()
    summary = _summary(cases, counts)
    print(json.dumps(summary, indent=1))
    if "--update" in sys.argv:
        RECORD.write_text(json.dumps({"summary": summary, "cases": cases}, indent=1) + "\n")
