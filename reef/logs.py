"""One log format for every Reef process: Reef's own loggers, uvicorn's, and the libraries'
that log through `logging`, as text or as JSON lines (`server.log_format`).

A line names the scenario, the record and the request it was logged for, where known. They
travel in context variables, set where they become known (the request by the HTTP middleware,
the scenario and record when a call is placed, the scenario by a worker's run), so anything
logged while serving that call carries them, from its own task, its threads (asyncio.to_thread
copies the context) and its streams. A request's id is the client's `x-request-id` when it
sends one (a load balancer's), else made when a line first needs it.

Progress bars (tqdm, Hugging Face's) draw with carriage returns: in a log file they are runs of
`\\r`. `quiet_progress_bars` turns them off unless stderr is a terminal.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from collections.abc import MutableMapping
from contextvars import ContextVar
from typing import Any, Literal

SCENARIO: ContextVar[str | None] = ContextVar("reef_scenario", default=None)
RECORD: ContextVar[str | None] = ContextVar("reef_record_id", default=None)
# The ASGI scope of the request being served (its id is read from it only when a line needs it)
REQUEST: ContextVar[MutableMapping[str, Any] | None] = ContextVar("reef_request", default=None)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_REQUEST_ID = "reef.request_id"
_MAX_REQUEST_ID = 128


def for_call(scenario: str, record_id: str) -> str:
    """The call being served from here on (in this task) is `record_id` of `scenario`;
    returns `record_id`."""
    SCENARIO.set(scenario)
    RECORD.set(record_id)
    return record_id


def request_id() -> str | None:
    """The id of the request being served, or None outside one."""
    scope = REQUEST.get()
    if scope is None:
        return None
    known = scope.get(_REQUEST_ID)
    if known is None:
        known = uuid.uuid4().hex[:16]
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                given = value.decode("latin-1")[:_MAX_REQUEST_ID]
                if given.isprintable() and given.strip():
                    known = given
                break
        scope[_REQUEST_ID] = known
    return str(known)


def context() -> dict[str, str]:
    """The scenario, record and request ids known where this is called."""
    out = {}
    if (scenario := SCENARIO.get()) is not None:
        out["scenario"] = scenario
    if (record := RECORD.get()) is not None:
        out["record_id"] = record
    if (request := request_id()) is not None:
        out["request_id"] = request
    return out


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message [scenario=... record_id=... request_id=...]`."""

    def __init__(self, process: str | None = None):
        fmt = (
            TEXT_FORMAT
            if process is None
            else TEXT_FORMAT.replace("%(name)s", f"{process} %(name)s")
        )
        super().__init__(fmt)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        known = context()
        if not known:
            return line
        tags = " ".join(f"{k}={v}" for k, v in known.items())
        head, newline, rest = line.partition("\n")  # after the message, before a traceback
        return f"{head} [{tags}]{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, then scenario,
    record_id and request_id where known, process (the worker's lines), exception (its
    traceback) when there is one."""

    def __init__(self, process: str | None = None):
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **context(),
        }
        if self.process is not None:
            out["process"] = self.process
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(
    level: str,
    log_format: Literal["text", "json"] = "text",
    *,
    process: str | None = None,
    stream: Any = None,
) -> None:
    """Every line of this process through one handler on stderr in `log_format`: the root
    logger's, uvicorn's (whose own handlers are dropped) and the libraries' that propagate.
    `process` names a process other than the server (the evolve worker) in each line."""
    handler = logging.StreamHandler(stream or sys.stderr)
    formatter = JsonFormatter(process) if log_format == "json" else TextFormatter(process)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = True


def quiet_progress_bars() -> None:
    """No progress bars unless stderr is a terminal: tqdm's (TQDM_DISABLE, its default for
    every bar that does not choose) and Hugging Face's (transformers, hub, datasets), which
    read these variables when imported: call this first. A variable already set stays."""
    if sys.stderr.isatty():
        return
    for name in (
        "TQDM_DISABLE",
        "HF_HUB_DISABLE_PROGRESS_BARS",
        "HF_DATASETS_DISABLE_PROGRESS_BARS",
    ):
        os.environ.setdefault(name, "1")
