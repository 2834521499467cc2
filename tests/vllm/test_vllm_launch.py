"""`reef serve --engine vllm` without a URL launches vLLM from vLLM's environment as a managed
child: it serves through it, and stopping Reef stops vLLM."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from reef.deploy.engine import EngineAdmin
from reef.testing.process import ReefServer
from tests.engines.test_embedded_releases import lora
from tests.vllm.conftest import VLLM_ARGS, VLLM_PYTHON

pytestmark = pytest.mark.vllm


def test_vllm_launched_by_reef_serves_and_stops_with_it(tmp_path: Path) -> None:
    env = {
        "REEF_ENGINE__VLLM__PYTHON": str(VLLM_PYTHON),
        "REEF_ENGINE__VLLM__ARGS": json.dumps(VLLM_ARGS),
    }
    srv = ReefServer(tmp_path, "--engine", "vllm", "--model", "tiny", env=env)
    srv.start(timeout_s=600)
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


def test_launched_vllm_refuses_callers_without_its_key(tmp_path: Path, tiny_dir: Path) -> None:
    """A vLLM that Reef launches listens on loopback with a random API key that only Reef
    holds: vLLM itself refuses /v1 without it, Reef's guard the routes vLLM leaves open (the
    dev-mode ones); /health stays open. Reef's own calls carry it: serving, readiness, and the
    admin routes a deploy drives (loading an adapter, verifying it against /weight_info)."""
    env = {
        "REEF_ENGINE__VLLM__PYTHON": str(VLLM_PYTHON),
        "REEF_ENGINE__VLLM__ARGS": json.dumps(VLLM_ARGS),
        "REEF_ENGINE__ALLOW_LOCAL_PATHS": "true",  # the adapter is a directory written here
    }
    srv = ReefServer(tmp_path / "reef", "--engine", "vllm", "--model", "tiny", env=env)
    srv.start(timeout_s=600)
    try:
        found = re.search(r"vLLM serving tiny at (http://\S+) \(pid (\d+)\)", srv.log())
        assert found, srv.log()[-3000:]
        vllm_url, pid = found.group(1), int(found.group(2))
        assert vllm_url.startswith("http://127.0.0.1:")
        environ = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{pid}/environ").read_text().split("\0")
            if "=" in item
        )
        key = environ["VLLM_API_KEY"]
        assert len(key) >= 32
        assert key not in Path(f"/proc/{pid}/cmdline").read_text()

        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        with httpx.Client(base_url=vllm_url, timeout=60) as anyone:
            assert anyone.get("/v1/models").status_code == 401  # vLLM's own check
            assert anyone.post("/v1/chat/completions", json=chat).status_code == 401
            assert anyone.get("/weight_info").status_code == 401  # Reef's guard
            assert anyone.post("/pause").status_code == 401
            assert anyone.get("/health").status_code == 200
            keyed = {"authorization": f"Bearer {key}"}
            assert anyone.get("/weight_info", headers=keyed).status_code == 200

        client = openai.OpenAI(base_url=srv.base_url, api_key="none")
        answer = client.chat.completions.create(**chat)
        assert answer.choices[0].message is not None
        assert httpx.get(f"{srv.url}/readyz").status_code == 200

        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
        lora(model, 1, tmp_path / "adapter", scale=0.3)
        admin = EngineAdmin(srv.url)
        try:
            assert admin.load("keyed@r1", "adapter", str(tmp_path / "adapter"))["loaded"]
            assert admin.verify("keyed@r1")["weight_version"] == "default"
        finally:
            admin.close()
        assert key not in srv.log()
        assert key not in (tmp_path / "reef" / "vllm.log").read_text()
    finally:
        srv.stop()
