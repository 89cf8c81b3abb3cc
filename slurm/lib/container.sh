#!/usr/bin/env bash
# Its inputs are bootstrap.sh's variables and its outputs bootstrap.sh's arrays:
# shellcheck disable=SC2034,SC2154
# Sourced by slurm/bootstrap.sh: the container route. With MPC_CONTAINER=IMAGE (an image pyxis
# can start: a docker:// or registry name, or a squashfs file; docker/README.md), every Python
# command of the job (planner, Ray head and workers, the driver) runs inside IMAGE as a job step
# started by pyxis's `srun --container-image`; bootstrap.sh itself, srun and scontrol stay on the
# host. Without MPC_CONTAINER every array below is empty and the job runs in MPC_VENV.
#
# Needs (set by bootstrap.sh): repo, run_root, cpus_per_node, gpus_per_node.
# Sets:
#   container            the image, or empty
#   in_image             prefix running one command in the image on this (the head) node
#   head_step            prefix for the Ray head: the node's CPUs and GPUs, in the image
#   worker_image_args    srun options that put a worker's command in the image
#   ray_head_args        extra `ray start --head` options (--block: a step's processes end with it)
# Environment: MPC_CONTAINER (the image), MPC_CONTAINER_MOUNTS (more SRC:DST[,SRC:DST...] mounts:
# models, data, a node-local cache).

container="${MPC_CONTAINER:-}"
in_image=()
head_step=()
worker_image_args=()
ray_head_args=()

# The mounts a job needs at the same paths as on the host: the repository (configs, slurm/lib),
# the submit directory (relative paths in the configs resolve there) and the run root
# (checkpoints, metrics), each once.
container_mounts() {
    local dir mounts="" seen=" "
    for dir in "$repo" "$PWD" "$run_root"; do
        case "$seen" in *" $dir "*) continue ;; esac
        seen+="$dir "
        mounts+="${mounts:+,}$dir:$dir"
    done
    echo "$mounts${MPC_CONTAINER_MOUNTS:+,$MPC_CONTAINER_MOUNTS}"
}

if [ -n "$container" ]; then
    # The mounted repository comes first on the image's Python path, so the job runs this
    # checkout's code and configs with the image's packages (srun passes the environment on).
    export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
    [ "$dry_run" = 1 ] || mkdir -p "$run_root"  # pyxis refuses to mount a missing directory
    worker_image_args=(--container-image="$container" --container-mounts="$(container_mounts)" --container-workdir="$PWD")
    # --overlap: the head's Ray step holds the node's CPUs and GPUs; the planner, the wait and
    # the driver run beside it on the same node.
    head_node="${SLURMD_NODENAME:-$(hostname -s)}"
    in_image=(srun --overlap --nodes=1 --ntasks=1 -w "$head_node" "${worker_image_args[@]}")
    head_step=(srun --overlap --nodes=1 --ntasks=1 -w "$head_node" --cpus-per-task="$cpus_per_node")
    [ "$gpus_per_node" -eq 0 ] || head_step+=(--gpus-per-node="$gpus_per_node")
    head_step+=("${worker_image_args[@]}")
    ray_head_args=(--block)
fi
