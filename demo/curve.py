"""The learning curve: one step per release (step 0 is the base model), as a text table, a PNG
and an MLflow run "demo" beside the server's evolve runs."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Step:
    round: int  # 0: the base model, before any feedback
    release_id: str
    pass_rate: float  # on the held-out questions
    passed: int
    asked: int
    seconds: float  # this round: ask + report + evolve + deploy + measure
    evolve_seconds: float  # last report -> the new release is the head
    elapsed: float  # since the demo started
    train_pass_rate: float | None = None  # the round's training questions, before feedback
    correct: int | None = None  # held-out answers naming the reference answer (the guard)
    rejected: str | None = None  # the gate's reason, when this round's candidate was refused


def table(steps: list[Step]) -> str:
    lines = [
        "| round | release | held-out pass rate | held-out correct | training answers passing "
        "| round s | evolve s | elapsed s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in steps:
        train = "–" if s.train_pass_rate is None else f"{s.train_pass_rate:.0%}"
        right = "–" if s.correct is None else f"{s.correct / s.asked:.0%} ({s.correct}/{s.asked})"
        release = f"`{s.release_id}`" + (" (candidate rejected: head kept)" if s.rejected else "")
        lines.append(
            f"| {s.round} | {release} | {s.pass_rate:.0%} ({s.passed}/{s.asked}) | {right} | "
            f"{train} | {s.seconds:.1f} | {s.evolve_seconds:.1f} | {s.elapsed:.1f} |"
        )
    return "\n".join(lines)


def plot(
    steps: list[Step],
    path: Path,
    *,
    target: float | None,
    title: str,
    ylabel: str = "pass rate (≤ 5 words)",
    xlabel: str = "release (rounds of 8 reported answers)",
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    rounds = [s.round for s in steps]
    ax.plot(rounds, [s.pass_rate for s in steps], marker="o", color="#1f77b4", label="held-out")
    trained = [s for s in steps if s.train_pass_rate is not None]
    if trained:
        ax.plot(
            [s.round - 1 for s in trained],
            [s.train_pass_rate for s in trained],
            marker="x",
            linestyle=":",
            color="#999999",
            label="training questions (as asked)",
        )
    if target is not None:
        ax.axhline(
            target, color="#2ca02c", linestyle="--", linewidth=1, label=f"target {target:.0%}"
        )
    for s in steps:
        ax.annotate(
            f"{s.pass_rate:.0%}",
            (s.round, s.pass_rate),
            textcoords="offset points",
            xytext=(0, 7),
            ha="center",
            fontsize=8,
        )
    ax.set_xticks(rounds)
    ax.set_xticklabels(["base" if r == 0 else f"r{r}" for r in rounds])
    ax.set_ylim(-0.05, 1.1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def save_figures(artifacts_dir: Path, scenario: str, steps: list[Step], source: str) -> list[str]:
    """The held-out pass rate (and correctness, when measured) per release as figures of the
    scenario in the server's artifact store (reef.figures), which the dashboard's learning
    page plots. A round whose candidate was refused measured the head it kept: its point
    lands on that release again, the latest measurement winning."""
    from reef.artifacts import open_artifacts
    from reef.figures import Figure, Point, save_figure

    artifacts = open_artifacts(artifacts_dir)
    figures = [
        Figure(
            "held-out-pass-rate",
            "held-out pass rate",
            source,
            tuple(Point(s.release_id, s.pass_rate) for s in steps),
            order=0,  # the preference leads the dashboard's learning figures
        )
    ]
    correct = tuple(
        Point(s.release_id, s.correct / s.asked) for s in steps if s.correct is not None
    )
    if correct:
        figures.append(
            Figure("held-out-correct", "held-out answers correct", source, correct, order=1)
        )
    return [save_figure(artifacts, scenario, f) for f in figures]


def log_mlflow(
    tracking_uri: str,
    artifact_location: str,
    scenario: str,
    steps: list[Step],
    png: Path,
    params: dict[str, object],
) -> str:
    """One run "demo" in experiment reef/<scenario>: pass_rate per step, the PNG, the table."""
    import mlflow

    from reef.registry import ensure_experiment

    experiment = ensure_experiment(tracking_uri, f"reef/{scenario}", artifact_location)
    client = mlflow.MlflowClient(tracking_uri)
    run = client.create_run(experiment, run_name="demo", tags={"reef.demo": "preference"})
    run_id = run.info.run_id
    for key, value in params.items():
        client.log_param(run_id, key, value)
    for s in steps:
        client.log_metric(run_id, "pass_rate", s.pass_rate, step=s.round)
        client.log_metric(run_id, "round_seconds", s.seconds, step=s.round)
        client.log_metric(run_id, "evolve_seconds", s.evolve_seconds, step=s.round)
        if s.train_pass_rate is not None:
            client.log_metric(run_id, "train_pass_rate", s.train_pass_rate, step=s.round)
        if s.correct is not None:
            client.log_metric(run_id, "correct_rate", s.correct / s.asked, step=s.round)
    client.log_artifact(run_id, str(png))
    client.log_text(run_id, table(steps), "learning-curve.md")
    client.log_text(run_id, json.dumps([asdict(s) for s in steps], indent=2), "steps.json")
    client.set_terminated(run_id)
    return run_id
