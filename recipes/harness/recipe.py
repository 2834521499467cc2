"""The harness recipe: evolve the text around the model (rules, skills, prompt templates) from
low-scored answers and their feedback, searched with GEPA (reflective, Pareto-based evolution
of text components, the maintained `gepa` package).

The search sees the harness as one GEPA component: the tree's files as JSON. Evaluating a
candidate runs episodes (recipes.harness.episodes) on the scenario's served weights; GEPA's
reflection step is this recipe's proposer (recipes.harness.propose), which reads the answers
that scored low with their feedback and writes whole-file edits, so a proposal may create,
update or remove rules, skills and templates. GEPA keeps the proposals that beat their parent
on a minibatch and tracks the Pareto front over the tasks.

What the search returns is a candidate, not a release: the evolve flow evaluates it against
the head on held-out tasks (paired episodes, N repeats) and the gate of #4 decides. When GEPA
kept no proposal, its last proposal is the candidate, so the gate's held-out test, not GEPA's
small minibatch, has the last word (and its numbers are stored either way).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

from reef.errors import ReefError
from reef.harness import Harness
from reef.recipe import Recipe, ReportContract, Target
from reef.recipes.harness.episodes import Generate, Outcome, Scorer, Task, run_episode
from reef.recipes.harness.propose import (
    Ask,
    apply_valid,
    example_of,
    parse_edits,
    reflection_messages,
)

log = logging.getLogger(__name__)

COMPONENT = "harness"


@dataclass(frozen=True)
class HarnessParams:
    threshold: float = 0.5  # a reported answer scored below this is a failure to learn from
    max_examples: int = 8  # low-scored answers the search reflects on and is scored on
    repeats: int = 2  # N: episodes per task and side in the gate's paired evaluation
    temperature: float = 0.7  # evaluation episodes sample, seeded by repeat (0..N-1)
    max_tokens: int = 64  # per episode answer
    max_metric_calls: int = 24  # GEPA's budget of search episodes
    minibatch: int = 3  # GEPA's reflection minibatch
    # The proposer: an OpenAI-compatible base URL (ending in /v1) and model; None: the served
    # model (the scenario's head weights, through the engine). The API key is read from the
    # environment variable `proposer_api_key_env`, never from the config file.
    proposer_url: str | None = None
    proposer_model: str | None = None
    proposer_api_key_env: str = "REEF_PROPOSER_API_KEY"
    proposer_max_tokens: int = 512
    # Scores an episode's answer: a dotted path to (completions, **columns) -> list[float];
    # None: the answer's word F1 against the user's correction (tasks without one are skipped).
    scorer: str | None = None
    # POST /reef/train: "append" writes the ask as a rule; "model" asks the proposer first.
    instruct_mode: Literal["append", "model"] = "append"


@dataclass(frozen=True)
class HarnessJob:
    """What a search needs: the head's harness, tasks to reflect on, and the model calls."""

    scenario: str
    head: Harness
    tasks: Sequence[Task]  # low-scored answers' prompts, with their feedback for the scorer
    generate: Generate  # an episode's generation on the head's weights
    ask: Ask  # the proposer
    scorer: Scorer
    seed: int = 0


@dataclass(frozen=True)
class HarnessSearch:
    """The search's candidate (None: no proposal differed from the head) and its numbers."""

    harness: Harness | None
    source: Literal["search_best", "last_proposal", "none"]
    metrics: dict[str, float] = field(default_factory=dict)


def encode(harness: Harness) -> str:
    return json.dumps(dict(harness.files), sort_keys=True, indent=1)


def decode(text: str) -> Harness:
    return Harness(json.loads(text)).validate()


