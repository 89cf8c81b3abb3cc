"""The ``megatron-pc`` command. Subcommands live next to their code and are imported lazily,
so ``megatron-pc simulate`` starts in a fraction of a second without torch or vLLM."""

from __future__ import annotations

import importlib
import logging
import sys

from megatron_pc.errors import MegatronPCError

# name -> (module:function, one-line help). Each function takes argv and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("megatron_pc.driver.train:main", "train a policy (default: the tiny CPU configuration)"),
    "simulate": ("megatron_pc.bench.simulate:main", "compare allocation strategies on a simulated policy"),
    "bench": ("megatron_pc.bench.cli:main", "benchmarks: controller, train, rollout, convert, step, rollouts"),
    "score": ("megatron_pc.training.score:main", "per-token log-probs of given responses under a model"),
    "convert": ("conversion.cli:main", "convert checkpoints: hf-to-megatron | megatron-to-hf"),
    "make-tiny-model": ("megatron_pc.models.tiny:main", "make the tiny CPU model (warm-up on arithmetic)"),
    "plan": ("megatron_pc.launch.plan:main", "check a layout fits the cluster and estimate memory per GPU"),
    "project": ("megatron_pc.launch.project:main", "seconds per step of PC, GRPO and DAPO projected to a cluster (default 14B on 64 H200)"),
    "launch": ("megatron_pc.launch.nemo:main", "submit a job through nemo-run (slurm | local)"),
    "config": ("megatron_pc.config_cli:main", "print the resolved configuration of an experiment"),
    "report": ("megatron_pc.bench.report:main", "report and plots of validation accuracy against rollouts for any runs"),
    "data": ("megatron_pc.data.cli:main", "prompt data files: inspect (format, fields, problems) | convert (to our .jsonl)"),
}


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: megatron-pc COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `megatron-pc COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand; user errors print one clear line and exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"megatron-pc: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    module_name, func_name = COMMANDS[name][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    try:
        return int(func(rest) or 0)
    except MegatronPCError as err:
        print(f"megatron-pc {name}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
