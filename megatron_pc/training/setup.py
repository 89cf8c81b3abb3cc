"""Build the pieces of a Megatron worker: model (optionally DDP-wrapped), optimizer, schedule."""

from __future__ import annotations

import logging

import torch

from megatron_pc import platform
from megatron_pc.models.config import ModelConfig
from megatron_pc.models.hf_config import HFArch
from megatron_pc.models.provider import build_gpt_model
from megatron_pc.training.config import TrainingConfig

logger = logging.getLogger(__name__)


def params_dtype(model_cfg: ModelConfig) -> torch.dtype:
    """The parameter dtype named by ``model.params_dtype`` (auto: bf16 on GPU, fp32 on CPU)."""
    if model_cfg.params_dtype == "auto":
        return platform.default_dtype()
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[model_cfg.params_dtype]


def build_model(arch: HFArch, model_cfg: ModelConfig, trainable: bool, sequence_parallel: bool = False) -> torch.nn.Module:
    """This rank's GPTModel; wrapped in Megatron DDP when it will be trained (the Megatron
    optimizer reads the DDP gradient buffers, and DDP reduces gradients over DP).
    ``sequence_parallel`` (TP > 1 only) splits the sequence over the TP ranks outside the
    attention and MLP blocks."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    sequence_parallel = sequence_parallel and model_cfg.tensor_parallel > 1
    model = build_gpt_model(arch, model_cfg.tensor_parallel, model_cfg.pipeline_parallel, params_dtype(model_cfg),
                            layer_spec_setting=model_cfg.layer_spec, sequence_parallel=sequence_parallel)
    if not trainable:
        model.eval()
        return model
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=True,  # at every DP: one checkpoint format, resharded over DP (training/checkpoint.py)
    )
    return DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)


def build_optimizer(model: torch.nn.Module, model_cfg: ModelConfig, train_cfg: TrainingConfig):  # -> (opt, sched)
    """Megatron's distributed optimizer and its warm-up LR schedule. It is distributed at DP 1
    too (one shard: the same memory and the same arithmetic as the replicated optimizer), so that
    every checkpoint holds the optimizer in the one format that reshards over DP."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    dtype = params_dtype(model_cfg)
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=train_cfg.lr,
        min_lr=train_cfg.lr,
        weight_decay=train_cfg.weight_decay,
        adam_beta1=train_cfg.adam_beta1,
        adam_beta2=train_cfg.adam_beta2,
        clip_grad=train_cfg.grad_clip,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        use_distributed_optimizer=True,
    )
    optimizer = get_megatron_optimizer(opt_config, [model])
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if train_cfg.warmup_steps else train_cfg.lr,
        max_lr=train_cfg.lr,
        min_lr=train_cfg.lr,
        lr_warmup_steps=train_cfg.warmup_steps,
        lr_decay_steps=max(train_cfg.steps, train_cfg.warmup_steps + 1),
        lr_decay_style="constant",
        start_wd=train_cfg.weight_decay,
        end_wd=train_cfg.weight_decay,
        wd_incr_steps=max(train_cfg.steps, 1),
        wd_incr_style="constant",
    )
    # The hooks Megatron's schedules call: loss scaling, DP/PP gradient reduction (incl. the
    # tied embedding across pipeline stages), and no-sync for all but the last micro-batch.
    config = model.module.config
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = model.no_sync
    return optimizer, scheduler
