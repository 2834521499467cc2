"""Imports flow one way, as the layer table of the design guide draws them:

    cli → api → deploy → reef        flows → deploy, recipes → reef

The layers above the library are folders at the top of the repository (api/, cli/, deploy/,
flows/, recipes/) and one import package with it: the links reef/api → ../api, ... make them
reef.api, reef.cli, ..., which is how every module imports them and how the wheel installs them.

Every import counts, at module level, inside functions and under TYPE_CHECKING. The checks
fail on an import that climbs a layer, on any import cycle between modules, and on an import of
another module's private (underscore) name. Each check is also run on a small tree made here,
to show that it fails when it should.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What each layer may import besides itself (docs/architecture.md, the layer table).
ALLOWED: dict[str, set[str]] = {
    "cli": {"api", "flows", "recipes", "deploy", "reef"},
    "api": {"deploy", "reef"},
    "flows": {"deploy", "recipes", "reef"},
    "recipes": {"reef"},
    "deploy": {"reef"},
    "reef": set(),
}


UPPER = [layer for layer in ALLOWED if layer != "reef"]  # the folders linked into reef/


def layer_of(module: str) -> str:
    """reef.api.app → api; reef.store → reef."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in UPPER else parts[0]


def modules(root: Path) -> dict[str, Path]:
    """Every module of the layer packages under `root`, by dotted name (reef.api.app for
    api/app.py; the links in reef/ are not walked twice)."""
    out: dict[str, Path] = {}
    for package in ALLOWED:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if package == "reef" and parts[1] in UPPER:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts if package == "reef" else ["reef", *parts])] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str]]:
    """(module, imported name) for every import in the file, resolved to the deepest known
    module; relative imports included."""
    out: list[tuple[str, str]] = []

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = resolve(alias.name)
                if target:
                    out.append((target, ""))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                target = resolve(f"{base}.{alias.name}")
                if target:
                    # `from pkg import module` names a module; anything else names an attribute
                    attr = "" if target == f"{base}.{alias.name}" else alias.name
                    out.append((target, attr))
    return out


