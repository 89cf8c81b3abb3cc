"""The CPU adapter: applied only on request, and each patch is needed (restoring just that
patch makes its Megatron call site fail on CPU again)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist

from megatron_pc import platform
from megatron_pc.training.launch import free_port

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the adapter only matters without CUDA")


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    """A one-process gloo world with Megatron's groups (TP = PP = DP = 1)."""
    from megatron.core import parallel_state

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    platform.apply_cpu_adapter()
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    platform.remove_cpu_adapter()
    dist.destroy_process_group()


def _rotary() -> None:
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    RotaryEmbedding(kv_channels=32, rotary_percent=1.0, use_cpu_initialization=False)


def _tied_embedding() -> None:
    from megatron.core.models.common.language_module.language_module import LanguageModule

    from types import SimpleNamespace

    # A middle pipeline stage in the embedding group: the method only moves and reduces the weight.
    weight = torch.nn.Parameter(torch.ones(2))
    probe = SimpleNamespace(_is_in_embd_group=lambda: True, embd_group=dist.group.WORLD,
                            shared_embedding_or_output_weight=lambda: weight, pre_process=False,
                            post_process=False, share_embeddings_and_output_weights=True,
                            config=SimpleNamespace(pipeline_model_parallel_size=2, mtp_num_layers=0),
                            vp_stage=None, vp_size=None, pp_group=dist.group.WORLD)
    LanguageModule.setup_embeddings_and_output_layer(probe)


def _p2p_shapes() -> None:
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    comm = P2PCommunicator(dist.group.WORLD, ModelParallelConfig(variable_seq_lengths=True))
    comm._communicate_shapes(None, None, False, False)


def _causal_mask() -> None:
    from megatron.core.fusions import fused_softmax

    fused_softmax.get_default_causal_mask(5)


def _schedule(name: str) -> Callable[[], None]:
    def run() -> None:
        from megatron.core.pipeline_parallel import schedules
        from megatron.core.transformer import TransformerConfig
        from megatron.core.transformer.enums import ModelType

        model = torch.nn.Linear(2, 2)
        model.config = TransformerConfig(num_layers=1, hidden_size=2, num_attention_heads=1,
                                         variable_seq_lengths=True, pipeline_dtype=torch.float32,
                                         moe_token_dispatcher_type="alltoall")
        model.model_type = ModelType.encoder_or_decoder
        model.set_input_tensor = lambda tensor: None

        def step(data: Iterator[torch.Tensor], module: torch.nn.Module) -> tuple:
            return module(next(data)), lambda out, non_loss_data=False: (out.sum(), {})

        getattr(schedules, name)(forward_step_func=step, data_iterator=iter([torch.ones(1, 2)]), model=[model],
                                 num_microbatches=1, seq_length=1, micro_batch_size=1, forward_only=True)

    return run


def _fp32_optimizer() -> None:
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import FP32Optimizer

    FP32Optimizer(torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))]), OptimizerConfig(lr=1e-3), None)


def _mixed_precision_init() -> None:
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import MixedPrecisionOptimizer

    # The class is abstract; a subclass with no-op abstract methods reaches its __init__.
    stubs = {name: lambda *a, **k: None for name in MixedPrecisionOptimizer.__abstractmethods__}
    bare = object.__new__(type("Probe", (MixedPrecisionOptimizer,), stubs))
    MixedPrecisionOptimizer.__init__(bare, torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))]),
                                     OptimizerConfig(lr=1e-3, bf16=True), None, None)


def _grad_norm() -> None:
    from megatron.core.optimizer import optimizer

    optimizer.get_grad_norm_fp32([torch.ones(3)], grad_stats_parallel_group=dist.group.WORLD)


def _clip() -> None:
    from megatron.core.optimizer import optimizer

    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    optimizer.clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=10.0)


def _distributed_optimizer() -> None:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from megatron_pc.models.hf_config import arch_from_dict
    from megatron_pc.models.provider import build_gpt_model

    arch = arch_from_dict(dict(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=64,
                               num_hidden_layers=1, num_attention_heads=2, head_dim=32))
    model = build_gpt_model(arch, 1, 1, torch.float32)
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(use_distributed_optimizer=True), model)
    get_megatron_optimizer(OptimizerConfig(lr=1e-3, use_distributed_optimizer=True), [ddp])


PROBES: dict[str, Callable[[], None]] = {
    "current_device": _rotary,
    "LanguageModule.setup_embeddings_and_output_layer": _tied_embedding,
    "synchronize": _p2p_shapes,
    "get_default_causal_mask": _causal_mask,
    "forward_backward_no_pipelining": _schedule("forward_backward_no_pipelining"),
    "forward_backward_pipelining_without_interleaving": _schedule("forward_backward_pipelining_without_interleaving"),
    "FP32Optimizer.__init__": _fp32_optimizer,
    "MixedPrecisionOptimizer.__init__": _mixed_precision_init,
    "get_grad_norm_fp32": _grad_norm,
    "clip_grad_by_total_norm_fp32": _clip,
    "DistributedOptimizer._build_model_and_main_param_groups": _distributed_optimizer,
}


def test_every_patch_has_a_probe_and_a_documented_call_site() -> None:
    assert sorted(PROBES) == sorted(p.attr for p in platform.PATCHES)
    assert all(p.call_site for p in platform.PATCHES)


@pytest.mark.parametrize("attr", sorted(PROBES))
def test_megatron_call_site_fails_on_cpu_without_its_patch_and_works_with_it(world: None, attr: str) -> None:
    PROBES[attr]()  # every patch applied: works
    platform.remove_cpu_adapter(only=attr)
    try:
        with pytest.raises((AssertionError, RuntimeError, TypeError)):
            PROBES[attr]()
    finally:
        platform.apply_cpu_adapter()
    PROBES[attr]()


def test_adapter_is_not_applied_at_import() -> None:
    import importlib
    import subprocess
    import sys

    code = ("import torch, megatron_pc.platform, megatron_pc.training.worker, megatron_pc.models.provider;"
            "import megatron_pc.platform as p; print(p.cpu_adapter_active(), torch.cuda.current_device.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "torch.cuda"]
    assert importlib.import_module("megatron_pc.platform").cpu_adapter_needed()


def test_cuda_names_mode_only_maps_cuda_requests() -> None:
    from megatron_pc.platform.cpu_adapter import CudaNamesOnCpu

    with CudaNamesOnCpu():
        made = torch.zeros(2, device="cuda")
        assert made.device.type == "cpu"
        assert made.type() == "torch.cuda.FloatTensor"
        assert made.cuda() is made
        assert torch.ones(1, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
    assert torch.zeros(1).type() == "torch.FloatTensor"
