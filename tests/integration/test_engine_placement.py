"""Placement of engines and policy ranks on GPUs, and engines driven all at once, with real Ray
actors on Ray's logical GPUs (``ray.init(num_gpus=8)``: Ray assigns ids and sets
CUDA_VISIBLE_DEVICES exactly as on a GPU node; nothing touches a device).

The real :class:`Placement` and the options the run uses place probe actors that stand in for
the vLLM engine actor and the Megatron ranks (the real ones would start vLLM or Megatron) and
report what they see.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from megatron_pc.cluster.engines import RayEngine, engine_group  # noqa: E402
from megatron_pc.cluster.placement import Placement  # noqa: E402
from megatron_pc.config import load_config  # noqa: E402
from megatron_pc.errors import MegatronPCError  # noqa: E402
from megatron_pc.rollout.group import EngineGroup  # noqa: E402

pytestmark = pytest.mark.integration
# The probe classes travel to Ray's workers by value: this test file is not importable there.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CALL_S = 1.0
"""How long every call of the slow probe engine takes."""


def _seen() -> dict[str, Any]:
    return {"ray": sorted(str(i) for i in ray.get_gpu_ids()), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "node": ray.get_runtime_context().get_node_id()}  # fmt: skip


class ProbeEngine:
    """EngineActor's constructor and the methods a run calls; every call takes CALL_S when ``slow``."""

    def __init__(self, model_path: str, rollout_cfg: Any, name: str, seed: int, max_prompt_tokens: int | None = None) -> None:
        self.name = name
        self.slow = model_path == "slow"
        self._wait()

    def _wait(self) -> None:
        if self.slow:
            time.sleep(CALL_S)

    def ready(self) -> str:
        return self.name

    def devices(self) -> dict[str, Any]:
        return _seen()

    def generate(self, requests: list[Any], sampling: Any) -> Any:
        from megatron_pc.rollout.base import GenerationResult, Sample

        self._wait()
        return GenerationResult([[Sample([1], [0.0], "stop")] * r.n for r in requests])

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        self._wait()
        return [[0.0] * (len(s) - 1) for s in sequences]

    def update_weights(self, bucket: list[Any]) -> Any:
        from megatron_pc.rollout.base import WeightPushStats

        self._wait()
        return WeightPushStats(len(bucket), 0, 0.0)

    def sleep(self) -> None:
        self._wait()

    def wake(self) -> None:
        self._wait()

    def shutdown(self) -> None:
        pass


@ray.remote
class ProbeRank:
    """Stands in for a MegatronRank: reports the devices it was given."""

    def devices(self) -> dict[str, Any]:
        return _seen()


@pytest.fixture(scope="module")
def logical_gpus() -> Iterator[None]:
    ray.init(num_cpus=32, num_gpus=8, include_dashboard=False, log_to_driver=False, _temp_dir="/tmp/mpc_ray_place")
    try:
        yield
    finally:
        ray.shutdown()


def _cfg(placement: str, engine_tp: int, engines: int, dp: int, *more: str):
    return load_config(None, [f"cluster.placement={placement}", f"rollout.tensor_parallel={engine_tp}", f"rollout.engines={engines}",
                              f"cluster.data_parallel={dp}", *more])  # fmt: skip


def _place(cfg, reference: bool = False) -> tuple[list[dict], list[dict], list[dict]]:
    """(policy ranks, reference ranks, engines): what each placed actor sees."""
    placement = Placement(cfg.cluster, cfg.layout, use_gpu=True)
    try:
        world = placement.world
        ranks = [ProbeRank.options(**placement.rank_options(r, True)).remote() for r in range(world)]
        refs = [ProbeRank.options(**placement.rank_options(r, False)).remote() for r in range(world)] if reference else []
        group = engine_group(cfg.rollout, placement, "fast", seed=cfg.seed, actor_class=ProbeEngine)
        seen = ray.get([a.devices.remote() for a in ranks]), ray.get([a.devices.remote() for a in refs])
        engines = ray.get([e.actor.devices.remote() for e in group.engines])
        group.shutdown()
        for actor in ranks + refs:
            ray.kill(actor)
        return seen[0], seen[1], engines
    finally:
        placement.remove()


