"""Acknowledged means durable: a writer killed with SIGKILL loses nothing it acknowledged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from reef.store.sql import open_store

# Writes through the group committer from 8 concurrent tasks and prints each record id once
# its `add` has returned, i.e. once the record was acknowledged as committed.
WRITER = """
import asyncio, sys
from reef.records import Record, new_id, utcnow
from reef.store.commits import GroupCommitter
from reef.store.sql import open_store

store = open_store(sys.argv[1])
store.migrate()
head = store.ensure_scenario("durable").head_release_id

async def writer(committer):
    while True:
        record = Record(
            id=new_id("rec"), scenario="durable", created_at=utcnow(), route="chat.completions",
            model="m", stream=False, request={"messages": [{"role": "user", "content": "hi"}]},
            response={"choices": []}, release_id=head, completion_token_ids=[1, 2, 3],
        )
        await committer.add(record)
        print(record.id, flush=True)

async def main():
    committer = GroupCommitter(store)
    await committer.start()
    await asyncio.gather(*(writer(committer) for _ in range(8)))

asyncio.run(main())
"""


def test_acknowledged_records_survive_sigkill(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state' / 'reef.db'}"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    acknowledged: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while len(acknowledged) < 300 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            acknowledged.append(line.strip())
        # Killed mid-stream: more writes are in flight, some of them mid-commit.
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        rest, err = child.communicate(timeout=30)
    acknowledged += rest.split()
    assert len(acknowledged) >= 300, err

    store = open_store(url)
    try:
        assert store.existing_record_ids("durable", acknowledged) == set(acknowledged)
    finally:
        store.close()
