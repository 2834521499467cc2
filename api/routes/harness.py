"""Harness routes: read a release's harness (the manifest and files), and publish a new one.

A harness is released on the scenario's chain like weights: a new harness release keeps the
head's weights and goes through the same deploy step (stage → verify → compare-and-swap).
Executable content (extensions, scripts) is never released from here: it waits for review as
a pending candidate (promote releases it). POST /reef/train turns a plain-language ask into a
harness candidate in the worker and answers with a job to poll.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from reef.api.answers import candidate_out, release_out
from reef.api.bodies import read_json, validate
from reef.api.contract import SCENARIO, ScenarioPath, ScenarioQuery, errors, reads
from reef.api.services import Services, caller
from reef.errors import BadRequest, NotFound, ServiceUnavailable
from reef.harness import Harness
from reef.records import Candidate, Job, Release, new_id, utcnow
from reef.wire import CandidateOut, HarnessIn, HarnessOut, JobOut, ReleaseOut, TrainIn

router = APIRouter(tags=["harness"])

ADAPTERS = Path(__file__).resolve().parents[1] / "adapters"


@dataclasses.dataclass(frozen=True)
class Agent:
    """An agent Reef installs with api/adapters/agents/install.sh: its npm package (pinned),
    the command it runs as, and its wrapper's body (api/adapters/agents/<adapter>.sh)."""

    name: str
    package: str
    version: str
    bin: str


AGENTS = {
    "pi": Agent("pi", "@mariozechner/pi-coding-agent", "0.73.1", "pi"),
    "codex": Agent("Codex", "@openai/codex", "0.171.0", "codex"),
    "claude-code": Agent("Claude Code", "@anthropic-ai/claude-code", "2.1.332", "claude"),
    "opencode": Agent("opencode", "opencode-ai", "1.18.33", "opencode"),
}
_SHELL_SAFE = re.compile(r"[A-Za-z0-9._:/@+-]+")


class ShellScript(PlainTextResponse):
    media_type = "text/x-shellscript"


@router.get(
    "/reef/harness",
    response_model=HarnessOut,
    openapi_extra=reads(headers=(SCENARIO,)),
    responses=errors(403, 404, 503),
    summary="The harness a release (default: the head) or a candidate carries: manifest, files",
)
async def get_harness(
    request: Request,
    scenario: ScenarioQuery = None,
    release_id: str | None = None,
    content: bool = True,
) -> dict[str, Any]:
    svc, _, name = caller(request, scenario)
    release, candidate = await _release(svc, name, release_id)
    harness = await asyncio.to_thread(svc.chain.harnesses.get, release)
    head = await asyncio.to_thread(svc.store.get_scenario, name)
    out: dict[str, Any] = {
        "object": "harness",
        "scenario": name,
        "release_id": release.id,
        "parent_release_id": release.parent_id,
        "current": release.id == head.head_release_id,
        "content_hash": None,
        "inject": False,
        "files": [],
        "skills": [],
        "executable": [],
        "evaluation": {"gate": release.gate, "metrics": release.metrics},
    }
    if candidate is not None:  # what a reviewer reads before promoting it
        out["candidate"] = {"status": candidate.status, "message": candidate.message}
    if harness is None:
        return out
    manifest = harness.manifest()
    files = manifest["files"]
    if content:
        files = [{**f, "content": harness.files[f["path"]]} for f in files]
    out.update(
        content_hash=manifest["content_hash"],
        inject=harness.config().get("inject") is True,
        files=files,
        executable=harness.executable_files(),
        skills=[s.__dict__ for s in harness.skills()],
    )
    return out


@router.get(
    "/reef/harness/install",
    response_class=ShellScript,
    openapi_extra=reads(headers=(SCENARIO,)),
    responses=errors(403, 404, e404="no installer for that adapter"),
    summary="A POSIX sh script installing an agent with the scenario's harness "
    "(adapter=pi|codex|claude-code|opencode)",
)
async def install_script(
    request: Request,
    adapter: str,
    scenario: ScenarioQuery = None,
    context_window: Annotated[int, Query(ge=256, le=1_048_576)] = 8192,
    max_tokens: Annotated[int | None, Query(ge=1)] = None,
) -> PlainTextResponse:
    svc, _, name = caller(request, scenario)
    if adapter not in AGENTS:
        raise NotFound(
            f"no installer for adapter '{adapter}' (there are: {', '.join(AGENTS)})",
            param="adapter",
        )
    agent = AGENTS[adapter]
    values = {
        "REEF_URL": str(request.base_url).rstrip("/"),
        "SCENARIO": name,
        "MODEL": svc.serving.models()[0],
        "CONTEXT_WINDOW": str(context_window),
        "MAX_TOKENS": str(min(max_tokens or 1024, svc.settings.server.max_tokens_cap)),
        "AGENT": adapter,
        "PACKAGE": agent.package,
        "VERSION": agent.version,
        "BIN": agent.bin,
    }
    folder = ADAPTERS / "agents"
    script = (folder / "install.sh").read_text()
    script = script.replace("@REEF_AGENT_MJS@", (folder / "reef-agent.mjs").read_text().rstrip())
    script = script.replace("@WRAPPER@", (folder / f"{adapter}.sh").read_text().rstrip())
    script = script.replace("@AGENT_NAME@", agent.name)
    for key, value in values.items():  # they land in sh and JSON literals: nothing to escape
        if not _SHELL_SAFE.fullmatch(value):
            raise BadRequest(f"cannot write {key.lower()} '{value}' into an install script")
    for key, value in values.items():
        script = script.replace(f"@{key}@", value)
    return ShellScript(script)


