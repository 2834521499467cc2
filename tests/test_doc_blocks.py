"""Every sh, bash and python block of the docs is decided: run by a test (`<!-- doc-test -->`)
or skipped with the reason it cannot run offline in seconds (`<!-- doc-skip: why -->`); a new
block with neither fails here. The runnable blocks (but the README's quick start, which
tests/test_readme.py runs in the default suite) run, a file at a time, as a reader types them
against a tiny-model server (marker `docs`, make test-docs): tests/docblocks.py says how."""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path

import httpx
import pytest

from reef.api.auth import hash_token
from reef.cli.testing import InProcessReef
from reef.client import Reef
from reef.store.sql import open_store
from tests.docblocks import (
    FENCE,
    ROOT,
    blocks,
    doc_files,
    quick_start_end,
    run_python,
    run_shell,
    script,
)


def test_every_fence_names_its_language() -> None:
    """A command block without a language would escape the rule below: every fence says what
    it holds (sh, python, yaml, text for diagrams and output, ...)."""
    bare = [
        f"{path.relative_to(ROOT)}:{path.read_text().count(chr(10), 0, m.start()) + 1}"
        for path in doc_files()
        for m in FENCE.finditer(path.read_text())
        if not m.group(2)
    ]
    assert bare == [], f"name the language of these fences (text for diagrams and output): {bare}"


def test_every_doc_block_is_run_or_skipped_with_a_reason() -> None:
    undecided = [
        b.where()
        for path in doc_files()
        for b in blocks(path)
        if not b.runs and b.skip_reason is None
    ]
    assert not undecided, (
        "mark each with <!-- doc-test --> (a test runs it) or <!-- doc-skip: why --> right "
        f"before its fence: {undecided}"
    )
    runnable = {
        b.path.relative_to(ROOT).as_posix() for p in doc_files() for b in blocks(p) if b.runs
    }
    # the files test_the_docs_run knows, and no runnable block outside them
    assert runnable == set(RUNS), runnable


ADMIN = "reef_doc-test-admin-token"


def readme(tmp_path: Path) -> None:
    """README.md after its quick start: a token made, a webhook receiver's check that agrees
    with Reef's own, experience imported from a file and over HTTP (kept by its ids)."""
    later = range(quick_start_end(ROOT / "README.md"), sys.maxsize)
    with InProcessReef(tmp_path / ".reef") as srv:  # .reef of where they run, as make run's
        check = """
from reef.events import signature, verify
body = b'{"kind": "release"}'
assert verified("s3cret", body, signature("s3cret", body))
assert verify("s3cret", body, signature("s3cret", body))
assert not verified("s3cret", body, signature("other", body))
"""
        run_python(script(ROOT / "README.md", "python", srv.url, later) + check, tmp_path)
        out = run_shell(script(ROOT / "README.md", "shell", srv.url, later), tmp_path)
        with Reef(srv.url, scenario="support") as reef:
            imported = reef.records().data
    assert re.search(r"\"sha256\": \"[0-9a-f]{64}\"", out) and "alice" in out, out
    assert len(imported) == 1 and any(k.startswith("reef.imported") for k in imported[0].tags)


def harness(tmp_path: Path) -> None:
    """docs/harness.md: a harness released by its files, then by an edit of the head's."""
    with InProcessReef(tmp_path / ".reef") as srv:
        run_shell(script(ROOT / "docs/harness.md", "shell", srv.url), tmp_path)
        with Reef(srv.url, scenario="support-bot") as reef:
            chain = reef.releases().data
        with httpx.Client(base_url=srv.url) as http:
            files = http.get("/reef/harness", params={"scenario": "support-bot"}).json()
    assert sorted(r.seq for r in chain) == [0, 1, 2], chain  # the base, then one release each
    assert "Answer in one sentence." in str(files), files


