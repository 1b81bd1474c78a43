"""The suffix drafter as a long-running server sees it: many requests, each added, drafted for
step by step and removed with its output remembered (``remember_outputs=True``) under a small
corpus bound. Shows that the shared corpus stays within its bound however many requests
pass, and that a proposal costs the same per request at the end as at the start (nothing is
copied per request, and the corpus stops growing).

Workload: four tenants (cache salts), each with its own pool of documents; a request of a
tenant asks to continue a stretch of one of its documents (its output: the next tokens, a
tenth of them changed at random), so later requests find earlier outputs in the corpus.
Eight requests are in flight; each step drafts for all of them in one call and accepts, per
request, the drafted path that matches its output (then one more token, as a verifier
would). Every 1000 requests it prints the corpus (tokens and sequences held, partitions)
and, over those requests' steps, the median propose time per request and the mean tokens
per step; then the largest corpus seen against the bound.

Run: ``python benches/bench_suffix_corpus.py`` (10^4 requests, bound 16384 tokens);
``--requests``, ``--bound``, ``--every``; ``--smoke``: 200 requests (a test that the script
works, not a measurement).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from specdec.draft import SuffixDrafter
from specdec.protocols import DraftRequest
from specdec.tree import DraftTree

VOCAB = 2000
TENANTS = [b"tenant-0", b"tenant-1", b"tenant-2", b"tenant-3"]


def accepted(tree: DraftTree, truth: list[int]) -> int:
    """How many of ``truth``'s first tokens the tree drafted along one path."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    node, n = 0, 0
    while n < len(truth):
        child = next(
            (i for i in range(1, len(tokens)) if parents[i] == node and tokens[i] == truth[n]),
            None,
        )
        if child is None:
            break
        node, n = child, n + 1
    return n


def run(args: argparse.Namespace) -> None:
    rng = random.Random(0)
    docs = {
        t: [[rng.randrange(VOCAB) for _ in range(args.doc_len)] for _ in range(args.docs)]
        for t in TENANTS
    }
    d = SuffixDrafter(max_depth=16, remember_outputs=True, corpus_tokens=args.bound)

    def new_request(rid: int) -> tuple[list[int], list[int], bytes]:
        salt = rng.choice(TENANTS)
        doc = rng.choice(docs[salt])
        at = rng.randrange(len(doc) - args.prompt_copy - args.output)
        prompt = [rng.randrange(VOCAB) for _ in range(32)] + doc[at : at + args.prompt_copy]
        cont = doc[at + args.prompt_copy : at + args.prompt_copy + args.output]
        truth = [t if rng.random() >= 0.1 else rng.randrange(VOCAB) for t in cont]
        d.add_request(rid, prompt, cache_salt=salt)
        return prompt, truth, salt

    live: dict[int, tuple[list[int], list[int], int]] = {}  # id -> (context, truth, produced)
    next_id, done, largest = 0, 0, 0
    window_us: list[float] = []
    window_tokens: list[int] = []
    medians: list[float] = []
    print(f"{args.requests} requests, corpus bound {args.bound} tokens, 8 in flight")
    print()
    print(
        "| requests done | corpus tokens | largest so far | sequences | partitions "
        "| median propose (us/request) | tokens/step |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    while done < args.requests:
        while len(live) < 8 and next_id < args.requests:
            prompt, truth, _ = new_request(next_id)
            live[next_id] = (prompt, truth, 0)
            next_id += 1
        ids = sorted(live)
        reqs = [DraftRequest(live[r][0], request_id=r) for r in ids]
        t0 = time.perf_counter()
        trees = d.propose(reqs, args.budget)
        window_us.append((time.perf_counter() - t0) / len(ids) * 1e6)
        for rid, tree in zip(ids, trees, strict=True):
            ctx, truth, produced = live[rid]
            step = accepted(tree, truth[produced:]) + 1
            window_tokens.append(min(step, len(truth) - produced))
            produced += step
            if produced < len(truth):
                live[rid] = (ctx + truth[produced - step : produced], truth, produced)
                continue
            del live[rid]
            d.remove_request(rid, output=truth)
            largest = max(largest, d.num_corpus_tokens)
            done += 1
            if done % args.every == 0:
                med = statistics.median(window_us)
                medians.append(med)
                print(
                    f"| {done} | {d.num_corpus_tokens} | {largest} | {d.num_corpus} "
                    f"| {d.corpus.num_partitions} | {med:.1f} "
                    f"| {statistics.fmean(window_tokens):.2f} |"
                )
                window_us, window_tokens = [], []
    print()
    verdict = "under" if largest <= args.bound else "OVER"
    print(f"largest corpus: {largest} tokens, {verdict} the bound of {args.bound}")
    print(f"requests held at the end: {d.num_requests}")
    if medians:
        print(
            f"median propose per request: {medians[0]:.1f} us over the first {args.every} "
            f"requests, {medians[-1]:.1f} us over the last {args.every}"
        )
    if largest > args.bound or d.num_requests:
        raise SystemExit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--bound", type=int, default=16_384, help="corpus_tokens")
    ap.add_argument("--every", type=int, default=1000, help="print a row every N requests")
    ap.add_argument("--docs", type=int, default=4, help="documents per tenant")
    ap.add_argument("--doc-len", type=int, default=200, help="tokens per document")
    ap.add_argument("--prompt-copy", type=int, default=16, help="document tokens in a prompt")
    ap.add_argument("--output", type=int, default=48, help="tokens per output")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.requests, args.every, args.bound = 200, 50, 2048
    run(args)


if __name__ == "__main__":
    main()
