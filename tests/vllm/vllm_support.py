"""What the tests of tests/vllm/ share: engines made and closed, the proposer's and the
processors' runner, vLLM's counters, chat prompts."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

MAX_MODEL_LEN = 1024
PROPOSER = "specdec.integrations.vllm.SuffixProposer"


def make_llm(model: Path, **kwargs: Any) -> Any:
    """A greedy-friendly SmolLM2 engine: float32 (the exported weights), eager, 8 slots."""
    from vllm import LLM

    args: dict[str, Any] = {
        "dtype": "float32",
        "enforce_eager": True,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": 8,
        "seed": 0,
        "disable_log_stats": False,
    }
    args.update(kwargs)
    return LLM(model=str(model), **args)


def close(llm: Any) -> None:
    """Shut the engine down now (its KV cache and weights are freed before the next one)."""
    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()


def suffix_config(k: int = 8) -> dict[str, Any]:
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}


def runner_of(llm: Any) -> Any:
    """The model runner of an in-process engine (the proposer and the processors live in
    it)."""
    return llm.collective_rpc(lambda worker: worker.model_runner)[0]


def metric(llm: Any, name: str) -> float:
    """A counter from vLLM's own metrics (0 when it was never incremented)."""
    total = 0.0
    for m in llm.get_metrics():
        if m.name == name:
            total += float(getattr(m, "value", 0) or 0)
    return total


def chat_prompts(llm: Any, messages: list[str]) -> list[str]:
    tok = llm.get_tokenizer()
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": m}], tokenize=False, add_generation_prompt=True
        )
        for m in messages
    ]
