"""OpenClaw-RL's objective (the OpenClaw-RL paper): k* selection on a hand-built overlap
matrix, the OPD gradient identity with ρ ≡ 1, the anchor case's zero gradient at step 0, and
the rows the recipe drops with a counted reason."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from reef.datasets import SCHEMAS
from reef.recipe import load_recipe
from reef.recipes.openclaw.objective import opd_loss, overlaps, rl_loss, select_candidate
from reef.recipes.openclaw.recipe import OpenClawParams
from reef.recipes.openclaw.turns import turns_from

# Three candidates (shortest hint first) over five response tokens.
OVERLAP = torch.tensor(
    [
        [2, 2, 0, 1, 1],  # sum 6
        [4, 0, 1, 1, 0],  # sum 6 (ties with the first: the shorter wins)
        [1, 3, 4, 0, 1],  # sum 9
    ]
)


def test_k_star_sequence_optimal_token_optimal_shortest() -> None:
    assert select_candidate(OVERLAP, "sequence_optimal").tolist() == [2, 2, 2, 2, 2]
    assert select_candidate(OVERLAP[:2], "sequence_optimal").tolist() == [0] * 5  # tie -> first
    assert select_candidate(OVERLAP, "token_optimal").tolist() == [1, 2, 2, 0, 0]
    assert select_candidate(OVERLAP, "shortest").tolist() == [0] * 5


def test_overlap_counts_shared_ids() -> None:
    student = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    teacher = torch.tensor([[[4, 3, 9, 10], [5, 6, 7, 8]], [[1, 2, 3, 4], [0, 9, 10, 11]]])
    assert overlaps(student, teacher).tolist() == [[2, 4], [4, 0]]


def test_opd_gradient_with_rho_one_is_the_weighted_clipped_difference() -> None:
    torch.manual_seed(0)
    length, vocab, k = 6, 11, 4
    logits = torch.randn(length, vocab, requires_grad=True)
    ids = torch.stack([torch.randperm(vocab)[:k] for _ in range(length)])
    teacher = torch.randn(length, k) * 2 - 1.5  # some differences beyond the clip
    mask = torch.ones(length)

    lsm = torch.log_softmax(logits, -1)
    opd = opd_loss(lsm, ids, teacher, mask, diff_clip=1.0)
    (grad,) = torch.autograd.grad(opd.loss, logits)

    # −mean_t Σ_{v∈S_t} w·clip(ℓ_T − ℓ_old)·∇ℓ_cur(v), with w, ℓ_old detached.
    lsm2 = torch.log_softmax(logits, -1)
    cur = lsm2.gather(-1, ids)
    old = cur.detach()
    w = torch.softmax(old, -1)
    coef = w * (teacher - old).clamp(-1.0, 1.0)
    surrogate = -(coef * cur).sum(-1).mean()
    (want,) = torch.autograd.grad(surrogate, logits)
    assert torch.allclose(grad, want, atol=1e-6)
    assert grad.abs().sum() > 0


def test_rl_gradient_with_rho_one_is_the_reward_weighted_log_prob() -> None:
    torch.manual_seed(1)
    logp = torch.log_softmax(torch.randn(5, 7), -1)[:, 0].clone().requires_grad_(True)
    loss = rl_loss(logp, -1.0, torch.ones(5))
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(grad, torch.full((5,), 1.0 / 5))  # −mean_t A ∇log π, A = −1


def test_anchor_case_gives_zero_opd_gradient_at_step_0(tmp_path: Path) -> None:
    """Teacher = base on the plain prompt, student = base + a fresh LoRA (B = 0): the same
    distribution, so every advantage is 0 and the OPD term pulls nowhere."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from reef.models import resolve_model
    from reef.recipes.openclaw.learner import OpenClawLearner, Setup, response_logits
    from reef.recipes.openclaw.turns import JudgedTurn

    model_dir = resolve_model("tiny", tmp_path / "models")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    policy = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    prompt, completion = [1, 5, 9, 12, 3], [7, 8, 2, 4]
    with torch.no_grad():
        lsm = response_logits(policy, prompt + completion, len(prompt), 0.6)
    topk = tuple(tuple(r) for r in lsm.topk(4, -1).indices.tolist())
    turn = JudgedTurn(
        "s", ({"role": "user", "content": "hi"},), tuple(prompt), tuple(completion), topk, 1, (), 0
    )
    setup = Setup(1e-3, 0.0, (0.9, 0.98), 0.6, 0.0, 1.0, 1.0, 0.2, 0.28, "sequence_optimal", None)
    learner = OpenClawLearner(policy, None, setup)
    teacher, kstar = learner.teacher(turn)
    student = response_logits(policy, prompt + completion, len(prompt), 0.6)
    opd = opd_loss(student, torch.tensor(topk), teacher, torch.ones(len(completion)))
    opd.loss.backward()
    grads = [p.grad for p in policy.parameters() if p.requires_grad and p.grad is not None]
    assert opd.advantage_abs_mean == 0.0 and kstar.tolist() == [0] * len(completion)
    assert grads and all(float(g.abs().max()) == 0.0 for g in grads)


