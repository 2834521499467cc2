"""The TRL recipes (sft, kto, dpo, grpo) train real candidates on the tiny model and move it
the way their method says: each test measures the policy before and after with transformers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from reef.datasets import SCHEMAS
from reef.errors import ConfigError, ReefError
from reef.models import resolve_model
from reef.recipe import Trained, TrainJob, WeightsRecipe, load_recipe

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    # peft asks the model `is_gradient_checkpointing`, which transformers 5.24 deprecates.
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
    pytest.mark.timeout(120),
]

QUESTIONS = [
    "What is the capital of France?",
    "What is the capital of Germany?",
    "What is the capital of Italy?",
    "How can I help you today?",
]
GOOD = "Paris is the capital."
BAD = "I do not know the answer to that question."


# fixtures and helpers ------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Any:
    """The tiny model's matrices are too small to share: on a busy 2-core machine two intra-op
    threads made each matmul ~40x slower (14 ms against 0.37 ms, measured) than one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_model("tiny", tmp_path_factory.mktemp("models"))


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def _common(sample_id: str) -> dict[str, Any]:
    return {
        "sample_id": sample_id,
        "scenario": "s",
        "record_ids": [sample_id],
        "release_id": "rel_base",
        "staleness": 0,
        "report_ids": [f"rep_{sample_id}"],
        "n_tokens": None,
    }


def scored(rows: Sequence[tuple[str, str, float, Any]]) -> pa.Table:
    """A "scored" snapshot from (question, answer, score, feedback object or None) rows."""
    return pa.Table.from_pylist(
        [
            _common(f"rec_{i}")
            | {
                "messages": json.dumps(messages(q)),
                "completion": a,
                "score": s,
                "report_id": f"rep_rec_{i}",
                "feedback": None if fb is None else json.dumps(fb),
            }
            for i, (q, a, s, fb) in enumerate(rows)
        ],
        schema=SCHEMAS["scored"],
    )


def preference(rows: Sequence[tuple[str, str, str]]) -> pa.Table:
    """A "preference" snapshot from (question, chosen, rejected) rows."""
    return pa.Table.from_pylist(
        [
            _common(f"pair_{i}")
            | {
                "messages": json.dumps(messages(q)),
                "chosen": c,
                "rejected": r,
                "chosen_score": 1.0,
                "rejected_score": 0.0,
            }
            for i, (q, c, r) in enumerate(rows)
        ],
        schema=SCHEMAS["preference"],
    )


