"""A run's workers as Ray actors in one placement group: what the driver's loop drives on a cluster.

It takes the component configs it needs (cluster, model, training, rollout) and the run's
:class:`~megatron_pc.cluster.config.Layout`, never the root Config; the driver unpacks its
Config into them (megatron_pc.driver.trainer.ray_workers).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from megatron_pc.cluster.config import ClusterConfig, Layout
from megatron_pc.cluster.engines import RayEngine, engine_group
from megatron_pc.cluster.peak_memory import peak_rss_bytes
from megatron_pc.cluster.placement import Placement, devices_needed, import_ray, ray_gpus, start_ray, stop_ray
from megatron_pc.cluster.policy_group import MegatronGroup
from megatron_pc.models.config import ModelConfig
from megatron_pc.cluster import nodes
from megatron_pc.platform import devices
from megatron_pc.rollout.config import RolloutConfig
from megatron_pc.rollout.group import EngineGroup
from megatron_pc.training.config import TrainingConfig
from megatron_pc.weight_sync.sync import WeightSync

logger = logging.getLogger(__name__)


class RayWorkers:
    """Policy (and reference) ranks and rollout engines as Ray actors."""

    def __init__(self, cluster: ClusterConfig, layout: Layout, model: ModelConfig, training: TrainingConfig, rollout: RolloutConfig,
                 *, seed: int, max_prompt_tokens: int | None, model_path: str, run_dir: Path, transport: str) -> None:  # fmt: skip
        self.cluster, self.layout, self.model, self.training, self.rollout = cluster, layout, model, training, rollout
        self.seed, self.max_prompt_tokens = seed, max_prompt_tokens
        self.model_path, self.run_dir, self.transport = model_path, run_dir, transport
        self.started = start_ray(cluster, bundles=layout.world + layout.engines)
        self.placement: Placement | None = None
        self.policy: Any = None
        self.reference: Any = None
        self.engines: Any = None
        self.weight_sync: WeightSync | None = None
        self.nodes: dict[str, str] = {}
        """Id -> address of the Ray nodes that hold the run's bundles."""

    def start(self, ready: Callable[[], None] | None = None) -> None:
        """Placement group, policy and reference ranks, ``ready()`` (the driver loads and offloads
        the policy), engines: on shared GPUs the engines start only after ``ready()`` returned."""
        # Stops the run (naming the venv and the fix) when the scheduler reports GPUs this Python's torch cannot use.
        gpu = devices.use_gpus()
        # Before any worker: Ray's GPUs must be usable here and enough for the layout.
        devices.check_gpu_count(devices_needed(self.cluster, self.layout), ray_gpus(), use_gpu=gpu)
        self.placement = Placement(self.cluster, self.layout, use_gpu=gpu)
        self.nodes = nodes.placement_nodes(self.placement.group)
        # The engines start while the Megatron ranks do (each takes tens of seconds on CPU),
        # except where they share GPUs: vLLM sizes its KV cache from the memory free when it
        # starts, which must not change under it while Megatron loads its weights.
        meanwhile = not gpu or not self.cluster.colocated
        self.policy = MegatronGroup(self.model, self.training, self.seed, self.placement, trainable=True)
        self.reference = MegatronGroup(self.model, self.training, self.seed, self.placement, trainable=False) if self.layout.reference else None
        megatron = [g for g in (self.policy, self.reference) if g is not None]
        if not meanwhile:
            for group in megatron:
                group.wait_ready()
            if ready is not None:
                ready()  # the fp32 grad buffer leaves the GPU before vLLM sizes its budget
        self.engines = engine_group(self.rollout, self.placement, self.model_path, seed=self.seed, max_prompt_tokens=self.max_prompt_tokens)
        if meanwhile:
            for group in megatron:
                group.wait_ready()
            if ready is not None:
                ready()
        self.weight_sync = WeightSync(self.policy, self.engines, self.rollout.sync_bucket_mb, self.transport)

    def sync_weights(self) -> dict[str, float]:
        """Stream the policy's weights into every engine (rollout.weight_transport)."""
        assert self.weight_sync is not None, "sync_weights before start"
        return self.weight_sync.sync_weights()

    def restart_engine(self, index: int) -> None:
        """A new engine actor in the dead one's bundle, then every engine gets the policy's weights.
        Where the bundle's node is gone there is nowhere to start it: :class:`nodes.NodeLostError`."""
        self.check_nodes(f"the restart of engine {index}")
        self.engines.restart(index)
        self.sync_weights()

    def check_nodes(self, during: str) -> None:
        """Raise :class:`nodes.NodeLostError` if a node of the run's bundles is gone (a multi-node
        run; on one node there is nothing to lose but the run itself)."""
        if len(self.nodes) > 1:
            lost = nodes.lost_nodes(self.nodes)
            if lost:
                raise nodes.NodeLostError(lost, during)

    def peak_memory(self) -> dict[str, int]:
        """Peak RSS in bytes of the driver and of every actor still alive, by name."""
        return peak_memory(self.policy, self.reference, self.engines)

    def close(self) -> None:
        """Engines, placement group, then Ray (if this run started it)."""
        try:
            if self.engines is not None:
                self.engines.shutdown()
            if self.placement is not None:
                self.placement.remove()
        finally:
            stop_ray(self.started)


def peak_memory(policy: MegatronGroup | None, reference: MegatronGroup | None, engines: EngineGroup | None) -> dict[str, int]:
    """Peak RSS in bytes of the driver and of every actor still alive, by name."""
    ray = import_ray()
    refs: dict[str, Any] = {}
    for label, group in (("policy", policy), ("reference", reference)):
        if group is not None:
            refs |= {f"{label}_rank{i}": a.peak_rss.remote() for i, a in enumerate(group.actors)}
    for engine in engines.engines if engines is not None else []:
        if isinstance(engine, RayEngine) and engine.alive:
            refs[engine.name] = engine.peak_rss()
    peaks = {"driver": peak_rss_bytes()}
    for name, ref in refs.items():
        try:
            peaks[name] = ray.get(ref, timeout=60)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            logger.warning("peak RSS of %s: its process is gone", name)
    return peaks
