"""The `reef` command. `reef serve` starts the API with its engine; `reef config` prints the
settings it would use. Against a running server: `reef report` sends feedback on receipts,
`reef releases|rollback|promote` and `reef rollout` read and move a scenario's head. Offline:
`reef token` makes a token, `reef export` writes a scenario's experience to a file, `reef
import` reads one in (OpenAI chat JSONL, OTLP/JSON GenAI spans or an export), `reef evolve`
runs the evolve flow, `reef gc` finishes scenario deletions and applies retention, `reef
backup` copies a deployment out and `reef restore` puts it into an empty one, `reef openapi`
prints the HTTP API's spec, `reef completion bash|zsh` a shell completion script."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.cli.extras import TRAIN_MODULES
from reef.errors import ConfigError, ReefError

if TYPE_CHECKING:
    from reef.settings import Settings

    # The subcommands of `reef`, as argparse adds them.
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]

# The setting each settings flag sets, by the flag's dest (flags beat YAML and the environment).
FLAG_SETTINGS: dict[str, tuple[str, ...]] = {
    "host": ("server", "host"),
    "port": ("server", "port"),
    "state_dir": ("server", "state_dir"),
    "log_level": ("server", "log_level"),
    "log_format": ("server", "log_format"),
    "engine": ("engine", "kind"),
    "model": ("engine", "model"),
    "upstream_url": ("engine", "upstream", "url"),
    "upstream_model": ("engine", "upstream", "model"),
    "vllm_url": ("engine", "vllm", "url"),
    "database_url": ("store", "database_url"),
}


def load_settings(config: Path | None, **overrides: Any) -> Settings:
    """reef.settings.load_settings, imported when a command needs it: `reef --version`,
    `reef report` and `reef completion` run where only the client extra is installed."""
    from reef.settings import load_settings as load

    return load(config, **overrides)


def missing_extra(command: str, error: ModuleNotFoundError) -> str:
    """One line for a command whose extra is not installed (a client-only install): the train
    extra for the learning loop's modules and for `reef evolve`, the serve extra for the rest."""
    name = (error.name or "").split(".")[0]
    extra = "train" if name in TRAIN_MODULES or command == "evolve" else "serve"
    return (
        f"`reef {command}` needs the {extra} extra (no module named '{name}' here): "
        f"pip install 'reef-agents[{extra}]', or 'reef-agents[all]'"
    )


