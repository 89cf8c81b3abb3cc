"""``megatron-pc fit-simulator BENCH_DIR...``: fit the simulator's learning model to measured
runs and judge it held out.

The data. Every finished run of a benchmark's layout (BENCH_DIR/REGIME/LABEL[@RULE]/seed_K,
:func:`megatron_pc.analysis.decompose.find_runs`) gives, per step, its optimizer updates U (``updates``), its informative
groups G (``batch_groups`` x (1 - ``zero_variance_share``)) and their mean reward variance v
(``group_reward_var_mean`` / (1 - ``zero_variance_share``): the metric averages over all groups,
the uninformative ones at 0), and every few steps its validation accuracy. The regime's
calibration (BENCH_DIR/REGIME/success_rates.json, the start model's per-prompt success rates)
gives the Rasch scale (:class:`SkillScale`) that maps accuracy to skill.

The fit. The model of :mod:`megatron_pc.analysis.learning_model` predicts each run's skill
after step t as s_0 + sum of its steps' gains, computed from the run's own measured (U, G, v):
the allocation is what was measured, only the learning is modelled. s_0 is the skill of the
regime's mean step-0 accuracy (its seeds share one start model; their step-0 validations differ
by sampling noise only). The four parameters minimise the squared error between the predicted
and the measured validation accuracies (Levenberg-Marquardt on log a, b, c, e; deterministic).

The judgement. A fitted model is only useful if it predicts runs it has not seen, in what the
benchmark reports: the rollouts-to-target ratios GRPO/PC and DAPO/PC at the 25/50/75% targets.
So the full simulator (the real strategies, the run's own config: batch, update rule, steps)
runs with parameters fitted (1) on all seeds but one, judged against that seed's measured
ratios, and (2) on all regimes but one, judged against that regime's measured ratios (all its
seeds). The linear model, its learning rate scaled so its GRPO gains what the measured GRPO
gained (as the benchmark calibrated it), is judged against the same measurements beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from megatron_pc.analysis.decompose import find_runs
from megatron_pc.analysis.learning_model import PARAMS_FILE, FittedLearning, SkillScale, format_error
from megatron_pc.analysis.report import TARGET_FRACTIONS, summarize
from megatron_pc.analysis.runs import MAIN_STRATEGIES, REFERENCE, Run, relative_path
from megatron_pc.config import Config, from_dict
from megatron_pc.errors import MegatronPCError

FORM = "delta_s = a * U^b * (G/U)^c * (v/0.25)^e / (1 + k N)"
COMPARED = ("grpo", "dapo")
"""Strategies whose rollout ratio to Pilot-Commit the simulator is judged on."""
PARAM_NAMES = ("scale", "updates_exp", "groups_exp", "variance_exp", "saturation")
START = np.array([math.log(0.01), 1.0, 0.5, 0.5, math.log(0.01)])
"""Where the fit starts: (log a, b, c, e, log k)."""
LOG_PARAMS = ("scale", "saturation")
"""Parameters fitted as their logarithm (they are positive)."""
FIXED = {"variance_exp": 0.0}
"""Held at a value by default. The groups' reward variance v is confounded with the strategy in
the measured runs (Pilot-Commit's pilots choose groups near q = 1/2: v 0.17-0.18 against GRPO's
and DAPO's 0.13-0.15): left free, the fit sets e near -0.7, and the simulator's DAPO and GRPO,
whose simulated groups have the lower v, then learn more per step than its PC, against what was
measured (DAPO/PC predicted 0.8-1.1x against a measured 1.1-1.8x). Fixed at 0: a group counts
by whether it is informative."""
SIM_SEEDS = 3
GOAL = 0.2
"""The held-out goal: predicted ratios within 20% of the measured ones."""


# ---- the measured runs -------------------------------------------------------------------------


@dataclass
class Trajectory:
    """What the fit reads of one run: per step (1..T) U, G, v; validation steps and accuracies."""

    run: Run
    group: str
    """``BENCH/REGIME``: runs that share a start model and a calibration."""
    updates: np.ndarray
    informative: np.ndarray
    variance: np.ndarray
    val_steps: np.ndarray
    val_accuracy: np.ndarray


def trajectory(run: Run, group: str) -> Trajectory:
    """The run's per-step learning inputs and its validations after step 0."""
    steps = run.steps
    if not steps:
        raise MegatronPCError(f"{run.run_dir}: no training steps to fit")
    updates, informative, variance = [], [], []
    for row in steps:
        z = float(row.get("zero_variance_share") or 0.0)
        groups = float(row.get("batch_groups") or row.get("trained_groups") or 0.0)
        live = groups * (1.0 - z)
        updates.append(float(row.get("updates") or 1.0))
        informative.append(live)
        variance.append(float(row.get("group_reward_var_mean") or 0.0) / (1.0 - z) if z < 1.0 else 0.0)
    last = int(steps[-1]["step"])
    points = [p for p in run.points if 0 < p.step <= last]
    return Trajectory(run, group, np.array(updates), np.array(informative), np.array(variance),
                      np.array([p.step for p in points], dtype=np.int64), np.array([p.accuracy for p in points]))  # fmt: skip


@dataclass
class Group:
    """The runs of one benchmark regime, with its Rasch scale and start skill."""

    name: str
    bench: str
    regime: str
    scale: SkillScale
    rates: list[float]
    samples: int
    start_skill: float
    trajectories: list[Trajectory]
    budget: int | None = None
    """The rollout budget every run of the group spent (an equal-budget benchmark), else None."""


def load_groups(bench_dirs: list[str]) -> list[Group]:
    """The finished runs of each benchmark directory, grouped by regime, with its calibration."""
    from megatron_pc.analysis.simulate import read_success_rates

    groups = []
    for bench_dir in bench_dirs:
        runs = find_runs(bench_dir)
        for regime in sorted({r.regime for r in runs}):
            rates_path = Path(bench_dir) / regime / "success_rates.json"
            if not rates_path.is_file():
                raise MegatronPCError(f"fit-simulator: {rates_path} is missing: the regime's calibration (its start model's success rates)")
            rates, samples = read_success_rates(str(rates_path))
            scale = SkillScale(rates, samples)
            mine = [r for r in runs if r.regime == regime]
            start = statistics.fmean(r.points[0].accuracy for r in mine)
            name = f"{Path(bench_dir).name}/{regime}"
            budgets = {simulated_config(r.run_dir / "config.yaml").training.rollout_budget for r in mine}
            if len(budgets) > 1:
                raise MegatronPCError(f"fit-simulator: the runs of {name} spent different rollout budgets ({sorted(budgets, key=str)}): "
                                      "targets on a common budget need one")  # fmt: skip
            groups.append(Group(name, Path(bench_dir).name, regime, scale, rates, samples, float(scale.skill(start)),
                                [trajectory(r, name) for r in mine], budgets.pop()))  # fmt: skip
    if not groups:
        raise MegatronPCError(f"fit-simulator: no finished runs under {', '.join(bench_dirs)}")
    return groups


# ---- the fit -----------------------------------------------------------------------------------


def _model(theta: np.ndarray) -> FittedLearning:
    return FittedLearning(float(math.exp(theta[0])), float(theta[1]), float(theta[2]), float(theta[3]), float(math.exp(theta[4])))


def step_gains(model: FittedLearning, t: Trajectory) -> np.ndarray:
    """The model's skill gain of each of the run's steps, from its measured U, G, v."""
    live = (t.informative > 0) & (t.variance > 0)
    u, g, v = t.updates, np.where(live, t.informative, 1.0), np.where(live, t.variance, 1.0)
    gains = model.scale * u**model.updates_exp * (g / u) ** model.groups_exp * (v / 0.25) ** model.variance_exp
    return np.where(live, gains, 0.0) / (1.0 + model.saturation * np.cumsum(u))


def predicted_accuracy(model: FittedLearning, group: Group, t: Trajectory) -> np.ndarray:
    """The model's accuracy at the run's validation steps."""
    skill = group.start_skill + np.cumsum(step_gains(model, t))
    return group.scale.accuracy(skill[t.val_steps - 1])


def residuals(theta: np.ndarray, groups: list[Group]) -> np.ndarray:
    """Predicted minus measured validation accuracy, every run's every validation."""
    model = _model(theta)
    out = [predicted_accuracy(model, g, t) - t.val_accuracy for g in groups for t in g.trajectories]
    return np.concatenate(out) if out else np.zeros(0)


def fit(groups: list[Group], start: np.ndarray = START, fixed: dict[str, float] | None = None,
        iterations: int = 200) -> tuple[FittedLearning, float]:  # fmt: skip
    """Least-squares parameters (Levenberg-Marquardt) and the root-mean-square accuracy error;
    ``fixed`` holds parameters kept at a value (default :data:`FIXED`)."""
    fixed = FIXED if fixed is None else fixed
    full = np.array(start, dtype=np.float64)
    for name, value in fixed.items():
        index = PARAM_NAMES.index(name)
        full[index] = math.log(value) if name in LOG_PARAMS else value
    free = [i for i, name in enumerate(PARAM_NAMES) if name not in fixed]

    def expand(theta: np.ndarray) -> np.ndarray:
        out = full.copy()
        out[free] = theta
        return out

    theta = full[free]
    r = residuals(expand(theta), groups)
    if not len(r):
        raise MegatronPCError("fit-simulator: the runs hold no validation after step 0 to fit")
    cost, damping = float(r @ r), 1e-3
    for _ in range(iterations):
        jac = np.empty((len(r), len(theta)))
        for i in range(len(theta)):
            h = 1e-6 * max(1.0, abs(theta[i]))
            shifted = theta.copy()
            shifted[i] += h
            jac[:, i] = (residuals(expand(shifted), groups) - r) / h
        normal, gradient = jac.T @ jac, jac.T @ r
        improved = converged = False
        while damping < 1e10:
            step = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient)
            candidate = theta + step
            r_new = residuals(expand(candidate), groups)
            new_cost = float(r_new @ r_new)
            if new_cost < cost:
                theta, r, damping, improved = candidate, r_new, max(damping / 3.0, 1e-9), True
                converged = cost - new_cost < 1e-12 * max(cost, 1e-12)
                cost = new_cost
                break
            damping *= 4.0
        if not improved or converged:
            break
    return _model(expand(theta)), math.sqrt(cost / len(r))


