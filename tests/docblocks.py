"""The fenced code blocks of Reef's docs, and how a test runs them as a reader types them.

Every ```sh, ```bash and ```python block in README.md, CONTRIBUTING.md, docs/*.md and
examples/**/*.md is decided by the line right before it: `<!-- doc-test -->` (a test runs it)
or `<!-- doc-skip: why -->` (it cannot run offline in seconds: a GPU, the network, a demo of
minutes, a server that runs until stopped). A file's runnable blocks run in order, the Python
ones in one interpreter and the shell ones in one bash, so a later block uses an earlier one's
names and variables. The docs' address (http://127.0.0.1:8900, localhost:8900) is rewritten to
the test server's, the model smollm2 to tiny, and `.venv/bin/reef` (or `reef` starting a line)
and `.venv/bin/python` to this interpreter."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = {"sh": "shell", "bash": "shell", "python": "python"}
TEST = "<!-- doc-test -->"
SKIP = re.compile(r"<!-- doc-skip: (\S.*?) -->")
DOC_URL = "http://127.0.0.1:8900"
FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```", re.S | re.M)


def doc_files() -> list[Path]:
    return [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "examples").glob("**/*.md")),
    ]


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str  # "shell" or "python"
    code: str
    marker: str  # the line before the fence

    @property
    def runs(self) -> bool:
        return self.marker == TEST

    @property
    def skip_reason(self) -> str | None:
        m = SKIP.fullmatch(self.marker)
        return m.group(1) if m else None

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every sh, bash and python block of `path`, with the line right before its fence."""
    text = path.read_text()
    found = []
    for m in FENCE.finditer(text):
        if m.group(2) not in RUNNABLE:
            continue
        before = text[: m.start()].rstrip().splitlines()
        indent = len(m.group(1))
        code = "\n".join(line[indent:] for line in m.group(3).rstrip("\n").splitlines())
        found.append(
            Block(
                path=path,
                line=text.count("\n", 0, m.start()) + 1,
                lang=RUNNABLE[m.group(2)],
                code=code,
                marker=before[-1].strip() if before else "",
            )
        )
    return found


def script(path: Path, lang: str, url: str, lines: range = range(sys.maxsize)) -> str:
    """The runnable `lang` blocks of `path` (those starting in `lines`), in order, rewritten
    for a server at `url`."""
    chosen = [b for b in blocks(path) if b.runs and b.lang == lang and b.line in lines]
    code = "\n".join(b.code for b in chosen)
    return rewrite(code, url, lang)


def quick_start_end(readme: Path) -> int:
    """The README's first line after its quick start (`## Concepts`): the blocks before it
    run in the default suite (tests/test_readme.py), the rest under the marker docs."""
    return readme.read_text().splitlines().index("## Concepts") + 1


def rewrite(code: str, url: str, lang: str) -> str:
    code = code.replace(DOC_URL, url).replace("localhost:8900", url)
    code = code.replace('"smollm2"', '"tiny"').replace("--model smollm2", "--model tiny")
    if lang != "shell":
        return code
    commands = {"reef": f"{sys.executable} -m reef.cli.main", "python": sys.executable}
    code = re.sub(r"(?<![\w/])\.venv/bin/(reef|python) ", lambda m: commands[m[1]] + " ", code)
    return re.sub(r"(?m)^reef ", commands["reef"] + " ", code)


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 240) -> str:
    """Run a block's script in its own process group (a block may start a server in the
    background: nothing it started outlives the test); its stdout, or a failure showing both
    streams."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    env.pop("REEF_API_KEY", None)
    # output to files, not pipes: a server the script started may hand its descendants the
    # script's stdout, and a pipe would stay open until the last of them ended
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out_f, stderr=err_f, text=True, start_new_session=True
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        with contextlib.suppress(ProcessLookupError):  # what the script left behind, or itself
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read() + (f"\n(killed after {timeout_s} s)" * timed_out)
    code = argv[-1]
    assert proc.returncode == 0, f"{code}\n--- stdout\n{out}\n--- stderr\n{err}"
    return out


def run_python(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    return run([sys.executable, "-c", code], cwd, env or {})


def run_shell(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    # background jobs a block starts (a server) are stopped when the script ends, as a reader
    # stops them with ^C
    stop = "rc=$?; kill $(jobs -p) 2>/dev/null || true; wait || true; exit $rc"
    prelude = f"set -euo pipefail\ntrap '{stop}' EXIT\n"
    return run(["bash", "-c", prelude + code], cwd, env or {})
