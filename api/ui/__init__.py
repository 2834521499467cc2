"""Reef's own dashboard at /ui: server-rendered pages, its static assets, its sign-in sessions."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from api.ui.pages import router
from api.ui.signin import Sessions

STATIC = Path(__file__).parent / "static"


def install(app: FastAPI) -> None:
    """Serve the dashboard from `app`: its pages, its assets (no CDN: everything the pages
    load comes from here) and the process's sign-in sessions."""
    app.state.ui_sessions = Sessions()
    app.state.ui_readiness = {}  # scenario -> (when, readiness): the overview's slow cell
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