class Calls:
    """A progress callback that remembers what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, dict[str, float]]] = []

    def __call__(self, step: int, total: int, metrics: Mapping[str, float]) -> None:
        self.calls.append((step, total, dict(metrics)))


def train(
    recipe: WeightsRecipe, tiny: Path, table: pa.Table, out: Path, **job: Any
) -> tuple[Trained, Calls]:
    calls = Calls()
    trained = recipe.train(TrainJob("s", tiny, table, out, **job), calls)
    assert calls.calls and calls.calls[-1][0] == calls.calls[-1][1] > 0  # reached the last step
    assert math.isfinite(trained.metrics["train_loss"])
    assert trained.path == out
    return trained, calls


def policy(tiny: Path, out: Path | None = None) -> tuple[Any, Any]:
    """(model, tokenizer): the base, or a candidate directory (adapter or checkpoint)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    if out is not None and (out / "adapter_config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
        model = PeftModel.from_pretrained(model, out)
    else:
        model = AutoModelForCausalLM.from_pretrained(out or tiny, dtype=torch.float32)
    return model.eval(), tokenizer


def logprob(model: Any, tokenizer: Any, question: str, answer: str) -> float:
    """log p(answer | question) under the chat template, summed over the answer's tokens."""
    import torch

    prompt = tokenizer.apply_chat_template(
        messages(question), add_generation_prompt=True, tokenize=False
    )
    full = tokenizer.apply_chat_template(
        [*messages(question), {"role": "assistant", "content": answer}], tokenize=False
    )
    p_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    ids = tokenizer(full, add_special_tokens=False).input_ids
    assert ids[: len(p_ids)] == p_ids
    x = torch.tensor([ids])
    with torch.no_grad():
        logp = model(x).logits[0, :-1].log_softmax(-1)
    token_logp = logp.gather(-1, x[0, 1:, None])[:, 0]
    return float(token_logp[len(p_ids) - 1 :].sum())


def mean_logprob(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> float:
    return sum(logprob(model, tokenizer, q, a) for q, a in pairs) / len(pairs)


def assert_adapter(out: Path) -> None:
    assert (out / "adapter_config.json").is_file()
    assert (out / "adapter_model.safetensors").is_file()
    assert not (out / "ref").exists()  # TRL's frozen reference adapter is not part of it


def assert_checkpoint(out: Path) -> None:
    assert (out / "config.json").is_file()
    assert (out / "model.safetensors").is_file()
    assert (out / "tokenizer.json").is_file()
    assert not (out / "adapter_config.json").exists()


def fast(name: str, **overrides: Any) -> WeightsRecipe:
    """A recipe with the YAML-style overrides tests use to stay small."""
    return load_recipe(name, overrides)


# sft ------------------------------------------------------------------------------------
def sft_table() -> pa.Table:
    return scored(
        [
            *[(q, GOOD, 1.0, None) for q in QUESTIONS[:3]],
            (QUESTIONS[3], BAD, 0.0, None),  # failed, uncorrected: left out
            (QUESTIONS[3], BAD, 0.0, {"correction": "Hello! Thank you very much."}),
            (QUESTIONS[0], BAD, 0.2, {"comment": "wrong"}),  # feedback without a correction
        ]
    )


@pytest.fixture(scope="module")
def sft_adapter(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One default-size SFT run (6 epochs of LoRA) that other tests continue from."""
    out = tmp_path_factory.mktemp("sft") / "candidate"
    trained, calls = train(load_recipe("sft"), tiny, sft_table(), out)
    assert trained.kind == "adapter"
    assert trained.trained_sample_ids == ("rec_0", "rec_1", "rec_2", "rec_4")
    assert trained.metrics["train_rows"] == 4
    assert calls.calls[-1][1] == 6  # 4 rows, batch 4, 6 epochs
    assert_adapter(out)
    return out


def test_sft_raises_the_targets_likelihood(tiny: Path, sft_adapter: Path) -> None:
    targets = [(q, GOOD) for q in QUESTIONS[:3]] + [(QUESTIONS[3], "Hello! Thank you very much.")]
    base = mean_logprob(*policy(tiny), targets)
    after = mean_logprob(*policy(tiny, sft_adapter), targets)
    assert after > base + 5.0, (base, after)


def test_sft_continues_from_a_parent_adapter(tiny: Path, sft_adapter: Path, tmp_path: Path) -> None:
    """Trained again on the same data with the same seed, a run from the base would land on
    the parent's weights exactly; continuing from the parent goes further."""
    targets = [(q, GOOD) for q in QUESTIONS[:3]]
    recipe = fast("sft", epochs=2)
    trained, _ = train(
        recipe, tiny, sft_table(), tmp_path, parent_kind="adapter", parent_path=sft_adapter
    )
    assert trained.kind == "adapter"
    assert_adapter(tmp_path)
    parent = mean_logprob(*policy(tiny, sft_adapter), targets)
    child = mean_logprob(*policy(tiny, tmp_path), targets)
    assert child > parent, (parent, child)


def test_sft_full_fine_tune_writes_a_checkpoint(
    tiny: Path, sft_adapter: Path, tmp_path: Path
) -> None:
    # On top of an adapter head: the adapter is merged in and every weight trains.
    trained, _ = train(
        fast("sft", full=True, max_steps=2),
        tiny,
        sft_table(),
        tmp_path / "full",
        parent_kind="adapter",
        parent_path=sft_adapter,
    )
    assert trained.kind == "checkpoint"
    assert_checkpoint(tmp_path / "full")
    # LoRA on top of a checkpoint head is merged back: the candidate is a checkpoint again.
    trained, _ = train(
        fast("sft", max_steps=1),
        tiny,
        sft_table(),
        tmp_path / "lora-on-full",
        parent_kind="checkpoint",
        parent_path=tmp_path / "full",
    )
    assert trained.kind == "checkpoint"
    assert_checkpoint(tmp_path / "lora-on-full")


def test_rounds_share_the_base_weights_and_leave_them_as_read(
    tiny: Path, sft_adapter: Path, tmp_path: Path
) -> None:
    """The worker keeps the base model in memory between rounds (recipes.training.shared_base):
    each round's model shares its tensors, and neither LoRA training (sft_adapter, trained in
    this process) nor a full fine-tune from the base changes them."""
    import torch
    from transformers import AutoModelForCausalLM

    from reef.recipes.training import shared_base

    train(fast("sft", full=True, max_steps=1), tiny, sft_table(), tmp_path / "full")
    first, second = shared_base(tiny), shared_base(tiny)
    assert first is not second
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        assert a is not b and a.data_ptr() == b.data_ptr()
    disk = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).state_dict()
    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, disk[name]), name


def test_sft_with_nothing_to_learn_says_why(tiny: Path, tmp_path: Path) -> None:
    table = scored([(q, BAD, 0.0, None) for q in QUESTIONS])
    with pytest.raises(ReefError) as e:
        load_recipe("sft").train(TrainJob("s", tiny, table, tmp_path))
    assert e.value.code == "nothing_to_train"
    assert "threshold" in e.value.message
    assert not (tmp_path / "adapter_config.json").exists()


def test_sft_threshold_and_corrections_choose_the_rows() -> None:
    rows, ids = load_recipe("sft", {"threshold": 0.1}).rows(sft_table())
    assert ids == ["rec_0", "rec_1", "rec_2", "rec_4", "rec_5"]
    assert rows[3]["completion"] == [
        {"role": "assistant", "content": "Hello! Thank you very much."}
    ]
    assert rows[3]["prompt"] == messages(QUESTIONS[3])
    _, ids = load_recipe("sft", {"use_corrections": False}).rows(sft_table())
    assert ids == ["rec_0", "rec_1", "rec_2"]


# kto ------------------------------------------------------------------------------------
def test_kto_raises_desirable_over_undesirable(tiny: Path, tmp_path: Path) -> None:
    rows = [(q, GOOD, 1.0, None) for q in QUESTIONS] + [(q, BAD, 0.0, None) for q in QUESTIONS]
    recipe = fast("kto", learning_rate=1e-3, epochs=2)
    trained, _ = train(recipe, tiny, scored(rows), tmp_path)
    assert trained.kind == "adapter"
    assert_adapter(tmp_path)
    assert len(trained.trained_sample_ids) == 8
    assert trained.metrics["train_desirable"] == trained.metrics["train_undesirable"] == 4

    def gap(model: Any, tokenizer: Any) -> float:
        good = mean_logprob(model, tokenizer, [(q, GOOD) for q in QUESTIONS])
        bad = mean_logprob(model, tokenizer, [(q, BAD) for q in QUESTIONS])
        return good - bad

    before, after = gap(*policy(tiny)), gap(*policy(tiny, tmp_path))
    assert after > before + 1.0, (before, after)


def test_kto_balances_few_positives_and_counts_corrections() -> None:
    table = scored(
        [(QUESTIONS[0], GOOD, 1.0, None)]
        + [(q, BAD, 0.0, None) for q in QUESTIONS[1:]]
        + [(QUESTIONS[0], BAD, 0.0, {"correction": GOOD})]
    )
    rows, ids = load_recipe("kto").rows(table)
    labels = sorted((r["completion"][0]["content"], r["label"]) for r in rows)
    assert labels == sorted([(GOOD, True)] * 2 + [(BAD, False)] * 4)
    assert len(ids) == 5


# dpo ------------------------------------------------------------------------------------
def test_dpo_widens_the_chosen_margin(tiny: Path, sft_adapter: Path, tmp_path: Path) -> None:
    pairs = [(q, GOOD, BAD) for q in QUESTIONS]
    recipe = fast("dpo", learning_rate=1e-3, epochs=2)
    # From an adapter head: TRL trains it against a frozen copy, which must not be saved.
    trained, _ = train(
        recipe, tiny, preference(pairs), tmp_path, parent_kind="adapter", parent_path=sft_adapter
    )
    assert trained.kind == "adapter"
    assert_adapter(tmp_path)
    assert trained.trained_sample_ids == tuple(f"pair_{i}" for i in range(4))

    def margin(model: Any, tokenizer: Any) -> float:
        return sum(
            logprob(model, tokenizer, q, c) - logprob(model, tokenizer, q, r) for q, c, r in pairs
        )

    before = margin(*policy(tiny, sft_adapter))
    after = margin(*policy(tiny, tmp_path))
    assert after > before + 1.0, (before, after)
    assert trained.metrics["train_rewards/margins"] > 0


def test_dpo_skips_ties(tiny: Path, tmp_path: Path) -> None:
    table = preference([(QUESTIONS[0], GOOD, GOOD)])
    with pytest.raises(ReefError) as e:
        load_recipe("dpo").train(TrainJob("s", tiny, table, tmp_path))
    assert e.value.code == "nothing_to_train"


# grpo -----------------------------------------------------------------------------------
def digits(completions: Sequence[Any], **_: Any) -> list[float]:
    """A reward the random tiny model can climb fast: how many digits the answer has."""
    from reef.recipes.scorers import completion_text

    return [float(sum(ch.isdigit() for ch in completion_text(c))) for c in completions]


def digit_mass(model: Any, tokenizer: Any) -> float:
    """Mean probability that the first answer token holds a digit, over the questions."""
    import torch

    digit_ids = [
        i for i in range(len(tokenizer)) if any(ch.isdigit() for ch in tokenizer.decode([i]))
    ]
    total = 0.0
    for q in QUESTIONS:
        prompt = tokenizer.apply_chat_template(
            messages(q), add_generation_prompt=True, tokenize=False
        )
        x = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
        with torch.no_grad():
            total += float(model(x).logits[0, -1].softmax(-1)[digit_ids].sum())
    return total / len(QUESTIONS)


def greedy_reward(model: Any, tokenizer: Any) -> float:
    import torch

    rewards = []
    for q in QUESTIONS:
        prompt = tokenizer.apply_chat_template(
            messages(q), add_generation_prompt=True, tokenize=False
        )
        x = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
        with torch.no_grad():
            out = model.generate(x, max_new_tokens=8, do_sample=False)
        rewards += digits([tokenizer.decode(out[0, x.shape[1] :], skip_special_tokens=True)])
    return sum(rewards) / len(rewards)


def test_grpo_climbs_its_verifier(tiny: Path, tmp_path: Path) -> None:
    """GRPO on a random model is noisy: what is asserted is that the sampled rewards varied
    (there was a signal), the loss stayed finite, the policy moved probability toward what the
    verifier rewards, and greedy answers did not score worse."""
    recipe = fast(
        "grpo",
        reward=f"{__name__}:digits",
        learning_rate=1e-3,
        max_completion_length=8,
        max_steps=8,
    )
    assert recipe.scorer() is digits
    table = scored([(q, BAD, 0.0, None) for q in QUESTIONS] + [(QUESTIONS[0], GOOD, 1.0, None)])
    trained, calls = train(recipe, tiny, table, tmp_path)
    assert trained.kind == "adapter"
    assert_adapter(tmp_path)
    assert trained.metrics["train_prompts"] == 4  # distinct requests
    assert len(trained.trained_sample_ids) == 5
    assert any(m.get("reward_std", 0) > 0 for _, _, m in calls.calls)
    base, after = policy(tiny), policy(tiny, tmp_path)
    assert digit_mass(*after) > digit_mass(*base)
    assert greedy_reward(*after) >= greedy_reward(*base)


def test_grpo_default_verifier() -> None:
    from reef.recipes.scorers import at_most_five_words

    recipe = load_recipe("grpo")
    assert recipe.scorer() is at_most_five_words
    answers = ["Paris.", "", "one two three four five six seven eight nine ten"]
    assert recipe.scorer()(answers) == [1.0, 0.0, 0.5]
    # TRL hands conversational completions as message lists
    assert at_most_five_words([[{"role": "assistant", "content": "Paris is lovely."}]]) == [1.0]


# params and wiring ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "kind"),
    [("sft", "scored"), ("kto", "scored"), ("dpo", "preference"), ("grpo", "scored")],
)
def test_recipes_are_wired_by_short_name(name: str, kind: str) -> None:
    recipe = load_recipe(name)
    assert recipe.name == name
    assert recipe.kind == kind
    assert recipe.params.full is False and recipe.params.lora_r == 16
    described = recipe.describe()
    assert described["params"]["lora_alpha"] == 32
    json.dumps(described)  # plain values, ready to log