def env_var(setting: tuple[str, ...]) -> str:
    """The environment variable a setting is read from: ("server", "port") -> REEF_SERVER__PORT."""
    return "REEF_" + "__".join(setting).upper()


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Only the flags given on the command line, as nested settings (they beat YAML and env)."""
    out: dict[str, Any] = {}
    for flag, (*sections, key) in FLAG_SETTINGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            place = out
            for section in sections:
                place = place.setdefault(section, {})
            place[key] = value
    return out


def serve(args: argparse.Namespace) -> int:
    from reef.cli.serve import serve as run

    return run(args, _overrides(args))


def token(args: argparse.Namespace) -> int:
    from reef.api.auth import hash_token, new_token

    secret = new_token()
    entry: dict[str, Any] = {"name": args.name, "sha256": hash_token(secret)}
    if args.admin:
        entry["admin"] = True
    else:
        entry["scenarios"] = args.scenario
        if args.reviewer:
            entry["reviewer"] = True
    print(f"token (give it to the client; it is not stored): {secret}")
    print("add to your config under auth.tokens:")
    print("  - " + json.dumps(entry))
    return 0


def openapi(args: argparse.Namespace) -> int:
    from reef.cli.serve import openapi as write

    return write(args)


def export(args: argparse.Namespace) -> int:
    from reef.export import export as write
    from reef.export import format_for
    from reef.store.sql import open_store

    settings = load_settings(args.config, **_overrides(args))
    fmt = format_for(args.output, args.format)
    store = open_store(settings.database_url)
    archive = None
    if args.include_archive:
        from reef.artifacts import artifacts_for

        archive = artifacts_for(settings)
    try:
        n = write(store, args.scenario, args.output, fmt, progress=not args.quiet, archive=archive)
    finally:
        store.close()
    print(f"reef: exported {n} records of '{args.scenario}' to {args.output} ({fmt})")
    return 0


def import_experience(args: argparse.Namespace) -> int:
    """Records and reports from a JSONL file (reef.imports); a re-import adds nothing."""
    from reef.imports import import_file
    from reef.store.sql import open_store

    if not args.file.is_file():
        raise ConfigError(f"cannot import {args.file}: no such file")
    settings = load_settings(args.config, **_overrides(args))
    store = open_store(settings.database_url)
    try:
        store.migrate()
        result = import_file(store, args.scenario, args.file)
    finally:
        store.close()
    print(
        f"reef: imported {result.records} records and {result.reports} reports into "
        f"'{args.scenario}' ({result.skipped} lines were there already)"
    )
    if result.dangling_reports:
        shown = ", ".join(result.dangling_reports[:5])
        print(
            f"reef: {len(result.dangling_reports)} reports quote records not in the file: {shown}"
        )
    return 0


def backup(args: argparse.Namespace) -> int:
    """Copy the deployment (database, MLflow, artifacts) into a new directory."""
    from reef.backup import backup as run

    settings = load_settings(args.config, **_overrides(args))
    out = run(settings, args.output)
    for part in out.done:
        print(f"reef backup: {part}")
    for note in out.notes:
        print(f"reef backup: note: {note}")
    heads = out.manifest["heads"]
    print(f"reef backup: {len(heads)} scenarios, their heads in {args.output / 'reef-backup.json'}")
    return 0


def restore(args: argparse.Namespace) -> int:
    """Put a backup into an empty deployment, then check its heads are the backup's."""
    from reef.backup import restore as run

    settings = load_settings(args.config, **_overrides(args))
    out = run(settings, args.input)
    for part in out.done:
        print(f"reef restore: {part}")
    for note in out.notes:
        print(f"reef restore: note: {note}")
    print(f"reef restore: {len(out.manifest['heads'])} scenarios at the backup's heads")
    return 0


def evolve(args: argparse.Namespace) -> int:
    """Run the evolve flow for a scenario now (or submit a deployment run to a Prefect server)."""
    from reef.flows.worker import run_once, tie_temporary_server

    tie_temporary_server()  # a Prefect temporary server, if one starts, dies with the command
    overrides = _overrides(args)
    settings = load_settings(args.config, **overrides)
    config = str(args.config) if args.config else None
    if args.force:
        from reef.flows.evolve import evolve as flow

        # secrets reach the in-process flow as SecretStr: Prefect stores them masked
        from reef.settings import conceal

        result = flow(args.scenario, config=config, overrides=conceal(overrides), force=True)
    else:
        result = run_once(settings, args.scenario, config, overrides)
    print(json.dumps(result, indent=2, default=str))
    return 0 if result.get("status") not in ("failed",) else 1


def gc(args: argparse.Namespace) -> int:
    """Finish scenario deletions: remove what deleted scenarios left in the artifact store and
    MLflow (their tombstones say which); what fails stays pending for the next run. Then, with
    `store.retention_days`, archive and delete old records and reports (reef.retention)."""
    from reef.artifacts import artifacts_for
    from reef.deletion import collect_garbage
    from reef.retention import apply_retention
    from reef.store.sql import open_store

    settings = load_settings(args.config, **_overrides(args))
    store = open_store(settings.database_url)
    artifacts = artifacts_for(settings)
    try:
        results = collect_garbage(store, settings, artifacts)
        archived = apply_retention(store, settings, artifacts)
    finally:
        store.close()
    for a in archived:
        if a.records or a.reports or a.kept:
            print(
                f"reef gc: {a.scenario}: archived {a.records} records and {a.reports} reports "
                f"older than {a.cutoff:%Y-%m-%d %H:%M} UTC in {len(a.files)} files; "
                f"{a.kept} old records kept for a pending batch"
            )
    if not results:
        print("reef gc: no deleted scenario left anything behind")
    for r in results:
        if not r.done:
            print(f"reef gc: {r.scenario}: not finished, run again: {r.error}")
        elif r.note:
            print(f"reef gc: {r.scenario}: {r.note}")
        else:
            m = r.mlflow
            mlflow = (
                f"{m.model_versions} model versions, {m.runs} runs, {m.logged_models} logged models"
                if m
                else "nothing"
            )
            print(f"reef gc: {r.scenario}: removed {r.artifacts} artifact keys; MLflow: {mlflow}")
    return 0 if all(r.done for r in results) else 1