def _ids(seen: dict) -> list[str]:
    return seen["cvd"].split(",")


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_colocated_engine_of_tp_t_sees_the_t_gpus_of_its_t_policy_ranks(logical_gpus: None, tp: int) -> None:
    # At TP 2 with a reference model too (kl_coef > 0): it shares the policy's GPUs.
    more = ["training.kl_coef=0.01"] if tp == 2 else []
    policy, reference, engines = _place(_cfg("colocated", tp, 8 // tp, 8, *more), reference=bool(more))
    # Every policy rank owns one GPU (Ray's own accounting), all distinct.
    assert all(len(p["ray"]) == 1 and p["cvd"] == p["ray"][0] for p in policy)
    assert sorted(p["cvd"] for p in policy) == [str(i) for i in range(8)]
    for k, engine in enumerate(engines):
        mine = {p["cvd"] for p in policy[k * tp : (k + 1) * tp]}
        assert len(_ids(engine)) == tp and set(_ids(engine)) == mine, (k, engine, mine)
        assert {p["node"] for p in policy[k * tp : (k + 1) * tp]} == {engine["node"]}
    if more:  # one reference rank per GPU, inside its policy rank's bundle
        assert sorted(r["cvd"] for r in reference) == [str(i) for i in range(8)]
        assert all(ref["ray"] == [] and ref["cvd"] in _ids(engines[r // tp]) for r, ref in enumerate(reference))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_engines_own_t_gpus_disjoint_from_the_policy(logical_gpus: None, tp: int) -> None:
    policy, _, engines = _place(_cfg("split", tp, 4 // tp, 4))
    policy_ids = [p["ray"] for p in policy]
    engine_ids = [e["ray"] for e in engines]
    assert all(len(ids) == 1 for ids in policy_ids) and all(len(ids) == tp for ids in engine_ids)
    assert all(e["cvd"] == ",".join(e["ray"]) for e in engines)  # what vLLM's workers will see
    everyone = [i for ids in policy_ids + engine_ids for i in ids]
    assert sorted(everyone) == [str(i) for i in range(8)]  # distinct: nothing shared


def test_colocated_layout_whose_engines_do_not_cover_the_policy_gpus_is_refused(logical_gpus: None) -> None:
    with pytest.raises(MegatronPCError, match=r"rollout.engines x rollout.tensor_parallel = 2 x 2 must equal the policy's TP x PP x DP = 8"):
        Placement((cfg := _cfg("colocated", 2, 2, 8)).cluster, cfg.layout, use_gpu=True)


def test_cpu_placement_asks_for_no_gpus(logical_gpus: None) -> None:
    cfg = _cfg("colocated", 2, 1, 2)
    placement = Placement(cfg.cluster, cfg.layout, use_gpu=False)
    try:
        assert all("GPU" not in b for b in placement.group.bundle_specs)
        opts = [placement.rank_options(0, True), placement.rank_options(1, False), placement.engine_options(0)]
        assert all("num_gpus" not in o and "OMP_NUM_THREADS" in o["runtime_env"]["env_vars"] for o in opts)
    finally:
        placement.remove()


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_eight_engines_start_sleep_wake_and_generate_all_at_once(logical_gpus: None) -> None:
    from megatron_pc.rollout.base import GenerationRequest, SamplingSettings

    cfg = _cfg("split", 1, 8, 1)
    placement = Placement(cfg.cluster, cfg.layout, use_gpu=False)  # the timing is the same on CPU bundles
    began: list[float] = []
    ended: list[float] = []

    def start(k: int) -> RayEngine:  # what engine_group's factory does, timed from the driver
        began.append(time.perf_counter())
        engine = RayEngine(cfg.rollout, placement, "slow", k, seed=cfg.seed, actor_class=ProbeEngine)
        ended.append(time.perf_counter())
        return engine

    try:
        group = EngineGroup(start, 8, concurrent=True)
        requests = [GenerationRequest([1, 2], 2) for _ in range(8)]
        seconds = {"sleep": _timed(group.sleep), "wake": _timed(group.wake),
                   "generate": _timed(lambda: group.generate(requests, SamplingSettings())),
                   "update_weights": _timed(lambda: group.update_weights([("w", 0)])),
                   "score_each": _timed(lambda: group.score_each([[1, 2, 3]]))}  # fmt: skip
        group.shutdown()
    finally:
        placement.remove()
    # One after the other, each would take 8 x 1 s.
    assert all(s < 2.0 for s in seconds.values()), seconds
    # Start: every engine was asked to start before the first one was ready (the wall time of a
    # start is mostly Ray spawning 8 worker processes, seconds of CPU on a small machine).
    assert len(began) == 8 and max(began) < min(ended), (began, ended)
