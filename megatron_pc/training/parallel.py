"""Process groups (TP x PP x DP) and seeds for a Megatron worker process."""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from megatron_pc import platform

logger = logging.getLogger(__name__)


def init_parallel(tp: int, pp: int, seed: int = 1234) -> None:
    """Create Megatron's model-parallel groups on an initialised torch.distributed world;
    DP is world_size / (TP x PP). Applies the CPU adapter when CUDA is absent."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    world = dist.get_world_size()
    if world % (tp * pp):
        raise ValueError(f"world size {world} is not a multiple of TP x PP = {tp * pp}")
    platform.apply_cpu_adapter()
    if platform.on_gpu():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    torch.manual_seed(seed)
    # On CPU there is no CUDA RNG to fork per TP rank; the inference tracker's fork() is a
    # no-op, which is exact because dropout is off.
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=not platform.on_gpu(),
                                    force_reset_rng=True)
    logger.debug("parallel groups: TP=%d PP=%d DP=%d", tp, pp, world // (tp * pp))


def destroy_parallel() -> None:
    """Tear down Megatron's groups (the world group stays)."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


def sizes() -> tuple[int, int, int]:
    """(TP, PP, DP) of this process."""
    from megatron.core import parallel_state as ps

    return (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
            ps.get_data_parallel_world_size())