# ---- the judgement: the simulator's predicted ratios against the measured ones ------------------


def simulated_runs(group: Group, learning: str, fitted: FittedLearning | None = None, lr: float | None = None,
                   seeds: int = SIM_SEEDS) -> list[Run]:  # fmt: skip
    """The simulator's runs of the group's main strategies, each under its measured run's own
    config (batch, update rule, steps, validation interval), as report runs."""
    from megatron_pc.analysis.simulate import SimConfig, run_one

    out = []
    for label in MAIN_STRATEGIES:
        measured = [t.run for t in group.trajectories if t.run.strategy == label]
        if not measured:
            continue
        cfg = simulated_config(measured[0].run_dir / "config.yaml")
        sim = SimConfig(pool_size=cfg.data.train_size, validation_size=2000, success_rates=group.rates,
                        success_samples=group.samples, target_accuracy=math.inf, max_steps=cfg.training.steps,
                        seeds=list(range(seeds)), strategies=[label], learning=learning, fitted=fitted)  # fmt: skip
        if lr is not None:
            sim.lr = lr
        for seed in sim.seeds:
            curve = run_one(cfg, sim, label, seed)["curve"]
            out.append(curve_run(group.regime, label, seed, curve, cfg.training.validate_every, cfg.training.validate_every_rollouts))
    return out


