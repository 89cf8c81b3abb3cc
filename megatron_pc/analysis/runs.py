"""The runs a report reads: a training run directory's metrics and labels, and its validations.

A run directory is a normal training run (metrics.jsonl, config.yaml), or its kept copy with
metrics.jsonl.gz (:func:`metrics_file`; ``scripts/bench_results.sh``). :func:`load_run` labels
it by task (``data.source``, named after its benchmark regime when it is one), strategy and
seed; :class:`Run` holds its rows and validation points. The report
(:mod:`megatron_pc.analysis.report`), its table and plots (``report_format``, ``report_plots``)
and ``scripts/accuracy_at_budgets.py`` read runs through this module.

Conventions (also in docs/benchmarks.md):
* Final accuracy of a run: the mean of its last ``FINAL_POINTS`` validations after step 0 (less
  jitter than one).
* Seconds are training seconds: each step's ``time_total`` without its validation (the
  ``time_validation`` metric when present, else the step's excess over its timed phases,
  :data:`megatron_pc.metrics.phases.BREAKDOWN_PHASES`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from megatron_pc.analysis.regimes import REGIMES
from megatron_pc.errors import MegatronPCError
from megatron_pc.jsonl import count_lines, find
from megatron_pc.metrics.logger import read_metrics
from megatron_pc.metrics.phases import BREAKDOWN_PHASES

REFERENCE = "pilot_commit"
"""The strategy every other one is compared with."""
HISTORY_AWARE = "pc_history"
"""The benchmark's label of history-aware Pilot-Commit (allocation.history.preset=history_aware)."""
VARIANT_REFERENCES = {HISTORY_AWARE: "history-aware Pilot-Commit", "pc_screen": "screened Pilot-Commit",
                      "pc_meta": "Pilot-Commit with metadata priors", "pc_meta_sized": "Pilot-Commit with metadata priors and sized counts",
                      "pc_meta_coarse": "metadata priors from labels cut into 3 bins", "pc_meta_noisy": "metadata priors from labels 20% shuffled",
                      "pc_screen_sized": "screened Pilot-Commit with sized counts",
                      "pc_meta_sized_sp2": "metadata priors, sized counts, short pilot of 2",
                      "pc_screen_sized_sp2": "screened Pilot-Commit, sized counts, short pilot of 2"}  # fmt: skip
"""Pilot-Commit's variants that every other strategy is also compared with, when a report has them
(label: description): the ablations of docs/metadata_prior.md too, so that GRPO / ablation is in
the summary beside GRPO / pc_meta."""
MAIN_STRATEGIES = ("pilot_commit", "grpo", "dapo")
"""Strategies whose final gains set the targets (ablations are measured against them)."""
FIELD_STRATEGIES = ("speed_rl", "greso", "mopps")
"""The field's other allocators (megatron_pc/allocation): strategies, not variants, so in an
equal-budget report their gains at the budget count toward the targets as the main ones' do."""
FINAL_POINTS = 3


@dataclass
class Point:
    """One validation of a run."""

    step: int
    rollouts: float
    """Cumulative generated rollouts when it was measured."""
    seconds: float
    """Cumulative training seconds (validation excluded) when it was measured."""
    accuracy: float
    stderr: float | None