def _admin_call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    from reef.deploy.engine import EngineAdmin

    settings = load_settings(args.config, **_overrides(args))
    admin = EngineAdmin(args.url or settings.engine_url, args.token, timeout_s=600)
    try:
        return admin.request(method, path, body)
    finally:
        admin.close()


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


def rollout(args: argparse.Namespace) -> int:
    """`reef rollout status|promote|abort --scenario S`: a live canary, shadow or A/B split, or
    end it now (`--release`: which release of an A/B split promote keeps)."""
    path = f"/reef/scenarios/{args.scenario}/rollout"
    if args.action == "status":
        r = _admin_call(args, "GET", path)
        if r.get("mode") == "ab":
            print(
                f"reef: A/B split, {r['share']:.0%} of sessions on b by {r['sticky']}, "
                f"since {r['started_at'][:19]}"
            )
            for name, arm in r["arms"].items():
                mean = "–" if arm["mean"] is None else f"{arm['mean']:.3f}"
                low, high = arm["interval"]
                print(
                    f"reef:   {name} {arm['release_id']}: n={arm['n']} mean={mean} "
                    f"[{low:.3f}, {high:.3f}]"
                )
        else:
            shadow = r.get("mode") == "shadow"
            serves = "of calls copied" if shadow else f"of sessions by {r['sticky']}"
            print(
                f"reef: {'shadow' if shadow else 'canary'} {r['canary_release_id']} vs control "
                f"{r['control_release_id']} ({r['share']:.0%} {serves}, "
                f"since {r['started_at'][:19]})"
            )
        print(f"reef: {r['verdict']['outcome']}: {r['verdict']['reason']}")
        if r.get("abort"):
            print(f"reef: the guardrail would abort it: {r['abort']}")
        return 0
    body: dict[str, str] | None = None
    if args.action == "abort" and args.reason:
        body = {"reason": args.reason}
    if args.action == "promote" and args.release:
        body = {"release_id": args.release}
    r = _admin_call(args, "POST", f"{path}/{args.action}", body)
    print(f"reef: rollout {args.action}: release {r['release_id']} (seq {r['seq']}) is the head")
    return 0


def _feedback(text: str | None) -> str | dict[str, Any] | None:
    """--feedback: a JSON object when it is one ('{"correction": "Paris."}'), else the text."""
    if text is None or not text.lstrip().startswith("{"):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def _metric(text: str) -> tuple[str, bool | float | str]:
    """NAME=VALUE: true/false a boolean, a number a float, anything else a category."""
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError("give NAME=VALUE, e.g. helpful=true")
    if raw.lower() in ("true", "false"):
        return name, raw.lower() == "true"
    try:
        return name, float(raw)
    except ValueError:
        return name, raw


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object: {...}")
    return value


def report(args: argparse.Namespace) -> int:
    """Feedback on receipts, through the Python client (reef.client)."""
    from reef.client import Reef, ReefAPIError

    with Reef(args.url, args.token, scenario=args.scenario) as client:
        try:
            out = client.report(
                args.receipts,
                score=args.score,
                feedback=_feedback(args.feedback),
                report_id=args.report_id,
                metadata=args.metadata,
                metrics=dict(args.metric or []),
            )
        except ReefAPIError as e:
            print(f"reef: {client.base_url} answered {e}", file=sys.stderr)
            return 1
    if args.json:
        print(out.model_dump_json(indent=2))
        return 0
    n = len(out.references)
    done = "stored" if out.created else "was already stored (same report_id and content)"
    print(f"reef: report {out.id} on {n} receipt{'s' * (n != 1)} of '{out.scenario}' {done}")
    return 0


