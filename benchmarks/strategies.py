"""``megatron-pc bench rollouts``: rollouts (and seconds) each strategy needs to reach fixed
validation accuracies, per task regime, over seeds: the paper's headline measurement.

Equal budgets (``--budget R``, the benchmark's design since issue #39; docs/benchmarks.md): every
strategy (pilot_commit, grpo, dapo and the field's speed_rl, greso, mopps) trains until it has
generated R rollouts, its steps varying; validation is on a rollout schedule (every
``--validate-every-rollouts`` K, the same for all, plus at 0 and R) of a validation set sized so
its standard error is under a third of the smallest target gap; the group shape is the paper's
(``--shape``, :mod:`benchmarks.shapes`); the report gives accuracy at R/4 .. R and rollouts to
targets set on the common budget, every ratio as the median of paired per-seed ratios with a
bootstrap 90% interval (:mod:`megatron_pc.analysis.budget`). Without ``--budget`` the runs are
matched in ``--steps`` (the older design, kept to reproduce the kept results).

For each regime (:mod:`megatron_pc.analysis.regimes`) and seed it trains the strategies
from the same start model, each a normal run directory ``OUT/REGIME/LABEL/seed_K``
(``megatron-pc train``; an interrupted benchmark resumes: finished runs are skipped, partial
ones continue from their checkpoint). All runs of a regime validate on one fixed set of
``--val-size`` prompts (OUT/REGIME/validation.jsonl) every ``--validate-every`` steps.

Every run trains under an update rule (``--update-rule``, :mod:`benchmarks.variants`):
``reference`` (the recipe's mini-batches in call rollouts) or ``equal`` (``--updates`` N per step
for every strategy). LABEL is the strategy or variant with the rule, e.g. ``grpo@reference``,
``pc_4up@equal4``; ``equal`` with 1 update adds nothing (``grpo``), the layout of the runs kept
from before rules were named, which are ``equal`` with 1 update and are reused as such.

Beside the runs, per regime:
* calibration: the start model's per-prompt success rates (16 samples at temperature 1) on
  validation prompts give the regime's zero-variance share z before any training;
* ablations: GRPO with as many informative groups per step as Pilot-Commit trains
  (``grpo_matched``: train batch / (1 - z)), and Pilot-Commit with a pilot batch sized to the
  survivors a step needs (``pc_sized``: train batch / predicted keep rate, not 3x);
* the simulator (``megatron-pc simulate``) calibrated to the measured success rates, its
  predicted ratios beside the measured ones.

Then OUT/report.md, OUT/summary.json and the PNGs (:mod:`megatron_pc.analysis.report`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_pc.analysis.regimes import DEFAULT_REGIMES, REGIMES, Regime, parse_regimes
from megatron_pc.analysis.report import parse_fractions, write_report
from megatron_pc.analysis.runs import Run, load_run, metrics_file, relative_path, run_dirs, validation_seconds
from benchmarks.options import parse_names
from benchmarks.calibration import calibrate, simulate_regime
from benchmarks.shapes import MAIN_SHAPE, SHAPES, Shape, parse_shape
from benchmarks.step import STRATEGIES, run_strategy
from benchmarks.variants import UPDATE_RULES, VARIANTS, UpdateRule, parse_rule
from megatron_pc.errors import MegatronPCError

ABLATIONS = ("grpo_matched", "pc_sized")
FIELD_STRATEGIES = ("speed_rl", "greso", "mopps")
"""The field's other allocators (allocation/speed_rl.py, greso.py, mopps.py): in an equal-budget benchmark by default."""
ALL_STRATEGIES = (*STRATEGIES, *FIELD_STRATEGIES)
DEFAULTS = {"steps": 70, "validate_every": 7, "val_size": 640}
"""The benchmark's run length and validation (docs/benchmarks.md, "A cheaper benchmark"): 640
prompts keep a validation's standard error at or under 0.5 / sqrt(640) = 0.0198."""
DEFAULT_CONFIG = "configs/tiny_cpu.yaml"
BUDGET_DEFAULTS = {"budget": 40_960, "validations": 8, "val_size": 18_000, "step_cap": 100_000}
"""An equal-budget benchmark (docs/benchmarks.md, "Equal budgets"): 40,960 rollouts (80 GRPO steps of
512), validation every budget / 8 rollouts (so at R/4, R/2, 3R/4 and R exactly), 18,000
validation prompts, and a step cap that never binds. The size: in the paper's shape the first
runs (paper_like, seed 0) gained 0.041-0.047 at the budget, so the targets lie 0.011 apart, and
their per-prompt spread (0.465) needs 16,700 prompts for a standard error under a third of that;
18,000 give 0.0035. Eight validations of 18,000 cost about what sixteen of 6,000 and a greedy
answer each did."""
MIN_EPOCHS = 3
"""A regime with a pool of its own (multi_epoch) must give GRPO at least this many epochs of the budget."""
VALIDATION_SEED = 20_260_526
"""Seed of every regime's fixed validation set (not a run seed: the set is shared by all runs)."""


