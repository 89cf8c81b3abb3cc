"""A plan is resolved once into requests that carry their prompt's token ids and answer; samples
are paired with the request that asked for them; groups become rows with per-group advantages."""

from __future__ import annotations

import json

import pytest

from megatron_pc.allocation import Request, Rollout, RoundPlan, TrainGroup
from megatron_pc.data.records import PromptRecord
from megatron_pc.driver.rounds import PromptRequest, gradings_of, resolve_round, sample_rows, to_rollouts
from megatron_pc.driver.scoring import Grading
from megatron_pc.driver.update import groups_to_sequences
from megatron_pc.rollout.base import GenerationResult, Sample, merge_results
from megatron_pc.training.payload import as_payload


def test_a_round_is_resolved_once_into_requests_in_plan_order_with_tokens_and_answers() -> None:
    plan = RoundPlan(1, 1, [Request(2, 4, "pilot"), Request(0, 12, "commit")])
    records = [PromptRecord(f"p{i}", f"q{i}", f"a{i}", source="s" if i else None, difficulty=0.5 if i else None) for i in range(3)]
    reqs = resolve_round(plan, [[5, 6], [7], [8, 9, 10]], records.__getitem__)
    assert [(r.prompt, r.kind, r.token_ids, r.grading.answer) for r in reqs] == [(2, "pilot", (8, 9, 10), "a2"), (0, "commit", (5, 6), "a0")]
    assert [(g.prompt_token_ids, g.n) for g in (r.generation for r in reqs)] == [((8, 9, 10), 4), ((5, 6), 12)]
    assert gradings_of(reqs) == [Grading("a2", "s", {"id": "p2", "difficulty": 0.5})] * 4 + [Grading("a0", None, {"id": "p0"})] * 12


def _requests(*ns: int) -> list[PromptRequest]:
    return [PromptRequest(i, "full", n, (1, 10 + i), Grading(str(i), None, {})) for i, n in enumerate(ns)]


def test_rewards_are_paired_with_samples_in_order() -> None:
    result = GenerationResult([[Sample([1], [-0.1], "stop"), Sample([2, 3], [-0.2, -0.3], "length")], [Sample([4], [-0.4], "stop")]])
    out = to_rollouts(_requests(2, 1), result, [(1.0, True), (0.0, False), (0.5, False)])
    assert [[r.reward for r in g] for g in out] == [[1.0, 0.0], [0.5]]
    payload = out[0][1].data
    assert payload.tokens.tolist() == [2, 3] and payload.logprobs.tolist() == pytest.approx([-0.2, -0.3]) and payload.finish == "length"
    # A buffered rollout goes into a checkpoint as JSON and comes back as the same payload.
    back = as_payload(Rollout.from_json(json.loads(json.dumps(out[0][1].to_json()))).data)
    assert back.tokens.tolist() == [2, 3] and back.logprobs.tolist() == payload.logprobs.tolist() and back.finish == "length"
    assert back.prompt.tolist() == [1, 10]
    with pytest.raises(ValueError):
        to_rollouts(_requests(2, 1), result, [(1.0, True)] * 4)


def test_each_rollout_carries_its_requests_prompt_into_the_rows_without_a_lookup() -> None:
    result = GenerationResult([[Sample([1], [-0.1], "stop"), Sample([2], [-0.2], "stop")], [Sample([4], [-0.4], "stop")]])
    out = to_rollouts(_requests(2, 1), result, [(1.0, True), (0.0, False), (0.5, False)])
    assert [[r.data.prompt.tolist() for r in g] for g in out] == [[[1, 10], [1, 10]], [[1, 11]]]
    assert out[0][0].data.prompt is out[0][1].data.prompt  # one array per request, shared by its group
    # The group id is the strategy's; the rows take the prompt the rollouts carry, whatever the id.
    seqs = groups_to_sequences([TrainGroup(99, out[0], step=1), TrainGroup(7, out[1], step=1)], std_normalize=False)
    assert [s.tokens for s in seqs] == [[1, 10, 1], [1, 10, 2], [1, 11, 4]] and [s.prompt_len for s in seqs] == [2, 2, 2]


def test_a_checkpointed_rollout_without_its_prompt_is_refused_by_name() -> None:
    old = {"tokens": [3], "logprobs": [-1.0], "finish": "stop"}  # written before rollouts kept their prompt
    with pytest.raises(ValueError, match="no 'prompt'"):
        as_payload(old)


