"""Build a Megatron-Core ``GPTModel`` for one pipeline stage from an HF architecture.

Call after ``megatron.core.parallel_state.initialize_model_parallel``: the stage (which
layers, whether it holds the embedding / output layer) and the TP shard come from there.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F

from megatron_pc import platform
from megatron_pc.models.hf_config import HFArch, check_parallel_sizes
from megatron_pc.models.layer_specs import final_norm, layer_spec, resolve_layer_spec, transformer_engine_available

logger = logging.getLogger(__name__)

VOCAB_PAD_MULTIPLE = 128
"""The embedding is padded to a multiple of lcm(128, TP) rows, so that the padded size does
not change between TP sizes that divide 128 (checkpoints reshard between them)."""


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """Rows of the (vocab-parallel) embedding and output layer."""
    multiple = math.lcm(VOCAB_PAD_MULTIPLE, tp)
    return -(-vocab_size // multiple) * multiple


def block_spec(arch: HFArch, config, spec: str):  # -> TransformerBlockSubmodules
    """This stage's layers plus the final norm, both from the layer spec ``spec`` (resolved:
    ``te``, ``sdpa`` or ``local``, megatron_pc/models/layer_specs.py).

    Passing only a layer spec would let Megatron choose the final norm from whatever imported
    (TE, else Apex's FusedLayerNorm, which rejects RMSNorm, else torch): the local spec on a
    machine with Apex would fail, and one with TE would mix implementations.
    """
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    layers = get_num_layers_to_build(config)
    return TransformerBlockSubmodules(layer_specs=[layer_spec(spec, arch.family.qk_norm)] * layers, layer_norm=final_norm(spec))


def transformer_config(arch: HFArch, tp: int, pp: int, params_dtype: torch.dtype, sequence_parallel: bool = False):  # -> TransformerConfig
    """The Megatron TransformerConfig equivalent to ``arch`` (dropout off: RL needs exact
    log-probs, and CPU has no CUDA RNG for dropout anyway)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    check_parallel_sizes(arch, tp, pp)
    on_gpu = platform.on_gpu()
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.intermediate_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.family.qkv_bias,
        qk_layernorm=arch.family.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=sequence_parallel,  # training.sequence_parallel (TP > 1 only)
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        # Parameters are built on CPU then moved; on CPU this is the only option.
        use_cpu_initialization=not on_gpu,
        perform_initialization=True,
        # Fused kernels need CUDA (and Apex/TE); the unfused paths are exact.
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        # Micro-batches are packed by a token budget, so their shapes vary.
        variable_seq_lengths=True,
        # Dense models have no MoE, but the config rejects variable lengths with the
        # default (allgather) dispatcher.
        moe_token_dispatcher_type="alltoall",
    )


def build_gpt_model(arch: HFArch, tp: int, pp: int, params_dtype: torch.dtype, layer_spec_setting: str = "auto",
                    vp_stage: int | None = None, sequence_parallel: bool = False):  # -> GPTModel
    """The GPTModel of this rank's pipeline stage and TP shard, built with the layer spec
    ``layer_spec_setting`` resolves to here (``model.layer_spec``; a spec that cannot be built
    is refused before any parameter is made)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    spec = resolve_layer_spec(layer_spec_setting, sequence_parallel, platform.on_gpu(), transformer_engine_available())
    config = transformer_config(arch, tp, pp, params_dtype, sequence_parallel)
    model = GPTModel(
        config=config,
        transformer_layer_spec=block_spec(arch, config, spec),
        vocab_size=padded_vocab_size(arch.vocab_size, tp),
        max_sequence_length=arch.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=True),
        post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=True),
        parallel_output=True,
        share_embeddings_and_output_weights=arch.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta) if float(arch.rope_theta).is_integer() else arch.rope_theta,
        rope_scaling=arch.rope_scaling_factor is not None,
        rope_scaling_factor=arch.rope_scaling_factor or 8.0,
    )
    if platform.on_gpu():
        model.cuda(torch.cuda.current_device())
    return model
