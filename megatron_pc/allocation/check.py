"""Check an allocation trace against the invariants every run must satisfy.

Used by the tests and by ``megatron-pc train`` users who want to audit a run: it reads only
the trace, so it checks what actually happened, not what the code meant to do.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from megatron_pc.allocation import STRATEGIES, AllocationStrategy
from megatron_pc.allocation.config import AllocationConfig
from megatron_pc.allocation.pilot_commit import short_pilot
from megatron_pc.allocation.predictor import apart


def check_trace(events: Iterable[dict[str, Any]], cfg: AllocationConfig) -> list[str]:
    """Every broken invariant of one run's trace, as readable lines (empty: all hold)."""
    strategy = STRATEGIES[cfg.strategy]
    problems: list[str] = []
    kept_pilot: dict[int, tuple[int, int]] = {}  # prompt -> (step, size) of its waiting kept pilot
    evicted: set[int] = set()
    generated: dict[int, dict[str, int]] = defaultdict(lambda: {"pilot": 0, "commit": 0, "full": 0})
    trained: dict[int, int] = defaultdict(int)
    batch_prompts: dict[int, set[int]] = defaultdict(set)  # step -> prompts of its train groups
    skips, selection = _Skips(), _Selection()
    for e in events:
        kind, step = e["event"], e.get("step")
        if kind in ("pilot", "full", "direct", "screen") and e["prompt"] in evicted:
            problems.append(f"step {step}: evicted prompt {e['prompt']} was drawn again")
        if kind in ("pilot", "direct", "screen"):
            problems += _check_prediction(e, cfg)
        if kind == "pilot":
            generated[step]["pilot"] += e["n"]
            problems += _check_pilot(e, cfg, strategy)
            if e["decision"] == "keep":
                kept_pilot[e["prompt"]] = (step, e["n"])
            if e["evict"]:
                evicted.add(e["prompt"])
        elif kind == "commit":
            generated[step]["commit"] += e["n"]
            if "successes" in e and not 0 <= e["successes"] <= e["n"]:
                problems.append(f"step {step}: commit of prompt {e['prompt']} reports {e['successes']} successes of {e['n']}")
            pilot_step, pilot_n = kept_pilot.pop(e["prompt"], (None, 0))
            if pilot_step != e["pilot_step"]:
                problems.append(f"step {step}: commit of prompt {e['prompt']} has no waiting kept pilot from step {e['pilot_step']}")
            elif cfg.strategy == "pilot_commit" and e["n"] != cfg.n - (kept := cfg.pilot_kept if pilot_n == cfg.pilot.n else pilot_n):
                problems.append(f"step {step}: commit of prompt {e['prompt']} has {e['n']} rollouts; with the {pilot_n} of its pilot "
                                f"(kept: {kept}) its group is not n = {cfg.n}")  # fmt: skip
            max_age = strategy.max_commit_age(cfg)
            if step - e["pilot_step"] < 0 or max_age is not None and step - e["pilot_step"] > max_age:
                problems.append(
                    f"step {step}: prompt {e['prompt']} committed {step - e['pilot_step']} steps after its pilot "
                    f"(max_age {cfg.buffer.max_age}, age_rule {cfg.buffer.age_rule})"
                )
        elif kind == "full":
            generated[step]["full"] += e["n"]
            selection.check_full(e, problems)
            problems += skips.observe(e)
        elif kind == "skip_check":  # GRESO: a prompt judged before any rollout
            problems += skips.check(e, cfg)
        elif kind == "select":  # MoPPS: the step's Thompson-sampled choice
            problems += selection.check(e)
        elif kind == "direct":  # history-aware Pilot-Commit: n rollouts without a pilot
            generated[step]["full"] += e["n"]
            problems += _check_direct(e, cfg)
            if e["evict"]:
                evicted.add(e["prompt"])
        elif kind == "generate":  # the driver's record of the policy version behind a round
            lag = step - 1 - e["policy_version"]
            if not 0 <= lag <= 1:
                problems.append(f"step {step}: round {e['round']} generated with policy version {e['policy_version']}, {lag} steps "
                                "behind the policy it trains (at most 1: pipelined mode)")  # fmt: skip
        elif kind == "screen":
            problems += _check_screen(e, cfg)
        elif kind == "train_group":
            trained[step] += e["size"]
            if e["prompt"] in batch_prompts[step]:
                problems.append(f"step {step}: prompt {e['prompt']} is in the train batch twice")
            batch_prompts[step].add(e["prompt"])
            problems += _check_group(e, cfg)
        elif kind == "step_end":
            if e["generated"] != generated[step]:
                problems.append(f"step {step}: step_end reports generated {e['generated']}, the events add up to {dict(generated[step])}")
            if e["trained"] != trained[step]:
                problems.append(f"step {step}: step_end reports {e['trained']} trained rollouts, train_group events add up to {trained[step]}")
            if strategy.trains_full_batch and e["trained"] != cfg.train_batch * cfg.n:
                problems.append(f"step {step}: GRPO trained {e['trained']} rollouts, not train_batch x n = {cfg.train_batch * cfg.n}")
        elif kind == "epoch_end":
            kept_pilot.clear()  # a buffer of kept pilots (Pilot-Commit) is dropped at epoch end
    return problems


