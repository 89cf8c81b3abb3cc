"""Answer extraction, reward functions, the overlong penalty and the reward pool on honest input."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from megatron_pc.errors import ConfigError
from megatron_pc.reward import RewardConfig, RewardPool, extract_answer, overlong_penalty
from megatron_pc.reward.functions import MAX_ANSWER_CHARS, grade_exact_int, grade_math_verify


@pytest.fixture(scope="module")
def math_pool() -> Iterator[RewardPool]:
    with RewardPool(RewardConfig(function="math_verify", workers=2, timeout_s=10.0)) as pool:
        yield pool


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{1} then \\boxed{\\frac{1}{2}} done 7", "\\frac{1}{2}"),  # last box wins over numbers
        ("\\fbox{ 42 }", "42"),
        ("\\boxed{{a}+{b}}", "{a}+{b}"),  # nested braces stay balanced
        ("first 3, then -12.5 apples", "-12.5"),  # no box: last number
        ("\\boxed{17 and never closed 9", "9"),  # an unclosed last box falls back to the last number
        ("no digits here", None),
    ],
)
def test_extract_answer_takes_last_box_else_last_number(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("The answer is \\boxed{0.5}", "1/2"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\frac12}", "\\frac{1}{2}"),
        ("thus x = \\boxed{1+x}", "x+1"),
        ("\\boxed{\\sqrt{2}}", "2^{1/2}"),
        ("12+345=357", "357"),
    ],
)
def test_math_verify_accepts_equivalent_answers(response: str, answer: str) -> None:
    assert grade_math_verify(response, answer).correct


@pytest.mark.parametrize(
    ("response", "answer", "reason"),
    [
        ("\\boxed{0.51}", "1/2", "incorrect"),
        ("\\boxed{358}", "357", "incorrect"),
        ("I do not know", "357", "no_answer"),
        ("\\boxed{" + "1" * (MAX_ANSWER_CHARS + 1) + "}", "1", "answer_too_long"),
    ],
)
def test_math_verify_rejects_wrong_missing_and_oversized_answers(response: str, answer: str, reason: str) -> None:
    grade = grade_math_verify(response, answer)
    assert not grade.correct and grade.reason == reason


def test_exact_int_compares_integers_and_rejects_non_integers() -> None:
    assert grade_exact_int("357", "357").correct
    assert grade_exact_int("=+007", "7").correct
    assert grade_exact_int("12-20=-8", "-8").correct
    assert grade_exact_int("=358", "357").reason == "incorrect"
    assert grade_exact_int("3.5", "3").reason == "unparsable"
    assert grade_exact_int("=", "3").reason == "no_answer"


def test_overlong_penalty_is_linear_in_the_buffer_and_flat_beyond() -> None:
    # max 100 tokens, buffer 20: free up to 80, -0.5 * factor at 90, -factor at 100 and beyond.
    assert overlong_penalty(80, 100, 20, 2.0) == 0.0
    assert overlong_penalty(90, 100, 20, 2.0) == pytest.approx(-1.0)
    assert overlong_penalty(100, 100, 20, 2.0) == pytest.approx(-2.0)
    assert overlong_penalty(150, 100, 20, 2.0) == pytest.approx(-2.0)
    assert overlong_penalty(150, 100, 0, 2.0) == 0.0


def test_pool_scores_in_order_with_rewards_and_counters(math_pool: RewardPool) -> None:
    before = math_pool.counters["correct"]
    results = math_pool.score(["\\boxed{0.5}", "\\boxed{3}", "nothing"], ["1/2", "4", "1"])
    assert [r.reward for r in results] == [1.0, 0.0, 0.0]
    assert [r.reason for r in results] == ["correct", "incorrect", "no_answer"]
    assert math_pool.counters["correct"] == before + 1


def test_pool_adds_overlong_penalty_to_correctness() -> None:
    cfg = RewardConfig(function="exact_int", workers=1, overlong_buffer=4, overlong_penalty=1.0)
    with RewardPool(cfg, max_tokens=16) as pool:
        results = pool.score(["=5", "=5", "=6"], ["5", "5", "5"], response_tokens=[12, 14, 20])
    assert [r.reward for r in results] == pytest.approx([1.0, 0.5, -1.0])
    assert [r.correct for r in results] == [True, True, False]


def test_pool_rejects_mismatched_lengths_and_use_after_close() -> None:
    pool = RewardPool(RewardConfig(workers=1))
    with pytest.raises(ValueError, match="answers"):
        pool.score(["1"], [])
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.score(["1"], ["1"])


def test_reward_config_rejects_bad_values_naming_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        RewardConfig(function="math-verify")
    assert err.value.field == "function"
    with pytest.raises(ConfigError) as err:
        RewardConfig(timeout_s=0)
    assert err.value.field == "timeout_s"
    with pytest.raises(ConfigError) as err:
        RewardConfig(overlong_buffer=64).check_max_tokens(64, "reward")
    assert err.value.field == "reward.overlong_buffer"