@router.post(
    "/reef/scenarios/{scenario}/harness",
    response_model=ReleaseOut,
    status_code=201,
    openapi_extra=reads(HarnessIn),
    summary="Release a new harness on the scenario's chain, keeping its weights (admin)",
    responses={
        202: {
            "model": CandidateOut,
            "description": "it changes executable content: held as a pending candidate for review "
            "(POST /reef/scenarios/{scenario}/promote releases it)",
        },
        **errors(404, 409, 500, 503, e409="the head moved meanwhile, or nothing changed"),
    },
)
async def publish_harness(request: Request, scenario: ScenarioPath) -> Any:
    svc, principal, name = caller(request, scenario)
    principal.require_admin("releasing a harness")
    body = validate(HarnessIn, await read_json(request, svc.settings.server.max_body_bytes))
    if (body.files is None) == (body.edits is None):
        raise BadRequest("give either 'files' (the whole harness) or 'edits'", param="files")
    if body.files is not None:
        new = Harness(body.files).validate()
    else:
        await asyncio.to_thread(svc.store.ensure_scenario, name)
        head = await asyncio.to_thread(svc.store.head_release, name)
        new = (await asyncio.to_thread(svc.chain.harness, head)).apply(body.edits or [])
    made = await asyncio.to_thread(svc.chain.release_harness, name, new)
    if isinstance(made, Candidate):  # held for review: never served before someone read it
        out = candidate_out(made, admin=True)  # admins only
        return JSONResponse(out.model_dump(mode="json"), status_code=202)
    return release_out(made, made.id, admin=True)


@router.post(
    "/reef/train",
    response_model=JobOut,
    status_code=202,
    openapi_extra=reads(TrainIn, headers=(SCENARIO,)),
    summary="Turn a plain-language ask into a harness candidate held for review; poll the job",
    responses={
        202: {
            "description": "the job, queued",
            "headers": {
                "location": {"description": "where to poll it", "schema": {"type": "string"}}
            },
        },
        **errors(503, e503="no worker runs jobs (reef.auto is off), or the store is down"),
    },
)
async def train(request: Request, response: Response) -> JobOut:
    svc, _, name = caller(request)
    body = validate(TrainIn, await read_json(request, svc.settings.server.max_body_bytes))
    if svc.evolver is None:
        raise ServiceUnavailable(
            "no worker runs jobs on this server: start reef serve with reef.auto on",
            code="no_worker",
        )
    await asyncio.to_thread(svc.store.ensure_scenario, name)
    now = utcnow()
    job = Job(
        id=new_id("job"),
        scenario=name,
        kind="instruct",
        status="queued",
        request={"text": body.text},
        created_at=now,
        updated_at=now,
        steps=[{"at": now.isoformat(), "step": "queued"}],
    )
    await asyncio.to_thread(svc.store.add_job, job)
    if not svc.evolver.run_job(name, job.id):
        await asyncio.to_thread(
            svc.store.update_job,
            name,
            job.id,
            status="failed",
            message="the worker is not running",
            step={"step": "failed"},
        )
        raise ServiceUnavailable("the worker is not running", code="no_worker")
    out = job_out(request, job)
    response.headers["location"] = out.url
    return out


@router.get(
    "/reef/train/{job_id}",
    response_model=JobOut,
    openapi_extra=reads(headers=(SCENARIO,)),
    responses=errors(403, 404, 503),
    summary="A train job's progress: its steps, then its candidate (or why it failed)",
)
async def train_job(request: Request, job_id: str, scenario: ScenarioQuery = None) -> JobOut:
    svc, _, name = caller(request, scenario)
    return job_out(request, await asyncio.to_thread(svc.store.get_job, name, job_id))


def job_out(request: Request, job: Job) -> JobOut:
    d = dataclasses.asdict(job)
    url = f"{str(request.base_url).rstrip('/')}/reef/train/{job.id}?scenario={job.scenario}"
    return JobOut(**d, url=url)


async def _release(
    svc: Services, scenario: str, release_id: str | None
) -> tuple[Release, Candidate | None]:
    """The release `release_id` names (default: the head); or, for a candidate's id, the
    release it would become, with the candidate."""
    if release_id is None:
        return await asyncio.to_thread(svc.store.head_release, scenario), None
    try:
        return await asyncio.to_thread(svc.store.get_release, scenario, release_id), None
    except NotFound:
        try:
            cand = await asyncio.to_thread(svc.store.get_candidate, scenario, release_id)
        except NotFound:
            raise NotFound(
                f"no release or candidate '{release_id}' in scenario '{scenario}'",
                param="release_id",
            ) from None
    return cand.release(), cand
