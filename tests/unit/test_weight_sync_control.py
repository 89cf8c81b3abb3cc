"""A weight sync's control path (megatron_pc.weight_sync.sync.WeightSync): the channel it holds
is opened once and reused, opened anew when an engine was replaced, and dropped after a failed
sync, so that the next sync opens a fresh one and succeeds.

The parts are the real ones, in one process: the policy rank's sending end
(megatron_pc.weight_sync.sending.SendingRank) with the object-store transport over a real
TCPStore, the rollout package's EngineGroup (restart included), and engines that receive,
load and acknowledge every bucket with a real Receiver. Only Ray and the models are left out:
the rank's weights are a few named tensors, and the "group" of one rank calls it directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch

from megatron_pc.rollout.base import EngineError, GenerationResult, RolloutEngine, WeightPushStats
from megatron_pc.rollout.group import EngineGroup
from megatron_pc.weight_sync.channel import BucketPayload, ChannelSpec
from megatron_pc.weight_sync.sending import SendingRank
from megatron_pc.weight_sync.sync import Sink, Source, WeightSync
from megatron_pc.weight_sync.transports import join_receiver

LAYERS = 3


class TensorRank(SendingRank):
    """Policy rank 0 whose weights are a few layers of named tensors, scaled by ``version``."""

    def __init__(self) -> None:
        self.rank = 0
        self.version = 1.0

    def weight_tensors(self, every_rank: bool) -> Iterator[tuple[str, torch.Tensor]]:
        for layer in range(LAYERS):
            yield f"model.layers.{layer}.mlp.up_proj.weight", torch.full((4, 8), self.version + layer)

    def sender_host(self) -> str:
        return "127.0.0.1"


class OneRankPolicy:
    """A policy group of one rank, called in this process: what MegatronGroup does over Ray."""

    def __init__(self) -> None:
        self.rank = TensorRank()

    def open_weight_channel(self, transport: str, receivers: list[str], timeout_s: float,
                            join: Callable[[str, dict[str, str] | None], None]) -> str:  # fmt: skip
        opened = self.rank.open_weight_channel(transport, receivers, timeout_s)
        assert opened is not None
        join(opened["address"], None)
        self.rank.connect_weight_channel()
        return opened["address"]

    def push_weights(self, bucket_bytes: int, per_gpu: bool = False) -> Iterator[Any]:
        yield from self.rank.push_weights(bucket_bytes)

    def weight_sync_stats(self) -> dict[str, Any]:
        return self.rank.weight_sync_stats()


class ReceivingEngine(RolloutEngine):
    """An engine whose one worker joins the channel and loads each bucket it is handed;
    ``fail_at``: the update call (1-based) in which it fails, as an engine whose process died."""

    def __init__(self, name: str, fail_at: int | None = None) -> None:
        self.name, self.fail_at = name, fail_at
        self.weights: dict[str, torch.Tensor] = {}
        self.receiver: Any = None
        self.joins = self.updates = 0

    def join_weight_channel(self, spec: ChannelSpec) -> None:
        if self.receiver is not None:
            self.receiver.close()
        self.receiver = join_receiver(spec.transport, spec.address, spec.first_rank, spec.size, self.name, timeout_s=spec.timeout_s)
        self.joins += 1

    def update_weights(self, weights: Any) -> WeightPushStats:
        assert isinstance(weights, BucketPayload)
        self.updates += 1
        if self.updates == self.fail_at:
            raise EngineError(self.name, "its process died")
        pairs = self.receiver.receive(weights)
        self.weights.update((n, t.clone()) for n, t in pairs)
        self.receiver.done(weights)
        return WeightPushStats(len(pairs), sum(t.numel() * t.element_size() for _, t in pairs), 0.0)

    def generate(self, requests: Sequence[Any], sampling: Any) -> GenerationResult:
        raise NotImplementedError

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        raise NotImplementedError

    def shutdown(self) -> None:
        if self.receiver is not None:
            self.receiver.close()


def _holds(engine: ReceivingEngine, version: float) -> bool:
    want = {f"model.layers.{k}.mlp.up_proj.weight": version + k for k in range(LAYERS)}
    return engine.weights.keys() == want.keys() and all(bool((engine.weights[n] == v).all()) for n, v in want.items())


def _setup(fail_at: Sequence[int | None] = (None, None)) -> tuple[OneRankPolicy, EngineGroup, WeightSync]:
    policy = OneRankPolicy()
    failures = list(fail_at)
    engines = EngineGroup(lambda k: ReceivingEngine(f"engine{k}", failures.pop(0) if failures else None), 2)
    source: Source = policy
    sink: Sink = engines
    return policy, engines, WeightSync(source, sink, bucket_mb=0, transport="object_store")


def test_the_channel_is_opened_once_and_reused_while_the_engines_are_the_same() -> None:
    policy, engines, sync = _setup()
    first = sync.sync_weights()
    channel = sync.channel
    policy.rank.version = 2.0
    second = sync.sync_weights()
    assert sync.opened == 1 and sync.channel is channel
    assert [e.joins for e in engines.engines] == [1, 1]
    assert all(_holds(e, 2.0) for e in engines.engines)
    for out in (first, second):
        assert out["sync_buckets"] == LAYERS and out["sync_mb"] == pytest.approx(LAYERS * 4 * 8 * 4 / 1e6)
        assert out["sync_inflight_buckets_max"] <= 2
    assert not hasattr(policy, "weight_channel")  # the channel's state lives in weight_sync/


def test_a_replaced_engine_makes_everyone_join_a_new_channel() -> None:
    policy, engines, sync = _setup()
    sync.sync_weights()
    old = sync.channel
    engines.restart(1)
    policy.rank.version = 3.0
    sync.sync_weights()
    assert sync.opened == 2 and sync.channel is not old and sync.channel.engines == tuple(engines.engines)
    assert [e.joins for e in engines.engines] == [2, 1]  # engine 0 joined again, the new engine 1 once
    assert all(_holds(e, 3.0) for e in engines.engines)


def test_a_failed_sync_drops_the_channel_and_the_next_sync_opens_a_new_one() -> None:
    policy, engines, sync = _setup(fail_at=(None, 2))  # engine 1 fails at the second bucket
    with pytest.raises(EngineError, match="engine1: its process died"):
        sync.sync_weights()
    assert sync.channel is None and sync.opened == 1
    policy.rank.version = 4.0
    out = sync.sync_weights()  # engine 1 is the same object, and healthy now
    assert sync.opened == 2 and sync.channel is not None
    assert [e.joins for e in engines.engines] == [2, 2]
    assert all(_holds(e, 4.0) for e in engines.engines) and out["sync_buckets"] == LAYERS
