"""SuffixProposer in vLLM: greedy output token for token the same as vLLM without
speculation (a batch, one request at a time, a second pass drafting from the corpus, an
aborted request, preempted requests), and the proposer's requests freed as they finish."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_support import chat_prompts, close, make_llm, metric, runner_of, suffix_config

MAX_TOKENS = 128


def greedy(max_tokens: int = MAX_TOKENS) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def token_ids(outputs: list[Any]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def suffix(model_dir: Path) -> Iterator[Any]:
    llm = make_llm(model_dir, speculative_config=suffix_config())
    yield llm
    close(llm)


@pytest.fixture(scope="module")
def expected(plain: Any, demo_messages: list[str]) -> list[list[int]]:
    return token_ids(plain.generate(chat_prompts(plain, demo_messages), greedy()))


def test_batch_output_equals_vllm_without_speculation(
    suffix: Any, demo_messages: list[str], expected: list[list[int]]
) -> None:
    prompts = chat_prompts(suffix, demo_messages)
    drafted = metric(suffix, "vllm:spec_decode_num_draft_tokens")
    accepted = metric(suffix, "vllm:spec_decode_num_accepted_tokens")
    assert token_ids(suffix.generate(prompts, greedy())) == expected
    first_pass = metric(suffix, "vllm:spec_decode_num_accepted_tokens") - accepted
    assert metric(suffix, "vllm:spec_decode_num_draft_tokens") > drafted
    assert first_pass > 0
    # Again: the finished outputs are in the corpus now, so whole answers are drafted.
    assert token_ids(suffix.generate(prompts, greedy())) == expected
    second_pass = metric(suffix, "vllm:spec_decode_num_accepted_tokens") - accepted - first_pass
    assert second_pass > first_pass


def test_one_request_at_a_time(suffix: Any, plain: Any, demo_messages: list[str]) -> None:
    for prompt in chat_prompts(suffix, demo_messages[:3]):
        (want,) = token_ids(plain.generate([prompt], greedy(64)))
        (got,) = token_ids(suffix.generate([prompt], greedy(64)))
        assert got == want


def test_finished_requests_are_freed_and_join_the_corpus(
    suffix: Any, demo_messages: list[str]
) -> None:
    drafter = runner_of(suffix).drafter
    before = drafter.chains.drafter.num_corpus
    suffix.generate(chat_prompts(suffix, demo_messages[:4]), greedy(16))
    # The last request to finish is freed at the next step of any request.
    suffix.generate(chat_prompts(suffix, demo_messages[4:5]), greedy(16))
    assert drafter.chains.num_requests <= 1
    assert drafter.chains.drafter.num_corpus >= before + 4
    assert drafter.stats.requests > 0 and drafter.stats.seconds > 0


def test_an_aborted_request_leaves_the_others_unchanged(
    suffix: Any, plain: Any, demo_messages: list[str]
) -> None:
    prompts = chat_prompts(suffix, demo_messages[:3])
    want = token_ids(plain.generate(prompts, greedy()))
    engine = suffix.llm_engine
    ids = [f"abort-{i}" for i in range(len(prompts))]  # vLLM's outputs and aborts use these
    for rid, p in zip(ids, prompts, strict=True):
        engine.add_request(rid, p, greedy())
    done: dict[str, list[int]] = {}
    aborted = False
    while engine.has_unfinished_requests():
        for out in engine.step():
            if not aborted and out.request_id == ids[1] and len(out.outputs[0].token_ids) >= 8:
                engine.abort_request([ids[1]])
                aborted = True
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    assert aborted
    assert done[ids[0]] == want[0] and done[ids[2]] == want[2]
    suffix.generate(prompts[:1], greedy(4))
    assert runner_of(suffix).drafter.chains.num_requests <= 1


def test_preempted_requests_resume_with_the_same_output(
    model_dir: Path, plain: Any, demo_messages: list[str], expected: list[list[int]]
) -> None:
    # 24 blocks of 32 tokens for 8 requests of ~100-300 tokens: the scheduler preempts.
    llm = make_llm(
        model_dir,
        speculative_config=suffix_config(),
        num_gpu_blocks_override=24,
        block_size=32,
        max_model_len=512,
    )
    try:
        got = token_ids(llm.generate(chat_prompts(llm, demo_messages), greedy()))
        assert metric(llm, "vllm:num_preemptions") > 0
        assert got == expected
    finally:
        close(llm)
