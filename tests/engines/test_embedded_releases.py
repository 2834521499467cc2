"""Hot deploy in the embedded engine: LoRA adapters and full checkpoints served beside the base."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
import warnings
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from reef.engines.base import Completion, Deployable, Engine
from reef.errors import BadRequest, Conflict, EngineError, NotFound, UnknownModel
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


def greedy(model: str, question: str, max_tokens: int = 12) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }


def ids(c: Completion) -> list[int]:
    return c.completion_token_ids or []


def quiet_peft(build: Any) -> Any:
    """PEFT reads a deprecated transformers attribute when it wraps a model (a FutureWarning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return build()


def lora(model: torch.nn.Module, seed: int, out: Path, scale: float = 0.1, rank: int = 8) -> None:
    """A LoRA on every linear layer, with lora_B drawn from `seed` so it changes the answers."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # PEFT draws lora_A from torch's global generator
        peft = quiet_peft(
            lambda: get_peft_model(model, LoraConfig(r=rank, target_modules="all-linear"))
        )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    peft.save_pretrained(out)


def perturbed(model_dir: Path, seed: int, out: Path, dtype: torch.dtype = torch.float32) -> None:
    """A full checkpoint: the tiny model with every weight moved a little."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    model.to(dtype).save_pretrained(out)


@dataclass
class Releases:
    """Artifacts on disk, and the plain transformers/PEFT models that are the ground truth."""

    dirs: dict[str, Path]
    truth: dict[str, torch.nn.Module]

    def expected(self, name: str, prompt: list[int], n: int) -> list[int]:
        """Greedy tokens by plain `generate`, which stops after an end-of-turn token as we do."""
        with torch.inference_mode():
            out = self.truth[name].generate(
                input_ids=torch.tensor([prompt]),
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                max_new_tokens=n,
                do_sample=False,
            )
        return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def releases(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Releases:
    root = tmp_path_factory.mktemp("releases")
    dirs = {name: root / name for name in ("a1", "a2", "ft")}

    def base() -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(tiny_dir).eval()

    lora(base(), 1, dirs["a1"])
    lora(base(), 2, dirs["a2"])
    perturbed(tiny_dir, 3, dirs["ft"])

    # Refused: an adapter for a narrower model, one whose config targets a norm layer (PEFT
    # fails halfway through wrapping), a checkpoint of another width and one stored in bf16.
    narrow = LlamaConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=32,
    )  # fmt: skip
    dirs["narrow"] = root / "narrow"
    lora(LlamaForCausalLM(narrow), 4, dirs["narrow"])
    dirs["norm"] = root / "norm"
    shutil.copytree(dirs["a1"], dirs["norm"])
    config = json.loads((dirs["norm"] / "adapter_config.json").read_text())
    config["target_modules"] = ["q_proj", "input_layernorm"]
    (dirs["norm"] / "adapter_config.json").write_text(json.dumps(config))
    wide = LlamaConfig.from_pretrained(tiny_dir)
    wide.intermediate_size = 192
    dirs["wide"] = root / "wide"
    LlamaForCausalLM(wide).save_pretrained(dirs["wide"])
    dirs["bf16"] = root / "bf16"
    perturbed(tiny_dir, 5, dirs["bf16"], torch.bfloat16)
    dirs["nan"] = root / "nan"
    lora(base(), 6, dirs["nan"], scale=float("nan"))
    dirs["empty"] = root / "empty"
    dirs["empty"].mkdir()

    truth = {
        "tiny": base(),
        "a1": quiet_peft(lambda: PeftModel.from_pretrained(base(), dirs["a1"])).eval(),
        "a2": quiet_peft(lambda: PeftModel.from_pretrained(base(), dirs["a2"])).eval(),
        "ft": AutoModelForCausalLM.from_pretrained(dirs["ft"]).eval(),
    }
    return Releases(dirs, truth)


def has_lora_layers(engine: Any) -> bool:
    return any("lora_A" in name for name, _ in engine._model.named_modules())


def test_the_embedded_engine_is_deployable(engine: Any) -> None:
    assert isinstance(engine, Engine) and isinstance(engine, Deployable)
    assert engine.variants() == [] and engine.models() == ["tiny"]


def test_an_adapter_serves_what_peft_computes(tiny_dir: Path, releases: Releases) -> None:
    with running_engine(tiny_dir) as engine:
        before = run(engine.complete(greedy("tiny", QUESTIONS[0])))
        assert not has_lora_layers(engine)  # no adapter, no PEFT on the hot path
        run(engine.load_adapter("a1", releases.dirs["a1"]))
        assert engine.models() == ["tiny", "a1"] and engine.variants() == ["a1"]

        tuned = run(engine.complete(greedy("a1", QUESTIONS[0])))
        assert tuned.response["model"] == "a1"
        prompt = tuned.prompt_token_ids or []
        assert ids(tuned) == releases.expected("a1", prompt, 12)
        assert ids(tuned) != ids(before)
        after = run(engine.complete(greedy("tiny", QUESTIONS[0])))
        assert ids(after) == ids(before) == releases.expected("tiny", prompt, 12)
        assert after.response["model"] == "tiny"

        run(engine.unload("a1"))
        assert engine.models() == ["tiny"] and not has_lora_layers(engine)
        assert ids(run(engine.complete(greedy("tiny", QUESTIONS[0])))) == ids(before)


def test_a_full_checkpoint_serves_what_transformers_computes(
    tiny_dir: Path, releases: Releases
) -> None:
    with running_engine(tiny_dir) as engine:
        run(engine.load_weights("ft", releases.dirs["ft"]))
        assert engine.models() == ["tiny", "ft"]
        tuned = run(engine.complete(greedy("ft", QUESTIONS[1])))
        base = run(engine.complete(greedy("tiny", QUESTIONS[1])))
        prompt = tuned.prompt_token_ids or []
        assert ids(tuned) == releases.expected("ft", prompt, 12) != ids(base)
        assert ids(base) == releases.expected("tiny", prompt, 12)
        assert not has_lora_layers(engine)
        run(engine.unload("ft"))
        assert engine.models() == ["tiny"]


@pytest.mark.parametrize("chunk", [256, 32])  # prompts read whole, and in parts
def test_base_adapters_and_a_checkpoint_decode_together(
    tiny_dir: Path, releases: Releases, chunk: int
) -> None:
    with running_engine(tiny_dir, max_batch_size=8, prefill_chunk_tokens=chunk) as engine:

        async def deploy_then_ask() -> list[Completion]:
            await engine.load_adapter("a1", releases.dirs["a1"])
            await engine.load_adapter("a2", releases.dirs["a2"])
            await engine.load_weights("ft", releases.dirs["ft"])
            plan = ["tiny", "a1", "a2", "ft", "tiny", "a1", "ft", "a2"]
            bodies = [greedy(m, QUESTIONS[i % len(QUESTIONS)], 16) for i, m in enumerate(plan)]
            return await asyncio.gather(*(engine.complete(b) for b in bodies))

        answers = run(deploy_then_ask())
        assert engine.models() == ["tiny", "a1", "a2", "ft"]
        for c in answers:
            name = c.response["model"]
            assert ids(c) == releases.expected(name, c.prompt_token_ids or [], 16), name
        assert len({tuple(ids(c)) for c in answers}) == len(answers)
        # base and adapter rows (6 of 8) went through one forward pass; the checkpoint's
        # rows had their own
        assert engine.stats.max_batch >= 5, engine.stats
        # Whether these prompts were read in chunks depends on arrival: only while rows decode
        # (all eight may be admitted before the first step). test_chunked_prefill.py starts a
        # long prompt mid-batch to check the chunked reading itself.
        assert engine.stats.active == 0 and engine.stats.failed == 0


def test_requests_in_flight_keep_their_weights(tiny_dir: Path, releases: Releases) -> None:
    with running_engine(tiny_dir, max_batch_size=8) as engine:
        # Each forward pass takes 2 ms at least, so 120 tokens outlast the loads by far.
        slow = engine._model.model.layers[0].register_forward_pre_hook(lambda *_: time.sleep(0.002))

        async def first_token(body: dict[str, Any]) -> asyncio.Task[Completion]:
            """Start a streamed request and return once its first token is out."""
            stream = engine.stream(body)
            seen = asyncio.Event()

            async def consume() -> Completion:
                async for item in stream:
                    seen.set()
                    if isinstance(item, Completion):
                        return item
                raise AssertionError("no completion")

            task = asyncio.create_task(consume())
            await seen.wait()
            return task

        async def scenario() -> tuple[Completion, Completion]:
            # A base request is decoding when the first adapter wraps the base model's layers.
            base_task = await first_token(greedy("tiny", QUESTIONS[2], 120))
            await engine.load_adapter("a1", releases.dirs["a1"])
            assert not base_task.done()
            tuned_task = await first_token(greedy("a1", QUESTIONS[3], 120))
            # Unloading starts while the a1 request runs: the name goes at once, the weights
            # only when that request is done; loading another adapter meanwhile changes nothing.
            unload = asyncio.create_task(engine.unload("a1"))
            await asyncio.sleep(0.01)
            assert engine.models() == ["tiny"]
            with pytest.raises(UnknownModel):
                await engine.complete(greedy("a1", "hi"))
            await engine.load_adapter("a2", releases.dirs["a2"])
            assert not unload.done() and not tuned_task.done()
            await unload
            assert tuned_task.done()  # its last token was sent before the weights went
            return await base_task, await tuned_task

        base, tuned = run(scenario())
        slow.remove()
        assert ids(base) == releases.expected("tiny", base.prompt_token_ids or [], 120)
        assert ids(tuned) == releases.expected("a1", tuned.prompt_token_ids or [], 120)
        assert len(ids(tuned)) == 120 and tuned.response["model"] == "a1"
        assert engine.models() == ["tiny", "a2"] and engine.stats.failed == 0


def test_a_taken_name_is_a_conflict(tiny_dir: Path, releases: Releases) -> None:
    with running_engine(tiny_dir) as engine:
        run(engine.load_adapter("a1", releases.dirs["a1"]))
        for load in (
            engine.load_adapter("a1", releases.dirs["a2"]),
            engine.load_adapter("tiny", releases.dirs["a2"]),
        ):
            with pytest.raises(Conflict) as err:
                run(load)
            assert err.value.code == "adapter_exists"
        with pytest.raises(Conflict) as err:
            run(engine.load_weights("a1", releases.dirs["ft"]))
        assert err.value.code == "model_exists"

        async def twice() -> list[Any]:
            return await asyncio.gather(
                engine.load_adapter("a2", releases.dirs["a2"]),
                engine.load_adapter("a2", releases.dirs["a2"]),
                return_exceptions=True,
            )

        outcomes = run(twice())
        assert sum(isinstance(o, Conflict) for o in outcomes) == 1 and None in outcomes
        assert engine.models() == ["tiny", "a1", "a2"]


def test_an_adapter_that_does_not_fit_is_refused(tiny_dir: Path, releases: Releases) -> None:
    with running_engine(tiny_dir) as engine:
        base = ids(run(engine.complete(greedy("tiny", QUESTIONS[4]))))

        def refused(name: str, match: str) -> None:
            with pytest.raises(BadRequest, match=match) as err:
                run(engine.load_adapter(name, releases.dirs[name]))
            assert err.value.code == "invalid_adapter"
            assert ids(run(engine.complete(greedy("tiny", QUESTIONS[4])))) == base

        refused("narrow", r"has shape \[8, 128\], but the base model's '.*down_proj' maps 256 to")
        refused("empty", "no adapter_config.json")
        refused("norm", "does not fit")  # PEFT failed halfway through the first wrap
        assert not has_lora_layers(engine) and engine.models() == ["tiny"]

        run(engine.load_adapter("a1", releases.dirs["a1"]))
        tuned = ids(run(engine.complete(greedy("a1", QUESTIONS[4]))))
        refused("norm", "does not fit")  # ...and beside an adapter already served
        assert ids(run(engine.complete(greedy("a1", QUESTIONS[4])))) == tuned
        assert engine.models() == ["tiny", "a1"]
        lora_layers = [n for n, _ in engine._model.named_modules() if n.endswith("lora_A")]
        assert all(
            list(engine._model.get_submodule(n).keys()) == [engine._variants["a1"].adapter]
            for n in lora_layers
        )


def test_a_checkpoint_that_does_not_fit_is_refused(tiny_dir: Path, releases: Releases) -> None:
    with running_engine(tiny_dir) as engine:
        base = ids(run(engine.complete(greedy("tiny", QUESTIONS[5]))))
        for name, match in [
            ("wide", r"mlp.down_proj.weight: \('F32', \(128, 192\)\) where the base has"),
            ("bf16", "'BF16'"),
            ("empty", "no config.json"),
            ("a1", "no config.json"),
        ]:
            with pytest.raises(BadRequest, match=match) as err:
                run(engine.load_weights("x", releases.dirs[name]))
            assert err.value.code == "invalid_checkpoint"
        assert engine.models() == ["tiny"]
        assert ids(run(engine.complete(greedy("tiny", QUESTIONS[5])))) == base


def test_unload_and_what_cannot_be_unloaded(tiny_dir: Path, releases: Releases) -> None:
    with running_engine(tiny_dir) as engine:
        with pytest.raises(NotFound):
            run(engine.unload("a1"))
        with pytest.raises(BadRequest):
            run(engine.unload("tiny"))
        run(engine.load_adapter("a1", releases.dirs["a1"]))
        run(engine.load_weights("ft", releases.dirs["ft"]))
        run(engine.unload("a1"))
        run(engine.unload("ft"))
        assert engine.models() == ["tiny"] and engine.variants() == []
        for name in ("a1", "ft"):
            with pytest.raises(UnknownModel) as err:  # as the API answers a model it lacks
                run(engine.complete(greedy(name, "hi")))
            assert err.value.status == 404 and err.value.param == "model"
        # the name is free again, and the adapter comes back as it was
        run(engine.load_adapter("a1", releases.dirs["a1"]))
        c = run(engine.complete(greedy("a1", QUESTIONS[0])))
        assert ids(c) == releases.expected("a1", c.prompt_token_ids or [], 12)


def test_verify_decodes_on_the_variant(tiny_dir: Path, releases: Releases) -> None:
    with running_engine(tiny_dir) as engine:
        run(engine.load_adapter("a1", releases.dirs["a1"]))
        report = run(engine.verify("a1"))
        assert report["model"] == "a1" and 1 <= report["tokens"] <= 8
        assert report["seconds"] > 0 and isinstance(report["text"], str)
        assert run(engine.verify("tiny"))["text"] != report["text"]
        with pytest.raises(UnknownModel):
            run(engine.verify("nope"))
        # An adapter that loads but computes NaN: verify is what catches it.
        run(engine.load_adapter("nan", releases.dirs["nan"]))
        with pytest.raises(EngineError, match="non-finite"):
            run(engine.verify("nan"))
        assert run(engine.verify("a1"))["text"] == report["text"]


def test_a_cancelled_load_leaves_nothing_behind(tiny_dir: Path, releases: Releases) -> None:
    with running_engine(tiny_dir) as engine:
        inside, held = threading.Event(), threading.Event()

        def wait(*_: Any) -> None:
            inside.set()
            held.wait(10)

        hold = engine._model.model.layers[0].register_forward_pre_hook(wait)

        async def cancel_midway() -> None:
            # The scheduler is held inside a forward pass, so the attach waits in its queue.
            busy = asyncio.create_task(engine.complete(greedy("tiny", "hi", 2)))
            await asyncio.to_thread(inside.wait, 10)
            load = asyncio.create_task(engine.load_adapter("a1", releases.dirs["a1"]))
            while engine._scheduler._queue.empty():  # the adapter was read; attaching is queued
                await asyncio.sleep(0.005)
            load.cancel()
            held.set()
            with pytest.raises(asyncio.CancelledError):
                await load
            await busy
            await engine.verify("tiny")  # a round trip: the queued detach has run by now

        run(cancel_midway())
        hold.remove()
        assert engine.models() == ["tiny"] and not has_lora_layers(engine)
        run(engine.load_adapter("a1", releases.dirs["a1"]))  # the name is free
