"""The memory settings of the policy update: per-placement defaults, validation, and the
sequence-parallel padding of a micro-batch."""

from __future__ import annotations

import pytest
import torch

from megatron_pc.errors import ConfigError
from megatron_pc.training.batching import Sequence, collate
from megatron_pc.training.config import TrainingConfig
from megatron_pc.training.steps import pad_to_multiple


def test_colocated_offloads_and_empties_the_cache_by_default_and_split_does_not() -> None:
    colocated = TrainingConfig().memory_settings(colocated=True, tensor_parallel=2, on_gpu=True)
    assert (colocated.offload_grads, colocated.offload_optimizer, colocated.empty_cache) == (True, True, True)
    split = TrainingConfig().memory_settings(colocated=False, tensor_parallel=2, on_gpu=True)
    assert (split.offload_grads, split.offload_optimizer, split.empty_cache) == (False, False, False)


def test_explicit_settings_win_over_the_placement_default() -> None:
    cfg = TrainingConfig(offload_optimizer=False, empty_cache=True)
    settings = cfg.memory_settings(colocated=False, tensor_parallel=1, on_gpu=True)
    assert (settings.offload_optimizer, settings.empty_cache) == (False, True)
    assert not cfg.memory_settings(colocated=True, tensor_parallel=1, on_gpu=True).offload_optimizer


def test_sequence_parallel_defaults_on_only_for_tp_above_one_on_a_gpu() -> None:
    cfg = TrainingConfig()
    assert cfg.memory_settings(True, 2, on_gpu=True).sequence_parallel
    assert not cfg.memory_settings(True, 1, on_gpu=True).sequence_parallel
    assert not cfg.memory_settings(True, 2, on_gpu=False).sequence_parallel
    assert TrainingConfig(sequence_parallel=True).memory_settings(True, 2, on_gpu=False).sequence_parallel


def test_logprob_chunk_tokens_must_be_positive_or_null() -> None:
    assert TrainingConfig(logprob_chunk_tokens=None).logprob_chunk_tokens is None
    with pytest.raises(ConfigError, match="logprob_chunk_tokens: must be >= 1"):
        TrainingConfig(logprob_chunk_tokens=0)


def test_padding_to_a_multiple_of_tp_adds_masked_positions_only() -> None:
    seq = Sequence(tokens=[5, 6, 7, 8, 9, 10], prompt_len=2, advantage=1.0)
    seq.old_logprobs = [-1.0, -2.0, -3.0, -4.0]
    mb = collate([seq], [0])
    padded = pad_to_multiple(mb, 4)
    assert mb.input_ids.shape[1] == 5 and padded.input_ids.shape[1] == 8
    assert torch.equal(padded.input_ids[:, :5], mb.input_ids) and not padded.input_ids[:, 5:].any()
    assert torch.equal(padded.mask[:, :5], mb.mask) and not padded.mask[:, 5:].any()
    assert padded.position_ids[0].tolist() == list(range(8))
    assert padded.extras["old_logprobs"].shape == (1, 8)
    assert pad_to_multiple(padded, 4) is padded
