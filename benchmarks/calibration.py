"""What ``bench rollouts`` measures about a regime before training, and what it predicts.

* :func:`calibrate`: the start model's per-prompt success rates (``SAMPLES`` samples at
  temperature 1, the warm-up's own sampler) on the regime's validation prompts, hence its
  zero-variance share z and the keep rate Pilot-Commit's pilots should see.
* :func:`matched_grpo_batch`, :func:`sized_pilot_batch`: the two ablations' sizes.
* :func:`simulate_regime`: ``megatron-pc simulate`` with the measured success rates as its
  starting distribution and its learning rate scaled so the simulated GRPO gains what the real
  one gained; its predicted ratios use the report's own targets and rules.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from megatron_pc.allocation.config import commit_granularity
from megatron_pc.analysis.regimes import Regime
from megatron_pc.analysis.report import summarize
from megatron_pc.analysis.runs import REFERENCE, Run, relative_path

SAMPLES = 16
"""Samples per prompt when measuring success rates (z counts prompts whose samples all agree)."""
AGREE = 0.2
"""A predicted ratio within this share of the measured one agrees (the simulator's goal)."""
MAX_BATCH_FACTOR = 8
"""The matched GRPO batch is at most this many train batches (z near 1 would ask for thousands)."""


def _beta_binomial(j: int, n: int, a: float, b: float) -> float:
    """P(j successes of n) when p ~ Beta(a, b)."""
    log = (math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + math.lgamma(j + a) + math.lgamma(n - j + b)
           - math.lgamma(n + a + b) - math.lgamma(a) - math.lgamma(b) + math.lgamma(a + b))  # fmt: skip
    return math.exp(log)


def predicted_keep_rate(rates: list[float], samples: int, pilot_n: int, p_lower: float, p_upper: float) -> float:
    """Share of prompts whose ``pilot_n`` pilots land in the keep band, for prompts whose success
    rate was measured as k / ``samples`` (p from its posterior Beta(k + 1/2, samples - k + 1/2))."""
    band = [j for j in range(pilot_n + 1) if p_lower <= j / pilot_n <= p_upper]
    total = 0.0
    for rate in rates:
        k = rate * samples
        total += sum(_beta_binomial(j, pilot_n, k + 0.5, samples - k + 0.5) for j in band)
    return total / len(rates)


def zero_variance_share(rates: list[float]) -> float:
    """Share of prompts whose measured samples were all right or all wrong."""
    return sum(1 for r in rates if r in (0.0, 1.0)) / len(rates)


def matched_grpo_batch(train_batch: int, z: float, n: int, engines: int) -> int:
    """GRPO prompts per step for ``train_batch`` informative groups when a share z has zero variance,
    rounded up so a step's rollouts divide over the engines."""
    batch = min(math.ceil(train_batch / max(1.0 - z, 1.0 / MAX_BATCH_FACTOR)), MAX_BATCH_FACTOR * train_batch)
    step = commit_granularity(n, engines)
    return math.ceil(batch / step) * step


def sized_pilot_batch(train_batch: int, keep_rate: float, pilot_n: int, engines: int) -> int:
    """Prompts to pilot per round so the survivors fill one train batch (instead of 3x it),
    rounded up so a round's pilots divide over the engines."""
    batch = min(math.ceil(train_batch / max(keep_rate, 1.0 / MAX_BATCH_FACTOR)), MAX_BATCH_FACTOR * train_batch)
    step = commit_granularity(pilot_n, engines)
    return math.ceil(batch / step) * step


def calibrate(cfg: Any, validation: Path, prompts: int, cache: Path) -> dict[str, Any]:
    """The start model's success rates on the first ``prompts`` validation prompts (cached in ``cache``)."""
    from megatron_pc.driver.prepare import ensure_model
    from megatron_pc.data.records import read_prompts

    model_path = ensure_model(cfg)
    records = read_prompts(validation)[:prompts]
    key = {"model": relative_path(model_path), "validation": relative_path(validation), "prompts": len(records), "samples": SAMPLES}
    if cache.is_file():
        saved = json.loads(cache.read_text())
        if {k: saved.get(k) for k in key} == key:
            return saved
    rates = _measure(model_path, [(str(r.prompt), r.answer) for r in records])
    a = cfg.allocation
    result = {
        **key,
        "z": zero_variance_share(rates),
        "all_wrong": sum(r == 0.0 for r in rates) / len(rates),
        "all_right": sum(r == 1.0 for r in rates) / len(rates),
        "mean_success": statistics.fmean(rates),
        "keep_rate": predicted_keep_rate(rates, SAMPLES, a.pilot.n, a.p_lower, a.p_upper),
        "rates": rates,
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(result) + "\n")
    return result


def _measure(model_path: Path, problems: list[tuple[str, str]]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from megatron_pc.models.tiny import sampled_success_rates

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    return sampled_success_rates(model, tokenizer, problems, samples=SAMPLES, seed=0)


# ---- the calibrated simulator -------------------------------------------------------------------


def _sim_runs(cfgs: Any, sim: Any, regime: str, validate_every: int) -> list[Run]:
    """Simulated runs as report runs (each strategy under its own config, ``cfgs[strategy]``,
    or one config for all), their accuracy curves sampled like the real validations."""
    from megatron_pc.analysis.simulate import run_one
    from megatron_pc.analysis.simulate_fit import curve_run

    if not isinstance(cfgs, dict):
        cfgs = {strategy: cfgs for strategy in sim.strategies}
    return [curve_run(regime, strategy, seed, run_one(cfgs[strategy], sim, strategy, seed)["curve"], validate_every)
            for strategy in sim.strategies for seed in sim.seeds]  # fmt: skip


def simulate_regime(args: argparse.Namespace, regime: Regime, rates_path: Path, measured: dict[str, Any],
                    fractions: tuple[float, ...]) -> dict[str, Any]:  # fmt: skip
    """Predicted targets and ratios of one regime, and the command that reproduces them.

    The fitted learning model (the default, ``--simulator-learning``) predicts from the success
    rates alone; the linear one has its learning rate scaled so its GRPO gains what the real one did."""
    from megatron_pc.analysis.learning_model import format_error, load_fitted, model_error_hint
    from megatron_pc.analysis.simulate import LABELS, SimConfig, read_success_rates
    from megatron_pc.config import load_config

    rates, samples = read_success_rates(str(rates_path))
    strategies = [s for s in measured["strategies"] if s in ("pilot_commit", "grpo", "dapo", *LABELS)]
    learning = getattr(args, "simulator_learning", "fitted")
    base = [*args.overrides, "allocation.strategy=pilot_commit"]
    train_batch = load_config(args.config, base).allocation.train_batch
    rule = [*args.rule.overrides(train_batch, train_batch, "simulator")] if hasattr(args, "rule") else []
    cfgs = {s: load_config(args.config, [*base, *rule]) for s in strategies}
    fitted, record = load_fitted() if learning == "fitted" else (None, None)
    sim = SimConfig(pool_size=args.train_size, validation_size=min(args.val_size, 2000), success_rates=rates, success_samples=samples,
                    target_accuracy=math.inf, max_steps=args.steps, seeds=list(range(args.seeds)), strategies=strategies,
                    learning=learning, fitted=fitted)  # fmt: skip
    result = summarize(_sim_runs(cfgs, sim, regime.name, args.validate_every), fractions)["regimes"][regime.name]
    if learning == "linear":
        real, simulated = measured["final_gain"].get("grpo"), result["final_gain"].get("grpo")
        if real is not None and simulated is not None and real > 0 and simulated > 0:
            sim.lr *= real / simulated  # the simulated GRPO then gains about what the real one did
            result = summarize(_sim_runs(cfgs, sim, regime.name, args.validate_every), fractions)["regimes"][regime.name]
    command = (f"megatron-pc simulate {args.config} {' '.join(args.overrides)} {' '.join(rule)} --success-rates {relative_path(rates_path)} "
               f"--pool-size {sim.pool_size} --max-steps {sim.max_steps} --seeds {len(sim.seeds)} --learning {learning}"
               + (f" --lr {sim.lr:.4g}" if learning == "linear" else "") + f" --strategies {','.join(strategies)}")  # fmt: skip
    return {"learning": learning, "lr": sim.lr if learning == "linear" else None, "error": model_error_hint(learning, record),
            "held_out_error": format_error(record) if record else None, "form": (record or {}).get("form"),
            "held_out": (record or {}).get("held_out"), "command": " ".join(command.split()),
            "start_accuracy": result["start_accuracy"], "final_gain": result["final_gain"], "fractions": result["fractions"],
            "ratios": _ratios(result), "targets": result["target_accuracies"]}  # fmt: skip


def _ratios(regime: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """{strategy: [rollout ratio vs Pilot-Commit per target]}."""
    out: dict[str, list[dict[str, Any]]] = {}
    for t in regime["targets"]:
        for name, figures in t["strategies"].items():
            if name != REFERENCE and "vs_pilot_commit" in figures:
                out.setdefault(name, []).append(figures["vs_pilot_commit"]["rollouts"])
    return out


def misprediction(measured: dict[str, Any], predicted: dict[str, Any]) -> str:
    """How a predicted ratio compares with the measured one."""
    m, p = measured.get("ratio"), predicted.get("ratio")
    if m is None or p is None:
        if measured["status"] == predicted["status"]:
            return "agrees (same strategies reached)"
        return f"mispredicts: measured {measured['status']}, predicted {predicted['status']}"
    if (m - 1.0) * (p - 1.0) < 0:
        return "mispredicts the winner"
    if abs(p / m - 1.0) > AGREE:
        return f"mispredicts the size ({'over' if p > m else 'under'} by {abs(p / m - 1.0):.0%})"
    return f"agrees (within {AGREE:.0%})"


def simulator_section(simulated: dict[str, Any], measured: dict[str, Any]) -> str:
    """report.md's comparison of measured and predicted ratios."""
    first = next(iter(simulated.values()), {})
    model = ("its learning model is the one fitted to the kept benchmarks' measured runs (" + str(first.get("form")) +
             "; docs/benchmarks.md, \"The simulator beside it\"), so it predicts from the success rates alone. Its "
             + str(first.get("held_out_error")) + ". "
             if first.get("learning") == "fitted" else
             "its learning model is the linear one, its learning rate scaled so its GRPO gains what the real GRPO gained. ")  # fmt: skip
    lines = ["## The simulator beside the measurement", "",
             "The simulator's start is each regime's measured per-prompt success rates; " + model +
             "Its targets follow the same rule (fractions of its own smallest gain). "
             "Ratios are rollouts to target, other / Pilot-Commit.", "",
             "| regime | target | strategy | measured | predicted | verdict |", "|---|---|---|---|---|---|"]  # fmt: skip
    for name, sim in simulated.items():
        real = _ratios(measured[name])
        for other, predicted in sim["ratios"].items():
            for frac, p, m in zip(sim["fractions"], predicted, real.get(other, [])):
                lines.append(f"| {name} | {100 * frac:.0f}% | {other}/PC | {_fmt(m)} | {_fmt(p)} | {misprediction(m, p)} |")
        lines.append(f"| {name} | | reproduce | `{sim['command']}` | | |")
    return "\n".join(lines)


def _fmt(r: dict[str, Any]) -> str:
    return f"{r['ratio']:.2f}x" if r.get("ratio") is not None else r["status"]
