#!/usr/bin/env bash
# Start one training job inside a SLURM allocation: plan the layout, start Ray (head on this,
# the first node; one worker per other node), run the driver on the head, and requeue the job
# when the driver stopped for a preemption checkpoint. The slurm/pc_*.sbatch files exec this.
#
# usage: slurm/bootstrap.sh CONFIG.yaml
# Environment (all optional; docs/slurm.md, "Running on a cluster"):
#   STRATEGY           pilot_commit (default) | grpo | dapo -> allocation.strategy
#   MPC_OVERRIDES      extra dotted overrides, separated by spaces (no spaces inside one)
#   MPC_DRY_RUN=1      print the plan and the commands, start nothing, exit 0 (or the planner's code)
#   MPC_NO_DATA_CHECK=1  do not check that the config's data files exist before Ray starts
#   MPC_RUN_ROOT       parent of run directories (default $SLURM_SUBMIT_DIR/runs, else ./runs)
#   MPC_RUN_DIR        the run directory itself (default MPC_RUN_ROOT/<config>-<strategy>-<job id>);
#                      set it to an earlier run's directory to resume that run in a new job
#   MPC_VENV           virtual environment put first on PATH (default <repo>/.venv; empty: none)
#   MPC_GPUS_PER_NODE  GPUs per node (default: what SLURM allocated, else 0 = CPU-only job)
#   MPC_HEAD_IP        address the workers reach the head at (default: first of `hostname -I`)
#   MPC_RAY_PORT       Ray head (GCS) port (default 6379)
#   MPC_RAY_TMP        Ray's temp dir (default /tmp/ray-<job id>; must stay short)
#   MPC_RAY_WAIT_S     seconds to wait for every node to join Ray (default 300)
#   MPC_CONTAINER      an image: run every Python command in it through pyxis (slurm/lib/container.sh)
#   MPC_CONTAINER_MOUNTS  more SRC:DST[,...] container mounts (models, data, a node-local cache)
set -euo pipefail

# The driver's half of the preemption contract (docs/slurm.md): after SIGUSR1 (or SIGTERM) it
# saves a checkpoint and exits with this code, which asks for a requeue. Any other code is final.
# 75 is EX_TEMPFAIL of sysexits.h, "temporary failure, try again"; no Python crash exits with it.
readonly REQUEUE_EXIT_CODE=75

say() { echo "bootstrap: $*" >&2; }
# A command as one line a shell would read back (for the dry run).
quoted() { local out; printf -v out '%q ' "$@"; echo "${out% }"; }
die() { say "error: $*"; exit 2; }

[ $# -eq 1 ] || die "usage: slurm/bootstrap.sh CONFIG.yaml (got $# arguments)"
config="$1"
[ -f "$config" ] || die "config file $config does not exist"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MPC_VENV-$repo/.venv}"
# In a container the image holds the environment; a host venv is used only if named.
[ -z "${MPC_CONTAINER:-}" ] || venv="${MPC_VENV-}"
if [ -n "$venv" ]; then
    [ -x "$venv/bin/megatron-pc" ] || die "MPC_VENV=$venv has no bin/megatron-pc (install the project, or set MPC_VENV)"
    export PATH="$venv/bin:$PATH"
fi

strategy="${STRATEGY:-pilot_commit}"
case "$strategy" in
    pilot_commit|grpo|dapo) ;;
    *) die "STRATEGY must be pilot_commit, grpo or dapo, got '$strategy'" ;;
esac
# Word splitting is the documented format of MPC_OVERRIDES: one override per word.
read -r -a user_overrides <<< "${MPC_OVERRIDES:-}"
overrides=("allocation.strategy=$strategy" "${user_overrides[@]}")

dry_run="${MPC_DRY_RUN:-0}"
data_check=()
[ "${MPC_NO_DATA_CHECK:-0}" != 1 ] || data_check=(--no-data-check)
nodes="${SLURM_JOB_NUM_NODES:-1}"
job_id="${SLURM_JOB_ID:-local-$$}"
cpus_per_node="${SLURM_CPUS_ON_NODE:-$(nproc)}"

# GPUs per node: SLURM_GPUS_ON_NODE is what this node really got; SLURM_GPUS_PER_NODE is the
# request, possibly typed ("h200:8"). None of them: a CPU-only job.
gpus_per_node="${MPC_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-0}}}"
gpus_per_node="${gpus_per_node##*:}"
[[ "$gpus_per_node" =~ ^[0-9]+$ ]] || die "cannot read GPUs per node from '$gpus_per_node' (set MPC_GPUS_PER_NODE)"
if ! [[ "$nodes" =~ ^[1-9][0-9]*$ ]]; then
    die "SLURM_JOB_NUM_NODES must be a number >= 1, got '$nodes'"
fi

run_root="${MPC_RUN_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}/runs}"
# A requeued job keeps its id, so it finds its own checkpoints again in the same directory.
run_dir="${MPC_RUN_DIR:-$run_root/$(basename "$config" .yaml)-$strategy-$job_id}"

