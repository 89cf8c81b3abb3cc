"""The named task regimes (of ``megatron-pc bench rollouts``, and the names the report gives a
run's task): arithmetic data with a known share of zero-variance GRPO groups for the warm-up
tiny model.

A regime is its content: a builtin prompt source whose mix of operations and operand sizes is
fixed (``megatron_pc.data.arithmetic.MIXES``), the same for every strategy. docs/benchmarks.md
lists the cells and the measured z (share of prompts whose 16 samples are all right or all
wrong) of each.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_pc.errors import MegatronPCError


@dataclass(frozen=True)
class Regime:
    """A named task regime."""

    name: str
    source: str
    """``data.source`` of its runs."""
    summary: str
    """What it is, in a line."""
    z_design: float
    """The zero-variance share it was built for (the benchmark measures the real one)."""
    train_size: int | None = None
    """Training prompts of its runs (None: the benchmark's ``--train-size``). A small pool makes
    a run pass over its prompts several times, so history-based methods have history."""


REGIMES: dict[str, Regime] = {
    r.name: r
    for r in (
        Regime("mixed", "builtin:arithmetic_mixed", "mostly prompts the start model half-solves", 0.3),
        Regime("paper_like", "builtin:arithmetic_paper_like",
               "the paper's kind of data: many prompts the model cannot solve yet, some it always solves, a band between", 0.6),  # fmt: skip
        Regime("hard", "builtin:arithmetic_hard", "mostly beyond the start model: long sums and differences, 2-digit products", 0.8),
        Regime("default", "builtin:arithmetic", "the default task of the tiny run (+, - with 1-4 digit operands, * up to 3x1)", 0.4),
        Regime("multi_epoch", "builtin:arithmetic_paper_like", "paper_like's prompts, a pool of 192: at least 3 epochs at the "
               "benchmark's budget, so history-based methods (GRESO, MoPPS, pc_history) have history", 0.6, train_size=192),  # fmt: skip
    )
}
DEFAULT_REGIMES = ("mixed", "paper_like", "hard", "multi_epoch")
"""The regimes a benchmark runs unless told otherwise (``default`` is the tiny run's own data)."""


def parse_regimes(text: str) -> list[Regime]:
    """Comma-separated regime names, each known."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in REGIMES]
    if unknown or not names:
        problem = f"unknown regime {unknown[0]!r}" if unknown else "none given"
        raise MegatronPCError(f"--regimes: {problem}; known: {', '.join(REGIMES)}")
    return [REGIMES[n] for n in names]
