"""What history-aware Pilot-Commit remembers: a Beta posterior over every prompt's success rate.

Every observed rollout of a prompt (pilot, commit or direct, in any epoch) is one success or
failure of that prompt. Observations fade as the policy changes: one made ``h`` steps ago counts
``2 ** (-h / half_life)``. A prompt's posterior is ``Beta(a0 + s, b0 + f)``, where ``s`` / ``f``
are its faded successes / failures and ``Beta(a0, b0)`` is the *population* prior: a Beta fitted
by moments to the first observation of every prompt, so a prompt never seen is expected to
behave like the pool does now (empirical Bayes). Before enough of the pool has been seen the
prior is Jeffreys' ``Beta(1/2, 1/2)``.

Decisions use the posterior predictive (beta-binomial) of what the next rollouts of a prompt
would show, and, for eviction, the posterior tail ``P(p > evict_level)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

JEFFREYS = (0.5, 0.5)
MIN_PRIOR_WEIGHT = 16.0
"""(Faded) first observations the population prior needs before it replaces Jeffreys'."""


@lru_cache(maxsize=4096)
def beta_binomial_pmf(n: int, a: float, b: float) -> tuple[float, ...]:
    """P(k successes in n | p ~ Beta(a, b)) for k = 0..n.

    By the ratio of neighbours, P(k+1) / P(k) = (n - k)(a + k) / ((k + 1)(b + n - k - 1)), then
    normalised to sum 1: a product a term instead of five log-gammas (the screen meets many
    distinct priors a round). Rescaled on the way, so no term overflows."""
    terms, x = [1.0], 1.0
    for k in range(n):
        x *= (n - k) * (a + k) / ((k + 1) * (b + n - k - 1))
        if x > 1e250:
            terms = [t * 1e-250 for t in terms]
            x *= 1e-250
        terms.append(x)
    total = math.fsum(terms)
    return tuple(t / total for t in terms)


@lru_cache(maxsize=8192)
def _band_mass(n: int, a: float, b: float, p_lower: float, p_upper: float) -> float:
    """P(p_lower <= k / n <= p_upper) for k ~ BetaBinomial(n, a, b) (cached: many prompts share a prior)."""
    return sum(q for k, q in enumerate(beta_binomial_pmf(n, a, b)) if p_lower <= k / n <= p_upper)


def beta_sf(x: float, a: float, b: float) -> float:
    """P(p > x) for p ~ Beta(a, b): the regularized incomplete beta function, by continued fraction."""
    if x <= 0.0:
        return 1.0
    if x >= 1.0:
        return 0.0
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    if x < (a + 1.0) / (a + b + 2.0):
        return 1.0 - math.exp(log_front) * _beta_cf(x, a, b) / a
    return math.exp(log_front) * _beta_cf(1.0 - x, b, a) / b


