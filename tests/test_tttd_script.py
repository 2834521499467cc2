"""scripts/tttd_gpu.sh's CPU path: the whole discovery loop (harness → Reef's live inference →
reports with grid metadata → the evolve worker's tttd step → a deployed release) on the tiny
model and a tiny grid, printing the best Σr per step as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # the loop itself is tests/flows/test_evolve_tttd.py (CI); this is its script
@pytest.mark.timeout(900)
def test_the_cpu_path_prints_best_per_step(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "TTTD_STATE_DIR": str(tmp_path / "run"),
        "TTTD_STEPS": "2",
    }
    env.pop("PREFECT_API_URL", None)  # the server's evolve worker runs its flows itself
    done = subprocess.run(
        [str(ROOT / "scripts" / "tttd_gpu.sh"), "--cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    steps = [line for line in lines if "step" in line]
    summary = lines[-1]["summary"]
    assert [s["step"] for s in steps] == [0, 1]
    baseline = summary["baseline"]
    assert baseline == pytest.approx(1.0)  # the 2x2 grid seed for N = 4
    assert all(s["best"] >= baseline for s in steps)  # non-decreasing from the seed
    assert steps[0]["best"] <= steps[1]["best"]
    # each step's grid trained a release that served the next step
    assert steps[0]["next_release_id"] == steps[1]["release_id"]
    assert steps[1]["next_release_id"] not in (None, steps[1]["release_id"])
    assert all(s["kl_to_base"] is not None for s in steps)
    # the archive and best program are on disk, resumable
    run = tmp_path / "run" / "ttt-s0"  # one directory per arm and seed (--seeds, default 0)
    archive = json.loads((run / "archive.json").read_text())
    assert archive["steps_done"] == 2
    assert (run / "best.py").read_text().startswith("import numpy")
