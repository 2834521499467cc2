"""reef.imports and `reef import`: OpenAI chat JSONL and reef export's rows become records and
reports that join experience like served ones, are imported once, and never count as served
traffic. On SQLite and Postgres (the experience fixtures' store)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from reef.cli.main import main
from reef.errors import BadRequest
from reef.experience import collect
from reef.export import export
from reef.imports import import_file, import_lines
from reef.records import IMPORTED_TAG
from reef.samples import ScoredSample, TrajectorySample
from reef.store.browse import Browse
from reef.store.sql import SQLStore
from tests.experience.conftest import record, report, session

OPENAI_LINES = [
    # the fine-tuning shape: the last message is the answer
    {
        "id": "conv-1",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."},
        ],
        "score": 1.0,
        "tags": {"team": "geo"},
    },
    # prompt + completion, a correction as feedback
    {
        "id": "conv-2",
        "messages": [{"role": "user", "content": "Capital of Spain?"}],
        "completion": "It is Madrid, a city in the centre of the country.",
        "score": 0.0,
        "feedback": {"correction": "Madrid."},
        "model": "gpt-4o-mini",
    },
    # no id, no feedback: a record awaiting feedback
    {"messages": [{"role": "user", "content": "Hi"}], "completion": "Hello!"},
]


def _jsonl(rows: list[dict[str, object]]) -> list[bytes]:
    return [orjson.dumps(r) + b"\n" for r in rows]


def test_openai_lines_become_experience_once(store: SQLStore) -> None:
    result = import_lines(store, "imp", _jsonl(OPENAI_LINES))
    assert (result.records, result.reports, result.skipped) == (3, 2, 0)
    assert not result.dangling_reports

    exp = collect(store, "imp", "scored", recipe="sft")
    assert exp.awaiting_feedback == 1 and not exp.dropped
    by_answer = {s.completion: s for s in exp.samples if isinstance(s, ScoredSample)}
    paris = by_answer["Paris."]
    assert paris.score == 1.0 and [m["content"] for m in paris.messages] == [
        "Be brief.",
        "Capital of France?",
    ]
    madrid = by_answer["It is Madrid, a city in the centre of the country."]
    assert madrid.score == 0.0 and orjson.loads(madrid.feedback or "") == {"correction": "Madrid."}
    records = store.get_records("imp", paris.record_ids + madrid.record_ids)
    assert {r.tags.get(IMPORTED_TAG) for r in records} == {"openai"}
    assert {r.tags.get("team") for r in records} == {"geo", None}
    assert all(r.prompt_token_ids is None and r.logprobs is None for r in records)
    assert {r.model for r in records} == {"imported", "gpt-4o-mini"}

    # the engine's own tokens are what rollout recipes learn from: imported ones say why not
    rollout = collect(store, "imp", "rollout", recipe="openclaw")
    assert not rollout.samples and rollout.dropped == Counter(imported=2)

    again = import_lines(store, "imp", _jsonl(OPENAI_LINES))
    assert (again.records, again.reports, again.skipped) == (0, 0, 3)
    assert len(collect(store, "imp", "scored", recipe="sft").samples) == 2


def test_bad_lines_are_named_and_nothing_written(store: SQLStore, tmp_path: Path) -> None:
    cases = [
        (b"{not json\n", "line 1: not JSON"),
        (b"[1, 2]\n", "line 1: a line must be a JSON object"),
        (b'{"messages": [{"role": "user", "content": "q"}]}\n', "line 1: no answer"),
        (b'{"messages": "q", "completion": "a"}\n', "'messages' must be a list"),
        (
            b'{"messages": [{"role": "user", "content": "q"}], "completion": "a", '
            b'"tags": {"reef.imported": "x"}}\n',
            "tags under 'reef.' are Reef's own",
        ),
        (
            b'{"messages": [{"role": "user", "content": "q"}], "completion": "a", "score": "high"}',
            "'score' must be a number",
        ),
    ]
    good = _jsonl(OPENAI_LINES[:1])[0]
    path = tmp_path / "bad.jsonl"
    for raw, said in cases:
        path.write_bytes(good + b"\n" + raw)  # a good line, a blank one, then the bad one
        with pytest.raises(BadRequest, match=said.replace("line 1", "line 3")):
            import_file(store, "bad", path)
    assert store.list_scenarios() == []  # not even the scenario


def test_a_reef_export_round_trips(store: SQLStore, tmp_path: Path) -> None:
    """Export a scenario with a stitched session (one report on its three turns) and single
    turns, import the file into another scenario: the same experience, the same reports, the
    same session; a second import adds nothing."""
    base = store.ensure_scenario("src").head_release_id
    turns = session("src", base, 3)
    singles = [record("src", base, answer=f"answer {k}") for k in range(3)]
    store.add_records([*turns, *singles])
    store.add_report(report("src", *(r.id for r in turns), score=0.5))
    store.add_report(report("src", singles[0].id, score=1.0, feedback={"text": "good"}))
    store.add_report(report("src", singles[1].id, score=0.0))
    path = tmp_path / "src.jsonl"
    assert export(store, "src", path, "jsonl", progress=False) == 6

    result = import_file(store, "dst", path)
    assert (result.records, result.reports, result.skipped) == (6, 3, 0)

    def content(scenario: str, kind: str, recipe: str) -> list[tuple[object, ...]]:
        exp = collect(store, scenario, kind, recipe=recipe)
        out = []
        for s in exp.samples:
            if isinstance(s, TrajectorySample):
                turns = [
                    (t.turn, t.messages, t.completion, t.prompt_token_ids, t.logprobs)
                    for t in s.turns
                ]
                out.append((*turns, s.score))
            else:
                assert isinstance(s, ScoredSample)
                out.append((s.messages, s.completion, s.score, s.feedback))
        return sorted(out, key=repr)

    assert content("dst", "scored", "sft") == content("src", "scored", "sft")
    assert content("dst", "trajectory", "harness") == content("src", "trajectory", "harness")
    imported = store.list_records("dst", limit=100)
    assert len({r.session_id for r in imported if r.session_id}) == 1
    stitched = sorted((r for r in imported if r.session_id), key=lambda r: r.turn or 0)
    assert [r.parent_id for r in stitched] == [None, stitched[0].id, stitched[1].id]

    again = import_file(store, "dst", path)
    assert (again.records, again.reports, again.skipped) == (0, 0, 6)


def test_imported_records_are_not_served_traffic(store: SQLStore) -> None:
    base = store.ensure_scenario("tr").head_release_id
    served = [record("tr", base) for _ in range(2)]
    store.add_records(served)
    store.add_report(report("tr", served[0].id))
    import_lines(store, "tr", _jsonl(OPENAI_LINES))
    traffic = Browse(store).traffic("tr")
    assert (traffic.records, traffic.quoted, sum(traffic.hourly)) == (2, 1, 2)
    assert traffic.mean_score == 1.0


def test_the_command_imports_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_bytes(b"".join(_jsonl(OPENAI_LINES)))
    args = ["import", str(path), "--scenario", "cli-imp", "--state-dir", str(tmp_path / "s")]
    assert main(args) == 0
    assert "imported 3 records and 2 reports into 'cli-imp'" in capsys.readouterr().out
    assert main(args) == 0
    assert "(3 lines were there already)" in capsys.readouterr().out
    missing = ["import", str(tmp_path / "nope.jsonl"), "--scenario", "x"]
    assert main([*missing, "--state-dir", str(tmp_path / "s")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_the_route_imports_a_body_a_scoped_token_may_send(tmp_path: Path) -> None:
    """POST /reef/scenarios/{s}/records:import over real HTTP: JSONL in, counts out; the
    wrong content type is 415, a bad line 400 naming it (nothing written), another scenario's
    token 403, an oversize body 413; the records then serve as experience."""
    import httpx

    from reef.api.auth import hash_token
    from reef.cli.testing import InProcessReef

    tokens = [
        {"name": "ops", "sha256": hash_token("sk-ops"), "admin": True},
        {"name": "team", "sha256": hash_token("sk-team"), "scenarios": ["imp-http"]},
    ]
    body = b"".join(_jsonl(OPENAI_LINES))
    with InProcessReef(tmp_path, auth={"tokens": tokens}, server={"max_import_bytes": 4096}) as srv:
        url = f"{srv.url}/reef/scenarios/imp-http/records:import"
        jsonl = {"content-type": "application/x-ndjson", "authorization": "Bearer sk-team"}
        r = httpx.post(url, content=body, headers=jsonl)
        assert r.status_code == 200, r.text
        got = r.json()
        assert (got["records"], got["reports"], got["skipped"]) == (3, 2, 0)
        assert httpx.post(url, content=body, headers=jsonl).json()["skipped"] == 3

        as_json = {**jsonl, "content-type": "application/json"}
        assert httpx.post(url, content=body, headers=as_json).status_code == 415
        bad = httpx.post(url, content=body + b"{oops\n", headers=jsonl)
        assert bad.status_code == 400 and "line 4" in bad.json()["error"]["message"]
        other = url.replace("imp-http", "elsewhere")
        assert httpx.post(other, content=body, headers=jsonl).status_code == 403
        big = httpx.post(url, content=body * 20, headers=jsonl)
        assert big.status_code == 413, big.text

        status = httpx.get(
            f"{srv.url}/reef/scenarios/imp-http/status", headers={"authorization": "Bearer sk-ops"}
        ).json()
        assert (status["eligible"], status["awaiting_feedback"]) == (2, 1), status


def _any(value: object) -> dict[str, object]:
    """A Python value as OTLP/JSON's AnyValue (structured, as an SDK records it)."""
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_any(v) for v in value]}}
    assert isinstance(value, dict)
    return {"kvlistValue": {"values": [{"key": k, "value": _any(v)} for k, v in value.items()]}}


