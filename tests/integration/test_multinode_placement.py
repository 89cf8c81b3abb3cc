"""The qwen3_14b layout (8 nodes x 8 GPUs: policy TP 2 x DP 32, 32 colocated engines of TP 2)
placed on an emulated Ray cluster of 8 nodes (benchmarks/nodes.py: a raylet and a loopback
address per node, 8 logical GPUs each, a head that holds nothing).

The run's own :class:`Placement` places all 32 bundles; its actor options then place stand-ins
for the Megatron ranks and the engines (test_engine_placement.py's probes: they report the node
and the GPU ids they were given, and start neither Megatron nor vLLM) on two nodes, the node of
the first bundle and that of the last, one node at a time: a Ray worker process is ~150 MB, and
the 96 of the whole layout would not fit beside the other tests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from benchmarks.nodes import emulated_nodes  # noqa: E402
from megatron_pc.cluster.engines import RayEngine  # noqa: E402
from megatron_pc.cluster.placement import Placement, master_address  # noqa: E402
from megatron_pc.config import load_config  # noqa: E402
from megatron_pc.weight_sync.channel import ChannelSpec  # noqa: E402
from test_engine_placement import ProbeEngine, ProbeRank  # noqa: E402

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
NODES, GPUS = 8, 8


@pytest.fixture(scope="module")
def placed() -> Iterator[dict[str, Any]]:
    """What every policy rank and engine of the qwen3_14b layout sees, the node of each bundle,
    the policy's master address, and the nodes' addresses by id."""
    # A quarter CPU a worker: a raylet keeps up to its logical CPUs' worth of idle Python
    # workers (~90 MB each), which 8 nodes of 16 CPUs would make hundreds.
    cfg = load_config(str(ROOT / "configs" / "qwen3_14b.yaml"), ["cluster.cpus_per_worker=0.25"])
    with emulated_nodes(NODES, cpus=GPUS * 0.25, gpus=GPUS) as nodes:
        ray.init(address=nodes.address, log_to_driver=False)
        try:
            placement = Placement(cfg.cluster, cfg.layout, use_gpu=True)
            from ray.util.placement_group import placement_group_table

            bundle_node = placement_group_table(placement.group)["bundles_to_node_id"]
            tp, last = cfg.rollout.tensor_parallel, cfg.rollout.engines - 1
            policy: dict[int, dict] = {}
            engines: dict[int, dict] = {}
            for node in dict.fromkeys([bundle_node[0], bundle_node[last]]):
                here = [k for k in range(cfg.rollout.engines) if bundle_node[k] == node]
                ranks = {r: ProbeRank.options(**placement.rank_options(r, True)).remote() for k in here for r in range(k * tp, (k + 1) * tp)}
                probes = {k: RayEngine(cfg.rollout, placement, "fast", k, seed=cfg.seed, actor_class=ProbeEngine) for k in here}
                policy |= dict(zip(ranks, ray.get([a.devices.remote() for a in ranks.values()])))
                engines |= dict(zip(probes, ray.get([e.actor.devices.remote() for e in probes.values()])))
                for actor in [*ranks.values(), *(e.actor for e in probes.values())]:
                    ray.kill(actor)
            yield {
                "cfg": cfg, "placement": placement, "node_ips": [nodes.ip(k) for k in range(NODES)],
                "ip_of": {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()},
                "policy": policy, "engines": engines, "bundle_node": bundle_node, "master": master_address(placement),
            }  # fmt: skip
            placement.remove()
        finally:
            ray.shutdown()


def test_every_bundle_is_on_one_of_the_eight_gpu_nodes_four_to_a_node(placed: dict[str, Any]) -> None:
    nodes = [placed["ip_of"][placed["bundle_node"][b]] for b in range(placed["cfg"].rollout.engines)]
    # 32 bundles of 2 GPUs: 4 on each GPU node, none on the head (it has no GPUs).
    assert Counter(nodes) == {ip: 4 for ip in placed["node_ips"]}


def test_each_rank_and_engine_is_on_its_bundles_node_and_colocated_ranks_share_the_engines_gpus(placed: dict[str, Any]) -> None:
    placement, tp = placed["placement"], placed["cfg"].rollout.tensor_parallel
    policy, engines = placed["policy"], placed["engines"]
    assert len(policy) == 16 and len(engines) == 8  # two nodes' worth, see the module docstring
    assert 0 in policy and 63 in policy  # the first rank and the last
    for rank, seen in policy.items():
        assert seen["node"] == placed["bundle_node"][placement.rank_bundle(rank)], rank
        assert len(seen["ray"]) == 1 and seen["cvd"] == seen["ray"][0]  # one GPU of its own, by Ray's accounting
    for k, engine in engines.items():
        assert engine["node"] == placed["bundle_node"][placement.engine_bundle(k)], k
        mine = [policy[r] for r in range(k * tp, (k + 1) * tp)]
        assert {p["node"] for p in mine} == {engine["node"]}
        assert sorted(engine["cvd"].split(",")) == sorted(p["cvd"] for p in mine), (k, engine, mine)
    # Every (node, GPU) holds exactly one policy rank: 16 GPUs of two nodes, none twice.
    assert len({(p["node"], p["cvd"]) for p in policy.values()}) == 16 and len({p["node"] for p in policy.values()}) == 2


def test_the_policys_master_address_is_on_rank_0s_node_which_is_not_the_head(placed: dict[str, Any]) -> None:
    host, port = placed["master"].rsplit(":", 1)
    rank0_ip = placed["ip_of"][placed["policy"][0]["node"]]
    assert host == rank0_ip and int(port) > 0
    assert rank0_ip in placed["node_ips"]  # a GPU node: nothing is placed on, or assumed of, the head


def test_the_per_gpu_weight_channel_finds_each_engine_worker_the_rank_on_its_own_node_and_gpu(placed: dict[str, Any]) -> None:
    """cuda_ipc keys each policy rank's channel by its GPU's UUID, which names one GPU of one
    node. With the GPU's index on its node as key, 8 nodes would give 8 keys for 64 ranks."""
    policy = placed["policy"]
    uuid = {(p["node"], p["cvd"]): f"GPU-{placed['ip_of'][p['node']]}-{p['cvd']}" for p in policy.values()}  # one per device
    by_gpu = {uuid[(p["node"], p["cvd"])]: f"{placed['ip_of'][p['node']]}:rank{r}" for r, p in policy.items()}
    assert len(by_gpu) == 16 and len({p["cvd"] for p in policy.values()}) == GPUS  # the index alone: 8 keys
    spec = ChannelSpec("cuda_ipc", "unused", 1, 2, 60.0, by_gpu)
    tp = placed["cfg"].rollout.tensor_parallel
    for k, engine in placed["engines"].items():
        for gpu in engine["cvd"].split(","):  # each vLLM worker of the engine, on one of its GPUs
            joined = spec.for_gpu(uuid[(engine["node"], gpu)], f"engine{k}")
            rank = int(joined.address.rsplit("rank", 1)[1])
            assert rank // tp == k and joined.address.startswith(placed["ip_of"][engine["node"]] + ":")