@dataclass
class Run:
    """One training run's metrics rows, labelled for the report."""

    regime: str
    strategy: str
    seed: int
    run_dir: Path
    rows: list[dict[str, Any]]
    val_prompts: int | None = None
    """Validation prompts (for a binomial standard error when the rows carry none)."""
    val_samples: int | None = None
    """Sampled responses per validation prompt."""
    update_rule: str = "unknown"
    """``reference`` or ``equal/N`` (:func:`rule_of_config`)."""
    variant: str = "none"
    """The benchmark's variant or ablation label (``none`` for a plain strategy)."""
    points: list[Point] = field(init=False)

    def __post_init__(self) -> None:
        self.points = validation_points(self)
        if not self.points:
            raise MegatronPCError(
                f"{self.run_dir}: metrics.jsonl has no validation rows (val_accuracy); "
                "the run stopped before its first validation (training.validate_every)"
            )

    @property
    def steps(self) -> list[dict[str, Any]]:
        """Rows of training steps (step 0 is the validation before training)."""
        return [r for r in self.rows if r.get("step", 0) > 0 and "generated" in r]

    @property
    def final_accuracy(self) -> float:
        """Mean accuracy of the last FINAL_POINTS validations after training began (the start
        accuracy only for a run that has none)."""
        trained = [p for p in self.points if p.step > 0] or self.points
        return statistics.fmean(p.accuracy for p in trained[-FINAL_POINTS:])


