"""What the learning page shows: the chart series per release (the JSON its scripts draw) and
the same numbers as table rows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from reef.figures import Figure
from reef.records import Release
from reef.store.browse import ScoreStats


def curve(chain: list[Release], scores: dict[str, ScoreStats]) -> dict[str, list[Any]]:
    """Chart series per release, oldest first: mean reported score with its interval and the
    gate's held-out means (candidate). Other figures per release: `figure_series`."""
    out: dict[str, list[Any]] = {
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
    chain: list[Release], figures: list[Figure], max_metrics: int = 40
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


@dataclass(frozen=True)
class FigureRow:
    """One release of the figures' table: each shown figure's value (None: none)."""

    release: Release
    values: tuple[float | None, ...]


def figure_rows(chain: list[Release], shown: list[Series]) -> list[FigureRow]:
    """The figures' table, newest release first, only releases with a value of any of them."""
    rows = [FigureRow(r, tuple(s.values[i] for s in shown)) for i, r in enumerate(chain)]
    return [row for row in reversed(rows) if any(v is not None for v in row.values)]
