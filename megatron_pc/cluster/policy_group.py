"""The policy's (or the reference's) Megatron ranks as one group the driver talks to.

The driver never talks to a single rank: every verb runs on all the group's actors (SPMD) and
returns rank 0's answer, or each data-parallel group's. Each verb is a typed method here, marked
``@verb(MegatronRank.<name>)`` (megatron_pc.cluster.verbs), which checks at import that it has
the rank method's signature; its body calls that rank method by attribute, never by a string.
The weight-sync methods at the end are this group as a weight sync's
:class:`~megatron_pc.weight_sync.sync.Source`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from megatron_pc.cluster.placement import Placement, import_ray, master_address
from megatron_pc.cluster.ranks import MegatronRank
from megatron_pc.cluster.verbs import verb
from megatron_pc.errors import MegatronPCError
from megatron_pc.models.config import ModelConfig
from megatron_pc.training.config import TrainingConfig
from megatron_pc.training.prompt_features import assemble_features


class WorkerDiedError(MegatronPCError):
    """A policy or reference rank's process died: the run stops (its peers cannot go on)."""

    def __init__(self, who: str, method: str, err: Exception) -> None:
        self.who = who
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        super().__init__(f"{who} died during {method} ({first}); the run stops. Run the same command again to "
                         "resume from the newest complete checkpoint")  # fmt: skip


def first_per_group(results: Sequence[Any], dp_of_rank: Sequence[int], groups: int) -> list[Any]:
    """Each DP group's result: that of its first rank that returned one (not None)."""
    out: list[Any] = [None] * groups
    for result, dp in zip(results, dp_of_rank):
        if out[dp] is None:
            out[dp] = result
    return out