@dataclass(frozen=True)
class Job:
    """One training run of the benchmark."""

    regime: Regime
    label: str
    """``pilot_commit``, ``grpo``, ``dapo``, a variant or an ablation name."""
    strategy: str
    seed: int
    overrides: tuple[str, ...]
    run_dir: Path
    rule: UpdateRule = UpdateRule("equal", 1)
    """The update rule it trains under (its overrides hold its settings)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megatron-pc bench rollouts", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG, help="experiment YAML (default: the tiny CPU run)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every run, e.g. training.lr=1e-4")
    parser.add_argument("--regimes", default=",".join(DEFAULT_REGIMES), help="comma-separated, from " + ", ".join(REGIMES))
    parser.add_argument("--strategies", default=None,
                        help=f"comma-separated, from {', '.join(ALL_STRATEGIES)} (default: all with --budget, else {', '.join(STRATEGIES)})")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=3, help="seeds per regime and strategy (0..N-1)")
    parser.add_argument("--budget", type=int, default=None,
                        help="equal budgets: every run trains until it has generated this many rollouts (steps vary); "
                             f"e.g. {BUDGET_DEFAULTS['budget']}. Without it, runs are matched in --steps (the older design)")  # fmt: skip
    parser.add_argument("--validate-every-rollouts", type=int, default=None,
                        help=f"with --budget: validation every K generated rollouts, plus at 0 and the budget (default budget / {BUDGET_DEFAULTS['validations']})")  # fmt: skip
    parser.add_argument("--shape", default=None, choices=tuple(SHAPES),
                        help=f"group shape (benchmarks/shapes.py; default {MAIN_SHAPE} with --budget, small without)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps per run (default {DEFAULTS['steps']}; with --budget a cap, default {BUDGET_DEFAULTS['step_cap']:,})")  # fmt: skip
    parser.add_argument("--validate-every", type=int, default=DEFAULTS["validate_every"], help="validation every K steps (without --budget)")
    parser.add_argument("--val-size", type=int, default=None,
                        help=f"prompts in each regime's fixed validation set (default {BUDGET_DEFAULTS['val_size']:,} with --budget, else {DEFAULTS['val_size']})")  # fmt: skip
    parser.add_argument("--update-rule", default="reference", choices=UPDATE_RULES,
                        help="reference: the recipe's mini-batches in call rollouts; equal: --updates per step for every strategy")  # fmt: skip
    parser.add_argument("--updates", type=int, default=None, help="with --update-rule equal: optimizer updates per step (default 1)")
    parser.add_argument("--train-size", type=int, default=20_000, help="training prompts per run")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated from {', '.join(VARIANTS)}, or none")
    parser.add_argument("--variant-regimes", default=None, help="comma-separated regimes the variants run on (default: every one of --regimes)")
    parser.add_argument("--ablations", default=",".join(ABLATIONS), help=f"comma-separated from {', '.join(ABLATIONS)}, or none")
    parser.add_argument("--calibration-prompts", type=int, default=500, help="validation prompts the start model is measured on")
    parser.add_argument("--no-simulate", action="store_true", help="skip the calibrated simulator")
    parser.add_argument("--simulator-learning", choices=("fitted", "linear"), default="fitted",
                        help="the simulator's learning model (megatron-pc simulate --learning)")  # fmt: skip
    parser.add_argument("--target-fractions", default="0.25,0.5,0.75", help="targets as shares of the smallest final gain")
    parser.add_argument("--equal-runs", action="append", default=[], metavar="DIR",
                        help="a kept benchmark of 1 update a step (e.g. results/bench_rollouts; repeat the flag for several): its "
                             "GRPO/PC ratios join the decomposition table, for regimes that started from the same model")  # fmt: skip
    parser.add_argument("--out", default="runs/bench_rollouts", help="benchmark directory (runs, report.md, summary.json, PNGs)")
    return parser


def _check_args(args: argparse.Namespace) -> tuple[list[Regime], list[str], list[str], list[str]]:
    """The regimes, strategies, variants and ablations asked for; ``args.rule`` and
    ``args.variant_regime_names`` set. Refuses anything unknown, naming the option."""
    from megatron_pc.config_cli import split_config_args

    config, args.overrides = split_config_args(args.config, args.overrides)  # CONFIG may be left out
    args.config = config or DEFAULT_CONFIG
    regimes = parse_regimes(args.regimes)
    budgeted = args.budget is not None
    strategies = parse_names(args.strategies or ",".join(ALL_STRATEGIES if budgeted else STRATEGIES), "strategies", ALL_STRATEGIES)
    args.shape = parse_shape(args.shape or (MAIN_SHAPE if budgeted else "small"))
    args.steps = args.steps if args.steps is not None else BUDGET_DEFAULTS["step_cap"] if budgeted else DEFAULTS["steps"]
    args.val_size = args.val_size if args.val_size is not None else BUDGET_DEFAULTS["val_size"] if budgeted else DEFAULTS["val_size"]
    if budgeted:
        if args.budget < 1:
            raise MegatronPCError(f"--budget: must be >= 1 rollout, got {args.budget}")
        if args.validate_every_rollouts is None:
            args.validate_every_rollouts = max(1, args.budget // BUDGET_DEFAULTS["validations"])
        if args.validate_every_rollouts < 1:
            raise MegatronPCError(f"--validate-every-rollouts: must be >= 1, got {args.validate_every_rollouts}")
    elif args.validate_every_rollouts is not None:
        raise MegatronPCError("--validate-every-rollouts: only with --budget (without it, validation is every --validate-every steps)")
    ablations = parse_names(args.ablations, "ablations", ABLATIONS, or_none=True)
    variants = parse_names(args.variants, "variants", VARIANTS, or_none=True)
    for name in ("seeds", "steps", "validate_every", "val_size", "train_size", "calibration_prompts"):
        if getattr(args, name) < 1:
            raise MegatronPCError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    args.rule = parse_rule(args.update_rule, args.updates)
    names = [r.name for r in regimes]
    chosen = names if args.variant_regimes is None else [r.name for r in parse_regimes(args.variant_regimes)]
    if set(chosen) - set(names):
        raise MegatronPCError(f"--variant-regimes: {sorted(set(chosen) - set(names))} not among --regimes {', '.join(names)}")
    args.variant_regime_names = chosen
    return regimes, strategies, variants, ablations


def _base_overrides(args: argparse.Namespace, regime: Regime, validation: Path) -> list[str]:
    """Overrides of every run of a regime. The user's come after the benchmark's defaults and
    before what defines the regime and the comparison (data, validation), which they cannot change."""
    # A step that runs out of rounds trains on what it has (counted as partial_steps) rather than
    # ending a long benchmark; the same rule for every strategy.
    defaults = ["allocation.on_round_limit=train_partial", "logging.tensorboard=false", *args.shape.overrides()]
    fixed = [f"data.source={regime.source}", f"data.train_size={regime.train_size or args.train_size}",
             f"data.validation={relative_path(validation)}", f"training.validate_every={args.validate_every}"]  # fmt: skip
    if args.budget is not None:
        fixed += [f"training.rollout_budget={args.budget}", f"training.validate_every_rollouts={args.validate_every_rollouts}"]
    return [*defaults, *args.overrides, *fixed]


def check_epochs(args: argparse.Namespace, regime: Regime, cfg: Any) -> None:
    """A regime with a pool of its own must give GRPO at least MIN_EPOCHS epochs of the budget."""
    if regime.train_size is None or args.budget is None:
        return
    epochs = args.budget / (regime.train_size * cfg.allocation.n)
    if epochs < MIN_EPOCHS:
        raise MegatronPCError(f"--budget {args.budget}: {regime.name} gives GRPO {epochs:.1f} epochs over its {regime.train_size} prompts "
                              f"at n = {cfg.allocation.n}; it needs >= {MIN_EPOCHS} (a budget of at least "
                              f"{MIN_EPOCHS * regime.train_size * cfg.allocation.n:,})")  # fmt: skip


def write_validation_set(regime: Regime, size: int, path: Path) -> None:
    """The regime's fixed validation prompts; an existing file must hold exactly the same set, and so
    must a SHA-256 record beside it (``validation.sha256``: kept runs whose set was too large to keep)."""
    from megatron_pc.data.builtin import BUILTIN_SOURCES

    records = BUILTIN_SOURCES[regime.source.removeprefix("builtin:")](size, VALIDATION_SEED)
    text = "".join(json.dumps(r.to_row(), ensure_ascii=False) + "\n" for r in records)
    record = path.with_name("validation.sha256")  # kept runs' set, recorded by scripts/bench_results.sh save
    if record.is_file():
        import hashlib

        if hashlib.sha256(text.encode()).hexdigest() != record.read_text().strip():
            raise MegatronPCError(f"{path}: the validation set made now (--val-size {size}) is not the one the kept runs were validated on "
                                  f"({record}: its SHA-256); the runs are not comparable with new ones: use another --out")  # fmt: skip
    if path.exists():
        if path.read_text() != text:
            raise MegatronPCError(f"{path} holds a different validation set (another --val-size?); use another --out")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def finished_steps(run_dir: Path) -> int:
    """Steps of the run that are done and checkpointed (0 when nothing is).

    A run kept without its checkpoints (the metrics and config of a finished run, e.g. results
    committed to share them: scripts/bench_results.sh) counts the steps its metrics hold.
    """
    from megatron_pc.driver.checkpoints import CheckpointManager

    if (run_dir / "checkpoints").is_dir():
        latest = CheckpointManager(run_dir).latest()
        return latest[0] if latest else 0
    return metrics_steps(run_dir)


def finished_rollouts(run_dir: Path) -> float:
    """Rollouts the run generated up to its last checkpointed (or, kept without checkpoints, last
    logged) step (0 without metrics)."""
    from megatron_pc.metrics.logger import read_metrics

    path, done = run_dir / "metrics.jsonl", finished_steps(run_dir)
    rows = read_metrics(path) if path.is_file() else []
    return max((float(r.get("cum_generated", 0)) for r in rows if 0 < int(r.get("step", 0)) <= done), default=0.0)


def metrics_steps(run_dir: Path) -> int:
    """The last training step in the run's metrics.jsonl, plain or kept (0 without one)."""
    from megatron_pc.metrics.logger import read_metrics

    path = metrics_file(run_dir)
    return max((int(r.get("step", 0)) for r in read_metrics(path)), default=0) if path is not None else 0


