"""The three layer specs a policy can be built with, and which one a run uses (``model.layer_spec``).

- ``te``: Megatron's Transformer Engine spec (fused norm + linear, TE's flash attention). Needs TE
  and a GPU.
- ``sdpa``: ours. Megatron's local spec (its own column/row-parallel linears, so the same
  parameter names and checkpoints) with two modules replaced: :class:`RMSNorm`, which supports
  sequence parallelism (its weight is marked ``sequence_parallel``, so Megatron's
  ``finalize_model_grads`` all-reduces its gradient over TP, the partial sums of each rank's
  sequence shard), and :class:`SdpaAttention`, core attention through torch's
  ``scaled_dot_product_attention`` (flash or memory-efficient kernels on a GPU, torch's fused
  CPU kernel on CPU: no [heads, s, s] score matrix is kept for the backward pass).
- ``local``: Megatron's local spec as it is: ``WrappedTorchNorm`` (which asserts
  ``not config.sequence_parallel``) and the unfused ``DotProductAttention``, which keeps the scores
  and the softmax, [heads / TP, s, s] per row and layer.

``auto`` (the default) is ``te`` where TE is usable, else ``sdpa`` where the run is on a GPU or
uses sequence parallelism, else ``local`` (the CPU runs keep their numerics).
"""

from __future__ import annotations

import copy
import importlib
import math
from typing import Any

import torch
import torch.nn.functional as F

from megatron_pc import platform
from megatron_pc.errors import MegatronPCError

LAYER_SPECS = ("te", "sdpa", "local")
"""The layer specs ``model.layer_spec`` may name (besides ``auto``)."""

TE_HOW_TO_GET = (
    "two ways to get it: the container (docker/Dockerfile builds TE at a pinned version, docs/gpu_install.md), "
    "or `scripts/install.sh --gpu`, which builds the `te` extra where a CUDA toolkit (nvcc) is found"
)
"""The two ways to get TE, named by every refusal that needs it."""


class LayerSpecError(MegatronPCError, ValueError):
    """The layer spec a run asks for cannot be built here; raised before any model is built."""


def transformer_engine_importable() -> bool:
    """``transformer_engine.pytorch`` imports (whether or not there is a GPU to run it on)."""
    try:
        importlib.import_module("transformer_engine.pytorch")
    except ImportError:
        return False
    return True


def transformer_engine_available() -> bool:
    """Transformer Engine imports and there is a GPU to run it on."""
    return platform.on_gpu() and transformer_engine_importable()


def resolve_layer_spec(setting: str, sequence_parallel: bool, on_gpu: bool, te_usable: bool) -> str:
    """The spec ``model.layer_spec = setting`` builds on this machine (``te``, ``sdpa`` or
    ``local``); raises :class:`LayerSpecError` for one that cannot be built, naming TE and the two
    ways to get it."""
    if setting == "auto":
        if te_usable:
            return "te"
        return "sdpa" if on_gpu or sequence_parallel else "local"
    if setting not in LAYER_SPECS:
        raise LayerSpecError(f"model.layer_spec: must be auto, {', '.join(LAYER_SPECS)}, got {setting!r}")
    if setting == "te" and not te_usable:
        where = "there is no GPU" if not on_gpu else "transformer_engine.pytorch does not import"
        raise LayerSpecError(f"model.layer_spec=te needs Transformer Engine on a GPU, but {where} ({TE_HOW_TO_GET}); "
                             "or set model.layer_spec=sdpa (ours: RMSNorm with sequence parallelism, torch SDPA)")
    if setting == "local" and sequence_parallel:
        raise LayerSpecError("model.layer_spec=local (Megatron's local spec) cannot run sequence parallelism: its "
                             "WrappedTorchNorm asserts `not config.sequence_parallel`. Use model.layer_spec=sdpa or te "
                             f"(Transformer Engine; {TE_HOW_TO_GET}), or set training.sequence_parallel=false")
    return setting


def _tp_size(pg_collection: Any) -> int:
    from megatron.core import parallel_state

    if pg_collection is not None and getattr(pg_collection, "tp", None) is not None:
        return pg_collection.tp.size()
    return parallel_state.get_tensor_model_parallel_world_size()


