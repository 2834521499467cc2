"""The discovery loop, environment side: a client of Reef that talks only HTTP.

Each step: pick G parents from the PUCT archive, ask Reef for R rollouts per parent
(/v1/chat/completions with `x-reef-scenario`, all G·R at once so the engine batches them), run
and verify every program, report each verified score against its receipt with the step-grid
metadata (/reef/report), update and save the archive, and — when learning — wait until Reef's
evolve worker has trained that grid and deployed the new release, which serves the next step.

Modes, at the same rollout budget: "ttt" (reports, Reef trains a LoRA step per grid),
"search" (the same PUCT, no reports: the frozen base model), "random": with the program action,
every rollout starts from the seeded baseline, no archive feedback (best-of-N sampling from the
frozen model); with an edit action (demo/discover/actions.py), the same PUCT with uniformly
random proposals in that format instead of the model (no model at all).
"""

from __future__ import annotations

import json
import random
import secrets
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import httpx
import openai

from demo.discover import actions
from demo.discover.archive import Archive, State
from demo.discover.packing import Judged
from demo.discover.sandbox import Limits
from demo.discover.verifier import invalid
from reef.artifacts import ArtifactStore
from reef.errors import NotFound
from reef.recipes.tttd.grid import grid_metadata

Mode = Literal["ttt", "search", "random"]


@dataclass(frozen=True)
class Config:
    n: int = 5  # circles
    groups: int = 2  # G
    rollouts: int = 4  # R (never 2)
    steps: int = 4
    max_tokens: int = 320
    temperature: float = 1.0  # §3.3: T 1, top-p 1
    mode: Mode = "ttt"
    limits: Limits = field(default_factory=lambda: Limits(wall_s=20.0))
    judges: int = 2  # programs run at once
    release_timeout_s: float = 900.0
    action: str = "program"  # what a rollout answers: demo/discover/actions.py
    seed: int = 0  # the run's sampling seeds (each rollout's) and the random proposer's
    constrained: bool = False  # the engine enforces the action's schema (edits only)
    start: str = "grid"  # the edit actions' seeded circles: actions.seed_state

    def __post_init__(self) -> None:
        if self.action not in actions.ACTIONS:
            raise ValueError(f"action must be one of {', '.join(actions.ACTIONS)}")
        if self.constrained and actions.response_format(self.action, self.n) is None:
            raise ValueError(f"the {self.action} action has no schema to enforce: edits has")
        if self.start not in actions.STARTS:
            raise ValueError(f"start must be one of {', '.join(actions.STARTS)}")
        if self.start != "grid" and self.action == "program":
            raise ValueError("the program action starts from its baseline program only")


@dataclass(frozen=True)
class StepResult:
    step: int
    mode: str
    release_id: str  # the release that served the step's rollouts
    best: float  # best archive value after the step
    mean_reward: float
    valid_fraction: float
    rollouts: int
    seconds: float
    kl_to_base: float | None = None  # of the release this step's grid trained (ttt)
    next_release_id: str | None = None


