"""Rollout accounting: every generated rollout is counted, per step and cumulatively."""

from __future__ import annotations

from collections import Counter
from typing import Any

# Counters that add up over steps. Everything generated is counted, including the pilots of
# prompts that were then skipped, deferred or evicted: that is the cost being compared.
COUNTERS = (
    "generated",
    "generated_pilot",
    "generated_commit",
    "generated_full",
    "trained_rollouts",
    "trained_groups",
    "rounds",
    "prompts_piloted",
    "prompts_kept",
    "prompts_too_easy",
    "prompts_too_hard",
    "prompts_evicted",
    "prompts_drawn",
    "groups_filtered",
    "groups_surplus",
    "buffer_adds",
    "buffer_pops",
    "buffer_age_evictions",
    "buffer_epoch_drops",
    "buffer_overflow",
    "partial_steps",
    # history-aware Pilot-Commit (allocation.history)
    "prompts_screened",
    "prompts_explored",
    "prompts_direct",
    "direct_trained",
    "prompts_direct_large",
    "prompts_short_pilot",
    # the screen's predictor (allocation.history.predictor)
    "prompts_predicted",
    "prompts_featureless",
    "features_received",
    # metadata priors (allocation.history.metadata)
    "prompts_bucket_prior",
    # the field's other allocators: GRESO's pre-rollout skips, MoPPS's candidates not chosen
    "prompts_skipped",
    "prompts_skipped_easy",
    "prompts_skipped_hard",
    "prompts_passed",
)


class Accounting:
    """Per-step counters that roll into cumulative totals when a step ends."""

    def __init__(self) -> None:
        self.step: Counter[str] = Counter()
        self.total: Counter[str] = Counter()

    def add(self, key: str, value: int = 1) -> None:
        """Count ``value`` more of ``key`` in the current step."""
        if key not in COUNTERS:
            raise KeyError(f"unknown accounting counter {key!r}")
        self.step[key] += value

    def close_step(self, gauges: dict[str, float]) -> dict[str, float]:
        """End the step: return its counters, the cumulative ones (``cum_`` prefix) and gauges."""
        self.total.update(self.step)
        report: dict[str, float] = {k: self.step.get(k, 0) for k in COUNTERS}
        report.update({f"cum_{k}": self.total.get(k, 0) for k in COUNTERS})
        report.update(gauges)
        self.step = Counter()
        return report

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state."""
        return {"step": dict(self.step), "total": dict(self.total)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.step = Counter(state["step"])
        self.total = Counter(state["total"])
