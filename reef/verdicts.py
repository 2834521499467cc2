"""Verdicts by likelihood: the served model reads what came after a turn, once, and says good, bad
or unclear without generating a word.

Generating a verdict asks a small model to think, then write `\\boxed{v}`; SmolLM2-135M almost
never does (every vote void on the runs that prompted this module), and each judged turn cost six
generations of up to 512 tokens. Here the judge is one forward pass: a short, fixed text of
labelled reactions ("Reaction (user): Thanks, that worked.\\nVerdict: good"), then the judged
turn's reaction and "Verdict:", and the verdict is read from the model's next-token
log-probabilities of " good", " bad" and " unclear". The fixed text is read once; each turn
reads only its own few tokens after it (its keys and values are kept).

A probe calibrates the reading: a small softmax regression over the same pass (the three
log-probabilities and the last position's hidden state), fitted on labelled reactions: the seed
set shipped beside this module, plus the scenario's own labelled turns (a person's score on a
turn that also has a next state) as they arrive (`Probe.fit`). Its class probability is the
verdict's confidence. Measured accuracy is in docs/reactions.md (bench/judge_accuracy.py):
read it before trusting any judge, this one included.

The model read is the scenario's base model (the files the engine was started with), loaded in
the worker, never the head: a judge that moved with each candidate would grade its own
training.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from reef.judge import MIN_HINT_CHARS, Exchange, Judgment

log = logging.getLogger("reef.verdicts")

LABELS: tuple[str, ...] = ("good", "bad", "unclear")
SCORES: tuple[int, ...] = (1, -1, 0)  # the verdict each label gives, in LABELS' order
MAX_REACTION_CHARS = 600  # a reaction's opening is what tells; a long traceback's tail does not

# The labelled reactions read before every judged turn. Written for this prompt; none is in the
# judge bench (bench/data/judge_labels.jsonl) or the seed set.
SHOTS: tuple[tuple[str, str, str], ...] = (
    ("user", "Thanks, that's exactly what I needed.", "good"),
    ("user", "No, that's wrong.", "bad"),
    ("user", "What's the weather like tomorrow?", "unclear"),
    ("tool", "Tests passed: 18 passed", "good"),
    ("tool", "SyntaxError: invalid syntax", "bad"),
    ("user", "Please make it shorter.", "bad"),
    ("user", "Perfect!", "good"),
    ("user", "alright, noted", "unclear"),
    ("tool", '{"items": []}', "unclear"),
    ("user", "could you have another go at it?", "bad"),
    ("user", "That worked, next question: how do I sort it?", "good"),
)
PREAMBLE = (
    "Each reaction below came right after an assistant's answer. The verdict says whether the "
    "reaction shows the answer was good or bad.\n\n"
)


def reaction_line(role: str, text: str) -> str:
    """How a reaction is shown to the model: its role and its opening, on one line."""
    flat = " ".join(text.split())[:MAX_REACTION_CHARS]
    return f"Reaction ({role}): {flat}\nVerdict:"


def fixed_text() -> str:
    return PREAMBLE + "".join(f"{reaction_line(r, t)} {v}\n\n" for r, t, v in SHOTS)


@dataclass(frozen=True)
class Reading:
    """What one pass over a reaction gives: the labels' log-probabilities (LABELS' order), the
    last position's hidden state, and the tokens the pass read (the fixed text's are read once,
    when the reader starts, not per turn)."""

    logprobs: tuple[float, ...]
    hidden: tuple[float, ...]
    tokens: int

    def features(self) -> np.ndarray:
        lp = np.asarray(self.logprobs, dtype=np.float64)
        lp = lp - np.logaddexp.reduce(lp)  # the labels' own distribution
        return np.concatenate([lp, np.asarray(self.hidden, dtype=np.float64)])


class Reader:
    """A causal LM that reads reactions after the fixed text. Thread-safe (one pass at a time:
    the worker judges several turns at once, the model takes them one by one)."""

    def __init__(self, model_dir: Path, *, threads: int = 1, cache_dir: Path | None = None):
        """`cache_dir`: where the features of reactions read before are kept across processes
        (a file per model and fixed text), so the seed labels are read once per machine."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._torch = torch
        self.model_dir = model_dir
        self.threads = threads
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str], np.ndarray] = {}
        self._cache_file = cache_dir / f"{self._fingerprint()}.npz" if cache_dir else None
        self._load_cache()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        self._label_ids = [self._first_token(" " + label) for label in LABELS]
        prefix = self.tokenizer(fixed_text(), return_tensors="pt")
        self._prefix_tokens = int(prefix.input_ids.shape[1])
        with self._threads(), torch.inference_mode():
            out = self.model(**prefix, use_cache=True)
        self._prefix_cache = out.cache

    def _fingerprint(self) -> str:
        """What a reading depends on: the model's files, the fixed text, how reactions show."""
        h = hashlib.sha256()
        for name in ("config.json", "model.safetensors"):
            f = self.model_dir / name
            if f.exists():
                st = f.stat()
                h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}".encode())
        h.update(str(self.model_dir.resolve()).encode())
        h.update(f"{fixed_text()}|{MAX_REACTION_CHARS}|{LABELS}".encode())
        return f"{self.model_dir.name}-{h.hexdigest()[:16]}"

    def _load_cache(self) -> None:
        if self._cache_file is None or not self._cache_file.exists():
            return
        try:
            with np.load(self._cache_file, allow_pickle=False) as z:
                keys = json.loads(str(z["keys"]))
                for (role, text), row in zip(keys, z["features"], strict=True):
                    self._known[(role, text)] = row
        except (OSError, ValueError, KeyError) as e:  # a broken cache is read again
            log.warning("ignoring the judge's feature cache %s: %s", self._cache_file, e)

    def _save_cache(self) -> None:
        """Write what is known, whole or not at all. Several processes may write the same
        file at once (the workers of one machine): each writes its own temporary file and
        the last rename wins; a cache that cannot be written is only a slower next start."""
        if self._cache_file is None or not self._known:
            return
        keys = list(self._known)
        try:
            self._cache_file.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                dir=self._cache_file.parent, suffix=".npz", delete=False
            ) as f:
                np.savez(
                    f,
                    keys=np.array(json.dumps(keys)),
                    features=np.stack(list(self._known.values())),
                )
            Path(f.name).replace(self._cache_file)
        except OSError as e:
            log.warning("could not write the judge's feature cache %s: %s", self._cache_file, e)

    def features(self, reactions: Sequence[tuple[str, str]]) -> np.ndarray:
        """The probe's features of each (role, text) reaction: read once, in batches, then
        kept (in memory and in `cache_dir`)."""
        todo = list(dict.fromkeys(r for r in reactions if r not in self._known))
        if todo:
            started = time.perf_counter()
            for key, reading in zip(todo, self.read_many(todo), strict=True):
                self._known[key] = reading.features()
            log.info("read %d reactions in %.1f s", len(todo), time.perf_counter() - started)
            self._save_cache()
        return np.stack([self._known[r] for r in reactions])

    def _first_token(self, word: str) -> int:
        ids = self.tokenizer(word, add_special_tokens=False).input_ids
        if not ids:
            raise ValueError(f"the tokenizer has no token for {word!r}")
        return int(ids[0])

    @contextlib.contextmanager
    def _threads(self) -> Iterator[None]:
        """torch's thread count for one pass, restored after (the worker trains with more)."""
        before = self._torch.get_num_threads()
        self._torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            self._torch.set_num_threads(before)

    def read_many(self, reactions: Sequence[tuple[str, str]], batch: int = 16) -> list[Reading]:
        """Readings of many (role, text) reactions, `batch` at a time: the fixed text's keys and
        values repeated for each row, the reactions padded on the right (a causal model's real
        tokens never see the padding after them), each read at its own last token. Equal to
        `read` one by one up to float rounding."""
        torch = self._torch
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        out: list[Reading] = []
        for start in range(0, len(reactions), batch):
            rows = [reaction_line(r, t) for r, t in reactions[start : start + batch]]
            enc = self.tokenizer(rows, return_tensors="pt", padding=True, add_special_tokens=False)
            n = len(rows)
            mask = torch.cat(
                [
                    torch.ones(n, self._prefix_tokens, dtype=enc.attention_mask.dtype),
                    enc.attention_mask,
                ],
                dim=1,
            )
            with self._lock, self._threads(), torch.inference_mode():
                cache = copy.deepcopy(self._prefix_cache)
                cache.batch_repeat_interleave(n)
                res = self.model(
                    input_ids=enc.input_ids,
                    attention_mask=mask,
                    cache=cache,
                    use_cache=True,
                    output_hidden_states=True,
                )
            last = enc.attention_mask.sum(dim=1) - 1
            for i in range(n):
                logprobs = torch.log_softmax(res.logits[i, last[i]].float(), dim=-1)
                hidden = res.hidden_states[-1][i, last[i]].float()
                out.append(
                    Reading(
                        logprobs=tuple(float(logprobs[j]) for j in self._label_ids),
                        hidden=tuple(float(v) for v in hidden.tolist()),
                        tokens=int(enc.attention_mask[i].sum()),
                    )
                )
        return out

    def read(self, role: str, text: str) -> Reading:
        return self.read_many([(role, text)])[0]


