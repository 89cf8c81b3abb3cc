"""``megatron-pc simulate``: compare allocation strategies on a simulated policy, in seconds.

The real allocation strategies (the same classes the trainer drives) run against a stand-in
for the policy, so the comparison exercises every decision they make at full batch sizes.

The model, and why
------------------
* Prompt i has a latent difficulty d_i ~ Normal(difficulty_mean, difficulty_std). The policy
  has one skill s; it solves prompt i with probability p_i = sigmoid(s - d_i) (a Rasch /
  item-response model). A wide difficulty spread gives what real pools show: many prompts
  that are always or never solved, i.e. zero-variance GRPO groups.
  Calibrated instead to a real start model (``--success-rates FILE``, ``SimConfig.success_rates``):
  each prompt draws one measured per-prompt success rate k/m of that model (m samples each) and
  its starting p_i from that rate's posterior Beta(k + 1/2, m - k + 1/2), so d_i = -logit(p_i);
  a prompt measured 0/16 starts rare-but-possible rather than impossible.
* Learning signal (``--learning``, :mod:`megatron_pc.analysis.learning_model`). For a logistic
  p_i, d p_i / d s = p_i (1 - p_i): the expected policy gradient a prompt contributes is largest
  at p = 1/2, which is Proposition 3.1 of the paper (see docs/pilot_commit.md). A sampled GRPO
  group with empirical success rate q and std-normalised advantages contributes a gradient whose
  size along s is proportional to sqrt(q (1 - q)) (its reward std), and exactly 0 for an
  all-equal group. How the skill responds to a step's groups:

  - ``fitted`` (the default): a step of U optimizer updates (from the config's
    ``training.mini_batch`` and ``mini_batch_unit``, as the trainer splits the step) on G
    informative groups of mean reward variance v, N updates into training, moves the skill by
        delta_s = a * U^b * (G/U)^c * (v/0.25)^e / (1 + k N)
    with a, b, c, e, k fitted to measured runs (``megatron-pc fit-simulator BENCH_DIR...``,
    :mod:`megatron_pc.analysis.simulate_fit`; kept in analysis/learning_model.json with the
    held-out error of its predicted rollout ratios, which the output states). Learning grows
    less than linearly with the informative groups of an update (c < 1) and about linearly with
    the updates: what the measured runs show.
  - ``linear`` (the first model): one step moves the skill by
        delta_s = lr * mean_over_groups( sqrt(q_g (1 - q_g)) ) / 0.5  [+ Normal(0, noise) jitter]
    whatever the update count; on the measured runs it picks the wrong winner against GRPO.

  Either way each trained prompt also gets easier by local_lr * sqrt(q_g (1 - q_g)) (fitting the
  prompt itself).
* Validation accuracy is the exact expected accuracy sigmoid(s - d_j) averaged over a
  held-out set of difficulties (no sampling noise), measured after every step.

What it does NOT model: response lengths and token-level effects (so DAPO's overlong shaping
and token-mean vs sequence-mean differences are invisible); off-policy staleness of
committed pilot rollouts (the paper finds it small; here it costs nothing); wall-clock time
(only rollouts are counted); generalisation that differs by topic; forgetting. The fitted
learning model was fitted on the tiny CPU model's runs (docs/benchmarks.md, "The simulator
beside it"): a user's model may learn differently per update; refit it on a few runs of theirs
(``megatron-pc fit-simulator``) when they have them. Use it to compare rollout allocation, not to predict the
accuracy of a real model.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_pc.allocation import Rollout, RoundPlan, TrainGroup, build_strategy, strategy_class
from megatron_pc.allocation.trace import NullTrace, TraceSink, TraceWriter
from megatron_pc.allocation.config import AllocationConfig
from megatron_pc.analysis.learning_model import FittedLearning, check_learning, load_fitted, model_error_hint
from megatron_pc.config import Config, from_dict, load_config, to_dict
from megatron_pc.config_cli import split_config_args
from megatron_pc.errors import ConfigError, RoundLimitError


@dataclass
class SimConfig:
    """The simulated policy and the comparison."""

    pool_size: int = 20_000
    """Training prompts."""
    validation_size: int = 2_000
    """Held-out prompts for the expected validation accuracy."""
    difficulty_mean: float = 1.0
    """Mean latent difficulty (skill starts at 0: the start accuracy is well below 1/2)."""
    difficulty_std: float = 3.0
    """Spread of difficulties; a wide spread makes many all-correct / all-wrong groups."""
    learning: str = "fitted"
    """The learning model: ``fitted`` (to measured runs, :mod:`megatron_pc.analysis.learning_model`)
    or ``linear`` (``lr`` per step in proportion to the groups' reward std)."""
    fitted: FittedLearning | None = None
    """The fitted model's parameters (None: analysis/learning_model.json)."""
    lr: float = 0.02
    """``linear``: skill gained per step from a batch whose every group has reward std 1/2."""
    local_lr: float = 0.5
    """How much easier a trained prompt becomes, per unit of its group's reward std."""
    noise: float = 0.0
    """Std of a random jitter added to each step's skill change."""
    target_accuracy: float = 0.6
    """Validation accuracy a run must reach; rollouts spent until then are the score."""
    max_steps: int = 400
    """A run that has not reached the target by then is reported as not reaching it."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    """One run per seed and strategy."""
    strategies: list[str] = field(default_factory=lambda: ["pilot_commit", "grpo", "dapo"])
    """Strategies to compare."""
    success_rates: list[float] | None = None
    """Measured per-prompt success rates of a start model (each k / ``success_samples``). When
    set, prompt difficulties come from them (see the module docstring) instead of
    ``difficulty_mean`` / ``difficulty_std``."""
    success_samples: int = 16
    """Samples behind each measured success rate (the width of its posterior)."""


class SimulatedPolicy:
    """Solves prompt i with probability sigmoid(skill - difficulty_i); learns from groups."""

    def __init__(self, sim: SimConfig, seed: int) -> None:
        rng = random.Random(seed)
        self.sim = sim
        self.skill = 0.0
        self.updates_done = 0
        self.learning = sim.fitted if sim.learning == "fitted" else None
        if sim.learning == "fitted" and self.learning is None:
            self.learning = load_fitted()[0]
        self.difficulty = [self._draw_difficulty(rng) for _ in range(sim.pool_size)]
        self.validation = [self._draw_difficulty(rng) for _ in range(sim.validation_size)]
        self._rng = random.Random(seed + 7919)

    def _draw_difficulty(self, rng: random.Random) -> float:
        """One prompt's latent difficulty: Gaussian, or from a measured success rate."""
        if self.sim.success_rates is None:
            return rng.gauss(self.sim.difficulty_mean, self.sim.difficulty_std)
        m = self.sim.success_samples
        k = rng.choice(self.sim.success_rates) * m
        p = min(max(rng.betavariate(k + 0.5, m - k + 0.5), 1e-9), 1.0 - 1e-9)
        return -math.log(p / (1.0 - p))  # skill 0 solves it with probability p

    def p(self, prompt: int) -> float:
        """Probability of solving a training prompt now."""
        return _sigmoid(self.skill - self.difficulty[prompt])

    def generate(self, plan: RoundPlan) -> list[list[Rollout]]:
        """Sampled, rewarded rollouts for every request of the round."""
        out = []
        for req in plan.requests:
            p = self.p(req.prompt)
            wins = [self._rng.random() < p for _ in range(req.n)]
            out.append([Rollout(1.0 if w else 0.0, w) for w in wins])
        return out

    def train(self, groups: list[Any], updates: int = 1) -> None:
        """One training step of ``updates`` optimizer updates on a batch of groups (see the
        module docstring)."""
        if not groups:
            return
        signals = []
        for g in groups:
            q = g.successes / g.size
            signal = math.sqrt(q * (1.0 - q))
            signals.append(signal)
            self.difficulty[g.prompt] -= self.sim.local_lr * signal
        jitter = self._rng.gauss(0.0, self.sim.noise) if self.sim.noise else 0.0
        self.updates_done += updates
        if self.learning is None:
            self.skill += self.sim.lr * (sum(signals) / len(signals)) / 0.5 + jitter
            return
        live = [s * s for s in signals if s > 0.0]  # the informative groups' reward variances q (1 - q)
        variance = sum(live) / len(live) if live else 0.0
        self.skill += self.learning.step_gain(updates, len(live), variance, self.updates_done) + jitter

    def validation_accuracy(self) -> float:
        """Exact expected accuracy on the held-out prompts."""
        return sum(_sigmoid(self.skill - d) for d in self.validation) / len(self.validation)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0


def run_one(cfg: Config, sim: SimConfig, strategy: str, seed: int, trace: TraceSink | None = None) -> dict[str, Any]:
    """Train one simulated policy with one strategy; return when it hits the target or max_steps."""
    alloc = _with_strategy(cfg, strategy)
    policy = SimulatedPolicy(sim, seed)
    strat = build_strategy(alloc, sim.pool_size, seed, cfg.rollout.engines, trace)
    start_acc = acc = policy.validation_accuracy()
    curve = [(0, 0, acc)]
    reached_at: tuple[int, int] | None = None
    stopped: str | None = None
    m: dict[str, float] = {}
    for step in range(1, sim.max_steps + 1):
        try:
            while not strat.batch_ready():
                plan = strat.plan_round()
                strat.observe(plan, policy.generate(plan))
        except RoundLimitError as err:  # e.g. every prompt evicted: the run ends here, as a real one would
            stopped = str(err)
            break
        result = strat.finish_step()
        m = result.metrics
        policy.train(result.groups, step_updates(cfg, alloc, result.groups))
        acc = policy.validation_accuracy()
        generated = int(result.metrics["cum_generated"])
        curve.append((step, generated, acc))
        if acc >= sim.target_accuracy:
            reached_at = (step, generated)
            break
        if cfg.training.budget_spent(generated):  # training.rollout_budget: the step that spends it is the last
            break
    return {
        "strategy": strategy,
        "seed": seed,
        "stopped": stopped,
        "reached": reached_at is not None,
        "steps_to_target": reached_at[0] if reached_at else None,
        "rollouts_to_target": reached_at[1] if reached_at else None,
        "start_accuracy": start_acc,
        "final_accuracy": acc,
        "steps": curve[-1][0],
        "rollouts_generated": int(m.get("cum_generated", 0)),
        "rollouts_trained": int(m.get("cum_trained_rollouts", 0)),
        "prompts_evicted": int(m.get("cum_prompts_evicted", 0)),
        "curve": curve,
    }


def step_updates(cfg: Config, alloc: AllocationConfig, groups: list[TrainGroup]) -> int:
    """Optimizer updates of a step, as the trainer splits it (driver/update.py plan_rows):
    mini-batches of ``training.mini_batch`` groups, or of ``mini_batch`` x the strategy's
    rollouts per generation call (``mini_batch_unit=call_rollouts``, the reference recipe)."""
    t = cfg.training
    if not groups:
        return 0
    if t.mini_batch_unit == "groups":
        return math.ceil(len(groups) / t.mini_batch)
    size = t.mini_batch * strategy_class(alloc.strategy).rollouts_per_call(alloc)
    return math.ceil(sum(g.size for g in groups) / size)


LABELS = {"pc_history": ("pilot_commit", {"preset": "history_aware"}), "pc_screen": ("pilot_commit", {"preset": "screen"})}
"""Names ``--strategies`` also takes: (strategy, allocation.history settings). ``pc_history`` is
history-aware Pilot-Commit with the config's history parameters (docs/history_aware.md);
``pc_screen`` adds the screen's predictor (docs/screen.md), which in the simulator has no prompt
text and so no features: it runs on the population prior, as pc_history does. The benchmark's
``pc_screen_policy`` differs from pc_screen only in its features, so it is not simulated apart."""


def _with_strategy(cfg: Config, strategy: str) -> AllocationConfig:
    data = to_dict(cfg.allocation)
    strategy, history = LABELS.get(strategy, (strategy, {}))
    data["strategy"] = strategy
    data["history"] = {**data["history"], **history}
    return from_dict(AllocationConfig, data, "allocation")


def summarize(runs: list[dict[str, Any]], strategies: list[str]) -> dict[str, Any]:
    """Median and spread of rollouts-to-target per strategy, and ratios against Pilot-Commit."""
    summary: dict[str, Any] = {}
    for name in strategies:
        mine = [r for r in runs if r["strategy"] == name]
        hits = [r["rollouts_to_target"] for r in mine if r["reached"]]
        summary[name] = {
            "runs": len(mine),
            "reached": len(hits),
            "median_rollouts_to_target": statistics.median(hits) if hits else None,
            "min_rollouts_to_target": min(hits) if hits else None,
            "max_rollouts_to_target": max(hits) if hits else None,
            "median_steps_to_target": statistics.median([r["steps_to_target"] for r in mine if r["reached"]]) if hits else None,
            "mean_final_accuracy": statistics.fmean(r["final_accuracy"] for r in mine),
        }
    pc = summary.get("pilot_commit", {}).get("median_rollouts_to_target")
    for name, s in summary.items():
        s["x_vs_pilot_commit"] = (s["median_rollouts_to_target"] / pc) if pc and s["median_rollouts_to_target"] else None
    return summary


def format_table(summary: dict[str, Any], sim: SimConfig, start_acc: float) -> str:
    """A human-readable comparison table."""
    lines = [
        f"target validation accuracy {sim.target_accuracy:.3f} (start {start_acc:.3f}), {len(sim.seeds)} seeds, "
        f"pool {sim.pool_size}, at most {sim.max_steps} steps",
        f"{'strategy':<14}{'reached':>8}{'median rollouts':>17}{'min':>10}{'max':>10}{'steps':>8}{'vs PC':>8}",
    ]
    for name, s in summary.items():
        med, ratio = s["median_rollouts_to_target"], s["x_vs_pilot_commit"]
        lo, hi, steps = s["min_rollouts_to_target"], s["max_rollouts_to_target"], s["median_steps_to_target"]
        lines.append(
            f"{name:<14}{s['reached']:>5}/{s['runs']:<2}"
            + (f"{med:>17,.0f}{lo:>10,}{hi:>10,}{steps:>8.0f}" if med else f"{'not reached':>17}{'-':>10}{'-':>10}{'-':>8}")
            + (f"{ratio:>7.2f}x" if ratio else f"{'-':>8}")
        )
    return "\n".join(lines)


class _Tagged:
    """Adds the run's strategy and seed to every trace event."""

    def __init__(self, sink: TraceSink, strategy: str, seed: int) -> None:
        self.sink, self.tags = sink, {"strategy": strategy, "seed": seed}

    def emit(self, event: dict[str, Any]) -> None:
        self.sink.emit({**event, **self.tags})

    def flush(self) -> None:
        self.sink.flush()


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="megatron-pc simulate", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", help="experiment YAML (its allocation section is used); default: embedded")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. allocation.pilot.n=8")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    parser.add_argument("--trace", metavar="FILE", help="write every allocation decision as JSON lines")
    parser.add_argument("--seeds", type=int, help="number of seeds (0..N-1)")
    parser.add_argument("--strategies", help="comma-separated strategies to compare")
    parser.add_argument("--success-rates", metavar="FILE",
                        help='JSON: measured per-prompt success rates of a start model, [0.25, ...] or {"rates": [...], "samples": 16}')  # fmt: skip
    parser.add_argument("--learning", choices=("fitted", "linear"),
                        help="learning model: fitted to measured runs (default) or the first, linear one (module docstring)")
    parser.add_argument("--learning-params", metavar="FILE", help="the fitted model's parameters (default: analysis/learning_model.json)")
    for name in ("pool_size", "max_steps"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int)
    for name in ("target_accuracy", "difficulty_mean", "difficulty_std", "lr", "local_lr", "noise"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float)
    return parser.parse_args(argv)


