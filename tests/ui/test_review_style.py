"""A reviewer's corrections teach SmolLM2 a style, and the next release serves it on questions
nobody reviewed (the reviewer loop on the real model; `make test-demo`, minutes on two cores).

A `reef serve --model smollm2` with its evolve worker (sft, the demo's LoRA recipe at 8
epochs; gate `always`, no hold-out) queues every turn (review.sample 1). The app asks plain questions through
the official openai SDK, with no instruction about length: SmolLM2 answers in sentences. A
reviewer works through the annotation queue over the dashboard's own routes (take, the review
form with its CSRF token, skip: the HTTP a browser sends; tests/ui/test_review_browser.py drives
the same pages with the keyboard in Chromium) and corrects the first eight answers longer than
five words to the short answer they should have been ("Paris."), skipping the short ones.
Those eight reviews are the batch: the worker trains on them, the gate releases the candidate.

Measured before and after, through the openai SDK at temperature 0 on 16 held-out questions
never served for review: how many answers are in the corrected style (one to five words; one
sentence, the looser style, is counted too), and, so that a style bought with wrong answers
shows, how many still name the right answer. The numbers are printed (`REVIEW_STYLE {...}`;
REEF_REVIEW_STYLE_OUT=<file> also writes them with every answer) and docs/ui.md states what
this test measured.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from demo.__main__ import RECIPE_PARAMS
from demo.preference import HELD_OUT, HELD_OUT_KEYS, TRAIN, correct, score
from reef.api.auth import hash_token
from reef.testing.process import ReefServer
from tests.reefserver import wait_for

pytestmark = [pytest.mark.demo, pytest.mark.timeout(1500)]

ADMIN, RITA = "style-admin", "style-rita"
SCENARIO = "terse-review"
CORRECTIONS = 8  # the batch: the reviewer's corrections are all the worker trains on
MAX_TOKENS = 24
# The demo's SmolLM2 recipe (demo/__main__.py: LoRA r16/alpha32, batch 4, lr 3e-4) with 8
# epochs instead of 4. The demo's system prompt asks for five words; here only the eight
# corrections say it, and at 4 epochs the release learned "one sentence" (5 -> 16 of 16) but
# not yet "five words" (1 -> 5 of 16), measured twice, the same both times (docs/ui.md).
RECIPE = {**RECIPE_PARAMS, "epochs": 8}
# A real rise: at least this many more of the 16 held-out answers in the corrected style
# (measured: 1 -> 15); and the style not bought with most right answers (measured: 9 -> 7).
MIN_RISE = 8
MAX_RIGHT_LOST = 4


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    tmp = tmp_path_factory.mktemp("review-style")
    cfg = tmp / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "auth": {
                    "tokens": [
                        {"name": "ops", "sha256": hash_token(ADMIN), "admin": True},
                        {
                            "name": "rita",
                            "sha256": hash_token(RITA),
                            "scenarios": [SCENARIO],
                            "reviewer": True,
                        },
                    ]
                },
                # the 16 held-out questions in one engine batch, on every core
                "engine": {
                    "embedded": {"max_batch_size": len(HELD_OUT), "threads": os.cpu_count() or 1}
                },
                "reef": {"recipe": "sft", "batch_size": CORRECTIONS, "params": RECIPE},
                "gate": {"policy": "always", "holdout": 0.0},
                "scenarios": {SCENARIO: {"review": {"sample": 1.0}}},
            }
        )
    )
    # One torch thread trains 3-4x faster than two on two shared cores (demo/__main__.py).
    env = {"REEF_REEF__AUTO": "true", "OMP_NUM_THREADS": "1"}
    srv = ReefServer(tmp / "state", "-c", str(cfg), "--model", "smollm2", env=env)
    srv.start(timeout_s=300)  # SmolLM2 loads in the serving engine first
    try:
        yield srv
    finally:
        srv.stop()


def _client(srv: ReefServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{srv.url}/v1",
        api_key=ADMIN,
        default_headers={"x-reef-scenario": SCENARIO},
        max_retries=0,
        timeout=300,
    )


@dataclass(frozen=True)
class Answer:
    text: str
    finished: bool  # ended by the model (finish_reason stop), not cut at MAX_TOKENS
    record_id: str
    release_id: str


def _ask(client: openai.OpenAI, question: str) -> Answer:
    """One plain question (no word about length) at temperature 0."""
    raw = client.chat.completions.with_raw_response.create(
        model="smollm2",
        messages=[{"role": "user", "content": question}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    choice = raw.parse().choices[0]
    return Answer(
        choice.message.content or "",
        choice.finish_reason == "stop",
        raw.headers["x-reef-agent-record-id"],
        raw.headers["x-reef-release-id"],
    )


def _held_out(srv: ReefServer, release_id: str) -> list[Answer]:
    """The 16 held-out answers of `release_id` (all at once: the engine batches them)."""
    with _client(srv) as client, ThreadPoolExecutor(len(HELD_OUT)) as pool:
        for _ in range(10):
            got = list(pool.map(lambda qa: _ask(client, qa[0]), HELD_OUT))
            if {g.release_id for g in got} == {release_id}:
                return got
    raise AssertionError(f"release {release_id} never answered the held-out questions")


_END = re.compile(r"[.!?](?=\s|$)")  # a sentence's end ("6.3" is none)


def one_sentence(answer: Answer) -> bool:
    """The corrected style: one sentence, ended (by the model, not by the token limit)."""
    text = answer.text.strip()
    return answer.finished and len(_END.findall(text)) == 1 and bool(_END.search(text[-1:]))


def _counts(answers: list[Answer]) -> dict[str, int]:
    """How many answers are one sentence, how many 1-5 words (the reviewer's corrections are
    both), and how many still name the right answer."""
    return {
        "one_sentence": sum(one_sentence(a) for a in answers),
        "five_words": sum(int(score(a.text)) for a in answers),
        "right": sum(correct(a.text, HELD_OUT_KEYS[i]) for i, a in enumerate(answers)),
    }


def _field(html: str, name: str) -> str:
    found = re.search(rf'name="{re.escape(name)}" value="([^"]+)"', html)
    assert found, f"no {name} field on the page"
    return found.group(1)


def _current_form(html: str, record_id: str) -> str:
    """The review form of the queue's current turn on its page."""
    start = html.index(f'<li class="turn current" id="{record_id}"')
    return html[start : html.index("</li>", start)]


