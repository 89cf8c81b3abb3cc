"""Priors from what the data already says about a prompt: a Beta per bucket of its metadata.

Real prompt sets carry their difficulty openly: a ``difficulty`` column, a ``source``, a field of
verl's ``extra_info``. ``allocation.history.metadata`` names such fields; each prompt's values
of them make its *bucket* (:func:`bucket_keys`):

- a categorical field (text, or a number with at most ``metadata_bins`` distinct values in the
  pool) gives one bucket per value;
- a numeric field with more distinct values is cut into ``metadata_bins`` bins of equal counts
  over the training pool;
- a prompt without the field has the value ``?``, a bucket of its own.

Nothing here knows what the fields mean: any field works the same way.

:class:`MetadataPrior` keeps, per bucket, faded moments of what the bucket's prompts turned out
to be when they were judged (every pilot and every direct group, in any epoch): the weight, and
unbiased estimates of E[p] and E[p^2] (``x / n`` and ``x (x - 1) / (n (n - 1))`` for x successes
in n rollouts), as the population prior of :mod:`megatron_pc.allocation.history` does for the
whole pool. Commit outcomes are left out of a bucket's moments: only survivors are committed,
so they would pull the bucket toward the keep band (they still update the prompt's own
posterior).

A bucket's prior is hierarchical: its moments are shrunk toward the population's with the weight
of ``metadata_shrink`` prompts, ``m_k = (S_k + c M_k) / (W + c)``, and the Beta is fitted to
them by moments. A bucket seen little is the population; a bucket seen much is itself. A prompt's
posterior is then its bucket's prior plus its own faded evidence (history.py).
"""

from __future__ import annotations

import bisect
import random
from typing import Any, Sequence

from megatron_pc.allocation.history import MIN_PRIOR_WEIGHT, add_outcome, beta_by_moments
from megatron_pc.errors import ConfigError

MISSING = "?"
"""The value of a field a record does not carry."""


