"""Figures per release measured outside Reef: a demo's or bench's numbers (say, the held-out
pass rate `make demo` measures after each release) kept beside the scenario's artifacts, so
the dashboard's learning curve shows them next to what Reef itself stores.

Why files in the artifact store and not reports: a figure is a measurement of a release on
questions that must never become training data, and a report is exactly what training reads.
Why not the release's metrics: those are written once, when the release is registered, while
a figure is measured after it serves.

A figure is one JSON object at `figures/<scenario>/<name>.json`:

    {"title": "held-out pass rate", "source": "python -m demo", "order": 0,
     "points": [{"release_id": "rel_...", "value": 0.25}, ...]}

`order` (optional, default 100) says which figure leads: the dashboard lists a scenario's
figures by it, then by name, and the first is the overview's sparkline.

Deleting the scenario removes them with its other files (reef.deletion).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from reef.artifacts import ArtifactStore
from reef.errors import BadRequest, NotFound

PREFIX = "figures"
MAX_FIGURES = 8  # read per page: the dashboard's time budget, whatever a directory holds
MAX_BYTES = 256 * 1024
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Point:
    release_id: str
    value: float


DEFAULT_ORDER = 100


@dataclass(frozen=True)
class Figure:
    name: str
    title: str
    source: str
    points: tuple[Point, ...]
    order: int = DEFAULT_ORDER  # lower leads (the overview's sparkline is the first)


def figure_key(scenario: str, name: str) -> str:
    if not _NAME.match(name):
        raise BadRequest(f"figure name '{name}' must match {_NAME.pattern}", param="name")
    return f"{PREFIX}/{scenario}/{name}.json"


def save_figure(artifacts: ArtifactStore, scenario: str, figure: Figure) -> str:
    """Write (or replace) one figure of `scenario`; returns its URI."""
    body = {
        "title": figure.title,
        "source": figure.source,
        "order": figure.order,
        "points": [asdict(p) for p in figure.points],
    }
    data = json.dumps(body, indent=1).encode()
    if len(data) > MAX_BYTES:
        raise BadRequest(f"figure '{figure.name}' exceeds {MAX_BYTES} bytes")
    return artifacts.put_bytes(figure_key(scenario, figure.name), data)


def load_figures(artifacts: ArtifactStore, scenario: str) -> tuple[list[Figure], list[str]]:
    """The scenario's figures (at most MAX_FIGURES, by name) and, for each file that could not
    be read as one, why: a broken file is reported, never a broken page."""
    keys = [
        k
        for k in artifacts.list_keys(f"{PREFIX}/{scenario}")
        if k.endswith(".json") and k.count("/") == 2
    ]
    figures, problems = [], []
    for key in keys[:MAX_FIGURES]:
        name = key.rsplit("/", 1)[-1].removesuffix(".json")
        try:
            data = artifacts.get_bytes(key)
            if len(data) > MAX_BYTES:
                raise ValueError(f"over {MAX_BYTES} bytes")
            figures.append(_figure(name, json.loads(data)))
        except NotFound:
            continue  # removed between the listing and the read
        except (ValueError, TypeError, KeyError) as e:
            problems.append(f"{key}: {e}")
    if len(keys) > MAX_FIGURES:
        problems.append(f"{len(keys) - MAX_FIGURES} more figures not shown (first {MAX_FIGURES})")
    figures.sort(key=lambda f: (f.order, f.name))
    return figures, problems


def _figure(name: str, body: Any) -> Figure:
    if not isinstance(body, dict) or not isinstance(body.get("points"), list):
        raise ValueError("not a figure: an object with a 'points' list")
    points = []
    for p in body["points"]:
        value = float(p["value"])
        if not math.isfinite(value):
            raise ValueError(f"value {value} of {p['release_id']} is not finite")
        points.append(Point(str(p["release_id"]), value))
    order = body.get("order", DEFAULT_ORDER)
    if not isinstance(order, int) or isinstance(order, bool):
        raise ValueError(f"order {order!r} is not an integer")
    return Figure(
        name, str(body.get("title") or name), str(body.get("source") or ""), tuple(points), order
    )
