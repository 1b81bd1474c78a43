"""The ``specdec`` console script."""

from __future__ import annotations

import argparse
import platform
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="time the Rust builder beside the plain-Python version")
    b.add_argument("--quick", action="store_true", help="shorter timing loops")
    d = sub.add_parser(
        "demo",
        help="SmolLM2 speculative decoding beside transformers: tokens/s, same output",
        description="SmolLM2 speculative decoding beside transformers on the same weights: "
        "one prompt per kind through transformers AR and prompt lookup, specdec AR, the suffix "
        "drafter and the block+suffix drafters (adaptive budget); --full runs every prompt "
        "and engine. Exit status 1 if a greedy output differs from transformers'.",
    )
    d.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    d.add_argument(
        "--prompts", type=int, default=None, help="prompts per kind (default: 1; --full: all)"
    )
    d.add_argument(
        "--full",
        action="store_true",
        help="the whole sweep: every prompt, every drafter, chain, DDTree at --budgets and auto",
    )
    d.add_argument(
        "--budgets",
        default="4,8,16,32",
        help="DDTree budgets (--full), comma-separated; the adaptive budget's maximum is the "
        "largest",
    )
    d.add_argument("--threads", type=int, default=None, help="torch threads (both sides)")
    d.add_argument("--repeats", type=int, default=1, help="runs per engine; fastest counts")
    d.add_argument("--quick", action="store_true", help="48 tokens (with --full: and B=8)")
    d.add_argument(
        "--plain-linear",
        action="store_true",
        help="specdec's linear layers through plain F.linear (the BLAS), not the GGUF "
        "blocks or packed oneDNN",
    )
    d.add_argument("--plot", metavar="DIR", help="write PNG plots here")
    d.add_argument("--json", metavar="FILE", help="write every figure here")
    d.add_argument(
        "--json-schema",
        metavar="FILE",
        help="constrained generation instead: SmolLM2 writes JSON for this schema "
        "(specdec AR vs DDTree, masks on every tree node; same output, validated)",
    )
    s = sub.add_parser(
        "serve",
        help="an OpenAI-compatible server (/v1/chat/completions, /v1/completions) on the "
        "speculative generator",
    )
    s.add_argument("--model", help="a GGUF file (default: the packaged SmolLM2-135M-Instruct)")
    s.add_argument(
        "--served-model-name", help="the model name clients send (default: the file's stem)"
    )
    s.add_argument(
        "--drafter",
        default="suffix",
        choices=["suffix", "ngram", "block", "block+suffix", "none"],
        help="what drafts the trees (none: plain decoding)",
    )
    s.add_argument("--budget", default="auto", help="drafted nodes per tree, or auto")
    s.add_argument("--max-batch", type=int, default=8, help="most requests per step")
    s.add_argument("--kv-tokens", type=int, help="the paged KV pool, in tokens")
    s.add_argument(
        "--kv-cache-gib",
        type=float,
        default=1.0,
        help="without --kv-tokens: the paged KV pool's memory (what finished requests leave "
        "there stays in the prefix cache)",
    )
    s.add_argument("--threads", type=int, help="torch threads")
    s.add_argument(
        "--numeric",
        default="exact",
        choices=["exact", "int8"],
        help="the target's products: exact float32, or int8 activations (llama.cpp's class)",
    )
    s.add_argument(
        "--no-grammar-drafts",
        action="store_true",
        help="do not draft what a request's grammar forces (on by default)",
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", help="require 'Authorization: Bearer <key>' on /v1")
    s.add_argument(
        "--max-queue", type=int, default=64, help="waiting requests before 429 Too Many Requests"
    )
    s.add_argument(
        "--grace", type=float, default=30.0, help="seconds requests may finish after a signal"
    )
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(parser, args)
    if args.command == "demo" and args.json_schema:
        from .demo import run_json_schema_demo

        budgets = [8] if args.quick else [int(b) for b in args.budgets.split(",")]
        schema_runs = run_json_schema_demo(
            args.json_schema,
            tokens=args.tokens if args.tokens != 128 or args.quick else 256,
            budgets=budgets,
            threads=args.threads,
        )
        return 0 if all(r.identical and r.valid for r in schema_runs) else 1
    if args.command == "demo":
        from .demo import DEFAULT_ENGINES, run_demo

        quick = args.quick
        prompts = args.prompts if args.prompts is not None or args.full else 1
        runs = run_demo(
            tokens=48 if quick else args.tokens,
            prompts_per_kind=1 if quick else prompts,
            budgets=[8] if quick and args.full else [int(b) for b in args.budgets.split(",")],
            engines=None if args.full else DEFAULT_ENGINES,
            threads=args.threads,
            repeats=args.repeats,
            plot_dir=args.plot,
            json_path=args.json,
            packed_linear=not args.plain_linear,
        )
        return 0 if all(r.identical for r in runs) else 1
    if args.command == "bench":
        import numpy as np

        from . import __version__
        from .benchmarks import bench_tree

        print(
            f"specdec {__version__}, python {platform.python_version()}, numpy {np.__version__}, "
            f"{platform.machine()}"
        )
        print("DDTree build, L=16 depths, prefix_len=512 (median per call):\n")
        print(bench_tree(quick=args.quick))
    return 0


def _serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import os

    # OpenMP threads that spin between torch ops take the cores the engine's own kernels and
    # the HTTP thread need as soon as anything else runs (time to first token goes from
    # 0.2 s to 3-4 s under load); set before torch starts its pool.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        from .serve import EngineConfig, run_server
    except ImportError as e:
        parser.error(f"specdec serve needs the serve extra: pip install 'specdec[serve]' ({e})")
    budget: int | str = args.budget
    if budget != "auto":
        try:
            budget = int(budget)
        except ValueError:
            parser.error(f"--budget must be auto or a number, got {budget!r}")
    for name in ("max_batch", "kv_tokens", "threads", "max_queue"):
        v = getattr(args, name)
        if v is not None and v < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if isinstance(budget, int) and budget < 1:
        parser.error(f"--budget must be >= 1, got {budget}")
    if not 0 < args.kv_cache_gib < 2**20:
        parser.error(f"--kv-cache-gib must be above 0, got {args.kv_cache_gib}")
    config = EngineConfig(
        model=args.model,
        drafter=args.drafter,
        budget=budget,  # type: ignore[arg-type]
        max_batch=args.max_batch,
        kv_tokens=args.kv_tokens,
        kv_cache_gib=args.kv_cache_gib,
        threads=args.threads,
        max_queue=args.max_queue,
        served_name=args.served_model_name,
        numeric=args.numeric,
        grammar_drafts=not args.no_grammar_drafts,
    )
    return run_server(
        config,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        grace=args.grace,
        log_level=args.log_level,
    )


if __name__ == "__main__":
    sys.exit(main())