def simulated_config(path: Path) -> Config:
    """What the simulator needs of a run's config.yaml: its allocation, how a step splits into
    updates, its steps and validation interval, its pool and engines (the rest of a kept config
    may name fields this version no longer has)."""
    raw = yaml.safe_load(path.read_text()) or {}
    kept = ("steps", "mini_batch", "mini_batch_unit", "validate_every", "validate_every_rollouts", "rollout_budget")
    training = {k: v for k, v in raw.get("training", {}).items() if k in kept}
    data = {"allocation": raw.get("allocation", {}), "training": training,
            "data": {"train_size": raw.get("data", {}).get("train_size", 20_000)},
            "rollout": {"engines": raw.get("rollout", {}).get("engines", 1)}}  # fmt: skip
    return from_dict(Config, data)


def curve_run(regime: str, label: str, seed: int, curve: list[tuple[int, int, float]], validate_every: int,
              every_rollouts: int | None = None) -> Run:  # fmt: skip
    """A simulated accuracy curve as a report run, validated like the real one: every
    ``validate_every`` steps, or (``every_rollouts`` K) after each step that crosses a multiple of
    K generated rollouts; and after the first and the last step."""
    rows, previous = [], 0
    for step, generated, acc in curve:
        row: dict[str, Any] = {"step": step, "cum_generated": generated}
        if step:
            row["generated"] = generated - previous
        due = generated // every_rollouts > previous // every_rollouts if every_rollouts else step % validate_every == 0
        if step == 0 or due or step == curve[-1][0]:
            row["val_accuracy"] = acc
        previous = generated
        rows.append(row)
    return Run(regime, label, seed, Path(f"simulated/{label}/seed_{seed}"), rows)


