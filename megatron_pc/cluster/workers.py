"""Ray actors: Megatron ranks of the policy (or reference) and vLLM engines.

The classes are plain Python; :mod:`megatron_pc.cluster.groups` wraps them with ``ray.remote``
when it places them, so importing this module needs neither Ray nor a device.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from typing import Any, Iterator

logger = logging.getLogger(__name__)


def peak_rss_bytes() -> int:
    """Peak resident set size of the calling process: ``VmHWM`` of /proc/self/status.

    Not ``getrusage().ru_maxrss``: Linux carries that across ``execve``, so a process started
    by a large parent (a driver started by pytest, a launcher) reports the parent's size at
    fork as its own peak. VmHWM belongs to the address space, which exec replaces.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    import resource  # no procfs (macOS): the best there is, in bytes there

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class MegatronRank:
    """One rank of a Megatron model (policy or reference) inside a TP x PP x DP world.

    Every rank receives every call with the same arguments (SPMD); results come back from all
    ranks and the group keeps rank 0's.
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
        self.sender: Any = None  # rank 0's end of the weight-sync channel (megatron_pc.weight_sync Sender)
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

    def _buckets(self, bucket_bytes: int, *, to_cpu: bool, every_rank: bool = False) -> Iterator[list[tuple[str, Any]]]:
        """HF-named full tensors in buckets of about ``bucket_bytes`` (collective; rank 0 yields,
        or every rank with ``every_rank``)."""
        from megatron_pc.models.export import iter_hf_tensors
        from megatron_pc.weight_sync.buckets import buckets_by_layer

        named = iter_hf_tensors(self.worker.module, self.worker.arch, every_rank=every_rank)
        tensors = ((name, t.detach().cpu().contiguous() if to_cpu else t.detach()) for name, t in named)
        yield from buckets_by_layer(tensors, bucket_bytes)

    # ---- weight sync (see megatron_pc.weight_sync) ----------------------------------------------
    def open_weight_channel(self, transport: str, receivers: list[str], timeout_s: float) -> dict[str, str] | None:
        """Host a new channel (closing any old one): rank 0 to every engine worker in
        ``receivers``, or, for a per-GPU transport (cuda_ipc), every rank to the engine worker
        on its GPU. Returns {"address": where receivers join, "gpu": this GPU's UUID or ""}, or
        None on a rank that does not send."""
        import ray

        from megatron_pc import platform
        from megatron_pc.weight_sync.transports import get_transport, open_sender

        self.close_weight_channel()
        per_gpu = get_transport(transport).sender.per_gpu
        if self.rank != 0 and not per_gpu:
            return None
        gpu = ""
        if per_gpu:
            from megatron_pc.weight_sync.cuda_ipc import this_gpu

            gpu = this_gpu()
            receivers = [f"the engine worker on GPU {gpu}"]
        device = platform.device() if platform.on_gpu() else "cpu"
        self.sender = open_sender(transport, ray.util.get_node_ip_address(), receivers, device=device, timeout_s=timeout_s)
        return {"address": self.sender.address, "gpu": gpu}

    def connect_weight_channel(self) -> None:
        """Wait for the engine workers to join (forms the broadcast group); a rank that does not
        send has nothing to wait for."""
        if self.sender is not None:
            self.sender.connect()

    def close_weight_channel(self) -> None:
        """Drop this rank's channel, if any."""
        if self.sender is not None:
            self.sender.close()
        self.sender = None

    def push_weights(self, bucket_bytes: int) -> Iterator[Any]:
        """Collective: every rank gathers the HF tensors; a rank with a sender (rank 0, or every
        rank per GPU) streams one payload per bucket of about ``bucket_bytes`` through it (the
        sender waits for acknowledgements to keep at most two buckets in flight); the other
        ranks take part and yield nothing."""
        sender = self.sender
        if sender is None:
            for _ in self._buckets(bucket_bytes, to_cpu=False):
                pass
            return
        yield from sender.stream(self._buckets(bucket_bytes, to_cpu=sender.on_cpu, every_rank=sender.per_gpu))

    def weight_sync_stats(self) -> dict[str, Any]:
        """What this rank's sender measured in the last sync (buckets and bytes in flight)."""
        if self.sender is None:
            raise RuntimeError(f"policy rank {self.rank}: no weight-sync channel is open")
        return asdict(self.sender.stats)


class EngineActor:
    """A vLLM engine in its own process."""

    def __init__(self, model_path: str, rollout_cfg: Any, name: str, seed: int, max_prompt_tokens: int | None = None) -> None:
        from megatron_pc.console import redirect_worker_output

        redirect_worker_output()
        from megatron_pc.rollout.vllm_engine import VllmEngine

        self.engine = VllmEngine(model_path, rollout_cfg, name=name, seed=seed, max_prompt_tokens=max_prompt_tokens)

    def ready(self) -> str:
        """The engine's name once it started."""
        return self.engine.name

    def peak_rss(self) -> int:
        """This process's peak resident memory in bytes (the engine's workers not included)."""
        return peak_rss_bytes()

    def generate(self, requests: list[Any], sampling: Any) -> Any:
        """Serve a shard of a round."""
        return self.engine.generate(requests, sampling)

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Log-probs of given sequences under the engine's current weights."""
        return self.engine.score(sequences)

    def update_weights(self, weights: Any) -> dict[str, float]:
        """Load (name, tensor) pairs or one bucket payload of the joined weight-sync channel."""
        return asdict(self.engine.update_weights(weights))

    def join_weight_channel(self, spec: Any) -> None:
        """Every vLLM worker of the engine joins a policy rank's channel (a ChannelSpec)."""
        self.engine.join_weight_channel(spec)

    def sleep(self) -> None:
        """Free accelerator memory while the policy trains."""
        self.engine.sleep()

    def wake(self) -> None:
        """Undo sleep."""
        self.engine.wake()

    def shutdown(self) -> None:
        """Release the engine (its workers leave any weight-sync channel)."""
        self.engine.shutdown()