ray_port="${MPC_RAY_PORT:-6379}"
ray_tmp="${MPC_RAY_TMP:-/tmp/ray-$job_id}"
# Ray puts unix sockets at <temp>/session_<date>_<time>_<pid>/sockets/<name>, about 60
# characters more; Linux refuses socket paths over 107 characters.
[ "${#ray_tmp}" -le 40 ] || die "MPC_RAY_TMP=$ray_tmp is ${#ray_tmp} characters; keep it <= 40 (socket paths <= 107)"

# shellcheck source=slurm/lib/container.sh
source "$repo/slurm/lib/container.sh"

# --- 1. the layout plan: refuse a layout that cannot fit before any node does work ---------
# Rule: a job without GPUs (gpus per node 0, e.g. the tiny CPU run) has no GPU layout to plan;
# its config is still fully validated by `megatron-pc config`. The planner runs in the job's own
# environment (the image, or the venv), so it detects Transformer Engine where the ranks will run
# and refuses a layer spec that needs TE there (docs/gpu_install.md), before Ray starts.
if [ "$gpus_per_node" -gt 0 ]; then
    say "planning $config for $nodes nodes x $gpus_per_node GPUs, in the job's own environment (where the ranks will look for Transformer Engine)"
    plan_rc=0
    "${in_image[@]}" megatron-pc plan "$config" --nodes "$nodes" --gpus-per-node "$gpus_per_node" ${data_check[@]+"${data_check[@]}"} "${overrides[@]}" || plan_rc=$?
    if [ "$plan_rc" -ne 0 ]; then
        say "the planner refused this layout, the config or its data (exit $plan_rc): see the 'refused:' or 'error:' lines above; nothing was started"
        exit "$plan_rc"
    fi
else
    say "no GPUs in this job: skipping the GPU layout plan, validating the config and its data only"
    config_rc=0
    "${in_image[@]}" megatron-pc config "$config" ${data_check[@]+"${data_check[@]}"} "${overrides[@]}" > /dev/null || config_rc=$?
    if [ "$config_rc" -ne 0 ]; then
        say "the config or its data was refused (exit $config_rc): see the 'error:' line above; nothing was started"
        exit "$config_rc"
    fi
fi

# --- 2. who is the head, who are the workers ------------------------------------------------
workers=()
if [ "$nodes" -gt 1 ]; then
    [ -n "${SLURM_JOB_NODELIST:-}" ] || die "a $nodes-node job needs SLURM_JOB_NODELIST"
    # scontrol's own error (no slurm.conf outside a cluster, say) is the message, not a count of 0 nodes.
    hostlist="$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>&1)" ||
        die "scontrol show hostnames $SLURM_JOB_NODELIST failed: ${hostlist//$'\n'/ | } (scontrol needs the cluster's slurm.conf: run on a node of the cluster, or set SLURM_CONF)"
    mapfile -t hosts <<< "$hostlist"
    [ "${#hosts[@]}" -eq "$nodes" ] || die "SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST names ${#hosts[@]} nodes, expected $nodes"
    # sbatch runs this script on the first node of the allocation: that one is the head.
    workers=("${hosts[@]:1}")
    head_ip="${MPC_HEAD_IP:-$(hostname -I | awk '{print $1}')}"
else
    # One node: keep Ray on loopback; nothing else has to reach it.
    head_ip="${MPC_HEAD_IP:-127.0.0.1}"
fi
ray_address="$head_ip:$ray_port"

ray_node_args=(--temp-dir="$ray_tmp" --num-cpus="$cpus_per_node" --num-gpus="$gpus_per_node" --disable-usage-stats)
head_cmd=("${head_step[@]}" ray start --head --node-ip-address="$head_ip" --port="$ray_port" --include-dashboard=false "${ray_node_args[@]}" "${ray_head_args[@]}")
srun_args=(--nodes=1 --ntasks=1 --cpus-per-task="$cpus_per_node")
# A step sees only the GPUs it asks for; the Ray worker must see all of its node's.
[ "$gpus_per_node" -eq 0 ] || srun_args+=(--gpus-per-node="$gpus_per_node")
srun_args+=("${worker_image_args[@]}")
worker_cmd=(ray start --address="$ray_address" "${ray_node_args[@]}" --block)
wait_cmd=("${in_image[@]}" python "$repo/slurm/lib/wait_for_ray.py" --address="$ray_address" --nodes="$nodes"
          --gpus="$((nodes * gpus_per_node))" --timeout="${MPC_RAY_WAIT_S:-300}")
train_cmd=("${in_image[@]}" megatron-pc train "$config" "run_dir=$run_dir" "${overrides[@]}")

if [ "$dry_run" = 1 ]; then
    echo "== dry run (MPC_DRY_RUN=1): nothing is started =="
    echo "job $job_id: $nodes nodes x $gpus_per_node GPUs, $cpus_per_node CPUs per node, strategy $strategy"
    echo "run dir: $run_dir"
    echo "head (this node):"
    echo "  $(quoted "${head_cmd[@]}")"
    for node in "${workers[@]}"; do
        echo "worker $node:"
        echo "  $(quoted srun "${srun_args[@]}" -w "$node" "${worker_cmd[@]}") &"
    done
    echo "wait for Ray: $(quoted "${wait_cmd[@]}")"
    echo "driver: $(quoted env "RAY_ADDRESS=$ray_address" "${train_cmd[@]}")"
    echo "on SIGUSR1: forward it to the driver; driver exit $REQUEUE_EXIT_CODE -> ray stop, scontrol requeue $job_id"
    exit 0