def _beta_cf(x: float, a: float, b: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-12:
            break
    return h


def add_outcome(sums: list[float], successes: int, n: int) -> None:
    """Add one outcome (``successes`` of ``n >= 2`` rollouts) to faded moment sums [weight, sum of
    p, sum of p^2]: ``x / n`` is unbiased for p and ``x (x - 1) / (n (n - 1))`` for p^2."""
    sums[0] += 1.0
    sums[1] += successes / n
    sums[2] += successes * (successes - 1) / (n * (n - 1))


def beta_by_moments(m1: float, m2: float, max_strength: float = 1000.0) -> tuple[float, float]:
    """The Beta(a, b) whose mean is ``m1`` and second moment ``m2`` (estimates of E[p], E[p^2]);
    a + b kept within [0.1, ``max_strength``], each of a, b at least 0.02."""
    mean = min(max(m1, 1e-3), 1.0 - 1e-3)
    var = m2 - mean * mean
    # Beta moments: var = mean (1 - mean) / (a + b + 1); a U-shaped pool gives a + b < 1.
    top = min(max_strength, 1000.0)
    strength = mean * (1.0 - mean) / var - 1.0 if var > 0 else top
    strength = min(max(strength, 0.1), top)
    return max(mean * strength, 0.02), max((1.0 - mean) * strength, 0.02)


@dataclass
class Posterior:
    """One prompt's Beta posterior and how much of it is the prompt's own evidence."""

    a: float
    b: float
    evidence: float
    """Faded rollouts of the prompt itself behind it."""

    @property
    def mean(self) -> float:
        """Posterior mean success rate."""
        return self.a / (self.a + self.b)

    def predictive(self, n: int) -> tuple[float, ...]:
        """P(k successes in the next n rollouts), k = 0..n."""
        return beta_binomial_pmf(n, round(self.a, 6), round(self.b, 6))

    def p_keep(self, n: int, p_lower: float, p_upper: float) -> float:
        """Chance that a pilot of ``n`` rollouts lands in the keep band."""
        return _band_mass(n, round(self.a, 6), round(self.b, 6), p_lower, p_upper)

    def p_informative(self, n: int) -> float:
        """Chance that ``n`` rollouts do not all score alike."""
        pmf = self.predictive(n)
        return max(0.0, 1.0 - pmf[0] - pmf[-1])

    def p_above(self, level: float) -> float:
        """P(p > level)."""
        return beta_sf(level, self.a, self.b)


class PromptHistory:
    """Faded successes and failures of every prompt seen, and the population prior they give."""

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self._seen: dict[int, list[float]] = {}  # prompt -> [successes, failures, step of the last update]
        # Faded sums over first observations: weight, unbiased estimates of E[p] and E[p^2].
        self._pop = [0.0, 0.0, 0.0]
        self._pop_step = 0

    def __len__(self) -> int:
        return len(self._seen)

    def _fade(self, steps: float) -> float:
        return 2.0 ** (-steps / self.half_life)

    def observe(self, prompt: int, successes: int, n: int, step: int) -> None:
        """Add ``n`` rollouts of ``prompt`` made at ``step``, ``successes`` of them correct."""
        entry = self._seen.get(prompt)
        if entry is None:
            if n >= 2:  # x(x-1) / (n(n-1)) is unbiased for p^2 only with two or more rollouts
                self._fade_population(step)
                add_outcome(self._pop, successes, n)
            self._seen[prompt] = [float(successes), float(n - successes), float(step)]
            return
        fade = self._fade(step - entry[2])
        entry[0] = entry[0] * fade + successes
        entry[1] = entry[1] * fade + n - successes
        entry[2] = float(step)

    def _fade_population(self, step: int) -> None:
        if step != self._pop_step:
            fade = self._fade(step - self._pop_step)
            self._pop = [x * fade for x in self._pop]
            self._pop_step = step

    def prior(self, step: int) -> tuple[float, float]:
        """The population prior Beta(a0, b0) at ``step`` (Jeffreys' until enough is seen)."""
        weight, s1, s2 = self.population_moments(step)
        if weight < MIN_PRIOR_WEIGHT:
            return JEFFREYS
        return beta_by_moments(s1 / weight, s2 / weight)

    def population_moments(self, step: int) -> tuple[float, float, float]:
        """Faded (weight, sum of p, sum of p^2 estimates) over first observations, at ``step``."""
        weight, s1, s2 = (x * self._fade(step - self._pop_step) for x in self._pop)
        return weight, s1, s2

    def posterior(self, prompt: int, step: int, prior: tuple[float, float]) -> Posterior:
        """The prompt's posterior at ``step`` under ``prior``."""
        entry = self._seen.get(prompt)
        if entry is None:
            return Posterior(prior[0], prior[1], 0.0)
        fade = self._fade(step - entry[2])
        s, f = entry[0] * fade, entry[1] * fade
        return Posterior(prior[0] + s, prior[1] + f, s + f)

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state (floats round-trip exactly through JSON)."""
        return {"seen": [[p, *v] for p, v in self._seen.items()], "population": list(self._pop), "population_step": self._pop_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self._seen = {int(row[0]): [float(x) for x in row[1:]] for row in state["seen"]}
        self._pop = [float(x) for x in state["population"]]
        self._pop_step = int(state["population_step"])
