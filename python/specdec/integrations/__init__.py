"""Adapters that put specdec's drafters and grammars into other inference engines:
:mod:`.vllm` (a suffix proposer and a grammar logits processor for vLLM, the ``vllm`` extra)
and :mod:`.transformers` (a grammar logits processor for ``model.generate``), both over
:mod:`.grammars` (per-request grammar specs and tokenizer vocabularies). Nothing here is
imported by ``import specdec``, and no module imports its engine until it is used."""
