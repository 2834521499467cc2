"""What the learning page shows: the chart series per release (the JSON its scripts draw) and
the same numbers as table rows."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reef.figures import Figure
from reef.records import Release
from reef.store.browse import ScoreStats


def curve(
    chain: list[Release], scores: dict[str, ScoreStats], lines: Sequence[Series] = ()
) -> dict[str, list[Any]]:
    """Chart series per release, oldest first: mean reported score with its interval, the
    gate's held-out means (candidate), and `lines` (the headline's figures and guards on the
    same axis as the score). Other figures per release: `figure_series`."""
    out: dict[str, list[Any]] = {
        "lines": [{"name": s.name, "values": list(s.values)} for s in lines],
        "seq": [],
        "label": [],
        "mean": [],
        "low": [],
        "high": [],
        "n": [],
        "gate": [],
    }
    for r in chain:
        s = scores.get(r.id)
        out["seq"].append(r.seq)
        out["label"].append(f"#{r.seq} {r.operation}")
        out["mean"].append(None if s is None else round(s.mean, 4))
        out["low"].append(None if s is None else round(s.low, 4))
        out["high"].append(None if s is None else round(s.high, 4))
        out["n"].append(0 if s is None else s.n)
        held = r.gate.get("mean_candidate")
        out["gate"].append(round(float(held), 4) if isinstance(held, int | float) else None)
    return out


@dataclass(frozen=True)
class CurveRow:
    """One release of the learning curve's table."""

    release: Release
    score: ScoreStats | None


def curve_rows(chain: list[Release], scores: dict[str, ScoreStats]) -> list[CurveRow]:
    """The curve's table, newest release first."""
    return [CurveRow(r, scores.get(r.id)) for r in reversed(chain)]


@dataclass(frozen=True)
class Series:
    """One of the other figures per release: values aligned with the chain (None where a
    release has none)."""

    name: str
    key: str  # "figure:<name>" (measured outside Reef) or "metric:<name>" (a release metric)
    source: str
    values: tuple[float | None, ...]
    off_chain: int = 0  # a figure's points naming releases not on this chain

    @property
    def figure(self) -> bool:
        return self.key.startswith("figure:")

    def json(self) -> dict[str, Any]:
        """What the page's chart script reads."""
        out: dict[str, Any] = {
            "name": self.name,
            "key": self.key,
            "source": self.source,
            "values": list(self.values),
        }
        return out | ({"off_chain": self.off_chain} if self.off_chain else {})


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def figure_series(
    chain: list[Release], figures: Sequence[Figure], max_metrics: int = 40
) -> list[Series]:
    """The second chart's series per release, oldest first (aligned with `curve`): the demo
    and bench figures measured outside Reef (reef.figures) first, then every numeric metric
    the releases recorded when registered (training loss, tttd's best verified score, the
    gate's numbers...). None where a release has no value."""
    index = {r.id: i for i, r in enumerate(chain)}
    out: list[Series] = []
    for f in figures:
        values: list[float | None] = [None] * len(chain)
        for p in f.points:
            if p.release_id in index:
                values[index[p.release_id]] = round(p.value, 6)
        off = sum(1 for p in f.points if p.release_id not in index)
        out.append(Series(f.title, f"figure:{f.name}", f.source, tuple(values), off))
    keys = sorted({k for r in chain for k, v in r.metrics.items() if _finite(v)})
    for k in keys[:max_metrics]:
        vals = [round(float(r.metrics[k]), 6) if _finite(r.metrics.get(k)) else None for r in chain]
        out.append(Series(k, f"metric:{k}", "release metrics", tuple(vals)))
    return out


def guard_series(chain: list[Release]) -> list[Series]:
    """Each gate guard's held-out mean per release, oldest first (aligned with `curve`): the
    candidate's mean at the release it became, and the head's mean it was compared with at the
    release before it (so the base release has its value from the first gate that guarded it)."""
    index = {r.id: i for i, r in enumerate(chain)}
    values: dict[str, list[float | None]] = {}
    for i, r in enumerate(chain):
        for g in r.gate.get("guards") or ():
            if not isinstance(g, dict) or not g.get("name"):
                continue
            line = values.setdefault(str(g["name"]), [None] * len(chain))
            if _finite(g.get("mean_candidate")):
                line[i] = round(float(g["mean_candidate"]), 6)
            parent = index.get(r.parent_id or "")
            if parent is not None and line[parent] is None and _finite(g.get("mean_head")):
                line[parent] = round(float(g["mean_head"]), 6)
    return [
        Series(f"guard {name}", f"guard:{name}", "the gate's held-out tasks", tuple(v))
        for name, v in values.items()
    ]


@dataclass(frozen=True)
class Change:
    """What a series did over the chain: its first and its latest value, and at which releases."""

    name: str
    source: str
    first: float
    last: float
    first_seq: int
    last_seq: int

    @property
    def delta(self) -> float:
        return self.last - self.first


def change(chain: list[Release], series: Series) -> Change | None:
    """The series' first and latest value (None when it has none)."""
    known = [(r.seq, v) for r, v in zip(chain, series.values, strict=True) if v is not None]
    if not known:
        return None
    return Change(series.name, series.source, known[0][1], known[-1][1], known[0][0], known[-1][0])


def score_series(chain: list[Release], scores: dict[str, ScoreStats]) -> Series:
    """The mean reported score per release, as a Series (for the headline and the overview)."""
    values = tuple(round(scores[r.id].mean, 6) if r.id in scores else None for r in chain)
    return Series("mean reported score", "score", "reports on the traffic it served", values)


def metric_series(
    chain: list[Release], metrics: Mapping[str, Mapping[str, ScoreStats]]
) -> list[Series]:
    """Each named metric's mean per release (Browse.release_metrics), by name."""
    names = sorted({name for per in metrics.values() for name in per})
    return [
        Series(
            f"mean {name}",
            f"reported:{name}",
            "reports' named metric",
            tuple(
                round(metrics[r.id][name].mean, 6) if name in metrics.get(r.id, {}) else None
                for r in chain
            ),
        )
        for name in names
    ]


def headline(
    chain: list[Release],
    scores: dict[str, ScoreStats],
    figures: list[Series],
    metrics: Mapping[str, Mapping[str, ScoreStats]] | None = None,
) -> list[Series]:
    """What the learning page and the overview lead with, most telling first: the figures
    measured outside Reef on held-out questions (`figure_series`' figures), each gate guard's
    held-out mean, the mean reported score, then each named metric's mean. Only series with a
    value."""
    ordered = [s for s in figures if s.figure] + guard_series(chain)
    ordered.append(score_series(chain, scores))
    ordered += metric_series(chain, metrics or {})
    return [s for s in ordered if any(v is not None for v in s.values)]


def on_unit_scale(series: Series) -> bool:
    """Whether every value lies in [0, 1] (a rate or a pass share): the main chart's left axis."""
    return all(v is None or 0.0 <= v <= 1.0 for v in series.values)


@dataclass(frozen=True)
class FigureRow:
    """One release of the figures' table: each shown figure's value (None: none)."""

    release: Release
    values: tuple[float | None, ...]


def figure_rows(chain: list[Release], shown: list[Series]) -> list[FigureRow]:
    """The figures' table, newest release first, only releases with a value of any of them."""
    rows = [FigureRow(r, tuple(s.values[i] for s in shown)) for i, r in enumerate(chain)]
    return [row for row in reversed(rows) if any(v is not None for v in row.values)]