def check_same_config(config: str, job: Job, overrides: list[str]) -> None:
    """A finished run is reused only if it ran the configuration asked for now (by the rule a
    resumed `megatron-pc train` applies: only steps, validation/save intervals, logging may differ)."""
    import yaml

    from megatron_pc.driver.prepare import config_changes
    from megatron_pc.fields import flatten
    from megatron_pc.config import load_config, to_dict

    current = flatten(to_dict(load_config(config, [*overrides, f"allocation.strategy={job.strategy}"])))
    saved = flatten(yaml.safe_load((job.run_dir / "config.yaml").read_text()) or {})
    # Runs record their validation set relative to the working directory (the repository root,
    # where the benchmark runs) or, outside it, absolute: compared as the same file either way.
    for flat in (saved, current):
        if isinstance(flat.get("data.validation"), str):
            flat["data.validation"] = str(Path(flat["data.validation"]).resolve())
    # A setting removed since the run was made (e.g. rollout.logprob_gap_max) has no current
    # value to differ from; what the run did under it is in its metrics.
    saved = {k: v for k, v in saved.items() if k in current}
    changed = config_changes(saved, current)
    if changed:
        details = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed[:5])
        raise MegatronPCError(f"{job.run_dir} holds a finished run with another configuration ({details}); use another --out")


