"""Screen features: the policy's view of candidate prompts before any is piloted.

:func:`screen_features` looks the prompts' token ids up in the run's token table (as
:func:`megatron_pc.driver.rollouts.resolve_round` does), asks the policy for each prompt's final
hidden state at its last token (a prefill on the policy ranks: megatron_pc.training.features),
and returns ``{prompt: vector}`` with the cost to log as step metrics. What consumes the
vectors (the allocation side's predictor) and when to call this (once per step, after the
update) is the caller's business.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

SCREEN_METRICS = ("screen_prompts", "screen_tokens", "screen_padded_tokens", "screen_seconds")
"""The cost of one screen, as step metrics: prompts forwarded, their real tokens, the tokens
forwarded with padding, and wall seconds of the call (driver side, transfers included)."""


class FeatureSource(Protocol):
    """What the screen needs of the policy: megatron_pc.cluster.groups.MegatronGroup."""

    def prompt_features(self, prompts: Sequence[np.ndarray]) -> tuple[np.ndarray, dict[str, int]]:
        """``[len(prompts), hidden]`` fp32 features in order, and ``tokens`` / ``padded_tokens``."""


def screen_features(policy: FeatureSource, prompt_ids: Sequence[int], token_ids: Sequence[Sequence[int]],
                    ) -> tuple[dict[int, np.ndarray], dict[str, float]]:
    """The policy's final hidden state (after the final norm, fp32) at the last token of each
    prompt of ``prompt_ids`` (pool indices into ``token_ids``, the run's token table; repeats
    are forwarded once), and the cost as :data:`SCREEN_METRICS`."""
    ids = list(dict.fromkeys(int(p) for p in prompt_ids))
    if any(p < 0 or p >= len(token_ids) for p in ids):
        bad = next(p for p in ids if p < 0 or p >= len(token_ids))
        raise IndexError(f"screen: prompt {bad} is not in the token table of {len(token_ids)} prompts")
    prompts = [np.asarray(token_ids[p], dtype=np.int32) for p in ids]
    start = time.perf_counter()
    values, tokens = policy.prompt_features(prompts) if prompts else (np.zeros((0, 0), np.float32), {"tokens": 0, "padded_tokens": 0})
    cost = {"screen_prompts": float(len(ids)), "screen_tokens": float(tokens["tokens"]),
            "screen_padded_tokens": float(tokens["padded_tokens"]), "screen_seconds": time.perf_counter() - start}
    return {p: values[k] for k, p in enumerate(ids)}, cost
