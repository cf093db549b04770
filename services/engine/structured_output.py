"""Structured outputs: a grammar per request constrains which tokens it may draw (llguidance).

Each step, every request with a grammar gets a token mask from its matcher; disallowed tokens'
logits become -inf before logprobs, the logits processors and sampling (vLLM applies its
grammar bitmask at the same point). The masks are filled on a worker thread while the model's
forward pass runs (llguidance releases the GIL), so the step waits only for what outlasts it.
After a token is drawn the matcher consumes it; a request whose grammar can take nothing more
finishes there as "stop", so output that ends by stop or EOS is always complete.

Grammar kinds, as vLLM names them: ``json`` (a JSON Schema), ``regex``, ``choice`` (one of a
list of strings) and ``grammar`` (Lark, or GBNF converted to Lark). A JSON Schema's open objects
are closed first, as vLLM's default engine reads them (json_schema_defaults.py). A grammar that
does not compile rejects its request at admission with llguidance's message.
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import llguidance.hf
import numpy as np
import torch
from llguidance.gbnf_to_lark import gbnf_to_lark

# Not llguidance.torch: it imports torch's compiler when loaded (docs/benchmarks.md, "A stack's start").
from llguidance.numpy import fill_next_token_bitmask

from services.engine.json_schema_defaults import closed_objects
from services.engine.sampling_params import StructuredOutput


class GrammarError(ValueError):
    """The request's grammar does not compile, or does not fit the model's vocabulary."""


def compile_grammar(structured: StructuredOutput, tokenizer: llguidance.LLTokenizer) -> str:
    """llguidance's grammar text for the constraint, checked against ``tokenizer``."""
    if structured.kind == "json":
        schema = closed_objects(json.loads(structured.spec))
        if structured.compact_whitespace and isinstance(schema, dict):
            schema = {**schema, "x-guidance": {**schema.get("x-guidance", {}), "whitespace_flexible": False}}
        return _checked(llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema)), tokenizer)
    if structured.kind == "regex":
        return _checked(llguidance.LLMatcher.grammar_from_regex(structured.spec), tokenizer)
    if structured.kind == "choice":
        choices = json.loads(structured.spec)
        return _checked("start: " + " | ".join(json.dumps(c) for c in choices), tokenizer)
    try:
        return _checked(structured.spec, tokenizer)
    except GrammarError as lark_error:
        try:  # GBNF, as xgrammar and llama.cpp take it
            return _checked(gbnf_to_lark(structured.spec), tokenizer)
        except Exception:
            raise lark_error from None


def _checked(grammar: str, tokenizer: llguidance.LLTokenizer) -> str:
    error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
    if error:
        raise GrammarError(error)
    return grammar


class Grammars:
    """The matchers of the requests that have a grammar, keyed by request id."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_token_ids = list(eos_token_ids)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None  # built on first use: ~2 s for a 150k vocabulary
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        self._executor: ThreadPoolExecutor | None = None

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._matchers

    def add(self, request_id: str, structured: StructuredOutput, output_token_ids: list[int]) -> None:
        """A matcher for the request, advanced past the tokens it already has (a decode node
        takes a request after its first token, a migration after more)."""
        tokenizer = self._tokenizer()
        try:
            grammar = compile_grammar(structured, tokenizer)
        except ValueError as exc:  # GrammarError and json.JSONDecodeError among them
            raise GrammarError(f"invalid {structured.kind} constraint: {exc}") from None
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        for token in output_token_ids:
            if not matcher.consume_token(token):
                raise GrammarError(f"the output so far does not follow the {structured.kind} constraint")
        self._matchers[request_id] = matcher

    def forget(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def start_masks(self, request_ids: list[str]) -> Future[dict[str, torch.Tensor]] | None:
        """Allowed-token masks ([vocab] bool) for these requests, filled on the worker thread."""
        wanted = [r for r in request_ids if r in self._matchers]
        if not wanted:
            return None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")
        return self._executor.submit(self._masks, [(r, self._matchers[r]) for r in wanted])

    def _masks(self, matchers: list[tuple[str, llguidance.LLMatcher]]) -> dict[str, torch.Tensor]:
        words = (self._tokenizer().vocab_size + 31) // 32
        out = {}
        for request_id, matcher in matchers:
            bits = np.zeros((1, words), dtype=np.int32)
            fill_next_token_bitmask(matcher, bits, 0)
            allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[: self._vocab_size].astype(bool)
            if allowed.shape[0] < self._vocab_size:  # model rows past the tokenizer's vocabulary stay banned
                allowed = np.pad(allowed, (0, self._vocab_size - allowed.shape[0]))
            out[request_id] = torch.from_numpy(allowed)
        return out

    def accept(self, request_id: str, token_id: int) -> bool:
        """Advance the request's matcher; True when its grammar can take nothing more."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return False
        matcher.consume_token(token_id)
        return matcher.is_stopped()

    def _tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:
            self._ll_tokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer, n_vocab=self._vocab_size, eos_token=self._eos_token_ids or None
            )
        return self._ll_tokenizer

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