def ratios(runs: list[Run], budget: int | None = None) -> dict[str, list[float | None]]:
    """{other: [rollouts-to-target ratio other / PC per target]} of the main strategies (the
    report's targets and statistic, on the common ``budget`` when there is one; None where
    either did not reach it)."""
    runs = [r for r in runs if r.strategy in MAIN_STRATEGIES]
    if not runs or REFERENCE not in {r.strategy for r in runs}:
        return {}
    regime = summarize(runs, TARGET_FRACTIONS, budget)["regimes"][runs[0].regime]
    out: dict[str, list[float | None]] = {}
    for name in COMPARED:
        if any(r.strategy == name for r in runs):
            out[name] = [t["strategies"][name]["vs_pilot_commit"]["rollouts"]["ratio"] for t in regime["targets"]]
    return out


def _linear_lr(group: Group, measured: list[Run]) -> float:
    """The linear model's learning rate scaled so its GRPO (or PC without one) gains what the
    measured one gained, as the benchmark calibrated it."""
    from megatron_pc.analysis.simulate import SimConfig

    lr = SimConfig().lr
    first = simulated_runs(group, "linear", lr=lr)
    name = "grpo" if any(r.strategy == "grpo" for r in measured) else REFERENCE
    real = _median_gain([r for r in measured if r.strategy == name])
    simulated = _median_gain([r for r in first if r.strategy == name])
    return lr * real / simulated if real > 0 and simulated > 0 else lr


def _median_gain(runs: list[Run]) -> float:
    return statistics.median(r.final_accuracy - r.points[0].accuracy for r in runs) if runs else 0.0


def _rows(fold: str, group: Group, predicted: dict[str, list[float | None]], measured: dict[str, list[float | None]],
          model: str) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for other, values in measured.items():
        for frac, m, p in zip(TARGET_FRACTIONS, values, predicted.get(other, [None] * len(values))):
            error = p / m - 1.0 if m is not None and p is not None else None
            rows.append({"model": model, "fold": fold, "group": group.name, "regime": group.regime, "ratio": f"{other}/PC",
                         "target": frac, "measured": m, "predicted": p, "error": error})  # fmt: skip
    return rows