class Reef:
    """Reef as an application sees it: the OpenAI SDK for inference, plain HTTP for reports
    and the release chain."""

    def __init__(self, url: str, scenario: str, model: str):
        self.url = url.rstrip("/")
        self.scenario = scenario
        self.model = model
        headers = {"x-reef-scenario": scenario}
        self.client = openai.OpenAI(
            base_url=f"{self.url}/v1",
            api_key="unused",
            default_headers=headers,
            max_retries=0,
            timeout=900,
        )
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=60.0)

    def close(self) -> None:
        self.client.close()
        self.http.close()

    def chat(
        self, messages: list[dict[str, str]], cfg: Config, seed: int | None = None
    ) -> tuple[str, str, str]:
        """(text, receipt, release id) of one rollout."""
        fmt = actions.response_format(cfg.action, cfg.n) if cfg.constrained else None
        raw = self.client.chat.completions.with_raw_response.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=cfg.max_tokens,
            temperature=cfg.temperature,
            top_p=1.0,
            seed=seed,
            extra_body={"response_format": fmt} if fmt else None,
        )
        text = raw.parse().choices[0].message.content or ""
        return text, raw.headers["x-reef-agent-record-id"], raw.headers["x-reef-release-id"]

    def report(self, receipt: str, score: float, reason: str, meta: dict, report_id: str) -> int:
        """POST /reef/report; 201 stored, 200 an identical retry, 409 the slot's id was used
        with other content (the first report at a slot wins)."""
        body = {
            "report_id": report_id,
            "references": [receipt],
            "score": score,
            "feedback": reason,
            "metadata": meta,
        }
        r = self.http.post("/reef/report", json=body)
        if r.status_code not in (200, 201, 409):
            raise RuntimeError(f"POST /reef/report: {r.status_code} {r.text}")
        return r.status_code

    def releases(self) -> list[dict[str, Any]]:
        r = self.http.get(f"/reef/scenarios/{self.scenario}/releases")
        if r.status_code == 404:
            return []
        r.raise_for_status()
        return list(r.json()["data"])

    def head(self) -> dict[str, Any] | None:
        return next((r for r in self.releases() if r["current"]), None)

    def wait_for_release(
        self, previous: str, timeout_s: float, check: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """Poll the chain until the head is no longer `previous`; `check` may raise (the demo
        uses it to surface an evolve failure from the server's log)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check is not None:
                check()
            head = self.head()
            if head is not None and head["release_id"] != previous:
                return head
            time.sleep(0.5)
        raise TimeoutError(f"no new release of {self.scenario} within {timeout_s:.0f}s")


def new_archive(cfg: Config) -> Archive:
    """G seeds, each the verified baseline (a program, or its circles for an edit action), so
    the G groups start independent lines (§3.6: the seeds are the baseline, children mostly
    edit its numbers)."""
    archive = Archive()
    program = actions.seed(cfg.action, cfg.n, cfg.start)
    verdict = actions.verify_seed(cfg.action, program, cfg.n, cfg.limits)
    if not verdict.valid:
        raise RuntimeError(f"the baseline program is invalid: {verdict.reason}")
    for _ in range(cfg.groups):
        archive.seed(program, verdict.reward, verdict.reason)
    return archive


def _puct(cfg: Config) -> bool:
    """Whether the step's parents come from the PUCT archive (all but the program action's
    random arm, which samples from the seeded baseline)."""
    return cfg.mode != "random" or cfg.action != "program"


def _parents(archive: Archive, cfg: Config) -> list[State]:
    if not _puct(cfg):
        seeds = sorted((s for s in archive.states.values() if s.seed), key=lambda s: s.id)
        return seeds[: cfg.groups]
    return archive.select(cfg.groups)


class ArchiveStore:
    """A discovery's resume point in an artifact store (reef.artifacts: a directory or
    s3://bucket/prefix), under `discover/<scenario>/`, besides its local directory: a run
    resumed on another machine (or after losing its disk) reads the archive, the best program
    and its score, the per-step log and the run id (its report ids) from there.

    One discovery per scenario: the scenario's release chain is the run's trajectory (each
    step's LoRA release serves the next). The archive is written last, so it is the commit
    point: a push cut short leaves the previous archive, and the step log is cut to the steps
    the archive says are done when read back."""

    FILES = ("run_id", "steps.jsonl", "best.json", "best.py", "archive.json")

    def __init__(self, artifacts: ArtifactStore, scenario: str):
        self.artifacts = artifacts
        self.prefix = f"discover/{scenario}"

    def __repr__(self) -> str:
        return self.artifacts.uri(self.prefix)

    def push(self, state_dir: Path) -> None:
        """Copy the local files up, the archive last."""
        for name in self.FILES:
            path = state_dir / name
            if path.is_file():
                self.artifacts.put_bytes(f"{self.prefix}/{name}", path.read_bytes())

    def steps_done(self) -> int | None:
        """How many steps the stored archive has done; None when there is none."""
        try:
            data = self.artifacts.get_bytes(f"{self.prefix}/archive.json")
        except NotFound:
            return None
        return Archive.from_dict(json.loads(data)).steps_done

    def pull(self, state_dir: Path) -> None:
        """Copy the stored files down (the archive last), replacing local ones."""
        for name in self.FILES:
            try:
                data = self.artifacts.get_bytes(f"{self.prefix}/{name}")
            except NotFound:
                continue
            tmp = state_dir / f"{name}.tmp"
            tmp.write_bytes(data)
            tmp.replace(state_dir / name)


def save(
    archive: Archive,
    state_dir: Path,
    results: list[StepResult],
    store: ArchiveStore | None = None,
) -> None:
    """The step's artifacts: the archive (resume point), the best program and its score, and
    the per-step log; each written atomically, then copied to `store` when there is one."""
    best = archive.best()
    _write(state_dir / "best.json", json.dumps({"reward": best.value, "state": asdict(best)}))
    _write(state_dir / "best.py", best.program or "")
    _write(state_dir / "steps.jsonl", "".join(json.dumps(asdict(r)) + "\n" for r in results))
    archive.save(state_dir / "archive.json")
    if store is not None:
        store.push(state_dir)


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def load_results(state_dir: Path) -> list[StepResult]:
    path = state_dir / "steps.jsonl"
    if not path.exists():
        return []
    return [StepResult(**json.loads(line)) for line in path.read_text().splitlines() if line]


def _answers(
    reef: Reef, jobs: list[tuple[int, int, State]], cfg: Config, step: int
) -> list[tuple[str, str, str]]:
    """(text, receipt, release id) per job: the model's answers, all asked at once so the engine
    batches them, each with its own seed; or, for an edit action's random arm, random proposals
    in the action's format (no receipt, no release)."""
    seeds = [cfg.seed * 1_000_003 + step * 1009 + g * 101 + r for g, r, _ in jobs]
    if cfg.mode == "random" and cfg.action != "program":
        return [
            (actions.random_answer(cfg.action, random.Random(s), cfg.n, p.program or ""), "", "")
            for s, (_, _, p) in zip(seeds, jobs, strict=True)
        ]

    def ask(job: tuple[int, int, State], seed: int) -> tuple[str, str, str]:
        p = job[2]
        messages = actions.prompt(
            cfg.action, cfg.n, p.program, p.value, p.output, constrained=cfg.constrained
        )
        return reef.chat(messages, cfg, seed)

    with ThreadPoolExecutor(max_workers=len(jobs)) as ex:
        return list(ex.map(ask, jobs, seeds))


def _update(
    archive: Archive,
    cfg: Config,
    step: int,
    parents: list[State],
    jobs: list[tuple[int, int, State]],
    judged: list[Judged],
) -> None:
    """The archive after the step: PUCT's update per group, or (the program action's random
    arm) the step's best valid program added when it beats the archive."""
    if _puct(cfg):
        for g, parent in enumerate(parents):
            children = [
                State(
                    0,
                    j.program,
                    j.verdict.reward,
                    j.verdict.reward,
                    parent.id,
                    False,
                    j.verdict.reason,
                )
                for (jg, _, _), j in zip(jobs, judged, strict=True)
                if jg == g and j.verdict.valid
            ]
            archive.update(parent.id, children, cfg.rollouts, step)
        return
    best = max((j for j in judged if j.verdict.valid), key=lambda j: j.verdict.reward, default=None)
    if best is not None and best.verdict.reward > archive.best().value:
        v = best.verdict
        archive.add(State(0, best.program, v.reward, v.reward, None, False, v.reason, step=step))


UNCHANGED = "unchanged: the answer left its parent's circles as they were"


def _changed(judged: Judged, parent: State, cfg: Config) -> Judged:
    """An edit action's answer that leaves its parent's circles as they were scores as invalid
    (0): it discovers nothing. Scored as the parent, every such copy beats the group's worse
    attempts, and the learner learned to copy: in the constrained CPU runs, one LoRA step at
    lr 1e-3 took every rollout's reward to exactly the parent's. The program action keeps its
    rule (a program is scored by what it builds)."""
    if cfg.action == "program" or not judged.verdict.valid or judged.program != parent.program:
        return judged
    return Judged(None, invalid(UNCHANGED), judged.seconds)


def run_step(
    reef: Reef, archive: Archive, cfg: Config, step: int, run_id: str
) -> tuple[StepResult, str]:
    """One step of G groups × R rollouts; returns its result and the serving release."""
    started = time.monotonic()
    parents = _parents(archive, cfg)
    jobs = [(g, r, parents[g]) for g in range(cfg.groups) for r in range(cfg.rollouts)]
    answers = _answers(reef, jobs, cfg, step)

    def judge(a: tuple[tuple[str, str, str], tuple[int, int, State]]) -> Judged:
        return actions.judge(cfg.action, a[0][0], cfg.n, a[1][2].program or "", cfg.limits)

    with ThreadPoolExecutor(max_workers=cfg.judges) as ex:
        judged = [
            _changed(j, job[2], cfg)
            for j, job in zip(ex.map(judge, zip(answers, jobs, strict=True)), jobs, strict=True)
        ]
    releases = {a[2] for a in answers}
    if cfg.mode == "ttt":
        for (g, r, _), (_, receipt, _), j in zip(jobs, answers, judged, strict=True):
            meta = grid_metadata(step, g, r, cfg.groups, cfg.rollouts)
            report_id = f"tttd-{run_id}-{step}-{g}-{r}"
            reef.report(receipt, j.verdict.reward, j.verdict.reason, meta, report_id)
    _update(archive, cfg, step, parents, jobs, judged)
    rewards = [j.verdict.reward for j in judged]
    result = StepResult(
        step=step,
        mode=cfg.mode,
        release_id=",".join(sorted(releases)),
        best=archive.best().value,
        mean_reward=statistics.fmean(rewards),
        valid_fraction=sum(j.verdict.valid for j in judged) / len(judged),
        rollouts=len(judged),
        seconds=time.monotonic() - started,
    )
    return result, next(iter(releases))


def discover(
    reef: Reef,
    cfg: Config,
    state_dir: Path,
    say: Callable[[str], None] = print,
    check: Callable[[], None] | None = None,
    store: ArchiveStore | None = None,
) -> list[StepResult]:
    """Run (or resume) the discovery in `state_dir` until `cfg.steps` steps are done. With a
    `store`, every step is saved there too, and a stored archive further along than the local
    one (or where there is none: another machine) is where the run resumes."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "archive.json"
    if store is not None:
        stored = store.steps_done()
        local = Archive.load(path).steps_done if path.exists() else None
        if stored is not None and (local is None or stored > local):
            store.pull(state_dir)
            say(f"{cfg.mode}: archive read from {store} ({stored} steps done)")
    archive = Archive.load(path) if path.exists() else new_archive(cfg)
    results = load_results(state_dir)[: archive.steps_done]
    run_file = state_dir / "run_id"
    if not run_file.exists():
        run_file.write_text(secrets.token_hex(4))
    run_id = run_file.read_text().strip()
    if archive.steps_done:
        say(f"resuming {cfg.mode} at step {archive.steps_done} (best {archive.best().value:.6f})")
    else:
        save(archive, state_dir, results, store)
        say(f"{cfg.mode}: seeded baseline, sum of radii {archive.best().value:.6f}")
    while archive.steps_done < cfg.steps:
        step = archive.steps_done
        started = time.monotonic()
        result, served = run_step(reef, archive, cfg, step, run_id)
        if cfg.mode == "ttt":
            # The step is done when Reef serves what it trained on the step's grid.
            head = reef.wait_for_release(served, cfg.release_timeout_s, check)
            kl = (head.get("metrics") or {}).get("train_kl_to_base")
            result = replace(
                result,
                kl_to_base=kl,
                next_release_id=head["release_id"],
                seconds=time.monotonic() - started,
            )
        archive.steps_done += 1
        results.append(result)
        save(archive, state_dir, results, store)
        say(
            f"{cfg.mode} step {step}: best {result.best:.6f}  mean reward "
            f"{result.mean_reward:.4f}  valid {result.valid_fraction:.0%}  "
            f"{result.seconds:.1f}s"
            + (f"  KL {result.kl_to_base:.4g}" if result.kl_to_base is not None else "")
        )
    return results
