"""The screen's prompt batches, DP shares and assembly (megatron_pc.training.prompt_features), and the
driver's lookup (megatron_pc.driver.screen). The forward itself is tested against transformers
in tests/integration/test_prompt_features_megatron.py."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from megatron_pc.driver.screen import SCREEN_METRICS, screen_features
from megatron_pc.training.prompt_features import PromptFeatures, assemble_features, dp_share, hidden_states_out, prompt_batches

LENGTHS = [3, 11, 1, 6, 6, 9, 2]
PROMPTS = [list(range(10 * i + 1, 10 * i + 1 + n)) for i, n in enumerate(LENGTHS)]


def test_prompt_batches_right_pad_and_point_at_each_prompts_last_real_token() -> None:
    batches = prompt_batches(PROMPTS, token_budget=20, pad_id=0)
    assert sorted(i for b in batches for i in b.index) == list(range(len(PROMPTS)))
    for b in batches:
        assert b.input_ids.shape[0] * b.input_ids.shape[1] <= 20 or len(b.index) == 1
        for row, i in enumerate(b.index):
            assert b.input_ids[row, b.last[row]].item() == PROMPTS[i][-1]
            assert b.input_ids[row, : LENGTHS[i]].tolist() == PROMPTS[i]
            assert (b.input_ids[row, LENGTHS[i] :] == 0).all()
        assert torch.equal(b.position_ids[0], torch.arange(b.input_ids.shape[1]))
    assert sum(b.tokens for b in batches) == sum(LENGTHS)


def test_prompt_batches_pad_to_a_multiple_for_sequence_parallelism() -> None:
    for b in prompt_batches(PROMPTS, token_budget=20, multiple=4):
        assert b.input_ids.shape[1] % 4 == 0 and b.position_ids.shape == b.input_ids.shape


def test_prompt_batches_accept_numpy_vectors_and_refuse_an_empty_prompt() -> None:
    batches = prompt_batches([np.asarray(p, dtype=np.int32) for p in PROMPTS], token_budget=64)
    assert sum(b.tokens for b in batches) == sum(LENGTHS)
    with pytest.raises(ValueError, match="prompt 1 has no tokens"):
        prompt_batches([[1], []], token_budget=64)


@pytest.mark.parametrize("dp", [1, 2, 3, 8])
def test_dp_shares_cover_every_prompt_once_with_about_equal_tokens(dp: int) -> None:
    shares = [dp_share(LENGTHS, r, dp) for r in range(dp)]
    assert sorted(i for s in shares for i in s) == list(range(len(LENGTHS)))
    tokens = [sum(LENGTHS[i] for i in s) for s in shares]
    assert max(tokens) - min(tokens) <= max(LENGTHS)


def _parts(dp: int, hidden: int = 3) -> list[PromptFeatures | None]:
    """What the ranks return: each DP group's rows (row i holds i), None from the other ranks."""
    parts: list[PromptFeatures | None] = [None]
    for r in range(dp):
        local = np.asarray(dp_share(LENGTHS, r, dp))
        values = np.repeat(local[:, None].astype(np.float32), hidden, axis=1)
        parts += [PromptFeatures(local, values, int(sum(LENGTHS[i] for i in local)), 100), None]
    return parts


def test_assemble_puts_every_groups_rows_back_in_the_callers_order() -> None:
    features, tokens = assemble_features(_parts(dp=3), len(LENGTHS))
    assert features.dtype == np.float32 and features.shape == (len(LENGTHS), 3)
    assert features[:, 0].tolist() == list(range(len(LENGTHS)))
    assert tokens == {"tokens": sum(LENGTHS), "padded_tokens": 300}


def test_assemble_names_a_prompt_missing_or_given_twice() -> None:
    parts = _parts(dp=2)
    with pytest.raises(ValueError, match="came back"):
        assemble_features(parts[:2], len(LENGTHS))  # group 1 missing
    with pytest.raises(ValueError, match="came back"):
        assemble_features(parts + parts, len(LENGTHS))
    with pytest.raises(ValueError, match="no rank returned"):
        assemble_features([None, None], len(LENGTHS))


def test_hidden_states_out_restores_post_process_even_when_the_forward_fails() -> None:
    module = torch.nn.Linear(1, 1)
    module.post_process = True
    with pytest.raises(RuntimeError):
        with hidden_states_out(module):
            assert module.post_process is False
            raise RuntimeError("forward failed")
    assert module.post_process is True


class TokenSumPolicy:
    """A policy at the edge whose 'feature' of a prompt is (its length, its token sum)."""

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []

    def prompt_features(self, prompts: Sequence[np.ndarray]) -> tuple[np.ndarray, dict[str, int]]:
        self.calls.append([p.tolist() for p in prompts])
        values = np.asarray([[len(p), int(p.sum())] for p in prompts], dtype=np.float32)
        return values, {"tokens": sum(len(p) for p in prompts), "padded_tokens": 99}


def test_screen_features_look_prompts_up_once_and_key_vectors_by_prompt_id() -> None:
    policy = TokenSumPolicy()
    features, cost = screen_features(policy, [5, 1, 5, 3], PROMPTS)
    assert policy.calls == [[PROMPTS[5], PROMPTS[1], PROMPTS[3]]]  # a repeat is forwarded once
    assert sorted(features) == [1, 3, 5]
    for p in (1, 3, 5):
        assert features[p].tolist() == [LENGTHS[p], sum(PROMPTS[p])]
    assert set(cost) == set(SCREEN_METRICS)
    assert cost["screen_prompts"] == 3 and cost["screen_tokens"] == LENGTHS[5] + LENGTHS[1] + LENGTHS[3]
    assert cost["screen_padded_tokens"] == 99 and cost["screen_seconds"] >= 0


def test_screen_features_of_no_prompt_call_nothing_and_a_bad_id_is_named() -> None:
    policy = TokenSumPolicy()
    features, cost = screen_features(policy, [], PROMPTS)
    assert features == {} and policy.calls == [] and cost["screen_tokens"] == 0
    with pytest.raises(IndexError, match="prompt 7 is not in the token table of 7"):
        screen_features(policy, [0, 7], PROMPTS)


def test_the_screen_counts_each_steps_policy_tokens_once() -> None:
    from megatron_pc.driver.screen import PolicyFeatures, Screen

    class Asking:
        """A strategy that wants features for the prompts it is given, one list per round."""

        def __init__(self, rounds: list[list[int]]) -> None:
            self.rounds = rounds
            self.got: list[int] = []

        def feature_requests(self) -> list[int]:
            return self.rounds.pop(0) if self.rounds else []

        def observe_features(self, features: dict, step: int) -> None:
            self.got += sorted(features)

    screen = Screen.__new__(Screen)  # its config checks are the trainer tests'; here only the counting
    screen.source, screen.cost = PolicyFeatures(TokenSumPolicy(), PROMPTS), {}
    strategy = Asking([[1, 3], [5], [], [2]])
    for step in (1, 1, 1, 2):
        screen.before_round(strategy, step)
    first, second = screen.metrics(1), screen.metrics(2)
    assert strategy.got == [1, 3, 5, 2]
    assert first["screen_prompts"] == 3 and first["screen_tokens"] == LENGTHS[1] + LENGTHS[3] + LENGTHS[5]
    assert first["screen_padded_tokens"] == 2 * 99
    assert second["screen_tokens"] == LENGTHS[2] and screen.metrics(3) == {"screen_prompts": 0.0, "time_screen": 0.0}
