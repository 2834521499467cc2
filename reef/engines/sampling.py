"""Per-request sampling: parameters read from an OpenAI body, and choosing the next token of each row."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from reef.engines.base import CAPTURE_TOPK
from reef.errors import BadRequest

MAX_TOP_LOGPROBS = 20  # OpenAI's limit
# Below this temperature sampling is greedy (as vLLM's): dividing the logits by a temperature
# near zero overflows them, and the distribution it approaches is the argmax anyway.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens. `max_tokens` is None until the prompt length is known."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> SamplingParams:
        """Read an OpenAI chat-completions body (the model's defaults already filled in, see
        `with_defaults`); BadRequest for what this engine cannot serve."""
        n = body.get("n")
        if n is not None and n != 1:
            raise BadRequest(
                "the embedded engine serves n=1 only", code="unsupported_value", param="n"
            )

        temperature = _number(body, "temperature", 1.0)
        if not 0 <= temperature <= 2:
            raise BadRequest("temperature must be between 0 and 2", param="temperature")
        top_p = _number(body, "top_p", 1.0)
        if not 0 < top_p <= 1:
            raise BadRequest("top_p must be in (0, 1]", param="top_p")

        max_tokens = body.get("max_completion_tokens")
        param = "max_completion_tokens"
        if max_tokens is None:
            max_tokens, param = body.get("max_tokens"), "max_tokens"
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise BadRequest(f"{param} must be a positive integer", param=param)

        stop = body.get("stop")
        if stop is None:
            stops: tuple[str, ...] = ()
        elif isinstance(stop, str):
            stops = (stop,)
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            stops = tuple(stop)
        else:
            raise BadRequest("stop must be a string or a list of strings", param="stop")
        stops = tuple(s for s in stops if s)  # an empty stop string would match everywhere

        seed = body.get("seed")
        if seed is not None and not isinstance(seed, int):
            raise BadRequest("seed must be an integer", param="seed")

        top_logprobs = body.get("top_logprobs") or 0
        if not isinstance(top_logprobs, int) or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise BadRequest(
                f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}",
                param="top_logprobs",
            )
        logprobs = bool(body.get("logprobs"))
        if top_logprobs and not logprobs:
            raise BadRequest("top_logprobs requires logprobs to be true", param="top_logprobs")

        return cls(
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            stop=stops,
            seed=seed,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
        )

    def generator(self) -> torch.Generator:
        """The request's own random stream: seeded requests repeat whatever else is batched."""
        gen = torch.Generator()
        if self.seed is not None:
            gen.manual_seed(self.seed % 2**64)  # OpenAI seeds may be negative
        else:
            gen.seed()
        return gen


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise BadRequest(f"{key} must be a number", param=key)
    return float(value)


@dataclass(frozen=True)
class Sampled:
    """The token chosen for one row, its log-prob under the raw model, and the top alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    # The top CAPTURE_TOPK (ids, log-probs), recorded for every token (Record.topk).
    capture: tuple[list[int], list[float]] | None = None


def sample_rows(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    allowed: list[torch.Tensor | None] | None = None,
) -> list[Sampled]:
    """Choose one token per row of `logits` [rows, vocab]; a row with an `allowed` mask (a
    structured output, reef.engines.grammar) draws only among the tokens it lets through.

    Log-probs always come from the unmodified distribution (log_softmax of the raw logits, no
    temperature, no top-p, no mask), as vLLM reports them: that is what a learning recipe
    compares against its own policy. Temperature, top-p and the mask only shape which token is
    drawn.
    """
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    drawn_from = (
        _masked(logits, allowed) if allowed and any(m is not None for m in allowed) else logits
    )
    # Greedy rows in one argmax over the batch; sampled rows one by one (each its own stream).
    chosen: list[int] = drawn_from.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if p.temperature < GREEDY_BELOW:
            continue
        probs = torch.softmax(drawn_from[i] / p.temperature, dim=-1)
        if p.top_p < 1:
            probs = _top_p(probs, p.top_p)
        chosen[i] = int(torch.multinomial(probs, 1, generator=generators[i]))

    index = torch.tensor(chosen).unsqueeze(1)
    picked = raw_logprobs.gather(1, index).squeeze(1).tolist()
    # Always at least CAPTURE_TOPK: the record keeps the top-K capture of every token.
    k = max(max((p.top_logprobs for p in params), default=0), CAPTURE_TOPK)
    top = raw_logprobs.topk(min(k, raw_logprobs.shape[-1]), dim=-1)
    top_values, top_ids = top.values.tolist(), top.indices.tolist()
    out = []
    for i, p in enumerate(params):
        alternatives: list[tuple[int, float]] = []
        if p.top_logprobs and top_ids is not None and top_values is not None:
            k_i = p.top_logprobs
            alternatives = list(zip(top_ids[i][:k_i], top_values[i][:k_i], strict=True))
        capture = (top_ids[i][:CAPTURE_TOPK], top_values[i][:CAPTURE_TOPK])
        out.append(Sampled(chosen[i], picked[i], alternatives, capture))
    return out


def _masked(logits: torch.Tensor, allowed: list[torch.Tensor | None]) -> torch.Tensor:
    """A copy of `logits` with each masked row's forbidden tokens at -inf."""
    out = logits.clone()
    for i, mask in enumerate(allowed):
        if mask is not None:
            out[i].masked_fill_(~mask, float("-inf"))
    return out


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (always the first)."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(0) - sorted_probs
    sorted_probs[mass_before >= top_p] = 0
    return torch.zeros_like(probs).scatter(0, order, sorted_probs)