def show_config(args: argparse.Namespace) -> int:
    """The settings `reef serve` would run with here, secrets masked."""
    import yaml

    from reef.cli.config import masked

    settings = load_settings(args.config, **_overrides(args))
    source = f"< {args.config} " if args.config else ""
    print(f"# effective settings: defaults {source}< REEF_* environment < flags; secrets masked")
    print(yaml.safe_dump(masked(settings), sort_keys=False, allow_unicode=True), end="")
    return 0


def completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(parser(), shell=args.shell), end="")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reef", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for add in (
        _serve_command,
        _token_command,
        _export_command,
        _import_command,
        _evolve_command,
        _chain_commands,
        _rollout_command,
        _gc_command,
        _backup_commands,
        _openapi_command,
    ):
        add(sub)
    return _finish(p, sub)


def _serve_command(sub: Subcommands) -> None:
    """`reef serve`: the server, its engine and where it keeps its state."""
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
    s.add_argument("--log-format", choices=["text", "json"], help="log lines (default text)")
    s.add_argument("--access-log", action="store_true", help="log every request")
    s.set_defaults(func=serve)


def _token_command(sub: Subcommands) -> None:
    """`reef token`: an API token for the admin or for some scenarios."""
    t = sub.add_parser("token", help="make an API token and the hash to put in the config")
    t.add_argument("--name", required=True)
    g = t.add_mutually_exclusive_group(required=True)
    g.add_argument("--admin", action="store_true", help="may use every scenario")
    g.add_argument("--scenario", action="append", help="a scenario it may use (repeatable)")
    t.add_argument(
        "--reviewer",
        action="store_true",
        help="with --scenario: may review those scenarios' turns in the dashboard (no release "
        "actions)",
    )
    t.set_defaults(func=token)


def _export_command(sub: Subcommands) -> None:
    """`reef export`: a scenario's experience written to a file or a directory."""
    e = sub.add_parser("export", help="export a scenario's sessions, feedback and release ids")
    e.add_argument("--scenario", required=True)
    e.add_argument("--output", required=True, type=Path, help=".jsonl, .parquet, or a directory")
    e.add_argument("--format", choices=["jsonl", "parquet", "hf"], help="default: by extension")
    e.add_argument("-c", "--config", type=Path, help="YAML settings file")
    e.add_argument("--state-dir", type=Path, help="where the SQLite DB is (default ./.reef)")
    e.add_argument("--database-url", help="sqlite:///path or postgresql+psycopg://user@host/db")
    e.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    e.add_argument(
        "--include-archive",
        action="store_true",
        help="also the records and reports retention archived to the artifact store",
    )
    e.set_defaults(func=export)


def _import_command(sub: Subcommands) -> None:
    """`reef import`: records and feedback from a JSONL file into a scenario."""
    m = sub.add_parser(
        "import",
        help="import experience from a JSONL file (OpenAI chat lines, OTLP/JSON GenAI spans, "
        "or reef export's rows)",
    )
    m.add_argument("file", type=Path, help="a .jsonl file")
    m.add_argument("--scenario", required=True, help="the scenario to add them to (made if new)")
    m.add_argument("-c", "--config", type=Path, help="YAML settings file")
    m.add_argument("--state-dir", type=Path, help="where the SQLite DB is (default ./.reef)")
    m.add_argument("--database-url", help="sqlite:///path or postgresql+psycopg://user@host/db")
    m.set_defaults(func=import_experience)


def _evolve_command(sub: Subcommands) -> None:
    """`reef evolve`: one evolve run now, from the scenario's eligible experience."""
    v = sub.add_parser("evolve", help="evolve a scenario now from its eligible experience")
    v.add_argument("--scenario", required=True)
    v.add_argument("-c", "--config", type=Path, help="YAML settings file (as for reef serve)")
    v.add_argument("--state-dir", type=Path, help="state directory (default ./.reef)")
    v.add_argument("--model", help="the served model (smollm2, tiny or a directory)")
    v.add_argument("--database-url", help="sqlite:///path or postgresql+psycopg://user@host/db")
    v.add_argument("--port", type=int, help="port of the reef serve to deploy to")
    v.add_argument("--force", action="store_true", help="run locally even below batch_size")
    v.set_defaults(func=evolve)


