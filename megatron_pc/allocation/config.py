"""Settings of rollout allocation: which strategy, batch sizes, the pilot/commit split, the band."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from megatron_pc.allocation.field_config import GresoConfig, MoppsConfig, SpeedRLConfig
from megatron_pc.errors import ConfigError


@dataclass
class PilotConfig:
    """The pilot stage of Pilot-Commit: a few rollouts of each new prompt to estimate p_hat."""

    n: int = 16
    """Rollouts per new prompt in the pilot (reference runs: 32 for n=128, 16 for n=64)."""
    n_effective: int | None = None
    """Pilot rollouts kept in the training group (<= n). None means all n."""
    batch: int = 384
    """Prompts piloted per generation round (reference: 3 x train_batch)."""
    keep: Literal["max_variance", "first"] = "max_variance"
    """Which pilot rollouts to keep when n_effective < n: the subset with the highest reward
    variance, or simply the first ones."""

    def __post_init__(self) -> None:
        _positive("n", self.n)
        _positive("batch", self.batch)
        if self.n_effective is not None:
            _positive("n_effective", self.n_effective)
            if self.n_effective > self.n:
                raise ConfigError("n_effective", f"must be <= pilot.n ({self.n}), got {self.n_effective}")

    @property
    def kept(self) -> int:
        """Pilot rollouts that enter the training group."""
        return self.n if self.n_effective is None else self.n_effective


@dataclass
class BufferConfig:
    """The replay buffer of pilot survivors that wait for their commit."""

    max_age: int = 4
    """A survivor is committed at most this many steps after its pilot (``age_rule: strict``);
    older ones are dropped."""
    age_rule: Literal["strict", "reference"] = "reference"
    """``strict``: a pilot is committed at most ``max_age`` steps after it. ``reference``: the
    reference recipe's rule, which drops entries with step - pilot_step > max_age after the
    batch is full, so a pilot can still be committed at the next step, max_age + 1 steps after it."""
    capacity: int | None = None
    """At most this many waiting survivors (the oldest are dropped first). None: no limit."""
    sampling: Literal["max_variance", "random"] = "random"
    """Which survivors a round commits: highest pilot variance p(1-p) first (ties to the most
    recent pilot), or uniformly at random."""

    def __post_init__(self) -> None:
        if self.max_age < 0:
            raise ConfigError("max_age", f"must be >= 0, got {self.max_age}")
        if self.capacity is not None:
            _positive("capacity", self.capacity)


@dataclass
class HistoryConfig:
    """History-aware Pilot-Commit (docs/history_aware.md). Every option is off by default, so the
    paper's behaviour stays the default; ``preset: history_aware`` turns them all on, ``preset:
    screen`` turns them all on and the predictor too (docs/screen.md)."""

    preset: Literal["off", "history_aware", "screen", "metadata"] = "off"
    """``history_aware``: the four options below on (with the parameters as set). ``screen``: those
    and ``predictor`` on. ``metadata``: those of ``screen``, and priors from the record fields
    named in ``metadata`` (docs/metadata_prior.md), which must then be named."""
    demand_pilots: bool = False
    """Pilot only as many new prompts as the buffer is expected to need, judged from each prompt's
    predicted keep probability, instead of a fixed ``pilot.batch``."""
    pilot_floor: int = 8
    """Demand-sized rounds still draw at least this many new prompts."""
    max_new_factor: float = 2.0
    """Demand-sized rounds draw at most ``max_new_factor x pilot.batch`` new prompts."""
    screen: bool = False
    """Do not pilot (this epoch) a prompt whose posterior predicts a pilot outside the keep band
    with probability >= ``confidence``; it is deferred (too hard) or skipped (too easy)."""
    explore: float = 0.05
    """Chance that a screened prompt is piloted anyway, so a prompt that has changed is found again."""
    direct_commit: bool = False
    """Give a prompt its n rollouts at once, with no pilot, when its posterior says that yields more
    informative groups per rollout than piloting it (a prompt confidently in the band, or a pool on
    which pilots mostly survive); the group is trained if its rewards differ."""
    sized: bool = False
    """Size each new prompt's rollouts by its posterior (docs/metadata_prior.md, "Sized counts"):
    a pilot, a short pilot (``short_pilot``), n rollouts directly, or ``large_factor`` x n directly
    for a prompt informative only with more samples, whichever is expected to give the most
    informative groups per rollout. Needs ``direct_commit``."""
    large_factor: int = 2
    """The larger group of ``sized``: this many times n rollouts, trained as one group."""
    short_pilot: int | None = None
    """The smaller pilot of ``sized``: this many rollouts, all kept in the prompt's group with
    n - short_pilot commits when they land in the keep band (at 4 and the reference band, 1 to 3
    right). Given where it is expected to put more informative groups per rollout than a full
    pilot or n directly: a prompt likely beyond the policy but not surely. None: a quarter of
    ``pilot.n`` (4 at the paper's 16 pilots, SPEED-RL's screening size), or none when no count of
    that many lands in the keep band (pilot.n below 8 at the reference band); 0: none."""
    posterior_evict: bool = False
    """Evict a prompt when its posterior puts p > ``evict_level`` with probability >= ``confidence``,
    instead of after one pilot with p_hat >= p_evict."""
    evict_level: float = 0.9
    confidence: float = 0.9
    half_life: float = 50.0
    """Steps after which an observation of a prompt counts half (the policy changes)."""
    min_evidence: float = 4.0
    """Own (decayed) rollouts a prompt needs before it is screened or evicted by its posterior
    (a prompt whose prior is a prediction of the ``predictor`` may be screened without any)."""
    predictor: bool = False
    """Predict every prompt's success rate from its features (an online ridge regression, refit
    each step on every observed outcome) and use the prediction as the prompt's prior in place of
    the population prior (docs/screen.md)."""
    screen_relative: float = 0.5
    """A prompt with no history of its own is screened by its prediction only when the prediction sets
    it apart from the pool: its predicted failure rate (or success rate) is at most this share of the
    population's. On a pool where every pilot is a long shot, screening all would starve the batch."""
    features: Literal["ngrams", "policy"] = "ngrams"
    """Where the predictor's features come from: ``ngrams``, hashed character n-grams of the prompt
    text (no model needed); ``policy``, the policy's final hidden state at the prompt's last token
    (a prefill-only forward on the policy ranks, registered by the driver's feature sources)."""
    ngram_dim: int = 512
    """Hashed n-gram features per prompt (``features: ngrams``)."""
    ngram_max: int = 3
    """Character n-grams of length 1 to ``ngram_max`` (``features: ngrams``)."""
    max_features: int = 512
    """Features wider than this (a policy's hidden state) are mapped to this many by a fixed random
    projection, so the per-step ridge solve stays small."""
    ridge_lambda: float = 1.0
    """The ridge penalty on the feature weights (not on the intercept)."""
    recency_half_life: float = 20.0
    """Steps after which an outcome counts half in the predictor's fit (the policy changes)."""
    prior_strength: float | None = None
    """a + b of a predicted prior Beta(m a+b, (1 - m) a+b). None: estimated every step from the
    predictor's out-of-sample errors on pilots (how far the true rates lie from the predictions)."""
    calibration_bins: int = 10
    """Cut the predictions into this many equal bins on [0, 1] and give a prompt the prior fitted to
    the outcomes of the prompts predicted in its bin (docs/screen.md). 0: ``Beta(m s, (1 - m) s)``
    around the prediction m."""
    min_fit: float = 32.0
    """(Faded) outcomes the predictor needs before its predictions replace the population prior."""
    lookahead: int | None = None
    """New prompts a round may draw next whose features are asked for in advance. None: 4 x the
    most new prompts a round may draw."""
    feature_max_age: int | None = None
    """Features computed more than this many steps ago are asked for again (``policy`` features
    change with the policy). None: never."""

    metadata: list[str] = field(default_factory=list)
    """Record fields whose values put each prompt in a bucket with a prior of its own, learned
    online from the bucket's pilots and direct groups and shrunk toward the population
    (docs/metadata_prior.md): ``difficulty``, ``source``, any other scalar field of the data rows,
    ``extra_info.<key>``. Empty: no metadata priors."""
    metadata_bins: int = 8
    """A numeric field with more distinct values than this is cut into this many bins of equal
    counts; one with fewer is read as categories."""
    metadata_shrink: float = 8.0
    """Prompts' worth of the population's moments added to every bucket's: a bucket seen less than
    this is mostly the population."""
    metadata_min_judged: int = 4
    """Coverage guard: the first this many prompts of every bucket drawn in an epoch are piloted
    (or given their rollouts directly), never screened, so every bucket is tried again each epoch
    and one the policy has learned since is found (at most this many pilots a bucket an epoch are
    spent on a hopeless one)."""
    metadata_noise: float = 0.0
    """Share of the prompts whose buckets are shuffled among themselves (the benchmark's ablation of
    rough labels; 0 for real use)."""

    def __post_init__(self) -> None:
        if self.preset in ("history_aware", "screen", "metadata"):
            self.demand_pilots = self.screen = self.direct_commit = self.posterior_evict = True
        if self.preset in ("screen", "metadata"):
            self.predictor = True
        if self.preset == "metadata" and not self.metadata:
            raise ConfigError("metadata", "preset metadata needs the record fields to learn priors from, e.g. metadata=[difficulty]")
        if any(not isinstance(f, str) or not f for f in self.metadata):
            raise ConfigError("metadata", f"must be a list of record field names, got {self.metadata!r}")
        if len(set(self.metadata)) != len(self.metadata):
            raise ConfigError("metadata", f"names a field twice: {self.metadata!r}")
        if self.metadata_bins < 2:
            raise ConfigError("metadata_bins", f"must be >= 2, got {self.metadata_bins}")
        if self.sized and not self.direct_commit:
            raise ConfigError("sized", "needs direct_commit (a sized prompt may get its rollouts directly); set direct_commit=true or a preset")
        if self.short_pilot is not None and self.short_pilot < 0:
            raise ConfigError("short_pilot", f"must be >= 0 rollouts (0: no short pilots), got {self.short_pilot}")
        if self.large_factor < 2:
            raise ConfigError("large_factor", f"must be >= 2 (the larger group is this many times n), got {self.large_factor}")
        if self.metadata_min_judged < 0:
            raise ConfigError("metadata_min_judged", f"must be >= 0, got {self.metadata_min_judged}")
        if self.metadata_shrink <= 0:
            raise ConfigError("metadata_shrink", f"must be > 0 prompts, got {self.metadata_shrink}")
        if not 0.0 <= self.metadata_noise <= 1.0:
            raise ConfigError("metadata_noise", f"must lie in [0, 1], got {self.metadata_noise}")
        _positive("pilot_floor", self.pilot_floor)
        if self.max_new_factor < 1.0:
            raise ConfigError("max_new_factor", f"must be >= 1, got {self.max_new_factor}")
        for name in ("explore", "evict_level", "confidence", "screen_relative"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(name, f"must lie in [0, 1], got {getattr(self, name)}")
        if self.confidence <= 0.5:
            raise ConfigError("confidence", f"must be > 0.5 (a decision taken with less than even odds), got {self.confidence}")
        if self.half_life <= 0:
            raise ConfigError("half_life", f"must be > 0 steps, got {self.half_life}")
        if self.min_evidence < 0:
            raise ConfigError("min_evidence", f"must be >= 0, got {self.min_evidence}")
        _positive("ngram_dim", self.ngram_dim)
        _positive("ngram_max", self.ngram_max)
        _positive("max_features", self.max_features)
        if self.ridge_lambda <= 0:
            raise ConfigError("ridge_lambda", f"must be > 0, got {self.ridge_lambda}")
        if self.recency_half_life <= 0:
            raise ConfigError("recency_half_life", f"must be > 0 steps, got {self.recency_half_life}")
        if self.prior_strength is not None and self.prior_strength <= 0:
            raise ConfigError("prior_strength", f"must be > 0 (or null: estimated), got {self.prior_strength}")
        if self.calibration_bins < 0:
            raise ConfigError("calibration_bins", f"must be >= 0 (0: no bins), got {self.calibration_bins}")
        if self.min_fit < 0:
            raise ConfigError("min_fit", f"must be >= 0, got {self.min_fit}")
        if self.lookahead is not None:
            _positive("lookahead", self.lookahead)
        if self.feature_max_age is not None and self.feature_max_age < 0:
            raise ConfigError("feature_max_age", f"must be >= 0 steps (or null: never), got {self.feature_max_age}")

    @property
    def active(self) -> bool:
        """True when any option is on (the prompt history is then kept)."""
        return self.demand_pilots or self.screen or self.direct_commit or self.posterior_evict or self.predictor or bool(self.metadata)


@dataclass
class AllocationConfig:
    """How rollouts are spent: the strategy and everything it decides with.

    The training group size ``n`` is shared by all three strategies so that comparisons are
    fair: GRPO and DAPO generate ``n`` rollouts per prompt, Pilot-Commit trains on
    ``pilot.n_effective + commit_n`` rollouts per prompt, which must equal ``n``.
    """

    strategy: Literal["pilot_commit", "grpo", "dapo", "speed_rl", "greso", "mopps"] = "pilot_commit"
    """Allocation strategy, by exact registry name."""
    train_batch: int = 128
    """Prompts (training groups) per optimizer step."""
    n: int = 64
    """Rollouts per training group (GRPO's n)."""
    pilot: PilotConfig = field(default_factory=PilotConfig)
    commit_n: int | None = None
    """Extra rollouts per survivor in the commit stage. None: n - pilot.n_effective."""
    p_lower: float = 0.125
    """Keep band lower bound: a pilot with p_hat below it is too hard (deferred to next epoch)."""
    p_upper: float = 0.75
    """Keep band upper bound: a pilot with p_hat above it is too easy (skipped this epoch)."""
    p_evict: float = 1.0
    """A pilot with p_hat >= p_evict removes the prompt from the pool for good."""
    buffer: BufferConfig = field(default_factory=BufferConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    """History-aware options of pilot_commit (off by default)."""
    dapo_batch: int | None = None
    """Prompts DAPO draws per generation round. None: train_batch. (The paper configs write the
    recipe's 3 x train_batch; a default that follows train_batch needs no second change with it.)"""
    max_rounds: int = 10
    """Generation rounds allowed to fill one train batch."""
    on_round_limit: Literal["error", "train_partial"] = "error"
    """When max_rounds pass with the batch short: stop with an error, or train on what is there."""
    speed_rl: SpeedRLConfig = field(default_factory=SpeedRLConfig)
    """SPEED-RL's settings (strategy speed_rl)."""
    greso: GresoConfig = field(default_factory=GresoConfig)
    """GRESO's settings (strategy greso)."""
    mopps: MoppsConfig = field(default_factory=MoppsConfig)
    """MoPPS's settings (strategy mopps)."""
    binding: bool = True
    """Generate a round's pilots and commits in one engine call (the paper's binding). False: two
    calls, new prompts first, then commits (to measure what binding saves)."""

    def __post_init__(self) -> None:
        _positive("train_batch", self.train_batch)
        _positive("n", self.n)
        _positive("max_rounds", self.max_rounds)
        for name in ("p_lower", "p_upper", "p_evict"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(name, f"must lie in [0, 1], got {value}")
        if self.p_lower > self.p_upper:
            raise ConfigError("p_lower", f"must be <= p_upper ({self.p_upper}), got {self.p_lower}")
        if self.dapo_batch is not None:
            _positive("dapo_batch", self.dapo_batch)
        if self.commit_n is not None:
            _positive("commit_n", self.commit_n)
        # What only one strategy needs of these settings, that strategy checks
        # (AllocationStrategy.check_config, called by the root Config and by the strategy).

    @property
    def max_commit_age(self) -> int:
        """The most steps between a pilot and its commit under the buffer's age rule."""
        return self.buffer.max_age + (1 if self.buffer.age_rule == "reference" else 0)

    @property
    def pilot_kept(self) -> int:
        """Pilot rollouts that enter each Pilot-Commit training group."""
        return self.pilot.kept

    @property
    def commit_rollouts(self) -> int:
        """Commit rollouts per survivor."""
        return self.n - self.pilot.kept if self.commit_n is None else self.commit_n

    @property
    def rollouts_per_dapo_round(self) -> int:
        """Prompts DAPO draws per round."""
        return self.train_batch if self.dapo_batch is None else self.dapo_batch



def commit_granularity(commit_n: int, ranks: int) -> int:
    """Smallest number of commits whose rollouts divide evenly over ``ranks`` engines."""
    return ranks // math.gcd(commit_n, ranks)


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise ConfigError(name, f"must be >= 1, got {value}")
