"""A weights recipe's training in N processes, under `accelerate launch` (reef.train.processes).

The worker (flows.weights.train) writes the recipe and its TrainJob to a work directory and
starts `accelerate launch --num_processes N -m reef.recipes.distributed <dir>`: accelerate starts the
ranks through torch.distributed.run, every rank rebuilds the recipe and the job and runs the
recipe's own `train`, and the transformers Trainer under it wraps the model in DDP (gloo on
CPU, NCCL on GPUs), shards each global batch across the ranks and averages the gradients. Rank 0
saves the candidate (recipes.training.fit) and writes the Trained result for the worker.

Each rank's stderr goes to `rank<N>.stderr` in the work directory, and a rank that raises
leaves its exception in `rank<N>.error`: when the launch fails, the worker raises the first
failing rank's error, a Reef verdict (nothing_to_train) as itself, anything else as a
TrainingFailed that quotes the rank's stderr tail.

The launch is a plain subprocess of the worker, on the worker's host: the pickles it reads are
the ones this worker wrote a moment before into its own temporary directory.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reef.errors import ConfigError, ReefError
from reef.recipe import Progress, Trained, TrainJob, WeightsRecipe, distributed_refusal

# A line on a rank's stdout that carries rank 0's progress to the worker (JSON after it).
_PROGRESS = "reef-train-progress "
_STDERR_TAIL = 4000  # characters of a failed rank's stderr quoted in the error


class TrainingFailed(ReefError):
    """A training process exited with an error that is not a Reef verdict."""

    code = "training_failed"


def launch(
    recipe: WeightsRecipe,
    job: TrainJob,
    *,
    processes: int,
    accelerate_config: Path | None = None,
    threads: int | None = None,
    progress: Progress | None = None,
) -> Trained:
    """Train `recipe` on `job` in `processes` ranks under accelerate; rank 0's Trained.

    Without `accelerate_config` the ranks are plain DDP on this host (`--multi_gpu`: torch's
    launcher; on a host without GPUs every rank uses the CPU and the gloo backend). With one,
    its distributed type (multi-GPU, FSDP, DeepSpeed, ...) decides, and `processes` still sets
    how many. `threads` sets each rank's torch threads (OMP_NUM_THREADS, which torch reads at
    import; torch's launcher sets 1 when it is unset).
    """
    refused = distributed_refusal(type(recipe), processes)
    if refused:
        raise ConfigError(refused)
    if accelerate_config is not None and not accelerate_config.is_file():
        raise ConfigError(f"reef.train.accelerate_config {accelerate_config} is not a file here")
    with tempfile.TemporaryDirectory(prefix="reef-train-") as tmp:
        work = Path(tmp)
        with (work / "job.pkl").open("wb") as f:
            pickle.dump({"recipe": recipe, "job": job, "processes": processes}, f)
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes"]
        cmd += [str(processes), "--num_machines", "1", "--main_process_port", "0", "--quiet"]
        if accelerate_config is not None:
            cmd += ["--config_file", str(accelerate_config)]
        else:
            cmd += ["--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no"]
        cmd += ["-m", "reef.recipes.distributed", str(work)]
        env = dict(os.environ)
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        returncode, output = _run(cmd, env, work / "launcher.log", progress)
        if returncode != 0:
            raise _failure(work, processes, returncode, output)
        result = work / "result.pkl"
        if not result.is_file():
            raise TrainingFailed(f"training in {processes} processes wrote no result (rank 0)")
        with result.open("rb") as f:
            trained: Trained = pickle.load(f)
        return trained


def _run(
    cmd: list[str], env: dict[str, str], log: Path, progress: Progress | None
) -> tuple[int, str]:
    """Run the launcher: rank 0's progress lines go to `progress`, the rest of its output and
    of the ranks' stdout to `log`. Returns (exit status, the log's tail)."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=out, text=True, bufsize=1
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(_PROGRESS):
                if progress is not None:
                    step, total, metrics = json.loads(line.removeprefix(_PROGRESS))
                    progress(step, total, metrics)
            else:
                out.write(line)
        returncode = proc.wait()
    return returncode, _tail(log)


