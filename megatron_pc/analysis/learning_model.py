"""How far one training step moves the simulated policy's skill (``megatron-pc simulate``).

Two learning models, chosen by ``SimConfig.learning`` (``--learning``):

* ``linear`` (the first simulator): the skill moves by ``lr * mean over the step's groups of
  sqrt(q (1 - q)) / 0.5``: in proportion to the informative groups of the batch, whatever the
  number of optimizer updates. On the measured runs it picks the wrong winner against GRPO in
  every regime (docs/benchmarks.md, "The simulator beside it").
* ``fitted``: one optimizer update on G informative groups (groups whose rewards differ) of mean
  reward variance v (the groups' q (1 - q)) moves the skill by a power law, and a step of U
  updates by

      delta_s = a * U^b * (G / U)^c * (v / 0.25)^e / (1 + k N)     (0 when no group is informative)

  ``c < 1`` is what the runs show: learning grows less than linearly with the informative groups
  of an update (the optimizer's step has a bounded size: Adam, and the gradient norm clipped at
  1.0 on most GRPO steps). ``b`` prices the update count: 4-6 updates a step learn much more
  per rollout than 1. ``e`` weighs the groups' reward variance (the gradient of one group grows
  with its reward std). N counts the updates taken so far, the step's own included: the tiny
  model's accuracy curves flatten with training (its skill grows about as log N at a constant
  batch), and k is how fast. The five numbers are fitted to measured runs by
  :mod:`megatron_pc.analysis.simulate_fit` (``megatron-pc fit-simulator BENCH_DIR...``) and kept
  in ``learning_model.json`` next to this module, with the held-out error of the prediction.

:class:`SkillScale` maps validation accuracy to skill and back for a policy whose prompts start
from measured success rates (the Rasch model of :mod:`megatron_pc.analysis.simulate`): the fit
reads measured accuracy curves as skill curves through it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from megatron_pc.errors import ConfigError

PARAMS_FILE = Path(__file__).with_name("learning_model.json")
"""The fitted parameters the simulator uses by default (written by ``megatron-pc fit-simulator``)."""
FULL_VARIANCE = 0.25
"""Reward variance of a group solved half the time: the unit of v."""


@dataclass(frozen=True)
class FittedLearning:
    """delta_s = scale * U^updates_exp * (G / U)^groups_exp * (v / 0.25)^variance_exp / (1 + saturation * N)."""

    scale: float
    """a: skill gained by one update on one informative group of variance 1/4."""
    updates_exp: float
    """b: how the step's gain grows with its optimizer updates U."""
    groups_exp: float
    """c: how one update's gain grows with its informative groups G / U."""
    variance_exp: float
    """e: how the gain grows with the informative groups' mean reward variance v."""
    saturation: float = 0.0
    """k: learning slows with the optimizer updates taken so far, N: a step's gain is divided
    by 1 + k N (N counting the step's own updates)."""

    def step_gain(self, updates: float, informative: float, variance: float, updates_so_far: float) -> float:
        """Skill gained by a step of ``updates`` updates on ``informative`` informative groups of
        mean reward variance ``variance``, ``updates_so_far`` updates (its own included) into training."""
        if informative <= 0 or updates <= 0 or variance <= 0:
            return 0.0
        per_update = informative / updates
        gain = self.scale * updates**self.updates_exp * per_update**self.groups_exp * (variance / FULL_VARIANCE) ** self.variance_exp
        return gain / (1.0 + self.saturation * updates_so_far)

    def as_dict(self) -> dict[str, float]:
        """The four parameters by name."""
        return asdict(self)


def load_fitted(path: str | Path | None = None) -> tuple[FittedLearning, dict[str, Any]]:
    """The fitted model and its whole record (held-out error, what it was fitted on, the command
    that refits it) from ``path`` (default: :data:`PARAMS_FILE`)."""
    source = Path(path) if path is not None else PARAMS_FILE
    try:
        record = json.loads(source.read_text())
        params = record["params"]
        model = FittedLearning(**{k: float(params[k]) for k in ("scale", "updates_exp", "groups_exp", "variance_exp", "saturation")})
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError("--learning-params", f"cannot read fitted learning parameters from {source}: {err}") from None
    if not model.scale > 0:
        raise ConfigError("--learning-params", f"{source}: params.scale must be > 0, got {model.scale}")
    return model, record


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class SkillScale:
    """Validation accuracy <-> skill of a Rasch policy whose prompts start from measured success
    rates: accuracy(s) = mean over prompts of sigmoid(s + logit p), each measured rate k/m
    standing for p ~ Beta(k + 1/2, m - k + 1/2) (``draws`` fixed draws per rate, seeded, so the
    scale is deterministic). Skill 0 is the measured start model."""

    GRID = np.linspace(-12.0, 12.0, 4801)

    def __init__(self, rates: list[float], samples: int, draws: int = 16, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        k = np.repeat(np.asarray(rates, dtype=np.float64) * samples, draws)
        p = np.clip(rng.beta(k + 0.5, samples - k + 0.5), 1e-9, 1.0 - 1e-9)
        logits = np.log(p / (1.0 - p))
        self._acc = np.array([float(_sigmoid(s + logits).mean()) for s in self.GRID])

    def accuracy(self, skill: np.ndarray | float) -> np.ndarray:
        """Expected validation accuracy at ``skill``."""
        return np.interp(skill, self.GRID, self._acc)

    def skill(self, accuracy: np.ndarray | float) -> np.ndarray:
        """The skill whose expected accuracy is ``accuracy`` (clamped to the grid)."""
        return np.interp(accuracy, self._acc, self.GRID)


def check_learning(kind: str) -> None:
    """Refuse an unknown ``--learning``."""
    if kind not in ("linear", "fitted"):
        raise ConfigError("--learning", f"must be 'linear' or 'fitted', got {kind!r}")


def format_error(record: dict[str, Any]) -> str:
    """One line: the fitted model's held-out error, as its record states it."""
    held = record.get("held_out", {})
    parts = []
    for fold, name in (("seed", "a held-out seed"), ("regime", "a held-out regime")):
        figures = held.get(fold)
        if figures and figures.get("mean_abs_error") is not None:
            parts.append(f"{figures['mean_abs_error']:.0%} on {name} ({figures['within_20']}/{figures['ratios']} ratios within 20%)")
    if not parts:
        return "held-out error: not measured"
    return "held-out error of the predicted rollout ratios (mean |predicted / measured - 1|): " + "; ".join(parts)


def model_error_hint(kind: str, record: dict[str, Any] | None) -> str:
    """What the simulator's output says about its own accuracy."""
    if kind == "fitted" and record is not None:
        return f"learning model: fitted ({record.get('form', '')}); {format_error(record)}"
    linear = (record or {}).get("held_out", {}).get("linear")
    if linear and linear.get("mean_abs_error") is not None:
        return (f"learning model: linear; its error on the measured runs: {linear['mean_abs_error']:.0%} mean "
                f"({linear['within_20']}/{linear['ratios']} ratios within 20%)")  # fmt: skip
    return "learning model: linear (error not measured)"
