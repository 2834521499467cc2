"""No function or method is longer than 80 lines.

A function's length is its span in the file, from its `def` line to its last line (decorators
not counted, its docstring and comments counted). Every .py file of the repository is checked,
tests included; Alembic migrations (generated, and never edited once released), the virtual
environment and hidden folders are not. The checker is also run on a small source made here, to
show that it fails when it should.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80


# Folders of generated or installed code, never the project's own (see .gitignore).
_NOT_SOURCE = {"__pycache__", "build", "dist", "node_modules", "mlruns"}


def skipped(folder: Path) -> bool:
    """Hidden folders (.git, .venv, caches), build outputs, any virtual environment, and an
    Alembic migration tree (its env.py beside a versions/ folder)."""
    return (
        folder.name.startswith(".")
        or folder.name in _NOT_SOURCE
        or folder.name.endswith(".egg-info")
        or (folder / "pyvenv.cfg").is_file()
        or ((folder / "env.py").is_file() and (folder / "versions").is_dir())
    )


def python_files(root: Path) -> Iterator[Path]:
    """Every .py file under `root` outside the skipped folders."""
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(name for name in subfolders if not skipped(Path(folder) / name))
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(folder) / name


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[int, str, int]]:
    """(line, qualified name, length) of every function or method, sync or async, nested or
    not, whose span is over `limit` lines."""
    out: list[tuple[int, str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > limit:
                    out.append((child.lineno, name, length))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return sorted(out)


def test_no_function_is_over_80_lines() -> None:
    found = []
    for path in python_files(ROOT):
        relative = path.relative_to(ROOT).as_posix()
        for line, name, length in long_functions(path.read_text()):
            found.append(f"{relative}:{line} {name} {length} lines")
    assert not found, f"functions over {LIMIT} lines (split them by meaning):\n" + "\n".join(found)


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function whose span is exactly `lines` lines: the def line, then statements."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return f"{indent}def {name}():\n{body}"


def test_the_checker_counts_the_span_without_decorators() -> None:
    assert long_functions(_function("short", 80)) == []
    assert long_functions("@decorator\n@other\n" + _function("short", 80)) == []
    assert long_functions(_function("long", 81)) == [(1, "long", 81)]


def test_the_checker_sees_methods_async_and_nested_functions() -> None:
    source = (
        "class Box:\n"
        + _function("fine", 80, "    ")
        + "    async def slow(self):\n"
        + "".join(f"        y{i} = {i}\n" for i in range(80))
        + _function("outer", 90)
    )
    # a nested function inside `outer`, itself over the limit, reported with its path
    source += "    def inner():\n" + "".join(f"        z{i} = {i}\n" for i in range(81))
    found = long_functions(source)
    names = {name: length for _, name, length in found}
    assert names == {"Box.slow": 81, "outer": 90 + 82, "outer.inner": 82}


def test_the_walk_skips_migrations_and_hidden_folders() -> None:
    walked = {path.relative_to(ROOT).as_posix() for path in python_files(ROOT)}
    assert "reef/serving.py" in walked
    assert "tests/test_function_length.py" in walked
    assert "reef/store/migrations/env.py" not in walked
    assert not any(path.startswith("reef/store/migrations/") for path in walked)
    assert not any(part.startswith(".") for path in walked for part in path.split("/"))


def test_the_walk_skips_environments_and_build_outputs(tmp_path: Path) -> None:
    for path in (
        "pkg/mod.py",
        "pkg/db/migrations/env.py",
        "pkg/db/migrations/versions/0001_initial.py",
        "venv/lib/site.py",
        "build/lib/pkg/mod.py",
        "node_modules/x/y.py",
        ".hidden/z.py",
    ):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    walked = [path.relative_to(tmp_path).as_posix() for path in python_files(tmp_path)]
    assert walked == ["pkg/mod.py"]
