"""Rewards that are not 0/1, from a custom function through the real reward pool into the
allocation: the advantages and DAPO's filter take the raw score; Pilot-Commit's band, the
history and the screen count successes (score >= reward.success_threshold)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from megatron_pc.algo.advantages import rollout_advantages
from megatron_pc.allocation import Request, RoundPlan, TrainGroup, build_strategy
from megatron_pc.allocation.trace import ListTrace
from megatron_pc.config import load_config
from megatron_pc.driver.rounds import PromptRequest, to_rollouts
from megatron_pc.driver.scoring import Grading
from megatron_pc.reward.config import RewardConfig
from megatron_pc.reward.pool import RewardPool
from megatron_pc.rollout.base import GenerationResult, Sample


@pytest.fixture()
def pool(tmp_path: Path) -> Iterator[RewardPool]:
    """A graded reward: the response is its own score ("0.75" scores 0.75); success from 0.6."""
    path = tmp_path / "graded.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return float(solution_str)\n")
    with RewardPool(RewardConfig(function=f"{path}:compute_score", workers=1, success_threshold=0.6)) as p:
        yield p


def _round(pool: RewardPool, plan: RoundPlan, scores: dict[int, list[float]]) -> list[list]:
    """The plan's rollouts, each prompt's samples scored as ``scores[prompt]`` says, via the pool."""
    requests = [PromptRequest(r.prompt, r.kind, r.n, (1, 2), Grading("", None, {})) for r in plan.requests]
    texts = [str(s) for r in plan.requests for s in scores[r.prompt][: r.n]]
    results = pool.score(texts, [""] * len(texts))
    out = GenerationResult([[Sample([3], [-0.1], "stop") for _ in range(r.n)] for r in plan.requests])
    return to_rollouts(requests, out, [(r.reward, r.correct) for r in results])


def test_advantages_take_the_raw_score(pool: RewardPool) -> None:
    plan = RoundPlan(1, 1, [Request(0, 3, "full"), Request(1, 2, "full")])
    groups = [TrainGroup(r.prompt, rollouts, 1) for r, rollouts in zip(plan.requests, _round(pool, plan, {0: [0.2, 0.5, 0.8], 1: [0.3, 0.3]}))]
    assert [r.correct for r in groups[0].rollouts] == [False, False, True]
    assert rollout_advantages(groups, std_normalize=False) == pytest.approx([-0.3, 0.0, 0.3, 0.0, 0.0], abs=1e-12)
    std = (0.18 / 3) ** 0.5  # population std of 0.2, 0.5, 0.8
    assert rollout_advantages(groups, std_normalize=True)[:3] == pytest.approx([-0.3 / std, 0.0, 0.3 / std], rel=1e-5)


def test_dapo_keeps_a_group_whose_scores_differ_even_with_no_success(pool: RewardPool) -> None:
    cfg = load_config(None, ["allocation.strategy=dapo", "allocation.n=4", "allocation.train_batch=2", "allocation.dapo_batch=4"]).allocation
    trace = ListTrace()
    strategy = build_strategy(cfg, 8, 0, trace=trace)
    plan = strategy.plan_round()
    prompts = [r.prompt for r in plan.requests]
    scores = {p: [0.5] * 4 for p in prompts}  # all equal: filtered
    scores[prompts[0]] = [0.1, 0.2, 0.3, 0.4]  # differ, no success: kept
    scores[prompts[1]] = [0.9, 0.9, 0.9, 0.9]  # all equal successes: filtered
    rollouts = _round(pool, plan, scores)
    assert [[r.correct for r in g] for g in rollouts[:2]] == [[False] * 4, [True] * 4]
    strategy.observe(plan, rollouts)
    kept = {e["prompt"]: (e["kept"], e["successes"]) for e in trace.events if e["event"] == "full"}
    assert kept[prompts[0]] == (True, 0) and kept[prompts[1]] == (False, 4)
    assert [kept[p] for p in prompts[2:]] == [(False, 0)] * 2


def test_pilot_commit_bands_and_history_count_successes_by_the_threshold(pool: RewardPool) -> None:
    cfg = load_config(None, ["allocation.strategy=pilot_commit", "allocation.n=8", "allocation.pilot.n=4", "allocation.train_batch=1",
                             "allocation.pilot.batch=4", "allocation.history.demand_pilots=true"]).allocation  # fmt: skip
    trace = ListTrace()
    strategy = build_strategy(cfg, 8, 0, trace=trace)
    plan = strategy.plan_round()
    pilots = [r.prompt for r in plan.requests if r.kind == "pilot"]
    patterns = [
        ([0.55, 0.58, 0.59, 0.5], ("too_hard", 0), [0.0, 4.0]),  # rewards differ, but no success
        ([0.6, 0.9, 0.1, 0.2], ("keep", 2), [2.0, 2.0]),  # 2 of 4 succeed: in the band
        ([0.7, 0.61, 0.99, 0.6], ("too_easy", 4), [4.0, 0.0]),  # all succeed
        ([0.0, 0.0, 0.0, 0.0], ("too_hard", 0), [0.0, 4.0]),
    ]
    assert len(pilots) >= len(patterns)
    scores = {p: patterns[i % len(patterns)][0] for i, p in enumerate(pilots)}
    strategy.observe(plan, _round(pool, plan, scores))
    decisions = {e["prompt"]: (e["decision"], e["successes"]) for e in trace.events if e["event"] == "pilot"}
    assert [decisions[p] for p in pilots] == [patterns[i % len(patterns)][1] for i in range(len(pilots))]
    # The history (which the screen's predictor reads) saw the same successes.
    history = strategy.history
    assert history is not None
    seen = {row[0]: row[1:3] for row in history.state_dict()["seen"]}  # prompt -> [successes, failures]
    assert [seen[p] for p in pilots] == [patterns[i % len(patterns)][2] for i in range(len(pilots))]
