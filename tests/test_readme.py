"""The README's blocks marked `<!-- doc-test -->` run as a reader types them, in order, against
a real server: the Python blocks in one interpreter (a later block uses an earlier one's
names), the shell blocks in one bash (a later block uses an earlier one's variables). The
server is `InProcessReef` on the tiny model, its state in `.reef` of the folder the blocks run
in, as `make run` keeps it in the checkout; tests/docblocks.py rewrites the README's address,
model name and `.venv/bin/reef`. These are the quick start's; the README's later blocks and the
other docs' run in tests/test_doc_blocks.py (marker docs)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.cli.testing import InProcessReef
from reef.client import Reef
from tests.docblocks import ROOT, blocks, quick_start_end, run_python, run_shell, script

README = ROOT / "README.md"
QUICK_START = range(quick_start_end(README))


def test_the_readme_marks_its_quick_start() -> None:
    languages = [b.lang for b in blocks(README) if b.runs and b.line in QUICK_START]
    assert languages.count("python") >= 3 and languages.count("shell") >= 3, languages


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readme")


@pytest.fixture(scope="module")
def server(checkout: Path) -> Iterator[InProcessReef]:
    with InProcessReef(checkout / ".reef") as srv:
        yield srv


def test_the_python_blocks_run(server: InProcessReef, checkout: Path) -> None:
    code = script(README, "python", server.url, QUICK_START)
    code += "\nprint('RECEIPT', receipt)\n"  # what the blocks promise: a receipt, a report on it
    out = run_python(code, checkout, {"REEF_BASE_URL": server.url})
    receipt = out.split("RECEIPT ")[-1].strip()
    with Reef(server.url, scenario="support-bot") as reef:
        reported = {ref for r in reef.reports().data for ref in r.references}
    assert receipt.startswith("rec_") and receipt in reported


def test_the_shell_blocks_run(server: InProcessReef, checkout: Path) -> None:
    code = script(README, "shell", server.url, QUICK_START) + '\necho "RECEIPT $RECEIPT"\n'
    out = run_shell(code, checkout, {"REEF_BASE_URL": server.url})
    receipt = out.split("RECEIPT ")[-1].strip()
    assert re.fullmatch(r"rec_\w+", receipt), out
    with Reef(server.url, scenario="support-bot") as reef:
        reports = [r for r in reef.reports().data if receipt in r.references]
        records = {r.id for r in reef.records().data}
    # the curl report and `reef report` both stored one on the captured receipt
    assert len(reports) == 2 and receipt in records, out
    assert '"id":"rec_' in out.replace(" ", "")  # the records listing printed them