def held_out(groups: list[Group], log: Any = None) -> list[dict[str, Any]]:
    """The held-out table: per fold (a seed, a regime), group, ratio and target, the fitted
    model's predicted ratio against the measured one; and the linear model's beside them."""
    say = log or (lambda text: None)
    rows: list[dict[str, Any]] = []
    seeds = sorted({t.run.seed for g in groups for t in g.trajectories})
    for seed in seeds:
        train = _subset(groups, lambda g, t: t.run.seed != seed)
        model, _ = fit(train)
        say(f"fold seed {seed}: fitted on the other seeds: {_params_text(model)}")
        for g in groups:
            measured = ratios([t.run for t in g.trajectories if t.run.seed == seed], g.budget)
            if measured:
                rows += _rows(f"seed {seed}", g, ratios(simulated_runs(g, "fitted", model), g.budget), measured, "fitted")
    for regime in sorted({g.regime for g in groups}):
        train = [g for g in groups if g.regime != regime]
        if not train:
            continue
        model, _ = fit(train)
        say(f"fold regime {regime}: fitted on the other regimes: {_params_text(model)}")
        for g in groups:
            if g.regime == regime:
                measured = ratios([t.run for t in g.trajectories], g.budget)
                rows += _rows(f"regime {regime}", g, ratios(simulated_runs(g, "fitted", model), g.budget), measured, "fitted")
    for g in groups:
        measured_runs = [t.run for t in g.trajectories]
        lr = _linear_lr(g, measured_runs)
        say(f"linear {g.name}: lr {lr:.4g}")
        rows += _rows("calibrated per regime", g, ratios(simulated_runs(g, "linear", lr=lr), g.budget), ratios(measured_runs, g.budget), "linear")
    return rows


def _subset(groups: list[Group], keep: Any) -> list[Group]:
    """The groups with only the trajectories ``keep(group, trajectory)`` accepts."""
    out = []
    for g in groups:
        mine = [t for t in g.trajectories if keep(g, t)]
        if mine:
            out.append(Group(g.name, g.bench, g.regime, g.scale, g.rates, g.samples, g.start_skill, mine))
    return out


def error_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean |error|, how many ratios within the goal, over all rows and per regime; a row whose
    ratio is missing on one side counts as a miss."""

    def figures(mine: list[dict[str, Any]]) -> dict[str, Any]:
        errors = [abs(r["error"]) for r in mine if r["error"] is not None]
        return {"ratios": len(mine), "compared": len(errors), "within_20": sum(e <= GOAL for e in errors),
                "mean_abs_error": statistics.fmean(errors) if errors else None,
                "max_abs_error": max(errors) if errors else None}  # fmt: skip

    return {**figures(rows), "by_regime": {reg: figures([r for r in rows if r["regime"] == reg])
                                           for reg in sorted({r["regime"] for r in rows})}}  # fmt: skip


def summaries(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Error summaries of the seed folds, the regime folds and the linear model."""
    return {"seed": error_summary([r for r in rows if r["model"] == "fitted" and r["fold"].startswith("seed")]),
            "regime": error_summary([r for r in rows if r["model"] == "fitted" and r["fold"].startswith("regime")]),
            "linear": error_summary([r for r in rows if r["model"] == "linear"])}  # fmt: skip


def _cell(v: float | None, fmt: str) -> str:
    return format(v, fmt) if v is not None else "-"


def format_rows(rows: list[dict[str, Any]]) -> str:
    """Predicted against measured ratios, a row each, as text."""
    lines = [f"{'model':<7}{'fold':<20}{'benchmark/regime':<24}{'ratio':<10}{'target':>7}{'measured':>10}{'predicted':>10}{'error':>8}"]
    for r in rows:
        lines.append(f"{r['model']:<7}{r['fold']:<20}{r['group']:<24}{r['ratio']:<10}{r['target']:>7.0%}"
                     f"{_cell(r['measured'], '.2f'):>10}{_cell(r['predicted'], '.2f'):>10}{_cell(r['error'], '+.0%'):>8}")  # fmt: skip
    return "\n".join(lines)


def format_held_out(rows: list[dict[str, Any]], held: dict[str, Any]) -> str:
    """The held-out table and its summary, as text."""
    lines = [format_rows(rows), ""]
    for key, name in (("seed", "fitted, a seed held out"), ("regime", "fitted, a regime held out"),
                      ("linear", "linear, lr calibrated on the regime itself")):  # fmt: skip
        s = held[key]
        per = ", ".join(f"{reg} {_cell(v['mean_abs_error'], '.0%')} ({v['within_20']}/{v['ratios']})" for reg, v in s["by_regime"].items())
        lines.append(f"{name}: mean |error| {_cell(s['mean_abs_error'], '.0%')}, {s['within_20']}/{s['ratios']} within 20% ({per})")
    return "\n".join(lines)


def _params_text(model: FittedLearning) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in model.as_dict().items())