def step_train_seconds(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Seconds each step spent training: ``time_total`` minus its validation.

    Without a ``time_validation`` metric, a validation step's validation is its excess of
    untimed seconds over the median untimed seconds (controller work) of the other steps.
    """
    steps = [r for r in rows if r.get("step", 0) > 0 and r.get("time_total") is not None]

    def untimed(r: dict[str, Any]) -> float:
        return r["time_total"] - sum(r.get(f"time_{p}") or 0.0 for p in BREAKDOWN_PHASES)

    plain = [untimed(r) for r in steps if r.get("val_accuracy") is None]
    overhead = statistics.median(plain) if plain else 0.0
    out = {}
    for r in steps:
        if r.get("time_validation") is not None:
            out[r["step"]] = r["time_total"] - r["time_validation"]
        elif r.get("val_accuracy") is not None:
            out[r["step"]] = r["time_total"] - max(untimed(r) - overhead, 0.0)
        else:
            out[r["step"]] = r["time_total"]
    return out


def validation_seconds(rows: list[dict[str, Any]]) -> float | None:
    """Mean seconds of one validation during training (None without any)."""
    train = step_train_seconds(rows)
    spent = [r["time_total"] - train[r["step"]] for r in rows if r.get("step", 0) > 0 and r.get("val_accuracy") is not None
             and r["step"] in train]  # fmt: skip
    return statistics.fmean(spent) if spent else None


def validation_points(run: Run) -> list[Point]:
    """The run's validations with cumulative rollouts, training seconds and standard error."""
    seconds = step_train_seconds(run.rows)
    points, elapsed = [], 0.0
    for r in run.rows:
        elapsed += seconds.get(r.get("step", 0), 0.0)
        acc = r.get("val_accuracy")
        if acc is None:
            continue
        stderr = r.get("val_accuracy_stderr")
        if stderr is None and run.val_prompts and run.val_samples:
            stderr = math.sqrt(max(acc * (1.0 - acc), 0.0) / (run.val_prompts * run.val_samples))
        points.append(Point(int(r["step"]), float(r.get("cum_generated", 0)), elapsed, float(acc), stderr))
    return points


def load_run(run_dir: str | Path, *, regime: str | None = None, strategy: str | None = None, seed: int | None = None,
             label_by: str = "strategy", variant: str = "none") -> Run:  # fmt: skip
    """A run directory's metrics and labels (from its config.yaml unless given; the update rule
    always from the config, so a kept run reads as the rule it ran)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise MegatronPCError(f"run directory {path} does not exist")
    metrics = metrics_file(path)
    if metrics is None:
        raise MegatronPCError(f"{path} holds no metrics.jsonl: not a training run directory (or the run has not started)")
    cfg_path = path / "config.yaml"
    cfg = (yaml.safe_load(cfg_path.read_text()) or {}) if cfg_path.is_file() else {}
    data, training = cfg.get("data", {}), cfg.get("training", {})
    if strategy is None and label_by == "dir":
        # The benchmark's layout: LABEL[@RULE]/seed_K. The rule is read from the config below,
        # so the label is the directory's name without it (pilot_commit@reference -> pilot_commit,
        # which the comparison takes as Pilot-Commit); a label that is no strategy is a variant.
        strategy = path.parent.name.split("@")[0]
        if variant == "none" and strategy not in (*MAIN_STRATEGIES, *FIELD_STRATEGIES):
            variant = strategy
    if strategy is None:
        strategy = cfg.get("allocation", {}).get("strategy", path.name)
    validation = data.get("validation")
    # Several validation sets write their own val_accuracy_stderr; one file is counted here.
    val_prompts = data.get("validation_size") if validation is None else _count_lines(Path(validation)) if isinstance(validation, str) else None
    return Run(
        regime=regime or regime_label(str(data.get("source", "unknown")), data.get("train_size")),
        strategy=str(strategy),
        seed=int(seed if seed is not None else cfg.get("seed", 0)),
        run_dir=path,
        rows=read_metrics(metrics),
        val_prompts=val_prompts,
        val_samples=training.get("val_samples"),
        update_rule=rule_of_config(cfg),
        variant=variant,
    )


def regime_label(source: str, train_size: int | None = None) -> str:
    """The report's name for a data source: the benchmark regime's name, else the source's. A
    regime with a pool of its own (``multi_epoch``: paper_like's prompts, 192 of them) is named
    only for runs with that pool, so that its runs and those of the full pool stay apart."""
    for name, regime in REGIMES.items():
        if regime.source == source and regime.train_size is not None and regime.train_size == train_size:
            return name
    for name, regime in REGIMES.items():
        if regime.source == source and regime.train_size is None:
            return name
    return source.removeprefix("builtin:") if source.startswith("builtin:") else Path(source).stem


def _count_lines(path: Path) -> int | None:
    return count_lines(path) if find(path) is not None else None


def metrics_file(run_dir: str | Path) -> Path | None:
    """The run's metrics: ``metrics.jsonl``, or ``metrics.jsonl.gz`` in a kept run (None: neither)."""
    return find(Path(run_dir) / "metrics.jsonl")


def run_dirs(root: str | Path, pattern: str) -> list[Path]:
    """The run directories under ``root`` that match ``pattern`` (e.g. ``*/*/seed_*``) and hold
    metrics, plain or kept, sorted."""
    return sorted(p for p in Path(root).glob(pattern) if p.is_dir() and metrics_file(p) is not None)


def check_unique(runs: list[Run]) -> None:
    """Two runs with the same task, label and seed cannot be told apart in a report."""
    seen: dict[tuple[str, str, int], Path] = {}
    for r in runs:
        key = (r.regime, r.strategy, r.seed)
        if key in seen:
            raise MegatronPCError(
                f"{seen[key]} and {r.run_dir} are both {r.strategy}, seed {r.seed}, on {r.regime}; "
                "report them separately, or label runs by their parent directory (--label-by dir)"
            )
        seen[key] = r.run_dir


def relative_path(path: str | Path, base: str | Path | None = None) -> str:
    """``path`` as a report or a run's config records it: relative to ``base`` (default: the
    working directory, the repository root where benchmarks run) when it lies inside, so kept
    results name no machine's absolute prefix; else absolute."""
    target = Path(path).resolve()
    root = Path(base if base is not None else Path.cwd()).resolve()
    return target.relative_to(root).as_posix() if target.is_relative_to(root) else str(target)


def rule_of_config(cfg: dict[str, Any]) -> str:
    """The update rule label of a run from its config.yaml: ``reference`` for mini-batches in
    call rollouts, ``equal/N`` for mini-batches of whole groups (a kept run without a rule
    label reads as what it ran: ``equal/1`` for the earlier benchmark's runs)."""
    training, allocation = cfg.get("training", {}), cfg.get("allocation", {})
    if training.get("mini_batch_unit", "groups") == "call_rollouts":
        return "reference"
    train_batch, mini_batch = allocation.get("train_batch"), training.get("mini_batch")
    if not train_batch or not mini_batch:
        return "unknown"
    return f"equal/{math.ceil(train_batch / mini_batch)}"
