"""Settings of rollout generation: engines and sampling."""

from __future__ import annotations

from dataclasses import dataclass, field

from megatron_pc.errors import ConfigError


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
    max_tokens: int = 16
    """Maximum response tokens."""
    stop: list[str] = field(default_factory=list)
    """Stop strings."""
    gpu_memory_utilization: float = 0.5
    """vLLM memory fraction on GPU."""
    sync_bucket_mb: int = 64
    """Weight-sync bucket size in MiB."""
    logprob_gap_max: float = 0.05
    """Error when engine and trainer log-probs differ by more than this (mean abs) after a sync."""

    def __post_init__(self) -> None:
        for name in ("engines", "tensor_parallel", "max_tokens", "sync_bucket_mb"):
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
        if self.logprob_gap_max <= 0:
            raise ConfigError("logprob_gap_max", f"must be > 0, got {self.logprob_gap_max}")
