"""The demo's server: `reef serve --model MODEL -c <state>/serve.yaml` as a subprocess, with the
automatic evolve worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from reef.testing.process import ReefProcess


class Server(ReefProcess):
    """One `reef serve --model MODEL -c <state>/serve.yaml` with the automatic evolve worker."""

    def __init__(
        self,
        state_dir: Path,
        model: str,
        config: dict[str, Any],
        env: dict[str, str] | None = None,
    ):
        state_dir = state_dir.resolve()
        self.model = model
        self.config = config
        self.config_path = state_dir / "serve.yaml"
        args = ("-c", str(self.config_path), "--model", model)
        env = {"REEF_REEF__AUTO": "true", **(env or {})}
        super().__init__(state_dir, *args, env=env, log_name="server.log")

    def start(self, timeout_s: float = 300.0) -> Server:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        super().start(timeout_s)
        return self