def _check_pilot(e: dict[str, Any], cfg: AllocationConfig, strategy: type[AllocationStrategy]) -> list[str]:
    p_hat = e["successes"] / e["n"]
    expected = strategy.pilot_decision(cfg, e["successes"], e["n"])
    out = []
    if expected is None:
        return [f"step {e['step']}: prompt {e['prompt']} was piloted, but {strategy.name} pilots nothing"]
    if e["decision"] != expected:
        out.append(f"step {e['step']}: prompt {e['prompt']} with p_hat {p_hat:.3f} was {e['decision']}, expected {expected}")
    if cfg.strategy == "pilot_commit":
        sizes = {cfg.pilot.n, short_pilot(cfg)} - {0}
        if e["n"] not in sizes:
            out.append(f"step {e['step']}: prompt {e['prompt']} was piloted with {e['n']} rollouts, not {' or '.join(map(str, sorted(sizes)))} "
                       "(pilot.n, or history.short_pilot with sized)")  # fmt: skip
    if not strategy.evicts:
        return out + ([f"step {e['step']}: prompt {e['prompt']} was evicted, but {strategy.name} evicts nothing"] if e["evict"] else [])
    return out + _check_evict(e, p_hat, cfg)


class _Skips:
    """GRESO's invariants: a prompt is judged by the zero-variance streak its own rollouts in the
    trace show, at the keep probability its base and streak give, and a skipped prompt gets no
    rollout in that round."""

    def __init__(self) -> None:
        self.streaks: dict[int, tuple[str, int]] = {}
        self.skipped: set[tuple[int, int, int]] = set()  # (step, round, prompt)

    def observe(self, e: dict[str, Any]) -> list[str]:
        """A rolled-out group: its prompt's streak grows, restarts or ends."""
        out = []
        if (e["step"], e["round"], e["prompt"]) in self.skipped:
            out.append(f"step {e['step']}: prompt {e['prompt']} was skipped and rolled out in the same round")
        kind = "easy" if e["successes"] == e["n"] else "hard" if e["successes"] == 0 else None
        if kind is None:
            self.streaks.pop(e["prompt"], None)
            return out
        before_kind, before = self.streaks.get(e["prompt"], (kind, 0))
        self.streaks[e["prompt"]] = (kind, before + 1 if before_kind == kind else 1)
        return out

    def check(self, e: dict[str, Any], cfg: AllocationConfig) -> list[str]:
        """One skip decision against the trace's history of its prompt."""
        from megatron_pc.allocation.greso import keep_probability

        g, where = cfg.greso, f"step {e['step']}: GRESO's judgement of prompt {e['prompt']}"
        out = []
        if (e["kind"], e["streak"]) != self.streaks.get(e["prompt"], ("easy", 0)):
            out.append(f"{where} rests on a {e['kind']} streak of {e['streak']}, the trace shows {self.streaks.get(e['prompt'], ('none', 0))}")
        if e["streak"] < 1:
            out.append(f"{where}: a prompt without a zero-variance streak is never judged")
        if not (min(g.min_p, g.p_easy, g.p_hard) - 1e-12 <= e["base"] <= max(g.max_p, g.p_easy, g.p_hard) + 1e-12):
            out.append(f"{where}: base probability {e['base']} outside [{g.min_p}, {g.max_p}]")
        if abs(e["keep_probability"] - keep_probability(e["base"], e["streak"], g.keep_floor)) > 1e-12:
            out.append(f"{where}: keep probability {e['keep_probability']} is not max(base^streak, {g.keep_floor})")
        if e["skipped"]:
            self.skipped.add((e["step"], e["round"], e["prompt"]))
        return out


class _Selection:
    """MoPPS's invariants: the chosen prompts are the k candidates whose Thompson samples lie
    closest to the target, and exactly they are rolled out in that round."""

    def __init__(self) -> None:
        self.chosen: dict[tuple[int, int], set[int]] = {}

    def check(self, e: dict[str, Any]) -> list[str]:
        """One step's choice."""
        from megatron_pc.allocation.mopps import closest_to_target

        samples = {int(p): float(s) for p, s in e["candidates"]}
        out = []
        if any(not 0.0 <= s <= 1.0 for s in samples.values()):
            out.append(f"step {e['step']}: a Thompson sample outside [0, 1]")
        expected = closest_to_target(samples, e["target"], e["k"])
        if sorted(expected) != sorted(e["chosen"]):
            out.append(f"step {e['step']}: MoPPS chose {sorted(e['chosen'])}, the samples closest to {e['target']} are {sorted(expected)}")
        self.chosen[(e["step"], e["round"])] = set(e["chosen"])
        return out

    def check_full(self, e: dict[str, Any], problems: list[str]) -> None:
        """A rolled-out prompt of a round with a choice must be one of the chosen."""
        chosen = self.chosen.get((e["step"], e["round"]))
        if chosen is not None and e["prompt"] not in chosen:
            problems.append(f"step {e['step']}: prompt {e['prompt']} was rolled out but MoPPS did not choose it")


