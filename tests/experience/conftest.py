"""Experience fixtures: a store per test (SQLite and Postgres), releases published on it, a
real S3 protocol server (moto_server) on loopback."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reef.records import Record, Release, Report, new_id, utcnow
from reef.store.sql import SQLStore
from reef.testing.process import free_port

MOTO = str(Path(sys.executable).with_name("moto_server"))
_seq = itertools.count()


def append_release(store: SQLStore, scenario: str) -> Release:
    """Publish a trained adapter on top of the scenario's head (the store numbers it)."""
    head = store.head_release(scenario)
    return store.publish_release(
        Release(
            id=new_id("rel"),
            scenario=scenario,
            seq=head.seq + 1,
            parent_id=head.id,
            kind="adapter",
            created_at=utcnow(),
            operation="training",
        )
    )


def record(scenario: str, release_id: str, **fields: Any) -> Record:
    """A chat record; `prompt`/`answer` set the text, keyword arguments override any field."""
    prompt = fields.pop("prompt", "Say hi in five words.")
    answer = fields.pop("answer", "Hi there, how are you?")
    values: dict[str, Any] = {
        "id": new_id("rec"),
        "scenario": scenario,
        "created_at": utcnow(),
        "route": "chat.completions",
        "model": "tiny",
        "stream": False,
        "request": {"model": "tiny", "messages": [{"role": "user", "content": prompt}]},
        "response": {
            "id": "chatcmpl-1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2},
        },
        "release_id": release_id,
        "prompt_token_ids": [1, 9468, 314, 2],
        "completion_token_ids": [17, 2],
        "logprobs": [-0.25, -1.5],
    }
    values.update(fields)
    return Record(**values)


def report(scenario: str, *refs: str, score: float | None = 1.0, **fields: Any) -> Report:
    # Reports made in one test get strictly increasing times, so "latest" is well defined.
    return Report(
        id=fields.pop("id", new_id("rep")),
        scenario=scenario,
        created_at=fields.pop("created_at", utcnow()),
        references=tuple(refs),
        score=score,
        **fields,
    )


def session(
    scenario: str, release_id: str, turns: int, *, break_at: int | None = None
) -> list[Record]:
    """A multi-turn conversation whose token ids extend turn by turn (except at `break_at`)."""
    out: list[Record] = []
    sid = new_id("ses")
    prompt_ids = [1, 100]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "q0"}]
    for k in range(turns):
        completion_ids = [200 + k, 2]
        rec = record(
            scenario,
            release_id,
            request={"model": "tiny", "messages": list(messages)},
            response={"choices": [{"message": {"role": "assistant", "content": f"a{k}"}}]},
            prompt_token_ids=list(prompt_ids),
            completion_token_ids=completion_ids,
            logprobs=[-0.5, -0.1],
            session_id=sid,
            turn=k,
            parent_id=out[-1].id if out else None,
        )
        out.append(rec)
        messages += [
            {"role": "assistant", "content": f"a{k}"},
            {"role": "user", "content": f"q{k + 1}"},
        ]
        prompt_ids = prompt_ids + completion_ids + [300 + k]
        if break_at is not None and k + 1 == break_at:
            prompt_ids = [1, 999, *prompt_ids[2:]]  # the history re-rendered differently
    return out


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 protocol server (moto_server) on a free loopback port."""
    port = free_port()
    proc = subprocess.Popen(
        [MOTO, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url, timeout=1.0)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("moto_server did not start")
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; credentials reach boto3 through its normal chain (the environment)."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "reef-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "reef-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = f"reef-{os.getpid()}-{next(_seq)}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name