class Progress:
    """One line per run: which run, steps done, seconds."""

    def __init__(self, total: int, budget: int | None = None) -> None:
        self.total, self.done, self.start, self.budget = total, 0, time.perf_counter(), budget

    def line(self, job: Job, steps: int, wanted: int, seconds: float, note: str) -> None:
        """Report a run that ended (or was found finished)."""
        self.done += 1
        spent = f"{steps} steps, {finished_rollouts(job.run_dir):,.0f}/{self.budget:,} rollouts" if self.budget else f"{steps}/{wanted} steps"
        print(f"bench rollouts [{self.done}/{self.total}] {job.regime.name} {job.label} ({job.rule.label}) seed {job.seed}: {spent}, "
              f"{seconds:,.0f} s ({note}); benchmark elapsed {time.perf_counter() - self.start:,.0f} s", file=sys.stderr, flush=True)  # fmt: skip


def run_job(config: str, job: Job, steps: int, progress: Progress, budget: int | None = None) -> dict[str, float] | None:
    """Train (or resume) one run to ``steps``, or with ``budget`` until it has generated that many
    rollouts: its wall seconds in this call and the step it started from (None: it was finished)."""
    overrides = [*job.overrides, f"seed={job.seed}"]
    if _interrupted_before_checkpoint(job, steps, budget):
        print(f"bench rollouts: {job.run_dir} was stopped after {metrics_steps(job.run_dir)} steps, before its first checkpoint; "
              "training it again from the start", file=sys.stderr, flush=True)  # fmt: skip
        shutil.rmtree(job.run_dir)
    before = finished_steps(job.run_dir)
    done = before >= steps or (budget is not None and finished_rollouts(job.run_dir) >= budget)
    if not done and not (job.run_dir / "checkpoints").is_dir() and metrics_steps(job.run_dir):
        raise MegatronPCError(f"{job.run_dir} holds {metrics_steps(job.run_dir)} steps of metrics but no checkpoints to continue from "
                              f"(--steps {steps}); remove the directory to train it again, or ask for at most that many steps")  # fmt: skip
    if done:
        check_same_config(config, job, overrides)
        progress.line(job, before, steps, 0.0, "already finished")
        return None
    wall = run_strategy(config, job.strategy, overrides, steps, job.run_dir)
    progress.line(job, finished_steps(job.run_dir), steps, wall, f"resumed at step {before}" if before else "trained")
    record = {"wall_seconds": wall, "from_step": before}
    # Kept beside the run so a later call (a resumed benchmark) still knows this call's cost.
    _wall_path(job).write_text(json.dumps(record) + "\n")
    return record


