"""The official openai SDK, unchanged, against Reef's app on the tiny model."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef
from tests.api.conftest import records_of

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


def client(server: InProcessReef, scenario: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url, api_key="unused", default_headers={"x-reef-scenario": scenario}
    )


def test_models_lists_the_engine_model(server: InProcessReef) -> None:
    models = openai.OpenAI(base_url=server.base_url, api_key="unused").models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_create_returns_receipt_and_record_keeps_tokens(
    server: InProcessReef, scenario: str
) -> None:
    raw = client(server, scenario).chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, max_tokens=8, temperature=0
    )
    receipt = raw.headers["x-reef-agent-record-id"]
    release = raw.headers["x-reef-release-id"]
    completion = raw.parse()
    assert receipt.startswith("rec_") and release.startswith("rel_")
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage is not None and 1 <= completion.usage.completion_tokens <= 8

    record = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records/{receipt}").json()
    assert record["id"] == receipt
    assert record["release_id"] == release
    assert record["route"] == "chat.completions"
    assert record["request"]["messages"] == MESSAGES
    assert (
        record["response"]["choices"][0]["message"]["content"]
        == completion.choices[0].message.content
    )
    assert len(record["completion_token_ids"]) == completion.usage.completion_tokens
    assert len(record["logprobs"]) == len(record["completion_token_ids"])
    assert all(lp <= 0 for lp in record["logprobs"])
    assert len(record["prompt_token_ids"]) == completion.usage.prompt_tokens
    # the generation-time top-4 per token (greedy: the chosen token is the first of them)
    topk = record["topk"]
    assert topk["k"] == 4 and len(topk["ids"]) == len(topk["logprobs"]) == len(record["logprobs"])
    assert [ids[0] for ids in topk["ids"]] == record["completion_token_ids"]
    assert all(row == sorted(row, reverse=True) for row in topk["logprobs"])

    scenario_info = httpx.get(f"{server.url}/reef/scenarios/{scenario}").json()
    assert scenario_info["head_release_id"] == release


def test_greedy_is_deterministic_and_seed_reproduces(server: InProcessReef, scenario: str) -> None:
    c = client(server, scenario)
    greedy = [
        c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert greedy[0] == greedy[1]
    seeded = [
        c.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=12, temperature=1.0, seed=7
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]


def test_streaming_headers_carry_receipt_and_record_is_stored(
    server: InProcessReef, scenario: str
) -> None:
    c = client(server, scenario)
    with c.chat.completions.with_streaming_response.create(
        model="tiny", messages=MESSAGES, max_tokens=10, temperature=0, stream=True
    ) as response:
        receipt = response.headers["x-reef-agent-record-id"]
        text = "".join(
            chunk.choices[0].delta.content or "" for chunk in response.parse() if chunk.choices
        )
    record = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records/{receipt}").json()
    assert record["stream"] is True
    assert record["response"]["choices"][0]["message"]["content"] == text
    plain = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0)
    assert plain.choices[0].message.content == text


def test_async_client_concurrent_calls_each_get_a_receipt(
    server: InProcessReef, scenario: str
) -> None:
    async def run() -> list[str]:
        ac = openai.AsyncOpenAI(
            base_url=server.base_url,
            api_key="unused",
            default_headers={"x-reef-scenario": scenario},
        )
        async with ac:
            raws = await asyncio.gather(
                *[
                    ac.chat.completions.with_raw_response.create(
                        model="tiny",
                        messages=[{"role": "user", "content": f"question {i}"}],
                        max_tokens=6,
                    )
                    for i in range(8)
                ]
            )
        return [r.headers["x-reef-agent-record-id"] for r in raws]

    receipts = asyncio.run(run())
    assert len(set(receipts)) == 8
    stored = {r["id"] for r in records_of(server, scenario)}
    assert stored == set(receipts)


def test_tags_headers_are_stored(server: InProcessReef, scenario: str) -> None:
    raw = client(server, scenario).chat.completions.with_raw_response.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=4,
        extra_headers={"x-reef-tag-user": "alice", "x-reef-tag-experiment": "b"},
    )
    receipt = raw.headers["x-reef-agent-record-id"]
    record = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records/{receipt}").json()
    # Besides the client's tags, the server's: the sampling values used (the tiny model
    # recommends none, so the request's own defaults).
    assert record["tags"] == {
        "user": "alice",
        "experiment": "b",
        "reef.temperature": "1.0",
        "reef.top_p": "1.0",
    }


def test_unknown_model_is_404_and_records_nothing(server: InProcessReef, scenario: str) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client(server, scenario).chat.completions.create(model="gpt-9", messages=MESSAGES)
    assert err.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert "gpt-9" in err.value.body["message"]  # type: ignore[index]
    assert records_of(server, scenario) == []


def test_max_tokens_over_cap_is_400(server: InProcessReef, scenario: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(server, scenario).chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=100_000
        )
    assert err.value.body["code"] == "max_tokens_too_large"  # type: ignore[index]
    assert records_of(server, scenario) == []
