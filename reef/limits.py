"""Bounds on the work one inference request may ask of the engine, checked before anything runs.

Reef forwards chat bodies with fields it does not know (an upstream may understand them), so
the caps here are what keeps one request from asking for unbounded work: how many tokens,
choices, stop strings, messages and tools, and which of vLLM's own extensions of the OpenAI
body (fields that change what vLLM computes: `ignore_eos`, `min_tokens`, `prompt_logprobs`,
`chat_template`, ...) may pass. Those are refused with a 400 naming the field unless
`engine.passthrough_extensions` lists them: dropping them silently would serve a request the
client did not ask for, and forwarding them would let any client change the work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reef.errors import BadRequest

if TYPE_CHECKING:
    from reef.settings import Settings

# vLLM's additions to the OpenAI chat-completions body: the fields of vLLM 0.32's
# ChatCompletionRequest (vllm/entrypoints/openai/chat_completion/protocol.py) that OpenAI's
# API does not have, plus the names earlier vLLM releases took (guided_*, best_of,
# logits_processors), which a vLLM upstream of another version may still honour. Not listed,
# because Reef itself understands them: `return_token_ids` (Reef answers it, and asks vLLM for
# the ids anyway) and `top_k` (a parameter of the Anthropic API that Reef's Messages route
# hands on).
VLLM_EXTENSIONS = frozenset(
    {
        "add_generation_prompt",
        "add_special_tokens",
        "allowed_token_ids",
        "bad_words",
        "best_of",
        "cache_salt",
        "chat_template",
        "chat_template_kwargs",
        "continue_final_message",
        "documents",
        "ec_transfer_params",
        "echo",
        "guided_choice",
        "guided_decoding_backend",
        "guided_grammar",
        "guided_json",
        "guided_regex",
        "guided_whitespace_pattern",
        "ignore_eos",
        "include_reasoning",
        "include_stop_str_in_output",
        "kv_transfer_params",
        "length_penalty",
        "logits_processors",
        "logprob_token_ids",
        "media_io_kwargs",
        "min_p",
        "min_tokens",
        "mm_payload",
        "mm_processor_kwargs",
        "priority",
        "prompt_logprobs",
        "repetition_detection",
        "repetition_penalty",
        "request_id",
        "return_mm_kwargs",
        "return_prompt_text",
        "return_token_offsets",
        "return_tokens_as_token_ids",
        "routed_experts_prompt_start",
        "session_id",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stop_token_ids",
        "stream_interval",
        "structured_outputs",
        "thinking_token_budget",
        "truncate_prompt_tokens",
        "truncation_side",
        "use_beam_search",
        "vllm_xargs",
        "watermarking",
    }
)


@dataclass(frozen=True)
class Limits:
    """The caps of one server (`server.*` and `engine.passthrough_extensions` settings)."""

    max_tokens: int = 4096
    n: int = 4
    stop: int = 4
    stop_chars: int = 256
    messages: int = 1024
    tools: int = 128
    passthrough: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        server = settings.server
        return cls(
            max_tokens=server.max_tokens_cap,
            n=server.max_n,
            stop=server.max_stop,
            stop_chars=server.max_stop_chars,
            messages=server.max_messages,
            tools=server.max_tools,
            passthrough=frozenset(settings.engine.passthrough_extensions),
        )

    def check_chat(self, body: dict[str, Any]) -> None:
        """An OpenAI chat-completions body as the client sent it (types already checked)."""
        # vLLM and Reef read max_completion_tokens first, another upstream may read max_tokens:
        # both are capped.
        for param in ("max_completion_tokens", "max_tokens"):
            self.check_max_tokens(body.get(param), param)
        n = body.get("n")
        if isinstance(n, int) and n > self.n:
            raise BadRequest(
                f"n is {n}, above this server's cap of {self.n} choices per request",
                code="n_too_large",
                param="n",
            )
        stop = body.get("stop")
        self._stops([stop] if isinstance(stop, str) else stop, "stop")
        self._count(body.get("messages"), self.messages, "messages")
        self._count(body.get("tools"), self.tools, "tools")
        for key, value in body.items():
            if key in VLLM_EXTENSIONS and key not in self.passthrough and value is not None:
                raise BadRequest(
                    f"'{key}' is a vLLM extension of the OpenAI API that this server does not "
                    "pass on; its operator can allow it with engine.passthrough_extensions",
                    code="unsupported_parameter",
                    param=key,
                )

    def check_messages(self, body: dict[str, Any]) -> None:
        """An Anthropic Messages body as the client sent it (types already checked)."""
        self.check_max_tokens(body.get("max_tokens"), "max_tokens")
        self._stops(body.get("stop_sequences"), "stop_sequences")
        self._count(body.get("messages"), self.messages, "messages")
        self._count(body.get("tools"), self.tools, "tools")

    def check_responses(self, body: dict[str, Any]) -> None:
        """An OpenAI Responses body as the client sent it (types already checked)."""
        self.check_max_tokens(body.get("max_output_tokens"), "max_output_tokens")
        items = body.get("input")
        self._count(items if isinstance(items, list) else None, self.messages, "input")
        self._count(body.get("tools"), self.tools, "tools")

    def check_max_tokens(self, max_tokens: Any, param: str = "max_tokens") -> None:
        if isinstance(max_tokens, int) and max_tokens > self.max_tokens:
            raise BadRequest(
                f"{param} is {max_tokens}, above this server's cap of {self.max_tokens}",
                code="max_tokens_too_large",
                param=param,
            )

    def _stops(self, stops: Any, param: str) -> None:
        if not isinstance(stops, list):
            return
        if len(stops) > self.stop:
            raise BadRequest(
                f"{param} has {len(stops)} strings, above this server's cap of {self.stop}",
                code="too_many_stop_sequences",
                param=param,
            )
        longest = max((len(s) for s in stops if isinstance(s, str)), default=0)
        if longest > self.stop_chars:
            raise BadRequest(
                f"{param} has a string of {longest} characters, above this server's cap of "
                f"{self.stop_chars}",
                code="stop_sequence_too_long",
                param=param,
            )

    @staticmethod
    def _count(items: Any, cap: int, param: str) -> None:
        if isinstance(items, list) and len(items) > cap:
            raise BadRequest(
                f"{param} has {len(items)} entries, above this server's cap of {cap}",
                code=f"too_many_{param}",
                param=param,
            )
