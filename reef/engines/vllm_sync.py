"""Send a full checkpoint into a running vLLM over NCCL, then name its weight version.

A script run in vLLM's environment (it needs vllm, trl, torch with CUDA; the main environment
has none of those), started by reef.engines.vllm with the dev-mode vLLM's root URL. It uses
TRL's maintained client for vLLM's weight-transfer routes: `init_communicator` joins vLLM's
NCCL group as rank 0 (/init_weight_transfer_engine), `weight_update` wraps
/start_weight_update ... /finish_weight_update, and `update_named_params` announces names,
dtypes and shapes (/update_weights) while broadcasting the tensors in that order. Generation
is paused (running requests finish) for the transfer and resumed after, whatever happens.

The caller has checked the checkpoint against the served model's tensors before starting this
and bounds the whole run with a timeout (a hung NCCL collective then becomes an error). Prints
one JSON line: seconds, bytes, GB/s.

vLLM's API key comes in VLLM_API_KEY (the caller's environment for this process, never its
command line, where every user of the host could read it) and goes on every HTTP call.

    python vllm_sync.py --url http://127.0.0.1:8000 --checkpoint DIR --version scen@rel
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="vLLM's root URL")
    p.add_argument("--checkpoint", required=True, type=Path, help="Hugging Face model directory")
    p.add_argument("--version", required=True, help="weight version to set once synced")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--group-port", type=int, default=51216)
    p.add_argument("--http-timeout", type=float, default=120.0)
    args = p.parse_args(argv)

    import requests
    import torch
    from safetensors.torch import load_file

    key = os.environ.get("VLLM_API_KEY")
    headers = auth_headers(key)
    if key:
        # TRL's VLLMClient makes its own requests.Session and calls /v1/models with it in its
        # constructor, before a header could be added to it: make every session carry the key.
        requests.Session = keyed_session(requests.Session, headers)  # type: ignore[misc]
    from trl.generation.vllm_client import VLLMClient

    started = time.perf_counter()
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(args.checkpoint.glob("*.safetensors")):
        tensors.update(load_file(str(file), device=args.device))
    if not tensors:
        print(f"no .safetensors in {args.checkpoint}", file=sys.stderr)
        return 2
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    loaded_s = time.perf_counter() - started

    def post(path: str, **kwargs: object) -> None:
        r = requests.post(f"{args.url}{path}", timeout=args.http_timeout, headers=headers, **kwargs)  # type: ignore[arg-type]
        r.raise_for_status()

    client = VLLMClient(base_url=args.url, group_port=args.group_port, connection_timeout=30)
    client.init_communicator(device=args.device)
    try:
        post("/pause", params={"mode": "wait"})
        try:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            metadata = [
                (name, str(t.dtype).removeprefix("torch."), list(t.shape))
                for name, t in tensors.items()
            ]
            with client.weight_update():
                client.update_named_params(metadata, iter(tensors.items()))
            torch.cuda.synchronize()
            sync_s = time.perf_counter() - t0
            post("/update_weight_version", json={"new_version": args.version})
            client.reset_prefix_cache()
        finally:
            post("/resume")
    finally:
        client.close_communicator()
    print(
        json.dumps(
            {
                "version": args.version,
                "tensors": len(tensors),
                "bytes": size,
                "load_s": round(loaded_s, 3),
                "sync_s": round(sync_s, 3),
                "gb_per_s": round(size / sync_s / 1e9, 2),
            }
        )
    )
    return 0


def auth_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def keyed_session(base: Any, headers: dict[str, str]) -> Any:
    """A requests.Session subclass whose sessions send `headers` on every request."""

    class KeyedSession(base):
        def __init__(self) -> None:
            super().__init__()
            self.headers.update(headers)

    return KeyedSession


if __name__ == "__main__":
    sys.exit(main())