def _review(srv: ReefServer, references: dict[str, str]) -> dict[str, str]:
    """The reviewer takes the queue's turns oldest first and corrects the answers longer than
    five words to their reference answer (score 1 of 5), skipping the short ones, until
    CORRECTIONS are corrected. Returns record id -> correction."""
    corrected: dict[str, str] = {}
    with httpx.Client(base_url=srv.url, follow_redirects=False, timeout=120) as ui:
        r = ui.post("/ui/login", data={"token": RITA, "next": "/ui"})
        assert r.status_code == 303, r.text
        csrf = _field(ui.get(f"/ui/s/{SCENARIO}/queue").text, "csrf")
        at = ui.post(f"/ui/s/{SCENARIO}/queue/take", data={"csrf": csrf})
        while len(corrected) < CORRECTIONS:
            assert at.status_code == 303 and "item=" in at.headers["location"], at.headers
            record_id = at.headers["location"].rsplit("#", 1)[1]
            assert record_id in references, "the queue gave a turn not asked for review"
            html = ui.get(at.headers["location"]).text
            form = _current_form(html, record_id)
            answer = re.search(r'role-assistant">.*?class="body">(.*?)</div>', form, re.S)
            assert answer is not None
            item = _field(form, "item")
            if score(answer.group(1)):  # already short: nothing to correct
                at = ui.post(f"/ui/s/{SCENARIO}/queue/skip", data={"csrf": csrf, "item": item})
                continue
            review = {
                "csrf": csrf,
                "record_id": record_id,
                "report_id": _field(form, "report_id"),
                "item": item,
                "score": "0",
                "correction": references[record_id],
            }
            at = ui.post(f"/ui/s/{SCENARIO}/review", data=review)
            corrected[record_id] = references[record_id]
    return corrected


def test_reviewer_corrections_make_the_next_release_answer_in_their_style(
    reef: ReefServer,
) -> None:
    admin = {"authorization": f"Bearer {ADMIN}"}
    r = httpx.post(f"{reef.url}/reef/scenarios", headers=admin, json={"name": SCENARIO})
    assert r.status_code in (201, 409), r.text
    base = httpx.get(f"{reef.url}/reef/scenarios/{SCENARIO}", headers=admin).json()
    base_id = base["head_release_id"]
    # the turns for review: training questions until enough answers break the style
    references: dict[str, str] = {}
    long_ones = 0
    with _client(reef) as client:
        for question, reference in TRAIN:
            got = _ask(client, question)
            references[got.record_id] = reference
            long_ones += not score(got.text)
            if long_ones == CORRECTIONS:
                break
    assert long_ones == CORRECTIONS, "SmolLM2 answered too many questions briefly already"
    before = _held_out(reef, base_id)  # newer than the turns for review: never reached
    corrected = _review(reef, references)

    def published() -> list[dict[str, Any]]:
        r = httpx.get(
            f"{reef.url}/reef/scenarios/{SCENARIO}/candidates",
            headers=admin,
            params={"status": "published"},
        )
        return list(r.json()["data"]) if r.status_code == 200 else []

    [cand] = wait_for("the release trained on the reviews", published, reef, timeout=900)
    after = _held_out(reef, cand["release_id"])
    was, now = _counts(before), _counts(after)
    numbers = {
        "corrections": len(corrected),
        "turns_served_for_review": len(references),
        "held_out": len(HELD_OUT),
        **{f"{k}_before": v for k, v in was.items()},
        **{f"{k}_after": v for k, v in now.items()},
        "train_loss": cand["metrics"].get("train_loss"),
    }
    print("REVIEW_STYLE " + json.dumps(numbers), flush=True)
    for (q, _), b, a in zip(HELD_OUT, before, after, strict=True):
        print(f"  {q}\n    {b.text.strip()!r}\n -> {a.text.strip()!r}", flush=True)
    out = os.environ.get("REEF_REVIEW_STYLE_OUT")
    if out:
        texts = {"before": [a.text for a in before], "after": [a.text for a in after]}
        Path(out).write_text(json.dumps({**numbers, **texts}, indent=1))
    assert now["five_words"] - was["five_words"] >= MIN_RISE, numbers
    assert now["right"] >= was["right"] - MAX_RIGHT_LOST, numbers
