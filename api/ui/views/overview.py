"""What the overview shows: one row per scenario with its last day's traffic as bars and its
learning curve as a sparkline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reef.api.ui.views.curves import Change, change, figure_series, headline
from reef.figures import Figure
from reef.records import Candidate, Release
from reef.store.browse import ScoreStats, Traffic


@dataclass(frozen=True)
class Bar:
    """One rectangle of an SVG bar chart (a traffic hour)."""

    x: float
    w: float
    h: float
    y: float


def bars(values: list[int], width: int = 120, height: int = 28) -> list[Bar]:
    """Rectangles of an SVG bar chart of `values` (traffic per hour)."""
    top = max(values) if values and max(values) > 0 else 1
    w = width / max(1, len(values))
    return [
        Bar(x=i * w, w=max(1.0, w - 1), h=v / top * height, y=height - v / top * height)
        for i, v in enumerate(values)
    ]


def sparkline(values: list[float | None], width: int = 120, height: int = 28) -> str:
    """An SVG polyline's points for `values` (None: gap, drawn as the previous value)."""
    nums = [v for v in values if v is not None]
    if len(nums) < 1:
        return ""
    lo, hi = min(nums), max(nums)
    span = (hi - lo) or 1.0
    step = width / max(1, len(values) - 1)
    points = []
    last = nums[0]
    for i, v in enumerate(values):
        last = v if v is not None else last
        y = height - 2 - (last - lo) / span * (height - 4)
        points.append(f"{i * step:.1f},{y:.1f}")
    return " ".join(points)


# How many headline series a row names (the first is its sparkline): a demo's preference and
# the correctness it may have cost.
LEAD = 2


@dataclass(frozen=True)
class OverviewRow:
    """One scenario's row of the overview."""

    name: str
    head: Release
    traffic: Traffic
    bars: tuple[Bar, ...]  # records per hour over the last day
    last: Candidate | None  # the newest candidate: the last evolve's outcome
    pending: int  # candidates waiting for review
    curve: str  # the sparkline of the headline series per release ("" before any value)
    releases: int
    lead: tuple[Change, ...] = ()  # the first headline series' first and latest values


def overview_row(
    name: str,
    head: Release,
    traffic: Traffic,
    candidates: list[Candidate],
    chain: list[Release],
    scores: dict[str, ScoreStats],
    figures: Sequence[Figure] = (),
    metrics: Mapping[str, Mapping[str, ScoreStats]] | None = None,
) -> OverviewRow:
    """The row of scenario `name` from its head, traffic, candidates (newest first), release
    chain (oldest first), the scores and named metrics reported per release and its figures
    (reef.figures). The
    sparkline is the learning page's headline series: a held-out figure when there is one, else
    a gate guard's held-out mean, else the mean reported score."""
    lead = headline(chain, scores, figure_series(chain, figures), metrics)
    return OverviewRow(
        name=name,
        head=head,
        traffic=traffic,
        bars=tuple(bars(traffic.hourly)),
        last=candidates[0] if candidates else None,
        pending=sum(1 for c in candidates if c.status == "pending"),
        curve=sparkline(list(lead[0].values)) if lead else "",
        releases=len(chain),
        lead=tuple(c for c in (change(chain, s) for s in lead[:LEAD]) if c is not None),
    )
