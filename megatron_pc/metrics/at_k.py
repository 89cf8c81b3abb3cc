"""Validation figures over n samples per prompt: mean@n, pass@k and maj@k (docs/metrics.md).

- ``mean@n``: the mean reward of the n samples (verl's ``mean@N``).
- ``pass@k``: the chance that at least one of k samples drawn from the n without replacement is
  a success, by the unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), c the
  successes; it averages over every k-subset of the n, not over one draw.
- ``maj@k``: whether the most common final answer among the first k samples is a success. The
  samples are independent draws, so the first k are as good as any k. A tie between answers
  counts the mean success of the tied answers (the expectation under a random tie-break).
  Samples without an extracted answer do not vote; a prompt where none voted scores 0.

Each is a mean over prompts; ``k`` runs over the powers of two below n, and n.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

__all__ = ["ks_for", "pass_at_k", "maj_at_k", "at_k_metrics"]


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... below ``n``, then ``n``."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): a success among k of the n samples, c of which succeed."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # The product form of the ratio, exact in floating point without huge binomials.
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def maj_at_k(answers: Sequence[str | None], successes: Sequence[bool], k: int) -> float:
    """Success of the majority answer among the first ``k`` samples (see module docstring)."""
    if len(answers) != len(successes) or not 1 <= k <= len(answers):
        raise ValueError(f"maj@k needs 1 <= k <= samples and one success per answer, got k={k}, "
                         f"{len(answers)} answers, {len(successes)} successes")  # fmt: skip
    votes = Counter(a for a in answers[:k] if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [a for a, count in votes.items() if count == top]

    def success(answer: str) -> float:
        mine = [s for a, s in zip(answers[:k], successes[:k]) if a == answer]
        return sum(mine) / len(mine)

    return sum(success(a) for a in tied) / len(tied)


def at_k_metrics(rewards: Sequence[Sequence[float]], successes: Sequence[Sequence[bool]], answers: Sequence[Sequence[str | None]]) -> dict[str, float]:
    """``mean@n``, ``pass@k`` and ``maj@k`` averaged over prompts; each argument holds one list of
    n samples per prompt."""
    if not rewards:
        return {}
    n = len(rewards[0])
    if any(len(r) != n for r in rewards) or len(successes) != len(rewards) or len(answers) != len(rewards):
        raise ValueError("every prompt needs the same number of samples, with a reward, a success and an answer each")
    prompts = len(rewards)
    out = {f"mean@{n}": sum(sum(r) for r in rewards) / (prompts * n)}
    for k in ks_for(n):
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(s), k) for s in successes) / prompts
    for k in ks_for(n):
        out[f"maj@{k}"] = sum(maj_at_k(a, s, k) for a, s in zip(answers, successes)) / prompts
    return out
