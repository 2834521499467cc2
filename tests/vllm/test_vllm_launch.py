"""`reef serve --engine vllm` without a URL launches vLLM from vLLM's environment as a managed
child: it serves through it, and stopping Reef stops vLLM."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
import pytest

from tests.reefserver import ReefServer
from tests.vllm.conftest import VLLM_ARGS, VLLM_PYTHON

pytestmark = pytest.mark.vllm


def test_vllm_launched_by_reef_serves_and_stops_with_it(tmp_path: Path) -> None:
    env = {
        "REEF_ENGINE__VLLM_PYTHON": str(VLLM_PYTHON),
        "REEF_ENGINE__VLLM_ARGS": json.dumps(VLLM_ARGS),
    }
    srv = ReefServer(tmp_path, "--engine", "vllm", "--model", "tiny", env=env)
    srv.start(timeout=600)
    try:
        found = re.search(r"vLLM serving tiny at (http://\S+)", srv.log())
        assert found, srv.log()[-3000:]
        vllm_url = found.group(1)
        client = openai.OpenAI(base_url=srv.base_url, api_key="none")
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        rec = httpx.get(
            f"{srv.url}/reef/scenarios/default/records/{raw.headers['x-reef-agent-record-id']}"
        ).json()
        assert len(rec["completion_token_ids"]) == len(rec["logprobs"]) == 3
        assert (tmp_path / "vllm.log").stat().st_size > 0
        assert httpx.get(f"{vllm_url}/health").status_code == 200
    finally:
        srv.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{vllm_url}/health", timeout=5)
