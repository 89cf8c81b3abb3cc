"""A run's workers as Ray actors in one placement group: what the driver's loop drives on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from megatron_pc.cluster import groups as G
from megatron_pc.config import Config
from megatron_pc.platform import devices
from megatron_pc.weight_sync.sync import sync_weights


class RayWorkers:
    """Policy (and reference) ranks and rollout engines as Ray actors (megatron_pc.cluster.groups)."""

    def __init__(self, cfg: Config, model_path: str, run_dir: Path, transport: str) -> None:
        self.cfg, self.model_path, self.run_dir, self.transport = cfg, model_path, run_dir, transport
        self.started = G.start_ray(cfg, bundles=cfg.policy_world + cfg.rollout.engines)
        self.placement: G.Placement | None = None
        self.policy: Any = None
        self.reference: Any = None
        self.engines: Any = None

    def start(self) -> None:
        """Placement group, policy and reference ranks, engines."""
        cfg = self.cfg
        # Stops the run (naming the venv and the fix) when the scheduler reports GPUs this Python's torch cannot use.
        gpu = devices.use_gpus()
        # Before any worker: Ray's GPUs must be usable here and enough for the layout.
        devices.check_gpu_count(G.devices_needed(cfg), G.ray_gpus(), use_gpu=gpu)
        self.placement = G.Placement(cfg, use_gpu=gpu)
        # The engines start while the Megatron ranks do (each takes tens of seconds on CPU),
        # except where they share GPUs: vLLM sizes its KV cache from the memory free when it
        # starts, which must not change under it while Megatron loads its weights.
        meanwhile = not gpu or not cfg.cluster.colocated
        self.policy = G.MegatronGroup(cfg, self.placement, trainable=True)
        self.reference = G.MegatronGroup(cfg, self.placement, trainable=False) if cfg.training.kl_coef > 0 else None
        megatron = [g for g in (self.policy, self.reference) if g is not None]
        if not meanwhile:
            for group in megatron:
                group.wait_ready()
        self.engines = G.engine_group(cfg, self.placement, self.model_path)
        if meanwhile:
            for group in megatron:
                group.wait_ready()

    def sync_weights(self) -> dict[str, float]:
        """Stream the policy's weights into every engine (rollout.weight_transport)."""
        return sync_weights(self.policy, self.engines, self.cfg.rollout.sync_bucket_mb, self.transport)

    def restart_engine(self, index: int) -> None:
        """A new engine actor in the dead one's bundle, then every engine gets the policy's weights."""
        self.engines.restart(index)
        self.sync_weights()

    def peak_memory(self) -> dict[str, int]:
        """Peak RSS of the driver and of every actor still alive."""
        return G.peak_memory(self.policy, self.reference, self.engines)

    def close(self) -> None:
        """Engines, placement group, then Ray (if this run started it)."""
        try:
            if self.engines is not None:
                self.engines.shutdown()
            if self.placement is not None:
                self.placement.remove()
        finally:
            G.stop_ray(self.started)