def _span(span_id: str, attributes: dict[str, object], *, structured: bool) -> dict[str, object]:
    def value(v: object) -> dict[str, object]:
        return (
            _any(v)
            if structured or isinstance(v, str)
            else {"stringValue": orjson.dumps(v).decode()}
        )

    return {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": span_id,
        "name": "chat",
        "attributes": [{"key": k, "value": value(v)} for k, v in attributes.items()],
    }


# A tool-using chat span with JSON-string attributes, one with structured ones, an HTTP span.
TOOL_CHAT: dict[str, object] = {
    "gen_ai.operation.name": "chat",
    "gen_ai.request.model": "gpt-4o",
    "gen_ai.response.model": "gpt-4o-2024-08-06",
    "gen_ai.system_instructions": [{"type": "text", "content": "You are a weather bot."}],
    "gen_ai.input.messages": [
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "call_1",
                    "name": "get_weather",
                    "arguments": {"location": "Paris"},
                },
            ],
        },
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "call_1", "result": "rainy, 57F"}],
        },
    ],
    "gen_ai.output.messages": [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "Rainy, 57F."}],
            "finish_reason": "stop",
        }
    ],
}
PLAIN: dict[str, object] = {
    "gen_ai.request.model": "llama-3",
    "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": "Hi"}]}],
    "gen_ai.output.messages": [
        {"role": "assistant", "parts": [{"type": "text", "content": "Hello"}]}
    ],
}
HTTP: dict[str, object] = {
    "http.request.method": "POST",
    "url.full": "https://api.example.com/v1/chat",
}
EXPORT = {
    "resourceSpans": [
        {
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "app"}}]},
            "scopeSpans": [
                {
                    "scope": {"name": "openai.instrumentation"},
                    "spans": [
                        _span("aaaaaaaaaaaaaaa1", TOOL_CHAT, structured=False),
                        _span("aaaaaaaaaaaaaaa2", PLAIN, structured=True),
                        _span("aaaaaaaaaaaaaaa3", HTTP, structured=True),
                    ],
                }
            ],
        }
    ]
}


