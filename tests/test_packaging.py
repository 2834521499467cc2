"""The distribution as a user installs it: a wheel built from this tree (sdist first, then the
wheel from the sdist, as a package index would), installed into fresh virtualenvs.

- `reef-agents[client]` alone: the report client and the `reef` command's parser, no torch;
  every other command says which extra it needs in one line.
- `reef-agents[serve]` alone: `reef serve` answers and records, and says why it does not learn.
- `reef-agents[all]` at the lock's exact versions, beside another distribution whose import
  package is named `flows`: both import as themselves (Reef installs one top-level package,
  `reef`), and the installed `reef serve` answers the official OpenAI SDK with a receipt.
- requirements.lock pins every dependency pyproject.toml names, inside its range.

The installs come from uv's cache (hard links: seconds), which `make venv` filled; the stage is
`make test-package`. The lock's own check is quick and runs in `make test`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import reef
from reef.testing.process import ReefServer

# Each install is a fresh venv and the serve test a real `reef serve`: `make test-package`.
package = pytest.mark.package

ROOT = Path(__file__).resolve().parents[1]
UV = str(Path(sys.executable).with_name("uv"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = ROOT / "requirements.lock"


def _uv(*args: str | Path, cwd: Path | None = None) -> str:
    out = subprocess.run(
        [UV, *map(str, args)], capture_output=True, text=True, cwd=cwd, check=False
    )
    assert out.returncode == 0, f"uv {' '.join(map(str, args))}:\n{out.stderr[-3000:]}"
    return out.stdout


def _find_links() -> list[str]:
    """pip's find-links folder, where the project machines keep torch's CPU wheel (as make)."""
    out = subprocess.run(
        ["pip", "config", "get", "global.find-links"], capture_output=True, text=True
    )
    return ["--find-links", out.stdout.strip()] if out.returncode == 0 else []


def _venv(path: Path, *requirements: str | Path) -> Path:
    _uv("venv", "-q", "--python", sys.executable, path)
    python = path / "bin" / "python"
    _uv("pip", "install", "-q", "--python", python, *_find_links(), *requirements)
    return path / "bin"


def _run(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # from /, not the checkout: its folders (flows/, api/, ...) would shadow what is installed
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=120, cwd="/"
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    _uv("build", "-q", "-o", out, ROOT)  # the sdist, then the wheel built from it
    (sdist,) = out.glob("reef_agents-*.tar.gz")
    (wheel,) = out.glob("reef_agents-*-py3-none-any.whl")
    return {"sdist": sdist, "wheel": wheel}


@package
def test_the_wheel_holds_one_import_package_with_its_data(dist: dict[str, Path]) -> None:
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = whl.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = whl.read(info).decode()
    tops = {n.split("/")[0] for n in names if not n.startswith("reef_agents-")}
    assert tops == {"reef"}
    for layer in ("api", "cli", "deploy", "flows", "recipes"):
        assert f"reef/{layer}/__init__.py" in names
    assert "reef/api/ui/templates/overview.html" in names
    assert "reef/store/migrations/versions/0001_initial.py" in names
    assert "reef/recipes/sft/examples/serve.yaml" in names
    assert "reef/py.typed" in names
    assert "Name: reef-agents" in metadata and f"Version: {reef.__version__}" in metadata
    assert "Requires-Python: >=3.11\n" in metadata and "License-Expression: Apache-2.0" in metadata
    extras = set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M))
    assert {"client", "serve", "train", "vllm", "all"} <= extras
    # the sdist carries the same files (the wheel above was built from it)
    with tarfile.open(dist["sdist"]) as sdist:
        assert any(n.endswith("/reef/api/app.py") for n in sdist.getnames())


@package
def test_the_client_extra_alone_installs_without_torch(
    dist: dict[str, Path], tmp_path: Path
) -> None:
    bin_ = _venv(tmp_path / "client", f"{dist['wheel']}[client]")
    site = next((tmp_path / "client" / "lib").glob("python3*/site-packages"))
    installed = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert {"reef_agents", "httpx", "pydantic"} <= installed
    assert not installed & {"torch", "fastapi", "prefect", "transformers", "sqlalchemy"}

    code = (
        "import sys; from reef.client import AsyncReef, Reef; "
        "print(sorted(m for m in ('torch', 'fastapi', 'sqlalchemy') if m in sys.modules))"
    )
    assert _run(bin_ / "python", "-c", code).stdout.strip() == "[]"
    assert _run(bin_ / "reef", "--version").stdout.strip() == f"reef {reef.__version__}"
    assert "-F _shtab_reef reef" in _run(bin_ / "reef", "completion", "bash").stdout
    # a report to a server that is not there: the client's one line, no traceback
    out = _run(bin_ / "reef", "report", "--url", "http://127.0.0.1:9", "--score", "1", "r1")
    assert out.returncode == 1 and "unreachable" in out.stderr and "Traceback" not in out.stderr
    # commands that need more say which extra, in one line
    out = _run(bin_ / "reef", "serve", "--model", "tiny")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "`reef serve` needs the serve extra" in out.stderr
    assert "pip install 'reef-agents[serve]'" in out.stderr
    out = _run(bin_ / "reef", "evolve", "--scenario", "s")
    assert out.returncode == 2 and "pip install 'reef-agents[train]'" in out.stderr


def _call_and_read_back(server: ReefServer, scenario: str) -> None:
    """A chat through the official openai SDK answers with a receipt naming its record."""
    import openai

    client = openai.OpenAI(
        base_url=f"{server.url}/v1",
        api_key="none",
        max_retries=0,
        default_headers={"x-reef-scenario": scenario},
    )
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    receipt = raw.headers["x-reef-agent-record-id"]
    assert raw.parse().choices[0].message.content is not None
    record = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records/{receipt}")
    assert record.status_code == 200 and record.json()["id"] == receipt


def _neighbour(tmp_path: Path) -> Path:
    """A wheel of another project whose import package is `flows` (as PyPI's is)."""
    src = tmp_path / "neighbour"
    (src / "flows").mkdir(parents=True)
    (src / "flows" / "__init__.py").write_text('OWNER = "not reef"\n')
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "flows"\nversion = "9.9"\n'
    )
    _uv("build", "-q", "--wheel", "-o", tmp_path / "neighbour-dist", src)
    (wheel,) = (tmp_path / "neighbour-dist").glob("flows-*.whl")
    return wheel


