"""The embedded engine on the real tiny model: sampling, capture, streaming, batching, failure."""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reef.engines.base import Completion, Engine
from reef.errors import BadRequest, EngineError, EngineUnavailable
from reef.settings import EngineSettings
from tests.engines.conftest import running_engine

T = TypeVar("T")

QUESTIONS = [
    "What is the capital of France?",
    "hi",
    "Write a long poem about the sea and the wind.",
    "2+2=?",
    "Tell me a joke about numbers",
    "Name three colors.",
]


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def ask(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": question}], **extra}


def greedy(question: str, **extra: Any) -> dict[str, Any]:
    return ask(question, temperature=0, **extra)


async def collect(engine: Any, body: dict[str, Any]) -> tuple[list[dict[str, Any]], Completion]:
    chunks: list[dict[str, Any]] = []
    final = None
    async for item in engine.stream(body):
        if isinstance(item, Completion):
            final = item
        else:
            assert final is None, "chunks after the final Completion"
            chunks.append(item)
    assert final is not None
    return chunks, final


def content(c: Completion) -> str:
    return c.response["choices"][0]["message"]["content"]


def test_implements_the_engine_protocol(engine: Any) -> None:
    assert isinstance(engine, Engine)
    assert engine.kind == "embedded"
    assert engine.models() == ["tiny"]
    assert run(engine.ready())


def test_greedy_is_deterministic(engine: Any) -> None:
    a = run(engine.complete(greedy(QUESTIONS[0], max_tokens=12)))
    b = run(engine.complete(greedy(QUESTIONS[0], max_tokens=12)))
    assert a.completion_token_ids == b.completion_token_ids
    assert content(a) == content(b) and content(a)
    r = a.response
    assert r["id"].startswith("chatcmpl-") and r["object"] == "chat.completion"
    assert r["model"] == "tiny" and isinstance(r["created"], int)
    assert r["usage"] == {
        "prompt_tokens": len(a.prompt_token_ids or []),
        "completion_tokens": len(a.completion_token_ids or []),
        "total_tokens": len(a.prompt_token_ids or []) + len(a.completion_token_ids or []),
    }
    assert set(a.timings) == {"queue_ms", "ttft_ms", "total_ms"}
    assert 0 <= a.timings["queue_ms"] <= a.timings["ttft_ms"] <= a.timings["total_ms"]


def test_a_seed_repeats_a_sample(engine: Any) -> None:
    def sample(seed: int) -> list[int]:
        c = run(engine.complete(ask(QUESTIONS[1], temperature=1.0, seed=seed, max_tokens=16)))
        return c.completion_token_ids or []

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)  # 16 draws from a broad distribution: equal would be a bug


def test_max_tokens_ends_with_length(engine: Any) -> None:
    c = run(engine.complete(greedy(QUESTIONS[2], max_tokens=5)))
    assert len(c.completion_token_ids or []) == 5
    assert c.response["choices"][0]["finish_reason"] == "length"
    assert c.response["usage"]["completion_tokens"] == 5
    # max_completion_tokens (the newer name) wins over max_tokens
    c = run(engine.complete(greedy(QUESTIONS[2], max_tokens=9, max_completion_tokens=3)))
    assert len(c.completion_token_ids or []) == 3


def test_default_max_tokens_applies(engine: Any) -> None:
    c = run(engine.complete(greedy(QUESTIONS[2])))
    assert len(c.completion_token_ids or []) <= engine.default_max_tokens == 16


