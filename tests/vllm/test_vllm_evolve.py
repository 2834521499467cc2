"""The whole loop with vLLM serving: calls and reports through `reef serve --engine vllm`, the
evolve worker trains (SFT, tiny model; a LoRA, then full weights), the gate passes, the deploy
loads the release into the running vLLM, and the next call is answered by vLLM exactly as the
trained model answers, with the record naming the new release."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from reef.engines.vllm import VllmServer
from reef.testing.process import ReefServer
from reef.testing.traffic import report_all, traffic
from tests.vllm.test_vllm_deploy import _ask, _greedy

pytestmark = pytest.mark.vllm

S = "evolve"


@pytest.mark.parametrize("full", [False, True], ids=["lora", "full"])
def test_vllm_serves_the_release_the_loop_trained(
    tmp_path: Path, vllm_server: VllmServer, tiny_dir: Path, full: bool
) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "reef": {
                    "recipe": "sft",
                    "batch_size": 4,
                    "params": {"epochs": 3, "learning_rate": 0.01, "full": full},
                },
                "gate": {"policy": "always"},
            }
        )
    )
    args = ("-c", str(cfg), "--engine", "vllm", "--model", "tiny", "--vllm-url", vllm_server.url)
    with ReefServer(tmp_path / "state", *args, env={"REEF_REEF__AUTO": "true"}) as srv:
        asked = [{"role": "user", "content": "question 0"}]
        prompt, before, base_release = _ask(srv, S, messages=asked)
        receipts = traffic(srv, S, 4, prompt="question {i}", max_tokens=4, temperature=0)
        correction = {"score": 1.0, "feedback": {"correction": "hello there"}}
        report_all(srv, S, receipts, lambda i, rid: correction)

        deadline = time.monotonic() + 200
        chain: list[dict] = []
        while time.monotonic() < deadline and len(chain) < 2:
            chain = httpx.get(f"{srv.url}/reef/scenarios/{S}/releases").json()["data"]
            time.sleep(1)
        assert len(chain) == 2, srv.log()[-6000:]
        new = chain[0]
        assert new["current"] and new["kind"] == ("checkpoint" if full else "adapter")
        name = f"{S}@{new['release_id']}"
        files = new["uri"].removeprefix("file://")

        # vLLM serves it and answers as the trained model does
        if full:
            assert httpx.get(f"{vllm_server.url}/weight_info").json()["weight_version"] == name
            truth = AutoModelForCausalLM.from_pretrained(files, dtype=torch.float32)
        else:
            names = [m["id"] for m in httpx.get(f"{vllm_server.url}/v1/models").json()["data"]]
            assert name in names
            from peft import PeftModel

            truth = PeftModel.from_pretrained(
                AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32), files
            )
        got_prompt, ids, served_by = _ask(srv, S, messages=asked)
        assert served_by == new["release_id"] != base_release and got_prompt == prompt
        assert ids == _greedy(truth, prompt, len(ids))
        assert ids != before, "training on the corrections should change the greedy answer"
