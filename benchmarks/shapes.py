"""The group shapes of ``megatron-pc bench rollouts``: the paper's, and our small one.

The paper's released Pilot-Commit runs use groups of 64 = 16 pilots + 48 commits (Qwen3-4B) and
128 = 32 + 96 (Qwen2.5-Math-1.5B). At n = 16 (4 + 12, our earlier benchmark) the keep band
reduces to "1-3 of 4 pilots right", a not-all-alike filter, so the small shape measures a
different mechanism (avoiding zero-variance groups) from the paper's (concentrating rollouts on
high-variance prompts; docs/benchmarks.md). Our rollouts are a few tokens long, so the paper's
shape is affordable here; ``paper64`` is the benchmark's main configuration.

What each shape sets, and whose value it is:

* the paper's: n, pilot.n (commit = n - pilot.n), pilot.batch = 3 x train_batch, the keep band
  0.125 / 0.75, p_evict 1.0, buffer.max_age 4 under the reference age rule, the buffer's sampling
  (random in the 4B script, max_variance in the 1.5B one), the reference update rule's mini-batch
  of train_batch / 4 prompts;
* ours: train_batch (the paper's 128 scaled so that a GRPO step is 512 rollouts, as the small
  shape's 32 x 16, and a budget of tens of thousands of rollouts is tens of steps), and DAPO's
  round of train_batch prompts (the recipe draws 3 x; the ``dapo_3x`` variant runs that).
The band, eviction and buffer settings equal the dataclass defaults except where written below.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_pc.errors import MegatronPCError


@dataclass(frozen=True)
class Shape:
    """A group shape and the train batch it runs at."""

    name: str
    n: int
    pilot_n: int
    train_batch: int
    summary: str
    buffer_sampling: str = "max_variance"
    age_rule: str = "strict"

    def overrides(self) -> tuple[str, ...]:
        """The allocation settings of this shape."""
        return (f"allocation.n={self.n}", f"allocation.pilot.n={self.pilot_n}", f"allocation.train_batch={self.train_batch}",
                f"allocation.pilot.batch={3 * self.train_batch}", f"allocation.buffer.sampling={self.buffer_sampling}",
                f"allocation.buffer.age_rule={self.age_rule}")  # fmt: skip

    @property
    def grpo_step_rollouts(self) -> int:
        """Rollouts of one GRPO step (train_batch x n)."""
        return self.train_batch * self.n


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("paper64", 64, 16, 8, "the paper's Qwen3-4B shape: 16 pilots + 48 commits, random buffer sampling, reference age rule; "
                                    "train batch 8 (ours; the paper's 128)", "random", "reference"),  # fmt: skip
        Shape("paper128", 128, 32, 4, "the paper's Qwen2.5-Math-1.5B shape: 32 pilots + 96 commits, max-variance buffer sampling, "
                                      "reference age rule; train batch 4 (ours; the paper's 128)", "max_variance", "reference"),  # fmt: skip
        Shape("small", 16, 4, 32, "our earlier shape: 4 pilots + 12 commits, train batch 32 (the tiny run's defaults)"),
    )
}
MAIN_SHAPE = "paper64"
"""The shape of an equal-budget benchmark unless told otherwise."""


def parse_shape(name: str) -> Shape:
    """A shape by name."""
    if name not in SHAPES:
        raise MegatronPCError(f"--shape: unknown {name!r}; choose from {', '.join(SHAPES)}")
    return SHAPES[name]
