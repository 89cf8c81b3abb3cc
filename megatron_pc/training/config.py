"""Settings of the policy update: optimizer, schedule, loss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from megatron_pc.errors import ConfigError


@dataclass
class TrainingConfig:
    """Optimizer, schedule and policy loss. Defaults: the Qwen3-4B recipe (configs/qwen3_4b.yaml)."""

    steps: int = 500
    """Optimizer steps in the run."""
    lr: float = 1e-6
    """Peak learning rate (reference runs at scale: 1e-6). Tiny CPU model: 5e-5 measured best;
    3e-4 moved a sequence's log-prob by ~3 nats per step and validation accuracy fell."""
    warmup_steps: int = 10
    """Linear warm-up steps."""
    weight_decay: float = 0.1
    """AdamW weight decay (reference runs: 0.1)."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    mini_batch: int = 32
    """Size of one optimizer update within a step, in ``mini_batch_unit`` (default: prompts, so
    train_batch / mini_batch updates per step)."""
    mini_batch_unit: Literal["groups", "call_rollouts"] = "call_rollouts"
    """What ``mini_batch`` counts. ``groups``: training groups (prompts), so every update holds
    whole groups. ``call_rollouts``: the reference recipe's rule (verl multiplies the mini-batch
    by the rollouts per prompt of a generation call): mini_batch x commit_n rollouts for
    Pilot-Commit, mini_batch x n for GRPO and DAPO. With train_batch 128, n 128 = 32 + 96 and
    mini_batch 32 a PC step then takes 6 updates (5 full, the last a third, its loss scaled by
    that share) and a GRPO step 4."""
    micro_batch_tokens: int = 6144
    """Token budget of one packed micro-batch."""
    logprob_chunk_tokens: int | None = 1024
    """Positions whose fp32 log-softmax is computed at once (megatron_pc/training/logprobs.py):
    the full fp32 logits of a micro-batch are never held, only ``logprob_chunk_tokens`` x
    vocabulary / TP x 4 bytes, three times (0.6 GB at 1,024 tokens of Qwen's 151,936-word
    vocabulary at TP 1). The bf16 logits and their gradient are still held whole. None: one
    chunk of the whole micro-batch (the memory of an unchunked implementation)."""
    sequence_parallel: bool | None = None
    """Megatron sequence parallelism: norms, dropout and the residual stream hold seq / TP
    tokens per rank, so activations outside attention and the MLP shrink by TP. None: on when
    TP > 1 on a GPU (gloo, the CPU backend, has no reduce-scatter of tensors, so CPU runs keep
    it off). Micro-batches are padded to a multiple of TP when on."""
    offload_grads: bool | None = None
    """Free the fp32 gradient buffer (4 bytes a local parameter) while the engines generate;
    it is zeroed at the start of every update anyway, so nothing is copied. None: on when
    colocated (engines and policy share the devices), off when split."""
    offload_optimizer: bool | None = None
    """Move Adam's fp32 master weights and moments (12 bytes a local parameter, / DP with the
    distributed optimizer) to host memory while the engines generate, back before the next
    update. None: on when colocated, off when split. Ignored for fp32 parameters (there the
    optimizer's parameters are the model's, which generation's weight sync reads)."""
    empty_cache: bool | None = None
    """Return the caching allocator's free blocks to the device (torch.cuda.empty_cache)
    before the engines wake: what the update freed stays reserved by torch otherwise, and the
    engines cannot have it. None: on when colocated, off when split."""
    clip_low: float = 0.2
    """PPO ratio clip below 1 (eps_low)."""
    clip_high: float = 0.28
    """PPO ratio clip above 1 (eps_high; clip-higher)."""
    dual_clip: float | None = 10.0
    """Dual-clip constant c for negative advantages; None disables it."""
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    """How per-token losses are averaged."""
    loss_denominator: Literal["all", "informative"] = "all"
    """What the loss mean of an update divides by (``loss_agg``'s count of tokens or sequences).
    ``all``: every trained row, as the reference recipe (the rows of zero-variance groups carry no
    policy gradient, so their share dilutes the gradient). ``informative``: only the rows of groups
    with a nonzero advantage, so the policy-gradient loss is the ``all`` one times
    all / informative (for Dr. GRPO-style comparisons). An update holding no informative row keeps
    the ``all`` count (its policy-gradient loss is 0 either way; KL and entropy terms use the same
    denominator)."""
    kl_coef: float = 0.0
    """Weight of the KL loss against the reference model (0: no reference model is run)."""
    kl_estimator: Literal["k1", "k3"] = "k3"
    """KL estimator."""
    entropy_coef: float = 0.0
    """Entropy bonus weight."""
    std_normalize: bool = True
    """Divide group advantages by the group's reward std (GRPO)."""
    tis_cap: float | None = None
    """Truncated importance weight against the generating engine's log-probs; None: off."""
    validate_every: int = 5
    """Validation every K steps (and at the start and the end)."""
    validate_every_rollouts: int | None = None
    """Validation on a rollout schedule instead: at the end of each step whose generated rollouts
    (cumulative, every kind counted) cross a multiple of K, and at the start and the end. None:
    every ``validate_every`` steps. Strategies that spend rollouts at different rates are then
    measured at the same spends (``megatron-pc bench rollouts --budget``)."""
    rollout_budget: int | None = None
    """Stop after the step whose cumulative generated rollouts reach this many (``steps`` stays
    the most steps run). None: run ``steps`` steps."""
    save_every: int = 20
    """Checkpoint every K steps (and on SIGTERM/SIGUSR1)."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept in the run directory (older ones are deleted)."""
    checkpoint_checksums: bool = True
    """Record the sha256 of every checkpoint file, so that any changed byte is caught on resume.
    Hashing reads each checkpoint back once when it is saved and once when it is resumed from
    (on threads: disk bandwidth bounds it). False records sizes only, for checkpoints too large
    to read back within the save interval."""
    pipelined: bool = False
    """Split placement only: the engines generate step t+1 (with the weights of step t-1) while
    the policy trains step t; the weights are pushed when both are done. Every rollout is then
    one step off-policy (recorded; ``tis_cap`` corrects it)."""
    val_samples: int = 4
    """Sampled responses per validation prompt (at the rollout temperature, fixed seed); the
    validation accuracy is their mean. A greedy accuracy is reported beside it."""
    val_greedy: bool = True
    """Also generate one greedy response per validation prompt and report ``val_greedy_accuracy``.
    False halves a one-sample validation's cost (the equal-budget benchmark turns it off: its
    figures use the sampled accuracy only)."""

    def __post_init__(self) -> None:
        if self.logprob_chunk_tokens is not None and self.logprob_chunk_tokens < 1:
            raise ConfigError("logprob_chunk_tokens", f"must be >= 1 (or null for one chunk), got {self.logprob_chunk_tokens}")
        for name in ("steps", "mini_batch", "micro_batch_tokens", "validate_every", "save_every", "keep_checkpoints", "val_samples"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("validate_every_rollouts", "rollout_budget"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1 (or null), got {getattr(self, name)}")
        if self.lr <= 0:
            raise ConfigError("lr", f"must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ConfigError("warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(name, f"must lie in [0, 1), got {getattr(self, name)}")
        for name in ("clip_low", "clip_high"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ConfigError(name, f"must lie in (0, 1), got {getattr(self, name)}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ConfigError("dual_clip", f"must be > 1 (or null to disable), got {self.dual_clip}")
        for name in ("grad_clip", "kl_coef", "entropy_coef", "weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ConfigError("tis_cap", f"must be > 0 (or null to disable), got {self.tis_cap}")

    def budget_spent(self, cum_generated: float) -> bool:
        """True once ``cum_generated`` rollouts reach ``rollout_budget`` (never without one)."""
        return self.rollout_budget is not None and cum_generated >= self.rollout_budget

    def validation_due(self, step: int, cum_generated: float, generated: float) -> bool:
        """Whether step ``step``, which brought the cumulative rollouts to ``cum_generated`` with
        ``generated`` of its own, ends with a validation (the last step always does)."""
        if step == self.steps or self.budget_spent(cum_generated):
            return True
        if self.validate_every_rollouts is None:
            return step % self.validate_every == 0
        k = self.validate_every_rollouts
        return int(cum_generated // k) > int((cum_generated - generated) // k)

    def memory_settings(self, colocated: bool, tensor_parallel: int, on_gpu: bool) -> MemorySettings:
        """The memory settings with every None resolved for this placement and device."""
        default = colocated
        return MemorySettings(
            logprob_chunk_tokens=self.logprob_chunk_tokens,
            sequence_parallel=self.sequence_parallel if self.sequence_parallel is not None else tensor_parallel > 1 and on_gpu,
            offload_grads=self.offload_grads if self.offload_grads is not None else default,
            offload_optimizer=self.offload_optimizer if self.offload_optimizer is not None else default,
            empty_cache=self.empty_cache if self.empty_cache is not None else default,
        )


@dataclass(frozen=True)
class MemorySettings:
    """:class:`TrainingConfig`'s memory fields resolved (no None but the chunk size): what the
    worker does and what ``megatron-pc plan`` counts. See the fields of TrainingConfig."""

    logprob_chunk_tokens: int | None
    sequence_parallel: bool
    offload_grads: bool
    offload_optimizer: bool
    empty_cache: bool
