"""The README's quick-start blocks marked `<!-- doc-test -->` run as a reader types them, in
order, against a real server: the Python blocks in one interpreter (a later block uses an
earlier one's names), the shell blocks in one bash (a later block uses an earlier one's
variables). The server is `InProcessReef` on the tiny model; the README's address
(http://127.0.0.1:8900) is rewritten to its, the model name smollm2 to tiny, and
`.venv/bin/reef` to this interpreter's `python -m cli.main`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.cli.testing import InProcessReef
from reef.client import Reef

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- doc-test -->"
README_URL = "http://127.0.0.1:8900"


def doc_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block right after a MARKER line."""
    pattern = re.compile(re.escape(MARKER) + r"\s*\n```(\w+)\n(.*?)\n```", re.S)
    return [(m.group(1), m.group(2)) for m in pattern.finditer(text)]


BLOCKS = doc_blocks((ROOT / "README.md").read_text())


def test_the_readme_marks_its_quick_start() -> None:
    languages = [lang for lang, _ in BLOCKS]
    assert languages.count("python") >= 3 and languages.count("sh") >= 3, languages


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("reef-readme")) as srv:
        yield srv


def _run(argv: list[str], code: str, server: InProcessReef, tmp: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REEF_BASE_URL": server.url}
    env.pop("REEF_API_KEY", None)
    out = subprocess.run(
        [*argv, code], cwd=tmp, capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, f"{code}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    return out.stdout


def _script(language: str, server: InProcessReef) -> str:
    code = "\n".join(block for lang, block in BLOCKS if lang == language)
    code = code.replace(README_URL, server.url).replace('"smollm2"', '"tiny"')
    return code.replace(".venv/bin/reef ", f"{sys.executable} -m cli.main ")


def test_the_python_blocks_run(server: InProcessReef, tmp_path: Path) -> None:
    code = _script("python", server)
    # what the blocks promise: a receipt in `receipt`, a report stored on it
    code += "\nprint('RECEIPT', receipt)\n"
    out = _run([sys.executable, "-c"], code, server, tmp_path)
    receipt = out.split("RECEIPT ")[-1].strip()
    with Reef(server.url, scenario="support-bot") as reef:
        reported = {ref for r in reef.reports().data for ref in r.references}
    assert receipt.startswith("rec_") and receipt in reported


def test_the_shell_blocks_run(server: InProcessReef, tmp_path: Path) -> None:
    code = "set -euo pipefail\n" + _script("sh", server) + '\necho "RECEIPT $RECEIPT"\n'
    out = _run(["bash", "-c"], code, server, tmp_path)
    receipt = out.split("RECEIPT ")[-1].strip()
    assert re.fullmatch(r"rec_\w+", receipt), out
    with Reef(server.url, scenario="support-bot") as reef:
        reports = [r for r in reef.reports().data if receipt in r.references]
        records = {r.id for r in reef.records().data}
    # the curl report and `reef report` both stored one on the captured receipt
    assert len(reports) == 2 and receipt in records, out
    assert '"id":"rec_' in out.replace(" ", "")  # the records listing printed them