def _sim_config(args: argparse.Namespace) -> SimConfig:
    sim = SimConfig()
    for name in ("pool_size", "max_steps", "target_accuracy", "difficulty_mean", "difficulty_std", "lr", "local_lr", "noise"):
        if getattr(args, name) is not None:
            setattr(sim, name, getattr(args, name))
    if args.seeds is not None:
        if args.seeds < 1:
            raise ConfigError("--seeds", f"must be >= 1, got {args.seeds}")
        sim.seeds = list(range(args.seeds))
    if args.strategies:
        sim.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if args.success_rates:
        sim.success_rates, sim.success_samples = read_success_rates(args.success_rates)
    if args.learning is not None:
        sim.learning = args.learning
    check_learning(sim.learning)
    if sim.learning == "fitted" and args.lr is not None:
        raise ConfigError("--lr", "sets the linear model's learning rate; add --learning linear (the fitted model has no lr)")
    if sim.learning == "fitted":
        sim.fitted = load_fitted(args.learning_params)[0]
    if not 0.0 < sim.target_accuracy < 1.0:
        raise ConfigError("--target-accuracy", f"must lie in (0, 1), got {sim.target_accuracy}")
    for name in ("pool_size", "max_steps"):
        if getattr(sim, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}", f"must be >= 1, got {getattr(sim, name)}")
    return sim