class _RMSNormFunction(torch.autograd.Function):
    """y = x / rms(x) x w, computed in fp32 and returned in x's dtype. Saves for the backward
    only the input (as it is, bf16 on a GPU) and the fp32 reciprocal rms of each row: two
    hidden-width bytes a value and 4 bytes a row, on every device. torch's own ``rms_norm`` keeps
    fp32 copies of the input and the normalised input where it has no fused kernel (CPU)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x32 * rstd * weight.float()).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd
        g = grad.float()
        grad_weight = (g * normed).reshape(-1, normed.shape[-1]).sum(0)
        gw = g * weight.float()
        grad_x = rstd * (gw - normed * (gw * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None


class RMSNorm(torch.nn.Module):
    """RMSNorm in fp32 (as Hugging Face's Qwen and Llama norms) that runs under sequence
    parallelism: each TP rank normalises its sequence shard, and the weight carries
    ``sequence_parallel`` so that Megatron sums its gradient over TP
    (``distributed/finalize_model_grads.py``), as it does for TE's norms. Keeps the input and one
    fp32 value a row for the backward pass (:class:`_RMSNormFunction`)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **unused: Any) -> None:
        super().__init__()
        if config.normalization != "RMSNorm":
            raise LayerSpecError(f"model.layer_spec=sdpa supports RMSNorm models only, got normalization {config.normalization!r}")
        self.hidden_size = hidden_size
        self.eps = eps
        device = None if config.use_cpu_initialization else torch.cuda.current_device()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype, device=device))
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFunction.apply(x, self.weight, self.eps)


class SdpaAttention(torch.nn.Module):
    """Causal core attention through ``torch.nn.functional.scaled_dot_product_attention``, with
    the constructor and ``forward`` of Megatron's ``DotProductAttention``: query [sq, b, heads/TP,
    d], key and value [sk, b, groups/TP, d] -> [sq, b, heads/TP x d]. Grouped-query attention is
    SDPA's own (``enable_gqa``), so keys and values are not repeated. Causal masks only (the
    policy's micro-batches are right-padded rows, no packed sequences)."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None) -> None:
        from megatron.core.transformer.enums import AttnMaskType

        super().__init__()
        if config.context_parallel_size != 1:
            raise LayerSpecError("model.layer_spec=sdpa: context parallelism needs Transformer Engine (model.layer_spec=te)")
        if attn_mask_type != AttnMaskType.causal:
            raise LayerSpecError(f"model.layer_spec=sdpa: causal attention only, got {attn_mask_type}")
        if config.apply_query_key_layer_scaling or config.softmax_type != "vanilla" or config.window_size is not None:
            raise LayerSpecError("model.layer_spec=sdpa: plain softmax attention only (no query-key layer scaling, "
                                 "softmax offsets or sliding windows)")
        self.config = config
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        tp = _tp_size(pg_collection)
        self.heads_per_partition = config.num_attention_heads // tp
        self.hidden_size_per_partition = config.kv_channels * self.heads_per_partition
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                attn_mask_type: Any = None, attention_bias: torch.Tensor | None = None,
                packed_seq_params: Any = None) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None or attention_mask is not None:
            raise LayerSpecError("model.layer_spec=sdpa: no packed sequences, attention bias or explicit mask "
                                 "(the policy's micro-batches are causal, right-padded rows)")
        if query.size(0) != key.size(0):
            raise LayerSpecError(f"model.layer_spec=sdpa: query and key lengths must match (training and scoring "
                                 f"only), got {query.size(0)} and {key.size(0)}")
        # [s, b, n, d] -> [b, n, s, d], SDPA's layout.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True,
                                             scale=self.softmax_scale, enable_gqa=k.size(1) != q.size(1))
        sq, b = query.size(0), query.size(1)
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)


def layer_spec(spec: str, qk_norm: bool):  # -> ModuleSpec
    """The transformer layer spec named ``spec`` (resolved: ``te``, ``sdpa`` or ``local``)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.identity_op import IdentityOp

    if spec == "te":
        return specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=qk_norm)
    local = specs.get_gpt_layer_local_spec(qk_layernorm=qk_norm, normalization="RMSNorm")
    if spec == "local":
        return local
    ours = copy.deepcopy(local)
    layer = ours.submodules
    layer.input_layernorm = RMSNorm
    layer.pre_mlp_layernorm = RMSNorm
    attention = layer.self_attention.submodules
    attention.core_attention = SdpaAttention
    if qk_norm:
        attention.q_layernorm = RMSNorm
        attention.k_layernorm = RMSNorm
    else:
        attention.q_layernorm = attention.k_layernorm = IdentityOp
    return ours


def final_norm(spec: str) -> type:
    """The final norm that goes with ``spec`` (one implementation throughout a model)."""
    if spec == "te":
        from megatron.core.extensions.transformer_engine import TENorm

        return TENorm
    if spec == "sdpa":
        return RMSNorm
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return WrappedTorchNorm
