"""JSON-Schema-Test-Suite (draft 2020-12, copied into tests/data with its LICENSE and
SOURCE_COMMIT) as a ratchet on the JSON Schema compiler, over the Tekken vocabulary.

Each instance is written as compact JSON (``json.dumps(..., separators=(",", ":"))``) and
tokenized with the Tekken tokenizer of ``mistral_common`` (the tokenizer a model would use,
not a byte-greedy walk of the vocabulary); the matcher must accept a valid instance token by
token and end accepting, and reject an invalid one at some token or at EOS. The suite's own
``valid`` flags are the oracle. Schemas compile with the defaults (``strict=True``: what
cannot be exact is refused), ``format`` read as the suite reads it: an annotation, except
under ``optional/format/`` where it asserts. Each instance is recorded as ``pass``,
``refused`` (the schema raised GrammarError at compile time), ``false_positive`` (invalid,
accepted) or ``false_negative`` (valid, rejected); a case (one schema) passes when all its
instances do.

The record is tests/data/json_schema_ratchet.json: per case its status and its false
positives and negatives, and the totals. The test fails when the pass count drops, when a
recorded passing case stops passing, or when false positives or false negatives rise, per
case or in total. After an improvement, rewrite it with
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


def run_suite() -> tuple[dict[str, dict[str, Any]], Counter[str]]:
    """Every case's status and false positives/negatives, and the instance outcomes counted
    by kind (``optional/`` files counted under ``optional:`` keys)."""
    vocab = Vocabulary.from_tekken()
    tok = _tokenizer()
    cases: dict[str, dict[str, Any]] = {}
    counts: Counter[str] = Counter()
    for path in sorted(SUITE.rglob("*.json")):
        rel = path.relative_to(SUITE).as_posix()
        group = "optional:" if rel.startswith("optional/") else ""
        assertion = rel.startswith("optional/format/")
        for i, case in enumerate(json.loads(path.read_text())):
            name = f"{rel}#{i} {case['description']}"
            try:
                g = CfgGrammar.from_json_schema(vocab, case["schema"], format_assertion=assertion)
            except GrammarError:
                cases[name] = {"status": "refused", "fp": 0, "fn": 0}
                counts[group + "refused"] += len(case["tests"])
                continue
            ok, fp, fn = True, 0, 0
            for t in case["tests"]:
                text = json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False)
                m = g.matcher()
                ids = tok.encode(text, bos=False, eos=False)
                accepted = m.accept_tokens(ids) == len(ids) and m.is_accepting()
                if accepted == t["valid"]:
                    counts[group + "pass"] += 1
                else:
                    ok = False
                    fn += t["valid"]
                    fp += not t["valid"]
                    counts[group + ("false_negative" if t["valid"] else "false_positive")] += 1
            cases[name] = {"status": "pass" if ok else "fail", "fp": fp, "fn": fn}
    return cases, counts


def _summary(cases: dict[str, dict[str, Any]], counts: Counter[str]) -> dict[str, Any]:
    return {
        "cases": dict(Counter(c["status"] for c in cases.values())),
        "instances": dict(sorted(counts.items())),
    }


def test_json_schema_test_suite_ratchet() -> None:
    record = json.loads(RECORD.read_text())
    cases, counts = run_suite()
    assert set(cases) == set(record["cases"]), "the suite changed: rerun with --update"
    old = record["cases"]
    lost = [c for c, r in old.items() if r["status"] == "pass" and cases[c]["status"] != "pass"]
    assert not lost, f"cases that passed no longer do: {lost}"
    for kind in ("fp", "fn"):
        rose = {c: (old[c][kind], r[kind]) for c, r in cases.items() if r[kind] > old[c][kind]}
        assert not rose, f"{kind} rose in: {rose}"
    recorded = record["summary"]["instances"]
    for key in ("pass", "optional:pass"):
        assert counts[key] >= recorded.get(key, 0), key
    for key in (
        "false_positive",
        "false_negative",
        "optional:false_positive",
        "optional:false_negative",
    ):
        assert counts[key] <= recorded.get(key, 0), key


if __name__ == "__main__":
    cases, counts = run_suite()
    summary = _summary(cases, counts)
    print(json.dumps(summary, indent=1))
    if "--update" in sys.argv:
        RECORD.write_text(json.dumps({"summary": summary, "cases": cases}, indent=1) + "\n")
