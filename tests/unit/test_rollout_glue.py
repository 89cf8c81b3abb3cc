"""Plans become engine requests in order; groups become rows with per-group advantages."""

from __future__ import annotations

import json

import pytest

from megatron_pc.allocation import Request, Rollout, RoundPlan, TrainGroup
from megatron_pc.driver.rollouts import groups_to_sequences, plan_to_requests, to_rollouts
from megatron_pc.rollout.base import GenerationResult, Sample
from megatron_pc.training.payload import as_payload


def test_a_bound_round_is_one_request_list_in_plan_order() -> None:
    plan = RoundPlan(1, 1, [Request(2, 4, "pilot"), Request(0, 12, "commit")])
    reqs = plan_to_requests(plan, [[5, 6], [7], [8, 9, 10]])
    assert [(r.prompt_token_ids, r.n) for r in reqs] == [((8, 9, 10), 4), ((5, 6), 12)]


def test_rewards_are_paired_with_samples_in_order() -> None:
    result = GenerationResult([[Sample([1], [-0.1], "stop"), Sample([2, 3], [-0.2, -0.3], "length")], [Sample([4], [-0.4], "stop")]])
    out = to_rollouts(result, [(1.0, True), (0.0, False), (0.5, False)])
    assert [[r.reward for r in g] for g in out] == [[1.0, 0.0], [0.5]]
    payload = out[0][1].data
    assert payload.tokens.tolist() == [2, 3] and payload.logprobs.tolist() == pytest.approx([-0.2, -0.3]) and payload.finish == "length"
    # A buffered rollout goes into a checkpoint as JSON and comes back as the same payload.
    back = as_payload(Rollout.from_json(json.loads(json.dumps(out[0][1].to_json()))).data)
    assert back.tokens.tolist() == [2, 3] and back.logprobs.tolist() == payload.logprobs.tolist() and back.finish == "length"
    with pytest.raises(ValueError):
        to_rollouts(result, [(1.0, True)] * 4)


def _rollout(reward: float, tokens: list[int]) -> Rollout:
    return Rollout(reward, reward > 0, {"tokens": tokens, "logprobs": [-1.0] * len(tokens), "finish": "stop"})


def test_advantages_are_normalised_within_each_group_only() -> None:
    groups = [
        TrainGroup(0, [_rollout(1.0, [3]), _rollout(0.0, [4])], step=1),
        TrainGroup(1, [_rollout(1.0, [5]), _rollout(1.0, [6])], step=1),
    ]
    seqs = groups_to_sequences(groups, [[1, 2], [9]], std_normalize=True)
    assert [s.tokens for s in seqs] == [[1, 2, 3], [1, 2, 4], [9, 5], [9, 6]]
    assert [s.prompt_len for s in seqs] == [2, 2, 1, 1]
    assert seqs[0].advantage == pytest.approx(1.0, rel=1e-4) and seqs[1].advantage == pytest.approx(-1.0, rel=1e-4)  # (r - mean) / (std + eps)
    assert seqs[2].advantage == 0.0 and seqs[3].advantage == 0.0  # all-equal group: no signal
    assert seqs[0].engine_logprobs == [-1.0]


def test_empty_responses_count_in_the_baseline_but_are_not_trained() -> None:
    groups = [TrainGroup(0, [_rollout(1.0, [3]), _rollout(0.0, []), _rollout(0.0, [4])], step=1)]
    seqs = groups_to_sequences(groups, [[1]], std_normalize=False)
    assert len(seqs) == 2
    assert seqs[0].advantage == pytest.approx(2 / 3) and seqs[1].advantage == pytest.approx(-1 / 3)
