"""The rollout engines as Ray actors: each a vLLM engine in its own process, seen from the driver
through the :class:`~megatron_pc.rollout.base.RolloutEngine` interface.

The actor is the engine itself (:class:`EngineActor`, a :class:`VllmEngine` that quiets its
process's output first), so a call from the driver goes to :class:`RayEngine`, which waits for
the actor's method of the same name, and nothing in between forwards it. A weight's control
path reaches the engine here once (``join_weight_channel``, ``update_weights``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from megatron_pc.cluster.peak_memory import peak_rss_bytes
from megatron_pc.cluster.placement import Placement, import_ray
from megatron_pc.rollout.base import EngineError, GenerationRequest, GenerationResult, RolloutEngine, SamplingSettings, WeightPushStats
from megatron_pc.rollout.config import RolloutConfig
from megatron_pc.rollout.group import EngineGroup
from megatron_pc.rollout.vllm_engine import VllmEngine
from megatron_pc.weight_sync.channel import BucketPayload, ChannelSpec, receiver_names


class EngineActor(VllmEngine):
    """A vLLM engine as a Ray actor: its output goes to the run's log before vLLM starts, and it
    answers :meth:`ready` and :meth:`peak_rss`; every other method is the engine's own."""

    def __init__(self, model_path: str, rollout_cfg: RolloutConfig, name: str, seed: int, max_prompt_tokens: int | None = None) -> None:
        from megatron_pc.console import redirect_worker_output

        redirect_worker_output(own_log=name)  # logs/<name>.log: not every engine into train.log
        super().__init__(model_path, rollout_cfg, name=name, seed=seed, max_prompt_tokens=max_prompt_tokens)

    def ready(self) -> str:
        """The engine's name once it started."""
        return self.name

    def peak_rss(self) -> int:
        """This process's peak resident memory in bytes (the engine's workers not included)."""
        return peak_rss_bytes()


@functools.cache
def _remote_class(actor_class: type) -> Any:
    """``ray.remote(actor_class)``, made once per class (engines start from several threads)."""
    return import_ray().remote(actor_class)


class RayEngine(RolloutEngine):
    """An engine actor seen through the :class:`RolloutEngine` interface, so that the rollout
    package's :class:`EngineGroup` splits, gathers and restarts it like a local one.

    ``actor_class`` is :class:`EngineActor` in a run; a test passes a class of the same
    constructor and methods to check placement and concurrency without vLLM.
    """

    def __init__(self, rollout: RolloutConfig, placement: Placement, model_path: str | Path, index: int, *, seed: int,
                 max_prompt_tokens: int | None = None, actor_class: type = EngineActor) -> None:  # fmt: skip
        """Starts the actor (seeded ``seed + index``) and returns once it is ready (the group
        starts all engines at once)."""
        self.name = f"engine{index}"
        self.workers = rollout.tensor_parallel
        actor_cls = _remote_class(actor_class).options(**placement.engine_options(index))
        self.actor = actor_cls.remote(str(model_path), rollout, self.name, seed + index, max_prompt_tokens)
        self._alive = True
        self.result(self.actor.ready.remote())

    def result(self, ref: Any) -> Any:
        """The value of a call made on the actor: an :class:`EngineError` if it failed, and
        the engine is marked dead if its process died."""
        ray = import_ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as err:
            self._alive = False
            raise EngineError(self.name, f"its process died: {err}") from None
        except ray.exceptions.RayTaskError as err:
            raise EngineError(self.name, str(err.cause if hasattr(err, "cause") else err)) from None

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSettings) -> GenerationResult:
        """Serve a shard of a round in the actor."""
        return self.result(self.actor.generate.remote(list(requests), sampling))

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Engine log-probs of given sequences."""
        return self.result(self.actor.score.remote([list(s) for s in sequences]))

    def update_weights(self, weights: Any) -> WeightPushStats:
        """Load (name, tensor) pairs, or one bucket payload of the joined weight-sync channel (a
        BucketPayload, or the Ray ObjectRef of one, which the actor receives resolved)."""
        if isinstance(weights, Iterable) and not isinstance(weights, (list, BucketPayload)):
            weights = list(weights)
        return self.result(self.actor.update_weights.remote(weights))

    @property
    def weight_receivers(self) -> list[str]:
        """One receive end per vLLM worker of the engine."""
        return receiver_names(self.name, self.workers)

    def join_weight_channel(self, spec: ChannelSpec) -> None:
        """The engine's workers join a policy rank's weight-sync channel."""
        self.result(self.actor.join_weight_channel.remote(spec))

    @property
    def alive(self) -> bool:
        """False once the actor died or was shut down."""
        return self._alive

    def sleep(self) -> None:
        """Sleep while the policy trains."""
        self.result(self.actor.sleep.remote())

    def wake(self) -> None:
        """Wake before generating."""
        self.result(self.actor.wake.remote())

    def peak_rss(self) -> Any:
        """The ObjectRef of the actor's peak resident memory in bytes."""
        return self.actor.peak_rss.remote()

    def shutdown(self) -> None:
        """Stop the engine and its actor."""
        if self._alive:
            try:
                self.result(self.actor.shutdown.remote())
            finally:
                import_ray().kill(self.actor)
                self._alive = False


def engine_group(rollout: RolloutConfig, placement: Placement, model_path: str | Path, *, seed: int,
                 max_prompt_tokens: int | None = None, actor_class: type = EngineActor) -> EngineGroup:  # fmt: skip
    """The run's ``rollout.engines`` engines as actors behind one group: every call (start
    included) goes to all engines at once and waits for all."""
    def start(k: int) -> RayEngine:
        return RayEngine(rollout, placement, model_path, k, seed=seed, max_prompt_tokens=max_prompt_tokens, actor_class=actor_class)

    return EngineGroup(start, rollout.engines, concurrent=True)
