"""The ``megatron-pc`` command. Subcommands live next to their code and are imported lazily,
so ``megatron-pc simulate`` starts in a fraction of a second without torch or vLLM."""

from __future__ import annotations

import logging
import sys

from megatron_pc.commands import CommandTable
from megatron_pc.errors import MegatronPCError

COMMANDS = CommandTable("megatron-pc", {
    "train": ("megatron_pc.driver.train:main", "train a policy (default: the tiny CPU configuration)"),
    "simulate": ("megatron_pc.analysis.simulate:main", "compare allocation strategies on a simulated policy"),
    "fit-simulator": ("megatron_pc.analysis.simulate_fit:main", "fit the simulator's learning model to benchmark runs; print its held-out error"),
    "bench": ("benchmarks.cli:main", "benchmarks: controller, train, rollout, convert, step, datapath, faults, sweep, weight-sync, activations, rollouts (bench --help)"),
    "score": ("megatron_pc.training.score:main", "per-token log-probs of given responses under a model"),
    "convert": ("conversion.cli:main", "convert checkpoints: hf-to-megatron | megatron-to-hf"),
    "make-tiny-model": ("megatron_pc.models.tiny:main", "make the tiny CPU model (warm-up on arithmetic)"),
    "plan": ("megatron_pc.launch.plan:main", "check a layout fits the cluster and estimate memory per GPU"),
    "project": ("megatron_pc.launch.project:main", "seconds per step of PC, GRPO and DAPO projected to a cluster (default 14B on 64 H200)"),
    "launch": ("megatron_pc.launch.nemo:main", "submit a job through nemo-run (slurm | local)"),
    "config": ("megatron_pc.config_cli:main", "print the resolved configuration of an experiment"),
    "report": ("megatron_pc.analysis.report:main", "report and plots of validation accuracy against rollouts for any runs"),
    "decompose": ("megatron_pc.analysis.decompose:main", "where the paper's gain comes from: update rules and controls side by side"),
    "data": ("megatron_pc.data.cli:main", "prompt data files: inspect (format, fields, problems) | convert (to our .jsonl)"),
}, footer="Run `megatron-pc COMMAND --help` for a command's options.")


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")


def version() -> str:
    """The installed distribution's version (setup.py's, when run from a checkout without an install)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("megatron-pc")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand; user errors print one clear line and exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(f"megatron-pc {version()}")
        return 0
    try:
        return COMMANDS.dispatch(argv, before=_configure_logging)
    except MegatronPCError as err:
        print(f"megatron-pc {argv[0]}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