def graph(root: Path) -> dict[str, list[tuple[str, str]]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def upward(g: dict[str, list[tuple[str, str]]]) -> list[str]:
    """Imports that break the layer table."""
    bad = []
    for module, deps in g.items():
        layer = layer_of(module)
        for target, _ in deps:
            other = layer_of(target)
            if other != layer and other not in ALLOWED[layer]:
                bad.append(f"{module} imports {target}")
    return sorted(set(bad))


def private(g: dict[str, list[tuple[str, str]]]) -> list[str]:
    """Imports of another module's private names."""
    return sorted(
        {
            f"{module} imports {target}.{attr}"
            for module, deps in g.items()
            for target, attr in deps
            if attr.startswith("_") and target != module
        }
    )


def cycles(g: dict[str, list[tuple[str, str]]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan)."""
    edges = {m: sorted({t for t, _ in deps if t != m and t in g}) for m, deps in g.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


# the project ----------------------------------------------------------------------------------
def test_no_import_climbs_a_layer() -> None:
    assert upward(graph(ROOT)) == []


def test_no_import_cycle() -> None:
    assert cycles(graph(ROOT)) == []


def test_no_module_imports_another_modules_private_names() -> None:
    assert private(graph(ROOT)) == []


# What a route module may take from the rest of api/: never another route module. api.contract
# is what a route declares for the OpenAPI spec (the body it reads, its headers, its errors);
# api.reporting the one write path of reports, which the dashboard's review form shares.
ROUTE_IMPORTS = {
    "reef.api.services",
    "reef.api.answers",
    "reef.api.bodies",
    "reef.api.contract",
    "reef.api.reporting",
}


def routes_reaching_out(g: dict[str, list[tuple[str, str]]]) -> list[str]:
    return sorted(
        {
            f"{module} imports {target}"
            for module, deps in g.items()
            if module.startswith("reef.api.routes.")
            for target, _ in deps
            if target.startswith("reef.api")
            and target not in ROUTE_IMPORTS | {"reef.api", "reef.api.routes"}
        }
    )


def test_route_modules_import_only_services_answers_bodies_and_contract() -> None:
    assert routes_reaching_out(graph(ROOT)) == []


def test_importing_the_api_and_the_cli_does_not_load_torch() -> None:
    code = "import sys, reef.api.app, reef.cli.main; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split() == ["False", "False"]


# the checks themselves, on trees made here ----------------------------------------------------
def _tree(root: Path, files: dict[str, str]) -> Path:
    for package in ALLOWED:
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    "text",
    [
        "from reef.api.services import Services\n",  # at module level
        "def f():\n    import reef.flows.evolve\n",  # inside a function
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from reef.deploy import chain\n",
    ],
)
def test_an_upward_import_fails(tmp_path: Path, text: str) -> None:
    root = _tree(
        tmp_path,
        {
            "reef/store.py": text,
            "api/services.py": "",
            "flows/evolve.py": "",
            "deploy/chain.py": "",
        },
    )
    assert upward(graph(root)) != []
    ok = _tree(tmp_path / "ok", {"api/services.py": "import reef.store\n", "reef/store.py": ""})
    assert upward(graph(ok)) == []


def test_an_import_cycle_fails(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "reef/a.py": "from reef.b import x\n",
            "reef/b.py": "def f():\n    from reef import c\n",
            "reef/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",
            "reef/d.py": "import reef.a\n",
        },
    )
    assert cycles(graph(root)) == [["reef.a", "reef.b", "reef.c"]]


def test_a_route_importing_a_route_fails(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"api/routes/__init__.py": "", "api/routes/a.py": "from reef.api.routes.b import x\n"},
    )
    (root / "api/routes/b.py").write_text("x = 1\n")
    assert routes_reaching_out(graph(root)) == ["reef.api.routes.a imports reef.api.routes.b"]


def test_a_private_import_fails(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"flows/a.py": "_x = 1\n", "flows/b.py": "from reef.flows.a import _x\n", "flows/c.py": ""},
    )
    assert private(graph(root)) == ["reef.flows.b imports reef.flows.a._x"]


# one import package ---------------------------------------------------------------------------
def test_the_layer_folders_are_linked_into_the_reef_package() -> None:
    for layer in UPPER:
        link = ROOT / "reef" / layer
        assert link.is_symlink() and link.readlink() == Path("..", layer), link


def _top_level_names(text: str) -> list[str]:
    """What `text` imports, or names as a module in a string ("pkg.mod:attr", `-m pkg.mod`),
    under a bare layer name (api, cli, ...) rather than reef.<layer>."""
    found = []
    for node in ast.walk(ast.parse(text)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
            if (
                " " not in value
                and ("." in value.partition(":")[0])
                and not value.endswith((".md", ".py", ".yaml", ".json", ".png", ".html", ".sh"))
            ):
                names = [value.partition(":")[0]]
            # code in a string (`python -c "import sys, reef.api.app; ..."`)
            for listed in re.findall(r"(?:^|[;\n]\s*)import ([\w., ]+)", value):
                names += [n.strip().split(" ")[0] for n in listed.split(",")]
            names += re.findall(r"(?:^|[;\n]\s*)from ([\w.]+) import", value)
            names += re.findall(r"(?:^|\s)-m ([\w.]+)", value)  # python -m pkg.module
        found += [n for n in names if n.split(".")[0] in UPPER]
    return found


def test_nothing_imports_a_layer_by_its_bare_folder_name() -> None:
    """`from api.app import ...` works in a checkout (its root is on sys.path) and fails
    installed, where only `reef` exists: every module, test, bench and demo says reef.api."""
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    here = Path(__file__).relative_to(ROOT).as_posix()  # its examples name bare layers
    bare = {p: _top_level_names((ROOT / p).read_text()) for p in tracked if p != here}
    # the deliberate ones: a config written before the layers were reef.<layer>, and the other
    # project's package `flows` installed beside Reef
    deliberate = {
        "tests/test_settings.py": ["recipes.sao.recipe", "recipes.sao.recipe"],
        "tests/test_packaging.py": ["flows"],
    }
    assert {path: names for path, names in bare.items() if names} == deliberate
    example = 'from flows.evolve import x\ny = "recipes.sft:SFTRecipe"\nz = "import sys, api.app"\n'
    example += 'w = f"{sys.executable} -m cli.main "\n'
    assert _top_level_names(example) == ["flows.evolve", "recipes.sft", "api.app", "cli.main"]
