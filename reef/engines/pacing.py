"""How much of a prompt to read in a round while other requests decode, from measured round times.

A scheduler round that reads a prompt chunk while rows decode takes longer than a plain decode
step: on a CPU the chunk's tokens cost about what as many more decoding rows would. With an
inter-token latency target (`engine.embedded.itl_target_ms`) the scheduler sizes each chunk so
that the round is expected to end within the target, which is the gap the decoding streams see
between their tokens: the token budget per iteration derived from a latency objective of
Sarathi-Serve's stall-free batching. A long prompt then takes as many rounds as the target
leaves room for and its own first token comes later; the streams it arrived among keep their
pace. Where not even one token fits (on a CPU a round that reads one prompt token among eight
decoding rows already costs ~20 % more than one that reads none: the fused pass's second
attention over the prompt's cache and its extra bookkeeping), the prompt waits: for the
streams to end (with nothing decoding it is read whole), or for room, but at most
`engine.embedded.itl_max_wait_ms`; after that it is read a token a round at least, so that
streams that never end cannot starve it.

The target is absolute (`engine.embedded.itl_target_ms`), relative to a plain round of the
same rows (`engine.embedded.itl_headroom`: 0.15 keeps a round that reads a prompt within 1.15x
of one that does not, whatever the machine's speed and the batch's size), or the tighter of the
two.

The cost model is linear and fit online from the rounds themselves, so it follows the machine,
the batch and its load: round ≈ decode(d) + per_token × c for d decoding rows and c prompt
tokens read (padding included). decode(d) is a moving average of rounds that read no prompt,
per row count; per_token the least-squares slope of (round − decode(d)) over c, exponentially
weighted toward recent rounds, starting from decode(d) / d (a prompt token costs about what a
decoding row does). Round times jitter by tens of percent on a shared machine: a one-token
round's excess is mostly noise, so rounds weigh by their chunk (the slope's c² weighting), and
the estimate has a floor so that a lucky streak cannot make the next chunk unbounded. Before a
plain round of any size has been seen, a round that read c tokens among d rows is taken as
d + c rows' worth of decoding (decode(d) ≈ round × d / (d + c)), a guess the first plain
round replaces: taking the whole round as decode(d) made every later round's excess negative
and held the slope at its floor for many rounds, which read chunks twice too large.
"""

from __future__ import annotations

SMOOTHING = 0.2  # weight of the newest plain round in decode(d)'s moving average
FORGET = 0.7  # weight the slope's sums keep at each round that read a prompt: ~10 rounds
FLOOR = 0.05  # the least a prompt token is taken to cost, as a share of a decoding row's cost


class Pacer:
    """Chunk sizes for a target round time. Used by the scheduler thread only."""

    def __init__(
        self, target_s: float | None = None, most: int = 0, *, headroom: float | None = None
    ):
        """`target_s`: the round time to stay within while rows decode; `headroom`: or how much
        longer than a plain round of as many rows it may take (0.15: 15 %), the tighter of the
        two where both are given; `most`: the largest chunk in tokens whatever the estimate
        (0: no cap)."""
        if target_s is None and headroom is None:
            raise ValueError("pacing needs an inter-token latency target or a headroom")
        if target_s is not None and target_s <= 0:
            raise ValueError("the inter-token latency target must be positive")
        if headroom is not None and headroom <= 0:
            raise ValueError("the inter-token latency headroom must be positive")
        self.target_s = target_s
        self.headroom = headroom
        self.most = most
        self._decode: dict[int, float] = {}  # decoding rows -> seconds of a plain round
        self._guess: dict[int, float] = {}  # the same, guessed before any plain round
        self._sxy = 0.0  # sum of weighted c * (round - decode(d)) over rounds with a chunk
        self._sxx = 0.0  # sum of weighted c * c

    def budget(self, rows: int) -> int:
        """Prompt tokens to read in a round in which `rows` rows decode; 0 where not even one
        fits the target by the estimate."""
        decode = self._decode_s(rows)
        if decode is None:  # nothing measured yet: one token, and a first measurement
            return 1
        per_token = self.per_token_s(rows)
        assert per_token is not None
        tokens = int((self.target(rows) - decode) / per_token + 1e-6)  # 3.9999... is 4
        if self.most:
            tokens = min(tokens, self.most)
        return max(0, tokens)

    def target(self, rows: int) -> float:
        """The round time to stay within while `rows` rows decode (inf: nothing to go by)."""
        targets = [] if self.target_s is None else [self.target_s]
        decode = self._decode_s(rows)
        if self.headroom is not None and decode is not None:
            targets.append(decode * (1 + self.headroom))
        return min(targets, default=float("inf"))

    def observe(self, rows: int, tokens: int, seconds: float) -> None:
        """A round in which `rows` rows decoded and `tokens` prompt tokens were read took
        `seconds`. Rounds without decoding rows say nothing about their gaps and are left out."""
        if rows <= 0:
            return
        if tokens <= 0:
            self._decode[rows] = _average(self._decode.get(rows), seconds)
            self._guess.clear()  # measured from now on
            return
        if not self._decode:  # no plain round seen: a prompt token costs what a row does
            self._guess[rows] = _average(self._guess.get(rows), seconds * rows / (rows + tokens))
        decode = self._decode_s(rows)
        assert decode is not None
        self._sxy = FORGET * self._sxy + tokens * (seconds - decode)
        self._sxx = FORGET * self._sxx + tokens * tokens

    def per_token_s(self, rows: int) -> float | None:
        """The estimated cost of one prompt token in a round of `rows` decoding rows."""
        decode = self._decode_s(rows)
        if decode is None:
            return None
        row = decode / max(1, rows)
        if not self._sxx:
            return row
        return max(self._sxy / self._sxx, FLOOR * row)

    def _decode_s(self, rows: int) -> float | None:
        """A plain round's time for `rows` rows: measured for that count, else for the nearest
        (guessed before any plain round)."""
        known = self._decode or self._guess
        if rows in known:
            return known[rows]
        if not known:
            return None
        nearest = min(known, key=lambda d: (abs(d - rows), -d))
        return known[nearest]


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
