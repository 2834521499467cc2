"""`sample_rows` with structured-output masks: the draw stays inside the mask, the recorded
log-probs stay the model's own."""

from __future__ import annotations

import torch

from reef.engines.sampling import SamplingParams, sample_rows


def test_masked_rows_draw_only_allowed_tokens_and_report_raw_logprobs() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    allowed = torch.zeros(50, dtype=torch.bool)
    allowed[[3, 17, 40]] = True
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0), SamplingParams()]
    raw = torch.log_softmax(logits, dim=-1)
    for seed in range(20):
        gens = [torch.Generator().manual_seed(seed) for _ in params]
        greedy, sampled, free = sample_rows(logits, params, gens, [allowed, allowed, None])
        assert greedy.token_id == max((3, 17, 40), key=lambda t: float(logits[0, t]))
        assert sampled.token_id in (3, 17, 40)
        for row, pick in ((0, greedy), (1, sampled), (2, free)):
            assert abs(pick.logprob - float(raw[row, pick.token_id])) < 1e-6
        # the unmasked row is drawn as before: same generator state, same token
        alone = sample_rows(logits[2:], [params[2]], [torch.Generator().manual_seed(seed)])
        assert alone[0].token_id == free.token_id