def _interrupted_before_checkpoint(job: Job, steps: int, budget: int | None) -> bool:
    """A run stopped before its first checkpoint: metrics but no checkpoints and no wall.json (a
    finished run always has one, and a kept run is only a finished one), short of what is asked.
    Nothing of it can be continued; its steps are redone from the same seed."""
    if (job.run_dir / "checkpoints").is_dir() or _wall_path(job).is_file() or not metrics_steps(job.run_dir):
        return False
    return metrics_steps(job.run_dir) < steps and (budget is None or finished_rollouts(job.run_dir) < budget)


def _wall_path(job: Job) -> Path:
    return job.run_dir.parent / f"{job.run_dir.name}.wall.json"


def read_wall(job: Job) -> dict[str, float] | None:
    """The wall seconds of the call that last trained the run (None if unknown)."""
    path = _wall_path(job)
    return json.loads(path.read_text()) if path.is_file() else None


def startup_seconds(run: Run, wall: dict[str, float]) -> float | None:
    """Seconds of a run trained from scratch outside its steps and validations: start-up (Ray,
    workers, engines) and shutdown."""
    if wall["from_step"]:
        return None
    first_validation = validation_seconds(run.rows) or 0.0  # step 0's validation is counted with the others
    return wall["wall_seconds"] - sum(r.get("time_total") or 0.0 for r in run.steps) - first_validation


def estimate_seconds(summary: dict[str, Any], startup: float, steps: int, seeds: int, validate_every: int, val_scale: float) -> dict[str, float]:
    """Seconds a benchmark of ``steps`` x ``seeds`` per strategy and regime would take, from the
    measured seconds per step, per validation (scaled by ``val_scale``) and per start-up."""
    out: dict[str, float] = {}
    for name, reg in summary["regimes"].items():
        total = 0.0
        for figures in reg["strategies"].values():
            validations = 1 + steps // validate_every + (steps % validate_every != 0)  # step 0, every K, the last
            per_run = steps * (figures["step_seconds"] or 0.0) + validations * (figures["validation_seconds"] or 0.0) * val_scale + startup
            total += seeds * per_run
        out[name] = total
    out["total"] = sum(out.values())
    return out


def estimate_budget_seconds(summary: dict[str, Any], startup: float, budget: int, every: int, seeds: int, val_scale: float) -> dict[str, float]:
    """Seconds an equal-budget benchmark would take: per run, the steps its measured rollouts per
    step need to spend the budget, budget / every + 2 validations (scaled by ``val_scale``), and
    a start-up."""
    out: dict[str, float] = {}
    for name, reg in summary["regimes"].items():
        total = 0.0
        for figures in reg["strategies"].values():
            steps = budget / figures["rollouts_per_step"] if figures["rollouts_per_step"] else 0.0
            validations = budget // every + 2
            total += seeds * (steps * (figures["step_seconds"] or 0.0) + validations * (figures["validation_seconds"] or 0.0) * val_scale + startup)
        out[name] = total
    out["total"] = sum(out.values())
    return out


MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")
"""The files of a start model that decide what it generates (their bytes make its fingerprint)."""


def model_fingerprint(model_dir: Path) -> str:
    """SHA-256 over the names and SHA-256s of the start model's deciding files (those it has of MODEL_FILES)."""
    import hashlib

    from megatron_pc.driver.checkpoints import sha256_file

    listing = "".join(f"{name}\0{sha256_file(model_dir / name)}\n" for name in MODEL_FILES if (model_dir / name).is_file())
    return hashlib.sha256(listing.encode()).hexdigest()