def test_stop_string_cuts_the_text(engine: Any) -> None:
    full = content(run(engine.complete(greedy(QUESTIONS[0], max_tokens=24))))
    stop = full[8:11]
    assert len(stop) == 3
    expected = full[: full.index(stop)]
    c = run(engine.complete(greedy(QUESTIONS[0], max_tokens=24, stop=[stop, "never-said"])))
    assert content(c) == expected
    assert c.response["choices"][0]["finish_reason"] == "stop"
    # Streaming holds back what could begin the stop string and never lets it through.
    chunks, final = run(collect(engine, greedy(QUESTIONS[0], max_tokens=24, stop=stop)))
    deltas = [ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"]]
    assert "".join(deltas) == expected
    assert content(final) == expected


def test_logprobs_are_the_raw_models(engine: Any, tiny_dir: Path) -> None:
    c = run(engine.complete(greedy(QUESTIONS[3], max_tokens=10, logprobs=True, top_logprobs=3)))
    ids, lps = c.completion_token_ids or [], c.logprobs or []
    entries = c.response["choices"][0]["logprobs"]["content"]
    assert len(ids) == len(lps) == len(entries) == 10
    assert all(lp <= 0 for lp in lps)
    for entry, lp in zip(entries, lps, strict=True):
        assert entry["logprob"] == pytest.approx(lp)
        assert len(entry["top_logprobs"]) == 3
        # greedy picks the argmax: the token is the most likely one
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"])
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert isinstance(entry["bytes"], list)

    # A sampled (temperature 1.5, top-p) answer's log-probs are still the plain model's,
    # as a full forward pass over prompt + completion computes them.
    body = ask(QUESTIONS[3], temperature=1.5, top_p=0.9, seed=3, max_tokens=10)
    c = run(engine.complete(body))
    ids, lps = c.completion_token_ids or [], c.logprobs or []
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    prompt = c.prompt_token_ids or []
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])
    assert lps == pytest.approx(expected.squeeze(1).tolist(), abs=1e-4)
    assert c.response["choices"][0]["logprobs"] is None  # not asked for


def test_token_ids_are_the_prompt_and_the_content(engine: Any, tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    body = greedy(QUESTIONS[4], max_tokens=20, return_token_ids=True)
    c = run(engine.complete(body))
    r = c.response
    assert r["prompt_token_ids"] == c.prompt_token_ids
    assert r["choices"][0]["token_ids"] == c.completion_token_ids
    rendered = tok.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
    assert c.prompt_token_ids == tok.encode(rendered, add_special_tokens=False)
    assert tok.decode(c.completion_token_ids, skip_special_tokens=True) == content(c)
    plain = run(engine.complete(greedy(QUESTIONS[4], max_tokens=20)))
    assert "prompt_token_ids" not in plain.response
    assert "token_ids" not in plain.response["choices"][0]


def test_stream_adds_up_to_the_completion(engine: Any) -> None:
    whole = run(engine.complete(greedy(QUESTIONS[5], max_tokens=20)))
    body = greedy(
        QUESTIONS[5],
        max_tokens=20,
        logprobs=True,
        return_token_ids=True,
        stream_options={"include_usage": True},
    )
    chunks, final = run(collect(engine, body))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["prompt_token_ids"] == whole.prompt_token_ids
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert len({ch["id"] for ch in chunks}) == 1
    *body_chunks, finish, usage = chunks
    assert finish["choices"][0]["finish_reason"] == "length" and finish["choices"][0]["delta"] == {}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 20
    assert all(ch["usage"] is None for ch in chunks[:-1])
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in body_chunks)
    assert text == content(whole) == content(final)
    ids = [i for ch in chunks[1:-1] for i in ch["choices"][0]["token_ids"]]
    entries = [e for ch in chunks[1:-1] for e in ch["choices"][0]["logprobs"]["content"]]
    assert ids == whole.completion_token_ids == final.completion_token_ids
    assert [e["logprob"] for e in entries] == pytest.approx(whole.logprobs)
    assert final.response["id"] == chunks[0]["id"]
    assert final.response["usage"] == usage["usage"]


def test_message_shapes_and_tools_render(engine: Any, tiny_dir: Path) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    body = {
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        "tools": tools,
        "temperature": 0,
        "max_tokens": 4,
    }
    c = run(engine.complete(body))
    prompt = AutoTokenizer.from_pretrained(tiny_dir).decode(c.prompt_token_ids)
    assert "Be brief." in prompt and '"name": "get_weather"' in prompt
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    with pytest.raises(BadRequest):
        run(
            engine.complete(
                ask("x", messages=[{"role": "user", "content": [{"type": "image_url"}]}])
            )
        )


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(tiny_dir: Path) -> None:
    with running_engine(tiny_dir, max_batch_size=8) as engine:
        bodies = [greedy(q, max_tokens=24) for q in QUESTIONS]
        solo = [run(engine.complete(b)) for b in bodies]
        assert engine.stats.max_batch == 1

        async def together() -> list[Completion]:
            return await asyncio.gather(*(engine.complete(b) for b in bodies))

        batched = run(together())
        assert engine.stats.max_batch > 1, engine.stats
        # Left padding changes the shapes of the matrix products, hence the float rounding;
        # greedy choices on the tiny model sit far from ties, so the tokens are the same.
        for s, b in zip(solo, batched, strict=True):
            assert b.completion_token_ids == s.completion_token_ids
            assert content(b) == content(s)
            assert b.logprobs == pytest.approx(s.logprobs, abs=1e-3)
        assert engine.stats.active == 0
        assert engine.stats.finished == 12


