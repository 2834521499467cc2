"""The `reef` command: `reef serve` starts the API with its engine; `reef token` makes a token;
`reef export` writes a scenario's experience to a file."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from reef.engines.base import Engine
from reef.errors import ConfigError, ReefError
from reef.settings import Settings, load_settings

log = logging.getLogger("reef")


def build_engine(settings: Settings) -> Engine:
    """Construct (not start) the configured engine. Heavy imports (torch) happen only here,
    so importing the API never loads them."""
    cfg = settings.engine
    if cfg.kind == "upstream":
        from reef.engines.upstream import UpstreamEngine

        return UpstreamEngine.from_settings(cfg)
    if cfg.kind == "vllm":
        from reef.engines.vllm import VllmEngine

        return VllmEngine.from_config(cfg, settings.server.state_dir)
    from reef.engines.embedded import EmbeddedEngine
    from reef.models import model_id, resolve_model

    return EmbeddedEngine(
        resolve_model(cfg.model, cfg.model_cache),
        model_id(cfg.model),
        max_batch_size=cfg.max_batch_size,
        default_max_tokens=cfg.default_max_tokens,
        threads=cfg.threads,
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Only the flags given on the command line, as nested settings (they beat YAML and env)."""
    flag_keys = {
        "host": ("server", "host"),
        "port": ("server", "port"),
        "state_dir": ("server", "state_dir"),
        "log_level": ("server", "log_level"),
        "engine": ("engine", "kind"),
        "model": ("engine", "model"),
        "upstream_url": ("engine", "upstream_url"),
        "upstream_model": ("engine", "upstream_model"),
        "vllm_url": ("engine", "vllm_url"),
        "database_url": ("store", "database_url"),
    }
    out: dict[str, dict[str, Any]] = {}
    for flag, (section, key) in flag_keys.items():
        value = getattr(args, flag, None)
        if value is not None:
            out.setdefault(section, {})[key] = value
    return out


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from api.app import create_app

    settings = load_settings(args.config, **_overrides(args))
    logging.basicConfig(
        level=settings.server.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings.server.state_dir.mkdir(parents=True, exist_ok=True)
    engine = build_engine(settings)
    evolver, engine_token = None, None
    if settings.reef.auto:  # the worker evolves scenarios and runs users' jobs (/reef/train)
        from api.auth import new_token
        from api.evolver import Evolver

        # The worker's deploys come back to this server's admin routes with this token; it
        # lives as long as the process and is handed over in the worker's environment only.
        engine_token = new_token() if settings.auth.tokens else None
        evolver = Evolver(args.config, _overrides(args), engine_token, settings.server.state_dir)
    app = create_app(settings, engine, evolver=evolver, engine_token=engine_token)
    url = f"http://{settings.server.host}:{settings.server.port}"
    print(
        f"reef: serving {engine.kind} engine on {url}/v1 (state in {settings.server.state_dir})",
        flush=True,
    )
    uvicorn.run(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=settings.server.log_level,
        access_log=args.access_log,
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=30,
    )
    return 0


def token(args: argparse.Namespace) -> int:
    from api.auth import hash_token, new_token

    secret = new_token()
    entry: dict[str, Any] = {"name": args.name, "sha256": hash_token(secret)}
    if args.admin:
        entry["admin"] = True
    else:
        entry["scenarios"] = args.scenario
    print(f"token (give it to the client; it is not stored): {secret}")
    print("add to your config under auth.tokens:")
    print("  - " + json.dumps(entry))
    return 0


def openapi(args: argparse.Namespace) -> int:
    import tempfile

    from api.app import create_app
    from reef.engines.upstream import UpstreamEngine

    # The spec needs an app, not a running one: nothing here is started or connected.
    with tempfile.TemporaryDirectory() as state_dir:
        settings = load_settings(None, server={"state_dir": state_dir})
        app = create_app(settings, UpstreamEngine("http://127.0.0.1:9/v1", model="reef"))
        text = json.dumps(app.openapi(), indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    else:
        print(text)
    return 0


def export(args: argparse.Namespace) -> int:
    from reef.export import export as write
    from reef.export import format_for
    from reef.store.sql import open_store

    settings = load_settings(args.config, **_overrides(args))
    fmt = format_for(args.output, args.format)
    store = open_store(settings.database_url)
    try:
        n = write(store, args.scenario, args.output, fmt, progress=not args.quiet)
    finally:
        store.close()
    print(f"reef: exported {n} records of '{args.scenario}' to {args.output} ({fmt})")
    return 0


def evolve(args: argparse.Namespace) -> int:
    """Run the evolve flow for a scenario now (or submit a deployment run to a Prefect server)."""
    from flows.worker import run_once

    overrides = _overrides(args)
    settings = load_settings(args.config, **overrides)
    config = str(args.config) if args.config else None
    if args.force:
        from flows.evolve import evolve as flow

        result = flow(args.scenario, config=config, overrides=overrides, force=True)
    else:
        result = run_once(settings, args.scenario, config, overrides)
    print(json.dumps(result, indent=2, default=str))
    return 0 if result.get("status") not in ("failed",) else 1


def _admin_call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    import httpx

    settings = load_settings(args.config, **_overrides(args))
    url = (args.url or settings.engine_url).rstrip("/")
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    r = httpx.request(method, url + path, json=body, headers=headers, timeout=600)
    data = r.json() if r.content else {}
    if r.status_code >= 400:
        message = data.get("error", {}).get("message", r.text) if isinstance(data, dict) else r.text
        raise ReefError(f"{r.status_code}: {message}")
    return data


def releases(args: argparse.Namespace) -> int:
    data = _admin_call(args, "GET", f"/reef/scenarios/{args.scenario}/releases")["data"]
    for r in data:
        mark = "*" if r["current"] else " "
        print(
            f"{mark} {r['seq']:>4} {r['release_id']}  {r['operation']:<9} {r['kind']:<10} "
            f"{r['created_at'][:19]}  {r['model_uri'] or ''}"
        )
    return 0


def move_head(args: argparse.Namespace) -> int:
    body = {"release_id": args.release_id}
    r = _admin_call(args, "POST", f"/reef/scenarios/{args.scenario}/{args.command}", body)
    print(f"reef: {args.command}: release {r['release_id']} (seq {r['seq']}) is the head")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reef", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="serve the OpenAI/Anthropic API and record every call")
    s.add_argument("-c", "--config", type=Path, help="YAML settings file")
    s.add_argument("--host", help="bind address (default 127.0.0.1; non-loopback needs tokens)")
    s.add_argument("--port", type=int, help="port (default 8900)")
    s.add_argument("--state-dir", type=Path, help="SQLite DB and local state (default ./.reef)")
    s.add_argument("--model", help="smollm2 (default), tiny, or a local Hugging Face model dir")
    s.add_argument("--engine", choices=["embedded", "upstream", "vllm"], help="serving engine")
    s.add_argument(
        "--vllm-url", help="a running vLLM server's root URL (engine vllm; default: launch one)"
    )
    s.add_argument("--upstream-url", help="OpenAI base URL ending in /v1 (engine upstream)")
    s.add_argument("--upstream-model", help="model name sent upstream (default: discovered)")
    s.add_argument("--database-url", help="sqlite:///path or postgresql+psycopg://user@host/db")
    s.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    s.add_argument("--access-log", action="store_true", help="log every request")
    s.set_defaults(func=serve)

    t = sub.add_parser("token", help="make an API token and the hash to put in the config")
    t.add_argument("--name", required=True)
    g = t.add_mutually_exclusive_group(required=True)
    g.add_argument("--admin", action="store_true", help="may use every scenario")
    g.add_argument("--scenario", action="append", help="a scenario it may use (repeatable)")
    t.set_defaults(func=token)

    e = sub.add_parser("export", help="export a scenario's sessions, feedback and release ids")
    e.add_argument("--scenario", required=True)
    e.add_argument("--output", required=True, type=Path, help=".jsonl, .parquet, or a directory")
    e.add_argument("--format", choices=["jsonl", "parquet", "hf"], help="default: by extension")
    e.add_argument("-c", "--config", type=Path, help="YAML settings file")
    e.add_argument("--state-dir", type=Path, help="where the SQLite DB is (default ./.reef)")
    e.add_argument("--database-url", help="sqlite:///path or postgresql+psycopg://user@host/db")
    e.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    e.set_defaults(func=export)

    v = sub.add_parser("evolve", help="evolve a scenario now from its eligible experience")
    v.add_argument("--scenario", required=True)
    v.add_argument("-c", "--config", type=Path, help="YAML settings file (as for reef serve)")
    v.add_argument("--state-dir", type=Path, help="state directory (default ./.reef)")
    v.add_argument("--model", help="the served model (smollm2, tiny or a directory)")
    v.add_argument("--database-url", help="sqlite:///path or postgresql+psycopg://user@host/db")
    v.add_argument("--port", type=int, help="port of the reef serve to deploy to")
    v.add_argument("--force", action="store_true", help="run locally even below batch_size")
    v.set_defaults(func=evolve)

    for name, what in (
        ("releases", "list a scenario's releases, newest first (* = head)"),
        ("rollback", "republish an earlier release as the head"),
        ("promote", "publish a pending candidate as the head"),
    ):
        r = sub.add_parser(name, help=what)
        r.add_argument("--scenario", required=True)
        if name != "releases":
            r.add_argument("--release-id", required=True)
        r.add_argument("-c", "--config", type=Path, help="YAML settings file")
        r.add_argument("--url", help="the reef server (default: from the settings)")
        r.add_argument("--token", default=os.environ.get("REEF_API_KEY"), help="admin token")
        r.set_defaults(func=releases if name == "releases" else move_head)

    o = sub.add_parser("openapi", help="print the HTTP API's OpenAPI spec")
    o.add_argument("-o", "--output", help="write to this file instead of stdout")
    o.set_defaults(func=openapi)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as e:
        print(f"reef: {e.message}", file=sys.stderr)
        return 2
    except ReefError as e:
        print(f"reef: {e.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
