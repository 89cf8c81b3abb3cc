"""The receiving end inside a vLLM engine: functions that run in each of the engine's workers
(``LLM.collective_rpc`` with a callable; vLLM passes the worker as the first argument).

At ``tensor_parallel: 1`` the single worker lives in the engine's process; with more, each
worker is a process of vLLM's multiprocessing executor. Either way every worker holds its own
:class:`~megatron_pc.weight_sync.channel.Receiver` (rank ``first_rank + its TP rank``), receives
each bucket itself and loads it with vLLM's layer-wise reload over the bucket's own modules
(:func:`~megatron_pc.weight_sync.reload.reload_bucket`), which keeps the worker's shard of every
full tensor. So a worker receives each bucket once: over the broadcast group, mapped
through CUDA IPC, or (object store) in the payload ``collective_rpc`` hands it.
"""

from __future__ import annotations

from typing import Any

import torch

from megatron_pc.weight_sync.buckets import TransportError
from megatron_pc.weight_sync.channel import BucketPayload, ChannelSpec, receiver_names
from megatron_pc.weight_sync.reload import reload_bucket
from megatron_pc.weight_sync.transports import join_receiver

_RECEIVER = "_megatron_pc_weight_receiver"
"""The attribute of the vLLM worker that holds its receiver between calls."""


def _tp_rank() -> tuple[int, int]:
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def join_in_worker(worker: Any, spec: ChannelSpec, engine: str) -> str:
    """Join the channel as this worker's rank (leaving any older one); returns the receiver's name."""
    leave_in_worker(worker)
    rank, workers = _tp_rank()
    name = receiver_names(engine, workers)[rank]
    first = spec.first_rank + rank
    if spec.by_gpu is not None:  # per GPU: the channel of the policy rank on this worker's GPU, as its only receiver
        from megatron_pc.weight_sync.cuda_ipc import this_gpu

        spec, first = spec.for_gpu(this_gpu(), name), 1
    receiver = join_receiver(spec.transport, spec.address, first, spec.size, name, device=_device(), timeout_s=spec.timeout_s)
    setattr(worker, _RECEIVER, receiver)
    return name


def load_in_worker(worker: Any, payload: BucketPayload) -> tuple[int, int]:
    """Receive one bucket, load it into this worker's shard of the model, acknowledge it;
    returns (tensors, bytes) received."""
    receiver = getattr(worker, _RECEIVER, None)
    if receiver is None:
        raise TransportError(f"vLLM worker {_tp_rank()[0]}: it has not joined a weight-sync channel")
    pairs = receiver.receive(payload)
    size = sum(t.numel() * t.element_size() for _, t in pairs)
    count = len(pairs)
    reload_bucket(worker, pairs)
    del pairs  # drop any mapping of the sender's memory before saying we are done
    receiver.done(payload)
    return count, size


def load_pairs_in_worker(worker: Any, pairs: list[tuple[str, torch.Tensor]]) -> None:
    """Load (HF name, full tensor) pairs handed over by ``collective_rpc`` itself."""
    reload_bucket(worker, pairs)


def leave_in_worker(worker: Any) -> None:
    """Leave the channel, if any."""
    receiver = getattr(worker, _RECEIVER, None)
    if receiver is not None:
        receiver.close()
        setattr(worker, _RECEIVER, None)