def test_opentelemetry_genai_spans_become_records(store: SQLStore) -> None:
    """An OTLP/JSON trace export (a tool-using chat span with JSON-string attributes, one with
    structured ones, and an HTTP span): the two GenAI spans become records in OpenAI chat
    form, the HTTP span is skipped, and a re-import adds nothing."""
    result = import_lines(store, "otel", [orjson.dumps(EXPORT)])
    assert (result.records, result.reports, result.skipped) == (2, 0, 0)
    records = sorted(store.list_records("otel"), key=lambda r: r.model)
    assert [r.model for r in records] == ["gpt-4o-2024-08-06", "llama-3"]
    weather, hi = records
    assert weather.tags[IMPORTED_TAG] == "otlp"
    assert weather.request["messages"] == [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"location":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "rainy, 57F"},
    ]
    assert weather.response["choices"][0]["message"]["content"] == "Rainy, 57F."
    assert hi.request["messages"] == [{"role": "user", "content": "Hi"}]

    store.add_report(report("otel", weather.id, score=1.0))  # feedback comes afterwards
    (sample,) = collect(store, "otel", "scored", recipe="sft").samples
    assert isinstance(sample, ScoredSample) and sample.completion == "Rainy, 57F."

    again = import_lines(store, "otel", [orjson.dumps(EXPORT)])
    assert (again.records, again.skipped) == (0, 2)
    with pytest.raises(BadRequest, match="line 1: not an OTLP/JSON trace export"):
        import_lines(
            store,
            "otel",
            [
                b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"attributes": [{"key": "gen_ai.input.messages", "value": {"stringValue": "[oops"}}, {"key": "gen_ai.output.messages", "value": {"stringValue": "[]"}}]}]}]}]}'
            ],
        )