def _rows(**over: object) -> pa.Table:
    row = {
        "sample_id": "rec_1",
        "scenario": "s",
        "record_ids": ["rec_1"],
        "release_id": "rel_0",
        "staleness": 0,
        "n_tokens": 7,
        "messages": json.dumps([{"role": "user", "content": "hi"}]),
        "completion": "x",
        "score": -1.0,
        "report_id": "judge_rec_1",
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "completion_mask": [1, 1],
        "logprobs": [-0.5, -0.7],
        "report_metadata": json.dumps({"source": "judge", "hints": ["Answer in one sentence."]}),
        "reported_at": None,
        "topk_ids": [[4, 1, 2, 3], [5, 6, 7, 8]],
    } | over
    schema = SCHEMAS["rollout"]
    return pa.Table.from_pylist([{f.name: row.get(f.name) for f in schema}], schema=schema)


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"topk_ids": None}, "no_topk_capture"),
        ({"topk_ids": [[4, 1, 2, 3]]}, "no_topk_capture"),  # does not cover the response
        ({"score": 0.0, "report_metadata": None}, "no_signal"),
        ({"score": 0.5}, "not_a_vote"),
        ({"completion_mask": [0, 1]}, "multi_turn"),
        ({"staleness": -1}, "negative_staleness"),
    ],
)
def test_rows_that_cannot_train_are_counted(over: dict[str, object], reason: str) -> None:
    turns, dropped = turns_from(_rows(**over))
    assert turns == [] and dropped == {reason: 1}


def test_dispatch_decides_reward_and_teachers() -> None:
    (turn,), _ = turns_from(_rows())
    assert turn.reward == -1 and turn.hints == ("Answer in one sentence.",)
    (turn,), _ = turns_from(_rows(score=1.0, report_metadata=None))
    assert turn.reward == 1 and turn.hints == ()  # the anchor
    (turn,), _ = turns_from(_rows(score=0.0))
    assert turn.reward == 0 and turn.hints  # hints only
    (turn,), _ = turns_from(_rows(score=0.2, report_metadata=None), thumbs=0.5)
    assert turn.reward == -1  # a thumbs-down


def test_learning_rate_defaults_by_mode_and_yields_to_a_given_one() -> None:
    # rl and combined step at 3e-4 (measured: bench/score_only.py, bench/reactions.py; 1e-4
    # moved a SmolLM2 LoRA a third as far in 10 rounds), opd at 1e-4 (not measured higher).
    assert load_recipe("openclaw", {"mode": "rl"}).params.setup().lr == 3e-4
    assert load_recipe("openclaw").params.setup().lr == 3e-4
    assert load_recipe("openclaw", {"mode": "opd"}).params.setup().lr == 1e-4
    given = load_recipe("openclaw", {"mode": "rl", "learning_rate": 2e-5})
    assert given.params.setup().lr == 2e-5
    with pytest.raises(ValueError, match="learning_rate"):
        OpenClawParams(learning_rate=0.0)


def test_without_the_anchor_an_unhinted_turn_trains_on_its_reward_alone(tmp_path: Path) -> None:
    """anchor: false — the teacher never runs for a turn without hints: combined takes the RL
    step alone (no OPD loss), opd mode takes no step at all (and does not fail)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from reef.models import resolve_model
    from reef.recipes.openclaw.learner import OpenClawLearner
    from reef.recipes.openclaw.turns import JudgedTurn

    model_dir = resolve_model("tiny", tmp_path / "models")
    prompt, completion = (1, 5, 9, 12, 3), (7, 8, 2, 4)
    topk = tuple((t, 10, 11, 13) for t in completion)
    turn = JudgedTurn("s", ({"role": "user", "content": "hi"},), prompt, completion, topk, 1, (), 0)
    for mode, moves in (("combined", True), ("opd", False)):
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        policy = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
        before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
        setup = OpenClawParams(mode=mode, anchor=False, learning_rate=1e-2).setup()
        totals = OpenClawLearner(policy, None, setup).step([turn])
        assert totals["opd_loss"] == 0.0 and totals["opd_advantage_abs"] == 0.0
        changed = any(
            not torch.equal(p, before[n]) for n, p in policy.named_parameters() if p.requires_grad
        )
        assert changed is moves, mode
