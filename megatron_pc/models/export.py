"""HF-named full tensors from a live, sharded Megatron model (any TP/PP/DP).

Used by the weight sync to vLLM and shares the per-tensor step (``name_maps.hf_tensors``)
with the offline converter (conversion/megatron_to_hf.py). Every rank calls it; the tensors
come out on global rank 0 only, one at a time:

1. each pipeline stage's parameter list (names with global layer indices) is shared over
   the PP group, so every rank walks the same sequence of tensors;
2. the owning stage all-gathers the TP shards and un-shards them (fc1 as [gate; up]);
3. a stage other than the first sends the full tensor to the first stage (global rank 0);
4. rank 0 undoes the vocab padding and splits fused QKV / fc1 with the inverse map.

Data-parallel replicas hold the same weights: only DP rank 0 takes part.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from megatron_pc.models import name_maps
from megatron_pc.models.hf_config import HFArch
from megatron_pc.models.hf_weights import global_names, shapes_of

_Listing = list[tuple[str, tuple[int, ...], torch.dtype]]


def _stage_listings(local: dict[str, torch.Tensor], pp_group: object, pp: int) -> list[_Listing]:
    """(name, local shape, dtype) of every stage's parameters, in stage order."""
    mine: _Listing = [(name, tuple(t.shape), t.dtype) for name, t in local.items()]
    if pp == 1:
        return [mine]
    listings: list[_Listing] = [[] for _ in range(pp)]
    dist.all_gather_object(listings, mine, group=pp_group)
    return listings


def _full_tensor(entry: name_maps.Entry, shard: torch.Tensor, tp: int, tp_group: object) -> torch.Tensor:
    """The full (TP=1 layout) tensor from this TP group's shards."""
    if entry.tp_dim is None or tp == 1:
        return shard.detach()
    shards = [torch.empty_like(shard) for _ in range(tp)]
    dist.all_gather(shards, shard.detach().contiguous(), group=tp_group)
    return name_maps.unshard(entry, shards)


def _full_shape(entry: name_maps.Entry, shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
    if entry.tp_dim is None:
        return shape
    full = list(shape)
    full[entry.tp_dim] *= tp
    return tuple(full)


@torch.no_grad()
def iter_hf_tensors(module: torch.nn.Module, arch: HFArch, *, every_rank: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, full tensor) for every weight of ``module`` on global rank 0.

    Collective: every rank of the model-parallel world must exhaust the iterator (other
    ranks yield nothing but take part in the gathers and sends). ``module`` is this rank's
    GPTModel, optionally wrapped in Megatron DDP. Tensors stay on the parameters' device and
    dtype; each is a fresh tensor (not a view of a parameter) unless TP=PP=1 and no layout
    change applies. With tied embeddings only ``model.embed_tokens.weight`` is yielded.

    ``every_rank`` (pipeline parallelism 1 only): every rank of every data-parallel replica
    yields the full tensors, all-gathered within its TP group (the per-GPU CUDA IPC sync: each
    rank feeds the engine worker on its own GPU)."""
    from megatron.core import parallel_state as ps

    if every_rank:
        yield from _iter_on_every_rank(module, arch)
        return
    if ps.get_data_parallel_rank() != 0:
        return
    model = getattr(module, "module", module)
    tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
    tp_group, pp_group = ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()
    my_stage, tp_rank = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()
    stage_ranks = dist.get_process_group_ranks(pp_group) if pp > 1 else [dist.get_rank()]
    shapes = shapes_of(arch, tp)
    local = dict(global_names(model))
    for stage, listing in enumerate(_stage_listings(local, pp_group, pp)):
        for name, shape, dtype in listing:
            entry, layer = name_maps.lookup(arch.family.name, arch.tie_embeddings, name)
            if entry is name_maps.OUTPUT_TIED:
                continue  # HF stores the tied head once, as the embedding
            full = _full_tensor(entry, local[name], tp, tp_group) if stage == my_stage else None
            if tp_rank != 0:
                continue
            if stage != 0 and my_stage == stage:
                dist.send(full.contiguous(), dst=stage_ranks[0])
            elif stage != 0 and my_stage == 0:
                full = torch.empty(_full_shape(entry, shape, tp), dtype=dtype, device=local_device(local))
                dist.recv(full, src=stage_ranks[stage])
            if dist.get_rank() == 0:
                yield from name_maps.hf_tensors(entry, layer, full, shapes)


def _iter_on_every_rank(module: torch.nn.Module, arch: HFArch) -> Iterator[tuple[str, torch.Tensor]]:
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() != 1:
        raise ValueError("full tensors on every rank need pipeline parallelism 1 (each stage holds only its layers)")
    model = getattr(module, "module", module)
    tp, tp_group = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_group()
    shapes = shapes_of(arch, tp)
    for name, shard in global_names(model):
        entry, layer = name_maps.lookup(arch.family.name, arch.tie_embeddings, name)
        if entry is name_maps.OUTPUT_TIED:
            continue
        yield from name_maps.hf_tensors(entry, layer, _full_tensor(entry, shard, tp, tp_group), shapes)


def local_device(local: dict[str, torch.Tensor]) -> torch.device:
    """The device of this rank's parameters (CPU when it has none)."""
    return next(iter(local.values())).device if local else torch.device("cpu")
