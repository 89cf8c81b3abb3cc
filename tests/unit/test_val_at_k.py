"""mean@n, pass@k (the unbiased estimator) and maj@k (ties counted as a random tie-break)."""

from __future__ import annotations

import itertools
import math

import pytest

from megatron_pc.metrics.at_k import at_k_metrics, ks_for, maj_at_k, pass_at_k


def test_pass_at_k_equals_a_hand_computation() -> None:
    # n = 5 samples, c = 2 successes, k = 2: 1 - C(3, 2) / C(5, 2) = 1 - 3/10.
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k = 1 is the success rate; k = n is "any success at all".
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 5) == 1.0 and pass_at_k(5, 0, 5) == 0.0
    # More failures than k leaves room for a miss; fewer does not.
    assert pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(16, 1, 4) == pytest.approx(1 - math.comb(15, 4) / math.comb(16, 4))


@pytest.mark.parametrize("n", [1, 3, 4, 6])
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_success(n: int) -> None:
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets)), (n, c, k)


def test_pass_at_k_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="n=4, c=5, k=1"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k=0"):
        pass_at_k(4, 1, 0)


def test_maj_at_k_takes_the_commonest_answer_of_the_first_k() -> None:
    answers = ["7", "3", "3", "7", "7"]
    right = [a == "7" for a in answers]
    assert maj_at_k(answers, right, 1) == 1.0
    assert maj_at_k(answers, right, 3) == 0.0  # 3 twice against 7 once
    assert maj_at_k(answers, right, 5) == 1.0  # 7 three times


def test_maj_at_k_counts_a_tie_as_the_mean_of_the_tied_answers() -> None:
    answers = ["7", "3", "5", "5", "7"]
    right = [a == "7" for a in answers]
    assert maj_at_k(answers, right, 2) == pytest.approx(0.5)  # 7 and 3 once each
    assert maj_at_k(answers, right, 3) == pytest.approx(1 / 3)  # three answers once each
    assert maj_at_k(answers, right, 5) == pytest.approx(0.5)  # 7 twice, 5 twice


def test_maj_at_k_leaves_out_samples_without_an_answer() -> None:
    assert maj_at_k([None, None, "4"], [False, False, True], 3) == 1.0
    assert maj_at_k([None, None, "4"], [False, False, True], 2) == 0.0  # nobody voted


def test_at_k_metrics_average_over_prompts_with_ks_by_powers_of_two() -> None:
    assert ks_for(1) == [1] and ks_for(4) == [1, 2, 4] and ks_for(6) == [1, 2, 4, 6]
    rewards = [[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.25, 0.0]]
    successes = [[r >= 1.0 for r in row] for row in rewards]
    answers = [["7", "3", "3", "7"], ["1", "2", "1", "2"]]
    got = at_k_metrics(rewards, successes, answers)
    assert list(got) == ["mean@4", "pass@1", "pass@2", "pass@4", "maj@1", "maj@2", "maj@4"]
    assert got["mean@4"] == pytest.approx(3.25 / 8)
    assert got["pass@1"] == pytest.approx(0.25)  # 2 of 4, 0 of 4
    assert got["pass@2"] == pytest.approx((1 - 1 / 6) / 2)
    assert got["pass@4"] == pytest.approx(0.5)
    assert got["maj@1"] == pytest.approx(0.5) and got["maj@2"] == pytest.approx(0.25) and got["maj@4"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="same number of samples"):
        at_k_metrics([[1.0], [1.0, 0.0]], [[True], [True, False]], [["1"], ["1", "2"]])
