"""The engine's admin routes, as deploys drive them: vLLM's LoRA routes plus Reef's own for full
weights, smoke verification and switching a scenario to its new head. Admin tokens only."""

from __future__ import annotations

from fastapi import APIRouter, Request

from reef import faults
from reef.api.bodies import read_json, validate
from reef.api.contract import UPSTREAM_REFUSED, errors, reads
from reef.api.services import Services, services
from reef.errors import BadRequest
from reef.variants import Variants
from reef.wire import (
    EngineGenerateIn,
    GenerationOut,
    LoadAdapterIn,
    LoadWeightsIn,
    RefreshIn,
    ScenarioRefreshed,
    UnloadAdapterIn,
    VariantIn,
    VariantList,
    VariantLoaded,
    VariantUnloaded,
    VariantVerified,
)

router = APIRouter(tags=["engine"])


async def _admin(request: Request, what: str) -> tuple[Services, Variants, dict]:
    svc = services(request)
    svc.auth.principal(request).require_admin(what)
    if svc.variants is None:
        raise BadRequest(
            f"the {svc.engine.kind} engine cannot load releases", code="not_deployable"
        )
    body = await read_json(request, svc.settings.server.max_body_bytes)
    return svc, svc.variants, body


async def _load(svc: Services, variants: Variants, name: str, kind: str, source: str) -> dict:
    """Load what a deploy asks for: its scenario's release files from the artifact store, or
    (engine.allow_local_paths) any directory this server can read."""
    if not svc.settings.engine.allow_local_paths:
        variants.check_source(name, source)
    loaded = await variants.load(name, kind, source)
    faults.reached("staged", name.partition("@")[0])
    return loaded


@router.post(
    "/v1/load_lora_adapter",
    openapi_extra=reads(LoadAdapterIn),
    response_model=VariantLoaded,
    responses=errors(404, 409, 500, 503),
    summary="Load a LoRA adapter under a new name (vLLM's route; never reloads in place)",
)
async def load_lora_adapter(request: Request) -> dict[str, object]:
    svc, variants, raw = await _admin(request, "loading an adapter")
    body = validate(LoadAdapterIn, raw)
    return await _load(svc, variants, body.lora_name, "adapter", body.lora_path)


@router.post(
    "/v1/unload_lora_adapter",
    openapi_extra=reads(UnloadAdapterIn),
    response_model=VariantUnloaded,
    responses=errors(404, 500, 503),
    summary="Unload an adapter (requests already on it finish first)",
)
async def unload_lora_adapter(request: Request) -> dict[str, object]:
    _, variants, raw = await _admin(request, "unloading an adapter")
    body = validate(UnloadAdapterIn, raw)
    return {"name": body.lora_name, "unloaded": await variants.unload(body.lora_name)}


@router.post(
    "/reef/engine/weights",
    openapi_extra=reads(LoadWeightsIn),
    response_model=VariantLoaded,
    responses=errors(404, 409, 500, 503),
    summary="Load full weights (a checkpoint of the same architecture) under a new name",
)
async def load_weights(request: Request) -> dict[str, object]:
    svc, variants, raw = await _admin(request, "loading weights")
    body = validate(LoadWeightsIn, raw)
    return await _load(svc, variants, body.name, "checkpoint", body.path)


@router.post(
    "/reef/engine/verify",
    openapi_extra=reads(VariantIn),
    response_model=VariantVerified,
    responses=errors(404, 500, 503),
    summary="Smoke-generate on a loaded variant",
)
async def verify(request: Request) -> dict[str, object]:
    _, variants, raw = await _admin(request, "verifying a variant")
    name = validate(VariantIn, raw).name
    faults.reached("verifying", name.partition("@")[0])
    return await variants.verify(name)


@router.post(
    "/reef/engine/refresh",
    openapi_extra=reads(RefreshIn),
    response_model=ScenarioRefreshed,
    summary="Serve the scenario's head as stored now (after a deploy moved it)",
)
async def refresh(request: Request) -> dict[str, object]:
    # any engine: a release that changed only the harness is deployed to upstream engines too
    svc = services(request)
    svc.auth.principal(request).require_admin("refreshing a scenario")
    raw = await read_json(request, svc.settings.server.max_body_bytes)
    name = validate(RefreshIn, raw).scenario
    svc.serving.forget(name)
    return {"scenario": name, "refreshed": True}


@router.post(
    "/reef/engine/generate",
    openapi_extra=reads(EngineGenerateIn),
    response_model=GenerationOut,
    responses={**errors(404, 500, 502, 503), **UPSTREAM_REFUSED},
    summary="Generate on a release's weights without recording it (evaluation episodes)",
)
async def generate(request: Request) -> dict[str, object]:
    """What evaluating a harness runs: the same weights that serve the release, none of the
    traffic's side effects (no record, no session, no injection)."""
    svc = services(request)
    svc.auth.principal(request).require_admin("generating outside traffic")
    body = validate(EngineGenerateIn, await read_json(request, svc.settings.server.max_body_bytes))
    svc.serving.check_max_tokens(body.max_tokens)
    scenario = await svc.serving.scenario(body.scenario)
    release_id = body.release_id or scenario.head_release_id
    model = svc.serving.models()[0]
    if svc.variants is not None:
        model = await svc.variants.model_for(scenario.name, release_id) or model
    engine_body: dict[str, object] = {
        "model": model,
        "messages": body.messages,
        "max_tokens": body.max_tokens,
        "temperature": body.temperature,
    }
    if body.seed is not None:
        engine_body["seed"] = body.seed
    done = await svc.engine.complete(engine_body)
    choice = done.response["choices"][0]
    return {
        "object": "reef.generation",
        "release_id": release_id,
        "model": model,
        "text": choice["message"].get("content") or "",
        "finish_reason": choice.get("finish_reason"),
        "usage": done.response.get("usage"),
    }


@router.get(
    "/reef/engine/variants",
    response_model=VariantList,
    responses=errors(403),
    summary="Variants (releases) the engine holds",
)
async def list_variants(request: Request) -> dict[str, object]:
    svc = services(request)
    svc.auth.principal(request).require_admin("listing variants")
    return {"object": "list", "data": svc.variants.loaded() if svc.variants else []}