def refit(bench_dirs: list[str], out: str | None = None) -> int:
    """``megatron-pc fit-simulator``: fit on every finished run, judge held out, print the
    table, write the parameters with their held-out error."""
    groups = load_groups(bench_dirs)
    model, rmse = fit(groups)
    print(f"fitted on {sum(len(g.trajectories) for g in groups)} runs ({', '.join(g.name for g in groups)}): {_params_text(model)}; "
          f"accuracy rms error {rmse:.4f}", flush=True)  # fmt: skip
    rows = held_out(groups, log=lambda text: print(text, flush=True))
    held = summaries(rows)
    record = {
        "form": FORM,
        "params": model.as_dict(),
        "fixed": FIXED,
        "rmse_accuracy": rmse,
        "fitted_on": {g.name: sorted(f"{t.run.strategy}@{t.run.update_rule}/seed_{t.run.seed}" for t in g.trajectories) for g in groups},
        "command": "megatron-pc fit-simulator " + " ".join(relative_path(d) for d in bench_dirs),
        "held_out": held,
        "table": rows,
    }
    print(format_held_out(rows, held))
    record["summary"] = format_error(record)
    print(record["summary"])
    target = Path(out) if out else PARAMS_FILE
    target.write_text(record_json(record))
    print(f"wrote {target}")
    return 0


def judge(bench_dirs: list[str], params: str) -> int:
    """``megatron-pc fit-simulator BENCH_DIR... --judge PARAMS``: no fit; the parameters of PARAMS
    (a file :func:`refit` wrote) predict these runs, which they were not fitted on: their
    validation accuracies (rms error) and the ratios GRPO/PC and DAPO/PC at the targets, each
    against the measured one. Writes nothing."""
    from megatron_pc.analysis.learning_model import load_fitted

    model, record = load_fitted(params)
    groups = load_groups(bench_dirs)
    seen = {name for name in record.get("fitted_on", {})} & {g.name for g in groups}
    if seen:
        raise MegatronPCError(f"fit-simulator --judge: {params} was fitted on {', '.join(sorted(seen))}; judge it on runs it has not seen")
    errors = np.concatenate([predicted_accuracy(model, g, t) - t.val_accuracy for g in groups for t in g.trajectories])
    print(f"{params}: {_params_text(model)}; on {sum(len(g.trajectories) for g in groups)} unseen runs "
          f"({', '.join(g.name for g in groups)}): accuracy rms error {math.sqrt(float(errors @ errors) / len(errors)):.4f}", flush=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    for g in groups:
        measured = ratios([t.run for t in g.trajectories], g.budget)
        rows += _rows("unseen runs", g, ratios(simulated_runs(g, "fitted", model), g.budget), measured, "fitted")
    summary = error_summary(rows)
    print(format_rows(rows))
    mean = summary["mean_abs_error"]
    print(f"predicting unseen runs: mean |error| {'-' if mean is None else format(mean, '.0%')}, {summary['within_20']}/{summary['ratios']} within 20%")
    return 0


def record_json(record: dict[str, Any]) -> str:
    """The record as JSON, its held-out table one row a line (the file stays readable in a diff)."""
    head = json.dumps({k: v for k, v in record.items() if k != "table"}, indent=1)
    rows = ",\n".join("  " + json.dumps(r) for r in record.get("table", []))
    return head[:-2] + ',\n "table": [\n' + rows + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    """``megatron-pc fit-simulator BENCH_DIR... [--out FILE]``."""
    import sys

    parser = argparse.ArgumentParser(prog="megatron-pc fit-simulator", description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_dirs", nargs="+", metavar="BENCH_DIR", help="benchmark directories (REGIME/LABEL[@RULE]/seed_K runs)")
    parser.add_argument("--out", help="where the parameters go (default: megatron_pc/analysis/learning_model.json, the simulator's)")
    parser.add_argument("--judge", metavar="PARAMS",
                        help="fit nothing: judge the parameters in PARAMS (a file fit-simulator wrote) on these runs, which they were not fitted on")  # fmt: skip
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.judge:
        if args.out:
            parser.error("--out: nothing is written with --judge")
        return judge(args.bench_dirs, args.judge)
    return refit(args.bench_dirs, args.out)
