"""The actor of one Megatron rank of the policy (or the reference): the worker verbs the driver
calls through :class:`~megatron_pc.cluster.policy_group.MegatronGroup`.

The class is plain Python; the policy group wraps it with ``ray.remote`` when it places it, so
importing this module needs neither Ray nor a device.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from megatron_pc.cluster.peak_memory import peak_rss_bytes
from megatron_pc.weight_sync.sending import SendingRank


class MegatronRank(SendingRank):
    """One rank of a Megatron model (policy or reference) inside a TP x PP x DP world.

    Every rank receives every call with the same arguments (SPMD), or its DP group's share;
    results come back from all ranks and the group keeps rank 0's, or each DP group's. Each
    public method here is a verb of :class:`~megatron_pc.cluster.policy_group.MegatronGroup`,
    which checks at import that its method has the same signature. The weight-sync methods
    come from :class:`~megatron_pc.weight_sync.sending.SendingRank`.
    """

    def __init__(self, rank: int, world: int, master: str, model_cfg: Any, train_cfg: Any, seed: int, trainable: bool) -> None:
        from megatron_pc.console import redirect_worker_output

        redirect_worker_output()  # before torch and Megatron print their start-up warnings
        import torch
        import torch.distributed as dist

        from megatron_pc import platform
        from megatron_pc.training.parallel import init_parallel

        host, port = master.rsplit(":", 1)
        os.environ.update(MASTER_ADDR=host, MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0")
        if not platform.on_gpu():
            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        dist.init_process_group(platform.dist_backend(), rank=rank, world_size=world, init_method=f"tcp://{master}")
        init_parallel(model_cfg.tensor_parallel, model_cfg.pipeline_parallel, seed)
        from megatron_pc.training.worker import PolicyWorker, ReferenceWorker

        self.rank = rank
        self.rows: Any = None  # this DP group's share of the step (StepRows) and its sequences
        self.seqs: list[Any] = []
        self.sender = None  # this rank's end of the weight-sync channel (SendingRank)
        self.worker = (PolicyWorker(model_cfg, train_cfg) if trainable else
                       ReferenceWorker(model_cfg, micro_batch_tokens=train_cfg.micro_batch_tokens,
                                       logprob_chunk_tokens=train_cfg.logprob_chunk_tokens, sequence_parallel=train_cfg.sequence_parallel))

    def ready(self) -> int:
        """Returns the rank once construction finished (used to wait for the group)."""
        return self.rank

    def peak_rss(self) -> int:
        """This process's peak resident memory in bytes."""
        return peak_rss_bytes()

    def load_hf(self, path: str) -> None:
        """Load Hugging Face weights."""
        self.worker.load_hf(path)

    def offload_for_generation(self, colocated: bool) -> dict[str, float]:
        """Before colocated engines wake: free what the update holds and generation does not need
        (training.offload_grads / offload_optimizer / empty_cache); the next update brings it back."""
        return self.worker.offload_for_generation(colocated)

    def logprobs(self, seqs: list[Any]) -> list[list[float]] | None:
        """Per-response-token log-probs of each sequence (rank 0 returns them)."""
        out = self.worker.compute_logprobs(seqs)
        return [lp.tolist() for lp, _ in out] if self.rank == 0 else None

    def prompt_features(self, prompts: list[Any]) -> Any:
        """Final hidden states at the prompts' last tokens (a PromptFeatures of this DP group's
        share, from the last pipeline stage's TP rank 0; None on every other rank)."""
        return self.worker.prompt_features(prompts)

    # ---- a step's rows, kept on the worker (see megatron_pc.training.payload) ----------------
    def layout(self) -> dict[str, int]:
        """This rank's place in the TP x PP x DP world."""
        from megatron.core import parallel_state as ps

        return {"rank": self.rank, "dp": ps.get_data_parallel_rank(), "tp": ps.get_tensor_model_parallel_rank(),
                "pp": ps.get_pipeline_model_parallel_rank()}

    def load_rows(self, rows: Any) -> int:
        """Take this DP group's share of the step (a StepRows, resolved from the object store);
        it stays here for the log-probs and the updates. Returns its number of rows."""
        self.rows, self.seqs = rows, rows.sequences()
        return rows.rows

    def old_logprobs(self) -> None:
        """The current policy's log-probs of the loaded rows become their old log-probs."""
        for seq, (lp, _) in zip(self.seqs, self.worker.local_logprobs(self.seqs)):
            seq.old_logprobs = lp

    def ref_logprobs(self) -> Any:
        """The reference log-probs of the loaded rows, flat, put into the object store by one
        rank of the DP group (TP and PP rank 0); an ObjectRef there, None elsewhere."""
        import numpy as np
        import ray

        flat = np.concatenate([lp.numpy() for lp, _ in self.worker.local_logprobs(self.seqs)]) if self.seqs else np.zeros(0, np.float32)
        here = self.layout()
        return ray.put(flat.astype(np.float32)) if here["tp"] == 0 and here["pp"] == 0 else None

    def set_ref_logprobs(self, flat: Any) -> None:
        """Reference log-probs of the loaded rows (flat, as ``ref_logprobs`` put them)."""
        import torch

        start = 0
        values = torch.as_tensor(flat)
        for seq in self.seqs:
            seq.ref_logprobs = values[start : start + seq.response_len]
            start += seq.response_len
        if start != len(values):
            raise ValueError(f"rank {self.rank}: {len(values)} reference log-probs for {start} response tokens")

    def train_update(self, update: int, last_update: bool) -> dict[str, float]:
        """Optimizer update ``update`` of the step, on this group's rows of it."""
        mine = [s for s, k in zip(self.seqs, self.rows.update) if k == update]
        scale = self.rows.loss_scales[update]
        return self.worker.train_local(mine, self.rows.denominators[update] / scale, scale, last_update)

    def save(self, path: str) -> None:
        """Write this rank's part of a Megatron distributed checkpoint (collective)."""
        from megatron_pc.training.checkpoint import save_checkpoint

        save_checkpoint(self.worker, path)

    def load(self, path: str) -> None:
        """Load model, optimizer, scheduler and RNG from a distributed checkpoint (collective)."""
        from megatron_pc.training.checkpoint import load_checkpoint

        load_checkpoint(self.worker, path)

    def weight_tensors(self, every_rank: bool) -> Iterator[tuple[str, Any]]:
        """The policy's HF-named full tensors (collective; yielded on rank 0, or on every rank
        with ``every_rank``): what :class:`SendingRank` streams to the engines."""
        from megatron_pc.models.export import iter_hf_tensors

        return iter_hf_tensors(self.worker.module, self.worker.arch, every_rank=every_rank)
