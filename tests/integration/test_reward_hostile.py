"""Hostile model output: every item returns fast with reward 0, nothing runs, the pool survives."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from megatron_pc.reward import RewardConfig, RewardPool

pytestmark = pytest.mark.integration


def _hostile(marker: Path) -> list[str]:
    code = f"__import__('os').system('touch {marker}')"
    return [
        "\\boxed{9^{9^{9^{9}}}}",  # sympy would evaluate a number with ~10^369693099 digits
        "\\boxed{(10^{10^{10}})!}",
        "\\boxed{" + code + "}",
        code,
        "\\boxed{eval(\"open('" + str(marker) + "', 'w')\")}",
        "9" * 100_000,  # a 100k-digit number
        "\\boxed{" + "9" * 100_000 + "}",
        "x" * (1 << 20) + "\\boxed{1}",  # 1 MB, even with a correct-looking tail
        "\\boxed{" * 20_000,  # many unclosed boxes: extraction must stay linear
        "\\boxed{" + "{" * 200 + "1" + "}" * 200 + "}",
    ]


def test_hostile_outputs_get_zero_reward_quickly_without_side_effects(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    responses = _hostile(marker)
    cfg = RewardConfig(function="math_verify", workers=2, timeout_s=3.0)
    start = time.monotonic()
    with RewardPool(cfg) as pool:
        results = pool.score(responses, ["2"] * len(responses))
        assert [r.reward for r in results] == [0.0] * len(responses)
        # Each failure is counted under its reason; none counted as correct.
        assert pool.counters["scored"] == len(responses) and pool.counters["correct"] == 0
        assert pool.counters["too_long"] == 1 and pool.counters["answer_too_long"] == 2
        # The pool is healthy afterwards: all workers alive, honest items graded right.
        assert pool.alive_workers() == cfg.workers
        after = pool.score(["\\boxed{\\frac{1}{2}}", "\\boxed{3}"], ["0.5", "4"])
        assert [r.correct for r in after] == [True, False]
    assert time.monotonic() - start < 60
    assert not marker.exists()
    assert list(tmp_path.iterdir()) == []


def test_overrunning_item_is_killed_counted_and_its_worker_replaced() -> None:
    cfg = RewardConfig(function="math_verify", workers=2, timeout_s=0.5)
    with RewardPool(cfg) as pool:
        start = time.monotonic()
        results = pool.score(["\\boxed{9^{9^{9^{9}}}}", "\\boxed{2}"], ["1", "2"])
        elapsed = time.monotonic() - start
        assert (results[0].reason, results[0].reward) == ("timeout", 0.0)
        assert results[1].correct
        assert pool.counters["timeout"] == 1 and pool.counters["worker_restarts"] == 1
        assert elapsed < 10
        assert pool.alive_workers() == 2
        assert pool.score(["\\boxed{2}"], ["2"])[0].correct


FRAGMENTS = ["\\boxed{", "}", "{", "^{", "9", "99999", "!", "\\frac{", "\\sqrt[", "]", "\\left(", "\\right)", "\\begin{pmatrix}",
             "&", "\\\\", "\\end{pmatrix}", "\\def\\x{\\x\\x}", "\\x", "__import__('os')", ".system('", "')", "eval(", "exec(",
             "touch pwned", "lambda: ", "\\int_0^\\infty", "e^{i\\pi}", "10^{10^{", "\\sum_{n=1}^{", "\x00", "\u202e", "$", "$$", "\\text{", " "]  # fmt: skip


@settings(max_examples=12, deadline=None)
@given(st.lists(st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join), min_size=4, max_size=8))
def test_fuzzed_hostile_outputs_finish_within_the_timeout_with_reward_0_and_no_side_effect(responses: list[str]) -> None:
    marker = Path("pwned")  # what the code-looking fragments would create, relative to the worker's directory
    cfg = RewardConfig(function="math_verify", workers=2, timeout_s=2.0)
    with RewardPool(cfg) as pool:
        start = time.monotonic()
        results = pool.score(responses, ["271828"] * len(responses))  # an answer no fragment can spell
        # Two workers: each item takes at most the timeout, plus the replacement of a killed worker.
        assert time.monotonic() - start < len(responses) / 2 * (cfg.timeout_s + 3) + 5
        assert [r.reward for r in results] == [0.0] * len(responses)
        assert pool.alive_workers() == cfg.workers
    assert not marker.exists()
