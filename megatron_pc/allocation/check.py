"""Check an allocation trace against the invariants every run must satisfy.

Used by the tests and by ``megatron-pc train`` users who want to audit a run: it reads only
the trace, so it checks what actually happened, not what the code meant to do.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from megatron_pc.allocation import STRATEGIES
from megatron_pc.allocation.config import AllocationConfig
from megatron_pc.allocation.predictor import apart


def check_trace(events: Iterable[dict[str, Any]], cfg: AllocationConfig) -> list[str]:
    """Every broken invariant of one run's trace, as readable lines (empty: all hold)."""
    strategy = STRATEGIES[cfg.strategy]
    problems: list[str] = []
    kept_pilot: dict[int, int] = {}  # prompt -> step of its waiting kept pilot
    evicted: set[int] = set()
    generated: dict[int, dict[str, int]] = defaultdict(lambda: {"pilot": 0, "commit": 0, "full": 0})
    trained: dict[int, int] = defaultdict(int)
    batch_prompts: dict[int, set[int]] = defaultdict(set)  # step -> prompts of its train groups
    for e in events:
        kind, step = e["event"], e.get("step")
        if kind in ("pilot", "full", "direct", "screen") and e["prompt"] in evicted:
            problems.append(f"step {step}: evicted prompt {e['prompt']} was drawn again")
        if kind in ("pilot", "direct", "screen"):
            problems += _check_prediction(e, cfg)
        if kind == "pilot":
            generated[step]["pilot"] += e["n"]
            problems += _check_pilot(e, cfg)
            if e["decision"] == "keep":
                kept_pilot[e["prompt"]] = step
            if e["evict"]:
                evicted.add(e["prompt"])
        elif kind == "commit":
            generated[step]["commit"] += e["n"]
            if "successes" in e and not 0 <= e["successes"] <= e["n"]:
                problems.append(f"step {step}: commit of prompt {e['prompt']} reports {e['successes']} successes of {e['n']}")
            if kept_pilot.pop(e["prompt"], None) != e["pilot_step"]:
                problems.append(f"step {step}: commit of prompt {e['prompt']} has no waiting kept pilot from step {e['pilot_step']}")
            if not 0 <= step - e["pilot_step"] <= cfg.max_commit_age:
                problems.append(
                    f"step {step}: prompt {e['prompt']} committed {step - e['pilot_step']} steps after its pilot "
                    f"(max_age {cfg.buffer.max_age}, age_rule {cfg.buffer.age_rule})"
                )
        elif kind == "full":
            generated[step]["full"] += e["n"]
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


def _check_pilot(e: dict[str, Any], cfg: AllocationConfig) -> list[str]:
    p_hat = e["successes"] / e["n"]
    expected = "too_easy" if p_hat > cfg.p_upper else "too_hard" if p_hat < cfg.p_lower else "keep"
    out = []
    if e["decision"] != expected:
        out.append(f"step {e['step']}: prompt {e['prompt']} with p_hat {p_hat:.3f} was {e['decision']}, expected {expected}")
    return out + _check_evict(e, p_hat, cfg)


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
    if e["n"] != cfg.n:
        out.append(f"step {e['step']}: direct prompt {e['prompt']} got {e['n']} rollouts, not n = {cfg.n}")
    p_hat = e["successes"] / e["n"]
    if e["decision"] == "too_hard" and not p_hat < cfg.p_lower or e["decision"] == "too_easy" and not p_hat > cfg.p_upper:
        out.append(f"step {e['step']}: direct prompt {e['prompt']} with p_hat {p_hat:.3f} was {e['decision']}")
    return out + _check_evict(e, p_hat, cfg)


def _check_screen(e: dict[str, Any], cfg: AllocationConfig) -> list[str]:
    h = cfg.history
    if not h.screen:
        return [f"step {e['step']}: prompt {e['prompt']} was screened, but allocation.history.screen is off"]
    # With the predictor, a prediction that sets the prompt apart from the pool stands for evidence (docs/screen.md).
    predicted = h.predictor and e.get("predicted_p") is not None and e.get("population_mean") is not None and apart(e["mean"], e["population_mean"], h.screen_relative)
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
    if e["size"] != cfg.n:
        out.append(f"step {e['step']}: training group of prompt {e['prompt']} has {e['size']} rollouts, not n = {cfg.n}")
    if STRATEGIES[cfg.strategy].drops_uniform_groups and e["successes"] in (0, e["size"]):
        out.append(f"step {e['step']}: DAPO trained on prompt {e['prompt']} whose rollouts all scored alike")
    return out
