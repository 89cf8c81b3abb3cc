"""The screen's predictor: every prompt's success rate from its features, before it is piloted.

An online ridge regression from a prompt's feature vector x (plus an intercept) to the success
rate y = successes / n of each observed outcome (pilot, commit or direct, in any epoch). The fit
keeps only its sufficient statistics ``sum w x x^T`` and ``sum w x y``, faded like the prompt
history: an outcome made h steps ago counts ``w = 2 ** (-h / recency_half_life)``. It is solved
again once per step, so every step's predictions use every outcome seen before the step.

A prediction m becomes the prompt's prior ``Beta(m s, (1 - m) s)``. The strength s says how far
the true success rates lie from the predictions. It is estimated by moments from the predictor's
own out-of-sample errors: for each pilot or direct outcome (x successes of n) of a prompt
predicted m before it was seen, ``x (x - 1) / (n (n - 1)) - 2 m x / n + m^2`` is an unbiased
estimate of ``(p - m)^2``, and a Beta with mean m has variance ``m (1 - m) / (s + 1)``. Features
that predict nothing give the population's spread, so the prior falls back to the population's.

With ``calibration_bins`` (the default), the prior is calibrated by the prediction's bin instead:
the predictions are cut into equal bins on [0, 1], and each bin keeps the same faded moments of
the outcomes of the prompts predicted in it (before they were seen), so a bin's prior is the
Beta fitted to what prompts predicted alike turned out to be, as the population prior is fitted
to the whole pool. A linear fit ranks prompts well but squeezes a U-shaped pool toward the middle;
the bins undo that, and give a sure prior where the predictions are sure (a bin of prompts that
were all never solved) and a wide one where they are not. A bin with too few outcomes falls back
to ``Beta(m s, (1 - m) s)``.

Pure numpy, deterministic; the whole state (features waiting to be used, the statistics, the
weights, the predictions made) goes into the strategy's checkpoint state.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Mapping

import numpy as np

from megatron_pc.allocation.config import HistoryConfig
from megatron_pc.allocation.history import add_outcome

PREDICTION_DECIMALS = 2
"""Predictions are rounded so that prompts predicted alike share one prior (and its cached pmf)."""
MIN_PRIOR = 0.02
"""Smallest Beta parameter of a predicted prior."""
PROJECTION_SEED = 20_260_528
BIN_MIN_WEIGHT = 16.0
"""(Faded) outcomes a calibration bin needs before its own prior is used."""


class ScreenPredictor:
    """Features of the prompts about to be drawn, the online ridge fit, and its predictions."""

    def __init__(self, h: HistoryConfig) -> None:
        self.lam = h.ridge_lambda
        self.half_life = h.recency_half_life
        self.min_fit = h.min_fit
        self.fixed_strength = h.prior_strength
        self.max_age = h.feature_max_age
        self.bins = h.calibration_bins
        self.max_features = h.max_features
        self._projection: np.ndarray | None = None  # wider features are projected to max_features (seeded, fixed)
        self._bin_sums = [[0.0, 0.0, 0.0] for _ in range(self.bins)]  # per bin, faded: outcomes, sum of p, sum of p^2 estimates
        self.dim: int | None = None
        self._features: dict[int, np.ndarray] = {}  # prompt -> feature vector
        self._feature_step: dict[int, int] = {}  # prompt -> the step its features were computed at
        self._pred: dict[int, float] = {}  # prompt -> the prediction under the current fit
        self._xtx: np.ndarray | None = None  # faded sum of w x x^T (x with the intercept last)
        self._xty: np.ndarray | None = None
        self._weight = 0.0  # faded number of outcomes in the fit
        self._resid = [0.0, 0.0, 0.0]  # faded: outcomes, sum of (p - m)^2 estimates, sum of m (1 - m)
        self._stats_step = 0
        self._w: np.ndarray | None = None
        self._fit_step = -1
        self._strength = 1.0
        self._bin_prior: list[tuple[float, float] | None] = [None] * self.bins
        self._rows: list[tuple[np.ndarray, float]] = []  # outcomes observed this round, added in one batch

    # ---- features ---------------------------------------------------------------------
    def wanted(self, upcoming: list[int], step: int) -> list[int]:
        """Those of ``upcoming`` without features (or with features older than ``feature_max_age``)."""
        if self.max_age is None:
            return [p for p in upcoming if p not in self._features]
        return [p for p in upcoming if p not in self._features or step - self._feature_step[p] > self.max_age]

    def add_features(self, features: Mapping[int, Any], step: int) -> None:
        """Cache each prompt's feature vector, computed at ``step`` (replacing older ones)."""
        if not features:
            return
        prompts = [int(p) for p in features]
        rows = [np.asarray(features[p], dtype=np.float64).reshape(-1) for p in features]
        sizes = {r.size for r in rows}
        if self.dim is None and len(sizes) == 1:
            self.dim = sizes.pop()
            sizes = {self.dim}
        if sizes != {self.dim}:
            raise ValueError(f"features: every vector must have {self.dim} values, got lengths {sorted(sizes)}")
        x = np.stack(rows)
        if not np.isfinite(x).all():
            bad = [p for p, r in zip(prompts, rows) if not np.isfinite(r).all()]
            raise ValueError(f"features of prompts {bad[:5]} hold non-finite values")
        if self.dim > self.max_features:
            x = x @ self.projection()
        x = x.astype(np.float32)  # kept in float32 (half the checkpoint); computed with in float64
        for i, p in enumerate(prompts):
            self._features[p] = x[i]
            self._feature_step[p] = int(step)
            self._pred.pop(p, None)

    def projection(self) -> np.ndarray:
        """The fixed random projection of features wider than ``max_features`` (a Johnson-Lindenstrauss
        map: dot products are kept on average, the ridge solve stays small)."""
        if self._projection is None:
            assert self.dim is not None
            rng = np.random.default_rng(PROJECTION_SEED)
            self._projection = rng.standard_normal((self.dim, self.max_features)) / math.sqrt(self.max_features)
        return self._projection

    def has_features(self, prompt: int) -> bool:
        """Whether ``prompt``'s features are cached."""
        return prompt in self._features

    def prune(self, keep: set[int]) -> None:
        """Forget the features of every prompt not in ``keep`` (prompts drawn soon or waiting for a commit)."""
        for p in [p for p in self._features if p not in keep]:
            del self._features[p], self._feature_step[p]
            self._pred.pop(p, None)

    # ---- predictions ------------------------------------------------------------------
    def prediction(self, prompt: int, step: int) -> float | None:
        """The predicted success rate of ``prompt`` (None: no features, or too little fitted yet)."""
        if self._fit_step != step:
            self.fit(step)
        if self._w is None:
            return None
        m = self._pred.get(prompt)
        if m is None:
            x = self._features.get(prompt)
            if x is None:
                return None
            # One dot product per prompt, always the same one: a resumed run recomputes it bit for bit.
            m = min(max(round(float(x.astype(np.float64) @ self._w[:-1]) + float(self._w[-1]), PREDICTION_DECIMALS), 0.005), 0.995)
            self._pred[prompt] = m
        return m

    def prior(self, prompt: int, step: int) -> tuple[float, float] | None:
        """The prompt's predicted prior Beta(a, b), or None (the population prior then applies)."""
        m = self.prediction(prompt, step)
        if m is None:
            return None
        if self.bins:
            prior = self._bin_prior[min(int(m * self.bins), self.bins - 1)]
            if prior is not None:
                return prior
        return max(m * self._strength, MIN_PRIOR), max((1.0 - m) * self._strength, MIN_PRIOR)

    def calibrated(self, prompt: int, step: int) -> bool:
        """Whether the prompt's prior is its bin's measured one (or bins are off): only then may a
        prediction stand for the prompt's own evidence when screening."""
        m = self.prediction(prompt, step)
        return m is not None and (not self.bins or self._bin_prior[min(int(m * self.bins), self.bins - 1)] is not None)

    def _fit_bins(self) -> None:
        """Each bin's prior: the Beta fitted by moments to the outcomes of the prompts predicted in it."""
        self._bin_prior = []
        for weight, s1, s2 in self._bin_sums:
            if weight < BIN_MIN_WEIGHT:
                self._bin_prior.append(None)
                continue
            raw = s1 / weight
            var = s2 / weight - raw * raw
            mean = (s1 + 0.5) / (weight + 1.0)  # a bin whose prompts all failed still leaves a little room
            # A bin's prior is no surer than the outcomes behind it: a + b <= the bin's (faded) outcomes.
            most = max(min(weight, 1000.0), 0.1)
            strength = min(max(mean * (1.0 - mean) / var - 1.0, 0.1), most) if var > 0 else most
            strength = float(f"{strength:.2g}")  # two significant digits: few distinct priors, cached pmfs
            mean = round(mean, PREDICTION_DECIMALS + 1)
            self._bin_prior.append((max(mean * strength, MIN_PRIOR), max((1.0 - mean) * strength, MIN_PRIOR)))

    @property
    def strength(self) -> float:
        """a + b of the predicted priors of the current fit."""
        return self._strength

    @property
    def fit_weight(self) -> float:
        """Faded outcomes behind the statistics."""
        return self._weight

    def fit(self, step: int) -> None:
        """Solve the ridge regression on every outcome seen so far, faded to ``step`` (prompts are
        predicted when first asked for)."""
        self._fade_to(step)
        self._fit_step = step
        self._pred = {}
        self._fit_bins()
        if self._xtx is None or self._xty is None or self._weight < max(self.min_fit, 1e-9):
            self._w = None
            return
        d = self._xtx.shape[0]
        penalty = np.full(d, self.lam)
        penalty[-1] = 1e-6  # the intercept is (almost) not penalised
        self._w = np.linalg.solve(self._xtx + np.diag(penalty), self._xty)
        n, r, v = self._resid
        if self.fixed_strength is not None:
            self._strength = float(self.fixed_strength)
        elif n < max(self.min_fit, 1.0):
            self._strength = 1.0  # too few honest errors yet: a weak prior
        else:  # predictions closer than binomial noise can tell: as strong as allowed
            # Two significant digits: prompts predicted alike then share one prior (and its cached pmf).
            # No surer than the (faded) outcomes behind the estimate.
            self._strength = float(f"{min(max(v / r - 1.0, 0.1), n, 1000.0):.2g}") if r > 0 else float(f"{min(n, 1000.0):.2g}")

    # ---- outcomes ---------------------------------------------------------------------
    def observe(self, prompt: int, successes: int, n: int, predicted: float | None) -> None:
        """One outcome of ``prompt``: ``successes`` of ``n`` rollouts. ``predicted``: the prediction
        made for it before it was seen (pilots and directs), which estimates the prior strength."""
        x = self._features.get(prompt)
        if x is not None and n > 0:
            self._rows.append((x, successes / n))
        if predicted is not None and n >= 2:
            m = predicted
            if self.bins:
                add_outcome(self._bin_sums[min(int(m * self.bins), self.bins - 1)], successes, n)
            self._resid[0] += 1.0
            self._resid[1] += successes * (successes - 1) / (n * (n - 1)) - 2.0 * m * successes / n + m * m
            self._resid[2] += m * (1.0 - m)

    def flush(self, step: int) -> None:
        """Add the outcomes observed since the last flush (made at ``step``) to the statistics."""
        self._fade_to(step)
        if not self._rows:
            return
        x = np.stack([np.append(row[0].astype(np.float64), 1.0) for row in self._rows])
        y = np.array([row[1] for row in self._rows])
        if self._xtx is None or self._xty is None:
            self._xtx, self._xty = np.zeros((x.shape[1], x.shape[1])), np.zeros(x.shape[1])
        self._xtx += x.T @ x
        self._xty += x.T @ y
        self._weight += len(self._rows)
        self._rows = []

    def _fade_to(self, step: int) -> None:
        if step == self._stats_step:
            return
        fade = 2.0 ** (-(step - self._stats_step) / self.half_life)
        if self._xtx is not None and self._xty is not None:
            self._xtx *= fade
            self._xty *= fade
        self._weight *= fade
        self._resid = [v * fade for v in self._resid]
        self._bin_sums = [[v * fade for v in sums] for sums in self._bin_sums]
        self._stats_step = step

    # ---- state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state; arrays as base64 of their float64 bytes (exact)."""
        if self._rows:
            raise RuntimeError("cannot save the predictor with outcomes not yet added (flush first)")
        prompts = sorted(self._features)
        return {
            "dim": self.dim,
            "prompts": prompts,
            "feature_steps": [self._feature_step[p] for p in prompts],
            "features": _pack(np.stack([self._features[p] for p in prompts]), "<f4") if prompts else None,
            "xtx": _pack(self._xtx),
            "xty": _pack(self._xty),
            "weight": self._weight,
            "resid": list(self._resid),
            "stats_step": self._stats_step,
            "w": _pack(self._w),
            "fit_step": self._fit_step,
            "strength": self._strength,
            "bin_sums": self._bin_sums,
            "bin_prior": [list(p) if p is not None else None for p in self._bin_prior],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.dim = state["dim"]
        prompts = [int(p) for p in state["prompts"]]
        features = _unpack(state["features"])
        self._features = {p: features[i].copy() for i, p in enumerate(prompts)} if features is not None else {}
        self._feature_step = {p: int(s) for p, s in zip(prompts, state["feature_steps"])}
        self._pred = {}  # recomputed when asked for, bit for bit
        self._xtx, self._xty, self._w = _unpack(state["xtx"]), _unpack(state["xty"]), _unpack(state["w"])
        self._weight = float(state["weight"])
        self._resid = [float(v) for v in state["resid"]]
        self._stats_step = int(state["stats_step"])
        self._fit_step = int(state["fit_step"])
        self._strength = float(state["strength"])
        self._bin_sums = [[float(v) for v in sums] for sums in state["bin_sums"]]
        self._bin_prior = [tuple(float(v) for v in p) if p is not None else None for p in state["bin_prior"]]  # type: ignore[misc]
        self._rows = []


def _pack(array: np.ndarray | None, dtype: str = "<f8") -> dict[str, Any] | None:
    if array is None:
        return None
    a = np.ascontiguousarray(array, dtype=dtype)
    return {"shape": list(a.shape), "dtype": dtype, "data": base64.b64encode(a.tobytes()).decode("ascii")}


def _unpack(obj: dict[str, Any] | None) -> np.ndarray | None:
    if obj is None:
        return None
    dtype = obj.get("dtype", "<f8")
    return np.frombuffer(base64.b64decode(obj["data"]), dtype=dtype).reshape(obj["shape"]).astype(np.float32 if dtype == "<f4" else np.float64)


def apart(mean: float, population_mean: float, share: float) -> bool:
    """Whether a predicted success rate sets a prompt apart from the pool: its failure or success
    rate is at most ``share`` of the population's (means rounded as the trace records them)."""
    mean, population_mean = round(mean, 4), round(population_mean, 4)
    return mean <= share * population_mean or 1.0 - mean <= share * (1.0 - population_mean)


# ---- calibration ------------------------------------------------------------------------
def brier(predicted: list[float], outcome: list[bool]) -> float:
    """Mean squared error of probabilities against 0/1 outcomes (NaN when there are none)."""
    if not predicted:
        return math.nan
    return float(np.mean((np.asarray(predicted, dtype=np.float64) - np.asarray(outcome, dtype=np.float64)) ** 2))


def auc(score: list[float], outcome: list[bool]) -> float:
    """P(a positive scores above a negative), ties counting half (Mann-Whitney); NaN with one class."""
    s = np.asarray(score, dtype=np.float64)
    y = np.asarray(outcome, dtype=bool)
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return math.nan
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))
