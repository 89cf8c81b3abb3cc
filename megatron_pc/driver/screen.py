"""Screen features: the policy's view of candidate prompts before any is piloted.

:func:`screen_features` looks the prompts' token ids up in the run's token table (as
:func:`megatron_pc.driver.rounds.resolve_round` does), asks the policy for each prompt's final
hidden state at its last token (a prefill on the policy ranks: megatron_pc.training.prompt_features),
and returns ``{prompt: vector}`` with the cost to log as step metrics. What consumes the
vectors is the allocation side's predictor; :class:`Screen` is the loop's side: it registers the
``policy`` source and hands the strategy its features before every round.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from megatron_pc.allocation.feature_sources import check_feature_source, make_feature_source, register_feature_source, supply_features
from megatron_pc.errors import ConfigError

SCREEN_METRICS = ("screen_prompts", "screen_tokens", "screen_padded_tokens", "screen_seconds")
"""The cost of one screen, as step metrics: prompts forwarded, their real tokens, the tokens
forwarded with padding, and wall seconds of the call (driver side, transfers included)."""


class FeatureSource(Protocol):
    """What the screen needs of the policy: megatron_pc.cluster.policy_group.MegatronGroup."""

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


class PolicyFeatures:
    """``allocation.history.features=policy``: the feature source that asks the policy ranks
    (:func:`screen_features`), with the tokens it forwarded counted for the step's metrics."""

    def __init__(self, policy: FeatureSource, token_ids: Sequence[Sequence[int]]) -> None:
        self.policy = policy
        self.token_ids = token_ids
        self.tokens = {"screen_tokens": 0.0, "screen_padded_tokens": 0.0}

    def __call__(self, prompts: Sequence[int]) -> dict[int, np.ndarray]:
        """The features of ``prompts`` (pool indices)."""
        values, cost = screen_features(self.policy, prompts, self.token_ids)
        for key in self.tokens:
            self.tokens[key] += cost[key]
        return values

    def take_tokens(self) -> dict[str, float]:
        """The tokens forwarded since the last call."""
        out, self.tokens = self.tokens, dict.fromkeys(self.tokens, 0.0)
        return out


def _policy_source(cfg: Any, data: Any, workers: Any) -> PolicyFeatures:
    return PolicyFeatures(workers.policy, data.train_tokens)


register_feature_source("policy", _policy_source)


class Screen:
    """The driver's side of the screen (``allocation.history.predictor``): the run's feature
    source (made once the workers run), the features handed to the strategy before each of its
    rounds (allocation.features.supply_features), and their cost per step as metrics:
    ``screen_prompts``, ``time_screen`` and, from the policy, ``screen_tokens`` /
    ``screen_padded_tokens``. Off, it asks nothing and adds no metric."""

    def __init__(self, cfg: Any, data: Any) -> None:
        check_feature_source(cfg)  # a source this build lacks is refused before any worker starts
        h = cfg.allocation.history
        if h.predictor and h.features == "policy" and cfg.training.pipelined:
            raise ConfigError("allocation.history.features", "'policy' features need the policy ranks between updates; with "
                              "training.pipelined the next step's rounds are planned during the update: use 'ngrams'")  # fmt: skip
        self.cfg, self.data = cfg, data
        self.source: Any = None
        self.cost: dict[int, dict[str, float]] = {}

    def start(self, workers: Any) -> None:
        """Make the feature source (the policy's needs the started workers)."""
        self.source = make_feature_source(self.cfg, self.data, workers)

    def before_round(self, strategy: Any, step: int) -> None:
        """The strategy's wanted features, before it plans a round of ``step``."""
        featured, seconds = supply_features(strategy, self.source, step)
        if featured:
            cost = self.cost.setdefault(step, {"screen_prompts": 0.0, "time_screen": 0.0})
            cost["screen_prompts"] += featured
            cost["time_screen"] += seconds
            tokens = self.source.take_tokens() if isinstance(self.source, PolicyFeatures) else {}
            for key, value in tokens.items():
                cost[key] = cost.get(key, 0.0) + value

    def metrics(self, step: int) -> dict[str, float]:
        """``step``'s screening cost (zeros for a step that asked for none), when the screen is on."""
        if self.source is None:
            return {}
        return {"screen_prompts": 0.0, "time_screen": 0.0, **self.cost.pop(step, {})}
