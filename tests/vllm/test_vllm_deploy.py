"""`reef serve --engine vllm` in front of a real vLLM: records carry vLLM's token ids and
log-probs, and releases deploy into the running vLLM through the same deploy step as the
embedded engine (deploy.release.deploy over the admin routes):

- LoRA releases load under `<scenario>@<release>`, answer like the PEFT model they came from,
  and fall out of the keep window; a name is never loaded twice.
- A full-weight release reloads the workers' weights in place and answers like the checkpoint;
  a checkpoint of another shape is refused before anything moves; one that fails verification
  (NaN weights) is taken out again and the previous weights are restored.

The tests share one vLLM and run in file order (full weights last: they are engine-wide).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from reef.deploy.engine import DeployError, EngineAdmin
from reef.deploy.release import deploy
from reef.engines.vllm import VllmServer
from reef.records import Release, new_id, utcnow
from reef.store.base import Store
from reef.store.sql import open_store
from reef.testing.process import ReefServer
from tests.engines.test_embedded_releases import lora, perturbed

pytestmark = pytest.mark.vllm

PROMPT = [{"role": "user", "content": "Say hello to the world"}]


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory, vllm_server: VllmServer) -> Iterator[ReefServer]:
    state = tmp_path_factory.mktemp("reef-vllm")
    args = ("--engine", "vllm", "--model", "tiny", "--vllm-url", vllm_server.url)
    # releases here are directories the test writes, not artifact-store files
    with ReefServer(state, *args, env={"REEF_ENGINE__ALLOW_LOCAL_PATHS": "true"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def store(reef: ReefServer) -> Iterator[Store]:
    s = open_store(f"sqlite:///{reef.state_dir / 'reef.db'}")
    yield s
    s.close()


@pytest.fixture(scope="module")
def admin(reef: ReefServer) -> Iterator[EngineAdmin]:
    a = EngineAdmin(reef.url)
    yield a
    a.close()


def _release(store: Store, scenario: str, kind: str, path: Path) -> Release:
    return Release(
        id=new_id("rel"),
        scenario=scenario,
        seq=0,
        parent_id=store.ensure_scenario(scenario).head_release_id,
        kind=kind,
        created_at=utcnow(),
        uri=str(path),
        operation="training",
    )


def _ask(
    reef: ReefServer, scenario: str, n: int = 8, messages: list[dict] = PROMPT
) -> tuple[list[int], list[int], str]:
    """(prompt ids, greedy completion ids, release id) of one call through Reef, with the ids
    read back from the stored record."""
    client = openai.OpenAI(
        base_url=reef.base_url, api_key="none", default_headers={"x-reef-scenario": scenario}
    )
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=PROMPT,
        max_tokens=n,
        temperature=0,  # type: ignore[arg-type]
    )
    rec = httpx.get(
        f"{reef.url}/reef/scenarios/{scenario}/records/{raw.headers['x-reef-agent-record-id']}"
    ).json()
    assert rec["release_id"] == raw.headers["x-reef-release-id"]
    return rec["prompt_token_ids"], rec["completion_token_ids"], rec["release_id"]


def _greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
        )
    return [int(t) for t in out[0, len(prompt) :]]


def _vllm(server: VllmServer, path: str) -> dict:  # type: ignore[type-arg]
    r = httpx.get(f"{server.url}{path}", timeout=10)
    r.raise_for_status()
    return dict(r.json())


def test_vllm_records_carry_token_ids_and_logprobs(reef: ReefServer) -> None:
    client = openai.OpenAI(base_url=reef.base_url, api_key="none")
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=PROMPT,
        max_tokens=6,
        temperature=0,  # type: ignore[arg-type]
    )
    answer = raw.parse()
    assert answer.choices[0].logprobs is None  # captured for the record, not shown unasked
    rec = httpx.get(
        f"{reef.url}/reef/scenarios/default/records/{raw.headers['x-reef-agent-record-id']}"
    ).json()
    assert len(rec["completion_token_ids"]) == len(rec["logprobs"]) == 6
    assert rec["prompt_token_ids"] and all(lp <= 0 for lp in rec["logprobs"])
    # vLLM's generation-time top-4 per token (the openclaw recipe's capture), asked of vLLM
    # and kept for the record only: greedy, the chosen token leads each row
    topk = rec["topk"]
    assert topk["k"] == 4 and len(topk["ids"]) == len(topk["logprobs"]) == 6
    assert all(len(row) == 4 for row in topk["ids"])
    assert [row[0] for row in topk["ids"]] == rec["completion_token_ids"]
    assert [row[0] for row in topk["logprobs"]] == pytest.approx(rec["logprobs"], abs=1e-4)

    # a stream is recorded with the same tokens
    with client.chat.completions.with_streaming_response.create(
        model="tiny",
        messages=PROMPT,
        max_tokens=6,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    ) as resp:
        text = "".join(c.choices[0].delta.content or "" for c in resp.parse() if c.choices)
        streamed = resp.headers["x-reef-agent-record-id"]
    srec = httpx.get(f"{reef.url}/reef/scenarios/default/records/{streamed}").json()
    assert srec["completion_token_ids"] == rec["completion_token_ids"]
    assert srec["topk"]["ids"] == topk["ids"]
    assert text == answer.choices[0].message.content

    # vLLM's refusal becomes an OpenAI-style error with vLLM's status and message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "word " * 2000}],
            max_tokens=4,
        )
    assert "context" in str(e.value).lower() or "length" in str(e.value).lower()
    assert httpx.get(f"{reef.url}/readyz").status_code == 200


def test_vllm_lora_releases_deploy_and_leave_the_keep_window(
    reef: ReefServer,
    store: Store,
    admin: EngineAdmin,
    vllm_server: VllmServer,
    tiny_dir: Path,
    tmp_path: Path,
) -> None:
    scenario = "lora"
    prompt, base_ids, base_release = _ask(reef, scenario)
    deployed = []
    for seed in (1, 2, 3):
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
        lora(model, seed, tmp_path / f"a{seed}", scale=0.3)
        release = _release(store, scenario, "adapter", tmp_path / f"a{seed}")
        published, timings = deploy(store, admin, release, keep=2)
        assert timings["verify"]["weight_version"] == "default"
        deployed.append(published.id)

        # the next call is served by the new release, through vLLM, as PEFT computes it
        got_prompt, ids, served_by = _ask(reef, scenario)
        assert served_by == published.id and got_prompt == prompt
        from peft import PeftModel

        truth = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32),
            str(tmp_path / f"a{seed}"),
        )
        assert ids == _greedy(truth, prompt, len(ids)), seed
        assert ids != base_ids, "the adapter should change the greedy answer"

    # keep window 2: the oldest adapter left vLLM; the two newest stay
    names = {m["id"] for m in _vllm(vllm_server, "/v1/models")["data"]}
    assert f"{scenario}@{deployed[0]}" not in names
    assert {f"{scenario}@{r}" for r in deployed[1:]} <= names
    assert sorted(admin.variants()) == sorted(f"{scenario}@{r}" for r in deployed[1:])

    # a rank above vLLM's --max-lora-rank (16 here) is refused by Reef, before vLLM sees it
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    lora(model, 4, tmp_path / "wide", rank=32)
    with pytest.raises(DeployError, match=r"400.*rank 32 is above"):
        deploy(store, admin, _release(store, scenario, "adapter", tmp_path / "wide"))

    # never reloaded in place: other files under a loaded name change nothing
    again = admin.load(f"{scenario}@{deployed[-1]}", "adapter", str(tmp_path / "a1"))
    assert again["loaded"] is False
    assert _ask(reef, scenario) == (prompt, ids, deployed[-1])
    assert base_release != deployed[-1]


def test_vllm_full_weights_deploy_refuse_misfits_and_restore_on_failure(
    reef: ReefServer,
    store: Store,
    admin: EngineAdmin,
    vllm_server: VllmServer,
    tiny_dir: Path,
    tmp_path: Path,
) -> None:
    scenario = "full"
    prompt, base_ids, _ = _ask(reef, scenario)

    # a full-weight release: the workers reload it in place, versioned by the release
    perturbed(tiny_dir, 7, tmp_path / "ckpt")
    release = _release(store, scenario, "checkpoint", tmp_path / "ckpt")
    published, timings = deploy(store, admin, release)
    name = f"{scenario}@{published.id}"
    assert timings["verify"]["weight_version"] == name
    assert _vllm(vllm_server, "/weight_info")["weight_version"] == name
    _, ids, served_by = _ask(reef, scenario)
    truth = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    assert served_by == published.id
    assert ids == _greedy(truth, prompt, len(ids)) and ids != base_ids

    # a checkpoint of another shape is refused before anything moves
    config = truth.config
    config.intermediate_size = 512
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "misfit")
    misfit = _release(store, scenario, "checkpoint", tmp_path / "misfit")
    with pytest.raises(DeployError, match=r"400.*tensors differ"):
        deploy(store, admin, misfit)
    assert _vllm(vllm_server, "/weight_info")["weight_version"] == name
    assert _vllm(vllm_server, "/is_paused")["is_paused"] is False

    # NaN weights pass the shape check, move, fail verification, and are taken out again:
    # the previous release's weights are restored and the head stays
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    model.save_pretrained(tmp_path / "nan")
    broken = _release(store, scenario, "checkpoint", tmp_path / "nan")
    with pytest.raises(DeployError, match="verify"):
        deploy(store, admin, broken)
    assert store.get_scenario(scenario).head_release_id == published.id
    assert _vllm(vllm_server, "/weight_info")["weight_version"] == name
    _, again, served_by = _ask(reef, scenario)
    assert served_by == published.id and again == ids
    assert name in admin.variants() and f"{scenario}@{broken.id}" not in admin.variants()

    # leave the shared vLLM on the base weights for the tests after this one
    with httpx.Client(base_url=vllm_server.url, timeout=120) as c:
        c.post(
            "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(tiny_dir)}},
        ).raise_for_status()
        c.post("/update_weight_version", json={"new_version": "default"}).raise_for_status()