# the probe --------------------------------------------------------------------------------
class Probe:
    """Softmax regression over standardized features, L2-regularized, fitted by full-batch
    gradient descent (a few hundred rows of ~600 features: milliseconds). Classes are LABELS."""

    def __init__(self, l2: float = 1.0, steps: int = 400, lr: float = 0.5):
        self.l2 = l2
        self.steps = steps
        self.lr = lr
        self.n = 0
        self._mean: np.ndarray | None = None
        self._scale: np.ndarray | None = None
        self._w: np.ndarray | None = None

    @property
    def fitted(self) -> bool:
        return self._w is not None

    def fit(self, x: np.ndarray, labels: Sequence[int]) -> Probe:
        """`labels`: verdicts in {1, -1, 0}; every class needs at least one row."""
        y = np.array([SCORES.index(int(v)) for v in labels])
        if len(set(y.tolist())) < len(LABELS):
            raise ValueError("a probe needs labelled rows of every verdict (good, bad, unclear)")
        self._mean = x.mean(axis=0)
        self._scale = x.std(axis=0) + 1e-6
        z = self._design(x)
        onehot = np.eye(len(LABELS))[y]
        w = np.zeros((z.shape[1], len(LABELS)))
        # balanced: each verdict weighs the same whatever its share of the labels
        weight = (len(y) / (len(LABELS) * np.bincount(y, minlength=len(LABELS))))[y][:, None]
        for _ in range(self.steps):
            p = _softmax(z @ w)
            grad = z.T @ ((p - onehot) * weight) / len(y)
            grad[:-1] += self.l2 * w[:-1] / len(y)
            w -= self.lr * grad
        self._w = w
        self.n = len(y)
        return self

    def _design(self, x: np.ndarray) -> np.ndarray:
        assert self._mean is not None and self._scale is not None
        z = (x - self._mean) / self._scale
        return np.hstack([z, np.ones((len(z), 1))])

    def proba(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities (rows of LABELS' order)."""
        if self._w is None:
            raise ValueError("the probe is not fitted")
        return _softmax(self._design(np.atleast_2d(x)) @ self._w)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(axis=1, keepdims=True))


# labelled reactions ----------------------------------------------------------------------
@dataclass(frozen=True)
class Labelled:
    role: str
    text: str
    label: int  # 1, -1 or 0


def seed_labels() -> list[Labelled]:
    """The labelled reactions shipped with Reef (reef/data/judge_seed.jsonl)."""
    text = resources.files("reef").joinpath("data/judge_seed.jsonl").read_text("utf-8")
    return list(labelled_rows(json.loads(line) for line in text.splitlines() if line.strip()))


def labelled_rows(rows: Iterable[dict[str, Any]]) -> Iterable[Labelled]:
    """Rows of the judge data files ({"next": {"role", "content"}, "label"}) as Labelled."""
    for row in rows:
        nxt = row["next"]
        yield Labelled(str(nxt["role"]), str(nxt["content"]), int(row["label"]))


# the judge --------------------------------------------------------------------------------
class LikelihoodJudge:
    """Judges a turn from one reading of its next state. The verdict is the probe's likeliest
    label when a probe is fitted, else the likeliest of the three labels; `confidence` is its
    probability. Below `min_confidence` the verdict is kept in the record but scores 0 and
    trains nothing. Hints: a negative verdict on a user's reaction longer than MIN_HINT_CHARS
    keeps the reaction itself as the hint (what the user said is what the turn should have
    heeded), when `hints` is "reaction"."""

    method = "likelihood"

    def __init__(
        self,
        reader: Reader,
        identity: str,
        *,
        probe: Probe | None = None,
        min_confidence: float = 0.0,
        hints: str = "reaction",
    ):
        self.reader = reader
        self.identity = identity
        self.probe = probe
        self.min_confidence = min_confidence
        self.hints = hints

    def fit(self, labelled: Sequence[Labelled]) -> None:
        """Refit the probe on these labelled reactions (the seed set plus the scenario's).
        The reader keeps what it read, so a refit reads only reactions it has not read."""
        x = self.reader.features([(r.role, r.text) for r in labelled])
        self.probe = Probe().fit(x, [r.label for r in labelled])

    def verdict(self, reading: Reading) -> tuple[int, float, dict[str, float]]:
        if self.probe is not None and self.probe.fitted:
            p = self.probe.proba(reading.features())[0]
        else:
            p = _softmax(np.asarray([reading.logprobs]))[0]
        best = int(np.argmax(p))
        return SCORES[best], float(p[best]), {LABELS[i]: float(p[i]) for i in range(len(LABELS))}

    def judge(self, exchange: Exchange) -> Judgment:
        start = time.perf_counter()
        reading = self.reader.read(exchange.next_role, exchange.next_text)
        verdict, confidence, probs = self.verdict(reading)
        score = verdict if confidence >= self.min_confidence else 0
        hints: tuple[str, ...] = ()
        text = exchange.next_text.strip()
        if (
            self.hints == "reaction"
            and score == -1
            and exchange.next_role == "user"
            and len(text) > MIN_HINT_CHARS
        ):
            hints = (text,)
        return Judgment(
            score=score,
            hints=hints,
            votes={"1": int(score == 1), "0": int(score == 0), "-1": int(score == -1), "void": 0},
            hint_votes={},
            raw={"likelihood": [json.dumps({"logprobs": list(reading.logprobs), "probs": probs})]},
            judge=self.identity,
            confidence=confidence,
            verdict=verdict,
            method=self.method,
            tokens=reading.tokens,
            seconds=time.perf_counter() - start,
        )