def check_start_model(cfg: Any, regime_dir: Path) -> None:
    """Every run of a regime starts from one model: the first call records the model's
    fingerprint in REGIME/start_model.json, later calls refuse another model.

    The tiny model is made on each machine by a seeded warm-up, but its bits follow the
    processor's kernels: one made elsewhere can differ, and runs trained from it are not
    comparable with the kept ones. ``scripts/bench_results.sh`` keeps the model beside the runs
    and puts it back. A regime whose runs predate the record gets none here (nothing proves which
    model they started from); :func:`check_same_start` still compares their step-0 validations.
    """
    from megatron_pc.driver.prepare import ensure_model

    model_dir = Path(ensure_model(cfg)).resolve()
    record = regime_dir / "start_model.json"
    mine = {"path": cfg.model.path, "sha256": model_fingerprint(model_dir)}
    if record.is_file():
        saved = json.loads(record.read_text())
        if saved.get("sha256") != mine["sha256"]:
            raise MegatronPCError(
                f"{regime_dir.name}: the model at {model_dir} (sha256 {mine['sha256'][:12]}) is not the one the runs in {regime_dir} "
                f"started from ({record}: {saved.get('path')}, sha256 {str(saved.get('sha256'))[:12]}); put that model back "
                "(scripts/bench_results.sh restore does, for kept results) or use another --out"
            )
        return
    if run_dirs(regime_dir, "*/seed_*"):
        print(f"bench rollouts: {regime_dir.name}: runs kept from before start models were recorded; their start is checked by "
              "their step-0 validations only", file=sys.stderr)  # fmt: skip
        return
    regime_dir.mkdir(parents=True, exist_ok=True)
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps(mine) + "\n")
    tmp.replace(record)


START_KEYS = ("val_accuracy", "val_greedy_accuracy")
"""Step-0 validation figures that runs of one regime and seed share when they start from one model."""