def _chain_commands(sub: Subcommands) -> None:
    """`reef releases|rollback|promote`: a running server's release chain."""
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


def _rollout_command(sub: Subcommands) -> None:
    """`reef rollout`: a scenario's live canary, shadow or A/B split."""
    ro = sub.add_parser(
        "rollout", help="a scenario's live canary, shadow or A/B split: status, promote or abort"
    )
    ro.add_argument(
        "action",
        choices=["status", "promote", "abort"],
        help="status: the live rollout and its verdict so far; promote: end it now, the canary "
        "(or the A/B release kept) becomes the head; abort: end it now, the head stays",
    )
    ro.add_argument("--scenario", required=True)
    ro.add_argument("--reason", help="abort: why (recorded on the rollback release)")
    ro.add_argument(
        "--release",
        metavar="RELEASE_ID",
        help="promote, A/B split: the release id kept, one of rollout.ab.releases (default: "
        "the second, b)",
    )
    ro.add_argument("-c", "--config", type=Path, help="YAML settings file")
    ro.add_argument("--url", help="the reef server (default: from the settings)")
    ro.add_argument("--token", default=os.environ.get("REEF_API_KEY"), help="admin token")
    ro.set_defaults(func=rollout)


def _gc_command(sub: Subcommands) -> None:
    """`reef gc`: scenario deletions finished, then retention applied."""
    c = sub.add_parser(
        "gc",
        help="finish scenario deletions (their files and MLflow entries), then archive "
        "records and reports older than store.retention_days",
    )
    c.add_argument("-c", "--config", type=Path, help="YAML settings file (as for reef serve)")
    c.add_argument("--state-dir", type=Path, help="state directory (default ./.reef)")
    c.add_argument("--database-url", help="sqlite:///path or postgresql+psycopg://user@host/db")
    c.set_defaults(func=gc)


def _backup_commands(sub: Subcommands) -> None:
    """`reef backup` and `reef restore`: the deployment copied out, and into an empty one."""
    b = sub.add_parser(
        "backup",
        help="copy the database, MLflow's SQLite store and a local artifact store into a new "
        "directory (safe while the server runs)",
    )
    b.add_argument("--output", required=True, type=Path, help="a new or empty directory")
    r = sub.add_parser(
        "restore",
        help="put a backup into an empty deployment (state directory, database), rewrite the "
        "artifact paths, migrate the schema and check the heads",
    )
    r.add_argument("--input", required=True, type=Path, help="a directory `reef backup` wrote")
    for c in (b, r):
        c.add_argument("-c", "--config", type=Path, help="YAML settings file (as for reef serve)")
        c.add_argument("--state-dir", type=Path, help="state directory (default ./.reef)")
        c.add_argument("--database-url", help="sqlite:///path or postgresql+psycopg://user@host/db")
    b.set_defaults(func=backup)
    r.set_defaults(func=restore)


def _openapi_command(sub: Subcommands) -> None:
    """`reef openapi`: the HTTP API's OpenAPI spec."""
    o = sub.add_parser("openapi", help="print the HTTP API's OpenAPI spec")
    o.add_argument("-o", "--output", help="write to this file instead of stdout")
    o.set_defaults(func=openapi)


