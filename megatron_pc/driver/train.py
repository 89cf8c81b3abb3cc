"""``megatron-pc train [CONFIG] [overrides]``: the main job.

Prints a progress bar with the key figures while it runs; writes everything to the run
directory (``run_dir``, default ``runs/<name>``): metrics.jsonl, tensorboard/, trace.jsonl,
checkpoints/, config.yaml, train.log. Starting again in a directory that holds a checkpoint
resumes from the newest complete one.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from megatron_pc import console
from megatron_pc.config import load_config
from megatron_pc.config_cli import resolve_config_args

logger = logging.getLogger(__name__)

PREEMPTED_EXIT = 75
"""Exit code after a checkpoint made because of SIGTERM/SIGUSR1 (EX_TEMPFAIL), or after a Ray
node of the run was lost (megatron_pc.cluster.nodes): the job is not finished and should be
requeued; it resumes by itself from the newest complete checkpoint."""


def main(argv: list[str] | None = None) -> int:
    """Train; 0 when the run finished, PREEMPTED_EXIT when it stopped on a signal."""
    parser = argparse.ArgumentParser(prog="megatron-pc train", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("config", nargs="?", help="experiment YAML or a name in configs/ (qwen3_14b); default: the tiny CPU run "
                        "(configs/tiny_cpu.yaml), or with your own data.source the dataclass defaults")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. allocation.strategy=grpo")
    parser.add_argument("--verbose", action="store_true",
                        help="show every log line (vLLM, Megatron, Ray, warnings) on the console; by default they go to train.log only")
    args = parser.parse_args(argv)
    path, overrides, note = resolve_config_args(args.config, args.overrides)
    cfg = load_config(path, overrides)

    from megatron_pc.driver.prepare import prepare, record_config
    from megatron_pc.driver.trainer import Trainer

    run_dir = cfg.resolved_run_dir
    record_config(cfg, run_dir)
    console.setup(run_dir / "train.log", verbose=args.verbose)
    budget = f" or {cfg.training.rollout_budget:,} rollouts, whichever comes first" if cfg.training.rollout_budget else ""
    console.to_console(logger, "megatron-pc train %s: %s, %d steps%s, run directory %s (log: train.log%s)", cfg.name,
                       cfg.allocation.strategy, cfg.training.steps, budget, run_dir, "" if args.verbose else "; --verbose shows it here")
    if note:
        console.to_console(logger, "%s", note)
    from megatron_pc.cluster.nodes import NodeLostError

    data = prepare(cfg)
    trainer = Trainer(cfg, data)
    try:
        last = trainer.run()
    except NodeLostError as err:
        logger.error("%s", err)
        print(f"node lost: {err}; run the same command to resume ({run_dir / 'checkpoints'})", file=sys.stderr)
        return PREEMPTED_EXIT
    if trainer.preempted:
        print(f"preempted: checkpoint written in {run_dir / 'checkpoints'}; run the same command to resume", file=sys.stderr)
        return PREEMPTED_EXIT
    _summary(run_dir, last)
    return 0


def _summary(run_dir: Path, last: dict[str, float]) -> None:
    from megatron_pc.metrics.logger import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    vals = [(r["step"], r["val_accuracy"], r.get("cum_generated", 0)) for r in rows if r.get("val_accuracy") is not None]
    print(f"run finished: {run_dir}")
    if vals:
        print(f"validation accuracy: {vals[0][1]:.3f} at step {vals[0][0]} -> {vals[-1][1]:.3f} at step {vals[-1][0]}")
    if last:
        print(f"rollouts generated: {last.get('cum_generated', 0):,.0f} (pilot {last.get('cum_generated_pilot', 0):,.0f}, "
              f"commit {last.get('cum_generated_commit', 0):,.0f}, full {last.get('cum_generated_full', 0):,.0f}); "
              f"trained on {last.get('cum_trained_rollouts', 0):,.0f}")
    print(f"metrics: {run_dir / 'metrics.jsonl'}  trace: {run_dir / 'trace.jsonl'}  tensorboard: {run_dir / 'tensorboard'}")