def check_same_start(runs: list[Run]) -> None:
    """Refuse to compare runs of one regime and seed that did not start from the same model.

    The step-0 validation (before any update) depends only on the start model, the regime's
    validation set and the seed, never on the strategy; runs whose step-0 figures differ were
    trained from another model (the tiny model made again differently, another model.path).
    """
    starts: dict[tuple[str, int], dict[tuple[Any, ...], list[Run]]] = {}
    for run in runs:
        row = next((r for r in run.rows if r.get("step", 0) == 0 and r.get("val_accuracy") is not None), None)
        if row is None:
            raise MegatronPCError(f"{run.run_dir}: metrics.jsonl has no step-0 validation, so its start model cannot be checked")
        key = tuple(row.get(k) for k in START_KEYS)
        starts.setdefault((run.regime, run.seed), {}).setdefault(key, []).append(run)
    for (regime, seed), by_start in starts.items():
        if len(by_start) > 1:
            found = "; ".join(f"{', '.join(str(r.run_dir) for r in group)}: {dict(zip(START_KEYS, key))}" for key, group in by_start.items())
            raise MegatronPCError(f"{regime} seed {seed}: the runs did not start from the same model (their step-0 validations "
                                  f"differ: {found}); remove the run directories trained from the other model and run the "
                                  "benchmark again to retrain them")  # fmt: skip


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its report; stopped (SIGINT, SIGTERM), it resumes when run again."""
    args = _parser().parse_intermixed_args(argv)  # overrides may follow the options
    # SIGTERM as Ctrl-C: the running `megatron-pc train` is stopped with us rather than left
    # writing into its run directory; its last checkpoint is where the next call resumes.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _bench(args)
    except KeyboardInterrupt:
        print(f"bench rollouts: interrupted; run the same command to resume ({args.out})", file=sys.stderr)
        return 130


def _bench(args: argparse.Namespace) -> int:
    regimes, strategies, variants, ablations = _check_args(args)
    fractions = parse_fractions(args.target_fractions)
    from megatron_pc.config import load_config

    out = Path(args.out).resolve()
    # Every run's configuration is built (and refused if bad) before any run starts.
    planned = {r.name: labelled_jobs(args, r, out, strategies, variants) for r in regimes}
    progress = Progress(sum(len(jobs) for jobs in planned.values()) + len(regimes) * args.seeds * len(ablations), args.budget)
    runs: list[Run] = []
    settings = {k: relative_path(v) if k == "out" else v for k, v in vars(args).items() if k not in ("rule", "shape")}
    shape = {"name": args.shape.name, "n": args.shape.n, "pilot_n": args.shape.pilot_n, "commit_n": args.shape.n - args.shape.pilot_n,
             "train_batch": args.shape.train_batch, "summary": args.shape.summary}  # fmt: skip
    extra: dict[str, Any] = {"bench": settings, "update_rule": args.rule.label, "shape": shape,
                             "validate_every_rollouts": args.validate_every_rollouts,
                             "calibration": {}, "ablations": {}, "simulator": {}, "wall_seconds": {}}  # fmt: skip
    for regime in regimes:
        validation = out / regime.name / "validation.jsonl"
        write_validation_set(regime, args.val_size, validation)
        base = _base_overrides(args, regime, validation)
        cfg = load_config(args.config, base)
        check_epochs(args, regime, cfg)
        check_start_model(cfg, out / regime.name)
        calibration = calibrate(cfg, validation, args.calibration_prompts, out / regime.name / "success_rates.json")
        extra["calibration"][regime.name] = {k: v for k, v in calibration.items() if k != "rates"}
        sized = ablation_jobs(cfg, regime, ablations, calibration, base, out, args.seeds, args.rule)
        extra["ablations"][regime.name] = sized["settings"]
        for job in planned[regime.name] + sized["jobs"]:
            wall = run_job(args.config, job, args.steps, progress, args.budget) or read_wall(job)
            variant = "none" if job.label == job.strategy else job.label
            runs.append(load_run(job.run_dir, regime=regime.name, strategy=job.label, seed=job.seed, variant=variant))
            if wall is not None:
                extra["wall_seconds"][str(job.run_dir.relative_to(out))] = {**wall, "startup_seconds": startup_seconds(runs[-1], wall)}
    check_same_start(runs)
    sections = []
    # The simulator is step-matched (the older design); an equal-budget benchmark leaves it out until it is refitted.
    if not args.no_simulate and args.budget is None:
        sections.append(_simulate_all(args, regimes, runs, fractions, extra))
    sections.append(_timing_section(args, runs, fractions, extra))
    if variants or args.equal_runs:
        sections.append(_decomposition_section(args, runs, fractions, out, extra))
    summary = write_report(runs, out, fractions=fractions, budget=args.budget, extra=extra, sections=sections)
    print(f"bench rollouts: {out / 'report.md'}, {out / 'summary.json'}; plots: {', '.join(summary['plots'])}")
    return 0


def _decomposition_section(args: argparse.Namespace, runs: list[Run], fractions: tuple[float, ...], out: Path, extra: dict[str, Any]) -> str:
    """The decomposition table (megatron_pc.analysis.decompose) of this benchmark's runs, with the
    1-update runs of --equal-runs where they started from the same model; into summary.json."""
    from megatron_pc.analysis import decompose

    equal, left_out = decompose.equal_runs_from(args.equal_runs, out) if args.equal_runs else (None, [])
    table = decompose.decompose(runs, equal, fractions)
    table["equal_left_out"] = left_out
    extra["decomposition"] = table
    return decompose.markdown(table)


def labelled_jobs(args: argparse.Namespace, regime: Regime, out: Path, strategies: list[str], variants: list[str]) -> list[Job]:
    """The strategies' and variants' runs of a regime (seed by seed), each under its update rule:
    the benchmark's, or a variant's own."""
    from megatron_pc.config import load_config

    base = _base_overrides(args, regime, out / regime.name / "validation.jsonl")
    regime_batch = load_config(args.config, base).allocation.train_batch
    specs = [(s, s, (), args.rule) for s in strategies]
    if regime.name in args.variant_regime_names:
        specs += [(v, VARIANTS[v].strategy, VARIANTS[v].overrides(regime_batch), VARIANTS[v].rule or args.rule) for v in variants]
    labelled = []
    for label, strategy, more, rule in specs:
        overrides = (*base, f"allocation.strategy={strategy}", *more)
        train_batch = load_config(args.config, list(overrides)).allocation.train_batch
        overrides = (*overrides, *rule.overrides(train_batch, regime_batch, label))
        load_config(args.config, list(overrides))  # refused here, naming the field, rather than in the middle of the benchmark
        labelled.append((label, strategy, overrides, rule))
    return [Job(regime, label, strategy, seed, overrides, out / regime.name / f"{label}{rule.dir_suffix}" / f"seed_{seed}", rule)
            for seed in range(args.seeds) for label, strategy, overrides, rule in labelled]  # fmt: skip


def _timing_section(args: argparse.Namespace, runs: list[Run], fractions: tuple[float, ...], extra: dict[str, Any]) -> str:
    """Measured seconds per step / validation / start-up, and what the full benchmark would take."""
    from megatron_pc.analysis.report import summarize

    starts = [w["startup_seconds"] for w in extra["wall_seconds"].values() if w.get("startup_seconds") is not None]
    startup = statistics.median(starts) if starts else 0.0
    startup_text = f"{startup:.0f} s (median)" if starts else "unknown (no run here was trained from scratch), counted as 0"
    summary = summarize(runs, fractions)
    full = {**DEFAULTS, "seeds": 3}
    scale = full["val_size"] / args.val_size
    main_only = summarize([r for r in runs if r.strategy in STRATEGIES], fractions)
    extra["estimate_seconds"] = {
        "this_benchmark": estimate_seconds(summary, startup, args.steps, args.seeds, args.validate_every, 1.0),
        "full_benchmark": {**full, **estimate_seconds(summary, startup, full["steps"], full["seeds"], full["validate_every"], scale)},
        "full_benchmark_without_ablations": estimate_seconds(main_only, startup, full["steps"], full["seeds"], full["validate_every"], scale),
        "startup_seconds": startup,
    }
    lines = ["## Time", "", "| regime | strategy | s/step (median) | s/validation | rollouts/step |", "|---|---|---|---|---|"]
    for name, reg in summary["regimes"].items():
        for label, f in reg["strategies"].items():
            lines.append(f"| {name} | {label} | {f['step_seconds'] or 0:.2f} | {f['validation_seconds'] or 0:.1f} | {f['rollouts_per_step'] or 0:,.0f} |")
    if args.budget is not None:
        extra["estimate_seconds"]["budget_benchmark"] = {
            "budget": args.budget, "validate_every_rollouts": args.validate_every_rollouts, "seeds": 3, "val_size": BUDGET_DEFAULTS["val_size"],
            **estimate_budget_seconds(summary, startup, args.budget, args.validate_every_rollouts, 3, BUDGET_DEFAULTS["val_size"] / args.val_size)}  # fmt: skip
    est = extra["estimate_seconds"]
    if args.budget is not None:
        b = est["budget_benchmark"]
        lines += ["", f"At these rates these regimes and labels at a budget of {args.budget:,} rollouts, 3 seeds, {b['val_size']:,} validation "
                      f"prompts every {args.validate_every_rollouts:,} rollouts, would take about {b['total'] / 3600:.1f} h on this machine "
                      f"({', '.join(f'{k} {v / 3600:.1f} h' for k, v in b.items() if k in summary['regimes'])})."]  # fmt: skip
    lines += ["", f"Start-up per run (Ray, workers, engines; shutdown): {startup_text}. At these rates the full "
              f"benchmark ({full['steps']} steps, {full['seeds']} seeds, validation of {full['val_size']} prompts every "
              f"{full['validate_every']} steps, these regimes) would take about {est['full_benchmark']['total'] / 3600:.1f} h on this "
              f"machine, {est['full_benchmark_without_ablations']['total'] / 3600:.1f} h without the ablations."]  # fmt: skip
    return "\n".join(lines)


def ablation_jobs(cfg: Any, regime: Regime, ablations: list[str], calibration: dict[str, Any], base: list[str], out: Path,
                  seeds: int, rule: UpdateRule) -> dict[str, Any]:  # fmt: skip
    """The ablation runs of a regime, sized from its calibration, under the benchmark's update rule."""
    from benchmarks.calibration import matched_grpo_batch, sized_pilot_batch

    a = cfg.allocation
    settings: dict[str, Any] = {}
    if "grpo_matched" in ablations:
        batch = matched_grpo_batch(a.train_batch, calibration["z"], a.n, cfg.rollout.engines)
        # Under equal/1: one optimizer update per step, as the others take (the same informative groups per update).
        settings["grpo_matched"] = {"strategy": "grpo", "overrides": [f"allocation.train_batch={batch}",
                                                                      *rule.overrides(batch, a.train_batch, "grpo_matched")]}  # fmt: skip
    if "pc_sized" in ablations:
        batch = sized_pilot_batch(a.train_batch, calibration["keep_rate"], a.pilot.n, cfg.rollout.engines)
        settings["pc_sized"] = {"strategy": "pilot_commit", "overrides": [f"allocation.pilot.batch={batch}",
                                                                          *rule.overrides(a.train_batch, a.train_batch, "pc_sized")]}  # fmt: skip
    jobs = [Job(regime, name, s["strategy"], seed, (*base, f"allocation.strategy={s['strategy']}", *s["overrides"]),
                out / regime.name / f"{name}{rule.dir_suffix}" / f"seed_{seed}", rule)
            for seed in range(seeds) for name, s in settings.items()]  # fmt: skip
    return {"settings": settings, "jobs": jobs}


def _simulate_all(args: argparse.Namespace, regimes: list[Regime], runs: list[Run], fractions: tuple[float, ...], extra: dict[str, Any]) -> str:
    """The calibrated simulator per regime; its figures go to ``extra``, a markdown section is returned."""
    from megatron_pc.analysis.report import summarize
    from benchmarks.calibration import simulator_section

    measured = summarize([r for r in runs if r.strategy in STRATEGIES], fractions)["regimes"]
    out = Path(args.out).resolve()
    for regime in regimes:
        rates_path = out / regime.name / "success_rates.json"
        extra["simulator"][regime.name] = simulate_regime(args, regime, rates_path, measured[regime.name], fractions)
    if extra["simulator"]:
        print(f"bench rollouts: simulator: {next(iter(extra['simulator'].values()))['error']}")
    return simulator_section(extra["simulator"], measured)
