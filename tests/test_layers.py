"""Imports flow one way: reef/ imports none of api/, flows/, recipes/, deploy/; api/ never
imports torch at module load."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UPPER = {"api", "flows", "recipes", "deploy"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_reef_does_not_import_upper_layers() -> None:
    crossings = {
        str(p.relative_to(ROOT)): sorted(_imports(p) & UPPER) for p in (ROOT / "reef").rglob("*.py")
    }
    assert {k: v for k, v in crossings.items() if v} == {}


def test_importing_the_api_does_not_load_torch() -> None:
    code = (
        "import sys, api.app, api.cli; print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split() == ["False", "False"]
