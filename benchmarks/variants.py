"""The update rules and the labelled variants of ``megatron-pc bench rollouts``.

An update rule decides how a step's trained groups split into optimizer updates:

* ``reference``: the reference recipe's rule. Mini-batches are counted in the rollouts of one
  generation call (``training.mini_batch_unit=call_rollouts``) with ``training.mini_batch`` a
  quarter of the regime's train batch (the recipe: 32 of 128 prompts). verl multiplies the
  mini-batch by the rollouts per prompt of a call, which for Pilot-Commit is its commit n, so a
  PC step takes about 1.5x GRPO's updates (6 against 4 at the tiny sizes: 32 groups of 4 pilot
  + 12 commit rollouts = 512 rows in mini-batches of 8 x 12 = 96; GRPO 512 rows in 8 x 16 = 128).
* ``equal`` with N updates: every strategy takes N updates per step, each of train batch / N
  whole groups (``mini_batch_unit=groups``). The benchmark's earlier runs (results/bench_rollouts)
  are ``equal`` with 1 update.

A variant is a strategy with overrides, run beside the strategies under its own label; the
controls of docs/benchmarks.md ("Where the paper's gain comes from") are variants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from megatron_pc.errors import MegatronPCError

UPDATE_RULES = ("reference", "equal")
REFERENCE_MINI_BATCHES = 4
"""The reference rule's mini-batch is the train batch over this (the recipe: 128 / 32), in prompts."""


@dataclass(frozen=True)
class UpdateRule:
    """How a step's groups split into optimizer updates."""

    name: Literal["reference", "equal"]
    updates: int | None = None
    """``equal``: optimizer updates per step; ``reference``: None (they follow the rollouts)."""

    def __post_init__(self) -> None:
        if self.name not in UPDATE_RULES:
            raise MegatronPCError(f"--update-rule: unknown {self.name!r}; choose from {', '.join(UPDATE_RULES)}")
        if self.name == "equal" and (self.updates is None or self.updates < 1):
            raise MegatronPCError(f"--updates: must be >= 1 with --update-rule equal, got {self.updates}")
        if self.name == "reference" and self.updates is not None:
            raise MegatronPCError("--updates: only with --update-rule equal (the reference rule's updates follow the rollouts)")

    @property
    def label(self) -> str:
        """``reference`` or ``equal/N``: the rule in the report and summary.json."""
        return self.name if self.name == "reference" else f"equal/{self.updates}"

    @property
    def dir_suffix(self) -> str:
        """What the rule adds to a run's label directory: nothing for ``equal`` with 1 update (the
        layout of the runs kept before rules were named, so they are found and reused),
        ``@reference`` or ``@equalN`` otherwise."""
        return "" if self.label == "equal/1" else "@" + self.label.replace("/", "")

    def overrides(self, train_batch: int, regime_train_batch: int, label: str) -> tuple[str, ...]:
        """The training settings of a run of ``train_batch`` groups per step under this rule
        (the reference mini-batch is sized from the regime's train batch, as the recipe keeps
        its mini-batch when a run's batch changes)."""
        if self.name == "reference":
            return ("training.mini_batch_unit=call_rollouts", f"training.mini_batch={max(1, regime_train_batch // REFERENCE_MINI_BATCHES)}")
        assert self.updates is not None
        if train_batch % self.updates:
            raise MegatronPCError(f"{label}: --updates {self.updates} does not divide its train batch {train_batch} into equal updates")
        return ("training.mini_batch_unit=groups", f"training.mini_batch={train_batch // self.updates}")


def _none(_train_batch: int) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class Variant:
    """A strategy run under its own label with overrides sized from the regime's train batch."""

    strategy: str
    summary: str
    overrides: Callable[[int], tuple[str, ...]] = field(default=_none)
    rule: UpdateRule | None = None
    """A rule of its own, whatever the benchmark's ``--update-rule`` (None: the benchmark's)."""


