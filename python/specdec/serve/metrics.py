"""Prometheus metrics of one server, in a registry of its own (two servers in one process,
as in the tests, never share counters). Names follow vLLM's where one exists, under the
``specdec:`` prefix."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..decode.common import GenerationResult

__all__ = ["ServerMetrics"]

_LATENCY = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)


class ServerMetrics:
    """Counters, gauges and histograms of requests, tokens, speculation and the KV pool."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "specdec:http_requests",
            "HTTP requests by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.finished_requests = Counter(
            "specdec:request_success",
            "Generation requests ended, by finish reason",
            ["finish_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter("specdec:prompt_tokens", "Prompt tokens", registry=r)
        self.cached_prompt_tokens = Counter(
            "specdec:prefix_cache_hit_tokens",
            "Prompt tokens whose K/V came from the prefix cache",
            registry=r,
        )
        self.generation_tokens = Counter(
            "specdec:generation_tokens", "Generated tokens", registry=r
        )
        self.drafted_tokens = Counter(
            "specdec:spec_decode_num_draft_tokens", "Drafted tree nodes verified", registry=r
        )
        self.accepted_tokens = Counter(
            "specdec:spec_decode_num_accepted_tokens", "Drafted tokens accepted", registry=r
        )
        self.grammar_tokens = Counter(
            "specdec:grammar_drafted_tokens",
            "Accepted tokens drafted by a request's grammar (forced tokens, grammar branches)",
            registry=r,
        )
        self.steps = Counter("specdec:engine_steps", "Engine steps (target forwards)", registry=r)
        self.running = Gauge("specdec:num_requests_running", "Requests in the batch", registry=r)
        self.waiting = Gauge("specdec:num_requests_waiting", "Requests queued", registry=r)
        self.kv_used = Gauge("specdec:kv_blocks_used", "KV blocks held by requests", registry=r)
        self.kv_total = Gauge("specdec:kv_blocks_total", "KV blocks in the pool", registry=r)
        self.ttft = Histogram(
            "specdec:time_to_first_token_seconds",
            "Submit to first streamed token",
            buckets=_LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            "specdec:inter_token_latency_seconds",
            "Time per output token between streamed chunks",
            buckets=_LATENCY,
            registry=r,
        )
        self.e2e = Histogram(
            "specdec:e2e_request_latency_seconds",
            "Submit to last token",
            buckets=_LATENCY,
            registry=r,
        )
        self.step_seconds = Histogram(
            "specdec:engine_step_seconds", "One engine step", buckets=_LATENCY, registry=r
        )

    def http(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def step(self, seconds: float, running: int) -> None:
        self.steps.inc()
        self.step_seconds.observe(seconds)
        self.running.set(running)

    def queued(self, waiting: int) -> None:
        self.waiting.set(waiting)

    def kv(self, usage: Any) -> None:
        self.kv_used.set(usage.used)
        self.kv_total.set(usage.total)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def inter_token(self, seconds: float, tokens: int) -> None:
        # A chunk of several tokens (a speculative step) spreads its gap over them.
        for _ in range(tokens):
            self.itl.observe(seconds / tokens)

    def finished(self, result: GenerationResult, seconds: float) -> None:
        self.finished_requests.labels(finish_reason=result.finish_reason or "error").inc()
        self.prompt_tokens.inc(result.prompt_len)
        self.cached_prompt_tokens.inc(result.prefix_hit)
        self.generation_tokens.inc(len(result.tokens))
        self.drafted_tokens.inc(sum(result.tree_sizes))
        self.accepted_tokens.inc(sum(result.accepted))
        self.grammar_tokens.inc(result.grammar_tokens)
        self.e2e.observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        out: bytes = generate_latest(self.registry)
        return out
