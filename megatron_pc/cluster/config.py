"""Settings of process placement: Ray address, colocated or split devices, GPU memory; and the
run's layout of workers (:class:`Layout`), which the root config derives from the model, cluster,
rollout and training settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from megatron_pc.errors import ConfigError


@dataclass
class ClusterConfig:
    """Where workers run."""

    ray_address: str | None = None
    """Join this Ray cluster (``ray://...`` or ``auto``); None: RAY_ADDRESS, else start a local one."""
    placement: Literal["colocated", "split"] = "colocated"
    """Engines and policy on the same devices (engines sleep during training), or disjoint pools."""
    data_parallel: int = 1
    """Data-parallel size of the policy (devices = TP x PP x DP)."""
    cpus_per_worker: float = 1.0
    """Ray CPUs reserved per worker on CPU runs."""
    cpu_threads: int | None = None
    """Torch threads of each policy rank and engine on CPU runs. None: the node's cores shared
    by the workers busy at once (colocated: a phase's workers have all of them; split: the
    policy's and the engines' pools share them)."""
    gpu_memory_gb: float = 141.0
    """Memory of one GPU in GB (10^9 bytes) that ``megatron-pc plan`` checks layouts against;
    141 is an H200. ``plan --gpu-memory-gb`` overrides it for one check."""

    @property
    def colocated(self) -> bool:
        """Whether engines and policy share devices (else each has its own pool)."""
        return self.placement == "colocated"

    def __post_init__(self) -> None:
        if self.data_parallel < 1:
            raise ConfigError("data_parallel", f"must be >= 1, got {self.data_parallel}")
        if self.cpus_per_worker <= 0:
            raise ConfigError("cpus_per_worker", f"must be > 0, got {self.cpus_per_worker}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ConfigError("cpu_threads", f"must be >= 1 or null, got {self.cpu_threads}")
        if self.gpu_memory_gb <= 0:
            raise ConfigError("gpu_memory_gb", f"must be > 0, got {self.gpu_memory_gb}")


@dataclass(frozen=True)
class Layout:
    """How many workers of each kind a run places (``Config.layout`` derives it): what cluster/
    needs of the model, rollout and training settings to place and start them."""

    world: int
    """Policy ranks (and devices on a GPU run): TP x PP x DP."""
    engines: int
    """Rollout engines (``rollout.engines``)."""
    engine_tp: int
    """Tensor parallelism of each engine (``rollout.tensor_parallel``): its vLLM workers."""
    reference: bool
    """Whether a reference model's ranks run beside the policy's (``training.kl_coef > 0``)."""

    @property
    def engine_devices(self) -> int:
        """Devices the engines occupy: engines x engine TP."""
        return self.engines * self.engine_tp
