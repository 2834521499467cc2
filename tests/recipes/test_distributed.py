"""The launch plumbing of recipes.distributed (reef.train.processes > 1): real `accelerate
launch` runs of two ranks whose recipe fails, or refuses its data, in a chosen rank; and the
recipes that cannot train in several processes refused with a ConfigError. The adapter a
two-rank run trains is compared with a one-process run in tests/flows/test_train_distributed.py
(slow)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from reef.datasets import SCHEMAS
from reef.errors import BadRequest, ConfigError
from reef.recipe import Progress, Trained, TrainJob, WeightsRecipe, load_recipe
from reef.recipes.distributed import TrainingFailed, launch
from reef.settings import load_settings

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class FailingParams:
    rank: int = 1  # the rank that fails
    how: str = "crash"  # crash: a RuntimeError | verdict: nothing_to_train | abort: SIGABRT


class FailingRecipe(WeightsRecipe):
    """Fails in one rank the way a recipe does: a bug (any exception) or a verdict on the
    data (a ReefError); the other ranks finish, as a rank that got past its own data would."""

    name = "failing"
    kind = "scored"
    Params = FailingParams
    distributed: ClassVar[bool] = True

    def train(self, job: TrainJob, progress: Progress | None = None) -> Trained:
        p: FailingParams = self.params
        if int(os.environ["RANK"]) == p.rank:
            if p.how == "verdict":
                # recipes.training.NothingToTrain, without importing torch into the ranks
                raise BadRequest(f"rank {p.rank} found nothing to learn", code="nothing_to_train")
            if p.how == "abort":  # as gloo's C++ does: a line on stderr, then abort()
                os.write(2, b"terminate called after throwing gloo::IoException on purpose\n")
                os.abort()
            raise RuntimeError(f"rank {p.rank} broke on purpose")
        return Trained("adapter", job.out_dir)


def job(tmp_path: Path) -> TrainJob:
    return TrainJob("s", tmp_path, SCHEMAS["scored"].empty_table(), tmp_path / "out")


@pytest.mark.loop  # a real launch: accelerate and two ranks each import torch (~15 s)
def test_a_crashing_rank_fails_the_launch_with_its_stderr(tmp_path: Path) -> None:
    """The default suite's one launch (~6 s idle, 12 s on a busy 2-core machine: the launcher
    imports torch): a rank's exception fails the task with that rank's stderr."""
    started = time.monotonic()
    with pytest.raises(TrainingFailed) as raised:
        launch(FailingRecipe(FailingParams(rank=1)), job(tmp_path), processes=2, threads=1)
    message = raised.value.message
    assert message.startswith("training rank 1 of 2 failed: rank 1 broke on purpose")
    # the rank's own stderr: the traceback, down to the line that raised
    tail = message.split("--- rank 1 stderr (tail) ---\n", 1)[1]
    assert "Traceback (most recent call last)" in tail
    assert 'raise RuntimeError(f"rank {p.rank} broke on purpose")' in tail
    assert raised.value.code == "training_failed"
    assert time.monotonic() - started < 60  # the surviving rank did not hang the launch


@pytest.mark.loop  # a real launch (~12 s on a busy 2-core machine; torch's import)
def test_a_rank_killed_in_c_fails_the_launch_with_every_ranks_stderr(tmp_path: Path) -> None:
    """A rank that dies without a Python error (gloo's abort, a signal) leaves no error file:
    the failure quotes each rank's own stderr, where the C library said why."""
    with pytest.raises(TrainingFailed) as raised:
        launch(FailingRecipe(FailingParams(1, "abort")), job(tmp_path), processes=2, threads=1)
    message = raised.value.message
    assert message.startswith("training in 2 processes exited with status 1 before a rank")
    rank1 = message.split("--- rank 1 stderr (tail) ---\n", 1)[1]
    assert rank1.startswith("terminate called after throwing gloo::IoException on purpose")
    assert "--- rank 0 stderr (tail) ---" in message
    assert "--- accelerate launch output (tail) ---" in message


@pytest.mark.loop  # a second launch (~12 s on a busy 2-core machine; torch's import)
def test_a_rank_verdict_reaches_the_worker_as_itself(tmp_path: Path) -> None:
    """nothing_to_train from a rank is the same verdict as from one process: flows.weights
    ends the run "nothing_to_train" on it instead of failing."""
    with pytest.raises(BadRequest, match="rank 0 found nothing to learn") as raised:
        launch(FailingRecipe(FailingParams(0, "verdict")), job(tmp_path), processes=2)
    assert raised.value.code == "nothing_to_train"


@pytest.mark.parametrize("recipe", ["sao", "openclaw", "tttd", "grpo"])
def test_single_process_recipes_are_refused(recipe: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"recipe '{recipe}' trains in one process") as raised:
        load_settings(None, reef={"recipe": recipe, "train": {"processes": 2}})
    assert "(sft, kto, dpo)" in raised.value.message
    assert load_settings(None, reef={"recipe": recipe}).reef.train.processes == 1
    with pytest.raises(ConfigError, match="trains in one process"):
        launch(load_recipe(recipe), job(tmp_path), processes=2)  # type: ignore[arg-type]


def test_a_missing_accelerate_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"accelerate_config .* is not a file"):
        launch(FailingRecipe(), job(tmp_path), processes=2, accelerate_config=tmp_path / "no")


def test_train_settings() -> None:
    loop = load_settings(None, reef={"train": {"processes": 2}}).reef
    assert loop.recipe == "sft" and loop.train.processes == 2
    assert loop.train.accelerate_config is None
    with pytest.raises(ConfigError, match=r"reef\.train\.processes"):
        load_settings(None, reef={"train": {"processes": 0}})