def _failure(work: Path, processes: int, returncode: int, output: str) -> ReefError:
    """The error a failed launch raises: the lowest rank that raised (its own ReefError, or
    TrainingFailed with its stderr tail), else the launcher's output (it failed to start)."""
    for rank in range(processes):
        error = work / f"rank{rank}.error"
        if not error.is_file():
            continue
        with error.open("rb") as f:
            raised = pickle.load(f)
        if isinstance(raised, ReefError):
            return raised
        return TrainingFailed(
            f"training rank {rank} of {processes} failed: {raised}\n"
            f"--- rank {rank} stderr (tail) ---\n{_tail(work / f'rank{rank}.stderr')}"
        )
    # No rank raised: one died in C (gloo's abort, a signal). Its own stderr says why.
    ranks = "".join(
        f"--- rank {rank} stderr (tail) ---\n{_tail(work / f'rank{rank}.stderr')}\n"
        for rank in range(processes)
    )
    return TrainingFailed(
        f"training in {processes} processes exited with status {returncode} before a rank "
        f"reported an error\n{ranks}--- accelerate launch output (tail) ---\n{output}"
    )


def _tail(path: Path) -> str:
    if not path.is_file():
        return "(none)"
    return path.read_text(errors="replace")[-_STDERR_TAIL:]


def _rank_main(work: Path) -> None:
    """One rank: train the recipe on the job; rank 0 writes the result."""
    rank = int(os.environ.get("RANK", "0"))
    stderr = os.open(work / f"rank{rank}.stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(stderr, 2)  # the rank's own stderr, C libraries' (gloo, torch) included
    try:
        with (work / "job.pkl").open("rb") as f:
            spec = pickle.load(f)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != spec["processes"]:
            raise TrainingFailed(
                f"accelerate started {world} process(es), reef.train.processes is "
                f"{spec['processes']}: the accelerate config's distributed_type must start "
                "one process per rank on this host (MULTI_GPU, FSDP, DEEPSPEED; MULTI_CPU "
                "needs mpirun)"
            )
        trained = spec["recipe"].train(spec["job"], _progress_printer(rank))
        if rank == 0:
            partial = work / "result.pkl.partial"
            with partial.open("wb") as f:
                pickle.dump(trained, f)
            partial.rename(work / "result.pkl")
        _leave_together()
    except BaseException as e:
        traceback.print_exc()
        sys.stderr.flush()
        (work / f"rank{rank}.error").write_bytes(_portable(e))
        raise SystemExit(1) from None


def _leave_together() -> None:
    """Wait for every rank, then close the process group before the interpreter exits.

    Rank 0 saves the candidate while the others are done: a rank that exited with its gloo
    group still open was torn down by C++ destructors under gloo's threads, and now and then
    aborted (SIGABRT, no Python error) while rank 0 was still writing.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _portable(error: BaseException) -> bytes:
    """`error` pickled when it unpickles as itself (a ReefError keeps its class and code),
    else a RuntimeError with its text."""
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
        return data
    except Exception:
        return pickle.dumps(RuntimeError(f"{type(error).__name__}: {error}"))


def _progress_printer(rank: int) -> Callable[[int, int, Any], None] | None:
    """Rank 0 prints its progress for the worker (the ranks step together)."""
    if rank != 0:
        return None

    def printer(step: int, total: int, metrics: Any) -> None:
        print(_PROGRESS + json.dumps([step, total, dict(metrics)]), flush=True)

    return printer


if __name__ == "__main__":
    # Run as recipes.distributed, not __main__, so what a rank pickles (TrainingFailed)
    # unpickles in the worker.
    from reef.recipes.distributed import _rank_main as rank_main

    rank_main(Path(sys.argv[1]))