def read_success_rates(path: str) -> tuple[list[float], int]:
    """(rates, samples per rate) from a JSON file: a list of rates, or {"rates": [...], "samples": m}."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError("--success-rates", f"cannot read {path}: {err}") from None
    rates, samples = (data.get("rates"), data.get("samples", 16)) if isinstance(data, dict) else (data, 16)
    if not isinstance(rates, list) or not rates or not all(isinstance(r, (int, float)) and 0.0 <= r <= 1.0 for r in rates):
        raise ConfigError("--success-rates", f"{path}: must hold a non-empty list of success rates in [0, 1]")
    if not isinstance(samples, int) or samples < 1:
        raise ConfigError("--success-rates", f"{path}: 'samples' must be an integer >= 1, got {samples!r}")
    return [float(r) for r in rates], samples


def main(argv: list[str] | None = None) -> int:
    """Run every strategy on every seed and print rollouts-to-target."""
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    cfg = load_config(*split_config_args(args.config, args.overrides))
    sim = _sim_config(args)
    for name in sim.strategies:
        _with_strategy(cfg, name)  # validate each strategy's settings before any work
    writer = TraceWriter(args.trace) if args.trace else None
    t0 = time.perf_counter()
    runs = []
    for name in sim.strategies:
        for seed in sim.seeds:
            trace = _Tagged(writer, name, seed) if writer else NullTrace()
            runs.append(run_one(cfg, sim, name, seed, trace))
    summary = summarize(runs, sim.strategies)
    seconds = time.perf_counter() - t0
    record = _learning_record(args.learning_params)
    if args.json:
        sim_fields = {**sim.__dict__, "fitted": sim.fitted.as_dict() if sim.fitted else None}
        out = {"sim": sim_fields, "allocation": _alloc_summary(cfg), "summary": summary, "runs": runs, "seconds": seconds,
               "learning": {"model": sim.learning, "error": model_error_hint(sim.learning, record),
                            "held_out": (record or {}).get("held_out")}}  # fmt: skip
        print(json.dumps(out, indent=1))
    else:
        print(format_table(summary, sim, runs[0]["start_accuracy"]))
        reached = {n: s["median_rollouts_to_target"] for n, s in summary.items() if s["median_rollouts_to_target"]}
        if reached:
            best = min(reached, key=reached.__getitem__)
            print(f"fewest rollouts to the target: {best} (median {reached[best]:,.0f})")
        print(model_error_hint(sim.learning, record))
        print(f"({seconds:.1f} s)")
    return 0


def _learning_record(path: str | None) -> dict[str, Any] | None:
    """The fitted model's record (its held-out error), None when there is none to read."""
    try:
        return load_fitted(path)[1]
    except ConfigError:
        return None


def _alloc_summary(cfg: Config) -> dict[str, Any]:
    a = cfg.allocation
    return {
        "train_batch": a.train_batch,
        "n": a.n,
        "pilot_n": a.pilot.n,
        "pilot_kept": a.pilot_kept,
        "commit_n": a.commit_rollouts,
        "pilot_batch": a.pilot.batch,
        "band": [a.p_lower, a.p_upper],
        "p_evict": a.p_evict,
        "max_age": a.buffer.max_age,
    }
