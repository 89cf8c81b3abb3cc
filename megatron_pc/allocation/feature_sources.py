"""Where the screen's features come from, and the one call the driver makes before every round.

A feature source is a callable ``source(prompt_ids) -> {prompt_id: 1-D array}``: every id asked
for gets a vector of one fixed length. Before each ``plan_round`` the driver calls
:func:`supply_features`, which asks the strategy which prompts it wants features for
(``strategy.feature_requests()``: the new prompts it may draw next, a bounded look-ahead, less
those already cached) and hands the source's answer back (``strategy.observe_features(features,
step)``; step = the policy version the features were computed with). A strategy without the
predictor asks for nothing, so the call costs nothing there.

Sources by ``allocation.history.features``:

- ``ngrams`` (built in): hashed character n-grams of the prompt text, deterministic, numpy only.
- ``policy``: the policy's final hidden state at each prompt's last token. The driver side
  registers it with :func:`register_feature_source` (a factory ``(cfg, data, workers) -> source``);
  until then a run that asks for it is refused with an error naming the field.
"""

from __future__ import annotations

import time
import zlib
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from megatron_pc.errors import ConfigError

if TYPE_CHECKING:
    from megatron_pc.allocation.base import AllocationStrategy

FeatureSource = Callable[[Sequence[int]], Mapping[int, np.ndarray]]
"""Prompt ids (pool indices) in, one feature vector per id out."""
FeatureFactory = Callable[[Any, Any, Any], FeatureSource]
"""``(cfg, data, workers) -> source``: the run's Config, its RunData and its Workers."""

FEATURE_SOURCES: dict[str, FeatureFactory] = {}
"""Factories of the sources other than ``ngrams`` (which needs only the prompt texts), by name."""


def register_feature_source(name: str, factory: FeatureFactory) -> None:
    """Make ``allocation.history.features=name`` available (the driver's policy features)."""
    FEATURE_SOURCES[name] = factory


def ngram_vector(text: str, dim: int, max_n: int) -> np.ndarray:
    """Signed hashed counts of the character 1..max_n-grams of ``text``, scaled to unit length."""
    index, sign = [], []
    data = text.encode("utf-8")
    for n in range(1, max_n + 1):
        for i in range(len(data) - n + 1):
            h = zlib.crc32(data[i : i + n], n)  # the order seeds the hash: "1" and "11" differ in any case
            index.append(h % dim)
            sign.append(1.0 if h & 0x80000000 else -1.0)
    out = np.zeros(dim)
    if index:
        np.add.at(out, np.asarray(index), np.asarray(sign))
        norm = float(np.linalg.norm(out))
        if norm > 0:
            out /= norm
    return out


class NgramFeatures:
    """The built-in source: hashed character n-grams of each prompt's text."""

    def __init__(self, texts: Sequence[str], dim: int = 256, max_n: int = 3) -> None:
        self.texts = texts
        self.dim = dim
        self.max_n = max_n

    def __call__(self, prompts: Sequence[int]) -> dict[int, np.ndarray]:
        """Feature vectors of ``prompts``."""
        return {p: ngram_vector(self.texts[p], self.dim, self.max_n) for p in prompts}


def prompt_text(record: Any) -> str:
    """A prompt record's text (chat prompts: their messages' contents, joined)."""
    prompt = record.prompt
    if isinstance(prompt, str):
        return prompt
    return "\n".join(m.content for m in prompt)


def make_feature_source(cfg: Any, data: Any, workers: Any = None) -> FeatureSource | None:
    """The run's feature source (None when the predictor is off). ``cfg``: the run's Config."""
    h = cfg.allocation.history
    if not h.predictor:  # a strategy without the predictor asks for no features (feature_requests)
        return None
    if h.features == "ngrams":
        return NgramFeatures([prompt_text(r) for r in data.train], h.ngram_dim, h.ngram_max)
    factory = FEATURE_SOURCES.get(h.features)
    if factory is None:
        raise ConfigError(
            "allocation.history.features",
            f"{h.features!r} features are not available in this build (no driver source registered for them); "
            "use 'ngrams', or register the source with megatron_pc.allocation.feature_sources.register_feature_source",
        )
    if workers is None:
        raise ConfigError("allocation.history.features", f"{h.features!r} features need the run's workers, which have not started")
    return factory(cfg, data, workers)


def check_feature_source(cfg: Any) -> None:
    """Refuse, before any worker starts, a feature source this build cannot provide."""
    h = cfg.allocation.history
    if h.predictor and h.features != "ngrams" and h.features not in FEATURE_SOURCES:
        raise ConfigError(
            "allocation.history.features",
            f"{h.features!r} features are not available in this build (no driver source registered for them); use 'ngrams'",
        )


def supply_features(strategy: "AllocationStrategy", source: FeatureSource | None, step: int) -> tuple[int, float]:
    """Give ``strategy`` the features it asks for before its next round. Returns (prompts, seconds)."""
    if source is None:
        return 0, 0.0
    wanted = strategy.feature_requests()
    if not wanted:
        return 0, 0.0
    t0 = time.perf_counter()
    got = source(wanted)
    missing = [p for p in wanted if p not in got]
    if missing:
        raise ValueError(f"the feature source returned no features for {len(missing)} of {len(wanted)} prompts (e.g. {missing[:3]})")
    strategy.observe_features({p: got[p] for p in wanted}, step)
    return len(wanted), time.perf_counter() - t0