class MegatronGroup:
    """All ranks of the policy (``trainable``) or of the reference model."""

    def __init__(self, model: ModelConfig, training: TrainingConfig, seed: int, placement: Placement, trainable: bool) -> None:
        """Asks the ranks to start and returns: :meth:`wait_ready` waits for them (other
        workers can start meanwhile)."""
        ray = import_ray()
        master = master_address(placement)
        cls = ray.remote(MegatronRank)
        self.label = "policy" if trainable else "reference"
        self.actors = [
            cls.options(**placement.rank_options(rank, trainable)).remote(rank, placement.world, master, model, training, seed, trainable)
            for rank in range(placement.world)
        ]
        self._starting = [a.ready.remote() for a in self.actors]
        self.dp_of_rank: list[int] = []
        """The data-parallel group of each rank (its TP/PP peers share that group's rows)."""
        self.data_parallel = 0

    def wait_ready(self) -> None:
        """Wait until every rank has started; learn the ranks' data-parallel layout."""
        self._gather(self._starting, "start")
        self.dp_of_rank = [here["dp"] for here in self._gather([a.layout.remote() for a in self.actors], "layout")]
        self.data_parallel = max(self.dp_of_rank) + 1

    def put_shares(self, plan: Any) -> list[Any]:
        """A step's rows (a RowPlan) split by DP group, balanced by tokens, each share built and
        put into the object store once; the ObjectRef of every group's share."""
        from megatron_pc.training.payload import split_by_tokens

        ray = import_ray()
        shares = split_by_tokens(plan.lengths, plan.update, len(plan.denominators), self.data_parallel)
        return [ray.put(plan.build(mine)) for mine in shares]

    # ---- the verbs: one typed method per rank method ------------------------------------------
    @verb(MegatronRank.load_hf)
    def load_hf(self, path: str) -> None:
        """Every rank loads Hugging Face weights."""
        return self._rank0([a.load_hf.remote(path) for a in self.actors], "load_hf")

    @verb(MegatronRank.load)
    def load(self, path: str) -> None:
        """Every rank loads its part of a distributed checkpoint (collective)."""
        return self._rank0([a.load.remote(path) for a in self.actors], "load")

    @verb(MegatronRank.save)
    def save(self, path: str) -> None:
        """Every rank writes its part of a distributed checkpoint (collective)."""
        return self._rank0([a.save.remote(path) for a in self.actors], "save")

    @verb(MegatronRank.offload_for_generation)
    def offload_for_generation(self, colocated: bool) -> dict[str, float]:
        """Before colocated engines wake: every rank frees what generation does not need."""
        return self._rank0([a.offload_for_generation.remote(colocated) for a in self.actors], "offload_for_generation")

    @verb(MegatronRank.logprobs)
    def logprobs(self, seqs: list[Any]) -> list[list[float]] | None:
        """Per-response-token log-probs of each sequence (rank 0's)."""
        return self._rank0([a.logprobs.remote(seqs) for a in self.actors], "logprobs")

    @verb(MegatronRank.prompt_features, reduce=assemble_features)
    def prompt_features(self, prompts: list[Any]) -> tuple[np.ndarray, dict[str, int]]:
        """The final hidden state (after the final norm, fp32) at each prompt's last token: an
        ``[len(prompts), hidden]`` array in order, and the tokens forwarded (``tokens``,
        ``padded_tokens``). The prompts (token-id vectors) go into the object store once; each
        DP group forwards its share (megatron_pc.training.prompt_features)."""
        ref = import_ray().put(list(prompts))
        return assemble_features(self._per_group([a.prompt_features.remote(ref) for a in self.actors], "prompt_features"), len(prompts))

    @verb(MegatronRank.load_rows, scatter="rows", gather="groups")
    def load_rows(self, rows: Sequence[Any]) -> list[int]:
        """Each DP group's ranks take its share of the step (``rows[dp]``, an ObjectRef of
        :meth:`put_shares`, which reaches the rank as its value); each group's row count."""
        return self._per_group([a.load_rows.remote(rows[dp]) for a, dp in zip(self.actors, self.dp_of_rank)], "load_rows")

    @verb(MegatronRank.old_logprobs)
    def old_logprobs(self) -> None:
        """The current policy's log-probs of the loaded rows become their old log-probs."""
        return self._rank0([a.old_logprobs.remote() for a in self.actors], "old_logprobs")

    @verb(MegatronRank.ref_logprobs, gather="groups")
    def ref_logprobs(self) -> list[Any]:
        """Each DP group's reference log-probs of its loaded rows (an ObjectRef, flat)."""
        return self._per_group([a.ref_logprobs.remote() for a in self.actors], "ref_logprobs")

    @verb(MegatronRank.set_ref_logprobs, scatter="flat")
    def set_ref_logprobs(self, flat: Sequence[Any]) -> None:
        """Each DP group's ranks take its reference log-probs (``flat[dp]``, as
        :meth:`ref_logprobs` gave them)."""
        return self._rank0([a.set_ref_logprobs.remote(flat[dp]) for a, dp in zip(self.actors, self.dp_of_rank)], "set_ref_logprobs")

    @verb(MegatronRank.train_update)
    def train_update(self, update: int, last_update: bool) -> dict[str, float]:
        """Optimizer update ``update`` of the step on every group's rows of it (rank 0's metrics)."""
        return self._rank0([a.train_update.remote(update, last_update) for a in self.actors], "train_update")

    # ---- gathering ------------------------------------------------------------------------------
    def _rank0(self, refs: list[Any], method: str) -> Any:
        return self._gather(refs, method)[0]

    def _per_group(self, refs: list[Any], method: str) -> list[Any]:
        return first_per_group(self._gather(refs, method), self.dp_of_rank, self.data_parallel)

    def _gather(self, refs: list[Any], method: str) -> list[Any]:
        """Every rank's result, in rank order. A rank whose process died is named at once: its
        peers may be blocked in a collective with it and would never answer. ``method`` names
        the call in that error."""
        ray = import_ray()
        index = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as err:
                raise WorkerDiedError(f"{self.label} rank {index[ready[0]]}", method, err) from None
        return ray.get(refs)

    # ---- the source of a weight sync (megatron_pc.weight_sync.sync.Source) ---------------------
    def open_weight_channel(self, transport: str, receivers: list[str], timeout_s: float,
                            join: Callable[[str, dict[str, str] | None], None]) -> str:
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
        ray = import_ray()
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
        return self._rank0([self.actors[0].weight_sync_stats.remote()], "weight_sync_stats")