def _check_evict(e: dict[str, Any], p_hat: float, cfg: AllocationConfig) -> list[str]:
    h = cfg.history
    if h.posterior_evict:
        if "evict_prob" not in e:
            return [f"step {e['step']}: prompt {e['prompt']}: posterior eviction is on but the event has no evict_prob"]
        if e["evict"] != (e["evict_prob"] >= h.confidence):
            return [f"step {e['step']}: prompt {e['prompt']} with P(p > {h.evict_level}) = {e['evict_prob']} evict={e['evict']} (confidence {h.confidence})"]
        return []
    if e["evict"] != (p_hat >= cfg.p_evict):
        return [f"step {e['step']}: prompt {e['prompt']} with p_hat {p_hat:.3f} evict={e['evict']} (p_evict {cfg.p_evict})"]
    return []


def _check_direct(e: dict[str, Any], cfg: AllocationConfig) -> list[str]:
    out = []
    if not cfg.history.direct_commit:
        out.append(f"step {e['step']}: prompt {e['prompt']} was given its rollouts directly, but allocation.history.direct_commit is off")
    sizes = (cfg.n, cfg.history.large_factor * cfg.n) if cfg.history.sized else (cfg.n,)
    if e["n"] not in sizes:  # a large group is trained whole, as one group (its train_group event has that size)
        out.append(f"step {e['step']}: direct prompt {e['prompt']} got {e['n']} rollouts, not {' or '.join(map(str, sizes))} (n{', or large_factor x n with sized' if cfg.history.sized else ''})")
    p_hat = e["successes"] / e["n"]
    if e["decision"] == "too_hard" and not p_hat < cfg.p_lower or e["decision"] == "too_easy" and not p_hat > cfg.p_upper:
        out.append(f"step {e['step']}: direct prompt {e['prompt']} with p_hat {p_hat:.3f} was {e['decision']}")
    return out + _check_evict(e, p_hat, cfg)


def _check_screen(e: dict[str, Any], cfg: AllocationConfig) -> list[str]:
    h = cfg.history
    if not h.screen:
        return [f"step {e['step']}: prompt {e['prompt']} was screened, but allocation.history.screen is off"]
    # With the predictor, a prediction that sets the prompt apart from the pool stands for evidence (docs/screen.md).
    # So does a calibrated bucket prior of the record's metadata (docs/metadata_prior.md).
    source = e.get("prior_source")
    if source is not None and not h.metadata:
        return [f"step {e['step']}: prompt {e['prompt']} was screened by a {source} prior, but allocation.history.metadata is off"]
    has_prior = (h.predictor and e.get("predicted_p") is not None) or source == "metadata"
    predicted = has_prior and e.get("population_mean") is not None and apart(e["mean"], e["population_mean"], h.screen_relative)
    if e["p_keep"] > 1.0 - h.confidence or (e["evidence"] < h.min_evidence and not predicted):
        return [f"step {e['step']}: prompt {e['prompt']} screened with p_keep {e['p_keep']} and evidence {e['evidence']} "
                f"(needs p_keep <= {1.0 - h.confidence:.3f} and evidence >= {h.min_evidence}"
                f"{f' or a prediction whose failure or success rate is <= {h.screen_relative} x the population mean' if h.predictor else ''})"]  # fmt: skip
    return []


def _check_prediction(e: dict[str, Any], cfg: AllocationConfig) -> list[str]:
    """With the predictor on, every judged prompt carries its prediction (None: no features or no
    fit yet), a probability; with it off, none does."""
    where = f"step {e['step']}: {e['event']} of prompt {e['prompt']}"
    if not cfg.history.predictor:
        return [f"{where} carries a predicted_p, but allocation.history.predictor is off"] if e.get("predicted_p") is not None else []
    if "predicted_p" not in e:
        return [f"{where}: the predictor is on but the event has no predicted_p"]
    p = e["predicted_p"]
    if p is not None and not 0.0 <= p <= 1.0:
        return [f"{where}: predicted_p {p} is not a probability"]
    if e["event"] == "pilot" and not 0.0 <= e.get("p_keep_population", 0.0) <= 1.0 + 1e-9:
        return [f"{where}: p_keep_population {e['p_keep_population']} is not a probability"]
    return []


def _check_group(e: dict[str, Any], cfg: AllocationConfig) -> list[str]:
    out = []
    sizes = (cfg.n, cfg.history.large_factor * cfg.n) if cfg.strategy == "pilot_commit" and cfg.history.sized else (cfg.n,)
    if e["size"] not in sizes:
        out.append(f"step {e['step']}: training group of prompt {e['prompt']} has {e['size']} rollouts, not {' or '.join(map(str, sizes))}")
    if STRATEGIES[cfg.strategy].drops_uniform_groups and e["successes"] in (0, e["size"]):
        out.append(f"step {e['step']}: DAPO trained on prompt {e['prompt']} whose rollouts all scored alike")
    return out
