"""Group advantages against hand-computed GRPO values."""

from __future__ import annotations

import math

import pytest
import torch

from megatron_pc.algo.advantages import group_advantages

torch.set_num_threads(1)


def _ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_single_group_is_centered_and_divided_by_population_std() -> None:
    # rewards 1,0,1,1: mean 0.75; deviations .25,-.75,.25,.25; population var = 0.75/4 = 0.1875.
    std = math.sqrt(0.1875)
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), _ids(0, 0, 0, 0))
    expected = torch.tensor([0.25 / std, -0.75 / std, 0.25 / std, 0.25 / std])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_two_rollout_group_uses_population_not_sample_std() -> None:
    # rewards 1,0: population std 0.5 gives +-1; the sample std (0.7071) would give +-0.7071.
    adv = group_advantages(torch.tensor([1.0, 0.0]), _ids(3, 3))
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0]), atol=1e-5, rtol=0)


def test_interleaved_groups_are_normalized_separately() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 3.0])
    ids = _ids(5, 9, 9, 5, 7, 9)
    # group 5: (1, 1) -> zero variance; group 9: (0, 0, 3) mean 1, deviations -1,-1,2, var 2;
    # group 7: a single rollout -> 0.
    s = math.sqrt(2.0)
    expected = torch.tensor([0.0, -1 / s, -1 / s, 0.0, 0.0, 2 / s])
    torch.testing.assert_close(group_advantages(rewards, ids), expected, atol=1e-5, rtol=0)


def test_without_std_normalize_advantage_is_reward_minus_group_mean() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0]), _ids(0, 0, 0, 0, 1, 1), std_normalize=False)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, -1.0, 1.0]))


def test_zero_variance_group_gets_exactly_zero_even_with_inexact_float_rewards() -> None:
    # 0.1 is not representable; its mean may differ from it by an ulp, which eps would inflate.
    adv = group_advantages(torch.full((7,), 0.1), _ids(*[2] * 7), eps=1e-12)
    assert torch.equal(adv, torch.zeros(7))


def test_output_keeps_reward_dtype_and_has_no_grad_through_rewards() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), _ids(0, 0))
    assert adv.dtype == torch.float64
    assert not adv.requires_grad


def test_empty_input_gives_empty_output() -> None:
    assert group_advantages(torch.zeros(0), _ids()).shape == (0,)


def test_mismatched_shapes_and_float_group_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="same length"):
        group_advantages(torch.zeros(3), _ids(0, 0))
    with pytest.raises(ValueError, match="int64"):
        group_advantages(torch.zeros(2), torch.zeros(2))
