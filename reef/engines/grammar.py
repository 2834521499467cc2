"""Structured outputs for the embedded engine: `response_format` as a mask over each next token.

An OpenAI body may ask for `{"type": "json_object"}` (any JSON object) or `{"type":
"json_schema", "json_schema": {"name": …, "schema": {…}}}` (a value of that schema). The
embedded engine enforces either while it decodes: before each token is drawn, the tokens that
cannot continue a valid answer are masked out, so the answer parses and fits the schema
(unless `max_tokens` cuts it short: `finish_reason` is then `length`, as with OpenAI). The
matcher is llguidance's (the Rust library vLLM and llama.cpp also use); this module compiles
the format into its grammar once per distinct format, checks it against the schema, and keeps
one matcher per request.

What the record keeps is unchanged: the log-prob of each sampled token is still taken from the
model's raw distribution (vLLM reports the same), so a recipe compares its policy with the
model, not with the mask. The schema is enforced whatever `strict` says, as vLLM does: a
client that names a schema wants answers that fit it.

JSON is written compactly with the separators Python's `json.dumps` uses (`", "`, `": "`) and
no other whitespace: small models otherwise fill an answer with newlines the grammar allows.
A schema's own `x-guidance` options override these.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from reef.errors import BadRequest

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# How JSON is laid out; a schema's "x-guidance" key overrides (llguidance's JsonCompileOptions).
JSON_LAYOUT: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
GRAMMAR_CACHE = 64  # grammars known to compile, the most recently used kept
PARAM = "response_format"


def grammar_source(response_format: Any) -> str | None:
    """The llguidance grammar of an OpenAI `response_format`, or None for plain text.
    BadRequest for a format this engine does not know or a malformed one; whether the schema
    compiles is checked by `Grammars.constraint`."""
    from llguidance import LLMatcher

    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise BadRequest("response_format must be an object with a type", param=PARAM)
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest(
                "response_format.json_schema.schema must be a JSON schema object",
                param=PARAM,
            )
        try:
            return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        except ValueError as exc:
            raise BadRequest(f"response_format.json_schema.schema: {exc}", param=PARAM) from exc
    raise BadRequest(
        f"response_format.type {kind!r} is not supported: use text, json_object or json_schema",
        code="unsupported_value",
        param=PARAM,
    )


class Grammars:
    """The tokenizer as llguidance reads it (built on first use: about 0.3 s) and the formats
    compiled so far. Thread-safe: intake runs on the event loop and on worker threads."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Iterable[int]):
        self._hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos_ids = sorted(eos_ids)
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._compiled: OrderedDict[str, None] = OrderedDict()  # validated sources

    def constraint(self, response_format: Any) -> Constraint | None:
        """A fresh matcher for one request, or None when the format is plain text. Compiling a
        large schema can take a while: call from a worker thread."""
        source = grammar_source(response_format)
        if source is None:
            return None
        from llguidance import LLMatcher

        tokenizer = self._llg_tokenizer()
        self._check(source, tokenizer)
        return Constraint(LLMatcher(tokenizer, source, log_level=0), self.vocab_size)

    def _check(self, source: str, tokenizer: Any) -> None:
        from llguidance import LLMatcher

        with self._lock:
            if source in self._compiled:
                self._compiled.move_to_end(source)
                return
        error = LLMatcher.validate_grammar(source, tokenizer)
        if error:
            raise BadRequest(f"response_format cannot be enforced: {error}", param=PARAM)
        with self._lock:
            self._compiled[source] = None
            while len(self._compiled) > GRAMMAR_CACHE:
                self._compiled.popitem(last=False)

    def _llg_tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                from llguidance.hf import from_tokenizer

                self._tokenizer = from_tokenizer(
                    self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=self._eos_ids
                )
            return self._tokenizer


class Constraint:
    """One request's matcher: which tokens may come next, and the tokens taken so far.
    Used by the scheduler thread only, once the request is submitted."""

    def __init__(self, matcher: Any, vocab_size: int):
        self._matcher = matcher
        self._vocab = vocab_size

    def allowed(self) -> torch.Tensor:
        """A boolean mask over the vocabulary: True where the token may come next."""
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        return torch.from_numpy(np.unpackbits(bits, bitorder="little")[: self._vocab].view(bool))

    def accept(self, token_id: int) -> None:
        """Advance past a drawn token (always one `allowed` let through)."""
        self._matcher.consume_token(token_id)

    @property
    def complete(self) -> bool:
        """The answer is a whole value and nothing may follow it."""
        return bool(self._matcher.is_stopped())

    @property
    def error(self) -> str | None:
        return str(self._matcher.get_error()) if self._matcher.is_error() else None