def record_field(record: Any, name: str) -> Any:
    """The value of field ``name`` of a prompt record (None when it has none): ``difficulty``,
    ``source``, or any other field the data file carried (``extra_info.<key>`` for a field of
    verl's ``extra_info``)."""
    if name in ("difficulty", "source"):
        return getattr(record, name)
    return dict(getattr(record, "metadata", ()) or ()).get(name)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _field_labels(values: list[Any], name: str, bins: int) -> list[str]:
    """One label per value: the value itself for a categorical field, its bin for a numeric one."""
    present = [v for v in values if v is not None]
    if not present:
        raise ConfigError("allocation.history.metadata", f"no training prompt carries the field {name!r}; name a field the data has")
    numeric = all(_is_number(v) for v in present)
    distinct = sorted(set(present), key=lambda v: (str(type(v)), v))
    if not numeric or len(distinct) <= bins:
        return [MISSING if v is None else f"{v:g}" if _is_number(v) else str(v) for v in values]
    ordered = sorted(float(v) for v in present)
    # Equal-count cut points over the pool's values (duplicates merge bins: a value never splits).
    cuts = sorted({ordered[min(len(ordered) - 1, (i * len(ordered)) // bins)] for i in range(1, bins)})
    edges = [ordered[0], *cuts, ordered[-1]]

    def label(v: Any) -> str:
        if v is None:
            return MISSING
        i = bisect.bisect_right(cuts, float(v))
        return f"[{edges[i]:g},{edges[i + 1]:g}{']' if i == len(cuts) else ')'}"

    return [label(v) for v in values]


def bucket_keys(records: Sequence[Any], fields: Sequence[str], bins: int, noise: float = 0.0, seed: int = 0) -> list[str]:
    """Each record's bucket: ``field=label`` for every named field, joined by ``;``.

    ``noise`` (the benchmark's rough-labels ablation): that share of the prompts, chosen by
    ``seed``, get their buckets shuffled among themselves, as labels a careless annotator swapped."""
    per_field = [_field_labels([record_field(r, name) for r in records], name, bins) for name in fields]
    keys = [";".join(f"{name}={labels[i]}" for name, labels in zip(fields, per_field)) for i in range(len(records))]
    if noise > 0.0:
        rng = random.Random(seed)
        chosen = rng.sample(range(len(keys)), round(noise * len(keys)))
        shuffled = [keys[i] for i in chosen]
        rng.shuffle(shuffled)
        for i, key in zip(chosen, shuffled):
            keys[i] = key
    return keys


def index_buckets(keys: Sequence[str]) -> tuple[list[str], list[int]]:
    """The bucket names, sorted, and each prompt's index into them."""
    names = sorted(set(keys))
    index = {name: i for i, name in enumerate(names)}
    return names, [index[k] for k in keys]


class MetadataPrior:
    """Faded outcome moments per bucket and the hierarchical Beta prior they give."""

    def __init__(self, names: Sequence[str], bucket: Sequence[int], half_life: float, shrink: float, min_judged: int = 0) -> None:
        self.names = list(names)  # the buckets, sorted (AllocationStrategy.set_prompt_metadata)
        self.bucket = bucket  # prompt -> index into names
        self.half_life = half_life
        self.shrink = shrink
        self.min_judged = min_judged
        self._sums = [[0.0, 0.0, 0.0] for _ in self.names]  # per bucket: weight, sum of p, sum of p^2 estimates
        self._step = 0
        self._judged = [0] * len(self.names)  # per bucket: prompts piloted or given directly this epoch

    def _fade_to(self, step: int) -> None:
        if step != self._step:
            fade = 2.0 ** (-(step - self._step) / self.half_life)
            self._sums = [[v * fade for v in sums] for sums in self._sums]
            self._step = step

    def observe(self, prompt: int, successes: int, n: int, step: int) -> None:
        """A judged outcome (pilot or direct) of ``prompt``: ``successes`` of ``n`` at ``step``."""
        self._judged[self.bucket[prompt]] += 1
        if n < 2:
            return
        self._fade_to(step)
        add_outcome(self._sums[self.bucket[prompt]], successes, n)

    def weight(self, prompt: int, step: int) -> float:
        """Faded judged outcomes of the prompt's bucket."""
        self._fade_to(step)
        return self._sums[self.bucket[prompt]][0]

    def calibrated(self, prompt: int, step: int) -> bool:
        """Whether the bucket's prior may stand for a prompt's own evidence when screening: it has
        seen ``MIN_PRIOR_WEIGHT`` faded outcomes."""
        return self.weight(prompt, step) >= MIN_PRIOR_WEIGHT

    def owed(self, prompt: int) -> bool:
        """The coverage guard: the epoch has judged fewer than ``min_judged`` prompts of this one's
        bucket, so it is piloted (or given its rollouts directly) whatever its posterior says.
        Every bucket is tried again each epoch, and one that looked hopeless is found once the
        policy has learned it."""
        return self._judged[self.bucket[prompt]] < self.min_judged

    def end_epoch(self) -> None:
        """A new epoch: every bucket is owed ``min_judged`` judged prompts again."""
        self._judged = [0] * len(self.names)

    def prior(self, prompt: int, step: int, population: tuple[float, float, float]) -> tuple[float, float]:
        """The prompt's bucket prior Beta(a, b): the bucket's moments shrunk toward ``population``
        (weight, sum of p, sum of p^2 estimates, as :meth:`PromptHistory.population_moments` gives)."""
        self._fade_to(step)
        weight, s1, s2 = self._sums[self.bucket[prompt]]
        pop_weight, p1, p2 = population
        if pop_weight > 0:
            m1, m2 = p1 / pop_weight, p2 / pop_weight
        else:  # nothing seen yet: Jeffreys' Beta(1/2, 1/2) has these moments
            m1, m2 = 0.5, 0.375
        c = self.shrink
        return beta_by_moments((s1 + c * m1) / (weight + c), (s2 + c * m2) / (weight + c), max_strength=weight + c)

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state (the buckets come from the data, not the checkpoint)."""
        return {"names": self.names, "sums": self._sums, "step": self._step, "judged": self._judged}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; refuses buckets other than this data's."""
        if list(state["names"]) != self.names:
            raise ValueError(
                f"the checkpoint's metadata buckets ({len(state['names'])}: {', '.join(map(str, state['names'][:4]))}...) are not "
                f"this run's ({len(self.names)}: {', '.join(self.names[:4])}...): the data or allocation.history.metadata changed"
            )
        self._sums = [[float(v) for v in sums] for sums in state["sums"]]
        self._step = int(state["step"])
        self._judged = [int(v) for v in state["judged"]]
