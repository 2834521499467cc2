"""Figures per release measured outside Reef (reef.figures): what the demos write into the
server's artifact store and the dashboard's learning page reads back."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.curve import Step, save_figures
from reef.artifacts import LocalArtifacts
from reef.errors import BadRequest
from reef.figures import MAX_FIGURES, Figure, Point, load_figures, save_figure


def test_a_demo_run_becomes_figures_per_release(tmp_path: Path) -> None:
    steps = [
        Step(0, "rel_a", 0.25, 4, 16, 1.0, 0.0, 1.0, None, 8),
        Step(1, "rel_b", 0.5, 8, 16, 1.0, 1.0, 2.0, 0.5, 10),
        Step(2, "rel_b", 0.5625, 9, 16, 1.0, 1.0, 3.0, 0.5, 7, "guard 'correct' dropped"),
    ]
    uris = save_figures(tmp_path, "five-words", steps, "python -m demo")
    assert len(uris) == 2
    figures, problems = load_figures(LocalArtifacts(tmp_path), "five-words")
    assert problems == []
    by_name = {f.name: f for f in figures}
    rate = by_name["held-out-pass-rate"]
    assert rate.title == "held-out pass rate" and rate.source == "python -m demo"
    assert [(p.release_id, p.value) for p in rate.points] == [
        ("rel_a", 0.25),
        ("rel_b", 0.5),
        ("rel_b", 0.5625),  # a refused round measured the head it kept
    ]
    assert [p.value for p in by_name["held-out-correct"].points] == [0.5, 0.625, 0.4375]
    # the preference leads, whatever the names' order: the dashboard's headline is the first
    assert [f.name for f in figures] == ["held-out-pass-rate", "held-out-correct"]
    assert load_figures(LocalArtifacts(tmp_path), "another") == ([], [])


def test_broken_files_are_reported_not_raised(tmp_path: Path) -> None:
    store = LocalArtifacts(tmp_path)
    save_figure(store, "s", Figure("good", "good", "bench", (Point("rel_a", 1.0),)))
    store.put_bytes("figures/s/broken.json", b"{not json")
    store.put_bytes("figures/s/nan.json", b'{"points": [{"release_id": "r", "value": NaN}]}')
    store.put_bytes("figures/s/notes.txt", b"ignored: not a figure file")
    store.put_bytes("figures/s/order.json", b'{"order": "first", "points": []}')
    figures, problems = load_figures(store, "s")
    assert [f.name for f in figures] == ["good"]
    assert len(problems) == 3
    assert any("broken.json" in p for p in problems) and any("not finite" in p for p in problems)
    assert any("order 'first' is not an integer" in p for p in problems)
    with pytest.raises(BadRequest, match="figure name"):
        save_figure(store, "s", Figure("../escape", "x", "", ()))


def test_a_page_reads_a_bounded_number(tmp_path: Path) -> None:
    store = LocalArtifacts(tmp_path)
    for i in range(MAX_FIGURES + 2):
        save_figure(store, "s", Figure(f"f{i:02d}", f"f{i}", "", (Point("rel_a", float(i)),)))
    figures, problems = load_figures(store, "s")
    assert len(figures) == MAX_FIGURES
    assert problems == [f"2 more figures not shown (first {MAX_FIGURES})"]