@package
def test_all_extras_at_the_lock_install_beside_a_flows_package_and_serve(
    dist: dict[str, Path], tmp_path: Path
) -> None:
    bin_ = _venv(tmp_path / "all", "-r", LOCK, f"{dist['wheel']}[all]", _neighbour(tmp_path))
    code = (
        "import flows, reef.flows.evolve, reef.api.app; "
        "print(flows.OWNER, reef.flows.evolve.__name__)"
    )
    out = _run(bin_ / "python", "-c", code)
    assert out.stdout.split() == ["not", "reef", "reef.flows.evolve"], out.stderr[-2000:]

    with ReefServer(tmp_path / "state", "--model", "tiny", executable=str(bin_ / "reef")) as server:
        _call_and_read_back(server, "packaged")


@package
def test_the_serve_extra_serves_and_records_and_says_why_nothing_learns(
    dist: dict[str, Path], tmp_path: Path
) -> None:
    """`reef-agents[serve]` at the lock's versions: no Prefect or TRL; `reef serve` on its
    defaults (the evolve worker asked for) answers and records, and logs once why it does not
    learn instead of starting a worker that cannot import its flows."""
    bin_ = _venv(tmp_path / "serve", "-c", LOCK, f"{dist['wheel']}[serve]")
    site = next((tmp_path / "serve" / "lib").glob("python3*/site-packages"))
    installed = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert {"torch", "fastapi", "transformers", "peft"} <= installed
    assert not installed & {"prefect", "trl", "datasets", "great_expectations", "gepa"}

    env = {"REEF_REEF__AUTO": "true"}
    state = tmp_path / "state"
    with ReefServer(state, "--model", "tiny", env=env, executable=str(bin_ / "reef")) as server:
        _call_and_read_back(server, "served")
        log = server.log()
    assert "learning is off: the evolve worker needs the train extra" in log
    assert "pip install 'reef-agents[train]'" in log and "Traceback" not in log


def test_the_lock_pins_every_dependency_inside_its_range() -> None:
    project = PYPROJECT["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        wanted += [Requirement(r) for r in extra]
    pinned: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith(("#", " ")):
            name, _, version = line.split()[0].partition("==")
            pinned[name.lower().replace("_", "-")] = Version(version)
    for req in wanted:
        name = req.name.lower().replace("_", "-")
        if name == "reef-agents":
            continue  # the extras naming each other
        assert name in pinned, f"{req} is not in requirements.lock: run `make lock`"
        version = pinned[name]
        assert req.specifier.contains(version, prereleases=True), f"lock has {name}=={version}"
    assert str(pinned["torch"]).endswith("+cpu")  # the CPU build: make needs no CUDA wheels
    assert ">=" in project["requires-python"] and "<" not in project["requires-python"]
