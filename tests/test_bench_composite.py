"""bench/composite.py: the verdict it reports for the default gate is the one reef.gate gives,
and — loop stage — the whole bench runs every arm on the tiny model and writes its results."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from reef.gate import GatePolicy, decide

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "composite.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_composite", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_default_gates_verdict_is_read_off_the_numbers_policy_always_computes() -> None:
    """The bench gates at `always` (every candidate serves and is measured) and reports what
    `improve` would have said from the numbers `always` stored: the same as reef.gate's."""
    improve = bench().improve
    rng = np.random.default_rng(0)
    for n in (1, 2, 8, 12):
        for _ in range(8):
            cand, head = rng.integers(0, 2, n).tolist(), rng.integers(0, 2, n).tolist()
            stored = decide(cand, head, GatePolicy(policy="always")).as_dict()
            assert improve(stored) == decide(cand, head, GatePolicy(policy="improve")).status
    assert improve(None) is None  # a step with nothing to train has no numbers


@pytest.mark.loop
@pytest.mark.timeout(600)
def test_the_bench_runs_every_arm_on_the_tiny_model(tmp_path: Path) -> None:
    """The bench end to end on the tiny model, one seed, a small batch (about a minute): every
    arm evolved from the same reported answers and measured; the JSON, table and PNG written."""
    args = ["--model", "tiny", "--seeds", "0", "--batch", "6", "--gate-tasks", "3"]
    args += ["--max-tokens", "8", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "composite.json").read_text())
    assert [r["arm"] for r in data["runs"]] == ["base", "sft", "harness", "composite"]
    for run in data["runs"]:
        assert len(run["passed"]) == 16 and run["release_id"].startswith("rel_")
        assert run["status"] in ("base", "published", "nothing_to_train"), run
    trained = data["runs"][1:]
    assert {r["batch_answers_differing"] for r in trained} == {0}  # one batch, every arm
    assert set(data["runs"][3]["gate"]) == {"harness", "weights"}  # the composite's steps
    assert "| composite | " in data["table"] and "composite vs sft" in data["table"]
    assert (tmp_path / "composite.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
