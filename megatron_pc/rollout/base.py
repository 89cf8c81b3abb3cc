"""The one interface every generation engine implements, and the plain types it speaks.

One :meth:`RolloutEngine.generate` call serves a whole generation round: each request
carries its own number of samples ``n``, so pilot requests (``n_pilot`` each) and commit
requests (``n_commit`` each) go to the engine together ("binding") and share its batch.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from megatron_pc.errors import MegatronPCError

if TYPE_CHECKING:
    import torch

    from megatron_pc.rollout.config import RolloutConfig
    from megatron_pc.weight_sync.channel import BucketPayload, ChannelSpec

FinishReason = Literal["stop", "length", "abort"]


class EngineError(MegatronPCError, RuntimeError):
    """A generation engine failed or is dead; ``engine`` names it so the group can restart it."""

    def __init__(self, engine: str, reason: str) -> None:
        self.engine = engine
        self.reason = reason
        super().__init__(f"rollout engine {engine}: {reason}")


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling parameters shared by all requests of one call.

    ``seed`` None leaves randomness to the engine's own generator (fast, reproducible for the
    same sequence of calls); an integer seeds every request separately (reproducible per
    request whatever else is in the batch, a little slower).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    """Keep sampling past <eos> up to max_tokens (throughput benchmarks only, never for RL)."""

    @classmethod
    def from_config(cls, config: "RolloutConfig", seed: int | None = None) -> "SamplingSettings":
        """The sampling part of a validated :class:`RolloutConfig`."""
        return cls(
            temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
            max_tokens=config.max_tokens, stop=tuple(config.stop), seed=seed,
        )


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt (token ids, including any <bos>) and how many samples to draw from it."""

    prompt_token_ids: tuple[int, ...]
    n: int

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"GenerationRequest.n must be >= 1, got {self.n}")
        if not self.prompt_token_ids:
            raise ValueError("GenerationRequest.prompt_token_ids must not be empty")


@dataclass
class Sample:
    """One sampled response: its tokens, the log-prob of each under the sampling
    distribution, and why it ended (``stop``: <eos> or a stop string; ``length``: max_tokens)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


@dataclass
class GenerationResult:
    """Per request (in request order) its ``n`` samples in order, plus counts and timing."""

    samples: list[list[Sample]]
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    per_engine_seconds: list[float] = field(default_factory=list)


def merge_results(outs: Sequence[GenerationResult], parts: Sequence[Sequence[int]], n: int) -> GenerationResult:
    """The results of calls that each served ``parts[k]`` (request indices) of ``n`` requests, as
    one result in request order."""
    samples: list[list[Sample]] = [[] for _ in range(n)]
    for out, part in zip(outs, parts):
        if len(out.samples) != len(part):
            raise ValueError(f"a call served {len(part)} requests but returned samples for {len(out.samples)}")
        for i, got in zip(part, out.samples):
            samples[i] = got
    return GenerationResult(samples, sum(o.prompt_tokens for o in outs), sum(o.generated_tokens for o in outs), sum(o.seconds for o in outs))


@dataclass
class WeightPushStats:
    """How long a weight push took and how much it moved."""

    tensors: int
    bytes: int
    seconds: float


class RolloutEngine(abc.ABC):
    """A generation engine: samples responses, takes new weights, can sleep while training runs."""

    name: str
    """Shown in logs and in :class:`EngineError`."""

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSettings) -> GenerationResult:
        """Draw ``request.n`` samples for every request; raises :class:`EngineError` on failure."""

    @abc.abstractmethod
    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-prob of every token after the first given its prefix (temperature 1), per sequence."""

    @abc.abstractmethod
    def update_weights(self, weights: "Iterable[tuple[str, torch.Tensor]] | BucketPayload") -> WeightPushStats:
        """Load full tensors by Hugging Face name (any subset, in any order) into the running
        engine: given as pairs, or as one bucket's payload of the weight-sync channel the engine
        joined (:meth:`join_weight_channel`), which its workers receive themselves."""

    @property
    def weight_receivers(self) -> list[str]:
        """The engine's receive ends in a weight-sync channel (one per worker), in rank order."""
        return [self.name]

    def join_weight_channel(self, spec: "ChannelSpec") -> None:
        """Join a sender's weight-sync channel (megatron_pc.weight_sync); an engine without
        one takes its weights as pairs only."""
        raise EngineError(self.name, f"cannot join a {spec.transport} weight-sync channel: it takes weights as (name, tensor) pairs only")

    def leave_weight_channel(self) -> None:
        """Leave the channel, if any."""

    @property
    def supports_sleep(self) -> bool:
        """Whether :meth:`sleep` really frees accelerator memory (False: it is a no-op)."""
        return False

    def sleep(self) -> None:
        """Free accelerator memory while training runs (no-op where unsupported)."""

    def wake(self) -> None:
        """Undo :meth:`sleep` before the next :meth:`generate` (no-op where unsupported)."""

    @property
    def alive(self) -> bool:
        """False once the engine failed or was shut down."""
        return True

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release the engine; further calls raise :class:`EngineError`. Safe to call twice."""


def derive_seed(seed: int, *parts: int | str) -> int:
    """A stable 62-bit seed from ``seed`` and labels (engine index, request index).

    Hashing keeps derived seeds far apart: vLLM seeds the i-th sample of a request with
    ``seed + i``, so consecutive request seeds would make two requests share samples.
    """
    text = ":".join(str(p) for p in (seed, *parts)).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 2
