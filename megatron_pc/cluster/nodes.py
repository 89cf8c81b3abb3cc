"""Nodes of a multi-node run, and what happens when one is lost.

A run's bundles sit on some Ray nodes (recorded when the placement group is ready). When one of
those nodes goes down, every policy rank and engine on it dies with it; the layout cannot be
placed again until a node comes back. Restarting an engine there would wait for ever, and the
policy ranks left cannot go on without their peers. So a lost node ends the run with
:class:`NodeLostError`, which ``megatron-pc train`` turns into the requeue exit code
(``driver.train.PREEMPTED_EXIT``): under SLURM, ``slurm/bootstrap.sh`` requeues the job, which
resumes from the newest complete checkpoint on the nodes it then gets (a resume may change the
policy's DP and the number of engines, see docs/slurm.md, if fewer nodes come back).

A lost head (the node of the driver and of Ray's GCS) ends the job itself: SLURM requeues it
like any failed job where ``--requeue`` is set, and it resumes the same way.
"""

from __future__ import annotations

import logging
from typing import Any

from megatron_pc.errors import MegatronPCError

logger = logging.getLogger(__name__)

NODE_PROBE_S = 60.0
"""How long a node may take to run an empty task before it counts as lost (Ray marks a node
whose raylet died as dead after its health checks fail, about 15-30 s)."""


class NodeLostError(MegatronPCError):
    """A Ray node holding the run's workers is gone: the run stops for a requeue."""

    def __init__(self, nodes: list[str], during: str) -> None:
        self.nodes = nodes
        super().__init__(f"Ray node {', '.join(nodes)} was lost during {during}, with the policy ranks and engines on it; "
                         "the run stops to be requeued and resumes from the newest complete checkpoint")  # fmt: skip


def placement_nodes(group: Any) -> dict[str, str]:
    """Node id -> address of every node that holds a bundle of placement group ``group``."""
    import ray
    from ray.util.placement_group import placement_group_table

    address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    return {node: address.get(node, node) for node in placement_group_table(group)["bundles_to_node_id"].values()}


def node_alive(node_id: str, timeout_s: float = NODE_PROBE_S) -> bool:
    """Whether node ``node_id`` still runs tasks: an empty task pinned to it answers, or the node
    is dead (Ray says so, or it does not answer within ``timeout_s``)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, max_retries=0)
    def here() -> bool:
        return True

    try:
        return bool(ray.get(here.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(), timeout=timeout_s))
    except (ray.exceptions.RayError, TimeoutError) as err:  # unschedulable there, died there, or no answer
        logger.warning("Ray node %s did not run a task (%s): counted as lost", node_id, type(err).__name__)
        return False


def lost_nodes(nodes: dict[str, str], timeout_s: float = NODE_PROBE_S) -> list[str]:
    """The addresses of the nodes of ``nodes`` (id -> address) that are gone."""
    return sorted(address for node, address in nodes.items() if not node_alive(node, timeout_s))