def _add_report_parser(sub: Subcommands) -> None:
    r = sub.add_parser(
        "report", help="report feedback (a score, text, a correction) on receipts to a server"
    )
    r.add_argument(
        "receipts", nargs="+", metavar="RECEIPT", help="record ids (x-reef-agent-record-id)"
    )
    r.add_argument("--score", type=float, help="e.g. 1 for a thumbs up, 0 for a thumbs down")
    r.add_argument("--feedback", help='text, or a JSON object such as \'{"correction": "Paris."}\'')
    r.add_argument(
        "--metric",
        action="append",
        type=_metric,
        metavar="NAME=VALUE",
        help="a named metric the scenario declares (repeatable): helpful=true, accuracy=0.7, "
        "tone=formal",
    )
    r.add_argument("--report-id", help="idempotency key: the same id and content store once")
    r.add_argument("--metadata", type=_json_object, help="a JSON object stored with the report")
    r.add_argument("--scenario", help="the receipts' scenario (default: the server's default)")
    r.add_argument(
        "--url",
        help="the reef server's root URL (default http://127.0.0.1:8900; env REEF_BASE_URL)",
    )
    r.add_argument("--token", help="API token (env REEF_API_KEY)")
    r.add_argument("--json", action="store_true", help="print the stored report as JSON")
    r.set_defaults(func=report)


def _add_config_parser(sub: Subcommands) -> None:
    c = sub.add_parser(
        "config",
        help="print the effective settings as YAML (defaults < file < REEF_* environment < "
        "flags), secrets masked",
    )
    c.add_argument("-c", "--config", type=Path, help="YAML settings file (as for reef serve)")
    c.add_argument("--host", help="bind address")
    c.add_argument("--port", type=int, help="port")
    c.add_argument("--state-dir", type=Path, help="SQLite DB and local state")
    c.add_argument("--model", help="smollm2, tiny, or a local Hugging Face model dir")
    c.add_argument("--engine", choices=["embedded", "upstream", "vllm"], help="serving engine")
    c.add_argument("--database-url", help="sqlite:///path or postgresql+psycopg://user@host/db")
    c.set_defaults(func=show_config)


def _add_completion_parser(sub: Subcommands) -> None:
    c = sub.add_parser(
        "completion",
        help='print a shell completion script (bash: eval "$(reef completion bash)" in ~/.bashrc)',
    )
    c.add_argument(
        "shell",
        choices=["bash", "zsh"],
        help="bash: source it (or eval it in ~/.bashrc); zsh: save it as _reef in a directory "
        "on $fpath, or eval it after compinit",
    )
    c.set_defaults(func=completion)


# Flags defined without help text that mean the same in every command.
_SHARED_HELP = {
    "scenario": "the scenario's name",
    "name": "who holds the token (shown in logs and on approvals)",
    "release_id": "a release id (`reef releases` lists them) or a pending candidate's",
    "log_level": "least severe log line written (default info)",
    "url": "the reef server's root URL (default: reef.engine_url, else server.host and "
    "server.port of the settings)",
    "token": "admin token",
}
# The environment variable a flag reads, besides its setting's (FLAG_SETTINGS).
_FLAG_ENV = {"token": "REEF_API_KEY", "url": env_var(("reef", "engine_url"))}


def _document(p: argparse.ArgumentParser) -> None:
    """Every flag of every command gets help text naming the environment variable it reads,
    and paths complete as files or directories in the shell."""
    import shtab

    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                _document(command)
            continue
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        # No made-up text: a flag with neither its own help nor a shared one keeps none, and
        # tests/test_docs.py names it.
        action.help = action.help or _SHARED_HELP.get(action.dest)
        env = env_var(FLAG_SETTINGS[action.dest]) if action.dest in FLAG_SETTINGS else None
        env = env or _FLAG_ENV.get(action.dest)
        if env and action.help and "env REEF_" not in action.help:
            action.help += f" (env {env})"
        if action.type is Path:
            action.complete = shtab.DIRECTORY if action.dest == "state_dir" else shtab.FILE  # type: ignore[attr-defined]


def _finish(p: argparse.ArgumentParser, sub: Subcommands) -> argparse.ArgumentParser:
    """The commands and flags added after the first ones: report, config, completion,
    --version; then the help text every flag gets (`_document`)."""
    import reef  # its __version__: the package's one version number

    p.add_argument("--version", action="version", version=f"%(prog)s {reef.__version__}")
    _add_report_parser(sub)
    _add_config_parser(sub)
    _add_completion_parser(sub)
    _document(p)
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
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "reef":
            raise  # Reef's own module: a bug, not a missing extra
        print(f"reef: {missing_extra(args.command, e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