def recipes(tmp_path: Path) -> None:
    """docs/recipes.md: the example recipe loads by the name its configuration gives, an admin
    changes a scenario's keys at run time, a tagged call carries its role, and a call names its
    session and end user."""
    doc = ROOT / "docs/recipes.md"
    recipe = next(b.code for b in blocks(doc) if b.runs and b.lang == "python")
    (tmp_path / "myrecipes").mkdir()
    (tmp_path / "myrecipes/shorter.py").write_text(recipe)  # the file its first line names
    tokens = [{"name": "ops", "sha256": hash_token(ADMIN), "admin": True}]
    with InProcessReef(tmp_path / ".reef", auth={"tokens": tokens}) as srv:
        prelude = f"""import openai
client = openai.OpenAI(base_url="{srv.url}/v1", api_key="{ADMIN}",
                       default_headers={{"x-reef-scenario": "coder"}})
messages = [{{"role": "user", "content": "Plan a trip to Paris."}}]
"""
        check = """
import sys
sys.path.insert(0, ".")
from reef.recipe import load_recipe
r = load_recipe("myrecipes.shorter:ShorterRecipe", {"epochs": 2})
assert (r.name, r.kind, r.params.epochs, r.params.full) == ("shorter", "scored", 2, False), r
"""
        # the Python blocks first: their call makes the scenario `coder` the settings block changes
        run_python(prelude + script(doc, "python", srv.url) + check, tmp_path)
        run_shell(script(doc, "shell", srv.url), tmp_path, {"REEF_ADMIN": ADMIN})
        auth = {"authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=srv.url, headers=auth) as http:
            settings = http.get("/reef/scenarios/coder/settings").json()
        with Reef(srv.url, scenario="coder", api_key=ADMIN) as reef:
            records = reef.records().data
    assert '"batch_size": 8' in str(settings).replace("'", '"'), settings
    tags = [r.tags for r in records]
    assert len(tags) == 2 and any(t.get("role") == "planner" for t in tags), tags
    # the slice by session and end user: the call names both
    alice = [r for r in records if r.tags.get("reef.user") == "alice"]
    assert [r.session_id for r in alice] == ["run-2026-12-06-a"], tags


def examples(tmp_path: Path) -> None:
    """examples/README.md: a `reef serve --model tiny` in the background, then the three
    applications, as typed (on a free port, given to them as $REEF_BASE_URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    code = script(ROOT / "examples/README.md", "shell", url)
    serve = f"{sys.executable} -m reef.cli.main serve "
    assert serve in code, code
    code = code.replace(serve, f"{serve}--port {port} --state-dir {tmp_path / '.reef'} ")
    # what the applications left in the server, before the script stops it
    code += f"\ncurl -sf '{url}/reef/scenarios/chat-thumbs/reports' -o thumbs.json\n"
    code = code.replace("-o thumbs.json", f"-o {tmp_path / 'thumbs.json'}")
    out = run_shell(code, ROOT, {"REEF_BASE_URL": url})  # paths relative to the checkout
    assert "thumbs" in out, out
    assert (tmp_path / "thumbs.json").read_text().count('"references"') == 4


def reliability(tmp_path: Path) -> None:
    """docs/reliability.md: a serving deployment backed up while it serves, restored into an
    empty state directory that holds what it served (the doc's /backups and /srv/reef are
    folders of where the blocks run)."""
    doc = ROOT / "docs/reliability.md"
    with InProcessReef(tmp_path / ".reef") as srv:  # `reef backup`'s default state dir
        with Reef(srv.url, scenario="kept") as reef, httpx.Client(base_url=srv.url) as http:
            call = http.post(
                "/v1/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-reef-scenario": "kept"},
            )
            receipt = call.headers["x-reef-agent-record-id"]
            reef.report(receipt, score=1.0)
        code = script(doc, "shell", srv.url).replace(" /backups/", " backups/")
        out = run_shell(code.replace(" /srv/reef", " srv/reef"), tmp_path)
    store = open_store(f"sqlite:///{tmp_path / 'srv/reef/reef.db'}")
    try:
        assert store.get_record("kept", receipt).id == receipt, out
        assert [r.references for r in store.list_reports("kept")] == [(receipt,)]
    finally:
        store.close()


RUNS = {
    "README.md": readme,
    "docs/harness.md": harness,
    "docs/recipes.md": recipes,
    "docs/reliability.md": reliability,
    "examples/README.md": examples,
}


@pytest.mark.docs
@pytest.mark.parametrize("doc", sorted(RUNS))
def test_the_docs_run(doc: str, tmp_path: Path) -> None:
    RUNS[doc](tmp_path)
