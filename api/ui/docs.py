"""The API's own docs, served from this process: Swagger UI at /docs, ReDoc at /redoc, both
from the vendored files in static/ (`make ui` copies them from npm), and `/` sends a browser to
the dashboard.

FastAPI's default pages load Swagger UI, ReDoc and Google's fonts from CDNs, and start Swagger
UI with an inline script: blank pages offline, and nothing a Content-Security-Policy without
'unsafe-inline' scripts allows. These pages load only files of this server (Swagger UI is
started by static/docs.js), and UiHeaders gives them DOCS_CONTENT_SECURITY_POLICY.
"""

from __future__ import annotations

from html import escape

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse

router = APIRouter(include_in_schema=False)

_SWAGGER = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} - Swagger UI</title>
<link rel="stylesheet" href="{root}/ui/static/swagger-ui.css">
</head>
<body data-spec="{spec}">
<div id="swagger-ui"></div>
<script src="{root}/ui/static/swagger-ui-bundle.js"></script>
<script src="{root}/ui/static/docs.js"></script>
</body>
</html>
"""

# ReDoc starts itself on the <redoc> element; it loads no font unless the page does.
_REDOC = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} - ReDoc</title>
</head>
<body>
<redoc spec-url="{spec}"></redoc>
<script src="{root}/ui/static/redoc.standalone.js"></script>
</body>
</html>
"""


def _page(request: Request, template: str) -> HTMLResponse:
    root = escape(str(request.scope.get("root_path", "")).rstrip("/"))
    title = escape(request.app.title)
    return HTMLResponse(template.format(root=root, title=title, spec=f"{root}/openapi.json"))


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return _page(request, _SWAGGER)


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    return _page(request, _REDOC)


@router.get("/")
async def root(request: Request) -> RedirectResponse:
    """A browser at the server's root lands on the dashboard."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    return RedirectResponse(f"{root}/ui", status_code=307)
