"""Settings of the field's other allocators (SPEED-RL, GRESO, MoPPS), each at its paper's values.

Each field says whether its default is the method's published value (the paper or the authors'
released scripts) or a choice of ours where the method leaves it open or our loop differs. The
strategies are ``allocation/speed_rl.py``, ``greso.py`` and ``mopps.py``; docs/benchmarks.md
compares them with Pilot-Commit at an equal rollout budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_pc.errors import ConfigError


@dataclass
class SpeedRLConfig:
    """SPEED-RL (arXiv 2506.09016): screening rollouts per prompt, then the rest of the group only
    for prompts of intermediate pass rate."""

    n_init: int = 4
    """Screening rollouts per new prompt (the paper's N_init = 4); the continuation gives an
    accepted prompt n - n_init more, and its group trains on all n."""
    p_low: float = 0.0
    """A screened prompt is accepted when p_low < pass rate < p_high (strictly): the paper's
    thresholds 0 and 1, i.e. the screening rollouts were neither all wrong nor all right."""
    p_high: float = 1.0
    screen_batch: int | None = None
    """New prompts screened per round. None: ``pilot.batch`` (ours: the same round size as
    Pilot-Commit's pilots; SPEED-RL sizes its generation batch to its hardware)."""

    def __post_init__(self) -> None:
        _positive("n_init", self.n_init)
        if not 0.0 <= self.p_low < self.p_high <= 1.0:
            raise ConfigError("p_low", f"need 0 <= p_low < p_high <= 1, got p_low {self.p_low}, p_high {self.p_high}")
        if self.screen_batch is not None:
            _positive("screen_batch", self.screen_batch)


@dataclass
class GresoConfig:
    """GRESO (arXiv 2506.02177): before any rollout, skip a prompt whose last samplings were all
    zero-variance, with a probability that grows with the length of that streak; the base
    probabilities adapt so that the zero-variance share of what is sampled tracks a target.
    The defaults are the authors' released scripts (Infini-AI-Lab/GRESO, ``all_probabilistic``)."""

    p_easy: float = 0.5
    """Start value of the base keep probability of prompts whose streak is all-correct: such a
    prompt with a streak of k is rolled out with probability max(p_easy^k, keep_floor)."""
    p_hard: float = 0.5
    """The same for all-wrong streaks."""
    target_zero_variance: float = 0.25
    """Target share of zero-variance groups among those sampled; a third of it is the target for
    all-correct groups, two thirds for all-wrong ones (the scripts' split: more exploration on hard
    prompts, which the rising policy may come to solve)."""
    adjust_step: float = 0.01
    """After each step from the second epoch on, each base probability moves by this much: down
    (skip more) when its share of the step's sampled groups was at or above its target, else up."""
    min_p: float = 0.05
    max_p: float = 0.95
    """Bounds of the base probabilities."""
    keep_floor: float = 0.01
    """A prompt is rolled out with probability at least this, however long its streak."""
    batch: int | None = None
    """Prompts rolled out per generation round (those that pass the skip filter). None: 1.5 x
    train_batch (the scripts' 384 sampled for a train batch of 256)."""

    def __post_init__(self) -> None:
        for name in ("p_easy", "p_hard", "target_zero_variance", "keep_floor"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(name, f"must lie in [0, 1], got {getattr(self, name)}")
        if not 0.0 < self.adjust_step < 1.0:
            raise ConfigError("adjust_step", f"must lie in (0, 1), got {self.adjust_step}")
        if not 0.0 <= self.min_p <= self.max_p <= 1.0:
            raise ConfigError("min_p", f"need 0 <= min_p <= max_p <= 1, got {self.min_p}, {self.max_p}")
        if self.batch is not None:
            _positive("batch", self.batch)

    def round_prompts(self, train_batch: int) -> int:
        """Prompts a round rolls out."""
        return self.batch if self.batch is not None else -(-3 * train_batch // 2)


@dataclass
class MoppsConfig:
    """MoPPS (arXiv 2507.04632): each prompt's success rate has a Beta posterior; each step draws
    a Thompson sample for every candidate and trains the prompts whose samples lie closest to a
    target, with no rollout spent on choosing. The defaults are the authors' math scripts
    (thu-rllab/MoPPS, ``topk``, no prior initialisation)."""

    candidates_ratio: int = 16
    """Candidates per step = this x train_batch (the math scripts' ts_ratio 16; 8 in their
    countdown and geometry scripts), at most the prompts left in the pool outside the batch."""
    target: float = 0.5
    """The success rate a chosen prompt's sample should be closest to."""
    prior_alpha: float = 1.0
    prior_beta: float = 1.0
    """Beta(1, 1): a uniform prior."""
    decay: float = 1.0
    """A prompt's posterior before its update is alpha <- decay x alpha + (1 - decay) x prior_alpha
    (likewise beta): 1.0 keeps all evidence (the math scripts), 0.5 the other scripts."""

    def __post_init__(self) -> None:
        _positive("candidates_ratio", self.candidates_ratio)
        if not 0.0 <= self.target <= 1.0:
            raise ConfigError("target", f"must lie in [0, 1], got {self.target}")
        for name in ("prior_alpha", "prior_beta"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, f"must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.decay <= 1.0:
            raise ConfigError("decay", f"must lie in [0, 1], got {self.decay}")


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise ConfigError(name, f"must be >= 1, got {value}")
