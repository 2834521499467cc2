"""`reef releases` and `reef rollback` against a running server, as an operator uses them."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.cli.main import main
from reef.cli.testing import InProcessReef
from reef.records import Release, new_id, utcnow
from reef.store.sql import open_store


def test_releases_and_rollback_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with InProcessReef(tmp_path / "state") as srv:
        store = open_store(f"sqlite:///{srv.state_dir / 'reef.db'}")
        try:
            base = store.ensure_scenario("ops").head_release_id
            second = store.publish_release(
                Release(
                    id=new_id("rel"),
                    scenario="ops",
                    seq=0,
                    parent_id=base,
                    kind="base",
                    created_at=utcnow(),
                    operation="promote",
                )
            )
        finally:
            store.close()
        assert main(["releases", "--scenario", "ops", "--url", srv.url]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith("*") and second.id in lines[0] and base in lines[1]

        args = ["rollback", "--scenario", "ops", "--release-id", base, "--url", srv.url]
        assert main(args) == 0
        assert "is the head" in capsys.readouterr().out
        main(["releases", "--scenario", "ops", "--url", srv.url])
        top = capsys.readouterr().out.splitlines()[0]
        assert top.startswith("*") and "rollback" in top

        # promoting something that is not a pending candidate is refused, with the reason
        args = ["promote", "--scenario", "ops", "--release-id", base, "--url", srv.url]
        assert main(args) == 1
        assert "not found" in capsys.readouterr().err
