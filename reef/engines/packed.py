"""Linear layers through oneDNN with their weights packed once, for the embedded engine.

A decode step is ~80 % matrix products of a few rows by each weight matrix. torch's
`nn.Linear` on CPU lays the weight out for them again at every call; oneDNN's linear with the
weight reordered once into its blocked layout (what torch.compile's CPU freezing does) measured
2-3x faster per product here (SmolLM2 shapes, 8 rows, float32: 576x1536 232 -> 89 us, the
49152-wide lm_head 12.7 -> 4.5 ms), with the same float32 arithmetic (results agree to ~2e-6,
the rounding of another summation order).

The layers stay `nn.Linear` objects, with their weights: only their `forward` changes, so PEFT
still wraps them for LoRA adapters (and calls them for the base product), and everything that
reads their weights or shapes reads what it read before. The cost is a second copy of every
weight, in the packed layout.

Which product is faster depends on the machine and on how many rows a call has: on a 2-core
Sapphire Rapids (AVX-512) a whole SmolLM2 decode step took 34 ms plain against 41 ms packed for
one row, 68 against 56 ms for eight, where the machines the numbers above come from gained at
every row count. So the layers keep both and `Products` says which to use by rows: `calibrate`
times one-token forward passes of the whole model both ways at 1, 2, 4 and 8 rows (its weights
read from memory, as in a decode step, which timing one layer in a loop would not) and sends
calls of up to the largest row count at which the plain product won, and all smaller ones,
to it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial

import torch

log = logging.getLogger(__name__)

# Rows the packed layout is tuned for (it serves any number): a decode step of a full batch.
ROWS_HINT = 8
CALIBRATION_ROWS = (1, 2, 4, 8)
CALIBRATION_REPS = 3  # the fastest of these many passes each way, alternating


@dataclass
class Products:
    """Which product the packed layers of an engine's models compute a call with: calls of at
    most `plain_up_to` rows (all tokens of the call) the plain one, the others the packed one."""

    plain_up_to: int = 0


def pack_linears(model: torch.nn.Module, products: Products | None = None) -> int:
    """Route every float `nn.Linear` of `model` through oneDNN with a packed weight, except calls
    `products` sends to the plain product; the number of layers packed (0 where this torch has
    no oneDNN, or it refuses the weights)."""
    if not torch.backends.mkldnn.is_available():
        return 0
    layers = [
        m
        for m in model.modules()
        if type(m) is torch.nn.Linear and m.weight.dtype in (torch.float32, torch.bfloat16)
    ]
    try:
        with torch.inference_mode():
            packed = [
                torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), ROWS_HINT)
                for m in layers
            ]
            for m, weight in zip(layers, packed, strict=True):
                probe = torch.zeros((1, m.in_features), dtype=m.weight.dtype)
                torch.ops.mkldnn._linear_pointwise(probe, weight, m.bias, "none", [], "")
    except RuntimeError as exc:  # an op this build lacks: the plain layers serve
        log.warning("embedded engine: oneDNN linear unavailable (%s); plain nn.Linear", exc)
        return 0
    products = products if products is not None else Products()
    for m, weight in zip(layers, packed, strict=True):
        bias = m.bias.detach() if m.bias is not None else None
        forward = partial(_packed_forward, products, m.weight.detach(), weight, bias)
        m.forward = forward  # type: ignore[method-assign]
    return len(layers)


def calibrate(model: torch.nn.Module, products: Products, token_id: int) -> dict[int, float]:
    """Set `products.plain_up_to` from timed one-token forward passes of `model` (packed by
    `pack_linears` with `products`) at `CALIBRATION_ROWS` rows, plain and packed alternating;
    for the log, the packed pass's time over the plain one's at each row count."""
    ratios: dict[int, float] = {}
    with torch.inference_mode():
        for rows in CALIBRATION_ROWS:
            ids = torch.full((rows, 1), token_id, dtype=torch.long)
            best = {True: float("inf"), False: float("inf")}
            for _ in range(CALIBRATION_REPS + 1):  # the first of each way warms it
                for plain in (True, False):
                    products.plain_up_to = rows if plain else 0
                    started = time.perf_counter()
                    model(input_ids=ids, use_cache=False)
                    best[plain] = min(best[plain], time.perf_counter() - started)
            ratios[rows] = best[False] / best[True]
    plain_up_to = 0
    for rows in CALIBRATION_ROWS:
        if ratios[rows] <= 1.0:
            break
        plain_up_to = rows
    products.plain_up_to = plain_up_to
    return ratios


def _packed_forward(
    products: Products,
    plain: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    x: torch.Tensor,
) -> torch.Tensor:
    if x.numel() <= products.plain_up_to * x.shape[-1]:
        return torch.nn.functional.linear(x, plain, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