class _GepaAdapter:
    """GEPA's integration point: run a candidate harness on a batch, build the reflective
    dataset from its answers, and propose the next harness with the recipe's proposer."""

    def __init__(self, job: HarnessJob, progress: Callable[[str], None]):
        self.job = job
        self.progress = progress
        self.proposals: list[Harness] = []
        self.episodes = 0

    def evaluate(self, batch: list[Task], candidate: dict[str, str], capture_traces: bool = False):
        from gepa import EvaluationBatch

        harness = decode(candidate[COMPONENT])
        outcomes: list[Outcome] = []
        for task in batch:
            outcome = run_episode(self.job.generate, harness, task, self.job.seed, self.job.scorer)
            if outcome.infra_failure:  # systemic for a search: stop, the batch stays eligible
                raise ReefError(
                    f"search episode on task {task.task_id}: {outcome.error}",
                    code="engine_unavailable",
                )
            outcomes.append(outcome)
        self.episodes += len(batch)
        scores = [float(o.score or 0.0) for o in outcomes]
        traces = list(zip(batch, outcomes, strict=True)) if capture_traces else None
        return EvaluationBatch(
            outputs=[o.answer for o in outcomes], scores=scores, trajectories=traces
        )

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: Any, components_to_update: list[str]
    ) -> dict[str, list[dict[str, Any]]]:
        rows = [
            {**example_of(task.messages, task.columns), "answer": o.answer, "score": o.score}
            for task, o in eval_batch.trajectories or []
        ]
        return {COMPONENT: rows}

    def propose_new_texts(
        self,
        candidate: dict[str, str],
        reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
        components_to_update: list[str],
    ) -> dict[str, str]:
        current = decode(candidate[COMPONENT])
        reply = self.job.ask(reflection_messages(current, reflective_dataset[COMPONENT]))
        proposed = apply_valid(current, parse_edits(reply, current))
        self.proposals.append(proposed)
        self.progress(f"proposal {len(self.proposals)}: {len(reply)} characters from the proposer")
        return {COMPONENT: encode(proposed)}


class _Log:
    """GEPA's logger protocol, into the flow's progress lines."""

    def __init__(self, progress: Callable[[str], None]):
        self.progress = progress

    def log(self, message: str) -> None:
        self.progress(message)


class HarnessRecipe(Recipe):
    """Evolves the scenario's harness; the weights stay as they are."""

    name = "harness"
    kind = "scored"
    target: ClassVar[Target] = "harness"
    contract = ReportContract(score=True)
    Params = HarnessParams

    def task_scorer(self) -> Scorer:
        from reef.recipe import import_object
        from reef.recipes.harness.episodes import correction_scorer

        if self.params.scorer:
            scorer: Scorer = import_object(self.params.scorer, "recipe parameter 'scorer'")
            return scorer
        return correction_scorer

    def scorable(self, tasks: Sequence[Task]) -> list[Task]:
        """The tasks the scorer can score: with the default scorer, those with a correction."""
        if self.params.scorer:
            return list(tasks)
        return [t for t in tasks if t.columns.get("correction")]

    def search(
        self, job: HarnessJob, progress: Callable[[str], None] | None = None
    ) -> HarnessSearch:
        import gepa

        say = progress or (lambda message: log.info("%s", message))
        p = self.params
        tasks = list(job.tasks)[: p.max_examples]
        if not tasks:
            return HarnessSearch(None, "none", {"search_tasks": 0.0})
        adapter = _GepaAdapter(job, say)
        result: Any = gepa.optimize(
            seed_candidate={COMPONENT: encode(job.head)},
            trainset=tasks,
            adapter=cast(Any, adapter),  # GEPA's Protocol, duck-typed
            reflection_minibatch_size=min(p.minibatch, len(tasks)),
            max_metric_calls=max(p.max_metric_calls, 2 * len(tasks) + 1),
            logger=_Log(say),
            seed=job.seed,
            raise_on_exception=True,
            display_progress_bar=False,
        )
        scores = list(result.val_aggregate_scores)
        best = decode(result.best_candidate[COMPONENT])
        metrics = {
            "search_tasks": float(len(tasks)),
            "search_episodes": float(adapter.episodes),
            "search_proposals": float(len(adapter.proposals)),
            "search_kept": float(len(result.candidates) - 1),
            "search_head_score": float(scores[0]),
            "search_best_score": float(max(scores)),
        }
        head_hash = job.head.content_hash()
        if best.content_hash() != head_hash:
            return HarnessSearch(best, "search_best", metrics)
        changed = [h for h in adapter.proposals if h.content_hash() != head_hash]
        if changed:
            return HarnessSearch(changed[-1], "last_proposal", metrics)
        return HarnessSearch(None, "none", metrics)