_SCREEN = ("allocation.history.preset=screen",)
_METADATA = ("allocation.history.preset=metadata", "allocation.history.metadata=[difficulty]")
"""The metadata labels' overrides: priors per bucket of the records' difficulty."""
_SIZED = "allocation.history.sized=true"
_SHORT_PILOT_2 = "allocation.history.short_pilot=2"

VARIANTS: dict[str, Variant] = {
    "pc_history": Variant("pilot_commit", "history-aware Pilot-Commit (docs/history_aware.md)",
                          lambda tb: ("allocation.history.preset=history_aware",)),  # fmt: skip
    "pc_screen": Variant("pilot_commit", "history-aware Pilot-Commit with the screen's predicted priors (docs/screen.md)",
                         lambda tb: _SCREEN),  # fmt: skip
    "pc_screen_policy": Variant("pilot_commit", "pc_screen fed the policy's hidden state at the last prompt token (features: policy) in place of n-grams",
                                lambda tb: (*_SCREEN, "allocation.history.features=policy")),  # fmt: skip
    "pc_meta": Variant("pilot_commit", "pc_screen with priors per bucket of the records' difficulty (docs/metadata_prior.md)",
                       lambda tb: _METADATA),  # fmt: skip
    "pc_meta_coarse": Variant("pilot_commit", "pc_meta with the difficulty cut into 3 bins (rough labels)",
                              lambda tb: (*_METADATA, "allocation.history.metadata_bins=3")),  # fmt: skip
    "pc_meta_noisy": Variant("pilot_commit", "pc_meta with 20% of the prompts' difficulty labels shuffled (wrong labels)",
                             lambda tb: (*_METADATA, "allocation.history.metadata_noise=0.2")),  # fmt: skip
    "pc_meta_sized": Variant("pilot_commit", "pc_meta with sized counts: a short pilot (4 + 60 commits), a pilot, n or 2n rollouts per prompt by its posterior",
                             lambda tb: (*_METADATA, _SIZED)),  # fmt: skip
    "pc_screen_sized": Variant("pilot_commit", "pc_screen with sized counts: pc_meta_sized without the labels (history and n-grams only)",
                               lambda tb: (*_SCREEN, _SIZED)),  # fmt: skip
    "pc_meta_sized_sp2": Variant("pilot_commit", "pc_meta_sized with a short pilot of 2 (history.short_pilot=2): the smallest that can be kept at pilots of 4",
                                 lambda tb: (*_METADATA, _SIZED, _SHORT_PILOT_2)),  # fmt: skip
    "pc_screen_sized_sp2": Variant("pilot_commit", "pc_screen_sized with a short pilot of 2 (history.short_pilot=2), without the labels",
                                   lambda tb: (*_SCREEN, _SIZED, _SHORT_PILOT_2)),  # fmt: skip
    "grpo_fair": Variant("grpo", "GRPO whose loss mean counts only the tokens of groups with a nonzero advantage",
                         lambda tb: ("training.loss_denominator=informative",)),  # fmt: skip
    "dapo_3x": Variant("dapo", "DAPO drawing 3 x the train batch of prompts per round, as the recipe",
                       lambda tb: (f"allocation.dapo_batch={3 * tb}",)),  # fmt: skip
    "grpo_half": Variant("grpo", "GRPO at half the train batch (how learning per step grows with the batch)",
                         lambda tb: (f"allocation.train_batch={max(1, tb // 2)}",)),  # fmt: skip
    "pc_4up": Variant("pilot_commit", "Pilot-Commit with 4 equal updates per step (mini-batches in groups)", rule=UpdateRule("equal", 4)),
}
"""Methods run beside the strategies, by label."""
CONTROLS = ("grpo_fair", "dapo_3x", "grpo_half", "pc_4up")
"""The variants that separate the paper's differences from ours (issue: where the gain comes from)."""


def parse_rule(name: str, updates: int | None) -> UpdateRule:
    """``--update-rule`` and ``--updates`` as a rule (``equal`` without ``--updates``: 1)."""
    return UpdateRule(name, updates if name == "reference" or updates is not None else 1)  # type: ignore[arg-type]