def test_samples_that_do_not_match_their_requests_are_refused_naming_the_prompt() -> None:
    result = GenerationResult([[Sample([1], [-0.1], "stop")], [Sample([4], [-0.4], "stop")]])
    with pytest.raises(ValueError, match="prompt 1: 1 samples where 2 were asked for"):
        to_rollouts(_requests(1, 2), result, [(1.0, True)] * 3)
    with pytest.raises(ValueError, match="samples for 2 requests, the round made 3"):
        to_rollouts(_requests(1, 1, 1), result, [(1.0, True)] * 3)


def test_two_calls_merge_back_into_request_order() -> None:
    a = GenerationResult([[Sample([1], [0.0], "stop")], [Sample([3], [0.0], "stop")]], prompt_tokens=2, generated_tokens=2, seconds=1.0)
    b = GenerationResult([[Sample([2], [0.0], "stop")]], prompt_tokens=1, generated_tokens=1, seconds=0.5)
    out = merge_results([a, b], [[0, 2], [1]], 3)
    assert [s[0].token_ids for s in out.samples] == [[1], [2], [3]]
    assert (out.prompt_tokens, out.generated_tokens, out.seconds) == (3, 3, 1.5)


def _rollout(reward: float, tokens: list[int], prompt: list[int]) -> Rollout:
    """A rollout as restored from a checkpoint (its payload as JSON)."""
    return Rollout(reward, reward > 0, {"tokens": tokens, "logprobs": [-1.0] * len(tokens), "finish": "stop", "prompt": prompt})


def test_advantages_are_normalised_within_each_group_only() -> None:
    groups = [
        TrainGroup(0, [_rollout(1.0, [3], [1, 2]), _rollout(0.0, [4], [1, 2])], step=1),
        TrainGroup(1, [_rollout(1.0, [5], [9]), _rollout(1.0, [6], [9])], step=1),
    ]
    seqs = groups_to_sequences(groups, std_normalize=True)
    assert [s.tokens for s in seqs] == [[1, 2, 3], [1, 2, 4], [9, 5], [9, 6]]
    assert [s.prompt_len for s in seqs] == [2, 2, 1, 1]
    assert seqs[0].advantage == pytest.approx(1.0, rel=1e-4) and seqs[1].advantage == pytest.approx(-1.0, rel=1e-4)  # (r - mean) / (std + eps)
    assert seqs[2].advantage == 0.0 and seqs[3].advantage == 0.0  # all-equal group: no signal
    assert seqs[0].engine_logprobs == [-1.0]


def test_empty_responses_count_in_the_baseline_but_are_not_trained() -> None:
    groups = [TrainGroup(0, [_rollout(1.0, [3], [1]), _rollout(0.0, [], [1]), _rollout(0.0, [4], [1])], step=1)]
    seqs = groups_to_sequences(groups, std_normalize=False)
    assert len(seqs) == 2
    assert seqs[0].advantage == pytest.approx(2 / 3) and seqs[1].advantage == pytest.approx(-1 / 3)


def test_the_samples_log_takes_one_sample_of_each_request_before_a_second() -> None:
    from megatron_pc.reward.pool import RewardResult

    records = [PromptRecord(f"p{i}", f"q{i}", "1") for i in range(3)]
    requests = [PromptRequest(i, "pilot", n, (1,), Grading("1", None, {})) for i, n in enumerate((3, 1, 2))]
    texts = ["a0", "a1", "a2", "b0", "c0", "c1"]
    results = [RewardResult(float(t == "b0"), t == "b0", "x") for t in texts]
    rows = sample_rows(7, requests, texts, results, 5, records.__getitem__)
    assert [(r["prompt_id"], r["response"]) for r in rows] == [("p0", "a0"), ("p1", "b0"), ("p2", "c0"), ("p0", "a1"), ("p2", "c1")]
    assert rows[1] == {"step": 7, "prompt_id": "p1", "prompt_index": 1, "kind": "pilot", "prompt": "q1", "response": "b0",
                       "reward": 1.0, "correct": True}  # fmt: skip
    assert len(sample_rows(7, requests, texts, results, 99, records.__getitem__)) == 6
    assert sample_rows(7, requests, texts, results, 0, records.__getitem__) == []
