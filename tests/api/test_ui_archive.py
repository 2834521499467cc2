"""The dashboard's archive view: records retention moved to parquet in the artifact store,
listed newest first a page at a time with the records page's columns, each one opened with its
request, response and reports, read through reef.retention's reader (sha256-checked)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx

from reef.artifacts import ArtifactStore, open_artifacts
from reef.cli.testing import InProcessReef
from reef.records import Consumption, utcnow
from reef.retention import apply_retention, archived_counts, archived_record
from reef.store.sql import open_store
from reef.testing.traffic import traffic

S = "archived"
N = 57  # more than a page (50), in files of 20 rows (store.retention_batch)


def _links(html: str) -> list[str]:
    return re.findall(rf'href="/ui/s/{S}/archive/(rec_[0-9a-z]+)"', html)


def test_archive_pages_list_and_open_what_retention_archived(tmp_path: Path) -> None:
    # A window of ~0.9 s: everything served before the sleep is past it.
    store_cfg = {"retention_days": 1e-5, "retention_batch": 20}
    with InProcessReef(tmp_path / "state", store=store_cfg) as srv:
        receipts = traffic(srv, S, N, prompt="question {i}", max_tokens=2)
        reported = receipts[3]
        artifacts = _report_and_archive(srv, reported)
        older = _pages_list_newest_first(srv, receipts)
        _one_exchange_opens(srv, reported)
        _fresh_record_stays_live(srv)
        _row_in_both_shows_the_databases(srv, artifacts, receipts[10], older)
        _files_are_verified_once(srv, artifacts, reported)


def _report_and_archive(srv: InProcessReef, reported: str) -> ArtifactStore:
    """Reports one record, then archives all N (and the report) once the loop trained on it."""
    r = httpx.post(
        f"{srv.url}/reef/report",
        headers={"x-reef-scenario": S},
        json={"references": [reported], "score": 1.0, "feedback": "spot on"},
    )
    assert r.status_code == 201, r.text
    empty = httpx.get(f"{srv.url}/ui/s/{S}/archive")
    assert empty.status_code == 200 and "Nothing archived." in empty.text

    # the loop trained on the reported record: nothing keeps it in the database
    store = open_store(srv.settings.database_url)
    artifacts = open_artifacts(srv.settings.artifacts_url)
    try:
        store.add_consumptions(
            [Consumption(S, srv.settings.reef.recipe, reported, "batch-1", utcnow())]
        )
        time.sleep(1.0)
        (done,) = [a for a in apply_retention(store, srv.settings, artifacts) if a.scenario == S]
        assert (done.records, done.reports) == (N, 1)
        assert len([f for f in done.files if f.kind == "records"]) == 3
    finally:
        store.close()
    assert archived_counts(artifacts, S) == {"records": N, "reports": 1}
    return artifacts


def _pages_list_newest_first(srv: InProcessReef, receipts: list[str]) -> str:
    """The records page points at the archive; the archive's first page holds the 50 newest
    with the records page's columns, the second the rest. Returns the second page's query."""
    live = httpx.get(f"{srv.url}/ui/s/{S}/records").text
    assert f'href="/ui/s/{S}/archive"' in live

    first = httpx.get(f"{srv.url}/ui/s/{S}/archive")
    assert first.status_code == 200
    assert first.headers["cache-control"] == "no-store"
    assert '<th scope="col">Latency</th>' in first.text and "<form" not in first.text
    page1 = _links(first.text)
    newest_first = sorted(receipts, reverse=True)  # ids sort by creation time
    assert page1 == newest_first[:50]
    assert "question 56" in first.text
    more = re.search(r'href="(\?before=rec_[0-9a-z]+)" rel="next"', first.text)
    assert more
    second = httpx.get(f"{srv.url}/ui/s/{S}/archive{more.group(1)}")
    assert second.status_code == 200
    page2 = _links(second.text)
    assert page2 == newest_first[50:]
    assert 'rel="next"' not in second.text and "Newest" in second.text
    assert '1 report · <span class="num">1.00</span>' in second.text  # the reported one
    assert f'href="/ui/s/{S}/releases#' in second.text
    return more.group(1)


def _one_exchange_opens(srv: InProcessReef, reported: str) -> None:
    """One archived exchange: request, response, its archived report; none that is not."""
    one = httpx.get(f"{srv.url}/ui/s/{S}/archive/{reported}")
    assert one.status_code == 200
    assert "Archived record" in one.text and "question 3" in one.text
    assert "score 1.00" in one.text and "spot on" in one.text
    assert f'id="{reported}"' in one.text
    # ... and none that is not archived
    assert (
        httpx.get(f"{srv.url}/ui/s/{S}/archive/rec_00000000000000000000000000").status_code == 404
    )
    assert httpx.get(f"{srv.url}/ui/s/nowhere/archive").status_code == 404


def _fresh_record_stays_live(srv: InProcessReef) -> None:
    """A record served after the run stays on the records page, not in the archive."""
    (fresh,) = traffic(srv, S, 1, prompt="fresh one", max_tokens=2)
    assert fresh not in _links(httpx.get(f"{srv.url}/ui/s/{S}/archive").text)
    assert fresh in httpx.get(f"{srv.url}/ui/s/{S}/records").text


def _row_in_both_shows_the_databases(
    srv: InProcessReef, artifacts: ArtifactStore, twice: str, older: str
) -> None:
    """A row both archived and in the database (a run that stopped between its file and its
    delete): the database's copy is the one shown, once."""
    store = open_store(srv.settings.database_url)
    try:
        store.add_records([archived_record(artifacts, S, twice)])
    finally:
        store.close()
    assert twice not in _links(httpx.get(f"{srv.url}/ui/s/{S}/archive").text)
    assert twice not in _links(httpx.get(f"{srv.url}/ui/s/{S}/archive{older}").text)
    moved = httpx.get(f"{srv.url}/ui/s/{S}/archive/{twice}")
    assert moved.status_code == 303
    assert moved.headers["location"] == f"/ui/s/{S}/records/{twice}"


def _files_are_verified_once(srv: InProcessReef, artifacts: ArtifactStore, reported: str) -> None:
    """Each archive file is content-addressed (its manifest gives its sha256), so a later view
    reads it from the server's cache instead of fetching and hashing the whole parquet file
    again. Shown here by taking the files away."""
    shown = _links(httpx.get(f"{srv.url}/ui/s/{S}/archive").text)
    httpx.get(f"{srv.url}/ui/s/{S}/archive/{reported}").raise_for_status()
    for kind in ("records", "reports"):
        assert artifacts.delete_prefix(f"archive/{S}/{kind}") > 0
    again = httpx.get(f"{srv.url}/ui/s/{S}/archive")
    assert again.status_code == 200 and _links(again.text) == shown
    one = httpx.get(f"{srv.url}/ui/s/{S}/archive/{reported}")
    assert one.status_code == 200 and "spot on" in one.text