def test_params_from_yaml_overrides() -> None:
    # YAML gives ints for floats and plain strings/booleans.
    recipe = load_recipe("sft", {"threshold": 1, "full": True, "lora_r": 8, "learning_rate": 1})
    assert recipe.params.threshold == 1.0 and isinstance(recipe.params.threshold, float)
    assert recipe.params.full is True and recipe.params.lora_r == 8
    assert recipe.params.learning_rate == 1.0
    assert load_recipe("grpo", {"num_generations": 2, "batch_size": 6}).params.batch_size == 6


@pytest.mark.parametrize(
    ("name", "overrides", "says"),
    [
        ("sft", {"treshold": 0.5}, "treshold"),
        ("sft", {"lora_r": "big"}, "lora_r"),
        ("kto", {"full": "yes"}, "full"),
        ("grpo", {"num_generations": 3}, "multiple of num_generations"),
        ("grpo", {"num_generations": 1, "batch_size": 1}, "num_generations must be >= 2"),
    ],
)
def test_bad_params_are_config_errors(name: str, overrides: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_recipe(name, overrides)


def test_bad_reward_path_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nowhere"):
        load_recipe("grpo", {"reward": "reef.recipes.scorers:nowhere"}).scorer()


def test_importing_the_recipes_does_not_load_torch() -> None:
    code = (
        "import sys, reef.recipes.sft, reef.recipes.kto, reef.recipes.dpo, reef.recipes.grpo, reef.recipes.scorers; "
        "print('torch' in sys.modules, 'trl' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split() == ["False", "False"]


# SmolLM2 --------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sft_teaches_smollm2_short_answers(tmp_path: Path) -> None:
    """The design guide's measurement through the recipe: 8 corrected five-word answers,
    default params; held-out questions get answers of at most five words far more often."""
    try:
        model_dir = resolve_model("smollm2", Path("~/.cache/reef/models"))
    except ConfigError as e:
        pytest.skip(str(e))
    instruction = "Answer in at most five words."
    train_qa = [
        ("What is the capital of France?", "Paris is France's capital."),
        ("Why is the sky blue?", "Air scatters blue light most."),
        ("What do bees make?", "Bees make honey."),
        ("How many legs does a spider have?", "A spider has eight legs."),
        ("What is water made of?", "Hydrogen and oxygen."),
        ("Who wrote Hamlet?", "William Shakespeare wrote it."),
        ("What is the largest planet?", "Jupiter is the largest."),
        ("What language is spoken in Brazil?", "Portuguese is spoken there."),
    ]
    held_out = [
        "What is the capital of Italy?",
        "Why do leaves change color in autumn?",
        "What do cows eat?",
        "How many days are in a year?",
        "What is the boiling point of water?",
        "Who painted the Mona Lisa?",
        "What is the smallest prime number?",
        "What gas do plants absorb?",
    ]

    def ask(q: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": instruction}, {"role": "user", "content": q}]

    table = pa.Table.from_pylist(
        [
            _common(f"rec_{i}")
            | {
                "messages": json.dumps(ask(q)),
                "completion": "Well, that is a great question, and the answer is long.",
                "score": 0.0,
                "report_id": f"rep_rec_{i}",
                "feedback": json.dumps({"correction": a}),
            }
            for i, (q, a) in enumerate(train_qa)
        ],
        schema=SCHEMAS["scored"],
    )
    trained, _ = train(load_recipe("sft"), model_dir, table, tmp_path)
    assert trained.kind == "adapter"

    def obeys(model: Any, tokenizer: Any) -> float:
        import torch

        ok = 0
        for q in held_out:
            text = tokenizer.apply_chat_template(ask(q), add_generation_prompt=True, tokenize=False)
            x = torch.tensor([tokenizer(text, add_special_tokens=False).input_ids])
            with torch.no_grad():
                out = model.generate(x, max_new_tokens=32, do_sample=False)
            answer = tokenizer.decode(out[0, x.shape[1] :], skip_special_tokens=True)
            ok += len(answer.split()) <= 5
        return ok / len(held_out)

    before = obeys(*policy(model_dir))
    after = obeys(*policy(model_dir, tmp_path))
    assert after >= 0.5 and after > before, (before, after)


def one_at_a_time(model: Any, tokenizer: Any, messages: list[dict[str, Any]], answer: str) -> float:
    """The reference for the gate's batched replay: one sequence, every position's logits."""
    import torch

    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = prompt + answer + (tokenizer.eos_token or "")
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    n = len(ids) - len(p_ids)
    if n <= 0:
        return 0.0
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
    token_lp = logp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)[-n:]
    return float(token_lp.mean())


def test_replay_scores_in_batches_equal_one_at_a_time(tiny: Path, sft_adapter: Path) -> None:
    """The gate's replay reads its pool in padded batches with the vocabulary projection only
    where answer tokens are predicted: the same log-probs as one sample at a time, for the base
    and for a trained adapter, across a batch boundary and answers of different lengths."""
    from reef.recipes import evaluate as ev

    items = [
        ([{"role": "user", "content": q}], answer)
        for q in QUESTIONS
        for answer in (GOOD, "A much longer answer that goes on for a while, on purpose.", "")
    ]
    items = (items * (ev.REPLAY_BATCH // len(items) + 2))[: ev.REPLAY_BATCH + 3]
    for kind, path in (("base", None), ("adapter", sft_adapter)):
        model, tokenizer = ev.load_model(tiny, kind, path)
        one = [one_at_a_time(model, tokenizer, m, a) for m, a in items]
        assert ev.answer_logprobs(model, tokenizer, items) == pytest.approx(one, abs=1e-5), kind


def test_replay_reads_a_shared_system_prompt_once_with_the_same_logprobs(
    tiny: Path, sft_adapter: Path
) -> None:
    """Every sequence of a batch that starts with the same tokens (here a long system prompt)
    has them read once, their keys and values shared: the log-probs are those of one sample at
    a time, for the base and an adapter, with answers of different lengths and an empty one."""
    from reef.recipes import evaluate as ev

    system = {"role": "system", "content": "You answer questions about colours. " * 6}
    items = [
        ([system, {"role": "user", "content": q}], answer)
        for q in QUESTIONS
        for answer in (GOOD, "A much longer answer that goes on for a while, on purpose.", "")
    ][: ev.REPLAY_BATCH + 2]
    model, tokenizer = ev.load_model(tiny, "base", None)
    encoded = ev.encode_answers(tokenizer, items[: ev.REPLAY_BATCH])
    assert ev.shared_prefix(encoded) >= 36, "the system prompt (36 words) is read once"
    for kind, path in (("base", None), ("adapter", sft_adapter)):
        model, tokenizer = ev.load_model(tiny, kind, path)
        one = [one_at_a_time(model, tokenizer, m, a) for m, a in items]
        assert ev.answer_logprobs(model, tokenizer, items) == pytest.approx(one, abs=1e-5), kind


def test_the_heads_replay_logprobs_are_computed_once_per_sample(tiny: Path) -> None:
    """The gate scores the same head on a pool that mostly stays between rounds: the head's
    log-probs are kept per release and sample, and only samples new to it are read again."""
    from reef.flows.weights import head_logprobs
    from reef.recipes import evaluate as ev

    model, tokenizer = ev.load_model(tiny, "base", None)
    pool = [
        ev.EvalSample(f"s{i}", [{"role": "user", "content": q}], GOOD, 1.0)
        for i, q in enumerate(QUESTIONS)
    ]
    read: list[int] = []

    def compute(todo: list[ev.EvalSample]) -> list[float]:
        read.append(len(todo))
        return ev.replay_logprobs(model, tokenizer, todo)

    first = head_logprobs("rel_head", pool[:3], compute)
    again = head_logprobs("rel_head", pool, compute)  # the pool grew by the rest
    assert read == [3, len(pool) - 3]
    assert again[:3] == first
    assert again == pytest.approx(ev.replay_logprobs(model, tokenizer, pool), abs=1e-5)
    head_logprobs("rel_other", pool[:1], compute)  # another release: read afresh
    assert read[-1] == 1


def test_evaluation_keeps_the_models_it_read_by_their_files(
    tiny: Path, sft_adapter: Path, tmp_path: Path
) -> None:
    """A released candidate is the next round's head, read from another directory: the same
    bytes give the model already loaded; other bytes, or a changed base, are read afresh."""
    import shutil

    from reef.recipes import evaluate as ev

    head = tmp_path / "head"
    shutil.copytree(sft_adapter, head)
    candidate, tokenizer = ev.load_model(tiny, "adapter", sft_adapter)
    again, tokenizer_again = ev.load_model(tiny, "adapter", head)
    assert again is candidate and tokenizer_again is tokenizer
    assert ev.load_model(tiny, "base", None)[0] is ev.load_model(tiny, "base", None)[0]
    changed = tmp_path / "changed"
    shutil.copytree(sft_adapter, changed)
    config = json.loads((changed / "adapter_config.json").read_text())
    (changed / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": 1}))
    other, _ = ev.load_model(tiny, "adapter", changed)
    assert other is not candidate
    items = [([{"role": "user", "content": QUESTIONS[0]}], GOOD)]
    assert ev.answer_logprobs(other, tokenizer, items) != ev.answer_logprobs(
        again, tokenizer, items
    )
