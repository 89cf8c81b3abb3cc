"""An emulated Ray cluster of N nodes on one machine, for the multi-node tests and the lost-node
fault of ``bench faults``.

Each node is a raylet of its own (``ray.cluster_utils.Cluster``: its own ports, object store and
logical CPUs/GPUs) with an address of its own on the loopback network (node k is 127.0.0.{k+2}),
so that what a process on it reports as its node's address (``ray.util.get_node_ip_address``,
the rendezvous of the policy's process groups) tells the nodes apart as on a real cluster. The
head holds no CPUs and no GPUs by default: no bundle lands on it, as no worker needs to be on
the node the driver runs on. ``slurm/bootstrap.sh`` builds the same cluster with ``ray start``
on every node of a job; this is that cluster without SLURM.

A node is lost with :meth:`EmulatedNodes.kill`: its raylet and every worker on it are killed at
once (SIGKILL), as when a machine goes down.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

NODE_IP = "127.0.0.{}"
"""Loopback address of emulated node k (``NODE_IP.format(k + 2)``; 127.0.0.1 stays the host's)."""


QUIET_NODES = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
"""Ray's system config of the emulated cluster: a raylet would otherwise start an idle Python
worker (~150 MB) per logical CPU at once, hundreds on one machine for the 8-node layout."""


@dataclass
class EmulatedNodes:
    """A running emulated cluster: its address and its worker nodes in order."""

    cluster: Any  # ray.cluster_utils.Cluster
    nodes: list[Any] = field(default_factory=list)  # ray._private.node.Node, node k at index k

    @property
    def address(self) -> str:
        """The GCS address a driver joins (``cluster.ray_address=...``)."""
        return str(self.cluster.address)

    def ip(self, index: int) -> str:
        """The address of node ``index``."""
        return NODE_IP.format(index + 2)

    def add(self, cpus: float, gpus: int = 0) -> int:
        """A new worker node (as a requeued job gets in place of a lost one); its index."""
        self.nodes.append(self.cluster.add_node(num_cpus=cpus, num_gpus=gpus, node_ip_address=self.ip(len(self.nodes))))
        return len(self.nodes) - 1

    def kill(self, index: int) -> None:
        """Lose node ``index``: its raylet and the workers on it are killed, not stopped."""
        self.cluster.remove_node(self.nodes[index], allow_graceful=False)


@contextmanager
def emulated_nodes(count: int, cpus: float, gpus: int = 0, head_cpus: float = 0, timeout_s: float = 300) -> Iterator[EmulatedNodes]:
    """Start a head and ``count`` worker nodes of ``cpus`` logical CPUs and ``gpus`` logical GPUs
    each; shut them all down on exit. The caller joins with ``ray.init(address=...)``."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus, "num_gpus": 0, "include_dashboard": False,
                                                            "_system_config": QUIET_NODES})
    emulated = EmulatedNodes(cluster)
    try:
        for _ in range(count):
            emulated.add(cpus, gpus)
        cluster.wait_for_nodes(timeout=timeout_s)
        yield emulated
    finally:
        cluster.shutdown()
