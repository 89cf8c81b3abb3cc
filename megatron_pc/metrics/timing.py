"""Seconds per phase of a step, and the counts of a step's generation that its FLOPs come from."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from megatron_pc.metrics.phases import PHASES, TOTAL

if TYPE_CHECKING:
    from megatron_pc.rollout.base import GenerationResult


class Timer:
    """Seconds spent per phase (:data:`megatron_pc.metrics.phases.PHASES`, or ``total``) within
    one step; ``on_enter(phase)`` is called as each begins (the fault injector's hook)."""

    def __init__(self, on_enter: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.on_enter = on_enter

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        """Time ``phase``; a ValueError names a phase that is not one of a step's."""
        if phase not in PHASES and phase != TOTAL:
            raise ValueError(f"Timer: {phase!r} is not a phase of a step; the phases are {[*PHASES, TOTAL]}")
        if self.on_enter is not None:
            self.on_enter(phase)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def only(self, phases: Sequence[str]) -> dict[str, float]:
        """The seconds of those of ``phases`` that ran."""
        return {p: self.seconds[p] for p in phases if p in self.seconds}


@dataclass
class GenerationTally:
    """What a step's rounds generated: the tokens, the engine calls, and the counts its
    generation FLOPs are computed from (megatron_pc.metrics.mfu)."""

    tokens: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    pairs: float = 0.0
    lengths: list[int] = field(default_factory=list)
    finishes: list[str] = field(default_factory=list)

    def add_round(self, prompt_lens: Sequence[int], out: "GenerationResult", calls: int) -> None:
        """A round's result (``prompt_lens[i]``: the prompt tokens of its request i), made in ``calls`` engine calls."""
        self.tokens += out.generated_tokens
        self.prompt_tokens += out.prompt_tokens
        self.calls += calls
        for p, samples in zip(prompt_lens, out.samples):
            # Causal attention scores the prefill's (query, key) pairs once (the request's samples
            # share it), then each sample's tokens against the prompt and those before them.
            self.pairs += p * p / 2
            for sample in samples:
                r = len(sample.token_ids)
                self.pairs += p * r + r * r / 2
                self.lengths.append(r)
                self.finishes.append(sample.finish_reason)

    def metrics(self) -> dict[str, float]:
        """Response lengths, the share cut at ``max_tokens``, prompt tokens and attention pairs."""
        return {**response_metrics(self.lengths, self.finishes), "gen_prompt_tokens": self.prompt_tokens, "gen_attention_pairs": self.pairs}


def response_metrics(lengths: Sequence[int], finish_reasons: Sequence[str]) -> dict[str, float]:
    """Response length mean and max, and the share cut at ``max_tokens``, of a step's rollouts."""
    if not lengths:
        return {}
    return {
        "response_length_mean": sum(lengths) / len(lengths),
        "response_length_max": float(max(lengths)),
        "truncated_share": sum(1 for f in finish_reasons if f == "length") / len(finish_reasons),
    }