fi

# A CPU build of torch on GPU nodes would run CPU ranks of a GPU model: stop before Ray starts.
if [ "$gpus_per_node" -gt 0 ]; then
    # In a container: in the image, in a step that sees the node's GPUs (head_step; empty otherwise).
    job_prefix="$("${head_step[@]}" python -c 'import sys; print(sys.prefix)' 2>/dev/null || echo "${venv:-the python on PATH}")"
    "${head_step[@]}" python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
        die "this job has $gpus_per_node GPUs per node, but torch in $job_prefix cannot use CUDA (a CPU build, or no torch): make a GPU environment with \`bash scripts/install.sh --gpu\` and point MPC_VENV at it"
fi

# --- 3. Ray, with cleanup on every way out --------------------------------------------------
worker_pids=()
driver_pid=""
pending_signal=""
cleaned=0
cleanup() {
    [ "$cleaned" -eq 0 ] || return 0
    cleaned=1
    local pid waited=0
    # srun passes SIGTERM to its task; `ray start --block` then stops that node's Ray.
    for pid in "${worker_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${worker_pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 30 ]; do sleep 1; waited=$((waited + 1)); done
        kill -KILL "$pid" 2>/dev/null || true
    done
    # In a container the head is a job step like the workers, stopped with them above.
    [ -n "$container" ] || ray stop > /dev/null 2>&1 || say "ray stop failed on the head; processes may linger until the job ends"
}
trap cleanup EXIT

# `--signal=B:USR1@S` signals only this shell, whose default on SIGUSR1 is to die. Trap it from
# here on; a signal that comes before the driver runs is kept and passed on once it does.
forward() {
    if [ -z "$driver_pid" ]; then
        say "got SIG$1 before the driver started: passing it on as soon as it runs"
        pending_signal="$1"
        return 0
    fi
    say "got SIG$1: passing it to the driver (pid $driver_pid) so it checkpoints and exits"
    kill -"$1" "$driver_pid" 2>/dev/null || true
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

# Ray token authentication, one token per job. Left to itself Ray disagrees with itself:
# `ray start` turns token auth on whenever ~/.ray/auth_token exists (any earlier local
# ray.init() writes one), but a client given an explicit address (wait_for_ray.py, the
# driver) never does, and is then refused ("InvalidAuthToken"). An explicit mode and a token
# in the environment reach every process of the job: the driver, Ray's own processes, and
# the srun workers on other nodes (srun passes the environment on). Made without python so
# nothing runs before the head starts. A user's own RAY_AUTH_MODE / RAY_AUTH_TOKEN win.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_TOKEN_PATH:-}" ]; then
    RAY_AUTH_TOKEN="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
    export RAY_AUTH_TOKEN
fi

say "starting the Ray head at $ray_address (temp dir $ray_tmp)${container:+ in $container}"
if [ -n "$container" ]; then
    # `ray start --block` in its own step: a step's processes end when the step does.
    "${head_cmd[@]}" &
    worker_pids+=("$!")
else
    "${head_cmd[@]}"
fi
for node in "${workers[@]}"; do
    say "starting a Ray worker on $node"
    srun "${srun_args[@]}" -w "$node" "${worker_cmd[@]}" &
    worker_pids+=("$!")
done
"${wait_cmd[@]}" || die "Ray did not come up with every node; stopping"

# --- 4. the driver --------------------------------------------------------------------------
# Bash runs a trap only between commands, so the driver runs in the background and this shell
# sits in `wait`, which a trapped signal interrupts.
mkdir -p "$run_dir"
say "driver: ${train_cmd[*]}"
RAY_ADDRESS="$ray_address" "${train_cmd[@]}" &
driver_pid=$!
[ -z "$pending_signal" ] || forward "$pending_signal"
driver_rc=0
wait "$driver_pid" || driver_rc=$?
# `wait` returns early (code > 128) when a trapped signal arrives; the driver may still run.
while kill -0 "$driver_pid" 2>/dev/null; do
    driver_rc=0
    wait "$driver_pid" || driver_rc=$?
done
say "driver exited with $driver_rc"

if [ "$driver_rc" -eq "$REQUEUE_EXIT_CODE" ]; then
    # Requeueing ends this job at once, so stop Ray first; the requeued job starts fresh on the
    # same run directory and the driver resumes from its latest checkpoint.
    cleanup
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        say "driver checkpointed for preemption: requeueing job $SLURM_JOB_ID"
        scontrol requeue "$SLURM_JOB_ID" || say "scontrol requeue $SLURM_JOB_ID failed; resubmit with MPC_RUN_DIR=$run_dir"
    else
        say "not inside a SLURM job: nothing to requeue; rerun with MPC_RUN_DIR=$run_dir to resume"
    fi
fi
exit "$driver_rc"
