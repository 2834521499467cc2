"""GET /reef/scenarios/{s}/sessions/{id} reads the session in one store query (the chain of
parent links in one recursive statement), not one query per turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from reef.api.app import create_app
from reef.cli.serve import build_engine
from reef.records import Record, new_id
from reef.settings import load_settings
from reef.store.sql import SQLStore, open_store
from tests.experience.conftest import record

S = "one-read"


class Counting(SQLStore):
    """Counts the store's calls by name; the per-turn lookups fail the test."""

    calls: dict[str, int]

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def session_records(self, *args: Any, **kwargs: Any) -> list[Record]:
        self._count("session_records")
        return super().session_records(*args, **kwargs)

    def get_record(self, *args: Any, **kwargs: Any) -> Record:
        raise AssertionError("the session was read turn by turn")

    def session_tail(self, *args: Any, **kwargs: Any) -> Record | None:
        raise AssertionError("the session was read turn by turn")


def test_session_route_reads_the_chain_in_one_query(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'reef.db'}"
    setup = open_store(url)
    setup.migrate()
    base = setup.ensure_scenario(S).head_release_id
    ses, fork = new_id("ses"), new_id("ses")
    turns: list[Record] = []
    for k in range(5):
        parent = turns[-1].id if turns else None
        turns.append(record(S, base, session_id=ses, turn=k, parent_id=parent))
    branch = record(S, base, session_id=fork, turn=3, parent_id=turns[2].id)
    setup.add_records([*turns, branch])
    setup.close()

    settings = load_settings(
        server={"state_dir": str(tmp_path / "state")},
        store={"database_url": url},
        engine={"model": "tiny"},
        reef={"auto": False},
    )
    store = Counting(open_store(url).engine)
    store.calls = {}
    with TestClient(
        create_app(settings, build_engine(settings), store=store), base_url="http://localhost"
    ) as client:
        r = client.get(f"/reef/scenarios/{S}/sessions/{ses}")
        assert r.status_code == 200, r.text
        got = r.json()
        assert [r["id"] for r in got["data"]] == [r.id for r in turns]
        assert got["last_id"] == turns[-1].id and got["has_more"] is False
        got = client.get(f"/reef/scenarios/{S}/sessions/{fork}").json()
        assert [r["id"] for r in got["data"]] == [*(r.id for r in turns[:3]), branch.id]
        assert client.get(f"/reef/scenarios/{S}/sessions/ses_nope").json()["data"] == []
        assert client.get(f"/reef/scenarios/nope/sessions/{ses}").status_code == 404
    assert store.calls == {"session_records": 3}
