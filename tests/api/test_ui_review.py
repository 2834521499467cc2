"""Reviewing in the dashboard over real HTTP: a review form becomes a report through the one
report path (source human, the reviewer's token name, the metrics checked, the correction a
training target as an API correction is); the reviewer role reviews but is refused release
actions (403); the annotation queue is filled by its policy, taken, skipped and finished, and
its progress shows on the overview."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml

from reef.api.auth import hash_token
from reef.cli.testing import InProcessReef
from reef.experience import collect, correction
from reef.guard_answers import failed, keep
from reef.store.sql import open_store
from tests.store.builders import new_candidate

ADMIN, RITA, ALICE = "rv-admin", "rv-rita", "rv-alice"
SHOP = "shop"


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    state: Path = tmp_path_factory.mktemp("reef-review")
    config = state / "serve.yaml"
    settings: dict[str, Any] = {
        "auth": {
            "tokens": [
                {"name": "ops", "sha256": hash_token(ADMIN), "admin": True},
                {
                    "name": "rita",
                    "sha256": hash_token(RITA),
                    "scenarios": [SHOP, "q", "gq"],
                    "reviewer": True,
                },
                {"name": "alice", "sha256": hash_token(ALICE), "scenarios": [SHOP]},
            ]
        },
        "engine": {"default_max_tokens": 4},
        "metrics": {"helpful": {"type": "boolean"}},
        "scenarios": {
            SHOP: {
                "metrics": {
                    "accuracy": {"type": "float", "range": [0, 1]},
                    "tone": {"type": "categorical", "values": ["curt", "kind"]},
                }
            },
            "q": {"review": {"sample": 1.0}},
            "q2": {"review": {"sample": 1.0}},
            "gq": {"review": {"guard_failed": True}},
        },
    }
    config.write_text(yaml.safe_dump(settings))
    with InProcessReef(state, config=config) as srv:
        yield srv


def _chat(srv: InProcessReef, scenario: str, text: str) -> str:
    with httpx.Client(
        base_url=srv.url,
        headers={"authorization": f"Bearer {ADMIN}", "x-reef-scenario": scenario},
        timeout=60,
    ) as http:
        body = {"model": "tiny", "messages": [{"role": "user", "content": text}]}
        r = http.post("/v1/chat/completions", json=body)
        r.raise_for_status()
        return str(r.headers["x-reef-agent-record-id"])


@contextmanager
def _signed_in(srv: InProcessReef, token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, follow_redirects=False, timeout=60) as client:
        r = client.post("/ui/login", data={"token": token, "next": "/ui"})
        assert r.status_code == 303, r.text
        yield client


def _field(html: str, name: str) -> str:
    found = re.search(rf'name="{re.escape(name)}" value="([^"]+)"', html)
    assert found, f"no {name} field on the page"
    return found.group(1)


def _reports(srv: InProcessReef, scenario: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{srv.url}/reef/scenarios/{scenario}/reports",
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    r.raise_for_status()
    return list(r.json()["data"])


def test_a_review_is_a_human_report_that_trains_like_an_api_correction(
    reef: InProcessReef,
) -> None:
    reviewed, by_api = _chat(reef, SHOP, "Capital of France?"), _chat(reef, SHOP, "And Italy?")
    with _signed_in(reef, RITA) as ui:
        page = ui.get(f"/ui/s/{SHOP}/records/{reviewed}", follow_redirects=True)
        assert page.status_code == 200
        html = page.text
        assert 'form method="post" action="/ui/s/shop/review"' in html
        for field in ('name="m.helpful"', 'name="m.accuracy"', 'name="m.tone"', "correction"):
            assert field in html, field
        form = {
            "csrf": _field(html, "csrf"),
            "record_id": reviewed,
            "report_id": _field(html, "report_id"),
            "score": "0",
            "m.helpful": "false",
            "m.accuracy": "0.25",
            "m.tone": "curt",
            "correction": "Paris.",
            "comment": "too long",
        }
        r = ui.post(f"/ui/s/{SHOP}/review", data=form)
        assert r.status_code == 303, r.text
        assert "msg=reviewed" in r.headers["location"]
        assert r.headers["location"].endswith(f"#{reviewed}")
        # the same form sent again stores nothing new (its report id is the idempotency key)
        assert ui.post(f"/ui/s/{SHOP}/review", data=form).status_code == 303
        # the scenario's metrics are checked as on the API; an empty review says nothing
        bad = ui.post(f"/ui/s/{SHOP}/review", data={**form, "report_id": "", "m.accuracy": "7"})
        assert bad.status_code == 400 and "accuracy" in bad.text
        # what only Reef writes is refused here as on the API: a judge's report id
        judge = ui.post(f"/ui/s/{SHOP}/review", data={**form, "report_id": "judge_x1"})
        assert judge.status_code == 400 and "reserved" in judge.text
        empty = {"csrf": form["csrf"], "record_id": reviewed}
        assert ui.post(f"/ui/s/{SHOP}/review", data=empty).status_code == 400
        shown = ui.get(r.headers["location"]).text
        assert "review saved as rpt_" in shown and "Paris." in shown
    with httpx.Client(
        base_url=reef.url,
        headers={"authorization": f"Bearer {ADMIN}", "x-reef-scenario": SHOP},
    ) as api:
        body = {"references": [by_api], "score": 0.0, "feedback": {"correction": "Rome."}}
        api.post("/reef/report", json=body).raise_for_status()
    mine = [p for p in _reports(reef, SHOP) if p["references"] == [reviewed]]
    assert len(mine) == 1
    p = mine[0]
    assert p["metadata"] == {"source": "human", "reviewer": "rita", "via": "dashboard"}
    assert p["score"] == 0.0 and p["created_at"]
    assert p["metrics"] == {"helpful": False, "accuracy": 0.25, "tone": "curt"}
    assert p["feedback"] == {"correction": "Paris.", "comment": "too long"}
    # the experience the sft recipe trains on: both corrections are targets, the same way
    store = open_store(reef.settings.database_url)
    try:
        exp = collect(store, SHOP, "scored", recipe="sft")
    finally:
        store.close()
    targets = {s.record_ids[0]: correction(s.feedback) for s in exp.samples}
    assert targets[reviewed] == "Paris." and targets[by_api] == "Rome."


def test_reviewers_review_but_cannot_release(reef: InProcessReef) -> None:
    rid = _chat(reef, SHOP, "hello")
    with _signed_in(reef, RITA) as rita:
        page = rita.get(f"/ui/s/{SHOP}/releases").text
        csrf = _field(page, "csrf")
        base = re.search(r'id="(rel_[0-9a-z]+)"', page)
        assert base
        for action in ("promote", "reject", "rollback", "evolve"):
            r = rita.post(f"/ui/s/{SHOP}/{action}", data={"csrf": csrf, "release_id": base[1]})
            assert r.status_code == 403, action
            assert "is a reviewer token" in r.text and "needs an admin token" in r.text
        # the API's admin routes refuse the reviewer's bearer token the same way
        api = httpx.post(
            f"{reef.url}/reef/scenarios/{SHOP}/rollback",
            headers={"authorization": f"Bearer {RITA}"},
            json={"release_id": base[1]},
        )
        assert api.status_code == 403 and "is a reviewer token" in api.json()["error"]["message"]
        # a scenario out of the reviewer's scope, and a form without its CSRF token
        assert (
            rita.post("/ui/s/bob/review", data={"csrf": csrf, "record_id": rid}).status_code == 403
        )
        r = rita.post(f"/ui/s/{SHOP}/review", data={"record_id": rid, "score": "1"})
        assert r.status_code == 403 and "CSRF" in r.text
    with _signed_in(reef, ALICE) as alice:  # a scoped token without the reviewer role
        html = alice.get(f"/ui/s/{SHOP}/records/{rid}", follow_redirects=True).text
        assert "/review" not in html
        r = alice.post(
            f"/ui/s/{SHOP}/review",
            data={"csrf": _field(html, "csrf"), "record_id": rid, "score": "1"},
        )
        assert r.status_code == 403 and "may not review" in r.text


def test_the_queue_is_taken_skipped_and_finished(reef: InProcessReef) -> None:
    turns = [_chat(reef, "q", f"question {i}") for i in range(3)]
    with _signed_in(reef, RITA) as rita, _signed_in(reef, ADMIN) as ops:
        page = rita.get("/ui/s/q/queue")
        assert page.status_code == 200
        assert "a random 100% of turns" in page.text
        assert all(t in page.text for t in turns)
        csrf = _field(page.text, "csrf")
        first = rita.post("/ui/s/q/queue/take", data={"csrf": csrf})
        assert first.status_code == 303
        loc = first.headers["location"]
        assert loc.endswith(f"#{turns[0]}") and "item=rvw_" in loc
        # ops takes the next one, never rita's
        took = ops.post("/ui/s/q/queue/take", data={"csrf": _field(ops.get("/ui").text, "csrf")})
        assert took.headers["location"].endswith(f"#{turns[1]}")
        html = rita.get(loc).text
        assert "From the review queue (sample)" in html
        item = _field(html, "item")
        # review it: finished, and the next free turn opens
        form = {"csrf": csrf, "record_id": turns[0], "score": "1", "item": item}
        done = rita.post("/ui/s/q/review", data=form)
        assert done.status_code == 303 and done.headers["location"].endswith(f"#{turns[2]}")
        skip_item = _field(rita.get(done.headers["location"]).text, "item")
        left = rita.post("/ui/s/q/queue/skip", data={"csrf": csrf, "item": skip_item})
        assert left.headers["location"].startswith("/ui/s/q/queue?msg=skipped")
        queue = rita.get(left.headers["location"]).text
        assert 'data-count="done">1<' in queue and 'data-count="skipped">1<' in queue
        overview = rita.get("/ui").text
        assert "Review queues" in overview and "1</span> of 3 reviewed" in overview
    [p] = [p for p in _reports(reef, "q") if p["references"] == [turns[0]]]
    assert p["metadata"]["queue_item"] == item and p["metadata"]["reviewer"] == "rita"


def test_a_guard_answer_is_queued_shown_and_corrected_like_a_turn(reef: InProcessReef) -> None:
    """What the evolve flow keeps of a candidate that failed a guard's task (reef.guard_answers)
    is reviewed through the same queue and form, its correction a training target; the
    transcript says what it is, with the answer the task expects."""
    store = open_store(reef.settings.database_url)
    try:
        cand = new_candidate("gq", store.ensure_scenario("gq").head_release_id)
        task = ("egypt", [{"role": "user", "content": "Capital of Egypt?"}], {"answer": "Cairo"})
        [rid] = keep(store, cand, failed("facts", [task], ["Paris, of course."], [0.0]))
    finally:
        store.close()
    with _signed_in(reef, RITA) as rita:
        queue = rita.get("/ui/s/gq/queue").text
        assert "answers a gate guard failed" in queue and rid in queue
        csrf = _field(queue, "csrf")
        took = rita.post("/ui/s/gq/queue/take", data={"csrf": csrf})
        assert took.headers["location"].endswith(f"#{rid}")
        html = rita.get(took.headers["location"]).text
        assert "From the review queue (guard)" in html
        assert "A guard answer, never served" in html and f"<code>{cand.id}</code>" in html
        assert "gate guard <b>facts</b>" in html and '<span class="expected">Cairo</span>' in html
        assert "Capital of Egypt?" in html and "Paris, of course." in html
        assert "Harness injection" not in html  # its reef.guard* tags are not an injection
        form = {
            "csrf": csrf,
            "record_id": rid,
            "report_id": _field(html, "report_id"),
            "item": _field(html, "item"),
            "score": "0",
            "correction": "Cairo.",
        }
        assert rita.post("/ui/s/gq/review", data=form).status_code == 303
        assert 'data-count="done">1<' in rita.get("/ui/s/gq/queue").text
    store = open_store(reef.settings.database_url)
    try:
        exp = collect(store, "gq", "scored", recipe="sft")
    finally:
        store.close()
    assert {s.record_ids[0]: correction(s.feedback) for s in exp.samples} == {rid: "Cairo."}


def test_a_queued_turn_retention_removed_is_passed_over(reef: InProcessReef) -> None:
    gone, kept = _chat(reef, "q2", "soon archived"), _chat(reef, "q2", "still here")
    with _signed_in(reef, ADMIN) as ops:
        assert gone in ops.get("/ui/s/q2/queue").text  # queued
        store = open_store(reef.settings.database_url)
        try:
            assert store.delete_records("q2", [gone], {}) == {gone}
        finally:
            store.close()
        csrf = _field(ops.get("/ui").text, "csrf")
        r = ops.post("/ui/s/q2/queue/take", data={"csrf": csrf})
        assert r.headers["location"].endswith(f"#{kept}")
        assert 'data-count="skipped">1<' in ops.get("/ui/s/q2/queue").text


def _warm(srv: InProcessReef) -> None:
    """Have the app build the routes the reviewers will use before two threads race on them.
    FastAPI builds a route's parameters on its first match inside warnings.catch_warnings(),
    which is not thread-safe: two apps of one process doing it at once can restore each
    other's filters, and under pytest's `error` filter a pydantic warning it meant to silence
    becomes a 500. Two replicas are two processes in production; here they share one."""
    for method, path in (
        ("GET", "/ui/s/q/queue"),
        ("POST", "/ui/s/q/queue/take"),
        ("POST", "/ui/s/q/review"),
        ("POST", "/ui/login"),
    ):
        httpx.request(method, f"{srv.url}{path}", follow_redirects=False)


@pytest.mark.postgres
def test_two_replicas_on_postgres_never_hand_out_the_same_turn(
    reef: InProcessReef, make_postgres_database: Any, tmp_path: Path
) -> None:
    """Two reviewers, each on a replica of its own over one Postgres database, work through
    the same queue at once: every turn is reviewed exactly once."""
    assert reef.config is not None
    database = make_postgres_database()
    config = tmp_path / "pg.yaml"
    settings = yaml.safe_load(Path(reef.config).read_text())
    settings["auth"]["tokens"].append(
        {"name": "otto", "sha256": hash_token("rv-otto"), "scenarios": ["q"], "reviewer": True}
    )
    settings["store"] = {"database_url": database}
    config.write_text(yaml.safe_dump(settings))
    with (
        InProcessReef(tmp_path / "a", config=config) as a,
        InProcessReef(tmp_path / "b", config=config) as b,
    ):
        turns = {_chat(a, "q", f"turn {i}") for i in range(10)}
        for srv in (a, b):  # one at a time first: see _warm
            _warm(srv)
        done: dict[str, list[str]] = {}
        start = threading.Barrier(2)

        def work(srv: InProcessReef, token: str, name: str) -> None:
            mine = []
            with _signed_in(srv, token) as ui:
                csrf = _field(ui.get("/ui/s/q/queue").text, "csrf")
                start.wait()
                r = ui.post("/ui/s/q/queue/take", data={"csrf": csrf})
                while "#rec_" in r.headers["location"]:
                    rid = r.headers["location"].rpartition("#")[2]
                    item = parse_qs(urlsplit(r.headers["location"]).query)["item"][0]
                    mine.append(rid)
                    form = {"csrf": csrf, "record_id": rid, "score": "1", "item": item}
                    r = ui.post("/ui/s/q/review", data=form)
                    assert r.status_code == 303, r.text
            done[name] = mine

        threads = [
            threading.Thread(target=work, args=(a, RITA, "rita")),
            threading.Thread(target=work, args=(b, "rv-otto", "otto")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert set(done) == {"rita", "otto"}
    reviewed = done["rita"] + done["otto"]
    assert sorted(reviewed) == sorted(turns)  # each turn once, by one of them
    assert done["rita"] and done["otto"]
