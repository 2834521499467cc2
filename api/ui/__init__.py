"""Reef's own dashboard at /ui: server-rendered pages, its static assets, its sign-in; and the
API docs (/docs, /redoc) on the same vendored assets."""

from __future__ import annotations

import secrets
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from reef.api.ui import docs
from reef.api.ui.headers import UiHeaders
from reef.api.ui.pages import router

STATIC = Path(__file__).parent / "static"


def install(app: FastAPI) -> None:
    """Serve the dashboard from `app`: its pages, its assets (no CDN: everything the pages
    load comes from here), the API docs (create the app with docs_url=None, redoc_url=None)
    and the redirect from `/`. Sign-in sessions are in the database (api.ui.signin); the CSRF
    token of no-token mode is the process's. Call it after the other middleware is added: its
    headers then reach every /ui answer, the guard's refusals included."""
    app.state.ui_anonymous_csrf = secrets.token_urlsafe(32)
    app.state.ui_readiness = {}  # scenario -> (when, readiness): the overview's slow cell
    app.include_router(router)
    app.include_router(docs.router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
    app.add_middleware(UiHeaders)