def test_context_overflow_is_a_bad_request(engine: Any) -> None:
    before = engine.stats.requests
    with pytest.raises(BadRequest) as err:
        run(engine.complete(greedy("hi", max_tokens=engine.max_context)))
    assert err.value.code == "context_length_exceeded"
    assert "maximum context length is 2048" in err.value.message
    with pytest.raises(BadRequest) as err:
        run(engine.complete(greedy("hello " * 3000)))
    assert err.value.code == "context_length_exceeded"
    with pytest.raises(BadRequest) as err:
        run(collect(engine, greedy("hello " * 3000)))  # a stream raises before its first chunk
    assert err.value.code == "context_length_exceeded"
    assert engine.stats.requests == before  # nothing was queued


SENTENCE = "the quick brown fox jumps over the lazy dog while 42 agents write code { } ; "
FOUR_MB = (SENTENCE * (4_000_000 // len(SENTENCE) + 1))[:4_000_000]


def test_text_longer_than_the_context_can_spell_is_refused_untokenized(engine: Any) -> None:
    # More characters than max_context tokens can spell (the longest vocabulary entry, times
    # the context): refused without tokenizing 4 MB (seconds, and the encoding of 1.5 M
    # tokens would be freed holding the interpreter lock).
    with pytest.raises(BadRequest) as err:
        run(engine.complete(greedy(FOUR_MB)))
    assert err.value.code == "context_length_exceeded"
    assert "4000" in err.value.message and "characters" in err.value.message


def test_large_prompt_is_tokenized_off_the_event_loop(tiny_dir: Path) -> None:
    """A prompt of many characters that the context could hold (a long-context model: the
    tiny model's context is raised here) is rendered and tokenized on a worker thread: the
    event loop keeps running meanwhile."""

    async def go(engine: Any) -> tuple[float, float, BadRequest]:
        gaps: list[float] = []

        async def tick() -> None:
            while True:
                t0 = time.perf_counter()
                await asyncio.sleep(0.005)
                gaps.append(time.perf_counter() - t0)

        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        try:
            # Tokenized and counted, then found too long for the completion asked.
            await engine.complete(greedy(FOUR_MB, max_tokens=engine.max_context - 10))
        except BadRequest as e:
            error = e
        elapsed = time.perf_counter() - t0
        await asyncio.sleep(0.02)  # the ticker records the gap it is in
        ticker.cancel()
        return elapsed, max(gaps), error

    with running_engine(tiny_dir) as engine:
        engine.max_context = 10**7
        elapsed, longest_gap, error = run(go(engine))
    assert error.code == "context_length_exceeded"
    assert re.search(r"\(\d{7} in the messages", error.message), error.message  # tokenized
    # Tokenizing 4 MB takes seconds; on the loop, the loop would stop for all of them.
    assert elapsed > 1.0
    assert longest_gap < elapsed / 4, (longest_gap, elapsed)


def test_prompt_tokens_are_transformers_tokens(tiny_dir: Path) -> None:
    from reef.engines.prompt import ChatRenderer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    renderer = ChatRenderer(tokenizer)
    body = {
        "messages": [
            {"role": "system", "content": "be brief <|im_start|> or not"},
            {"role": "user", "content": "héllo wörld 😀 " * 50 + "<|im_end|> {json: [1, 2]}"},
        ]
    }
    text = renderer.prompt_text(body)
    expected = tokenizer.encode(text, add_special_tokens=False)
    assert renderer.prompt_ids(body) == expected
    assert renderer.encode(text, len(expected)) == (len(expected), expected)
    assert renderer.encode(text, len(expected) - 1) == (len(expected), None)
    assert renderer.max_chars(len(expected)) >= len(text)


def test_only_one_choice(engine: Any) -> None:
    with pytest.raises(BadRequest) as err:
        run(engine.complete(greedy("hi", n=2)))
    assert err.value.param == "n"
    assert content(run(engine.complete(greedy("hi", n=1, max_tokens=2))))


def test_a_closed_stream_frees_its_slot(tiny_dir: Path) -> None:
    with running_engine(tiny_dir, max_batch_size=1) as engine:

        async def abandon_stream() -> None:
            stream = engine.stream(greedy("hi", max_tokens=1500))
            async for chunk in stream:
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    break  # the client went away after the first words
            await stream.aclose()

        async def abandon_task() -> None:
            start = engine.stats.tokens_generated
            task = asyncio.create_task(engine.complete(greedy("hi", max_tokens=1500)))
            while engine.stats.tokens_generated < start + 3:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        for abandon in (abandon_stream, abandon_task):
            run(abandon())
            # With one slot, this answer can only come once the abandoned row has left.
            c = run(asyncio.wait_for(engine.complete(greedy("hi", max_tokens=3)), 60))
            assert len(c.completion_token_ids or []) == 3
        assert engine.stats.cancelled == 2
        assert engine.stats.tokens_generated < 200, engine.stats
        assert engine.stats.active == 0


def test_a_model_failure_fails_only_its_step(tiny_dir: Path) -> None:
    with running_engine(tiny_dir) as engine:
        failures = {"left": 1}

        def explode(module: Any, args: Any) -> None:
            if failures["left"]:
                failures["left"] -= 1
                raise RuntimeError("simulated kernel failure")

        handle = engine._model.model.layers[0].register_forward_pre_hook(explode)
        try:
            with pytest.raises(EngineError) as err:
                run(engine.complete(greedy("hi", max_tokens=3)))
            # the caller learns what failed, never the exception text (the log has it)
            assert "reading the prompt" in err.value.message
            assert "simulated kernel failure" not in err.value.message
            assert run(engine.ready())
            c = run(engine.complete(greedy("hi", max_tokens=3)))
            assert len(c.completion_token_ids or []) == 3
            assert engine.stats.failed == 1
        finally:
            handle.remove()


def test_closing_fails_what_is_left(tiny_dir: Path) -> None:
    with running_engine(tiny_dir) as engine:

        async def close_midway() -> None:
            task = asyncio.create_task(engine.complete(greedy("hi", max_tokens=1500)))
            while engine.stats.tokens_generated < 3:
                await asyncio.sleep(0.001)
            await engine.aclose()
            with pytest.raises(EngineUnavailable, match="shutting down"):
                await task

        run(close_midway())
        assert not run(engine.ready())
        with pytest.raises(EngineUnavailable):
            run(engine.complete(greedy("hi")))


@pytest.mark.slow
def test_smollm2_converts_and_answers(tmp_path: Path) -> None:
    cache = EngineSettings().model_cache
    gguf = cache / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.is_file():
        pytest.skip(f"{gguf} missing: run `make smollm2`")
    # Convert afresh from the shared GGUF, so the conversion itself is under test.
    (tmp_path / "smollm2").mkdir()
    shutil.copyfile(gguf, tmp_path / "smollm2" / gguf.name)
    from reef.models import resolve_model

    model_dir = resolve_model("smollm2", tmp_path)
    with running_engine(model_dir, threads=2) as engine:
        c = run(engine.complete(greedy("What is the capital of France?", max_tokens=24)))
    assert "Paris" in content(c)
    assert c.response["choices"][0]["finish_reason"] == "stop"


def test_each_engine_takes_its_settings_section_whole(tiny_dir: Path) -> None:
    """`reef serve` hands the embedded engine `engine.embedded` as it is, with the engine-wide
    keys beside it, and the upstream engine reads `engine.upstream`."""
    from reef.cli.serve import build_engine
    from reef.engines.upstream import UpstreamEngine
    from reef.settings import load_settings

    settings = load_settings(
        engine={
            "model": str(tiny_dir),
            "default_max_tokens": 9,
            "sampling_defaults": {},
            "embedded": {"max_batch_size": 3, "dtype": "bfloat16", "prefill_chunk_tokens": 0},
        }
    )
    engine: Any = build_engine(settings)
    assert engine.options is settings.engine.embedded
    assert engine.dtype == torch.bfloat16
    assert (engine.default_max_tokens, engine.sampling_defaults) == (9, {})
    upstream = {"url": "http://127.0.0.1:9/v1", "model": "m", "timeout_s": 7, "responses": True}
    front = build_engine(load_settings(engine={"kind": "upstream", "upstream": upstream}))
    assert isinstance(front, UpstreamEngine)
    assert (front.base_url, front.model, front.timeout_s) == ("http://127.0.0.1:9/v1", "m", 7)
    assert front.serves_responses
